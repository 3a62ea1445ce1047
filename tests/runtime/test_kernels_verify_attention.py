"""The verification attention kernel (Q query tokens per sequence, split-KV) vs paged_attention_ref.

Without CUDA the kernel runs under TRITON_INTERPRET=1 on CPU in float32 at tiny sizes; tests marked `gpu`
run Qwen3-8B head shapes in bf16 and check that the launch is CUDA-graph capturable.
"""

from __future__ import annotations

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.kernels import attention_triton  # noqa: E402
from kvpilot.runtime.kernels.attention import paged_attention_ref  # noqa: E402
from kvpilot.runtime.kernels.decode_attention_triton import DecodeConfig, DecodePlan  # noqa: E402
from kvpilot.runtime.kernels.kv_cache import quantize_ref  # noqa: E402
from kvpilot.runtime.kernels.verify_attention_triton import paged_verify_attention_triton  # noqa: E402

from tests.runtime.test_kernels_attention import make_batch as paged_batch  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"
TOL = {"atol": 1e-4, "rtol": 1e-4} if DEVICE == "cpu" else {"atol": 2e-2, "rtol": 2e-2}
SMALL = DecodeConfig(block_n=16, min_partition=16)


def make_batch(
    ctx_lens: list[int],
    query_len: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """test_kernels_attention's random paged batch (pages scattered, unused table entries -1) with
    query_len query tokens for every sequence."""
    q_lens = [query_len] * len(ctx_lens)
    return paged_batch(
        ctx_lens, q_lens, num_heads, num_kv_heads, head_dim, block_size, seed=seed, dtype=dtype
    )


def reference(b: dict[str, torch.Tensor], scale: float, **kw: torch.Tensor) -> torch.Tensor:
    keys = ("q", "k_cache", "v_cache", "cu_seqlens_q", "context_lens", "block_tables")
    return paged_attention_ref(*(b[k] for k in keys), scale, **kw)


def verify(b: dict[str, torch.Tensor], scale: float, **kw: object) -> torch.Tensor:
    keys = ("q", "k_cache", "v_cache", "context_lens", "block_tables")
    return paged_verify_attention_triton(*(b[k] for k in keys), scale, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 2), (6, 2), (4, 1)])
@pytest.mark.parametrize("query_len", [2, 5])
@pytest.mark.parametrize("plan", [DecodePlan(1, 48), DecodePlan(3, 16)], ids=["single_pass", "split_kv"])
def test_verify_matches_reference(
    num_heads: int, num_kv_heads: int, query_len: int, plan: DecodePlan
) -> None:
    # contexts: exactly Q (no history), a partition boundary inside the Q rows (17 - 5 .. 16), odd, long
    ctx_lens = [query_len, 17, 33, 45]
    b = make_batch(ctx_lens, query_len, num_heads, num_kv_heads, 16, 4, seed=query_len + num_heads)
    torch.testing.assert_close(verify(b, 0.37, config=SMALL, plan=plan), reference(b, 0.37), **TOL)


def test_a_plan_whose_partition_is_only_a_minimum_spreads_the_context() -> None:
    """Plans with run-time adaptive splits give the fewest positions per split: 2 splits of at least 16
    positions must still cover contexts of 45 (2 x 32)."""
    b = make_batch([5, 17, 45], 5, 4, 2, 16, 4, seed=8)
    out = verify(b, 0.37, config=SMALL, plan=DecodePlan(2, 16))
    torch.testing.assert_close(out, reference(b, 0.37), **TOL)


def test_verify_planned_split_and_odd_head_dim() -> None:
    b = make_batch([40, 9], 3, 4, 2, 24, 8, seed=4)  # head_dim 24: padded to 32 inside the kernel
    for sms in (1, 132):  # one pass / split-KV as plan_decode chooses
        torch.testing.assert_close(verify(b, 0.3, config=SMALL, sms=sms), reference(b, 0.3), **TOL)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn], ids=["int8", "fp8"])
def test_verify_dequantizes_8bit_caches(dtype: torch.dtype) -> None:
    b = make_batch([21, 30], 4, 4, 2, 16, 4, seed=9)
    k, k_scale = quantize_ref(b["k_cache"], dtype)
    v, v_scale = quantize_ref(b["v_cache"], dtype)
    b8 = {**b, "k_cache": k, "v_cache": v}
    scales = {"k_scale": k_scale, "v_scale": v_scale}
    for plan in (DecodePlan(1, 32), DecodePlan(2, 16)):
        out = verify(b8, 0.25, config=SMALL, plan=plan, **scales)
        torch.testing.assert_close(out, reference(b8, 0.25, **scales), **TOL)


def test_dispatcher_sends_uniform_small_query_lens_to_the_verify_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    real = attention_triton.paged_verify_attention_triton

    def spy(*a: object, **k: object) -> torch.Tensor:
        calls.append("verify")
        return real(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(attention_triton, "paged_verify_attention_triton", spy)
    b = make_batch([12, 20], 3, 4, 2, 16, 4, seed=5)
    keys = ("q", "k_cache", "v_cache", "cu_seqlens_q", "context_lens", "block_tables")
    args = [b[k] for k in keys]
    torch.testing.assert_close(
        attention_triton.paged_attention_triton(*args, 0.3, max_q_len=3), reference(b, 0.3), **TOL
    )
    assert calls == ["verify"]
    attention_triton.paged_attention_triton(*args, 0.3, max_q_len=4)  # not uniform: the prefill kernel
    attention_triton.paged_attention_triton(*args, 0.3)  # no hint: the prefill kernel
    assert calls == ["verify"]


def test_uneven_query_rows_are_refused() -> None:
    b = make_batch([12, 20], 3, 4, 2, 16, 4, seed=6)
    with pytest.raises(ValueError, match="split evenly"):
        verify({**b, "q": b["q"][:5]}, 0.3)


# ---------------------------------------------------------------- GPU: Qwen3-8B heads, bf16


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_gpu_verify_qwen3_8b_and_graph_capture(batch: int) -> None:
    ctx = [1024 + 37 * i for i in range(batch)]
    b = make_batch(ctx, 5, 32, 8, 128, 16, seed=batch, dtype=torch.bfloat16)
    want = reference(b, 0.088)
    torch.testing.assert_close(verify(b, 0.088), want, atol=2e-2, rtol=2e-2)
    out = verify(b, 0.088)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = verify(b, 0.088)
    b["q"].copy_(torch.randn_like(b["q"]))
    graph.replay()
    torch.testing.assert_close(out, reference(b, 0.088), atol=2e-2, rtol=2e-2)


COMPILE = """
import json
from kvpilot.runtime.kernels import verify_attention_triton as v
from kvpilot.runtime.kernels.compile_specs import ATTN_TYPES, DEC_NODIV, HEADS, scaled
from kvpilot.runtime.kernels.triton_compile import KernelSpec, compile_kernel
types = {**ATTN_TYPES, "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"}
consts = {"Q": 5, "GROUP": 4, "GROUP_PAD": 4, "BLOCK_M": 32, **HEADS}
specs = []
for kv, cfg in (("bf16", v.DecodeConfig()), ("fp8", v.EIGHT_BIT_VERIFY), ("int8", v.EIGHT_BIT_VERIFY)):
    kernel_types = types if kv == "bf16" else scaled(types, kv)
    for split in (False, True):
        c = {**consts, "BLOCK_N": cfg.block_n, "SCALED": kv != "bf16", "SPLIT": split}
        launch = (cfg.num_warps, cfg.num_stages, DEC_NODIV)
        specs.append(KernelSpec(f"{kv}_{split}", v._verify_kernel, kernel_types, c, *launch))
reduce_types = {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": "*bf16"}
reduce_types["context_lens_ptr"] = "*i32"
reduce_consts = {"Q": 5, "HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_S": 64}
specs.append(KernelSpec("reduce", v._decode_reduce_kernel, reduce_types, reduce_consts, 4, 1, DEC_NODIV))
print(json.dumps({s.name: compile_kernel(s).__dict__ for s in specs}))
"""


def test_verify_kernels_compile_for_sm90_without_spills() -> None:
    """Qwen3-8B heads, k = 4 (Q = 5), bf16 and 8-bit pages, single pass and split: the real compiler
    (in a subprocess: this one may run the interpreter) accepts them, K/V loads stay pipelined, no spills."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reports = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(reports) == 7
    for name, report in reports.items():
        assert (report["stack_bytes"] or 0) <= 32, f"{name} spills registers: {report}"
        if name != "reduce":
            assert report["async_copies"] > 0, f"{name}: K/V loads are not pipelined"
