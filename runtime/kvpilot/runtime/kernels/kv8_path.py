"""The 8-bit decode kernel's options (host side, no triton import: DecodeConfig carries them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kv8Path:
    """How the 8-bit decode kernel (kv8_decode_triton.py) computes one tile.

    cvt: widening of K and V to fp16 ("cast" | "ptx" | "bias": kv8_convert_triton.py); "auto": "bias"
        for int8 (two instructions per four codes), "ptx" for e4m3 (the one-instruction cvt per pair).
    qk: "widen": fp16 QK dot on widened K; "native": q quantized per row to the cache's type and the QK
        dot on 8-bit operands (int8 x int8 -> int32, e4m3 x e4m3 -> fp32; K is never widened).
        16-bit activations only: with fp32 activations (the CPU engine) K is widened exactly.
    swap: compute S^T = K q^T and O^T = V^T P^T, so the context positions (BLOCK_N) or head_dim are the
        M side of the dots (M >= 64: Hopper's wgmma, operands read from shared memory) instead of the
        16-row padded query group (4 real rows at GQA 4).
    prefetch: load tile i + 1 into registers before computing tile i, so each program keeps a tile in
        flight while it computes (with num_stages 1: no shared-memory staging of the loads).
    split_plans: False: only single-pass plans (one partition per sequence: large batches) take this
        path; split-KV plans (few sequences) keep the shared kernel.
    diag: bench-only diagnostics: "none"; "load": load the tiles and scales and fold them with xor/add
        (no conversion, no dots); "convert": widen them too (no dots). Outputs are meaningless then.
    """

    cvt: str = "auto"
    qk: str = "widen"
    swap: bool = False
    prefetch: bool = False
    split_plans: bool = True
    diag: str = "none"

    def __post_init__(self) -> None:
        modes = {
            "cvt": ("auto", "cast", "ptx", "bias"),
            "qk": ("widen", "native"),
            "diag": ("none", "load", "convert"),
        }
        for name, allowed in modes.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"Kv8Path.{name} must be one of {allowed}, got {getattr(self, name)!r}")


CVT_CODES = {"cast": 0, "ptx": 1, "bias": 2}


def cvt_code(cvt: str, int8: bool) -> int:
    """The kernel's CVT constant for a Kv8Path.cvt and a cache of int8 (else e4m3) codes."""
    return CVT_CODES["bias" if int8 else "ptx"] if cvt == "auto" else CVT_CODES[cvt]


DIAG_CODES = {"none": 0, "load": 1, "convert": 2}
