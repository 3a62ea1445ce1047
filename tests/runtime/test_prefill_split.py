"""Split-KV over a short chunk's cached prefix in the prefill kernel (prefill_split_triton.py): the split
launch gives the unsplit launch's output and the reference's, the split really ran, and it leaves its
counters at zero for the next launch. Interpreted on CPU without CUDA."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.engine.batch import SeqChunk, StepBatch  # noqa: E402
from kvpilot.runtime.kernels import prefill_attention_triton as pat  # noqa: E402
from kvpilot.runtime.kernels.attention import paged_attention_ref  # noqa: E402
from kvpilot.runtime.kernels.kv_cache import dequantize_ref  # noqa: E402
from kvpilot.runtime.kernels.prefill_plan import PrefillConfig, plan_prefix_splits  # noqa: E402

from tests.runtime.test_kv_cache_8bit import EIGHT_BIT, IDS, _runner, quantized_batch  # noqa: E402

TOL = {"atol": 1e-4, "rtol": 1e-4} if INTERPRET else {"atol": 2e-2, "rtol": 2e-2}
PAGE = 4
# chunks of at most 8 tokens split prefixes of >= 2 x 32 positions, into at most 4 partitions
SPLIT = PrefillConfig(block_m=16, block_n=16, split_q=8, split_partition=32, max_prefix_splits=4)
# a short chunk after 200 cached positions (4 partitions of 64, 64, 64, 8), a short chunk after a prefix
# too short to split, a prompt, a chunk too long to split after a long prefix
CTX, Q = [205, 40, 30, 130], [5, 6, 30, 20]


def _own_rows(b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
    """Full-precision K/V of each chunk's own positions in token order, and their (block, offset)."""
    places = []
    for s, (c, q) in enumerate(zip(CTX, Q, strict=True)):
        places += [(int(b["block_tables"][s, p // PAGE]), p % PAGE) for p in range(c - q, c)]
    k = torch.stack([b["k_full"][blk, off] for blk, off in places])
    v = torch.stack([b["v_full"][blk, off] for blk, off in places])
    return k, v, places


def _prefill(b: dict[str, torch.Tensor], max_context_len: int | None, cfg: PrefillConfig) -> torch.Tensor:
    names = ("q", "k_cache", "v_cache", "cu_seqlens_q", "context_lens", "block_tables")
    k_rows, v_rows, _ = _own_rows(b)
    return pat.paged_prefill_attention_triton(
        *(b[n] for n in names), 16**-0.5, config=cfg, k_scale=b["k_scale"], v_scale=b["v_scale"],
        step_kv=(k_rows, v_rows), max_context_len=max_context_len,
        max_q_len=max(Q),  # alone, it would choose the per-sequence grid; a split launch takes the flat one
    )  # fmt: skip


@pytest.mark.parametrize("dtype", EIGHT_BIT, ids=IDS)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 2), (6, 2)])
def test_split_prefix_gives_the_unsplit_result(
    dtype: torch.dtype, num_heads: int, num_kv_heads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = quantized_batch(CTX, Q, num_heads, num_kv_heads, 16, PAGE, dtype, seed=7)
    launches: list[tuple[int, torch.Tensor]] = []
    real = pat.split_workspace

    def spy(cfg: PrefillConfig, splits: int, *args: Any) -> tuple[torch.Tensor, ...]:
        ws = real(cfg, splits, *args)
        launches.append((splits, ws[2]))
        return ws

    monkeypatch.setattr(pat, "split_workspace", spy)
    split = _prefill(b, max(CTX), SPLIT)
    whole = _prefill(b, None, SPLIT)  # no host bound on the contexts: one partition per chunk
    assert [s for s, _ in launches] == [4, 1]
    assert bool((launches[0][1] == 0).all())  # the last program of each tile reset its counter
    torch.testing.assert_close(split, whole, **TOL)
    # the reference: the dequantized pages, each chunk's own positions at full precision
    k_rows, v_rows, places = _own_rows(b)
    k_mix, v_mix = dequantize_ref(b["k_cache"], b["k_scale"]), dequantize_ref(b["v_cache"], b["v_scale"])
    for i, (blk, off) in enumerate(places):
        k_mix[blk, off], v_mix[blk, off] = k_rows[i], v_rows[i]
    want = paged_attention_ref(
        b["q"], k_mix, v_mix, b["cu_seqlens_q"], b["context_lens"], b["block_tables"], 16**-0.5
    )
    torch.testing.assert_close(split, want, **TOL)


@pytest.mark.parametrize(("gqa_pack", "heads_first"), [(False, True), (True, False)])
def test_split_on_the_other_grids(gqa_pack: bool, heads_first: bool) -> None:
    """One query head per program (no GQA packing), or the tile axis first: the workspace slots and the
    partitions follow the grid."""
    b = quantized_batch(CTX, Q, 4, 2, 16, PAGE, torch.int8, seed=9)
    cfg = replace(SPLIT, gqa_pack=gqa_pack, heads_first=heads_first)
    torch.testing.assert_close(_prefill(b, max(CTX), cfg), _prefill(b, None, cfg), **TOL)


def test_split_is_off_when_the_config_says_so() -> None:
    b = quantized_batch(CTX, Q, 4, 2, 16, PAGE, torch.int8, seed=8)
    torch.testing.assert_close(
        _prefill(b, max(CTX), replace(SPLIT, split_q=0)), _prefill(b, max(CTX), SPLIT), **TOL
    )


def test_plan_prefix_splits() -> None:
    args = {"num_seqs": 2, "heads_axis": 8, "block_m": 64, "block_q": 16, "block_d": 128}
    cfg = PrefillConfig()  # split_q 64, partitions of >= 512, up to 16, 64 MiB of workspace
    assert plan_prefix_splits(cfg, 8192, **args) == 16
    assert plan_prefix_splits(cfg, 3000, **args) == 5  # 3000 // 512
    assert plan_prefix_splits(cfg, 1023, **args) == 1  # not two partitions
    assert plan_prefix_splits(cfg, None, **args) == 1  # no host bound
    assert plan_prefix_splits(replace(cfg, split_q=0), 8192, **args) == 1
    # 16 sequences: 16 x 4 tiles x 8 heads x 64 rows x 130 x 4 B = 17 MB per partition -> 3 fit
    assert plan_prefix_splits(cfg, 8192, **{**args, "num_seqs": 16}) == 3
    assert plan_prefix_splits(cfg, 8192, **{**args, "num_seqs": 32}) == 1


def test_model_mixed_step_splits_a_short_chunks_prefix(
    qwen3_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """triton against torch on an int8 cache, with partitions of 16 positions: a mixed step (a decode,
    then a 5-token chunk after 32 cached tokens, and a prompt) splits the chunk's prefix in every layer."""
    small = PrefillConfig(block_m=16, block_n=16, split_q=8, split_partition=16, max_prefix_splits=4)
    monkeypatch.setattr(pat, "default_prefill_config", lambda dtype: small)
    splits: list[int] = []
    real = pat.split_workspace

    def spy(cfg: PrefillConfig, n: int, *args: Any) -> tuple[torch.Tensor, ...]:
        splits.append(n)
        return real(cfg, n, *args)

    monkeypatch.setattr(pat, "split_workspace", spy)
    runners = {b: _runner(qwen3_checkpoint, "int8", b) for b in ("torch", "triton")}  # 12 pages of 4
    a, t0 = list(range(3, 40)), list(range(10))
    steps = [  # the chunk beside a new prompt: one short chunk alone would take the verify kernel
        StepBatch([SeqChunk(0, a[:32], 0, t0, False), SeqChunk(1, [7, 100, 250], 0, [10], True)]),
        StepBatch(
            [
                SeqChunk(1, [77], 3, [10], True),
                SeqChunk(0, a[32:], 32, t0, True),
                SeqChunk(2, [5, 9, 17], 0, [11], True),
            ]
        ),
    ]
    for step in steps:
        splits.clear()
        logits = {b: r.execute(step) for b, r in runners.items()}
        torch.testing.assert_close(logits["triton"], logits["torch"], **TOL)
    # the mixed step's chunk launch: 32 cached positions in 2 partitions of 16, in every layer (its
    # prompt launch is prefix-free: no split variant, no workspace)
    assert splits == [2] * runners["triton"].model_config.num_hidden_layers
