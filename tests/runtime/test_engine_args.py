"""EngineArgs is the one list of engine knobs: every field is a flag with vLLM's name, one validate() names
every problem, and what it refuses comes from the capability table the operator's planner also reads."""

from __future__ import annotations

import dataclasses

import pytest
from kvpilot.contracts.capabilities import EVERYTHING, RUNTIME
from kvpilot.runtime.engine.engine_args import EngineArgs, EngineArgsError
from kvpilot.runtime.server.args import build_parser, parse_args


def test_every_field_is_a_flag_and_round_trips() -> None:
    parser = build_parser()
    dests = {a.dest for a in parser._actions}
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert fields <= dests
    args = parse_args(
        [
            "--model",
            "/m",
            "-tp",
            "1",
            "-pp",
            "1",
            "--enforce-eager",
            "--no-async-scheduling",
            "--max-num-seqs",
            "7",
        ]
    )
    engine = args.engine_args
    assert engine == EngineArgs(model="/m", enforce_eager=True, async_scheduling=False, max_num_seqs=7)
    assert EngineArgs(**engine.to_dict()) == engine


def test_vllm_flag_names() -> None:
    flags = {s for a in build_parser()._actions for s in a.option_strings}
    for name in (
        "--model",
        "--served-model-name",
        "--max-model-len",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--block-size",
        "--gpu-memory-utilization",
        "--kv-cache-dtype",
        "--quantization",
        "--tensor-parallel-size",
        "-tp",
        "--pipeline-parallel-size",
        "-pp",
        "--enforce-eager",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--load-format",
        "--device",
    ):
        assert name in flags, name


def test_validate_names_every_problem() -> None:
    args = EngineArgs(
        model="/m", max_num_seqs=0, gpu_memory_utilization=1.5, device="tpu", quantization="int3"
    )
    with pytest.raises(EngineArgsError) as info:
        args.validate()
    message = str(info.value)
    for part in (
        "--max-num-seqs must be positive",
        "--gpu-memory-utilization must be in (0, 1]",
        "--device 'tpu' is not one of",
        "--quantization 'int3' is not one of",
    ):
        assert part in message


@pytest.mark.parametrize(
    ("changes", "setting"),
    [
        ({"tensor_parallel_size": 16}, "--tensor-parallel-size"),
        ({"pipeline_parallel_size": 16}, "--pipeline-parallel-size"),
    ],
)
def test_what_the_runtime_refuses_comes_from_the_capability_table(changes: dict, setting: str) -> None:
    args = EngineArgs(model="/m", **changes)
    assert any(p.startswith(setting) for p in args.problems(RUNTIME))
    assert args.problems(EVERYTHING) == []


def test_quantized_weights_split_across_ranks_follow_the_capability_table() -> None:
    args = EngineArgs(model="/m", quantization="awq", tensor_parallel_size=2)
    assert args.problems(RUNTIME) == []  # this build splits them
    no_split = dataclasses.replace(RUNTIME, quantized_parallel=False)
    assert any(p.startswith("--quantization") for p in args.problems(no_split))


def test_kv_dtype_aliases_and_cpu_types_are_servable() -> None:
    for dtype in ("auto", "bf16", "bfloat16", "fp16", "half", "fp8", "fp8_e4m3", "int8", "float32"):
        assert EngineArgs(model="/m", kv_cache_dtype=dtype).problems() == []


def test_bad_flags_exit_2_with_the_problems(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--model", "/m", "--block-size", "0", "--port", "70000"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--block-size must be positive" in err and "--port must be in [0, 65535]" in err
