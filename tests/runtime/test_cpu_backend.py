"""The "cpu" backend (kernels/cpu.py: the references rewritten for CPU serving) against the references:
each op on random inputs, and whole engines on tiny checkpoints (backend "cpu" vs "torch")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from kvpilot.runtime.kernels import cpu
from kvpilot.runtime.kernels.activation import silu_and_mul_ref
from kvpilot.runtime.kernels.attention import paged_attention_ref
from kvpilot.runtime.kernels.norm import rms_norm_ref
from kvpilot.runtime.kernels.qkv_prepare import qkv_prepare_ref
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.sampling_params import SamplingParams

TOL = {"atol": 1e-5, "rtol": 1e-5}
GQA = [(4, 4), (6, 2), (4, 1)]


def paged_batch(ctx_lens: list[int], q_lens: list[int], heads: int, kv_heads: int, seed: int = 0) -> dict:
    """Random q and a paged cache whose blocks are scattered; tables padded with 0 as the engine pads."""
    gen = torch.Generator().manual_seed(seed)
    block_size, head_dim = 4, 16
    per_seq = [-(-c // block_size) for c in ctx_lens]
    num_blocks = sum(per_seq) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(ctx_lens), max(per_seq), dtype=torch.int32)
    used = 0
    for s, n in enumerate(per_seq):
        tables[s, :n] = perm[used : used + n]
        used += n
    shape = (num_blocks, block_size, kv_heads, head_dim)
    return {
        "q": torch.randn(sum(q_lens), heads, head_dim, generator=gen),
        "k_cache": torch.randn(shape, generator=gen),
        "v_cache": torch.randn(shape, generator=gen),
        "cu_seqlens_q": torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32),
        "context_lens": torch.tensor(ctx_lens, dtype=torch.int32),
        "block_tables": tables,
    }


@pytest.mark.parametrize(("heads", "kv_heads"), GQA)
@pytest.mark.parametrize(
    ("ctx_lens", "q_lens"),
    [
        ([9, 1, 17, 4], [1, 1, 1, 1]),  # a decode step: one batched attention
        ([9, 12, 5], [9, 5, 1]),  # a whole prompt, a later chunk of one, a decode
    ],
)
def test_paged_attention_equals_the_reference(heads, kv_heads, ctx_lens, q_lens) -> None:
    b = paged_batch(ctx_lens, q_lens, heads, kv_heads)
    want = paged_attention_ref(**b, scale=0.25)
    got = cpu.paged_attention_cpu(**b, scale=0.25, max_q_len=max(q_lens))
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_qkv_prepare_equals_the_reference(qk_norm: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    heads, kv_heads, head_dim, tokens = 6, 2, 16, 5
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    positions = torch.tensor([0, 3, 7, 8, 2])
    cos_sin = torch.randn(16, head_dim, generator=gen)
    slots = torch.tensor([4, -1, 9, 10, 0])  # -1: padding, not stored
    weights = (torch.rand(head_dim, generator=gen) + 0.5, torch.rand(head_dim, generator=gen) + 0.5)
    norm = {"q_norm_weight": weights[0], "k_norm_weight": weights[1], "eps": 1e-6} if qk_norm else {}
    caches = [torch.zeros(4, 4, kv_heads, head_dim) for _ in range(4)]
    want = qkv_prepare_ref(qkv, positions, cos_sin, caches[0], caches[1], slots, **norm)
    got = cpu.qkv_prepare_cpu(qkv, positions, cos_sin, caches[2], caches[3], slots, **norm)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(caches[2], caches[0], **TOL)
    torch.testing.assert_close(caches[3], caches[1], **TOL)


def test_norm_and_activation_equal_the_references() -> None:
    gen = torch.Generator().manual_seed(2)
    x, residual, weight = (torch.randn(3, 32, generator=gen) for _ in range(3))
    torch.testing.assert_close(cpu.rms_norm_cpu(x, weight[0], 1e-6), rms_norm_ref(x, weight[0], 1e-6), **TOL)
    got, got_sum = cpu.rms_norm_cpu(x, weight[0], 1e-6, residual)
    want, want_sum = rms_norm_ref(x, weight[0], 1e-6, residual)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(got_sum, want_sum)
    torch.testing.assert_close(cpu.silu_and_mul_cpu(x), silu_and_mul_ref(x), **TOL)


@pytest.mark.parametrize("rows", [1, 3, 8, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_equals_f_linear_and_follows_weight_updates(rows: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    weight = torch.nn.Parameter(torch.randn(48, 32, generator=gen).to(dtype), requires_grad=False)
    bias = torch.randn(48, generator=gen).to(dtype)
    x = torch.randn(rows, 32, generator=gen).to(dtype)
    tol = TOL if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    with torch.inference_mode():
        torch.testing.assert_close(cpu.linear_cpu(x, weight, bias), F.linear(x, weight, bias), **tol)
    with torch.no_grad():
        weight.mul_(-1)  # written again: the packed copy must follow
    with torch.inference_mode():
        torch.testing.assert_close(cpu.linear_cpu(x, weight, None), F.linear(x, weight), **tol)


@pytest.mark.parametrize("family", ["llama2", "qwen3"])
def test_engine_on_cpu_backend_equals_the_reference_backend(
    family: str, tiny_checkpoint_factory: Callable[..., Path]
) -> None:
    path = tiny_checkpoint_factory(family)
    prompts = ["The quick brown fox jumps over the lazy dog", "Hi", "kv cache " * 9]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2, prompt_logprobs=1)
    outs = {}
    for backend in ("torch", "cpu"):
        llm = LLM(
            str(path), device="cpu", dtype="float32", max_model_len=128, block_size=4, kernel_backend=backend
        )
        assert llm.engine.runner.ops.name == backend
        outs[backend] = llm.generate(prompts, params)
    for ref, got in zip(outs["torch"], outs["cpu"], strict=True):
        assert got.token_ids == ref.token_ids
        assert [lp.logprob for lp in got.logprobs] == pytest.approx(
            [lp.logprob for lp in ref.logprobs], abs=1e-4
        )
        got_prompt = [lp.logprob for lp in got.prompt_logprobs[1:]]
        assert got_prompt == pytest.approx([lp.logprob for lp in ref.prompt_logprobs[1:]], abs=1e-4)


def test_auto_backend_is_cpu_on_a_cpu(tiny_checkpoint_factory: Callable[..., Path]) -> None:
    llm = LLM(str(tiny_checkpoint_factory("qwen3")), device="cpu", max_model_len=64)
    assert llm.engine.runner.ops.name == "cpu"
