"""PagedAttention on the triton kernels: a prefix-free prefill step reads its K/V rows from the qkv
projection (qkv_prepare's k_to_qkv, the prefill kernel's step_kv) and matches the torch kernels; on a 16-bit
cache, steps with cached context and decode steps read the pages (8-bit caches: test_prefill_step_rows.py).
Interpreted on CPU without CUDA."""

from __future__ import annotations

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.kernels import attention_triton  # noqa: E402
from kvpilot.runtime.kernels.kv_cache import KVCache  # noqa: E402
from kvpilot.runtime.layers.attention import AttentionMetadata, PagedAttention  # noqa: E402
from kvpilot.runtime.layers.kernel_ops import kernel_ops  # noqa: E402
from kvpilot.runtime.layers.rotary import rope_cos_sin_cache  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"
TOL = {"atol": 1e-4, "rtol": 1e-4} if INTERPRET else {"atol": 2e-2, "rtol": 2e-2}  # GPU fp32 dots: TF32
H, KVH, D, PAGE = 8, 2, 16, 4


def step(
    ctx_lens: list[int], q_lens: list[int], seed: int
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """(qkv [T, (H + 2 KVH) D], positions, metadata): each sequence's pages scattered over the pool."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-c // PAGE) for c in ctx_lens]
    perm = torch.randperm(sum(per_seq) + 2, generator=gen).tolist()
    tables, slots, positions = torch.zeros(len(ctx_lens), max(per_seq), dtype=torch.int32), [], []
    for s, (c, q) in enumerate(zip(ctx_lens, q_lens, strict=True)):
        tables[s, : per_seq[s]] = torch.tensor(perm[: per_seq[s]])
        perm = perm[per_seq[s] :]
        positions += list(range(c - q, c))
        slots += [int(tables[s, p // PAGE]) * PAGE + p % PAGE for p in range(c - q, c)]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=DEVICE),
        cu_seqlens_q=cu.to(DEVICE),
        context_lens=torch.tensor(ctx_lens, dtype=torch.int32, device=DEVICE),
        block_tables=tables.to(DEVICE),
        max_q_len=max(q_lens),
        max_context_len=max(ctx_lens),
        prefix_free=ctx_lens == q_lens,
    )
    qkv = torch.randn(sum(q_lens), (H + 2 * KVH) * D, generator=gen).to(DEVICE)
    return qkv, torch.tensor(positions, device=DEVICE), meta


def attend(
    ops: str, qkv: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, cache: KVCache
) -> torch.Tensor:
    layer = PagedAttention(H, KVH, D, D**-0.5, kernel_ops(ops))
    cos_sin = rope_cos_sin_cache(D, 64, 10_000.0, None, DEVICE)
    qkv = qkv.clone()  # store_qkv may write the rotated k over its k columns
    q = layer.store_qkv(qkv, positions, cos_sin, cache, meta)
    return layer(q, cache, meta, qkv)


@pytest.mark.parametrize(
    ("ctx_lens", "q_lens", "step_kv"),
    [
        ([23, 9, 40], [23, 9, 40], True),  # prompts only: the step's rows
        ([23, 30, 40], [23, 9, 40], False),  # the middle one has 21 cached tokens: pages
        ([23, 9, 1], [23, 9, 1], True),  # a one-token prompt beside longer ones
    ],
)
def test_prefix_free_prefill_reads_the_steps_rows(
    ctx_lens: list[int], q_lens: list[int], step_kv: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []
    real = attention_triton.paged_prefill_attention_triton

    def spy(*a: object, **k: object) -> torch.Tensor:
        seen.append(k.get("step_kv") is not None)
        return real(*a, **k)

    monkeypatch.setattr(attention_triton, "paged_prefill_attention_triton", spy)
    qkv, positions, meta = step(ctx_lens, q_lens, seed=sum(ctx_lens))
    blocks = int(meta.block_tables.max()) + 3
    pages = torch.randn(2, blocks, PAGE, KVH, D, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    want = attend("torch", qkv, positions, meta, KVCache(pages[0].clone(), pages[1].clone()))
    got = attend("triton", qkv, positions, meta, KVCache(pages[0].clone(), pages[1].clone()))
    torch.testing.assert_close(got, want, **TOL)
    assert seen == [step_kv]


def test_step_kv_needs_a_prefill_on_triton() -> None:
    layer = PagedAttention(H, KVH, D, D**-0.5, kernel_ops("triton"))
    _, _, prompts = step([9, 5], [9, 5], seed=2)
    _, _, decode = step([1, 1], [1, 1], seed=3)
    bf16 = KVCache(torch.zeros(4, PAGE, KVH, D), torch.zeros(4, PAGE, KVH, D))
    assert layer.uses_step_kv(bf16, prompts)
    assert not layer.uses_step_kv(bf16, decode)  # one token each: the decode kernel reads the pages
    assert not PagedAttention(H, KVH, D, 1.0, kernel_ops("cpu")).uses_step_kv(bf16, prompts)
