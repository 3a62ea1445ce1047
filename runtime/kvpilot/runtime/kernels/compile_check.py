"""Compile every Triton kernel for a GPU architecture without a GPU, and report its resources.

    python -m kvpilot.runtime.kernels.compile_check [--arch 90]

Lowers each kernel of compile_specs.default_specs (the shapes the engine uses) through Triton's real
pipeline (triton_compile.compile_kernel) and prints registers, spill stack, shared memory and whether the
K/V loads were software-pipelined (async copies). Must run WITHOUT TRITON_INTERPRET=1 (the interpreter
replaces the compiler).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from .compile_specs import default_specs
from .triton_compile import compile_kernel


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
