"""Plain-PyTorch references for the quantized GEMMs (the oracle for the Triton kernels beside them), and
the one canonical layout every integer weight format is unpacked into at load time.

Integer weights (int8, int4, AWQ, GPTQ), for a layer y = x W^T with W [N, K] (N outputs, K inputs):
    qweight  int32 [K * bits / 32, N]  bits/32 values per word along K, interleaved per tile of T rows
                                       (T = pack_tile(K, bits), 128 for real models; C = T * bits / 32
                                       word rows per tile): value j (bits [j*bits, (j+1)*bits)) of word
                                       row t*C + r is row k = t*T + j*C + r; unsigned
    scales   [K / G, N]  model dtype   one scale per group of G input rows and output column
    zeros    [K / G, N]  model dtype   the unsigned zero point of that group (integer valued)
    perm     int64 [K] or None         act-order (GPTQ desc_act): the kernel sees x[:, perm] and rows
                                       sorted so that each group is contiguous
    W^T[k, n] = (q[k, n] - zeros[k // G, n]) * scales[k // G, n]
K-major packing lets a kernel load one word per output column; the interleave within a tile lets it take
value j of a [C, BLOCK_N] tile of words with one shift and mask, giving rows t*T + j*C .. + C of W^T as a
[C, BLOCK_N] tile already in the order of x's columns (no reshape, no register shuffle through shared
memory), so a K step of T rows is 32/bits dots of C rows each. The checkpoint layouts (GPTQ's row r*8+j,
AWQ's N-packed words) are only input: quant/checkpoint_formats.py unpacks them and pack_rows repacks.

fp8 weights (W8A8): weight float8_e4m3fn [N, K], weight_scale float32 [N]; activations are quantized per
token (row) with a dynamic absmax scale, so y = (xq * sx) (wq * sw)^T. Block-wise fp8 checkpoints keep
one float32 scale per block of W and run weight-only (dequantize_fp8_blocks_ref).
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
INT8_MAX = 127.0  # symmetric int8: [-127, 127]


def pack_tile(k: int, bits: int) -> int:
    """T, the rows of K one interleaved tile spans: the largest of 128, 64, ... dividing K, a whole number
    of words per column (the fused kernel's K step is exactly one tile)."""
    per_word = 32 // bits
    for tile in (128, 64, 32, 16, 8, 4):
        if tile % per_word == 0 and k % tile == 0:
            return tile
    raise ValueError(f"cannot pack K={k} rows into {bits}-bit words")


def pack_rows(q: torch.Tensor, bits: int) -> torch.Tensor:
    """[K, N] unsigned integer values < 2**bits -> int32 [K * bits / 32, N] (interleaved, see module doc)."""
    per_word = 32 // bits
    k, n = q.shape
    tile = pack_tile(k, bits)
    rows = q.to(torch.int64).reshape(k // tile, per_word, tile // per_word, n)  # [K/T, j, r, N]
    shifts = (torch.arange(per_word, device=q.device, dtype=torch.int64) * bits).view(1, per_word, 1, 1)
    words = (rows << shifts).sum(dim=1).reshape(k // per_word, n)  # word row t*C + r, < 2**32
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_rows(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [K * bits / 32, N] -> int32 [K, N] values in [0, 2**bits)."""
    per_word = 32 // bits
    k, n = packed.shape[0] * per_word, packed.shape[1]
    tile = pack_tile(k, bits)
    words = packed.reshape(k // tile, 1, tile // per_word, n)  # [K/T, 1, C, N]
    shifts = (torch.arange(per_word, device=packed.device, dtype=torch.int32) * bits).view(1, per_word, 1, 1)
    return ((words >> shifts) & ((1 << bits) - 1)).reshape(k, n)  # [K/T, j, C, N]: row t*T + j*C + r


def dequantize_int_ref(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int
) -> torch.Tensor:
    """W^T [K, N] in the scales' dtype (rows in the kernel's order: x[:, perm] when act-ordered)."""
    q = unpack_rows(qweight, bits)
    group = q.shape[0] // scales.shape[0]
    s = scales.repeat_interleave(group, dim=0)
    z = zeros.repeat_interleave(group, dim=0)
    return ((q.to(s.dtype) - z) * s).to(scales.dtype)


def int_gemm_ref(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bits: int,
    perm: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] @ dequantized W^T [K, N] (+ bias) -> [M, N]: dequantize, then one matmul."""
    if perm is not None:
        x = x[:, perm]
    y = x @ dequantize_int_ref(qweight, scales, zeros, bits).to(x.dtype)
    return y if bias is None else y + bias


def quantize_fp8_rows_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row absmax scaling to float8_e4m3fn: (values [R, C] fp8, scales [R, 1] float32)."""
    absmax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    scale = absmax / FP8_MAX
    values = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return values, scale


def fp8_gemm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    dense: torch.Tensor | None = None,
) -> torch.Tensor:
    """W8A8 emulated in float32: x [M, K] quantized per token, weight [N, K] fp8 with scales [N].
    dense: weight * weight_scale in float32 when the caller keeps it (the same numbers, made once)."""
    xq, sx = quantize_fp8_rows_ref(x)
    return _fp8_matmul(xq.float() * sx, weight, weight_scale, bias, dense, x.dtype)


def _fp8_matmul(
    x: torch.Tensor,  # [M, K] float32
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    dense: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    w = dense if dense is not None else weight.float() * weight_scale.float().view(-1, 1)
    y = (x @ w.t()).to(dtype)
    return y if bias is None else y + bias


# fp8 layers run weight-only (W8A16) up to this many tokens and W8A8 above (quant/fp8_gemm.py); the
# references follow the same split so that they stay the oracle of what the GPU computes
FP8_WEIGHT_ONLY_MAX_M = 16


def fp8_weight_only_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    dense: torch.Tensor | None = None,
) -> torch.Tensor:
    """W8A16 fp8 (the decode GEMV): x [M, K] unquantized @ (weight [N, K] fp8 * weight_scale [N])^T.
    dense: weight * weight_scale in float32 when the caller keeps it."""
    return _fp8_matmul(x.float(), weight, weight_scale, bias, dense, x.dtype)


def dequantize_fp8_blocks_ref(
    weight: torch.Tensor, block_scale: torch.Tensor, block: tuple[int, int]
) -> torch.Tensor:
    """Block-wise fp8 W [N, K] in float32: weight [N, K] fp8 times the scale of its block, block_scale
    [ceil(N / bn), ceil(K / bk)] with block = (bn, bk)."""
    n, k = weight.shape
    rows = block_scale.float().repeat_interleave(block[0], dim=0)[:n]
    return weight.float() * rows.repeat_interleave(block[1], dim=1)[:, :k]


def fp8_block_gemm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    block_scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
    *,
    dense: torch.Tensor | None = None,
) -> torch.Tensor:
    """Block-wise fp8, weight-only: W dequantized and rounded to x's dtype, x [M, K] @ W^T summed in
    float32, in x's dtype (the oracle of kernels/fp8_block_gemm_triton.py). dense: dequantize_fp8_blocks_ref's
    W when the caller keeps it."""
    w = dense if dense is not None else dequantize_fp8_blocks_ref(weight, block_scale, block)
    y = (x.float() @ w.to(x.dtype).float().t()).to(x.dtype)
    return y if bias is None else y + bias


def quantize_fp8_groups_ref(x: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token, per-group absmax scaling to float8_e4m3fn: (values [M, K] fp8, scales [M, K / group])."""
    m, k = x.shape
    groups = x.float().reshape(m, k // group, group)
    scale = groups.abs().amax(dim=-1).clamp(min=1e-12) / FP8_MAX
    values = (groups / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return values.reshape(m, k), scale


def fp8_block_w8a8_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    block_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    dense: torch.Tensor | None = None,
) -> torch.Tensor:
    """Block-wise fp8 as DeepSeek's recipe runs it above decode sizes (block_scale [N / 128, K / 128]): x
    quantized per token and 128 inputs, both operands dequantized, summed in float32, rounded to bf16 (what
    torch._scaled_mm's block scaling writes), then in x's dtype (its oracle, quant/fp8_block.py)."""
    xq, sx = quantize_fp8_groups_ref(x)
    x_deq = xq.float() * sx.repeat_interleave(128, dim=1)
    w = dense if dense is not None else dequantize_fp8_blocks_ref(weight, block_scale, (128, 128))
    y = (x_deq @ w.t()).to(torch.bfloat16).to(x.dtype)
    return y if bias is None else y + bias


def quantize_int8_rows_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row absmax scaling to int8, rounded half away from zero: (values [R, C] int8, scales [R])."""
    scale = x.abs().amax(dim=-1).float().clamp(min=1e-12) / INT8_MAX
    v = (x.float() / scale[:, None]).clamp(-INT8_MAX, INT8_MAX)
    return (torch.sign(v) * torch.floor(v.abs() + 0.5)).to(torch.int8), scale


def int8_gemm_ref(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """W8A8 int8 (kernels/int8_gemm_triton.py): x [..., K] quantized per token, times weight [N, K] int8
    with scales [N] per output channel, summed in float32, in x's dtype."""
    xq, sx = quantize_int8_rows_ref(x.reshape(-1, x.shape[-1]))
    w = weight.float() * weight_scale.float().reshape(-1, 1)
    y = ((xq.float() * sx[:, None]) @ w.t()).to(x.dtype).reshape(*x.shape[:-1], -1)
    return y if bias is None else y + bias
