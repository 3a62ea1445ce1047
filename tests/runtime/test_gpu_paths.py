"""GPU: a random Qwen3-0.6B-shaped model (bf16) on the Triton path vs the torch path, and CUDA graphs vs
eager. Run on the H200 machine (`pytest -m gpu`); CI deselects them.

Greedy tokens of two bf16 implementations may part ways where the top two logits are nearly tied, so the
comparison is teacher-forced: both runners read the same tokens (the reference's greedy choice) at every
step, and each step's argmax must agree unless the reference's own margin between its top two logits is
within the measured difference between the two implementations' logits — a divergence explained by
rounding, not a bug. Logits must also be close everywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kvpilot.runtime.bench_workloads import write_model_dir
from kvpilot.runtime.engine.batch import SeqChunk, StepBatch
from kvpilot.runtime.engine.engine_args import EngineArgs
from kvpilot.runtime.engine.model_runner import GRAPH_MAX_CONTEXT, ModelRunner

pytestmark = pytest.mark.gpu
BLOCK = 16
PROMPT_LENS = [5, 37, 100, 300]  # straddle block boundaries; mixed lengths in one batch
DECODE_STEPS = 24


@pytest.fixture(scope="module")
def qwen3_06b_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("gpu"), "qwen3-0.6b")


def _runner(
    model_dir: Path, backend: str, eager: bool, kv_cache_dtype: str = "auto", max_model_len: int = 1024
) -> ModelRunner:
    return ModelRunner(
        EngineArgs(
            model=str(model_dir),
            block_size=BLOCK,
            max_model_len=max_model_len,
            device="cuda",
            dtype="bfloat16",
            num_kv_blocks=128,
            kernel_backend=backend,
            load_format="dummy",
            seed=7,
            max_num_seqs=8,
            enforce_eager=eager,
            kv_cache_dtype=kv_cache_dtype,
        )
    )


def _tables() -> list[list[int]]:
    """Disjoint block ranges, each reversed so that a sequence's pages are not contiguous."""
    tables, start = [], 0
    for n in PROMPT_LENS:
        blocks = -(-(n + DECODE_STEPS) // BLOCK)
        tables.append(list(range(start, start + blocks))[::-1])
        start += blocks
    return tables


def teacher_forced_logits(ref: ModelRunner, test: ModelRunner) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(reference logits, test logits) per step: a prefill step, then DECODE_STEPS decode steps."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1000, 150000, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    tables = _tables()
    batch = StepBatch([SeqChunk(i, p, 0, tables[i], True) for i, p in enumerate(prompts)])
    pairs = []
    for step in range(DECODE_STEPS + 1):
        a, b = ref.execute(batch), test.execute(batch)
        pairs.append((a.float().cpu(), b.float().cpu()))
        nxt = a.argmax(-1).tolist()
        batch = StepBatch(
            [SeqChunk(i, [nxt[i]], len(prompts[i]) + step, tables[i], True) for i in range(len(prompts))]
        )
    return pairs


def assert_agree(pairs: list[tuple[torch.Tensor, torch.Tensor]], atol: float) -> None:
    for step, (a, b) in enumerate(pairs):
        diff = (a - b).abs().max().item()
        print(f"step {step}: max |logit diff| {diff:.4f}, logit range {a.abs().max().item():.2f}")
        assert diff <= atol, f"step {step}: logits differ by {diff} > {atol}"
        top2 = a.topk(2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
        disagree = a.argmax(-1) != b.argmax(-1)
        unexplained = disagree & (margin > 2 * diff)
        assert not unexplained.any(), f"step {step}: argmax differs beyond rounding (margin {margin})"


def test_triton_path_matches_torch_path(qwen3_06b_dir: Path) -> None:
    ref, test = _runner(qwen3_06b_dir, "torch", True), _runner(qwen3_06b_dir, "triton", True)
    assert_agree(teacher_forced_logits(ref, test), atol=0.1)


def test_cuda_graph_path_matches_eager(qwen3_06b_dir: Path) -> None:
    eager, graphed = _runner(qwen3_06b_dir, "triton", True), _runner(qwen3_06b_dir, "triton", False)
    assert graphed.graphs is not None and eager.graphs is None
    pairs = teacher_forced_logits(eager, graphed)
    assert_agree(pairs, atol=0.05)


@pytest.mark.parametrize(("kv", "dtype"), [("fp8", torch.float8_e4m3fn), ("int8", torch.int8)])
def test_8bit_kv_cache_on_the_cuda_graph_path_stays_close_to_bf16(
    qwen3_06b_dir: Path, kv: str, dtype: torch.dtype
) -> None:
    """8-bit pages with per-token-head scales halve KV bytes; logits move by their rounding, never by a
    wrong layout. The 8-bit runner replays CUDA graphs (store + decode kernels captured with the scales);
    the eager 8-bit runner must agree with it to bf16 rounding."""
    ref, q8 = _runner(qwen3_06b_dir, "triton", True), _runner(qwen3_06b_dir, "triton", False, kv)
    assert q8.graphs is not None and q8.kv_caches[0].k.dtype == dtype
    assert q8.kv_caches[0].k_scale is not None
    assert_agree(teacher_forced_logits(ref, q8), atol=0.5)
    eager = _runner(qwen3_06b_dir, "triton", True, kv)
    assert_agree(teacher_forced_logits(eager, q8), atol=0.05)


def test_cuda_graphs_with_a_long_max_model_len_match_eager(qwen3_06b_dir: Path) -> None:
    """max_model_len 32k: graphs cover contexts up to GRAPH_MAX_CONTEXT, with the decode plan sized for it."""
    eager = _runner(qwen3_06b_dir, "triton", True, max_model_len=32768)
    graphed = _runner(qwen3_06b_dir, "triton", False, max_model_len=32768)
    assert graphed.graphs is not None and graphed.graphs.max_blocks == GRAPH_MAX_CONTEXT // BLOCK
    assert_agree(teacher_forced_logits(eager, graphed), atol=0.05)
