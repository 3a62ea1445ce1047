"""The quantized decode GEMVs with the op before the projection fused in (fp8: kernels/fp8_gemv_triton.py;
int4 / int8 have none since their prologues lost on the H200) against the composed references
(kernels/gemv.py with the format's reference GEMM), and the decoder layer's fused path with quantized
weights (quant/fused_gemv.py through Linear.norm_linear / silu_linear) against its unfused one.

Interpreted on CPU without CUDA (tiny shapes, float32 and one fp16 case), compiled on the GPU otherwise.
"""

from __future__ import annotations

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

from kvpilot.runtime.engine.batch import SeqChunk, StepBatch  # noqa: E402
from kvpilot.runtime.engine.engine_args import EngineArgs  # noqa: E402
from kvpilot.runtime.engine.model_runner import ModelRunner  # noqa: E402
from kvpilot.runtime.kernels.activation import silu_and_mul_ref  # noqa: E402
from kvpilot.runtime.kernels.fp8_gemv_triton import norm_fp8_gemv, silu_fp8_gemv  # noqa: E402
from kvpilot.runtime.kernels.gemv import composed_norm_linear, composed_silu_linear  # noqa: E402
from kvpilot.runtime.kernels.int_gemv_triton import GemvConfig  # noqa: E402
from kvpilot.runtime.kernels.norm import rms_norm_ref  # noqa: E402
from kvpilot.runtime.kernels.quant_reference import (  # noqa: E402
    fp8_weight_only_ref,
    quantize_fp8_rows_ref,
)
from kvpilot.runtime.quant import fused_gemv  # noqa: E402

DEVICE = torch.device("cpu" if INTERPRET else "cuda")
EPS = 1e-6
TOL = {"rtol": 1e-4, "atol": 1e-4}  # float32: the same sums up to order
# whole-model logits, fused vs unfused runners: on a GPU the split-K partials and the norm's 1/rms after
# the dot sum in other orders (the bf16 weights' model test saw 2.5e-4 on the H200: test_kernels_gemv)
MODEL_TOL = TOL if INTERPRET else {"rtol": 1e-3, "atol": 1e-3}
FP16_TOL = {"rtol": 2e-3, "atol": 2e-2}  # the kernel rounds h w_norm to fp16 for the dot, the reference
N, K = 40, 256  # N ragged against every BLOCK_N; K two pack tiles of 128


def _vectors(k: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """hidden, residual [1, k], the norm weight [k], gate_up [1, 2k]."""
    gen = torch.Generator().manual_seed(seed)
    hidden, residual = torch.randn(2, 1, k, generator=gen)
    norm_weight = 1 + 0.1 * torch.randn(k, generator=gen)
    gate_up = torch.randn(1, 2 * k, generator=gen)
    return tuple(t.to(DEVICE, dtype) for t in (hidden, residual, norm_weight, gate_up))


def _check_fused(
    linear: Callable[..., torch.Tensor],
    norm: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    silu: Callable[..., torch.Tensor],
    dtype: torch.dtype,
) -> None:
    """norm (with and without a residual) and silu against the composed references."""
    hidden, residual, norm_weight, gate_up = _vectors(K, dtype, seed=1)
    tol = TOL if dtype == torch.float32 else FP16_TOL
    for res in (residual, None):
        want_y, want_h = composed_norm_linear(rms_norm_ref, linear)(hidden, res, norm_weight, EPS, None)
        got_y, got_h = norm(hidden, res, norm_weight, EPS)
        torch.testing.assert_close(got_y.float(), want_y.float(), **tol)
        assert torch.equal(got_h, want_h)  # h = hidden + residual rounded as the reference rounds
    want = composed_silu_linear(silu_and_mul_ref, linear)(gate_up, None)
    torch.testing.assert_close(silu(gate_up).float(), want.float(), **tol)


FP8_CONFIGS = [  # None: the dispatch's M = 1 shape; split-K with the whole row re-read; wider tiles
    None,
    GemvConfig(use_dot=False, block_n=4, split_k=2, num_warps=1, block_m=1, block_k=64),
    GemvConfig(use_dot=False, block_n=8, split_k=4, num_warps=2, block_m=1, block_k=64, reduce="workspace"),
]


@pytest.mark.parametrize("config", FP8_CONFIGS, ids=lambda c: "default" if c is None else f"split{c.split_k}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fp8_fused_gemvs_match_the_composed_reference(config: GemvConfig | None, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    weight, scale = quantize_fp8_rows_ref(torch.randn(N, K, generator=gen))
    weight, scale = weight.to(DEVICE), scale.view(-1).to(DEVICE)

    def linear(x: torch.Tensor, _w: object, _b: object) -> torch.Tensor:
        return fp8_weight_only_ref(x, weight, scale)

    _check_fused(
        linear,
        lambda h, r, nw, eps: norm_fp8_gemv(h, r, nw, eps, weight, scale, config),
        lambda gu: silu_fp8_gemv(gu, weight, scale, config),
        dtype,
    )


def test_fused_launches_refuse_what_they_cannot_run() -> None:
    hidden, residual, norm_weight, gate_up = _vectors(K, torch.float32, seed=2)
    weight, scale = quantize_fp8_rows_ref(torch.randn(N, K))
    weight, scale = weight.to(DEVICE), scale.view(-1).to(DEVICE)
    with pytest.raises(ValueError, match="multiply-add path"):
        norm_fp8_gemv(hidden, residual, norm_weight, EPS, weight, scale, GemvConfig(use_dot=True))
    with pytest.raises(ValueError, match="must be"):
        silu_fp8_gemv(gate_up[:, :K], weight, scale)


def test_by_default_only_fp8_silu_fuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The H200 chain's verdict (quant/fused_gemv.py's doc): the fp8 SiLU fuses; the fp8 norm leaves the
    layer to the separate ops (None) unless a config asks for the kernel; the int formats never fuse."""
    monkeypatch.setattr(fused_gemv, "kernels_run_on", lambda x: True)
    hidden, residual, norm_weight, gate_up = _vectors(K, torch.float32, seed=4)
    weight, scale = quantize_fp8_rows_ref(torch.randn(N, K))
    weight, scale = weight.to(DEVICE), scale.view(-1).to(DEVICE)
    assert fused_gemv.fp8_norm_linear(hidden, residual, norm_weight, EPS, weight, scale, None) is None
    assert fused_gemv.fp8_silu_linear(gate_up, weight, scale, None) is not None
    cfg8 = fused_gemv.fp8_config(N, K, DEVICE)
    assert (
        fused_gemv.fp8_norm_linear(hidden, residual, norm_weight, EPS, weight, scale, None, cfg8) is not None
    )


Entries = tuple[Callable[..., torch.Tensor], Callable[..., object], Callable[..., object]]


def _dispatched(fmt: str, w: torch.Tensor) -> Entries:
    """(reference linear, fused norm entry, fused silu entry) of quant/fused_gemv.py for W [N, K] in fmt."""
    if fmt == "fp8":
        weight, scale = quantize_fp8_rows_ref(w)
        scale = scale.view(-1)

        def ref(x: torch.Tensor, _w: object, _b: object) -> torch.Tensor:
            return fp8_weight_only_ref(x, weight, scale)

        n, k = weight.shape
        cfg8 = fused_gemv.fp8_config(n, k, weight.device)  # past the switch (norm: off)

        def norm(h: torch.Tensor, r: torch.Tensor, nw: torch.Tensor) -> object:
            return fused_gemv.fp8_norm_linear(h, r, nw, EPS, weight, scale, None, cfg8)

        return ref, norm, lambda gu: fused_gemv.fp8_silu_linear(gu, weight, scale, None)
    raise ValueError(f"no fused GEMV for {fmt}")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8"])
@pytest.mark.parametrize(
    ("n", "k", "prologue"), [(6144, 4096, "norm"), (24576, 4096, "norm"), (4096, 12288, "silu")]
)
def test_dispatched_fused_gemvs_at_qwen3_8b_shapes_bf16(fmt: str, n: int, k: int, prologue: str) -> None:
    """quant/fused_gemv.py's entries as the model calls them (bf16, the dispatch's shapes and split-K,
    PDL) on qkv / gate_up (norm) and down (silu), against the references."""
    w = (torch.randn(n, k, generator=torch.Generator().manual_seed(n)) * k**-0.5).to(DEVICE)
    hidden, residual, norm_weight, gate_up = _vectors(k, torch.bfloat16, seed=n)
    ref, norm, silu = _dispatched(fmt, w)
    if prologue == "norm":
        got = norm(hidden, residual, norm_weight)
        assert isinstance(got, tuple)
        want, want_h = composed_norm_linear(rms_norm_ref, ref)(hidden, residual, norm_weight, EPS, None)
        assert torch.equal(got[1], want_h)
        got_y = got[0]
    else:
        got_y = silu(gate_up)
        assert isinstance(got_y, torch.Tensor)
        want = composed_silu_linear(silu_and_mul_ref, ref)(gate_up, None)
    err = (got_y.float() - want.float()).norm() / want.float().norm()
    assert float(err) < 1e-2, (fmt, n, k, float(err))


# ---------------------------------------------------------------- the model's fused decode path, quantized


def _runner(ckpt: Path, quantization: str, fused: bool) -> ModelRunner:
    runner = ModelRunner(
        EngineArgs(
            model=str(ckpt),
            block_size=4,
            num_kv_blocks=8,
            device=str(DEVICE),
            dtype="float32",
            kernel_backend="triton",
            quantization=quantization,
            enforce_eager=True,  # graphs captured before the switch below would hold the fused path
        )
    )
    for layer in runner.model.model.layers:
        layer.fused_gemv = fused
    return runner


@pytest.mark.parametrize("quantization", ["fp8"])
def test_quantized_fused_decode_path_matches_unfused(
    quantization: str, tiny_checkpoint_factory: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefill (unfused in both runners), then a single-token decode step: the runner whose layers fuse
    (the fused GEMVs through Linear.norm_linear / silu_linear and the quant method) gives the unfused
    runner's logits, and its fused kernels ran at every site (qkv, gate_up, down of every layer)."""
    monkeypatch.setattr(fused_gemv, "kernels_run_on", lambda x: True)  # the interpreter on CPU
    for switch in ("FUSE_FP8_NORM", "FUSE_FP8_SILU"):
        monkeypatch.setattr(fused_gemv, switch, True)  # most are off by default (the module doc): wired too
    calls = {"norm": 0, "silu": 0}
    names = {"norm": "norm_fp8_gemv", "silu": "silu_fp8_gemv"}
    for kind, name in names.items():
        fn = getattr(fused_gemv, name)

        def counted(*args: object, _fn: Callable[..., object] = fn, _kind: str = kind) -> object:
            calls[_kind] += 1
            return _fn(*args)

        monkeypatch.setattr(fused_gemv, name, counted)
    ckpt = tiny_checkpoint_factory("qwen3", hidden_size=128, intermediate_size=256)
    fused, unfused = _runner(ckpt, quantization, True), _runner(ckpt, quantization, False)
    assert all(layer.self_attn.fusable and layer.mlp.fusable for layer in fused.model.model.layers)
    steps = [StepBatch([SeqChunk(0, [5, 9, 17], 0, [3], True)]), StepBatch([SeqChunk(0, [12], 3, [3], True)])]
    for step in steps:
        torch.testing.assert_close(fused.execute(step), unfused.execute(step), **MODEL_TOL)
    layers = len(fused.model.model.layers)
    assert calls == {"norm": 2 * layers, "silu": layers}  # the decode step's qkv, gate_up and down


@pytest.mark.parametrize("quantization", ["int4", "int8"])
def test_int_formats_run_the_ops_apart_on_the_fused_path(
    quantization: str, tiny_checkpoint_factory: Callable[..., Path]
) -> None:
    """int4 / int8 have no fused GEMV: their projections are not fusable, so a runner whose layers may
    fuse runs the norm, the SiLU and the GEMVs apart and gives the unfused runner's logits."""
    ckpt = tiny_checkpoint_factory("qwen3", hidden_size=128, intermediate_size=256)
    fused, unfused = _runner(ckpt, quantization, True), _runner(ckpt, quantization, False)
    assert not any(layer.self_attn.fusable or layer.mlp.fusable for layer in fused.model.model.layers)
    steps = [StepBatch([SeqChunk(0, [5, 9, 17], 0, [3], True)]), StepBatch([SeqChunk(0, [12], 3, [3], True)])]
    for step in steps:
        torch.testing.assert_close(fused.execute(step), unfused.execute(step), **MODEL_TOL)
