"""`kvpilot` command: subcommands are imported lazily so `kvpilot plan` never needs torch."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from importlib import import_module

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("kvpilot.operator.planning.command", "Print the plan for an InferenceService manifest"),
    "up": ("kvpilot.cli.up", "Run the local stack: gateway + runtime replicas on this machine"),
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help") or args[0] not in SUBCOMMANDS:
        print("usage: kvpilot {" + ",".join(SUBCOMMANDS) + "} ...\n")
        for name, (_, help_text) in SUBCOMMANDS.items():
            print(f"  {name:6s} {help_text}")
        return 0 if args and args[0] in ("-h", "--help") else 2
    entry: Callable[[list[str]], int] = import_module(SUBCOMMANDS[args[0]][0]).main
    try:
        code = entry(args[1:])
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`kvpilot plan ... | head`): not an error. Point stdout at /dev/null so
        # the interpreter's own flush at exit does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return code


if __name__ == "__main__":
    raise SystemExit(main())
