"""GPU (sm_90+): programmatic dependent launch must not race. A decode layer's non-GEMM kernels chained as
the engine chains them (RMSNorm -> qkv_prepare -> decode attention [-> split reduce] -> SiLU-and-mul),
each waiting on the one before it, captured in a CUDA graph with PDL and replayed, must give bit for bit
what the same kernels give launched normally. A kernel that read its predecessor's output before waiting
for it would read stale data (the buffers are refilled with different values between replays)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
    pytest.skip("programmatic dependent launch needs an sm_90+ GPU", allow_module_level=True)

from kvpilot.runtime.kernels.activation_triton import silu_and_mul_triton  # noqa: E402
from kvpilot.runtime.kernels.decode_attention_triton import (  # noqa: E402
    DecodeConfig,
    paged_decode_attention_triton,
)
from kvpilot.runtime.kernels.norm_triton import rms_norm_triton  # noqa: E402
from kvpilot.runtime.kernels.qkv_prepare_triton import qkv_prepare_triton  # noqa: E402

H, KVH, D, PAGE, LAYERS = 8, 2, 64, 16, 6
WIDTH = (H + 2 * KVH) * D  # 768: the layer's hidden is the fused qkv width here (no GEMM in the chain)


def _inputs(num_seqs: int, ctx: int) -> dict[str, torch.Tensor]:
    dev, bf16 = "cuda", torch.bfloat16
    pages = -(-ctx // PAGE)
    tables = torch.randperm(num_seqs * pages, device=dev, dtype=torch.int32).view(num_seqs, pages)
    last = ctx - 1
    slots = tables[:, last // PAGE].long() * PAGE + last % PAGE
    cos_sin = torch.randn(ctx, D, device=dev, dtype=bf16)
    return {
        "hidden": torch.randn(num_seqs, WIDTH, device=dev, dtype=bf16),
        "norm_w": torch.rand(WIDTH, device=dev, dtype=bf16) + 0.5,
        "positions": torch.full((num_seqs,), last, device=dev, dtype=torch.int64),
        "cos_sin": cos_sin,
        "slots": slots,
        "tables": tables,
        "ctx": torch.full((num_seqs,), ctx, device=dev, dtype=torch.int32),
        "k": torch.randn(num_seqs * pages, PAGE, KVH, D, device=dev, dtype=bf16),
        "v": torch.randn(num_seqs * pages, PAGE, KVH, D, device=dev, dtype=bf16),
    }


def _chain(b: dict[str, torch.Tensor], pdl: bool) -> torch.Tensor:
    h = b["hidden"]
    for _ in range(LAYERS):
        qkv = rms_norm_triton(h, b["norm_w"], 1e-6, pdl=pdl)
        q = qkv_prepare_triton(qkv, b["positions"], b["cos_sin"], b["k"], b["v"], b["slots"], pdl=pdl)
        o = paged_decode_attention_triton(
            q, b["k"], b["v"], b["ctx"], b["tables"], D**-0.5, config=DecodeConfig(pdl=pdl)
        )  # [seqs, H, D]
        act = silu_and_mul_triton(o.view(o.shape[0], H * D), pdl=pdl)  # [seqs, H * D / 2]
        h = act.repeat(1, WIDTH // act.shape[1])  # a normally launched kernel between the layers
    return h


@pytest.mark.parametrize(("num_seqs", "ctx"), [(1, 1100), (64, 300)], ids=["split_kv", "single_pass"])
def test_pdl_chain_in_a_graph_equals_normal_launches(num_seqs: int, ctx: int) -> None:
    torch.manual_seed(0)
    b = _inputs(num_seqs, ctx)
    k0, v0 = b["k"].clone(), b["v"].clone()
    _chain(b, pdl=True)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _chain(b, pdl=True)
    for trial in range(3):  # new inputs each replay: stale reads would show
        b["hidden"].copy_(torch.randn_like(b["hidden"]))
        b["k"].copy_(k0)
        b["v"].copy_(v0)
        graph.replay()
        got = out.clone()
        b["k"].copy_(k0)
        b["v"].copy_(v0)
        want = _chain(b, pdl=False)
        torch.cuda.synchronize()
        assert torch.equal(got, want), f"replay {trial}: max diff {(got - want).abs().max().item()}"
