"""Maps the component folders into the `kvpilot` namespace (see DESIGN.md, "Layout").

Each top-level component folder is a source root holding `kvpilot/<component>/`: `kvpilot` itself is an
implicit namespace package, so no folder named `operator/` on sys.path can ever shadow the standard
library, and static tools resolve `kvpilot.*` through `mypy_path` (pyproject.toml) alone.
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
SOURCE_ROOTS = ("cli", "runtime", "operator", "gateway", "contracts")


def _packages() -> tuple[list[str], dict[str, str]]:
    found, dirs = [], {}
    for root in SOURCE_ROOTS:
        base = ROOT / root
        for init in sorted((base / "kvpilot").rglob("__init__.py")):
            rel = init.parent.relative_to(base)
            name = ".".join(rel.parts)
            found.append(name)
            dirs[name] = str(Path(root, *rel.parts))
    return found, dirs


PACKAGES, PACKAGE_DIR = _packages()

setup(
    packages=PACKAGES,
    package_dir=PACKAGE_DIR,
    package_data={
        "kvpilot.runtime.fixtures": ["*.txt"],
        "kvpilot.runtime.eval": ["*.txt"],
        "kvpilot.operator.planning": ["*.yaml"],
        "kvpilot.runtime.kernels": ["*.cu", "*.cuh"],
    },
    include_package_data=True,
)
