"""Maps the component folders into the `kvpilot` namespace (see DESIGN.md, "Layout")."""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
COMPONENTS = {"kvpilot": "cli", "kvpilot.operator": "operator", "kvpilot.gateway": "gateway",
              "kvpilot.runtime": "runtime"}


def _packages() -> list[str]:
    found = []
    for package, folder in COMPONENTS.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / folder)
            found.append(".".join([package, *rel.parts]) if rel.parts else package)
    return found


setup(
    packages=_packages(),
    package_dir=COMPONENTS,
    package_data={"kvpilot.runtime.fixtures": ["*.txt"], "kvpilot.operator": ["*.yaml"]},
    include_package_data=True,
)
