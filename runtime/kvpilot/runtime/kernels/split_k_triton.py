"""How the split-K programs of the decode GEMVs (kernels/int_gemv_triton.py, kernels/fp8_gemv_triton.py)
combine their float32 partial sums into y [M, N]. SPLIT_K programs share each output tile; one of:

  store       SPLIT_K = 1: the program writes y directly.
  atomic      atomic adds into y, zeroed first (a memset and the kernel; adds rounded in y's dtype, in
              arrival order).
  atomic_f32  atomic adds into a zeroed float32 buffer, then cast to y (memset, kernel, cast).
  workspace   partials stored in a float32 [SPLIT_K, M, N] workspace, summed in split order by a second
              kernel (kernel, reduce; deterministic).
  fixup       partials stored in the workspace; each program then counts itself in on its tile's counter
              and the last to arrive sums the tile's partials in split order, writes y and resets the
              counter to zero for the next call (one kernel, deterministic). The counters [tiles] int32
              persist across calls (zero between them), so the caller owns them (split_counters).
  fixup_wide  fixup whose last program loads the partials 4 splits at a time (the same sums in the
              same order): "fixup" waits one L2 round trip per split, which a deep split-K (16-48 for
              the one-warp int4 mma GEMV) pays at the end of every tile. Not a default: not yet timed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

REDUCES = ("atomic", "atomic_f32", "workspace", "fixup", "fixup_wide")
_MODES = {"store": 0, "atomic": 1, "atomic_f32": 1, "workspace": 2, "fixup": 3, "fixup_wide": 4}


@triton.jit
def store_split(
    acc,  # float32 partial sum of this program (any shape; offs and mask alike)
    out_ptr,  # y [M, N], or the float32 buffer of atomic_f32
    ws_ptr,  # float32 [SPLIT_K, M, N] workspace (workspace, fixup)
    counter_ptr,  # int32 [tiles] (fixup)
    offs,  # offsets of acc's elements in [M, N]
    mask,
    pid_k,
    split_k,
    MN,
    MODE: tl.constexpr,  # _MODES
):
    if MODE == 0:
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    elif MODE == 1:
        tl.atomic_add(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask, sem="relaxed")
    else:
        tl.store(ws_ptr + pid_k * MN + offs, acc, mask=mask)
    if MODE >= 3:
        tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
        tl.debug_barrier()  # every thread's partial is written before the count is released
        arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel")
        if arrived == split_k - 1:  # the last of the tile's programs: the others' partials are visible
            total = tl.zeros_like(acc)
            if MODE == 3:
                for split in range(split_k):  # split order: the same sum on every call
                    total += tl.load(ws_ptr + split * MN + offs, mask=mask, other=0.0, cache_modifier=".cg")
            else:  # four loads in flight per round trip, added in split order
                for split0 in range(0, split_k, 4):
                    at = ws_ptr + split0 * MN + offs
                    rank = offs * 0 + split0  # a tensor: the interpreter's masks must be tensors
                    p0 = tl.load(at, mask=mask, other=0.0, cache_modifier=".cg")
                    p1 = tl.load(at + MN, mask=mask & (rank + 1 < split_k), other=0.0, cache_modifier=".cg")
                    p2 = tl.load(
                        at + 2 * MN, mask=mask & (rank + 2 < split_k), other=0.0, cache_modifier=".cg"
                    )
                    p3 = tl.load(
                        at + 3 * MN, mask=mask & (rank + 3 < split_k), other=0.0, cache_modifier=".cg"
                    )
                    total = (((total + p0) + p1) + p2) + p3
            tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(counter_ptr + tile, 0, sem="relaxed")  # the next launch is stream-ordered


@triton.jit
def _reduce_splits_kernel(
    part_ptr,  # float32 [SPLIT_K, M * N]
    out_ptr,  # [M * N] in the activations' dtype
    MN,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Sum of the split-K partials, cast on store: one launch (torch would take a sum and a cast)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in range(SPLIT_K):
        acc += tl.load(part_ptr + split * MN + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def split_counters(n: int, device: torch.device, max_m: int = 64, min_block_n: int = 16) -> torch.Tensor:
    """Zeroed fixup counters for a GEMM of N outputs: enough for every launch shape up to max_m tokens
    (one counter per output tile of >= 16 tokens x >= min_block_n columns)."""
    return torch.zeros(-(-max_m // 16) * -(-n // min_block_n), device=device, dtype=torch.int32)


@dataclass
class SplitOutput:
    """The buffers of one launch: y, what the kernel writes into (y or a float32 buffer), the workspace
    and counters (fixup / workspace), and the kernel's MODE."""

    out: torch.Tensor
    target: torch.Tensor
    workspace: torch.Tensor
    counters: torch.Tensor
    mode: int
    split_k: int

    def finish(self) -> torch.Tensor:
        """y, after the kernel: the workspace summed (workspace) or the float32 buffer cast (atomic_f32)."""
        if self.mode == 2:
            mn, block = self.out.numel(), 1024
            _reduce_splits_kernel[(triton.cdiv(mn, block),)](
                self.workspace, self.out, mn, SPLIT_K=self.split_k, BLOCK=block
            )
        elif self.target is not self.out:
            self.out.copy_(self.target)
        return self.out


def split_output(
    x: torch.Tensor, m: int, n: int, split_k: int, reduce: str, counters: torch.Tensor | None, tiles: int
) -> SplitOutput:
    """Buffers for y [M, N] in x's dtype from split_k partials combined by `reduce` (REDUCES). counters:
    the caller's persistent fixup counters (>= tiles of them), else zeroed ones made for this call."""
    if reduce not in REDUCES:
        raise ValueError(f"split-K reduction {reduce!r} is not one of {REDUCES}")
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    none = out.new_empty(0, dtype=torch.float32)
    no_counters = torch.empty(0, device=x.device, dtype=torch.int32)
    if split_k == 1:
        return SplitOutput(out, out, none, no_counters, 0, 1)
    if reduce in ("workspace", "fixup", "fixup_wide"):
        workspace = torch.empty(split_k, m, n, device=x.device, dtype=torch.float32)
        if reduce == "workspace":
            return SplitOutput(out, out, workspace, no_counters, 2, split_k)
        if counters is None or counters.numel() < tiles:
            counters = torch.zeros(tiles, device=x.device, dtype=torch.int32)
        return SplitOutput(out, out, workspace, counters, _MODES[reduce], split_k)
    if reduce == "atomic_f32" and x.dtype != torch.float32:
        return SplitOutput(
            out, torch.zeros(m, n, device=x.device, dtype=torch.float32), none, no_counters, 1, split_k
        )
    return SplitOutput(out, out.zero_(), none, no_counters, 1, split_k)
