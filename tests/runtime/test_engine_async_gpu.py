"""GPU: asynchronous scheduling with CUDA graphs and the Triton kernels gives the synchronous engine's
greedy tokens bit for bit (same batches: every request has the same length, so no step holds a request
that already finished), and overlaps the decode steps. Run on the H200 machine (`pytest -m gpu`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvpilot.runtime.bench_workloads import write_model_dir
from kvpilot.runtime.engine.engine_args import EngineArgs
from kvpilot.runtime.engine.llm_engine import LLMEngine
from kvpilot.runtime.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu
PROMPT_LENS = [5, 37, 100, 300]
MAX_TOKENS = 40


def _generate(model_dir: Path, async_scheduling: bool) -> tuple[dict[str, list[int]], int]:
    engine = LLMEngine.from_args(
        EngineArgs(
            model=str(model_dir),
            max_model_len=1024,
            max_num_seqs=8,
            num_kv_blocks=256,
            device="cuda",
            dtype="bfloat16",
            load_format="dummy",
            seed=7,
            async_scheduling=async_scheduling,
        )
    )
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, detokenize=False)
    for i, n in enumerate(PROMPT_LENS):
        engine.add_request(f"r{i}", [(7 * i + 13 * j) % 1000 + 1 for j in range(n)], params)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(PROMPT_LENS))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    return tokens, engine.num_overlapped_steps


def test_async_scheduling_equals_synchronous_on_cuda(tmp_path: Path) -> None:
    model_dir = write_model_dir(tmp_path, "qwen3-0.6b")
    sync, sync_overlapped = _generate(model_dir, False)
    overlapped, num_overlapped = _generate(model_dir, True)
    assert all(len(t) == MAX_TOKENS for t in sync.values())
    assert overlapped == sync
    assert sync_overlapped == 0 and num_overlapped >= MAX_TOKENS - 1
