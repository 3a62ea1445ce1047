"""8-bit KV tiles (e4m3 or int8 codes) -> the 16-bit dot type of the 8-bit decode kernel.

Three ways to widen a [BLOCK_N, BLOCK_D] tile of codes for an fp16 tensor-core dot (kv8_path.Kv8Path.cvt):
- "cast": x.to(fp16); Triton places the conversion (after the layout conversion to the dot operand,
  i.e. per element of the operand fragments; for V it first gathers the transposed 8-bit operand bytewise).
- "ptx": exact, by inline PTX in the load's layout (the compiler cannot move it): e4m3 pairs by the one
  hardware instruction cvt.rn.f16x2.e4m3x2; int8 by the 0x6400 magic number (bias the byte to unsigned,
  permute it under the fp16 exponent of 1024, subtract 1024 + 128 = 1152).
- "bias": the same bit moves without the arithmetic, the difference folded into the attention math:
  int8 x -> the fp16 1152 + x (xor + prmt only; the kernel subtracts 1152 * sum(q) from each score and
  1152 * sum(p) from each output column), e4m3 x -> the fp16 x / 256 (prmt, shift, and: the e4m3 bits
  moved under fp16's exponent; the 256 is folded into the per-position scales). Both are exact.
Under the CPU interpreter (no PTX) "ptx" and "bias" produce the same values by casts, so the CPU tests
check the algebra of each path; the PTX itself runs in the gpu tests.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e4m3_to_f16_ptx(x):
    return tl.inline_asm_elementwise(
        asm="cvt.rn.f16x2.e4m3x2 $0, $1;",
        constraints="=r,h",
        args=[x],
        dtype=tl.float16,
        is_pure=False,
        pack=2,
    )


@triton.jit
def _e4m3_to_f16_div256(x):
    """e4m3 codes -> fp16 x / 256 exactly: each byte under fp16's sign/exponent bits, shifted by one."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 lo, hi, a, b, sa, sb;
        prmt.b32 lo, $2, 0, 0x1404;
        prmt.b32 hi, $2, 0, 0x3424;
        shr.u32 a, lo, 1;
        shr.u32 b, hi, 1;
        and.b32 sa, lo, 0x80008000;
        and.b32 sb, hi, 0x80008000;
        lop3.b32 $0, a, 0x3FFF3FFF, sa, 0xEA;
        lop3.b32 $1, b, 0x3FFF3FFF, sb, 0xEA;
        }""",
        constraints="=r,=r,r",
        args=[x],
        dtype=tl.float16,
        is_pure=False,
        pack=4,
    )


@triton.jit
def int8_to_f16_ptx(x, BIASED: tl.constexpr):
    """int8 codes -> fp16: the byte + 128 under the exponent of 1024 (x + 1152); minus 1152 unless BIASED."""
    if BIASED:
        return tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 u;
            xor.b32 u, $2, 0x80808080;
            prmt.b32 $0, u, 0x64646464, 0x5140;
            prmt.b32 $1, u, 0x64646464, 0x5342;
            }""",
            constraints="=r,=r,r",
            args=[x],
            dtype=tl.float16,
            is_pure=False,
            pack=4,
        )
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 u, bias;
        xor.b32 u, $2, 0x80808080;
        mov.b32 bias, 0x64806480;
        prmt.b32 $0, u, 0x64646464, 0x5140;
        prmt.b32 $1, u, 0x64646464, 0x5342;
        sub.f16x2 $0, $0, bias;
        sub.f16x2 $1, $1, bias;
        }""",
        constraints="=r,=r,r",
        args=[x],
        dtype=tl.float16,
        is_pure=False,
        pack=4,
    )


@triton.jit
def widen8(x, DOT16: tl.constexpr, CVT: tl.constexpr, ASM: tl.constexpr):
    """8-bit codes [BLOCK_N, BLOCK_D] -> fp16 (DOT16) or fp32 (fp32 activations: exact casts).
    fp16, CVT 2 ("bias"): x + 1152 (int8) or x / 256 (e4m3); 0 ("cast") and 1 ("ptx"): x.
    ASM False (the interpreter runs no PTX): the same values by casts."""
    if not DOT16:  # fp32 dots: exact casts, no bias
        y = x.to(tl.float32)
    elif CVT == 0:
        y = x.to(tl.float16)
    elif not ASM:
        y = x.to(tl.float16)
        if CVT == 2 and x.dtype == tl.int8:
            y = y + 1152.0
        elif CVT == 2:
            y = y * (1.0 / 256.0)
    elif x.dtype == tl.int8:
        y = int8_to_f16_ptx(x, CVT == 2)
    elif CVT == 2:
        y = _e4m3_to_f16_div256(x)
    else:
        y = e4m3_to_f16_ptx(x)
    return y
