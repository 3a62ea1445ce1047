"""Suite-wide setup. Triton decides at @triton.jit decoration time whether kernels are compiled or run by its
CPU interpreter, so without a GPU TRITON_INTERPRET=1 must be set before anything imports triton."""

from __future__ import annotations

import os

try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # the operator/gateway-only environments have no torch
    pass
