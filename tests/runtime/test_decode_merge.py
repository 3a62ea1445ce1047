"""Split-KV decode that merges its partitions in-kernel (decode_attention_triton.split_epilogue): the last
partition of each (sequence, KV head) to finish merges the partials, so no reduce kernel is launched.
Checked against the reference and the two-launch path, with the reduce kernel made to fail so that a
silent fallback would show; the counters are left at zero for the next launch."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.kernels import decode_attention_triton as dat  # noqa: E402
from kvpilot.runtime.kernels.decode_attention_triton import DecodePlan  # noqa: E402
from kvpilot.runtime.kernels.kv8_path import Kv8Path  # noqa: E402

from tests.runtime.test_kernels_attention import (  # noqa: E402
    GQA,
    SMALL_DECODE,
    SMALL_TOL,
    decode,
    make_batch,
    reference,
)
from tests.runtime.test_kv_cache_8bit import EIGHT_BIT, IDS, TOL, _ref, quantized_batch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CTX = [1, 17, 33, 64, 70, 0]  # one position, tile edges, a multiple, odd, and a padding row


def _counters(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int32, device=DEVICE)


@pytest.fixture
def no_reduce(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reduce launch fails: a merged decode must not need it."""

    class _Fail:
        def __getitem__(self, grid: object) -> object:
            raise AssertionError("the split-KV reduce kernel was launched")

    monkeypatch.setattr(dat, "_decode_reduce_kernel", _Fail())


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), GQA)
@pytest.mark.parametrize("splits", [2, 5])
def test_merged_split_matches_reference_and_two_launches(
    num_heads: int, num_kv_heads: int, splits: int, no_reduce: None
) -> None:
    b = make_batch(CTX, [1] * len(CTX), num_heads, num_kv_heads, 16, 4, seed=40 + splits)
    counters = _counters(len(CTX) * num_kv_heads)
    plan = DecodePlan(splits, 16)
    out = decode(b, 0.37, config=SMALL_DECODE, plan=plan, counters=counters)
    torch.testing.assert_close(out, reference(b, 0.37), **SMALL_TOL)
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))  # context 0: zeros, as the reduce writes
    assert not counters.any(), "every launch leaves its counters at zero"
    again = decode(b, 0.37, config=SMALL_DECODE, plan=plan, counters=counters)  # the counters are reusable
    assert torch.equal(again, out), "the merge order is fixed: the same result whichever partition is last"


def test_merge_needs_enough_counters_else_the_reduce_runs() -> None:
    b = make_batch(CTX, [1] * len(CTX), 8, 2, 16, 4, seed=7)
    plan = DecodePlan(3, 16)
    few = _counters(len(CTX) * 2 - 1)
    out = decode(b, 0.3, config=SMALL_DECODE, plan=plan, counters=few)
    torch.testing.assert_close(out, reference(b, 0.3), **SMALL_TOL)
    off = decode(b, 0.3, config=replace(SMALL_DECODE, merge_splits=False), plan=plan, counters=_counters(64))
    torch.testing.assert_close(off, out, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", EIGHT_BIT, ids=IDS)
@pytest.mark.parametrize("kv8", [None, Kv8Path(cvt="cast")], ids=["shared_kernel", "kv8_kernel"])
def test_merged_split_over_8bit_pages(dtype: torch.dtype, kv8: Kv8Path | None, no_reduce: None) -> None:
    b = quantized_batch([37, 5, 48], [1, 1, 1], 8, 2, 32, 4, dtype, seed=23)
    counters = _counters(3 * 2)
    out = dat.paged_decode_attention_triton(
        b["q"], b["k_cache"], b["v_cache"], b["context_lens"], b["block_tables"], 32**-0.5,
        config=replace(SMALL_DECODE, kv8=kv8), plan=DecodePlan(3, 16),
        k_scale=b["k_scale"], v_scale=b["v_scale"], counters=counters,
    )  # fmt: skip
    torch.testing.assert_close(out, _ref(b, 32**-0.5), **TOL)
    assert not counters.any()
