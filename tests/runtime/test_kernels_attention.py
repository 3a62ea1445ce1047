"""Triton paged attention (decode split-KV / single pass, varlen prefill, dispatcher) vs the reference.

Without CUDA the kernels run under TRITON_INTERPRET=1 on CPU (set below BEFORE triton is imported: triton
decides at @triton.jit decoration time whether a kernel is compiled or interpreted) in float32 at small
sizes. With CUDA the same small tests run the compiled kernels (float32 dots use TF32 there, hence the
looser tolerance). Tests marked `gpu` run Qwen3-8B head shapes in bf16 on the GPU.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.kernels import attention_triton  # noqa: E402
from kvpilot.runtime.kernels.attention import paged_attention_ref  # noqa: E402
from kvpilot.runtime.kernels.decode_attention_triton import (  # noqa: E402
    DecodeConfig,
    DecodePlan,
    default_decode_config,
    paged_decode_attention_triton,
    partition_for,
    plan_decode,
)
from kvpilot.runtime.kernels.decode_plan import TileShape  # noqa: E402
from kvpilot.runtime.kernels.prefill_attention_triton import (  # noqa: E402
    PrefillConfig,
    paged_prefill_attention_triton,
    use_flat_grid,
)
from kvpilot.runtime.layers.kernel_ops import kernel_ops  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"
SMALL_TOL = {"atol": 1e-4, "rtol": 1e-4} if DEVICE == "cpu" else {"atol": 2e-2, "rtol": 2e-2}
GQA = [(4, 4), (4, 2), (8, 2), (6, 2), (4, 1)]  # (q heads, kv heads): ratios 1, 2, 4, 3 (padded), MQA
SMALL_DECODE = DecodeConfig(block_n=16, min_partition=16)  # several tiles and splits at small contexts
SMALL_PREFILL = PrefillConfig(block_m=16, block_n=16)


def make_batch(
    ctx_lens: list[int],
    q_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = DEVICE,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Fresh random q and paged K/V; each sequence's pages are scattered over the pool (random block
    table) and unused table entries are -1, so reading a wrong or missing page shows in the output."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-c // block_size) for c in ctx_lens]
    num_blocks = sum(per_seq) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.full((len(ctx_lens), max(per_seq, default=0) + 1), -1, dtype=torch.int32)
    used = 0
    for s, n in enumerate(per_seq):
        tables[s, :n] = perm[used : used + n]
        used += n
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    dev_gen = torch.Generator(device=device).manual_seed(seed)
    out = {
        "q": torch.randn(int(cu[-1]), num_heads, head_dim, generator=dev_gen, device=device, dtype=dtype),
        "k_cache": torch.randn(cache_shape, generator=dev_gen, device=device, dtype=dtype),
        "v_cache": torch.randn(cache_shape, generator=dev_gen, device=device, dtype=dtype),
    }
    out["cu_seqlens_q"] = cu.to(device)
    out["context_lens"] = torch.tensor(ctx_lens, dtype=torch.int32, device=device)
    out["block_tables"] = tables.to(device)
    return out


def reference(b: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
    return paged_attention_ref(
        b["q"], b["k_cache"], b["v_cache"], b["cu_seqlens_q"], b["context_lens"], b["block_tables"], scale
    )


def decode(b: dict[str, torch.Tensor], scale: float, **kw: object) -> torch.Tensor:
    return paged_decode_attention_triton(
        b["q"], b["k_cache"], b["v_cache"], b["context_lens"], b["block_tables"], scale, **kw
    )


def prefill(b: dict[str, torch.Tensor], scale: float, **kw: object) -> torch.Tensor:
    args = (b["q"], b["k_cache"], b["v_cache"], b["cu_seqlens_q"], b["context_lens"], b["block_tables"])
    return paged_prefill_attention_triton(*args, scale, **kw)


# ---------------------------------------------------------------- decode planning (pure)


def test_plan_single_pass_when_the_batch_fills_the_gpu() -> None:
    assert plan_decode(64, 8, 4096, 132, DecodeConfig()).num_splits == 1


@pytest.mark.parametrize(("num_seqs", "max_ctx"), [(1, 4096), (1, 4097), (4, 1000), (16, 130)])
@pytest.mark.parametrize("adaptive", [True, False])
def test_plan_split_partitions_cover_the_context(num_seqs: int, max_ctx: int, adaptive: bool) -> None:
    cfg = DecodeConfig(adaptive_partitions=adaptive)
    plan = plan_decode(num_seqs, 8, max_ctx, 132, cfg)
    assert plan.partition_size % cfg.block_n == 0
    part = partition_for(max_ctx, plan, cfg.block_n)
    assert plan.num_splits * part >= max_ctx > (plan.num_splits - 1) * part  # every split holds positions
    if max_ctx >= 1000:
        assert plan.num_splits > 1
        assert part >= cfg.min_partition


def test_adaptive_partitions_spread_a_short_context_over_every_split() -> None:
    """A plan made for a wide block table (a CUDA graph's capture width) with a short real context."""
    cfg = DecodeConfig(min_partition=128)
    plan = plan_decode(4, 8, 8192, 132, cfg)
    assert plan.num_splits > 4
    assert -(-600 // partition_for(600, plan, cfg.block_n)) == -(-600 // cfg.min_partition)  # 5 busy
    fixed = plan_decode(4, 8, 8192, 132, replace(cfg, adaptive_partitions=False))
    assert fixed.partition_size >= 1024  # the fixed plan: one split does all 600 positions
    assert -(-600 // partition_for(600, fixed, cfg.block_n)) == 1


@pytest.mark.parametrize(
    ("num_seqs", "ctx", "splits", "stages"),
    [(8, 4096, 4, 5), (16, 4096, 2, 5), (32, 512, 3, None), (16, 8192, 5, None), (1, 4096, 64, None)],
)
def test_plan_prefers_long_double_buffered_partitions(
    num_seqs: int, ctx: int, splits: int, stages: int | None
) -> None:
    """Without pages_ahead: where the short plan cuts contexts into < 1024 positions (8 x 4k: 8 x 512),
    ~2 programs per SM with long partitions at 5 stages (H200: 39.4 vs 47.2 µs); where partitions can't
    be long (32 x 512) or already are (16 x 8k), the short plan."""
    plan = plan_decode(num_seqs, 8, ctx, 132, DecodeConfig(pages_ahead=False))
    assert (plan.num_splits, plan.num_stages, plan.pages_ahead) == (splits, stages, False)
    assert plan_decode(8, 8, 4096, 132, DecodeConfig(long_split_waves=0.0, pages_ahead=False)).num_splits == 8
    eight_bit = default_decode_config(torch.int8)  # long plans were measured for 16-bit caches only
    assert plan_decode(8, 8, 4096, 132, eight_bit).num_stages is None
    assert not plan_decode(32, 8, 512, 132, eight_bit).pages_ahead


@pytest.mark.parametrize(
    ("num_seqs", "ctx", "splits", "ahead"),
    [
        (32, 512, 1, True),  # 256 (seq, head) pairs: one pipelined pass each, no reduce
        (8, 4096, 4, True),  # ~2 programs per SM, partitions of 1024
        (16, 8192, 2, True),
        (24, 4096, 2, True),  # 192 pairs: one pass would leave 72 SMs with 1 program and 60 with 2
        (64, 4096, 1, False),  # fills the GPU: the 2-stage pass
        (1, 4096, 64, False),  # 8 pairs: long partitions would be too few programs; 64 short ones
        (16, 512, 4, False),  # 128 pairs, partitions can't be long: the short plan
    ],
)
def test_plan_pages_ahead(num_seqs: int, ctx: int, splits: int, ahead: bool) -> None:
    plan = plan_decode(num_seqs, 8, ctx, 132, DecodeConfig())
    assert (plan.num_splits, plan.pages_ahead) == (splits, ahead)
    assert plan.num_stages == (3 if ahead else None)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.int8])
def test_8bit_single_pass_plans_take_their_tile_shape(dtype: torch.dtype) -> None:
    """Batches that fill the GPU: 64-position tiles at 2 warps (decode_plan.EIGHT_BIT_DECODE); split plans
    keep the config's own shape."""
    cfg = default_decode_config(dtype)
    tile = cfg.single_pass
    assert tile is not None
    full = plan_decode(64, 8, 4000, 132, cfg)
    assert (full.num_splits, full.block_n, full.num_warps, full.num_stages) == (
        1, tile.block_n, tile.num_warps, tile.num_stages)  # fmt: skip
    assert full.partition_size == 4032  # 4000 rounded up to the tile
    few = plan_decode(2, 8, 4000, 132, cfg)
    assert few.num_splits > 1 and few.block_n is None and few.num_warps is None
    dense = plan_decode(256, 8, 1000, 132, cfg)  # 15.5 programs per SM
    want = cfg.dense_pass or tile  # e4m3: one warp from dense_waves programs per SM on; int8: none
    assert (dense.num_splits, dense.block_n, dense.num_warps) == (1, want.block_n, want.num_warps)


def test_decode_with_a_single_pass_tile_shape_matches_reference() -> None:
    b = make_batch([1, 17, 33, 64, 70], [1] * 5, 8, 2, 16, 4, seed=11)
    cfg = DecodeConfig(block_n=32, single_pass=TileShape(block_n=16, num_warps=2, num_stages=3))
    plan = plan_decode(5, 2, b["block_tables"].shape[1] * 4, 1, cfg)
    assert plan.block_n == 16
    torch.testing.assert_close(decode(b, 0.37, config=cfg, sms=1), reference(b, 0.37), **SMALL_TOL)


def test_plan_short_context_is_one_pass() -> None:
    assert plan_decode(1, 1, 64, 132, DecodeConfig(min_partition=128)) == DecodePlan(1, 64)


# ---------------------------------------------------------------- decode kernel, small, interpreted on CPU


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), GQA)
@pytest.mark.parametrize("block_size", [4, 8, 16])
@pytest.mark.parametrize("sms", [1, 132], ids=["single_pass", "split_kv"])
def test_decode_matches_reference(num_heads: int, num_kv_heads: int, block_size: int, sms: int) -> None:
    ctx_lens = [1, 17, 33, 64, 70]  # one position, page/tile boundaries straddled, exact multiple, odd
    b = make_batch(ctx_lens, [1] * len(ctx_lens), num_heads, num_kv_heads, 16, block_size, seed=block_size)
    out = decode(b, 0.37, config=SMALL_DECODE, sms=sms)
    torch.testing.assert_close(out, reference(b, 0.37), **SMALL_TOL)


@pytest.mark.parametrize("block_size", [4, 16, 32])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_pages_looked_up_a_tile_ahead(block_size: int, splits: int) -> None:
    ctx_lens = [1, 17, 33, 64, 70]
    b = make_batch(ctx_lens, [1] * len(ctx_lens), 8, 2, 16, block_size, seed=30 + block_size)
    plan = DecodePlan(splits, 16, 3, pages_ahead=True)
    out = decode(b, 0.37, config=SMALL_DECODE, plan=plan)
    torch.testing.assert_close(out, reference(b, 0.37), **SMALL_TOL)


def test_decode_default_config_and_block_size_one() -> None:
    b = make_batch([3, 130, 200], [1, 1, 1], 8, 2, 32, 1, seed=3)
    for sms in (1, 132):
        torch.testing.assert_close(decode(b, 0.2, sms=sms), reference(b, 0.2), **SMALL_TOL)


def test_decode_odd_head_dim_and_explicit_plan() -> None:
    b = make_batch([9, 50], [1, 1], 4, 2, 24, 8, seed=4)  # head_dim 24: padded to 32 inside the kernel
    out = decode(b, 0.3, config=SMALL_DECODE, plan=DecodePlan(num_splits=4, partition_size=16))
    torch.testing.assert_close(out, reference(b, 0.3), **SMALL_TOL)


def test_decode_plan_smaller_than_the_context_still_covers_it() -> None:
    """Partitions grow at run time to ceil(ctx / num_splits): a plan sized for a shorter table (or a
    sequence longer than the plan assumed) loses no positions."""
    b = make_batch([100, 7, 64], [1, 1, 1], 4, 2, 16, 4, seed=8)
    for splits in (1, 2, 5):
        out = decode(b, 0.3, config=SMALL_DECODE, plan=DecodePlan(num_splits=splits, partition_size=16))
        torch.testing.assert_close(out, reference(b, 0.3), **SMALL_TOL)


def test_decode_merges_more_partials_than_one_reduce_pass_holds() -> None:
    """Past 64 splits the reduce merges 64 at a time, rescaling the sums so far by the running maximum."""
    b = make_batch([1100, 40, 700], [1, 1, 1], 4, 2, 16, 16, seed=9)
    for splits in (17, 70):  # one pass of the wide build; two passes (64 + 6 partitions of 16 positions)
        out = decode(b, 0.3, config=SMALL_DECODE, plan=DecodePlan(num_splits=splits, partition_size=16))
        torch.testing.assert_close(out, reference(b, 0.3), **SMALL_TOL)


def test_decode_empty_context_gives_zeros() -> None:
    b = make_batch([0, 5], [1, 1], 4, 2, 16, 4, seed=5)  # a padding row (context 0) beside a real one
    for sms in (1, 132):
        out = decode(b, 0.5, config=SMALL_DECODE, sms=sms)
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        torch.testing.assert_close(out, reference(b, 0.5), **SMALL_TOL)


# ---------------------------------------------------------------- prefill kernel, small


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), GQA)
@pytest.mark.parametrize("block_size", [4, 8, 16])
def test_prefill_mixed_batch_matches_reference(num_heads: int, num_kv_heads: int, block_size: int) -> None:
    # full prompt, prefix + new tokens (odd, straddling pages and tiles), a decode row, a one-token prompt
    q_lens = [23, 9, 1, 1, 40]
    ctx_lens = [23, 37, 18, 1, 57]
    b = make_batch(ctx_lens, q_lens, num_heads, num_kv_heads, 16, block_size, seed=10 + block_size)
    out = prefill(b, 0.29, config=SMALL_PREFILL)
    torch.testing.assert_close(out, reference(b, 0.29), **SMALL_TOL)


def test_prefill_flat_grid_equals_the_per_sequence_grid() -> None:
    """A mixed step (chunks beside many single-token rows): the flat grid finds every (sequence, tile)
    on the device, with and without the max_q_len hint, and matches the per-sequence grid."""
    ctx_lens = [40, 23, *range(5, 45, 3), 17]
    q_lens = [40, 9, *([1] * len(range(5, 45, 3))), 17]
    b = make_batch(ctx_lens, q_lens, 4, 2, 16, 4, seed=9)
    small = PrefillConfig(block_m=16, block_n=16, flat_grid=True)
    flat = prefill(b, 0.3, config=small)
    torch.testing.assert_close(flat, reference(b, 0.3), **SMALL_TOL)
    per_seq = prefill(b, 0.3, config=PrefillConfig(block_m=16, block_n=16, flat_grid=False))
    torch.testing.assert_close(flat, per_seq, atol=0, rtol=0)


@pytest.mark.parametrize(
    "cfg",
    [
        PrefillConfig(block_m=16, block_n=16, gqa_pack=False),
        PrefillConfig(block_m=16, block_n=16, fold_scale=True),
        PrefillConfig(block_m=16, block_n=16, gqa_pack=False, fold_scale=True, flat_grid=True),
        PrefillConfig(block_m=16, block_n=16, pages_ahead=True),
        PrefillConfig(block_m=16, block_n=16, pages_ahead=True, flat_grid=True, heads_first=True),
        PrefillConfig(block_m=16, block_n=16, heads_first=True, gqa_pack=False),
    ],
)
def test_prefill_options_match_reference(cfg: PrefillConfig) -> None:
    b = make_batch([23, 37, 1, 40], [23, 9, 1, 40], 8, 2, 16, 4, seed=12)
    torch.testing.assert_close(prefill(b, 0.29, config=cfg), reference(b, 0.29), **SMALL_TOL)


@pytest.mark.parametrize("gqa_pack", [True, False])
def test_prefill_reads_the_steps_contiguous_kv(gqa_pack: bool) -> None:
    """Prompts with no cached prefix: K/V rows of the step (gathered here from the pages in table
    order, token-aligned with q) give the paged result; the pages are then poisoned to show they are
    not read."""
    ctx_lens = [23, 1, 40]
    b = make_batch(ctx_lens, ctx_lens, 8, 2, 16, 4, seed=13)
    rows = [
        b[name][b["block_tables"][s, : -(-c // 4)].long()].flatten(0, 1)[:c]
        for name in ("k_cache", "v_cache")
        for s, c in enumerate(ctx_lens)
    ]
    k_rows, v_rows = torch.cat(rows[:3]), torch.cat(rows[3:])  # [tokens, kv_heads, head_dim]
    expected = reference(b, 0.29)
    b["k_cache"].fill_(float("nan"))
    b["v_cache"].fill_(float("nan"))
    cfg = PrefillConfig(block_m=16, block_n=16, gqa_pack=gqa_pack)
    out = prefill(b, 0.29, config=cfg, step_kv=(k_rows, v_rows))
    torch.testing.assert_close(out, expected, **SMALL_TOL)


def test_flat_grid_policy() -> None:
    cfg = PrefillConfig()
    assert use_flat_grid(cfg, 1024, 1, None, 16)  # no hint: flat, no host sync
    assert not use_flat_grid(cfg, 1024, 1, 1024, 16)  # one prompt: the per-sequence grid is as small
    assert use_flat_grid(cfg, 7886, 136, 1024, 32)  # W1 mixed step: 4352 vs 383 tiles
    assert not use_flat_grid(PrefillConfig(flat_grid=False), 7886, 136, 1024, 32)


def test_prefill_default_config_with_max_q_len_hint() -> None:
    b = make_batch([150, 70], [150, 3], 8, 2, 32, 16, seed=20)
    torch.testing.assert_close(prefill(b, 0.2, max_q_len=150), reference(b, 0.2), **SMALL_TOL)


def test_prefill_block_size_one_and_odd_head_dim() -> None:
    b = make_batch([12, 31], [5, 31], 6, 3, 20, 1, seed=21)
    torch.testing.assert_close(prefill(b, 0.25, config=SMALL_PREFILL), reference(b, 0.25), **SMALL_TOL)


def test_half_precision_decode_and_prefill() -> None:
    """The casts to the cache dtype (q, probabilities before the PV matmul, output). float16 because the
    interpreter multiplies bfloat16 bit patterns as integers; bf16 itself is covered by the gpu tests."""
    half_tol = {"atol": 5e-3, "rtol": 5e-3}
    dec = make_batch([40, 77], [1, 1], 8, 2, 32, 16, dtype=torch.float16, seed=40)
    torch.testing.assert_close(decode(dec, 0.2, config=SMALL_DECODE), reference(dec, 0.2), **half_tol)
    pre = make_batch([40, 70], [40, 9], 8, 2, 32, 16, dtype=torch.float16, seed=41)
    torch.testing.assert_close(prefill(pre, 0.2, config=SMALL_PREFILL), reference(pre, 0.2), **half_tol)


# ---------------------------------------------------------------- dispatcher


def _dispatch(b: dict[str, torch.Tensor], backend: str, **kw: object) -> torch.Tensor:
    """The attention op of a kernel set, as the layers call it."""
    args = (b["q"], b["k_cache"], b["v_cache"], b["cu_seqlens_q"], b["context_lens"], b["block_tables"])
    return kernel_ops(backend).paged_attention(*args, 0.3, **kw)


def test_dispatcher_routes_decode_and_prefill(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real_decode = attention_triton.paged_decode_attention_triton
    real_prefill = attention_triton.paged_prefill_attention_triton

    def spy_decode(*a: object, **k: object) -> torch.Tensor:
        calls.append("decode")
        return real_decode(*a, **k)

    def spy_prefill(*a: object, **k: object) -> torch.Tensor:
        calls.append("prefill")
        return real_prefill(*a, **k)

    monkeypatch.setattr(attention_triton, "paged_decode_attention_triton", spy_decode)
    monkeypatch.setattr(attention_triton, "paged_prefill_attention_triton", spy_prefill)
    dec = make_batch([5, 20], [1, 1], 4, 2, 16, 4, seed=30)
    pre = make_batch([5, 20], [2, 1], 4, 2, 16, 4, seed=31)
    torch.testing.assert_close(_dispatch(dec, "triton"), _dispatch(dec, "torch"), **SMALL_TOL)
    torch.testing.assert_close(_dispatch(pre, "triton"), _dispatch(pre, "torch"), **SMALL_TOL)
    torch.testing.assert_close(_dispatch(pre, "triton", max_q_len=2), reference(pre, 0.3), **SMALL_TOL)
    torch.testing.assert_close(_dispatch(dec, "triton", is_decode=False), reference(dec, 0.3), **SMALL_TOL)
    assert calls == ["decode", "prefill", "prefill", "prefill"]


def test_dispatcher_rejects_bad_input() -> None:
    b = make_batch([5, 20], [2, 1], 4, 2, 16, 4, seed=32)
    with pytest.raises(ValueError, match="unknown kernel set 'cuda'"):
        _dispatch(b, "cuda")
    with pytest.raises(ValueError, match="one query token per sequence"):
        _dispatch(b, "triton", is_decode=True)
    with pytest.raises(ValueError, match="int32"):
        _dispatch({**b, "context_lens": b["context_lens"].long()}, "triton")
    with pytest.raises(ValueError, match="KV heads"):
        _dispatch({**b, "q": b["q"][:, :3]}, "triton")
    odd = make_batch([5, 20], [2, 1], 4, 2, 16, 6, seed=33)
    with pytest.raises(ValueError, match="power of two"):
        _dispatch(odd, "triton")


# ---------------------------------------------------------------- GPU: Qwen3-8B heads, bf16, full size

QWEN3_8B = {"num_heads": 32, "num_kv_heads": 8, "head_dim": 128}
BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}  # p is rounded to bf16 before the PV matmul; output is bf16


def _assert_bf16_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.float(), ref.float(), **BF16_TOL)
    rel = (out.float() - ref.float()).norm() / ref.float().norm()
    assert rel < 1e-2, f"relative L2 error {rel:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "max_ctx"), [(64, 4096), (1, 4096), (8, 1500)])
@pytest.mark.parametrize("path", ["auto", "single_pass", "split_kv"])
def test_gpu_decode_qwen3_8b(batch: int, max_ctx: int, path: str) -> None:
    gen = torch.Generator().manual_seed(batch + max_ctx)
    ctx = [max_ctx, *torch.randint(1, max_ctx + 1, (batch - 1,), generator=gen).tolist()]
    b = make_batch(ctx, [1] * batch, **QWEN3_8B, block_size=16, dtype=torch.bfloat16, device="cuda")
    plans = {
        "auto": None,
        "single_pass": DecodePlan(1, -(-max_ctx // 64) * 64),
        "split_kv": DecodePlan(-(-max_ctx // 256), 256),
    }
    scale = 128**-0.5
    _assert_bf16_close(decode(b, scale, plan=plans[path]), reference(b, scale))


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("ctx_lens", "q_lens"),
    [([1024], [1024]), ([3000], [512]), ([700, 33, 2049, 1], [700, 1, 100, 1])],
    ids=["prefill_1k", "extend_512_on_2488", "mixed"],
)
def test_gpu_prefill_qwen3_8b(ctx_lens: list[int], q_lens: list[int]) -> None:
    b = make_batch(ctx_lens, q_lens, **QWEN3_8B, block_size=16, dtype=torch.bfloat16, device="cuda")
    scale = 128**-0.5
    _assert_bf16_close(prefill(b, scale), reference(b, scale))


@pytest.mark.gpu
def test_gpu_decode_cuda_graph_replay_matches_eager() -> None:
    """The decode launch is capturable: grid and plan depend on shapes only, no host sync."""
    b = make_batch(
        [4000, 4000, 1, 2500], [1] * 4, **QWEN3_8B, block_size=16, dtype=torch.bfloat16, device="cuda"
    )
    scale = 128**-0.5
    args = (b["q"], b["k_cache"], b["v_cache"], b["cu_seqlens_q"], b["context_lens"], b["block_tables"])
    args = (*args, scale)
    attention_triton.paged_attention_triton(*args, is_decode=True)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = attention_triton.paged_attention_triton(*args, is_decode=True)
    b["q"].copy_(torch.randn_like(b["q"]))  # new step: new queries, contexts moved (within allocated pages)
    b["context_lens"].copy_(torch.tensor([17, 3999, 0, 2500], dtype=torch.int32))
    graph.replay()
    _assert_bf16_close(captured, reference(b, scale))
    assert torch.equal(captured[2], torch.zeros_like(captured[2]))
