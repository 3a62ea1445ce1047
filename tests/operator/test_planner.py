"""Planning decisions come out of the sizing model; each test states why the answer is right.

The decision table is the planner's full reasoning (capabilities.EVERYTHING: every weight format, KV dtype
and layout it can size); the operator plans within what this runtime build runs (capabilities.RUNTIME),
tested at the end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from kvpilot.contracts.capabilities import EVERYTHING, RUNTIME, RuntimeCapabilities
from kvpilot.operator.planning.model_facts import facts_from_config
from kvpilot.operator.planning.plan import Plan
from kvpilot.operator.planning.planner import PlanRequest, plan
from kvpilot.operator.planning.profiles import GpuProfile, builtin_profiles
from kvpilot.operator.planning.search_space import tensor_degrees
from kvpilot.operator.planning.sizing import kv_bytes_per_token, weight_bytes_per_gpu

PROFILES = builtin_profiles()
PlanFor = Callable[..., Plan]


@pytest.fixture()
def plan_for(model_configs: dict[str, dict[str, Any]]) -> PlanFor:
    def run(repo: str, profile: str | GpuProfile, **kwargs: Any) -> Plan:
        gpu = PROFILES[profile] if isinstance(profile, str) else profile
        kwargs.setdefault("capabilities", EVERYTHING)
        return plan(PlanRequest(facts_from_config(model_configs[repo]), gpu, **kwargs))

    return run


def shape(p: Plan) -> tuple[int, int, str, str]:
    return p.tensor_parallel, p.pipeline_parallel, p.quantization, p.kv_cache_dtype


# --- The seeds' decision table -------------------------------------------------------------------------


def test_seed_a100_80gb_7b_is_tp1_16bit_256_seqs(plan_for: PlanFor) -> None:
    """Qwen2.5-7B: 14.2 GiB of bf16 weights leave ~56 GiB of KV = 1M tokens at 56 KiB each: 516
    sequences of 2k tokens, capped at the default batch limit of 256."""
    p = plan_for("Qwen/Qwen2.5-7B-Instruct", "a100-80gb")
    assert shape(p) == (1, 1, "none", "bf16")
    assert p.max_num_seqs == 256
    assert "capped at 256" in p.reasons["maxNumSeqs"]


def test_seed_a100_80gb_mha_7b_gets_fewer_seqs(plan_for: PlanFor) -> None:
    """Llama-2-7B (MHA) stores 512 KiB of KV per token, 9x Qwen2.5-7B: 16-bit still reaches the 32
    target, but ~116 sequences of 1k tokens fit, not 256. A better answer than the seed's ~256."""
    p = plan_for("meta-llama/Llama-2-7b-hf", "a100-80gb")
    assert shape(p) == (1, 1, "none", "fp16")
    assert 100 <= p.max_num_seqs <= 128


def test_seed_a100_80gb_72b_is_tp1_awq_about_64_seqs(plan_for: PlanFor) -> None:
    """The 72B AWQ checkpoint: 72.7B params in 4-bit are 39.4 GiB (the runtime's layout: 16-bit scale and
    zero per 128 weights), leaving ~32 GiB of KV = ~50 sequences of 2k tokens."""
    p = plan_for("Qwen/Qwen2.5-72B-Instruct-AWQ", "a100-80gb")
    assert shape(p) == (1, 1, "awq", "fp16")
    assert 40 <= p.max_num_seqs <= 64
    assert "the checkpoint is awq-quantized" in p.reasons["quantization"]


def test_a100_80gb_16bit_72b_is_int4_at_load_and_names_the_awq_alternative(plan_for: PlanFor) -> None:
    """The 16-bit 72B checkpoint: 135 GiB in bf16 and 70 GiB in int8 don't fit 72 GiB usable; AWQ needs
    its own checkpoint, so the plan quantizes to int4 at load (the same size) and says where AWQ is."""
    p = plan_for("Qwen/Qwen2.5-72B-Instruct", "a100-80gb")
    assert shape(p) == (1, 1, "int4", "bf16")
    assert 40 <= p.max_num_seqs <= 64
    assert "16-bit (bf16) does not fit" in p.reasons["quantization"]
    assert "int8 does not fit" in p.reasons["quantization"]
    assert "pre-quantized AWQ or GPTQ checkpoint" in p.reasons["quantization"]


def test_seed_rtx4090_7b_is_tp1_awq_about_32_seqs(plan_for: PlanFor) -> None:
    """Llama-2-7B on 24 GiB: fp16 weights leave KV for 15 sequences of 1k tokens, fp8 and int8 for 27;
    only 4 bits reach the 32 target (33): int4 at load from this 16-bit checkpoint (an AWQ one would be
    the seed's answer, and the reason points at it)."""
    p = plan_for("meta-llama/Llama-2-7b-hf", "rtx4090")
    assert shape(p) == (1, 1, "int4", "fp16")
    assert "pre-quantized AWQ or GPTQ checkpoint" in p.reasons["quantization"]
    assert p.max_num_seqs == 33
    assert "16-bit (fp16) holds 15 of 32" in p.reasons["quantization"]
    assert "fp8 holds 27 of 32" in p.reasons["quantization"]


def test_rtx4090_gqa_7b_keeps_16bit(plan_for: PlanFor) -> None:
    """A better answer for a GQA 7B: Qwen2.5-7B's KV is 56 KiB per token, so 16-bit weights already hold
    55 sequences of 2k tokens; quantizing would lose quality for nothing."""
    p = plan_for("Qwen/Qwen2.5-7B-Instruct", "rtx4090")
    assert shape(p) == (1, 1, "none", "bf16")
    assert p.max_num_seqs == 55


def test_seed_rtx4090_72b_is_tp2_awq(plan_for: PlanFor) -> None:
    """AWQ is 19.3 GiB per GPU at tp2: only at 0.95 utilization does one 8k sequence still fit, and int8 KV
    gets ~11 sequences of 2k tokens (the seed's ~16 assumed shorter contexts); the reason says how short."""
    p = plan_for("Qwen/Qwen2.5-72B-Instruct-AWQ", "rtx4090")
    assert shape(p) == (2, 1, "awq", "int8")
    assert p.gpus == 2 and p.gpu_memory_utilization == 0.95
    assert 8 <= p.max_num_seqs <= 16
    assert "short of the 32 target" in p.reason
    assert "over PCIe" in p.reasons["tensorParallel"]
    assert "raised from 0.90" in p.reasons["gpuMemoryUtilization"]


# --- Every catalog GPU -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_catalog_gpu_gets_a_consistent_plan(
    plan_for: PlanFor, model_configs: dict[str, Any], name: str
) -> None:
    profile = PROFILES[name]
    facts = facts_from_config(model_configs["Qwen/Qwen3-8B"])
    p = plan_for("Qwen/Qwen3-8B", name)
    assert p.feasible, p.reason
    assert p.tensor_parallel in tensor_degrees(facts, profile.gpus_per_node)
    assert p.quantization != "fp8" or profile.fp8
    assert p.kv_cache_dtype in ("bf16", "int8")  # fp8 only when pinned
    weights = weight_bytes_per_gpu(facts, p.quantization, p.tensor_parallel, p.pipeline_parallel)
    per_token = kv_bytes_per_token(facts, p.kv_cache_dtype, p.tensor_parallel, p.pipeline_parallel)
    kv = per_token * p.kv_cache_tokens
    assert weights + kv <= profile.memory_bytes * p.gpu_memory_utilization
    assert p.kv_cache_tokens >= p.max_model_len == 8192
    assert 1 <= p.max_num_seqs <= 256 and p.max_num_batched_tokens >= 2048
    assert set(p.reasons) == {
        "quantization",
        "kvCacheDtype",
        "tensorParallel",
        "pipelineParallel",
        "maxModelLen",
        "maxNumSeqs",
        "maxNumBatchedTokens",
        "gpuMemoryUtilization",
        "kvCacheTokens",
    }


def test_big_gpus_keep_16bit_and_small_ones_quantize(plan_for: PlanFor) -> None:
    """Qwen3-8B is 15.3 GiB in bf16: the 80 GiB parts keep it; on 22.5 GiB parts bf16 leaves KV for 7
    sequences of 2k tokens, so the best format that reaches 32 is chosen (fp8 where the GPU has it)."""
    assert plan_for("Qwen/Qwen3-8B", "h100-80gb").quantization == "none"
    assert plan_for("Qwen/Qwen3-8B", "h200-141gb").max_num_seqs == 256
    assert plan_for("Qwen/Qwen3-8B", "l4").quantization == "fp8"
    assert plan_for("Qwen/Qwen3-8B", "a10g").quantization == "int8"


# --- Pinned vs auto -------------------------------------------------------------------------------------


def test_pinned_quantization_is_honoured(plan_for: PlanFor) -> None:
    p = plan_for("Qwen/Qwen3-8B", "h100-80gb", quantization="int4")
    assert p.quantization == "int4" and "pinned by spec.quantization" in p.reasons["quantization"]
    awq = plan_for("Qwen/Qwen3-8B", "h100-80gb", quantization="awq")  # a 16-bit checkpoint: never AWQ
    assert not awq.feasible and "pre-quantized AWQ checkpoint of this model" in awq.reason
    assert plan_for("Qwen/Qwen3-8B", "h100-80gb", quantization="auto").quantization == "none"


def test_pinned_fp8_on_a_gpu_without_fp8_is_infeasible(plan_for: PlanFor) -> None:
    p = plan_for("Qwen/Qwen3-8B", "a100-80gb", quantization="fp8")
    assert not p.feasible
    assert "fp8 weights need fp8 tensor cores" in p.reason and "a100-80gb has none" in p.reason
    assert p.reason.endswith("use int8, int4 or auto")


def test_an_fp8_checkpoint_without_fp8_hardware_names_what_would_work(plan_for: PlanFor) -> None:
    """int8/int4 at load need 16-bit weights: for an fp8 checkpoint the way out is other GPUs or the
    16-bit model, not another spec.quantization."""
    p = plan_for("Qwen/Qwen3-8B-FP8", "a100-80gb")
    assert not p.feasible and "a100-80gb has none" in p.reason
    assert "serve it on a GPU profile with fp8, or point spec.model at this model's 16-bit" in p.reason
    assert "use int8, int4 or auto" not in p.reason


def test_auto_never_picks_fp8_without_hardware(plan_for: PlanFor) -> None:
    for name in ("a10g", "a100-40gb", "rtx3090"):
        p = plan_for("meta-llama/Llama-2-7b-hf", name)
        assert p.quantization != "fp8" and p.kv_cache_dtype != "fp8", name


def test_pinned_kv_dtype(plan_for: PlanFor) -> None:
    p = plan_for("Qwen/Qwen3-8B", "h100-80gb", kv_cache_dtype="fp8")
    assert p.kv_cache_dtype == "fp8" and "pinned by spec.kvCacheDtype" in p.reasons["kvCacheDtype"]


def test_prequantized_checkpoint_fixes_the_format(plan_for: PlanFor) -> None:
    p = plan_for("Qwen/Qwen2.5-72B-Instruct-AWQ", "h100-80gb")
    assert p.quantization == "awq" and "checkpoint is awq-quantized" in p.reasons["quantization"]
    conflict = plan_for("Qwen/Qwen2.5-72B-Instruct-AWQ", "h100-80gb", quantization="fp8")
    assert not conflict.feasible and "checkpoint is awq" in conflict.reason


def test_8bit_kv_only_when_16bit_misses_the_target(plan_for: PlanFor) -> None:
    """Qwen3-8B at 32k context and 64 sequences (8k average): 16-bit KV holds 57 with any format, 8-bit
    KV 94, so the weights stay bf16 and the KV goes to int8 (fp8 only when pinned)."""
    p = plan_for("Qwen/Qwen3-8B", "h100-80gb", gpu_count=1, concurrency=64, max_model_len=32768)
    assert shape(p) == (1, 1, "none", "int8")
    assert p.max_num_seqs == 64
    assert "at most 57 of 64" in p.reasons["kvCacheDtype"]


# --- GPU count and parallelism --------------------------------------------------------------------------


def test_count_given_prefers_quality_then_fewest_gpus(plan_for: PlanFor) -> None:
    """70B with 64 x 4k-token sequences: bf16 at tp2 holds 14, at tp4 118: tp4 bf16 beats tp1 AWQ."""
    p = plan_for(
        "meta-llama/Llama-3.3-70B-Instruct", "h100-80gb", gpu_count=4, concurrency=64, max_model_len=16384
    )
    assert shape(p) == (4, 1, "none", "bf16") and p.max_num_seqs == 64
    assert "spec.gpu.count allows 4" in p.reasons["tensorParallel"]


def test_count_absent_takes_the_fewest_gpus(plan_for: PlanFor) -> None:
    p = plan_for("meta-llama/Llama-3.3-70B-Instruct", "h100-80gb", concurrency=64, max_model_len=16384)
    assert p.gpus == 1 and p.quantization in ("fp8", "int4")


def test_tensor_parallel_divides_heads(plan_for: PlanFor, model_configs: dict[str, Any]) -> None:
    facts = facts_from_config(model_configs["Qwen/Qwen2.5-7B-Instruct"])  # 28 heads, 4 KV heads
    assert tensor_degrees(facts, 8) == [1, 2, 4]
    bad = plan_for("Qwen/Qwen2.5-7B-Instruct", "l4", tensor=8)
    assert not bad.feasible and "dividing 28 attention heads and 4 KV heads" in bad.reason
    assert plan_for("Qwen/Qwen2.5-7B-Instruct", "l4", tensor=2).tensor_parallel == 2


def test_pipeline_parallel_when_one_node_is_not_enough(plan_for: PlanFor) -> None:
    """405B needs > 8 x 22.5 GiB even in 4-bit: with count 16 it runs as 2 stages of 8 L4s."""
    p = plan_for("meta-llama/Llama-3.1-405B-Instruct", "l4", gpu_count=16)
    assert (p.tensor_parallel, p.pipeline_parallel, p.gpus) == (8, 2, 16)
    assert "one node of 8 GPUs is not enough" in p.reasons["pipelineParallel"]
    assert "pp2" in p.summary


def test_pinned_pipeline(plan_for: PlanFor) -> None:
    p = plan_for("Qwen/Qwen3-8B", "l4", pipeline=2)
    assert p.pipeline_parallel == 2 and "pinned" in p.reasons["pipelineParallel"]
    too_many = plan_for("Qwen/Qwen3-8B", "l4", pipeline=64)
    assert not too_many.feasible and "exceeds the model's 36 layers" in too_many.reason


# --- Infeasible -----------------------------------------------------------------------------------------


def test_infeasible_says_what_was_needed_and_available(plan_for: PlanFor) -> None:
    p = plan_for("meta-llama/Llama-3.1-405B-Instruct", "l4")
    assert not p.feasible and p.summary == "infeasible"
    assert p.reason.startswith("does not fit: int4 weights need 25.8 GiB per GPU")
    assert "but 8 x l4 offer 21.4 GiB usable per GPU (22.49 GiB x 0.95)" in p.reason
    assert "spec.gpu.count: 16 (2 nodes, pipeline parallel) would fit" in p.reason
    status = p.to_status()
    assert status["feasible"] is False and status["weightBytes"] > 0 and "tensorParallel" not in status


def test_infeasible_on_a_count_of_one(plan_for: PlanFor) -> None:
    p = plan_for("Qwen/Qwen2.5-72B-Instruct", "rtx4090", gpu_count=1)
    assert not p.feasible
    assert "1 x rtx4090 offer" in p.reason and "spec.gpu.count: 2 would fit" in p.reason


def test_nothing_fits_even_with_many_nodes() -> None:
    tiny = GpuProfile(name="tiny", memoryGiB=1, bandwidthGBps=100, bf16Tflops=10, gpusPerNode=1)
    facts = facts_from_config(
        {
            "num_hidden_layers": 4,
            "hidden_size": 8192,
            "num_attention_heads": 64,
            "vocab_size": 32000,
            "intermediate_size": 28672,
        }
    )
    p = plan(PlanRequest(facts, tiny, capabilities=EVERYTHING))
    assert not p.feasible and "use a larger GPU profile" in p.reason
    assert "no layout of up to 4 nodes of tiny fits" in p.reason  # the model's 4 layers: 4 stages at most


def test_max_model_len_beyond_the_model(plan_for: PlanFor) -> None:
    p = plan_for("meta-llama/Llama-2-7b-hf", "h100-80gb", max_model_len=8192)
    assert not p.feasible and "exceeds the model's max_position_embeddings 4096" in p.reason


# --- Plan output ----------------------------------------------------------------------------------------


def test_status_uses_camel_case_and_summary(plan_for: PlanFor) -> None:
    p = plan_for("Qwen/Qwen3-0.6B", "l4")
    status = p.to_status()
    assert status["tensorParallel"] == 1 and status["gpuProfile"] == "l4" and status["feasible"] is True
    assert set(status) >= {
        "quantization",
        "kvCacheDtype",
        "maxNumSeqs",
        "maxModelLen",
        "weightBytes",
        "kvBytesPerToken",
        "kvCacheTokens",
        "gpuMemoryUtilization",
        "reason",
        "reasons",
    }
    assert p.summary == f"1xl4 tp1 none kv:bf16 {p.max_num_seqs}seq"


def test_workload_defaults_and_overrides(plan_for: PlanFor) -> None:
    p = plan_for("Qwen/Qwen3-0.6B", "l4", concurrency=16, avg_context_len=512)
    assert p.max_num_seqs == 16 and "capped at 16 by workload.concurrency" in p.reasons["maxNumSeqs"]
    assert "512 tokens" in p.reasons["maxNumSeqs"]
    assert "default min(8192" in p.reasons["maxModelLen"]


# --- Within what this runtime runs (capabilities.RUNTIME, the operator's default) ----------------------
# The refusals of tensor/pipeline-parallel layouts are checked against a one-GPU build (the runtime before
# tensor parallelism), so the planner's reasons for a runtime without them stay covered.
# the single-GPU build (before tensor/pipeline parallel and quantized weights split across ranks)
SINGLE_GPU = dataclasses.replace(
    RUNTIME, max_tensor_parallel=1, max_pipeline_parallel=1, quantized_parallel=False
)


def test_this_runtime_runs_the_70b_on_four_h100s(plan_for: PlanFor) -> None:
    p = plan_for(
        "meta-llama/Llama-3.3-70B-Instruct",
        "h100-80gb",
        gpu_count=4,
        concurrency=64,
        max_model_len=16384,
        capabilities=RUNTIME,
    )
    assert p.feasible and shape(p) == (4, 1, "none", "bf16") and not p.needs


def test_the_default_request_plans_within_this_runtime(model_configs: dict[str, Any]) -> None:
    assert (
        PlanRequest(facts_from_config(model_configs["Qwen/Qwen3-8B"]), PROFILES["l4"]).capabilities is RUNTIME
    )


def test_runtime_small_model_is_planned(plan_for: PlanFor) -> None:
    p = plan_for("Qwen/Qwen3-0.6B", "l4", capabilities=RUNTIME)
    assert p.feasible and shape(p) == (1, 1, "none", "bf16") and p.gpus == 1 and not p.needs
    assert RUNTIME.supports(
        quantization=p.quantization,
        kv_cache_dtype=p.kv_cache_dtype,
        tensor_parallel=p.tensor_parallel,
        pipeline_parallel=p.pipeline_parallel,
    )


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_runtime_plans_stay_within_the_runtime(plan_for: PlanFor, name: str) -> None:
    for repo in ("Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B", "meta-llama/Llama-2-7b-hf", "Qwen/Qwen2.5-7B-Instruct"):
        p = plan_for(repo, name, capabilities=RUNTIME)
        if p.feasible:
            assert RUNTIME.supports(
                quantization=p.quantization,
                kv_cache_dtype=p.kv_cache_dtype,
                tensor_parallel=p.tensor_parallel,
                pipeline_parallel=p.pipeline_parallel,
            ), (repo, name, p.summary)
        else:
            assert "this runtime" in p.reason, (repo, name, p.reason)


def test_runtime_quantizes_where_the_full_planner_does(plan_for: PlanFor) -> None:
    """Qwen3-8B on an L4: fp8 weights (quantized at load) reach 32 sequences; the runtime runs them."""
    p = plan_for("Qwen/Qwen3-8B", "l4", capabilities=RUNTIME)
    assert p.feasible and shape(p) == (1, 1, "fp8", "bf16") == shape(plan_for("Qwen/Qwen3-8B", "l4"))
    assert "quantized at load" in p.reasons["quantization"]


def test_runtime_72b_on_a100_runs_int4_or_its_awq_checkpoint(plan_for: PlanFor) -> None:
    p = plan_for("Qwen/Qwen2.5-72B-Instruct", "a100-80gb", capabilities=RUNTIME)
    assert p.feasible and shape(p) == (1, 1, "int4", "bf16") and not p.needs
    awq = plan_for("Qwen/Qwen2.5-72B-Instruct-AWQ", "a100-80gb", capabilities=RUNTIME)
    assert awq.feasible and shape(awq) == (1, 1, "awq", "fp16") and awq.to_status()["feasible"] is True


def test_runtime_72b_on_two_4090s_needs_tensor_parallel(plan_for: PlanFor) -> None:
    p = plan_for("Qwen/Qwen2.5-72B-Instruct-AWQ", "rtx4090", capabilities=SINGLE_GPU)
    assert not p.feasible and p.needs == ("4-bit AWQ weights split across 2 GPUs", "tensor parallel 2")
    assert p.reason.startswith("needs 4-bit AWQ weights split across 2 GPUs and tensor parallel 2, which")
    # a runtime that runs tensor parallel 2, but not with quantized weights split across the ranks
    no_split = dataclasses.replace(RUNTIME, quantized_parallel=False)
    p = plan_for("Qwen/Qwen2.5-72B-Instruct-AWQ", "rtx4090", capabilities=no_split)
    assert not p.feasible and p.needs == ("4-bit AWQ weights split across 2 GPUs",)
    assert "the plan that would fit: 2 x rtx4090 (tp2), 4-bit AWQ weights, int8 KV" in p.reason
    # this runtime splits them: the AWQ checkpoint runs at tensor parallel 2
    p = plan_for("Qwen/Qwen2.5-72B-Instruct-AWQ", "rtx4090", capabilities=RUNTIME)
    assert p.feasible and shape(p) == (2, 1, "awq", "int8") and not p.needs


def test_runtime_70b_on_four_h100s_needs_tensor_parallel_4(plan_for: PlanFor) -> None:
    p = plan_for(
        "meta-llama/Llama-3.3-70B-Instruct",
        "h100-80gb",
        gpu_count=4,
        concurrency=64,
        max_model_len=16384,
        capabilities=SINGLE_GPU,
    )
    # one GPU with int4 weights and an int8 KV cache is short of 64 but runs; tp4 bf16 would reach it
    assert p.feasible and shape(p) == (1, 1, "int4", "int8") and "short of the 64 target" in p.reason
    full = plan_for(
        "meta-llama/Llama-3.3-70B-Instruct", "h100-80gb", gpu_count=4, concurrency=64, max_model_len=16384
    )
    assert shape(full) == (4, 1, "none", "bf16")


def test_runtime_405b_on_sixteen_l4s_needs_pipeline_parallel(plan_for: PlanFor) -> None:
    p = plan_for("meta-llama/Llama-3.1-405B-Instruct", "l4", gpu_count=16, capabilities=SINGLE_GPU)
    assert not p.feasible
    assert p.needs == ("int4 weights split across 16 GPUs", "tensor parallel 8", "pipeline parallel 2")


def test_runtime_pins_outside_the_runtime_are_refused_with_what_it_serves(plan_for: PlanFor) -> None:
    awq = plan_for("Qwen/Qwen3-8B", "h100-80gb", quantization="awq", capabilities=RUNTIME)
    assert not awq.feasible and not awq.needs  # a 16-bit checkpoint: the spec, not the runtime, is wrong
    assert "AWQ weights come from a pre-quantized AWQ checkpoint" in awq.reason
    tp2 = plan_for("Qwen/Qwen3-8B", "h100-80gb", tensor=2, capabilities=SINGLE_GPU)
    assert not tp2.feasible and tp2.needs == ("tensor parallel 2",)
    assert "parallelism.tensor is 2 and this runtime runs tensor parallel up to 1" in tp2.reason
    assert plan_for("Qwen/Qwen3-8B", "h100-80gb", tensor=2, capabilities=RUNTIME).feasible
    int8 = plan_for("Qwen/Qwen3-8B", "h100-80gb", kv_cache_dtype="int8", capabilities=RUNTIME)
    assert int8.feasible and int8.kv_cache_dtype == "int8"  # the runtime stores scaled 8-bit pages
    prequantized = plan_for("Qwen/Qwen2.5-72B-Instruct-AWQ", "h100-80gb", capabilities=RUNTIME)
    assert prequantized.feasible and prequantized.quantization == "awq"


def test_runtime_errors_of_the_spec_itself_are_reported_once(plan_for: PlanFor) -> None:
    p = plan_for("meta-llama/Llama-2-7b-hf", "h100-80gb", max_model_len=8192, capabilities=RUNTIME)
    assert not p.feasible and not p.needs
    assert p.reason == "workload.maxModelLen 8192 exceeds the model's max_position_embeddings 4096"


def test_runtime_nothing_fits_anywhere_says_so_and_what_the_runtime_serves(plan_for: PlanFor) -> None:
    p = plan_for("meta-llama/Llama-3.1-405B-Instruct", "l4", capabilities=SINGLE_GPU)
    assert not p.feasible and not p.needs
    assert "spec.gpu.count: 16 (2 nodes, pipeline parallel) would fit" in p.reason
    assert p.reason.endswith(
        "; but this runtime serves only 16-bit, 4-bit AWQ, fp8, GPTQ, int4 or int8 weights with a bf16, "
        "fp16, fp8 or int8 KV cache, on one GPU"
    )


def test_a_runtime_with_tensor_parallelism_gets_tensor_parallel_plans(plan_for: PlanFor) -> None:
    """The table grows with the runtime: a build that runs tp up to 4 gets the 70B on 4 H100s."""
    tp4 = RuntimeCapabilities(
        weight_quantizations=frozenset({"none"}),
        kv_cache_dtypes=frozenset({"bf16", "fp8"}),
        max_tensor_parallel=4,
        max_pipeline_parallel=1,
    )
    p = plan_for(
        "meta-llama/Llama-3.3-70B-Instruct",
        "h100-80gb",
        gpu_count=4,
        concurrency=64,
        max_model_len=16384,
        capabilities=tp4,
    )
    assert p.feasible and shape(p) == (4, 1, "none", "bf16")
    big = plan_for("meta-llama/Llama-3.1-405B-Instruct", "h100-80gb", gpu_count=16, capabilities=tp4)
    assert not big.feasible and "tensor parallel 8" in big.needs  # fp8 weights on one node of 8


def test_runtime_refuses_an_architecture_it_cannot_load(plan_for: PlanFor) -> None:
    """Mixtral (MoE) fits one H200 in 16-bit, but this runtime loads Llama and Qwen2/Qwen3 models only."""
    p = plan_for("mistralai/Mixtral-8x7B-Instruct-v0.1", "h200-141gb", capabilities=RUNTIME)
    assert not p.feasible and p.needs == ("the MixtralForCausalLM architecture",)
    assert "this runtime loads LlamaForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM" in p.reason
    assert plan_for("mistralai/Mixtral-8x7B-Instruct-v0.1", "h200-141gb").feasible  # the full planner
