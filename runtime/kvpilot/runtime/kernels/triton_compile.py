"""Lower a Triton kernel through Triton's real pipeline (TTIR -> TTGIR -> PTX -> cubin with ptxas) for a GPU
architecture without a GPU, and report its resources: registers, spill stack, shared memory, whether its loads
were software-pipelined (async copies), layout conversions inside loops and bytewise shared loads. The
specs of the engine's kernels are in compile_specs.py; compile_check.py runs them all. Must run WITHOUT
TRITON_INTERPRET=1 (the interpreter replaces the compiler)."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


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


def source(spec: KernelSpec) -> ASTSource:
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


def resource_usage(cubin: bytes) -> tuple[int | None, int | None]:
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
    compiled = triton.compile(source(spec), target=GPUTarget("cuda", arch, 32), options=options)
    registers, stack = resource_usage(compiled.asm["cubin"])
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
