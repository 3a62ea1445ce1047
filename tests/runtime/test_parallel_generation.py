"""Tensor and pipeline parallel on CPU (gloo, spawned worker processes) produce exactly the greedy tokens,
and logprobs within 1e-4, of one process, on tiny checkpoints of every family: GQA with fewer KV heads
than ranks, tied embeddings, a vocabulary no rank count divides, q/k/v bias and q/k norm, with prefix
caching, preemption, chunked prefill and overlapped (asynchronous) steps in the run. Pipeline parallel
splits the prefill-heavy steps into micro-batches (the stages overlap), with the same results."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kvpilot.runtime.distributed.executor import StepBroadcaster
from kvpilot.runtime.fixtures.checkpoint import make_tiny_checkpoint
from kvpilot.runtime.fixtures.quantized import make_quantized_checkpoint

from tests.runtime.parallel_support import Run, assert_same, engine_args, generate, reference, spawned_group

ODD_VOCAB = 1027  # divisible by neither 2 nor 4: the last vocab block is padded
CHECKPOINTS = {
    # name: (family, config.json overrides)
    "llama2-mha": ("llama2", {}),
    "llama3-kv1": ("llama3", {"num_key_value_heads": 1, "num_hidden_layers": 3}),  # fewer KV heads than ranks
    "qwen2-bias-tied": ("qwen2", {"vocab_size": ODD_VOCAB}),
    "qwen3-qknorm-tied": ("qwen3", {"vocab_size": ODD_VOCAB}),
}
TP4_CHECKPOINTS = {
    "llama3-kv4": ("llama3", {"num_key_value_heads": 4, "vocab_size": ODD_VOCAB}),
    "qwen3-kv8": ("qwen3", {"num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 8}),
    "qwen2-kv2": ("qwen2", {}),  # 2 KV heads on 4 ranks: each replicated twice
}


# Quantized weights split across the ranks: (checkpoint format, or None for a 16-bit one quantized at load
# with --quantization; --quantization; fixture options). Each rank's weights are exactly its slice of one
# GPU's (test_parallel_quantized_load.py), so, as for 16-bit weights, only the order of the all-reduce's
# float32 sums differs: the same 1e-4 logprob tolerance holds. int4 at load: row-parallel inputs 256/512
# wide keep one GPU's group of 128 at tp 2.
QUANTIZED = {
    "int8": (None, "int8", {}),
    "int4": (None, "int4", {"num_attention_heads": 8, "head_dim": 32, "intermediate_size": 512}),
    "awq-g32": ("awq", None, {"group_size": 32}),
    "gptq4-asym-g32": ("gptq", None, {"bits": 4, "group_size": 32, "sym": False}),
}


def _make(root: Path, table: dict[str, tuple[str, dict]]) -> dict[str, Path]:
    return {
        name: make_tiny_checkpoint(root / name, family, seed=3, **overrides)
        for name, (family, overrides) in table.items()
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("parallel")
    return _make(root, CHECKPOINTS) | _make(root, TP4_CHECKPOINTS)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str | None]]:
    root = tmp_path_factory.mktemp("quantized")
    out = {}
    for name, (fmt, quantization, opts) in QUANTIZED.items():
        if fmt is None:
            path = make_tiny_checkpoint(root / name, "qwen3", seed=3, **opts)
        else:
            path = make_quantized_checkpoint(root / name, fmt, "qwen3", seed=3, **opts)
        out[name] = (path, quantization)
    return out


@pytest.fixture(scope="module")
def references(checkpoints: dict[str, Path]) -> dict[str, Run]:
    return {name: reference(path) for name, path in checkpoints.items()}


@pytest.fixture(scope="module", params=[(2, 1), (1, 2), (4, 1), (2, 2)], ids=["tp2", "pp2", "tp4", "tp2pp2"])
def group(request: pytest.FixtureRequest, checkpoints: dict[str, Path]) -> Iterator[StepBroadcaster]:
    tp, pp = request.param
    yield from spawned_group(next(iter(checkpoints.values())), tp, pp)


def _check(group: StepBroadcaster, path: Path, ref: Run, quantization: str | None = None) -> None:
    rank = group.comm.rank
    group.load(engine_args(path, rank.tp, rank.pp, quantization).to_dict())
    assert_same(generate(group, path), ref)
    if rank.pp > 1:  # the stages ran micro-batched steps (the prefill-heavy ones), and whole ones
        stage = group.pipeline
        assert 0 < stage.split_steps < stage.steps
        assert stage.micro_batches >= 2 * stage.split_steps


@pytest.mark.parametrize("group", [(2, 1), (1, 2)], indirect=True, ids=["tp2", "pp2"])
def test_two_ranks_match_one(
    group: StepBroadcaster, checkpoints: dict[str, Path], references: dict[str, Run]
) -> None:
    for name in CHECKPOINTS:
        _check(group, checkpoints[name], references[name])


@pytest.mark.parametrize("group", [(4, 1), (2, 2)], indirect=True, ids=["tp4", "tp2pp2"])
def test_four_ranks_match_one(
    group: StepBroadcaster, checkpoints: dict[str, Path], references: dict[str, Run]
) -> None:
    for name in TP4_CHECKPOINTS:
        _check(group, checkpoints[name], references[name])


@pytest.mark.parametrize("group", [(2, 1), (1, 2)], indirect=True, ids=["tp2", "pp2"])
def test_quantized_weights_split_across_ranks_match_one(
    group: StepBroadcaster, quantized: dict[str, tuple[Path, str | None]]
) -> None:
    names = list(QUANTIZED) if group.comm.rank.tp > 1 else ["awq-g32"]  # pp: each stage its layers
    for name in names:
        path, quantization = quantized[name]
        _check(group, path, reference(path, quantization), quantization)
