"""The int4 tensor-core GEMV (kernels/int4_mma_gemv_triton.py) without a GPU: its inline PTX is run by a
small warp-level interpreter of the instructions it uses (mma.sync's fragment layout included) on the
operands the kernel builds, lane by lane, and the result must be quant_reference.int_gemm_ref's. With the
sm_90 compile test (the asm's lane layout) this checks what the GPU run would: operand numbering, the
pairing of K rows in A and B, the lane roles and the epilogue's offsets."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
from kvpilot.runtime.kernels import int4_mma_gemv_triton as mma
from kvpilot.runtime.kernels.int4_mma_ptx import row_set_asm
from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref
from kvpilot.runtime.quant.int_weight import quantize_rtn


def _bf16_bits(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF


def _half(bits: int, hi: bool) -> float:
    raw = torch.tensor([(bits >> 16 if hi else bits) & 0xFFFF], dtype=torch.int64).to(torch.int16)
    return float(raw.view(torch.bfloat16).float())


def _bf16x2(a: int, b: int, op: str) -> int:
    out = 0
    for hi in (False, True):
        x, y = _half(a, hi), _half(b, hi)
        v = x - y if op == "sub" else x * y
        out |= int(_bf16_bits(torch.tensor([v], dtype=torch.float64).float())) << (16 if hi else 0)
    return out


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        idx = ((a >> bit) & 1) << 2 | ((b >> bit) & 1) << 1 | ((c >> bit) & 1)
        out |= ((lut >> idx) & 1) << bit
    return out


def run_warp(asm: str, operands: list[list[object]], memory: dict[int, int]) -> list[list[object]]:
    """Execute the asm for 32 lanes: operands[lane][k] is $k (int bits, float, or address); memory maps
    byte addresses to 16-bit values. Returns the operands with the outputs ($0..) written."""
    regs: list[dict[str, object]] = [dict() for _ in range(32)]

    def val(lane: int, tok: str) -> object:
        tok = tok.strip()
        if tok.startswith("$"):
            return operands[lane][int(tok[1:])]
        if tok.startswith("0x"):
            return int(tok, 16)
        if tok.isdigit():
            return int(tok)
        return regs[lane][tok]

    def put(lane: int, tok: str, v: object) -> None:
        if tok.startswith("$"):
            operands[lane][int(tok[1:])] = v
        else:
            regs[lane][tok] = v

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if line in ("{", "}") or line.startswith(".reg"):
            continue
        guard = None
        if line.startswith("@"):
            guard, line = line[1:].split(" ", 1)
        op, args = line.split(" ", 1)
        if op.startswith("mma.sync"):
            groups = [g.split(",") for g in re.findall(r"\{([^}]*)\}", args)]
            _mma(groups, val, put)
            continue
        parts = [p.strip() for p in re.split(r",(?![^{]*\})", args)]
        for lane in range(32):
            if guard is not None and not regs[lane][guard]:
                continue
            if op == "setp.ne.b32":
                put(lane, parts[0], val(lane, parts[1]) != int(parts[2]))
            elif op == "mov.b16":
                put(lane, parts[0], val(lane, parts[1]))
            elif op == "mov.b32":
                lo, hi = parts[1].strip("{}").split(",")
                put(lane, parts[0], int(val(lane, lo)) | int(val(lane, hi)) << 16)
            elif op == "ld.global.nc.b16":
                base, off = parts[1].strip("[]").split("+")
                put(lane, parts[0], memory[int(val(lane, base)) + int(off)])
            elif op == "shr.b32":
                put(lane, parts[0], (int(val(lane, parts[1])) & 0xFFFFFFFF) >> int(parts[2]))
            elif op == "lop3.b32":
                a, b, c, lut = (int(val(lane, p)) & 0xFFFFFFFF for p in parts[1:])
                put(lane, parts[0], _lop3(a, b, c, lut))
            elif op in ("sub.rn.bf16x2", "mul.rn.bf16x2"):
                a, b = (int(val(lane, p)) & 0xFFFFFFFF for p in parts[1:])
                put(lane, parts[0], _bf16x2(a, b, op[:3]))
            else:
                raise AssertionError(f"the emulator does not know {op}")
    return operands


def _mma(groups: list[list[str]], val: Callable[[int, str], object], put: Callable[..., None]) -> None:
    """mma.sync.m16n8k16.row.col f32 += bf16 x bf16, PTX's fragment layout (groupID = lane / 4)."""
    d, a, b, c = groups
    A, B, C = torch.zeros(16, 16), torch.zeros(16, 8), torch.zeros(16, 8)
    for lane in range(32):
        gid, tig = lane // 4, lane % 4
        for i, reg in enumerate(
            a
        ):  # a0: (g, 2t..), a1: (g + 8, 2t..), a2: (g, 2t + 8..), a3: (g + 8, 2t + 8..)
            bits = int(val(lane, reg))
            for e in range(2):
                A[gid + 8 * (i % 2), 2 * tig + 8 * (i // 2) + e] = _half(bits, e == 1)
        for i, reg in enumerate(b):  # b0: (k 2t.., n g), b1: (k 2t + 8.., n g)
            bits = int(val(lane, reg))
            for e in range(2):
                B[2 * tig + 8 * i + e, gid] = _half(bits, e == 1)
        for i, reg in enumerate(c):  # c0, c1: (g, 2t + {0, 1}), c2, c3: (g + 8, ..)
            C[gid + 8 * (i // 2), 2 * tig + i % 2] = float(val(lane, reg))
    D = (A.double() @ B.double() + C.double()).float()
    for lane in range(32):
        gid, tig = lane // 4, lane % 4
        for i, reg in enumerate(d):
            put(lane, reg.strip(), float(D[gid + 8 * (i // 2), 2 * tig + i % 2]))


def emulate(x: torch.Tensor, qw: torch.Tensor, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The kernel's operands built as its code builds them (TILES = 1, one split), the asm emulated."""
    m, k = x.shape
    n = qw.shape[1]
    group = k // s.shape[0]
    sets = 1 if m <= 8 else 2
    asm = row_set_asm(False, sets)
    outs = 16 * sets
    memory = {2 * i: int(b) for i, b in enumerate(_bf16_bits(x.reshape(-1)))}  # byte address -> bits
    y = torch.zeros(m, n)
    for n0 in range(0, n, 64):
        acc = torch.zeros(4, outs // 4, 32, 4)  # [row set, d/e index, lane, c]
        for k0 in range(0, k, 128):
            for r in range(4):
                operands = []
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    cols = [n0 + 4 * g + c for c in range(4)]
                    w_lo = [int(qw[k0 // 8 + 4 * r + t, col]) for col in cols]
                    w_hi = [int(qw[k0 // 8 + 4 * r + t, col + 32]) for col in cols]
                    grp = k0 // group

                    def pair(v: torch.Tensor) -> int:
                        bits = int(_bf16_bits(v.reshape(1)))
                        return bits | bits << 16

                    z_lo = [pair(z[grp, col] + 128.0) for col in cols]
                    z_hi = [pair(z[grp, col + 32] + 128.0) for col in cols]
                    s_lo = [pair(s[grp, col]) for col in cols]
                    s_hi = [pair(s[grp, col + 32]) for col in cols]
                    ops: list[object] = [0.0] * outs + w_lo + w_hi + z_lo + z_hi + s_lo + s_hi
                    for ts in range(sets):
                        tok = g + 8 * ts
                        addr = 2 * (min(tok, m - 1) * k + k0 + 4 * r + t)
                        ops += [addr] * 4 + [int(tok < m)] * 4
                    ops += [float(acc[r, i // 4, lane, i % 4]) for i in range(outs)]
                    operands.append(ops)
                done = run_warp(asm, operands, memory)
                for lane in range(32):
                    for i in range(outs):
                        acc[r, i // 4, lane, i % 4] = done[lane][i]
        total = acc.sum(0)  # [d/e index, lane, c]: the kernel's sum over row sets
        for dk in range(outs // 4):
            ts, which = divmod(dk, 4)  # d0..d3 / e0..e3: token parity (which % 2), hi columns (which // 2)
            for lane in range(32):
                tok = 2 * (lane % 4) + which % 2 + 8 * ts
                for c in range(4):
                    col = n0 + 4 * (lane // 4) + c + 32 * (which // 2)
                    if tok < m and col < n:
                        y[tok, col] = total[dk, lane, c]
    return y


@pytest.mark.parametrize("m", [1, 3, 11])
def test_int4_mma_asm_matches_reference(m: int) -> None:
    torch.manual_seed(m)
    n, k = 64, 256
    q = quantize_rtn(torch.randn(n, k) * 0.02, 4, 128, sym=False)
    s, z = q.scales.bfloat16(), q.zeros.bfloat16()
    x = torch.randn(m, k).bfloat16()
    want = x.float() @ dequantize_int_ref(q.qweight, s, z, 4).float()  # float32 sums of the bf16 weight
    got = emulate(x, q.qweight, s, z)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_int4_mma_support_and_config_checks() -> None:
    x = torch.zeros(1, 256, dtype=torch.bfloat16)
    assert not mma.int4_mma_supported(x, 256, 128)  # a CPU tensor: the asm needs a GPU
    with pytest.raises(ValueError):
        mma.int4_mma_gemv(x, torch.zeros(32, 64, dtype=torch.int32), x, x, mma.MmaConfig(split_k=3))


COMPILE = """
import json, re, triton
from triton.backends.compiler import GPUTarget
from kvpilot.runtime.kernels import int4_mma_gemv_triton as mma
from kvpilot.runtime.kernels.int4_mma_ptx import row_set_asm
from kvpilot.runtime.kernels.triton_compile import KernelSpec, source, loop_conversions, resource_usage
out = []
for sets, tiles, l2 in ((1, 1, 0), (2, 1, 0), (1, 2, 0), (1, 1, 2)):
    types = {"x_ptr": "*bf16", "qw_ptr": "*i32", "s_ptr": "*bf16", "z_ptr": "*bf16", "out_ptr": "*bf16",
             "ws_ptr": "*fp32", "counter_ptr": "*i32"}
    consts = {"GROUP": 128, "TILES": tiles, "PREFETCH": True, "L2_AHEAD": l2, "FP16": False, "SETS": sets,
              "SPLIT_MODE": 3}
    spec = KernelSpec("mma", mma._int4_mma_kernel, types, consts, 1, 1, ("M",))
    options = {"num_warps": 1, "num_stages": 1}
    c = triton.compile(source(spec), target=GPUTarget("cuda", 90, 32), options=options)
    ttgir = c.asm["ttgir"]
    layouts = dict(re.findall(r"^(#\\w+) = (.*)$", ttgir, re.M))
    # the mma asm (float32 accumulators out; the L2 prefetch asm has its own, any, layout)
    asm_layouts = set(re.findall(r"elementwise_inline_asm.*?-> \\(?tensor<[^,>]*xf32, (#\\w+)>", ttgir))
    regs, stack = resource_usage(c.asm["cubin"])
    prefetches = c.asm["ptx"].count("prefetch.global.L2")
    out.append({"sets": sets, "tiles": tiles, "l2": l2, "prefetches": prefetches,
                "asm": [layouts[a] for a in asm_layouts], "stack": stack,
                "loop_conversions": loop_conversions(ttgir), "mma": c.asm["ptx"].count("mma.sync")})
print(json.dumps(out))
"""


def test_int4_mma_kernel_compiles_for_sm90_in_the_mma_lane_layout() -> None:
    """The asm runs in the [R, 128] layout with lane = j / 4 and c (4 consecutive elements) in registers,
    the lane roles the emulation above assumes; no register spills, no layout conversion in the K loop."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for report in json.loads(done.stdout.strip().splitlines()[-1]):
        assert report["prefetches"] == (8 * report["tiles"] if report["l2"] else 0), report
        assert len(report["asm"]) == 1, report
        layout = report["asm"][0]
        assert "sizePerThread = [1, 4]" in layout and "threadsPerWarp = [1, 32]" in layout, report
        assert (report["stack"] or 0) <= 32, report
        assert report["loop_conversions"] == 0, report
        assert report["mma"] == 8 * report["sets"] * 4 * report["tiles"], report


def test_int4_mma_dispatch_takes_wide_layers_at_few_tokens() -> None:
    """int_gemm sends M <= 8 here only for layers with >= 2 blocks of 64 columns per SM (Qwen3-8B's
    gate_up on an H200, split 4 for 8 programs per SM), as the H200 sweep measured; never on a CPU."""
    assert mma.default_mma_config(24576, 4096, 132).split_k == 4
    assert [mma.default_mma_config(n, k, 132).split_k for n, k in ((6144, 4096), (4096, 12288))] == [16, 24]
    assert not mma.int4_mma_dispatched(torch.zeros(1, 4096, dtype=torch.bfloat16), 24576, 128)  # CPU


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config",
    [
        mma.MmaConfig(),
        mma.MmaConfig(split_k=4),
        mma.MmaConfig(split_k=12, reduce="fixup_wide"),
        mma.MmaConfig(split_k=2, tiles=2, prefetch=False),
        mma.MmaConfig(split_k=3, reduce="workspace"),
    ],
    ids=lambda c: f"s{c.split_k}-t{c.tiles}-p{int(c.prefetch)}-{c.reduce}",
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int4_mma_gemv_on_the_gpu(config: mma.MmaConfig, dtype: torch.dtype) -> None:
    """The kernel itself at Qwen3-8B's o projection with N = 4032 (a masked last column block), one and
    two token sets, every reduction; against the float32 GEMM of the weight dequantized in x's dtype."""
    n, k = 4032, 4608  # 36 tiles of 128 rows: every split above divides them
    w = quantize_rtn(0.02 * torch.randn(n, k, device="cuda"), 4, 128, sym=False)
    s, z = w.scales.to(dtype), w.zeros.to(dtype)
    dense = dequantize_int_ref(w.qweight, s, z, 4).float()
    for m in (1, 5, 9, 16):
        x = (0.5 * torch.randn(m, k, device="cuda")).to(dtype)
        got = mma.int4_mma_gemv(x, w.qweight, s, z, config).float()
        want = x.float() @ dense
        assert float((got - want).norm() / want.norm()) < 5e-3, (m, config)
