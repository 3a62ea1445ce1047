"""The prefill kernel's step rows (step_kv) on steps with cached context: each chunk's own positions come
from the step's K/V rows, the earlier ones from the pages. A 16-bit cache gives exactly the paged result;
an 8-bit cache gives attention over its own tokens at full precision and over the dequantized prefix.
Interpreted on CPU without CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.engine.batch import SeqChunk, StepBatch  # noqa: E402
from kvpilot.runtime.engine.model_inputs import prepare_inputs  # noqa: E402
from kvpilot.runtime.kernels import attention_triton  # noqa: E402
from kvpilot.runtime.kernels.attention import paged_attention_ref  # noqa: E402
from kvpilot.runtime.kernels.kv_cache import KVCache, dequantize_ref  # noqa: E402
from kvpilot.runtime.kernels.prefill_attention_triton import (  # noqa: E402
    PrefillConfig,
    paged_prefill_attention_triton,
)
from kvpilot.runtime.layers.attention import PagedAttention  # noqa: E402
from kvpilot.runtime.layers.kernel_ops import kernel_ops  # noqa: E402

from tests.runtime.test_attention_step_kv import step  # noqa: E402
from tests.runtime.test_kv_cache_8bit import EIGHT_BIT, IDS, _runner, quantized_batch  # noqa: E402

TOL = {"atol": 1e-4, "rtol": 1e-4} if INTERPRET else {"atol": 2e-2, "rtol": 2e-2}
SMALL = PrefillConfig(block_m=16, block_n=16)
# a prompt, a chunk after 23 cached tokens (tiles not aligned to the prefix), a decode row, and a chunk
# after exactly one tile of prefix
CTX, Q = [21, 30, 9, 40], [21, 7, 1, 24]


def own_rows(b: dict[str, torch.Tensor], page: int) -> tuple[torch.Tensor, torch.Tensor, list[tuple]]:
    """The full-precision K/V of each chunk's own positions in token order ([T, KVH, D] each), and their
    (block, offset) places in the pages."""
    places = []
    for s, (c, q) in enumerate(zip(CTX, Q, strict=True)):
        places += [(int(b["block_tables"][s, p // page]), p % page) for p in range(c - q, c)]
    k = torch.stack([b["k_full"][blk, off] for blk, off in places])
    v = torch.stack([b["v_full"][blk, off] for blk, off in places])
    return k, v, places


def prefill(b: dict[str, torch.Tensor], step_kv: tuple | None, scaled: bool) -> torch.Tensor:
    names = ("q", "k_cache", "v_cache", "cu_seqlens_q", "context_lens", "block_tables")
    scales = {"k_scale": b["k_scale"], "v_scale": b["v_scale"]} if scaled else {}
    return paged_prefill_attention_triton(
        *(b[n] for n in names), 16**-0.5, max_q_len=max(Q), config=SMALL, step_kv=step_kv, **scales
    )


@pytest.mark.parametrize("dtype", EIGHT_BIT, ids=IDS)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 2), (6, 2)])
def test_8_bit_cache_own_tokens_at_full_precision(
    dtype: torch.dtype, num_heads: int, num_kv_heads: int
) -> None:
    b = quantized_batch(CTX, Q, num_heads, num_kv_heads, 16, 4, dtype, seed=5)
    k_rows, v_rows, places = own_rows(b, 4)
    got = prefill(b, (k_rows, v_rows), scaled=True)
    # reference: the dequantized pages with the chunks' own positions holding their full values
    k_mix = dequantize_ref(b["k_cache"], b["k_scale"])
    v_mix = dequantize_ref(b["v_cache"], b["v_scale"])
    for i, (blk, off) in enumerate(places):
        k_mix[blk, off], v_mix[blk, off] = k_rows[i], v_rows[i]
    want = paged_attention_ref(
        b["q"], k_mix, v_mix, b["cu_seqlens_q"], b["context_lens"], b["block_tables"], 16**-0.5
    )
    torch.testing.assert_close(got, want, **TOL)
    paged = prefill(b, None, scaled=True)  # the pages alone: the own tokens' rounding shows
    # (compiled on a GPU the fp32 dots run in TF32, whose error is closer to the 8-bit rounding's)
    assert (paged - want).abs().max() > (10 if INTERPRET else 2) * (got - want).abs().max()


def test_16_bit_cache_step_rows_give_the_paged_result() -> None:
    b = quantized_batch(CTX, Q, 4, 2, 16, 4, torch.int8, seed=6)
    b["k_cache"], b["v_cache"] = b["k_full"], b["v_full"]  # a float cache holding the full values
    k_rows, v_rows, _ = own_rows(b, 4)
    torch.testing.assert_close(prefill(b, (k_rows, v_rows), False), prefill(b, None, False), **TOL)


def test_layer_takes_the_step_rows_for_8_bit_prefill_steps() -> None:
    layer = PagedAttention(8, 2, 16, 0.25, kernel_ops("triton"))
    _, _, prompts = step([9, 5], [9, 5], seed=2)
    _, _, extend = step([20, 5], [4, 5], seed=4)
    _, _, decode = step([7, 1], [1, 1], seed=3)
    bf16 = KVCache(torch.zeros(4, 4, 2, 16), torch.zeros(4, 4, 2, 16))
    int8 = KVCache(*(torch.zeros(4, 4, 2, 16, dtype=torch.int8) for _ in range(2)),
                   *(torch.ones(4, 4, 2) for _ in range(2)))  # fmt: skip
    assert layer.uses_step_kv(int8, prompts) and layer.uses_step_kv(int8, extend)
    assert layer.uses_step_kv(bf16, prompts) and not layer.uses_step_kv(bf16, extend)
    assert not layer.uses_step_kv(int8, decode)  # one token each: the decode kernel reads the pages


def _mixed_steps() -> list[StepBatch]:
    """Two prompts, then steps as the scheduler builds them: decodes first, then chunks (a prompt's
    second chunk, a new prompt); the split staging must rebase the chunks' metadata."""
    a, b, c = [5, 9, 17, 33, 2, 8, 40, 41], [7, 7, 100, 250, 3, 9], [4, 8, 15, 16, 23, 42, 11]
    return [
        StepBatch([SeqChunk(0, a[:5], 0, [3, 0], False), SeqChunk(1, b, 0, [1, 2], True)]),
        StepBatch(
            [
                SeqChunk(1, [77], 6, [1, 2], True),
                SeqChunk(0, a[5:], 5, [3, 0, 6], True),
                SeqChunk(2, c, 0, [4, 5], True),
            ]
        ),
        StepBatch(
            [
                SeqChunk(1, [5], 7, [1, 2], True),
                SeqChunk(0, [12], 8, [3, 0, 6], True),
                SeqChunk(2, [6, 6, 6], 7, [4, 5, 7], True),
            ]
        ),
    ]


def test_mixed_steps_are_staged_split() -> None:
    inputs = prepare_inputs(_mixed_steps()[1], 4, torch.device("cpu"))
    split = inputs.meta.mixed
    assert split is not None and split.num_decode_seqs == 1 and not split.prefix_free
    assert split.cu_seqlens_q.tolist() == [0, 3, 10]
    assert split.context_lens.tolist() == [8, 7]
    assert split.block_tables.tolist() == inputs.meta.block_tables[1:].tolist()
    # after the chunk with cached tokens (3 tokens), the prompt staged again on its own
    prompts = split.prompts
    assert prompts is not None and (prompts.num_prefix_seqs, prompts.num_prefix_tokens) == (1, 3)
    assert prompts.cu_seqlens_q.tolist() == [0, 7] and prompts.context_lens.tolist() == [7]
    assert prompts.block_tables.tolist() == inputs.meta.block_tables[2:].tolist()
    for t in (split.cu_seqlens_q, split.context_lens, split.block_tables, prompts.cu_seqlens_q,
              prompts.context_lens, prompts.block_tables):  # fmt: skip
        assert t.data_ptr() % 16 == 0  # Triton specialises on 16-byte alignment
    assert prepare_inputs(_mixed_steps()[0], 4, torch.device("cpu")).meta.mixed is None
    # the last step's chunks both have cached tokens: no prompt part
    last = prepare_inputs(_mixed_steps()[2], 4, torch.device("cpu")).meta.mixed
    assert last is not None and last.prompts is None
    # nor after a chunk when the prompts are one token each (that group would be taken for decodes)
    ones = StepBatch(
        [
            SeqChunk(1, [77], 6, [1, 2], True),
            SeqChunk(0, [1, 2], 5, [3, 0], True),
            SeqChunk(2, [4], 0, [4], True),
        ]
    )
    mixed = prepare_inputs(ones, 4, torch.device("cpu")).meta.mixed
    assert mixed is not None and mixed.prompts is None


@pytest.mark.parametrize("kv", ["auto", "int8", "fp8"])
def test_mixed_steps_split_decodes_from_chunks(
    kv: str, qwen3_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """triton (interpreted on CPU) and torch kernel sets split mixed steps; the cpu set does not. On a
    16-bit cache the three agree; on 8-bit caches triton and torch (same rules) agree."""
    decoded: list[int] = []
    real = attention_triton.paged_decode_attention_triton

    def spy(q: torch.Tensor, *a: object, **k: object) -> torch.Tensor:
        decoded.append(q.shape[0])
        return real(q, *a, **k)

    monkeypatch.setattr(attention_triton, "paged_decode_attention_triton", spy)
    backends = ("torch", "triton", "cpu") if kv == "auto" and INTERPRET else ("torch", "triton")
    # compiled on a GPU, TF32 dots move activations enough to flip a stored 8-bit code here and there
    tol = TOL if INTERPRET or kv == "auto" else {"atol": 0.1, "rtol": 0.1}
    runners = {b: _runner(qwen3_checkpoint, kv, b) for b in backends}
    decoded.clear()  # a GPU runner's CUDA-graph capture ran decode steps
    for batch in _mixed_steps():
        logits = {b: r.execute(batch) for b, r in runners.items()}
        for b in backends[1:]:
            torch.testing.assert_close(logits[b], logits["torch"], **tol)
    layers = runners["triton"].model_config.num_hidden_layers
    assert decoded == [1] * layers + [2] * layers  # each mixed step's decodes, in every layer
