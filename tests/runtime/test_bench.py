"""The benchmark's arithmetic (floors, parameter counts) and its measuring loop, on CPU with a tiny model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from kvpilot.runtime.bench import engine_overrides, run_ours
from kvpilot.runtime.bench_workloads import (
    WORKLOADS,
    make_requests,
    param_count,
    physical_floor_s,
    qwen3_config,
)
from kvpilot.runtime.engine.engine_args import EngineArgs
from kvpilot.runtime.engine.llm_engine import LLMEngine


def test_parameter_counts_of_the_real_shapes() -> None:
    assert param_count(qwen3_config("qwen3-8b")) == pytest.approx(8.19e9, rel=0.01)
    assert param_count(qwen3_config("qwen3-0.6b")) == pytest.approx(0.596e9, rel=0.01)


def test_floors_match_design_md() -> None:
    """DESIGN.md: W1 ~36k tok/s, W3 ~3.6 ms per token (15.1 GB streamed / HBM), W4 ~20 ms."""
    w1 = WORKLOADS["W1"]
    reqs = make_requests(w1, 151936, seed=0)
    assert sum(o for _, o in reqs) / physical_floor_s(w1, reqs) == pytest.approx(36e3, rel=0.2)
    w3 = WORKLOADS["W3"]
    assert physical_floor_s(w3, make_requests(w3, 151936, 0)) / 256 == pytest.approx(3.6e-3, rel=0.05)
    w4 = WORKLOADS["W4"]
    assert physical_floor_s(w4, make_requests(w4, 151936, 0)) == pytest.approx(20e-3, rel=0.1)


def test_run_ours_counts_every_output_token(tiny_checkpoint_factory: Callable[..., Path]) -> None:
    engine = LLMEngine.from_args(
        EngineArgs(model=str(tiny_checkpoint_factory("qwen3")), device="cpu", max_model_len=256)
    )
    reqs = [([5, 6, 7, 8], 5), ([9] * 20, 3), ([11, 12], 7)]
    result = run_ours(engine, reqs, "t")
    assert result["output_tokens"] == 15
    assert result["output_tok_s"] > 0 and result["ttft_s"] <= result["wall_s"]
    assert not engine.has_unfinished_requests()


def test_engine_overrides_are_typed_like_engine_args() -> None:
    assert engine_overrides(["kv_cache_dtype=fp8", "max_num_seqs=64", "enforce_eager=true"]) == {
        "kv_cache_dtype": "fp8",
        "max_num_seqs": 64,
        "enforce_eager": True,
    }
    with pytest.raises(SystemExit, match="no_such_knob"):
        engine_overrides(["no_such_knob=1"])


def test_long_context_floor_counts_the_8bit_cache_bytes() -> None:
    """W2L's decode steps read mostly KV, its prefill (64 x 8k tokens) is compute: an 8-bit cache (values +
    fp32 scales) lowers only the KV part, by 256 / 132 per token at Qwen3-8B's head_dim of 128."""
    w = WORKLOADS["W2L"]
    reqs = make_requests(w, 151936, 0)
    bf16, fp8 = physical_floor_s(w, reqs, "bf16"), physical_floor_s(w, reqs, "fp8")
    c = qwen3_config("qwen3-8b")
    kv_elements = sum(len(p) * (o - 1) + (o - 1) * o // 2 for p, o in reqs) * 2 * c["num_hidden_layers"] * 8
    saved_bytes = kv_elements * (2 * 128 - (128 + 4))  # per (token, layer, K/V, head): bf16 vs 8-bit + scale
    assert bf16 - fp8 == pytest.approx(saved_bytes / 4.25e12, rel=1e-6)
    assert physical_floor_s(w, reqs, "int8") == pytest.approx(fp8)
