"""Compile every Triton kernel for a GPU architecture without a GPU, and report its resources.

    python -m kvpilot.runtime.kernels.compile_check [--arch 90]

Lowers each kernel through Triton's real pipeline (TTIR -> TTGIR -> PTX -> cubin with ptxas) for the
shapes the engine uses (Qwen3-8B heads, bf16, page size 16; the attention and store kernels also over 8-bit
fp8/int8 pages with their fp32 scales), with the 16-divisibility that Triton infers at
launch for pointers and strides, and prints registers, spill stack, shared memory and whether the K/V loads
were software-pipelined (async copies). Must run WITHOUT TRITON_INTERPRET=1 (the interpreter replaces
the compiler).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import (
    activation_triton,
    decode_attention_triton,
    decode_plan,
    decode_split_triton,
    kv8_decode_triton,
    norm_triton,
    prefill_attention_triton,
    qkv_prepare_triton,
)
from .kv8_path import cvt_code


@dataclass(frozen=True)
class KernelSpec:
    name: str
    fn: Any  # a triton JITFunction
    types: dict[str, str]  # non-i32 runtime parameters: "*bf16", "fp32", ...
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int = 1
    not_div16: tuple[str, ...] = ()  # integer parameters NOT specialised as multiples of 16


@dataclass(frozen=True)
class KernelReport:
    name: str
    registers: int | None
    stack_bytes: int | None
    shared_bytes: int
    async_copies: int  # cp.async ops in the final TTGIR: >0 means a pipelined loop
    loop_conversions: int = (
        0  # register->shared round trips (convert_layout, local_alloc of a value) in loops
    )
    byte_shared_loads: int = 0  # ld.shared of single bytes in the PTX: an 8-bit operand gathered bytewise


def loop_conversions(ttgir: str) -> int:
    """Layout conversions inside scf.for bodies of a TTGIR listing: each one costs a trip through shared
    memory (or shuffles) on every iteration, which a streaming K loop should not pay."""
    count, depth = 0, 0
    for line in ttgir.splitlines():
        if "scf.for" in line:
            depth += 1
        elif depth and "scf.yield" in line:
            depth -= 1
        elif depth and ("ttg.convert_layout" in line or re.search(r"ttg\.local_alloc %", line)):
            count += 1
    return count


_ATTN = {
    "q_ptr": "*bf16",
    "k_cache_ptr": "*bf16",
    "v_cache_ptr": "*bf16",
    "out_ptr": "*bf16",
    "context_lens_ptr": "*i32",
    "block_tables_ptr": "*i32",
    "qk_scale": "fp32",
    "kr_ptr": "*bf16",
    "vr_ptr": "*bf16",
}
_HEADS = {"HEAD_DIM": 128, "BLOCK_D": 128, "PAGE": 16}
_SPLIT = {"ws_acc_ptr": "*fp32", "ws_ml_ptr": "*fp32", "counter_ptr": "*i32"}  # prefill_split_triton
_QKV_PREPARE = {
    "qkv_ptr": "*bf16",
    "positions_ptr": "*i64",
    "cos_sin_ptr": "*fp32",
    "q_norm_ptr": "*bf16",
    "k_norm_ptr": "*bf16",
    "q_out_ptr": "*bf16",
    "k_cache_ptr": "*bf16",
    "v_cache_ptr": "*bf16",
    "slot_mapping_ptr": "*i64",
    "eps": "fp32",
}
_UNSCALED_STORE = {"SCALED": False, "QMAX": 0.0, "INT8": False}
_QKV_PREPARE_CONSTS = {
    "NUM_HEADS": 32,
    "NUM_KV_HEADS": 8,
    "HEAD_DIM": 128,
    "BLOCK_SIZE": 16,
    "BLOCK_G": 4,
    "BLOCK_HALF": 64,
}
# per-token-head scales [blocks, 16, 8 kv heads]: the slot and head strides (8, 1) are not multiples of 16
_SCALE_NODIV = ("stride_ss", "stride_sh")
_DEC_NODIV = ("partition_size", "num_splits", "num_heads", "stride_bt", *_SCALE_NODIV)
_KV8 = {"fp8": "*fp8e4nv", "int8": "*i8"}
_DEC_TYPES = {**_ATTN, "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"}
_DEC8_CONSTS = {"GROUP": 4, "BLOCK_H": 16, **_HEADS, "SCALED": True}
_KV8_DTYPES = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}


def _scaled(types: dict[str, str], kv: str) -> dict[str, str]:
    return {
        **types,
        "k_cache_ptr": _KV8[kv],
        "v_cache_ptr": _KV8[kv],
        "k_scale_ptr": "*fp32",
        "v_scale_ptr": "*fp32",
    }


def _decode8_spec(
    name: str, dec8: decode_attention_triton.DecodeConfig, kv: str, split: bool, tile: decode_plan.TileShape
) -> KernelSpec:
    """The decode launch of an 8-bit cache's default config with this tile shape."""
    return KernelSpec(
        name,
        kv8_decode_triton._decode8_kernel
        if _kv8_consts(dec8, kv, split)
        else decode_attention_triton._decode_kernel,
        _scaled(_DEC_TYPES, kv),
        {
            **_DEC8_CONSTS,
            "BLOCK_N": tile.block_n,
            "SPLIT": split,
            "PDL": dec8.pdl,
            **_dot_modes(dec8, kv),
            **_kv8_consts(dec8, kv, split),
        },
        tile.num_warps,
        tile.num_stages,
        _DEC_NODIV,
    )


def kv8_specs() -> list[KernelSpec]:
    """The decode (single pass and split), prefill and store kernels over 8-bit pages."""
    pre = prefill_attention_triton.EIGHT_BIT_PREFILL
    specs = []
    for kv in _KV8:
        dec8 = decode_attention_triton.default_decode_config(_KV8_DTYPES[kv])
        # the defaults (int8: the kv8 kernel, kv8_decode_triton.py): single pass, split, and the single
        # pass from dense_waves programs per SM on
        own = decode_plan.TileShape(dec8.block_n, dec8.num_warps, dec8.num_stages)
        kinds = {"single_pass": (False, dec8.single_pass or own), "split": (True, own)}
        if dec8.dense_pass is not None:
            kinds["dense_pass"] = (False, dec8.dense_pass)
        for kind, (split, tile) in kinds.items():
            specs.append(_decode8_spec(f"decode_{kind}_{kv}", dec8, kv, split, tile))
        # the alternatives DecodeConfig can select (benchmarks/bench_kernels.py --sweep times them)
        for variant, cfg in decode8_variants(kv).items():
            specs.append(
                KernelSpec(
                    f"decode_single_pass_{kv}_{variant}",
                    decode_attention_triton._decode_kernel,
                    _scaled(_DEC_TYPES, kv),
                    {**_DEC8_CONSTS, "BLOCK_N": cfg.block_n, "SPLIT": False, **_dot_modes(cfg, kv)},
                    cfg.num_warps,
                    cfg.num_stages,
                    _DEC_NODIV,
                )
            )
        specs.append(
            KernelSpec(
                f"prefill_{kv}",
                prefill_attention_triton._prefill_kernel,
                _scaled({**_ATTN, "cu_seqlens_q_ptr": "*i32"}, kv),
                {**_prefill_consts(pre), "SCALED": True},
                pre.num_warps,
                pre.num_stages,
                ("stride_bt", "num_seqs", "flat", *_SCALE_NODIV),
            )
        )
        specs.append(  # prefill steps: own positions from the step's K/V rows, the prefix from 8-bit pages
            KernelSpec(
                f"prefill_step_kv_{kv}",
                prefill_attention_triton._prefill_kernel,
                _scaled({**_ATTN, **_SPLIT, "cu_seqlens_q_ptr": "*i32"}, kv),
                {**_prefill_consts(pre), "SCALED": True, "CONTIG": True, **_split_consts(pre)},
                pre.num_warps,
                pre.num_stages,
                ("stride_bt", "num_seqs", "flat", "prefix_splits", *_SCALE_NODIV),
            )
        )
        specs.append(
            KernelSpec(
                f"qkv_prepare_{kv}",
                qkv_prepare_triton._qkv_prepare_kernel,
                _scaled(_QKV_PREPARE, kv),
                {
                    **_QKV_PREPARE_CONSTS,
                    "HAS_NORM": True,
                    "SCALED": True,
                    "QMAX": 448.0 if kv == "fp8" else 127.0,
                    "INT8": kv == "int8",
                },
                1,
                1,
                _SCALE_NODIV,
            )
        )
    return specs


def decode8_variants(kv: str) -> dict[str, decode_attention_triton.DecodeConfig]:
    """The shared kernel's 8-bit alternatives (the defaults are compiled as decode_*_{kv})."""
    base = decode_attention_triton.EIGHT_BIT_DECODE
    out = {
        "v_tile": dataclasses.replace(base, v_widen="tile"),
        "qk_native": dataclasses.replace(base, qk_dot="native", v_widen="tile"),
        "bn64": dataclasses.replace(base, block_n=64),
    }
    return out


def _dot_modes(cfg: decode_attention_triton.DecodeConfig, kv: str) -> dict[str, Any]:
    scaled = kv in _KV8
    return {
        "QK_NATIVE": scaled and cfg.qk_dot == "native",
        "V_TILE": scaled and cfg.v_widen == "tile",
        "WIDEN_ASM": True,
        "QMAX": 448.0 if kv == "fp8" else 127.0,
    }


def _kv8_consts(cfg: decode_attention_triton.DecodeConfig, kv: str, split: bool) -> dict[str, Any]:
    """The kv8 kernel's own constants for cfg (none when cfg selects the shared kernel)."""
    if cfg.kv8 is None or (split and not cfg.kv8.split_plans):
        return {}
    return {
        "DOT16": True,  # bf16 activations
        "CVT": cvt_code(cfg.kv8.cvt, kv == "int8"),
        "NATIVE": cfg.kv8.qk == "native",
        "SWAP": cfg.kv8.swap,
        "PREFETCH": cfg.kv8.prefetch,
        "DIAG": 0,
    }


def _split_consts(pre: prefill_attention_triton.PrefillConfig) -> dict[str, Any]:
    """The prefix-split constants of a step-rows launch at GQA 4 (prefill_split_triton.py)."""
    return {"SPLIT_Q": pre.split_q, "TILES_Q": -(-pre.split_q // (pre.block_m // 4))}


def _prefill_consts(pre: prefill_attention_triton.PrefillConfig) -> dict[str, Any]:
    return {
        "GROUP": 4,
        "GROUP_PAD": 4,
        **_HEADS,
        "BLOCK_M": pre.block_m,
        "BLOCK_Q": pre.block_m // 4,
        "BLOCK_N": pre.block_n,
        "BLOCK_SEQS": 256,
        "PAGES_AHEAD": pre.pages_ahead,
        "HEADS_FIRST": pre.heads_first,
    }


def default_specs() -> list[KernelSpec]:
    dec, pre = decode_attention_triton.DecodeConfig(), prefill_attention_triton.PrefillConfig()
    dec_types = _DEC_TYPES
    dec_consts = {
        "GROUP": 4,
        "BLOCK_H": 16,
        **_HEADS,
        "BLOCK_N": dec.block_n,
        "SCALED": False,
        "PDL": dec.pdl,
        **_dot_modes(dec, "bf16"),
    }
    return [
        KernelSpec(
            "decode_single_pass",
            decode_attention_triton._decode_kernel,
            dec_types,
            {**dec_consts, "SPLIT": False},
            dec.num_warps,
            dec.num_stages,
            _DEC_NODIV,
        ),
        KernelSpec(
            "decode_split",
            decode_attention_triton._decode_kernel,
            dec_types,
            {**dec_consts, "SPLIT": True},
            dec.num_warps,
            dec.num_stages,
            _DEC_NODIV,
        ),
        KernelSpec(
            "decode_split_pages_ahead",  # the plans for batches that do not fill the GPU
            decode_attention_triton._decode_kernel,
            dec_types,
            {**dec_consts, "SPLIT": True, "PAGES_AHEAD": True},
            dec.num_warps,
            dec.ahead_num_stages,
            _DEC_NODIV,
        ),
        KernelSpec(
            "decode_head_dim_80",
            decode_attention_triton._decode_kernel,
            dec_types,
            {**dec_consts, "HEAD_DIM": 80, "SPLIT": True},
            dec.num_warps,
            dec.num_stages,
            _DEC_NODIV,
        ),
        KernelSpec(
            "decode_reduce",
            decode_split_triton._decode_reduce_kernel,
            {
                "part_out_ptr": "*fp32",
                "part_lse_ptr": "*fp32",
                "out_ptr": "*bf16",
                "context_lens_ptr": "*i32",
            },
            {"HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_S": 64},
            4,
            1,
            _DEC_NODIV,
        ),
        KernelSpec(
            "prefill",
            prefill_attention_triton._prefill_kernel,
            {**_ATTN, "cu_seqlens_q_ptr": "*i32"},
            {**_prefill_consts(pre), "SCALED": False},
            pre.num_warps,
            pre.num_stages,
            ("stride_bt", "num_seqs", "flat"),
        ),
        KernelSpec(
            "prefill_step_kv",  # prefix-free steps: K/V rows of the step, no block table
            prefill_attention_triton._prefill_kernel,
            {**_ATTN, "cu_seqlens_q_ptr": "*i32"},
            {**_prefill_consts(pre), "SCALED": False, "CONTIG": True, "PREFIX": False},
            pre.num_warps,
            pre.step_kv_num_stages,
            ("stride_bt", "num_seqs", "flat"),
        ),
        KernelSpec(
            "rms_norm_residual",
            norm_triton._rms_norm_kernel,
            {
                "x_ptr": "*bf16",
                "residual_ptr": "*bf16",
                "weight_ptr": "*bf16",
                "out_ptr": "*bf16",
                "residual_out_ptr": "*bf16",
                "eps": "fp32",
            },
            {"HAS_RESIDUAL": True, "BLOCK": 4096, "PDL": True},
            8,
        ),
        KernelSpec(
            "qkv_prepare_qk_norm",
            qkv_prepare_triton._qkv_prepare_kernel,
            _QKV_PREPARE,
            {**_QKV_PREPARE_CONSTS, "HAS_NORM": True, **_UNSCALED_STORE, "PDL": True},
            1,
        ),
        KernelSpec(
            "qkv_prepare",
            qkv_prepare_triton._qkv_prepare_kernel,
            _QKV_PREPARE,
            {**_QKV_PREPARE_CONSTS, "HAS_NORM": False, **_UNSCALED_STORE},
            1,
        ),
        KernelSpec(
            "silu_and_mul",
            activation_triton._silu_and_mul_kernel,
            {"x_ptr": "*bf16", "out_ptr": "*bf16"},
            {"BLOCK": 1024, "PDL": True},
            4,
        ),
        *kv8_specs(),
    ]


def _source(spec: KernelSpec) -> ASTSource:
    params = list(inspect.signature(spec.fn.fn).parameters)
    # constexpr parameters the spec leaves out take their defaults (a launch that omits them does too)
    defaults = {
        name: p.default
        for name, p in inspect.signature(spec.fn.fn).parameters.items()
        if p.default is not inspect.Parameter.empty and "constexpr" in str(p.annotation)
    }
    spec = dataclasses.replace(spec, constexprs={**defaults, **spec.constexprs})
    signature = {p: "constexpr" if p in spec.constexprs else spec.types.get(p, "i32") for p in params}
    div16 = [["tt.divisibility", 16]]
    attrs = {
        (i,): div16
        for i, p in enumerate(params)
        if signature[p] != "constexpr" and not signature[p].startswith("fp") and p not in spec.not_div16
    }
    constexprs = {(params.index(k),): v for k, v in spec.constexprs.items()}
    return ASTSource(fn=spec.fn, signature=signature, constexprs=constexprs, attrs=attrs)


def _resource_usage(cubin: bytes) -> tuple[int | None, int | None]:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else (None, None)


def compile_kernel(spec: KernelSpec, arch: int = 90) -> KernelReport:
    options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
    compiled = triton.compile(_source(spec), target=GPUTarget("cuda", arch, 32), options=options)
    registers, stack = _resource_usage(compiled.asm["cubin"])
    ttgir = compiled.asm["ttgir"]
    async_copies = ttgir.count("async_copy_global_to_local")
    byte_loads = len(re.findall(r"ld\.shared\.[bsu]8\b", compiled.asm["ptx"]))
    return KernelReport(
        spec.name,
        registers,
        stack,
        compiled.metadata.shared,
        async_copies,
        loop_conversions(ttgir),
        byte_loads,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--json", action="store_true", help="print one JSON list instead of a table")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: the interpreter does not compile")
    reports = [compile_kernel(spec, args.arch) for spec in default_specs()]
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in reports]))
        return
    print("| kernel | registers | spill stack B | shared B | async copies | loop conversions | byte lds |")
    print("|---|---|---|---|---|---|---|")
    for r in reports:
        cells = (
            r.registers,
            r.stack_bytes,
            r.shared_bytes,
            r.async_copies,
            r.loop_conversions,
            r.byte_shared_loads,
        )
        print(f"| {r.name} | " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
