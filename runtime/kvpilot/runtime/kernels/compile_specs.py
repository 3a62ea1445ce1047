"""The engine's Triton kernels as compile specs, at the shapes the engine launches them (Qwen3-8B heads, bf16,
page size 16; the attention and store kernels also over 8-bit fp8/int8 pages with their fp32 scales), with
the 16-divisibility that Triton infers at launch for pointers and strides (triton_compile.KernelSpec)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

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
from .triton_compile import KernelSpec

ATTN_TYPES = {
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
HEADS = {"HEAD_DIM": 128, "BLOCK_D": 128, "PAGE": 16}
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
DEC_NODIV = ("partition_size", "num_splits", "num_heads", "stride_bt", *_SCALE_NODIV)
_KV8 = {"fp8": "*fp8e4nv", "int8": "*i8"}
_DEC_TYPES = {**ATTN_TYPES, "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"}
_DEC8_CONSTS = {"GROUP": 4, "BLOCK_H": 16, **HEADS, "SCALED": True}
_KV8_DTYPES = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}


def scaled(types: dict[str, str], kv: str) -> dict[str, str]:
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
        scaled(_DEC_TYPES, kv),
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
        DEC_NODIV,
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
                    scaled(_DEC_TYPES, kv),
                    {**_DEC8_CONSTS, "BLOCK_N": cfg.block_n, "SPLIT": False, **_dot_modes(cfg, kv)},
                    cfg.num_warps,
                    cfg.num_stages,
                    DEC_NODIV,
                )
            )
        specs.append(
            KernelSpec(
                f"prefill_{kv}",
                prefill_attention_triton._prefill_kernel,
                scaled({**ATTN_TYPES, "cu_seqlens_q_ptr": "*i32"}, kv),
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
                scaled({**ATTN_TYPES, **_SPLIT, "cu_seqlens_q_ptr": "*i32"}, kv),
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
                scaled(_QKV_PREPARE, kv),
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
        **HEADS,
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
        **HEADS,
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
            DEC_NODIV,
        ),
        KernelSpec(
            "decode_split",
            decode_attention_triton._decode_kernel,
            dec_types,
            {**dec_consts, "SPLIT": True},
            dec.num_warps,
            dec.num_stages,
            DEC_NODIV,
        ),
        KernelSpec(
            "decode_split_pages_ahead",  # the plans for batches that do not fill the GPU
            decode_attention_triton._decode_kernel,
            dec_types,
            {**dec_consts, "SPLIT": True, "PAGES_AHEAD": True},
            dec.num_warps,
            dec.ahead_num_stages,
            DEC_NODIV,
        ),
        KernelSpec(
            "decode_head_dim_80",
            decode_attention_triton._decode_kernel,
            dec_types,
            {**dec_consts, "HEAD_DIM": 80, "SPLIT": True},
            dec.num_warps,
            dec.num_stages,
            DEC_NODIV,
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
            DEC_NODIV,
        ),
        KernelSpec(
            "prefill",
            prefill_attention_triton._prefill_kernel,
            {**ATTN_TYPES, "cu_seqlens_q_ptr": "*i32"},
            {**_prefill_consts(pre), "SCALED": False},
            pre.num_warps,
            pre.num_stages,
            ("stride_bt", "num_seqs", "flat"),
        ),
        KernelSpec(
            "prefill_step_kv",  # prefix-free steps: K/V rows of the step, no block table
            prefill_attention_triton._prefill_kernel,
            {**ATTN_TYPES, "cu_seqlens_q_ptr": "*i32"},
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
