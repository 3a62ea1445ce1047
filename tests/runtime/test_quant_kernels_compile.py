"""The weight-only GEMM kernels lower to Hopper (sm_90) machine code through the real Triton compiler,
without a GPU, at Qwen3-8B's launch shapes (as test_kernels_compile does for the other kernels). Runs in a
subprocess: this process may have switched Triton to its interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

COMPILE = """
import dataclasses, json
from kvpilot.runtime.kernels import fp8_quant_triton as f, int8_gemm_triton as i8, w4a16_triton as w
from kvpilot.runtime.kernels import fp8_gemv_triton as f8, int_gemv_triton as g, int_gemv_fma_triton as fma
from kvpilot.runtime.kernels.triton_compile import KernelSpec, compile_kernel

def gemm(name, bits, group, bm, bn, bk, out, stages, x="*bf16"):
    types = {"x_ptr": x, "qw_ptr": "*i32", "s_ptr": x, "z_ptr": x, "out_ptr": out}
    consts = {"GROUP": group, "BITS": bits, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
              "DOT_IEEE": x == "*fp32"}
    return KernelSpec(name, w._int_gemm_kernel, types, consts, 4, stages, ("M",))

PROLOGUE = {"x_ptr": "*bf16", "r_ptr": "*bf16", "nw_ptr": "*bf16", "h_ptr": "*bf16", "eps": "fp32",
            "ws_ptr": "*fp32", "counter_ptr": "*i32"}

def gemv(name, bits, group, use_dot, out, magic, bn=64, tiles=1, stages=4, asm=False, mode=1, pdl=False):
    types = {"x_ptr": "*bf16", "ws_ptr": "*fp32", "counter_ptr": "*i32", "qw_ptr": "*i32", "s_ptr": "*bf16",
             "z_ptr": "*bf16", "out_ptr": out}
    consts = {"GROUP": group, "BITS": bits, "BLOCK_M": 16 if use_dot else 1, "BLOCK_N": bn, "TILE": 128,
              "TILES": tiles, "USE_DOT": use_dot, "MAGIC16": magic, "OFFSET": 128.0 if magic else 0.0,
              "SPLIT_MODE": mode, "DOT_IEEE": False, "PAIR_ASM": asm, "PDL": pdl}
    return KernelSpec(name, g._int_gemv_kernel, types, consts, 4, stages, ("M",))

def fp8_gemv(name, use_dot, out, pro=0, pdl=False, bn=32, warps=4, mode=3, prefetch=False):
    types = {**PROLOGUE, "w_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "out_ptr": out}
    consts = {"BLOCK_M": 16 if use_dot else 1, "BLOCK_N": 64 if use_dot else bn,
              "BLOCK_K": 128 if use_dot else 512, "USE_DOT": use_dot, "SPLIT_MODE": mode, "DOT_IEEE": False,
              "PROLOGUE": pro, "HAS_RESIDUAL": pro == 1, "PDL": pdl, "PREFETCH": prefetch}
    return KernelSpec(name, f8._fp8_gemv_kernel, types, consts, warps, 4 if use_dot else 1, ("M",))

def fma_gemv(name, bits, group, bm, bn, tiles=1, l2=0):
    types = {"x_ptr": "*bf16", "qw_ptr": "*i32", "s_ptr": "*bf16", "z_ptr": "*bf16", "out_ptr": "*bf16",
             "ws_ptr": "*fp32", "counter_ptr": "*i32"}
    consts = {"GROUP": group, "BITS": bits, "BLOCK_M": bm, "BLOCK_N": bn, "TILE": 128, "TILES": tiles,
              "PREFETCH": True, "L2_AHEAD": l2, "SPLIT_MODE": 3}
    return KernelSpec(name, fma._int_fma_kernel, types, consts, 4, 1, ("M",))

dequant_types = {"qw_ptr": "*i32", "s_ptr": "*bf16", "z_ptr": "*bf16", "out_ptr": "*bf16"}
specs = [
    gemm("w4_decode_split", 4, 128, 16, 64, 128, "*fp32", 4),
    gemm("w4_decode_group32", 4, 32, 16, 64, 128, "*fp32", 4),
    gemm("w4_prefill", 4, 128, 64, 128, 128, "*bf16", 3),
    gemm("w8_decode_split", 8, 4096, 16, 64, 128, "*fp32", 4),
    gemm("w4_decode_fp32_ieee", 4, 128, 16, 64, 128, "*fp32", 4, "*fp32"),
    gemv("w4_gemv_dot", 4, 128, True, "*fp32", 0x4300),
    gemv("w4_gemv_dot_pair_asm", 4, 128, True, "*bf16", 0x4300, bn=128, asm=True, mode=3),
    gemv("w4_gemv_dot_group32", 4, 32, True, "*bf16", 0x4300),
    gemv("w4_gemv_fma", 4, 128, False, "*bf16", 0, tiles=2, stages=1),
    gemv("w8_gemv_dot", 8, 4096, True, "*fp32", 0),
    gemv("w8_gemv_fma", 8, 4096, False, "*fp32", 0, stages=1),
    fp8_gemv("fp8_gemv_dot", True, "*fp32"),
    fp8_gemv("fp8_gemv_fma", False, "*bf16"),
    # the dispatch's M = 1 shape with programmatic dependent launch; fp8's fused prologues
    gemv("w4_gemv_pdl", 4, 128, True, "*bf16", 0x4300, asm=True, mode=3, pdl=True),
    fp8_gemv("fp8_norm_gemv_pdl", False, "*bf16", pro=1, pdl=True, bn=4, warps=1, mode=0),
    fp8_gemv("fp8_norm_gemv_split", False, "*bf16", pro=1, pdl=True, bn=4, warps=1),
    fp8_gemv("fp8_silu_gemv_pdl", False, "*bf16", pro=2, pdl=True, bn=4, warps=1),
    fp8_gemv("fp8_norm_gemv_prefetch", False, "*bf16", pro=1, pdl=True, bn=4, warps=1, prefetch=True),
    fma_gemv("w4_fma_m1", 4, 128, 1, 64),
    fma_gemv("w4_fma_m4_group32", 4, 32, 4, 64),
    fma_gemv("w8_fma_m1", 8, 4096, 1, 64),
    fma_gemv("w8_fma_m1_l2", 8, 4096, 1, 64, l2=2),
    KernelSpec("w4_dequantize", w._dequantize_kernel, dequant_types,
               {"GROUP": 128, "BITS": 4, "BLOCK_K": 128, "BLOCK_N": 64}, 4, 1),
    KernelSpec("reduce_splits", w._reduce_splits_kernel, {"part_ptr": "*fp32", "out_ptr": "*bf16"},
               {"SPLIT_K": 4, "BLOCK": 1024}, 4, 1),
    KernelSpec("fp8_quantize_rows", f.quantize_rows_kernel,
               {"x_ptr": "*bf16", "out_ptr": "*fp8e4nv", "scale_ptr": "*fp32"},
               {"BLOCK": 4096, "QMAX": 448.0}, 4, 1),
    KernelSpec("int8_quantize_rows", f.quantize_rows_kernel,
               {"x_ptr": "*bf16", "out_ptr": "*i8", "scale_ptr": "*fp32"},
               {"BLOCK": 4096, "QMAX": 127.0, "ROUND": True}, 4, 1),
    *[KernelSpec(f"int8_gemm_{top}", i8._int8_gemm_kernel,
                 {"xq_ptr": "*i8", "sx_ptr": "*fp32", "w_ptr": "*i8", "sw_ptr": "*bf16", "out_ptr": "*bf16"},
                 {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k, "GROUP_M": c.group_m},
                 c.num_warps, c.num_stages, ("M",)) for top, c in i8.LAUNCHES],
]
print(json.dumps([dataclasses.asdict(compile_kernel(s, 90)) for s in specs]))
"""


GEMV = (
    "w4_gemv_dot",
    "w4_gemv_dot_pair_asm",
    "w4_gemv_dot_group32",
    "w4_gemv_fma",
    "w8_gemv_dot",
    "w8_gemv_fma",
    "fp8_gemv_dot",
    "fp8_gemv_fma",
    "w4_gemv_pdl",
    "fp8_norm_gemv_pdl",
    "fp8_norm_gemv_split",
    "fp8_silu_gemv_pdl",
    "fp8_norm_gemv_prefetch",
    "w4_fma_m1",
    "w4_fma_m4_group32",
    "w8_fma_m1",
    "w8_fma_m1_l2",
)


def test_int_gemm_kernels_compile_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reports = {r["name"]: r for r in json.loads(done.stdout.strip().splitlines()[-1])}
    int8_gemms = [name for name in reports if name.startswith("int8_gemm_")]  # one per launch bucket
    assert len(int8_gemms) == 3, int8_gemms
    assert set(reports) == {
        "w4_decode_split",
        "w4_decode_group32",
        "w4_prefill",
        "w4_decode_fp32_ieee",
        "w8_decode_split",
        "w4_dequantize",
        "reduce_splits",
        "fp8_quantize_rows",
        "int8_quantize_rows",
        *int8_gemms,
        *GEMV,
    }
    for name in int8_gemms:  # both operands K-major from shared memory: pipelined, no conversions, no spills
        report = reports[name]
        assert report["async_copies"] > 0 and report["loop_conversions"] == 0, report
        assert (report["stack_bytes"] or 0) <= 32, report
    for name in ("w4_decode_split", "w4_decode_group32", "w4_prefill", "w8_decode_split"):
        assert reports[name]["async_copies"] > 0, f"{name}: weight loads are no longer pipelined"
        assert (reports[name]["stack_bytes"] or 0) <= 32, f"{name} spills registers: {reports[name]}"
    for name in ("w4_decode_split", "w4_decode_group32", "w8_decode_split"):
        # the words go from shared memory straight into the mma operand layout and are unpacked there
        assert reports[name]["loop_conversions"] == 0, f"{name} converts layouts in its K loop"
    # Hopper's wgmma (BLOCK_M 64) reads B from shared memory: one store per dequantized chunk, no more
    assert reports["w4_prefill"]["loop_conversions"] <= 8 + 2, reports["w4_prefill"]
    assert (reports["w4_decode_fp32_ieee"]["stack_bytes"] or 0) <= 32, reports["w4_decode_fp32_ieee"]
    for name in GEMV:  # the decode GEMVs (bf16 atomics included) lower for Hopper without spilling
        assert (reports[name]["stack_bytes"] or 0) <= 32, f"{name} spills registers: {reports[name]}"
    dots = ("w4_gemv_dot", "w4_gemv_dot_pair_asm", "w4_gemv_dot_group32", "w8_gemv_dot", "fp8_gemv_dot")
    for name in (*dots, "w4_gemv_pdl"):
        assert reports[name]["async_copies"] > 0, f"{name}: weight loads are no longer pipelined"
    for name in ("w4_fma_m1", "w4_fma_m4_group32", "w8_fma_m1", "w8_fma_m1_l2"):  # registers only
        assert reports[name]["loop_conversions"] == 0, f"{name} converts layouts in its K loop"
    for name in ("w4_gemv_dot", "w8_gemv_dot"):  # magic-number operands built in the mma layout
        assert reports[name]["loop_conversions"] == 0, f"{name} converts layouts in its K loop"
