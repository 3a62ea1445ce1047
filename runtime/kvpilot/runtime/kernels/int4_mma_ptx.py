"""The inline PTX of kernels/int4_mma_gemv_triton.py: one row set of one lane (the module doc there
explains the lane roles), as text built once at import."""

from __future__ import annotations


def row_set_asm(fp16: bool, sets: int) -> str:
    """The PTX of one row set for one lane: 4 mma blocks x 2 steps x `sets` token sets (tokens g, g + 8).
    Operands, 4 each (one per block c; per-lane values repeat): the accumulators out (d0 of blocks 0..3,
    d1, d2, d3; then the second set's), words lo, words hi, (OFFSET + z) pairs lo, hi, s pairs lo, hi,
    then per token set its x row pointer and valid flag, then the accumulators in (as out)."""
    ty = "f16" if fp16 else "bf16"
    magic = "0x64006400" if fp16 else "0x43004300"
    outs = 16 * sets
    w_lo, w_hi, z_lo, z_hi, s_lo, s_hi = (outs + 4 * i for i in range(6))
    ptr = [outs + 24 + 8 * ts for ts in range(sets)]
    ok = [outs + 28 + 8 * ts for ts in range(sets)]
    acc_in = outs + 24 + 8 * sets
    lines = ["{", ".reg .b32 b<8>, w, a<4>;", ".reg .b16 h<16>;", ".reg .pred p<2>;"]
    for ts in range(sets):
        lines.append(f"setp.ne.b32 p{ts}, ${ok[ts]}, 0;")
        for i in range(8):  # x[token][k0 + 16 i + 4 rs + t]: the K row of value i of this lane's word row
            h = f"h{8 * ts + i}"
            lines += [f"mov.b16 {h}, 0;", f"@p{ts} ld.global.nc.b16 {h}, [${ptr[ts]}+{32 * i}];"]
        for i in range(4):  # B pair i: the K rows of values (i, i + 4)
            lines.append(f"mov.b32 b{4 * ts + i}, {{h{8 * ts + i}, h{8 * ts + i + 4}}};")
    for c in range(4):
        for s in range(2):
            for slot, (word, i) in enumerate(
                ((w_lo, 2 * s), (w_hi, 2 * s), (w_lo, 2 * s + 1), (w_hi, 2 * s + 1))
            ):
                zero, scale = (z_lo, s_lo) if word == w_lo else (z_hi, s_hi)  # lo / hi columns' own
                src = f"${word + c}"
                if i:
                    lines.append(f"shr.b32 w, ${word + c}, {4 * i};")
                    src = "w"
                lines += [
                    f"lop3.b32 a{slot}, {src}, 0x000F000F, {magic}, 0xEA;",
                    f"sub.rn.{ty}x2 a{slot}, a{slot}, ${zero + c};",
                    f"mul.rn.{ty}x2 a{slot}, a{slot}, ${scale + c};",
                ]
            for ts in range(sets):
                d = [f"${16 * ts + 4 * k + c}" for k in range(4)]
                src_acc = [f"${acc_in + 16 * ts + 4 * k + c}" for k in range(4)] if s == 0 else d
                lines.append(
                    f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{{', '.join(d)}}}, "
                    f"{{a0, a1, a2, a3}}, {{b{4 * ts + 2 * s}, b{4 * ts + 2 * s + 1}}}, "
                    f"{{{', '.join(src_acc)}}};"
                )
    lines.append("}")
    return "\n".join(lines)


def row_set_constraints(sets: int) -> str:
    """The inline asm's operand constraints, in row_set_asm's order."""
    return ",".join(
        ["=f"] * 16 * sets + ["r"] * 24 + ["l", "l", "l", "l", "r", "r", "r", "r"] * sets + ["f"] * 16 * sets
    )
