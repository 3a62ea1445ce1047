"""The benchmark's arithmetic (floors, parameter counts) and its measuring loop, on CPU with a tiny model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from kvpilot.runtime.bench import (
    WORKLOADS,
    make_requests,
    param_count,
    physical_floor_s,
    qwen3_config,
    run_ours,
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
