"""The weight-only integer GEMM kernels (kernels/w4a16_triton.py) against their torch reference.

Without CUDA they run under TRITON_INTERPRET=1 at tiny shapes (float32 activations); tests marked `gpu`
run Qwen3-8B layer shapes in bf16.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.kernels.fp8_gemv_triton import fp8_gemv  # noqa: E402
from kvpilot.runtime.kernels.int_gemv_triton import (  # noqa: E402
    GEMV_MAX_M,
    GemvConfig,
    default_gemv_config,
    default_split_k,
    gemv_bucket,
    int_gemv,
    warm_up_m,
)
from kvpilot.runtime.kernels.quant_reference import (  # noqa: E402
    fp8_block_w8a8_ref,
    fp8_weight_only_ref,
    int_gemm_ref,
    quantize_fp8_rows_ref,
)
from kvpilot.runtime.kernels.w4a16_triton import (  # noqa: E402
    decode_launch,
    dequantize_triton,
    fused_supported,
    int_gemm,
    int_gemm_fused,
)
from kvpilot.runtime.quant.int_weight import quantize_rtn  # noqa: E402

DEVICE = torch.device("cpu" if INTERPRET else "cuda")
# float32 activations: IEEE float32 dots in the kernel (not tf32), on the GPU as under the interpreter
TOL = {"rtol": 1e-4, "atol": 1e-4}


def weights(
    n: int, k: int, bits: int, group: int, dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    # quantized where the kernels run: Qwen3-8B's shapes quantize in milliseconds on the GPU
    w = quantize_rtn(torch.randn(n, k, generator=gen).to(DEVICE), bits, group, sym=bits == 8)
    return w.qweight.to(DEVICE), w.scales.to(DEVICE, dtype), w.zeros.to(DEVICE, dtype)


@pytest.mark.parametrize(
    ("m", "bits", "group", "split_k"),
    [(1, 4, 32, None), (3, 4, 16, 2), (5, 8, -1, 1), (20, 4, 32, None), (33, 8, 32, None)],
)
def test_fused_kernel_matches_reference(m: int, bits: int, group: int, split_k: int | None) -> None:
    n, k = 48, 256  # N not a multiple of BLOCK_N: masked columns; K two interleaved tiles of 128
    qweight, scales, zeros = weights(n, k, bits, group, torch.float32)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(DEVICE)
    got = int_gemm_fused(x, qweight, scales, zeros, bits, split_k=split_k)
    want = int_gemm_ref(x, qweight, scales, zeros, bits)
    torch.testing.assert_close(got, want, **TOL)


QWEN3_8B_LAYERS = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)]  # (N, K): qkv, o, gate_up, down
# decode GEMV launch shapes: both multiply paths, every split-K reduction, several pack tiles per step
GEMV_CONFIGS = [
    GemvConfig(use_dot=False, block_n=32, split_k=1, tiles=2),
    GemvConfig(use_dot=True, block_n=32, split_k=2, reduce="fixup"),
    GemvConfig(use_dot=False, block_n=64, split_k=2, reduce="fixup"),
    GemvConfig(use_dot=False, block_n=64, split_k=2, reduce="atomic"),
    GemvConfig(use_dot=False, block_n=16, split_k=2, reduce="workspace"),
    GemvConfig(use_dot=True, block_n=32, split_k=2, reduce="atomic_f32"),
    GemvConfig(use_dot=True, block_n=64, split_k=1),
    GemvConfig(use_dot=True, block_n=16, split_k=2, block_m=32, reduce="fixup"),
    GemvConfig(use_dot=True, block_n=16, split_k=2, reduce="workspace"),
]


@pytest.mark.parametrize("config", GEMV_CONFIGS, ids=lambda c: f"{'dot' if c.use_dot else 'fma'}-{c.reduce}")
@pytest.mark.parametrize(("bits", "group"), [(4, 128), (4, 32), (8, -1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gemv_matches_reference(config: GemvConfig, bits: int, group: int, dtype: torch.dtype) -> None:
    """Every launch shape at M <= 16, one group per tile or several (group 32 < the 128-row tile); fp16
    activations take the 16-bit magic-number operands (bf16's dots need the GPU: the interpreter cannot)."""
    n, k = 48, 256
    qweight, scales, zeros = weights(n, k, bits, group, dtype)
    m = 1 if not config.use_dot else 5
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(bits)).to(DEVICE, dtype)
    got = int_gemv(x, qweight, scales, zeros, bits, config).float()
    want = int_gemm_ref(x.float(), qweight, scales.float(), zeros.float(), bits)
    tol = TOL if dtype == torch.float32 else {"rtol": 2e-3, "atol": 2e-2}  # fp16 output rounding
    torch.testing.assert_close(got, want, **tol)


def test_gemv_rejects_a_config_that_does_not_tile_k() -> None:
    qweight, scales, zeros = weights(16, 256, 4, 128, torch.float32)
    with pytest.raises(ValueError, match="does not fit K"):
        int_gemv(torch.ones(1, 256, device=DEVICE), qweight, scales, zeros, 4, GemvConfig(split_k=4, tiles=1))
    with pytest.raises(ValueError, match="does not fit K"):
        int_gemv(torch.ones(1, 256, device=DEVICE), qweight, scales, zeros, 4, GemvConfig(reduce="sum"))


def test_default_gemv_config_takes_the_h200_sweeps_best_splits() -> None:
    # Qwen3-8B on an H200 (132 SMs): the split-K the sweep measured fastest for each layer, at M = 1/16
    # (64 columns per program) and at M = 64 (two row blocks of 32 tokens, 128 columns)
    for m in (1, 16):
        splits = [default_gemv_config(m, n, k, 4, 132).split_k for n, k in QWEN3_8B_LAYERS]
        assert splits == [4, 8, 1, 8]  # qkv, o, gate_up, down (o: 4 and 8 within 1%)
    cfg = default_gemv_config(1, 6144, 4096, 4, 132)
    assert cfg.use_dot and cfg.pair_asm and (cfg.block_m, cfg.block_n, cfg.reduce) == (16, 64, "fixup")
    cfg = default_gemv_config(64, 24576, 4096, 4, 132)
    assert (cfg.block_m, cfg.block_n, cfg.split_k) == (32, 128, 1)
    assert default_split_k(64, 96, 132) == 8 and default_split_k(64, 3, 132) == 1  # short K: no split
    from kvpilot.runtime.kernels.fp8_gemv_triton import default_fp8_gemv_config

    fp8 = [default_fp8_gemv_config(1, n, k, 132) for n, k in QWEN3_8B_LAYERS]
    # fp8 M = 1: one-warp multiply-adds over 4 rows x 512 of K, >= 8 programs per SM (the H200 sweep)
    assert [c.split_k for c in fp8] == [1, 2, 1, 2] and not any(c.use_dot for c in fp8)
    assert {(c.block_n, c.block_k, c.num_warps) for c in fp8} == {(4, 512, 1)}
    for m, n, k in ((1, 24576, 4096), (4, 4096, 4096), (1, 64, 384), (40, 1024, 3072)):
        cfg = default_gemv_config(m, n, k, 4, 132)
        steps = k // 128
        assert steps % (cfg.split_k * cfg.tiles) == 0 and steps // cfg.split_k >= min(steps, 4)


def test_launch_shapes_depend_on_the_bucket_of_m_only() -> None:
    """M changes every serving step: a shape (and so a compiled variant) per M would compile mid-serving.
    The warm-up Ms cover every bucket."""
    from kvpilot.runtime.kernels.fp8_gemv_triton import default_fp8_gemv_config

    buckets = {gemv_bucket(m) for m in range(1, GEMV_MAX_M + 1)}
    assert buckets == {gemv_bucket(m) for m in warm_up_m()} and len(buckets) == 3
    for n, k, bits in ((6144, 4096, 4), (4096, 12288, 8)):
        shapes: dict[tuple[int, int, int], GemvConfig] = {}
        for m in range(1, GEMV_MAX_M + 1):
            shape = shapes.setdefault(gemv_bucket(m), default_gemv_config(m, n, k, bits, 132))
            assert default_gemv_config(m, n, k, bits, 132) == shape, m
    fp8 = {default_fp8_gemv_config(m, 4096, 4096, 132) for m in range(1, 17)}
    assert len(fp8) == 2  # M = 1 (multiply-adds) and 2..16 (dots): both warmed up by warm_up_fp8_gemv


@pytest.mark.parametrize(
    "config", [None, *GEMV_CONFIGS[1:4]], ids=lambda c: "default" if c is None else c.reduce
)
@pytest.mark.parametrize("k", [256, 320])  # 320: a ragged last K block of 64
def test_fp8_weight_only_gemv_matches_reference(config: GemvConfig | None, k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    weight, scale = quantize_fp8_rows_ref(torch.randn(40, k, generator=gen))
    weight, scale = weight.to(DEVICE), scale.view(-1).to(DEVICE)
    if config is not None and k == 320:
        config = GemvConfig(use_dot=config.use_dot, block_n=config.block_n)  # 3 K blocks: no even split
    for m, dtype in ((1, torch.float32), (3, torch.float32), (2, torch.float16)):
        if config is not None and config.use_dot != (m > 1):
            continue
        x = torch.randn(m, k, generator=gen).to(DEVICE, dtype)
        got = fp8_gemv(x, weight, scale, config).float()
        want = fp8_weight_only_ref(x.float(), weight, scale)
        tol = TOL if dtype == torch.float32 else {"rtol": 2e-3, "atol": 2e-2}
        torch.testing.assert_close(got, want, **tol)


def test_decode_launch_fills_the_sms_with_short_k_loops() -> None:
    # Qwen3-8B on an H200 (132 SMs), K steps of 128 rows: (BLOCK_N, SPLIT_K)
    assert decode_launch(6144, 32, 132) == (64, 4)  # qkv: 96 tiles x 4 = 384 programs, 8 steps each
    assert decode_launch(24576, 32, 132) == (64, 2)  # gate_up: 384 tiles x 2
    assert decode_launch(4096, 96, 132) == (64, 8)  # down: 64 tiles x 8 splits of 12 steps
    assert decode_launch(4096, 32, 132) == (64, 8)  # o: 64 tiles x 8 splits of 4 steps
    assert decode_launch(64, 3, 132) == (64, 1)  # too few steps to split
    for n, steps in ((6144, 32), (4096, 96), (512, 10)):
        split = decode_launch(n, steps, 132)[1]
        assert steps % split == 0 and steps // split >= min(steps, 4)


def test_fused_kernel_takes_real_layouts_and_leaves_tiny_ones_to_dequantize() -> None:
    assert fused_supported(4096, 128, 4) and fused_supported(12288, 4096, 8)
    assert fused_supported(4096, 16, 4) and not fused_supported(4096, 16, 8)  # int8 dots span 32 rows
    assert not fused_supported(64, 32, 4)  # K = 64: a tile of 64 rows gives dots of 8 rows
    qweight, scales, zeros = weights(16, 64, 4, 32, torch.float32)
    with pytest.raises(ValueError, match="fused"):
        int_gemm_fused(torch.ones(1, 64, device=DEVICE), qweight, scales, zeros, 4)


def test_dequantize_kernel_and_permuted_inputs() -> None:
    qweight, scales, zeros = weights(32, 32, 4, 16, torch.float32, seed=1)
    from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref

    torch.testing.assert_close(
        dequantize_triton(qweight, scales, zeros, 4, torch.float32),
        dequantize_int_ref(qweight, scales, zeros, 4),
    )
    perm = torch.randperm(32, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    x = torch.randn(2, 32).to(DEVICE)
    torch.testing.assert_close(
        int_gemm(x, qweight, scales, zeros, 4, perm),
        int_gemm_ref(x, qweight, scales, zeros, 4, perm),
        **TOL,
    )
    torch.testing.assert_close(
        int_gemm(x[:, perm], qweight, scales, zeros, 4),
        int_gemm_ref(x[:, perm], qweight, scales, zeros, 4),
        **TOL,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 16, 64, 256, 1024])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)])
def test_qwen3_8b_shapes_bf16(m: int, n: int, k: int) -> None:
    """Qwen3-8B's qkv, o, gate_up and down projections, int4 group 128 and int8 per channel."""
    for bits, group in ((4, 128), (8, -1)):
        qweight, scales, zeros = weights(n, k, bits, group, torch.bfloat16)
        x = (0.1 * torch.randn(m, k)).to(DEVICE, torch.bfloat16)
        got = int_gemm(x, qweight, scales, zeros, bits).float()
        want = int_gemm_ref(x.float(), qweight, scales.float(), zeros.float(), bits)
        err = (got - want).norm() / want.norm()
        assert float(err) < 1e-2, (bits, m, n, k, float(err))


SWEEP_SAMPLE = [
    GemvConfig(use_dot=True, block_n=128, split_k=8, pair_asm=True),
    GemvConfig(use_dot=True, block_n=256, split_k=2, reduce="atomic", pair_asm=True, num_warps=8),
    GemvConfig(use_dot=False, block_n=64, split_k=4, tiles=2),
    GemvConfig(use_dot=False, block_n=128, split_k=8, tiles=1, reduce="atomic"),
    GemvConfig(use_dot=False, block_n=32, split_k=2, tiles=4, reduce="workspace", num_warps=8),
    GemvConfig(use_dot=True, block_n=64, split_k=4),
    GemvConfig(use_dot=True, block_n=128, split_k=1, num_warps=8),
    GemvConfig(use_dot=True, block_n=32, split_k=8, reduce="atomic", num_stages=2),
]


@pytest.mark.gpu
@pytest.mark.parametrize("config", SWEEP_SAMPLE, ids=lambda c: f"{'dot' if c.use_dot else 'fma'}-{c.reduce}")
@pytest.mark.parametrize(("bits", "group"), [(4, 128), (4, 64), (8, -1)])
def test_gemv_bf16_launch_shapes(config: GemvConfig, bits: int, group: int) -> None:
    """bf16 activations (the 0x4300 magic operands and bf16 atomics, which the CPU interpreter cannot run)
    at Qwen3-8B's down projection, for launch shapes the benchmark sweep may pick."""
    n, k = 4096, 12288
    qweight, scales, zeros = weights(n, k, bits, group, torch.bfloat16)
    for m in (1, 16) if config.use_dot else (1,):
        x = (0.1 * torch.randn(m, k)).to(DEVICE, torch.bfloat16)
        got = int_gemv(x, qweight, scales, zeros, bits, config).float()
        want = int_gemm_ref(x.float(), qweight, scales.float(), zeros.float(), bits)
        assert float((got - want).norm() / want.norm()) < 1e-2, (config, m)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 16, 64])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 12288)])
def test_fp8_linear_bf16(m: int, n: int, k: int) -> None:
    """The fp8 dispatch: weight-only GEMV at M <= 16 (against x @ W^T), W8A8 _scaled_mm above."""
    from kvpilot.runtime.kernels.quant_reference import fp8_gemm_ref
    from kvpilot.runtime.quant.fp8_gemm import fp8_linear

    w, w_scale = quantize_fp8_rows_ref(0.02 * torch.randn(n, k, device=DEVICE))
    x = (0.1 * torch.randn(m, k, device=DEVICE)).bfloat16()
    got = fp8_linear(x, w, w_scale.view(-1), None).float()
    ref = fp8_weight_only_ref if m <= 16 else fp8_gemm_ref
    want = ref(x.float(), w, w_scale.view(-1)).float()
    assert float((got - want).norm() / want.norm()) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 12288)])
def test_fp8_scaled_mm_matches_its_emulation(n: int, k: int) -> None:
    from kvpilot.runtime.kernels.quant_reference import fp8_gemm_ref, quantize_fp8_rows_ref
    from kvpilot.runtime.quant.fp8_gemm import fp8_scaled_mm

    w, w_scale = quantize_fp8_rows_ref(0.02 * torch.randn(n, k, device=DEVICE))
    x = (0.1 * torch.randn(16, k, device=DEVICE)).bfloat16()
    got = fp8_scaled_mm(x, w, w_scale.view(-1), None).float()
    want = fp8_gemm_ref(x.float(), w, w_scale.view(-1)).float()
    assert float((got - want).norm() / want.norm()) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize(
    "fmt",
    [
        "awq",
        "awq-mixed",
        "gptq",
        "compressed-tensors-int",
        "compressed-tensors-w8a8",
        "fp8-block",
        "fp8-block-w8a8",
        "modelopt-fp8-pb-wo",
        "fbgemm-fp8",
        "int4",
        "int4-q4_1",
        "int4-q4_k_m",
        "int8",
        "int8-q8_0",
        "fp8",
    ],
)
def test_quantized_engine_on_gpu_matches_its_reference_gemms(
    fmt: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Triton kernels under CUDA graphs give the tokens and logprobs of the same weights through the torch
    references (float32 activations). The two kernel sets differ in summation order (and fp8 runs a real
    e4m3 GEMM with bf16 output against a float32 emulation), so logprobs agree within a tolerance, and
    where the reference's top two tokens are closer than that tolerance (a near-tie: seen on the H200 for
    AWQ, margin 0.001) the greedy choice may go either way and the rest of that sequence is not compared."""
    from kvpilot.runtime.fixtures import make_tiny_checkpoint
    from kvpilot.runtime.fixtures.fp8_exports import make_fbgemm_fp8_checkpoint, make_modelopt_checkpoint
    from kvpilot.runtime.fixtures.gguf_grids import make_grid_checkpoint
    from kvpilot.runtime.fixtures.quantized import make_quantized_checkpoint
    from kvpilot.runtime.llm import LLM
    from kvpilot.runtime.sampling_params import SamplingParams

    root = tmp_path_factory.mktemp(fmt)
    if fmt in ("awq", "gptq", "compressed-tensors-int"):
        act_order = fmt != "awq"
        path, quant = make_quantized_checkpoint(root, fmt, group_size=32, sym=False, desc_act=act_order), None
    elif fmt == "awq-mixed":  # layer 0's attention and layer 1's down projection left 16-bit
        keep = ("model.layers.1.mlp.down_proj", *(f"model.layers.0.self_attn.{p}_proj" for p in "qkvo"))
        path, quant = make_quantized_checkpoint(root, "awq", group_size=32, keep_16bit=keep), None
    elif fmt == "compressed-tensors-w8a8":  # int8 per channel, unpacked; prefill past 16 tokens W8A8
        ct = {"bits": 8, "group_size": -1, "ct_format": "int-quantized", "int8_activations": "dynamic"}
        wide = {"hidden_size": 128, "intermediate_size": 256}  # whole 128-row pack tiles: every layer
        path, quant = make_quantized_checkpoint(root, "compressed-tensors-int", **ct, **wide), None
    elif fmt == "fp8-block":  # weight-only: the same tolerance as the integer formats
        path, quant = make_quantized_checkpoint(root, "fp8", block=(32, 32)), None
    elif fmt in ("fp8-block-w8a8", "modelopt-fp8-pb-wo"):  # 128 x 128 blocks: W8A8 past 16 tokens
        wide = {
            "hidden_size": 512,
            "intermediate_size": 1024,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
        }
        if fmt == "fp8-block-w8a8":
            path, quant = make_quantized_checkpoint(root, "fp8", block=(128, 128), **wide), None
        else:  # ModelOpt's [N/128, 1, K/128, 1] scales, read from an older export's hf_quant_config.json
            path, quant = make_modelopt_checkpoint(root, "FP8_PB_WO", legacy=True, **wide), None
    elif fmt == "fbgemm-fp8":
        path, quant = make_fbgemm_fp8_checkpoint(root), None
    elif fmt in ("int4-q4_1", "int8-q8_0"):  # GGUF grids kept (Q4_1: whole zeros, then the offsets)
        path, quant = make_grid_checkpoint(root, fmt[5:]), fmt[:4]
    elif fmt == "int4-q4_k_m":  # Q4_K at 4 bits with offsets, Q6_K v / down held at int8: mixed-bit parts
        path = make_grid_checkpoint(root, "q4_k", mix={"v_proj": "q6_k", "down_proj": "q6_k"})
        quant = "int4"
    else:
        path, quant = make_tiny_checkpoint(root, "qwen3"), fmt
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=2)
    # fp8's real GEMM (W8A8, above 16 tokens, on both backends) writes bf16, the only output row-wise scaling
    # allows; the decode GEMV (W8A16) is compared with its float32 reference (the reference follows the
    # dispatch since the W8A8 emulation at decode sizes was 0.24 apart on the H200). The block-wise W8A8
    # reference rounds its output to bf16 as _scaled_mm does. Block-wise W8A8 layers agree with it to
    # 6e-4-9e-4 on the same input (H100; checked per layer below), and each layer's fp8 activation rounding
    # turns that into whole-step flips: a first token's logprob was 0.16 apart (H100).
    # int8 activations flip whole steps too (finer ones): 0.068 apart once (H100, a packed-weight build).
    tolerance = {"fp8": 0.15, "fbgemm-fp8": 0.15, "compressed-tensors-w8a8": 0.1}.get(fmt, 0.01)
    tolerance = 0.25 if fmt in ("fp8-block-w8a8", "modelopt-fp8-pb-wo") else tolerance
    w8a8 = fmt in ("fp8-block-w8a8", "modelopt-fp8-pb-wo", "compressed-tensors-w8a8")
    layer_errors: list[tuple[str, float]] = []
    prompts = ["the cat sat on", "a quick brown fox"]
    if w8a8 or fmt.startswith(("int4-q4", "int8-q8")):  # a prefill of more than 16 tokens
        prompts.append("the quick brown fox jumps over the lazy dog while the cat sat on the mat again")
    outs = []
    for backend in ("triton", "torch"):
        llm = LLM(
            str(path),
            device="cuda",
            dtype="float32",  # the other kernels differ between the sets: keep their rounding small
            quantization=quant,
            kernel_backend=backend,
            max_model_len=128,
            max_num_batched_tokens=2048,  # the profile step's float32 logits left ~0.1 GiB spare at 8k
            gpu_memory_utilization=0.3,
        )
        if backend == "triton" and w8a8:
            watch_w8a8_layers(llm.engine.runner.model, layer_errors)
        outs.append(llm.generate(prompts, params))
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    compared = 0
    for kernel, reference in zip(outs[0], outs[1], strict=True):
        for got, want, lp_got, lp_want in zip(
            kernel.token_ids, reference.token_ids, kernel.logprobs, reference.logprobs, strict=True
        ):
            top = [v for _, v in lp_want.top_logprobs]
            if got != want:
                assert top[0] - top[1] < tolerance, (fmt, got, want, lp_want.top_logprobs)
                break
            assert lp_got.logprob == pytest.approx(lp_want.logprob, abs=tolerance)
            compared += 1
    assert compared >= 8  # at least one whole sequence agreed token for token
    if w8a8:  # every layer ran W8A8 in the prefill, each within bf16 of its reference on the same input
        assert len({n for n, _ in layer_errors}) == 8 and max(e for _, e in layer_errors) < 3e-3, layer_errors


def watch_w8a8_layers(model: torch.nn.Module, errors: list[tuple[str, float]]) -> None:
    """Appends (layer, relative error against its W8A8 reference on the same input) for each eager call of a
    block-wise fp8 or W8A8 int8 layer with more than 16 tokens (the W8A8 path)."""
    from kvpilot.runtime.kernels.quant_reference import FP8_WEIGHT_ONLY_MAX_M, int8_gemm_ref
    from kvpilot.runtime.quant.fp8_block import Fp8BlockMethod
    from kvpilot.runtime.quant.int8_channel import Int8ChannelMethod

    def check(name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            method, x = module.quant_method, inputs[0].reshape(-1, inputs[0].shape[-1])
            if torch.cuda.is_current_stream_capturing() or x.shape[0] <= FP8_WEIGHT_ONLY_MAX_M:
                return
            if isinstance(method, Int8ChannelMethod):
                want = int8_gemm_ref(x, method.weight, method.weight_scale).float()
            else:
                assert isinstance(method, Fp8BlockMethod) and method.w8a8, name
                want = fp8_block_w8a8_ref(x, method.weight, method.block_scale).float()
            got = out.reshape(want.shape).float()
            errors.append((name, float((got - want).norm() / want.norm())))

        return hook

    for name, module in model.named_modules():
        if isinstance(getattr(module, "quant_method", None), Fp8BlockMethod | Int8ChannelMethod):
            module.register_forward_hook(check(name))


@pytest.mark.parametrize(("m", "k"), [(3, 40), (2, 5000)])
def test_fp8_row_quantization_kernel_matches_reference(m: int, k: int) -> None:
    from kvpilot.runtime.kernels.fp8_quant_triton import quantize_fp8_rows_triton
    from kvpilot.runtime.kernels.quant_reference import quantize_fp8_rows_ref

    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k)).to(DEVICE)
    x[0, 7] = 30.0  # an outlier sets row 0's scale
    values, scales = quantize_fp8_rows_triton(x)
    want_values, want_scales = quantize_fp8_rows_ref(x)
    torch.testing.assert_close(scales, want_scales)
    got, want = values.float(), want_values.float()
    if INTERPRET:
        # The CPU interpreter's float8 cast drops the carry when rounding up crosses a power of two
        # (126.2 -> 64 instead of 128) and rounds subnormals (< 2**-6) differently; the GPU's
        # cvt.rn.satfinite rounds right. Everywhere else: exact.
        wrong = got != want
        explained = (torch.frexp(want[wrong].abs()).mantissa == 0.5) | (want[wrong].abs() < 2**-6)
        assert bool(explained.all()) and float(wrong.float().mean()) < 0.05
        got, want = got[~wrong], want[~wrong]
    torch.testing.assert_close(got, want)
