"""Every runtime pod the operator renders starts: its args pass kvpilot-runtime's own parser and checks,
its GPUs are the plan's tp x pp, and the capability table the planner consults is the one the runtime's
checks enforce. A plan the runtime can't run is never Planned=True and renders nothing."""

from __future__ import annotations

import argparse
import itertools
from typing import Any

import pytest
from kvpilot.contracts.capabilities import EVERYTHING, RUNTIME
from kvpilot.operator.planning.outcome import FEASIBLE, INFEASIBLE, UNSUPPORTED_BY_RUNTIME
from kvpilot.operator.planning.plan import Plan
from kvpilot.operator.pod import GPU_RESOURCE, PORT, runtime_args, served_model_name
from kvpilot.operator.render import render
from kvpilot.runtime.server.args import parse_args

from tests.contracts.cases import MODEL_CONFIGS, PROFILES, Case, cases_for, own_profile_cases

WORKLOAD_KINDS = ("Deployment", "LeaderWorkerSet")
# Planned on some built-in profile, refused on every one (what this runtime build can't run yet).
MUST_PLAN = {
    "small-model-l4",
    "qwen3-8b-h100",
    "scale-to-zero",
    "qwen3-0.6b-pinned-1x1",
    "llama2-fp16-kv",
    "qwen3-8b-int8-kv",
    "qwen3-8b-tp2",
    "qwen2.5-72b-awq-checkpoint",
    "qwen2.5-72b-2x4090",  # on one GPU of 48 GiB or more, and on its own 2 x RTX 4090 (AWQ split at tp 2)
    "qwen3-8b-fp8-l4",  # block-wise fp8 as Qwen ships it, on GPUs with fp8
}
MUST_REFUSE = {
    "qwen3-8b-awq": "4-bit AWQ weights",  # a 16-bit checkpoint pinned to AWQ: a spec error
    "mixtral": "the MixtralForCausalLM architecture",
}


def pod_templates(workload: dict[str, Any]) -> list[tuple[dict[str, Any], int]]:
    """(pod template, pods of it per replica)."""
    if workload["kind"] == "Deployment":
        return [(workload["spec"]["template"], 1)]
    group = workload["spec"]["leaderWorkerTemplate"]
    return [(group["leaderTemplate"], 1), (group["workerTemplate"], group["size"] - 1)]


def runtime_containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in template["spec"]["containers"] if c.get("command") == ["kvpilot-runtime"]]


def parse(argv: list[str], capsys: pytest.CaptureFixture[str]) -> argparse.Namespace:
    try:
        return parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"kvpilot-runtime {' '.join(argv)}\nexits {exc.code}: {capsys.readouterr().err.strip()}")


def check_case(case: Case, capsys: pytest.CaptureFixture[str]) -> None:
    outcome, plan = case.outcome, case.outcome.plan
    if not outcome.planned:
        assert outcome.reason != FEASIBLE
        if plan is not None:  # planning ran and refused: nothing renders, the reason says why
            assert outcome.reason in (INFEASIBLE, UNSUPPORTED_BY_RUNTIME), case.name
            with pytest.raises(ValueError, match="only a feasible plan renders"):
                render(case.owner, outcome.spec, plan, outcome.profile)  # type: ignore[arg-type]
        return
    assert plan is not None and outcome.reason == FEASIBLE
    assert RUNTIME.supports(
        quantization=plan.quantization,
        kv_cache_dtype=plan.kv_cache_dtype,
        tensor_parallel=plan.tensor_parallel,
        pipeline_parallel=plan.pipeline_parallel,
    ), case.name
    workloads = [o for o in case.render() if o["kind"] in WORKLOAD_KINDS]
    assert len(workloads) == 1, case.name
    gpus_per_replica = 0
    for template, pods in pod_templates(workloads[0]):
        [container] = runtime_containers(template)
        args = parse(container["args"], capsys)
        tp, pp = args.tensor_parallel_size, getattr(args, "pipeline_parallel_size", 1)
        assert (tp, pp) == (plan.tensor_parallel, plan.pipeline_parallel), case.name
        gpus = container["resources"]["limits"][GPU_RESOURCE]
        assert gpus == container["resources"]["requests"][GPU_RESOURCE] == tp  # a pod runs one stage
        gpus_per_replica += gpus * pods
        assert args.max_model_len == plan.max_model_len and args.max_num_seqs == plan.max_num_seqs
        assert args.max_num_batched_tokens == plan.max_num_batched_tokens
        assert args.gpu_memory_utilization == pytest.approx(plan.gpu_memory_utilization)
        assert args.kv_cache_dtype == plan.kv_cache_dtype and args.quantization == plan.quantization
        assert args.served_model_name == served_model_name(outcome.spec, case.owner)  # type: ignore[arg-type]
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        assert ports.get("http", PORT) == args.port == PORT
    assert gpus_per_replica == plan.tensor_parallel * plan.pipeline_parallel == plan.gpus, case.name


@pytest.mark.parametrize("profile", PROFILES)
def test_rendered_runtime_args_pass_the_runtimes_parser(
    profile: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = cases_for(profile)
    for case in cases:
        check_case(case, capsys)
    for case in cases:
        name = case.name.partition("@")[0]
        if name in MUST_REFUSE:
            assert not case.outcome.planned, case.name
            if case.outcome.plan is not None and case.outcome.reason == UNSUPPORTED_BY_RUNTIME:
                assert MUST_REFUSE[name] in case.outcome.plan.needs, (case.name, case.outcome.message)


def test_examples_on_their_own_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    cases = own_profile_cases()
    for case in cases:
        check_case(case, capsys)
    planned = {case.name.partition("@")[0] for case in cases if case.outcome.planned}
    assert planned == {
        "small-model-l4",
        "qwen3-8b-h100",
        "scale-to-zero",
        "llama-70b-4xh100",
        "qwen2.5-72b-2x4090",
        "qwen3-8b-fp8-l4",
    }


def test_what_must_plan_plans_somewhere_and_what_must_not_never_does() -> None:
    planned_somewhere: set[str] = set()
    for profile in PROFILES:
        for case in cases_for(profile):
            name = case.name.partition("@")[0]
            if case.outcome.planned:
                planned_somewhere.add(name)
    assert planned_somewhere >= MUST_PLAN
    assert not planned_somewhere & set(MUST_REFUSE)


def test_every_planned_model_loads_in_the_runtime() -> None:
    """The runtime's own config check accepts the config.json of every model the operator plans."""
    from kvpilot.runtime.config import SUPPORTED_ARCHITECTURES, ModelConfig

    assert RUNTIME.architectures == frozenset(SUPPORTED_ARCHITECTURES)
    for profile in PROFILES:
        for case in cases_for(profile):
            if case.outcome.planned and case.outcome.spec and case.outcome.spec.model.scheme == "hf":
                config = MODEL_CONFIGS[case.outcome.spec.model.location]
                ModelConfig.from_dict(config)  # raises UnsupportedModelError / ModelLoadError


def _plan(quantization: str, kv: str, tp: int, pp: int) -> Plan:
    return Plan(
        feasible=True,
        gpu_profile="h100-80gb",
        reason="",
        gpus=tp * pp,
        quantization=quantization,
        kv_cache_dtype=kv,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        max_num_seqs=64,
        max_model_len=8192,
        max_num_batched_tokens=8192,
        gpu_memory_utilization=0.9,
    )


def test_the_capability_table_is_what_the_runtime_enforces(capsys: pytest.CaptureFixture[str]) -> None:
    """For everything the planner can reason about, RUNTIME says `runs` exactly when the runtime's parser
    and checks accept the operator's flags for it: grow the runtime, and this fails until the table grows."""
    combos = itertools.product(
        sorted(EVERYTHING.weight_quantizations), sorted(EVERYTHING.kv_cache_dtypes), (1, 2), (1, 2)
    )
    for quantization, kv, tp, pp in combos:
        argv = runtime_args(_plan(quantization, kv, tp, pp), "m", "/models/m")
        try:
            parse_args(argv)
            accepted, why = True, ""
        except SystemExit as exc:
            accepted, why = False, f"exit {exc.code}: {capsys.readouterr().err.strip().splitlines()[-1]}"
        runs = RUNTIME.supports(
            quantization=quantization, kv_cache_dtype=kv, tensor_parallel=tp, pipeline_parallel=pp
        )
        assert accepted == runs, (quantization, kv, tp, pp, why)
