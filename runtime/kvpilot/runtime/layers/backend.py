"""Choosing an op implementation by backend name, passed down explicitly from the model runner.

"torch" runs the plain-PyTorch references from runtime/kernels (the oracle); "cpu" the same ops rewritten
for serving on a CPU (kernels/cpu.py, tested against the references); "triton" the GPU kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

BACKENDS = ("torch", "cpu", "triton")


def lazy_op(module: str, name: str) -> Callable[..., Any]:
    """An op imported on first call, so choosing the torch backend never imports triton."""
    resolved: list[Callable[..., Any]] = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if not resolved:
            resolved.append(getattr(import_module(module), name))
        return resolved[0](*args, **kwargs)

    call.__name__ = name
    return call


def pick_op(ops: Mapping[str, Callable[..., Any]], backend: str, op_name: str) -> Callable[..., Any]:
    """ops[backend], or a ValueError naming the op and the backends that implement it."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend not in ops:
        raise ValueError(f"{op_name} has no {backend!r} implementation; available: {', '.join(ops)}")
    return ops[backend]
