"""Measures the two ceilings every floor in BENCHMARKS.md uses: device copy bandwidth and bf16 matmul rate."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from triton.testing import do_bench


def copy_bandwidth(n_bytes: int = 8 << 30) -> float:
    src = torch.randn(n_bytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * n_bytes / (ms * 1e-3)  # bytes read + bytes written


def matmul_rate(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    return 2 * n**3 / (ms * 1e-3)


def main() -> int:
    out = {
        "device": torch.cuda.get_device_name(),
        "copy_TBps": copy_bandwidth() / 1e12,
        "bf16_TFLOPs": matmul_rate() / 1e12,
        "torch": torch.__version__,
    }
    print(json.dumps(out))
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
