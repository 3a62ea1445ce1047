"""Where a kvpilot module's source lives: each top-level component folder is a source root holding
kvpilot/<component>/ (setup.py), so `kvpilot.runtime.engine` is runtime/kvpilot/runtime/engine/."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMPONENTS = ("cli", "operator", "gateway", "runtime", "contracts")
PACKAGE_DIRS = {f"kvpilot.{c}": f"{c}/kvpilot/{c}" for c in COMPONENTS}


def module_file(module: str) -> Path | None:
    """The source file of a kvpilot module (its __init__.py for a package), or None if there is none."""
    owners = [p for p in PACKAGE_DIRS if module == p or module.startswith(p + ".")]
    if not owners:
        return None
    package = max(owners, key=len)
    rest = module[len(package) :].lstrip(".").split(".") if module != package else []
    base = REPO / PACKAGE_DIRS[package]
    base = base.joinpath(*rest) if rest else base
    if (base / "__init__.py").exists():
        return base / "__init__.py"
    return base.with_suffix(".py") if base.with_suffix(".py").exists() else None
