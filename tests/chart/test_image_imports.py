"""Each image's entrypoint, followed through its static imports, needs only what that image holds: kvpilot
modules from the folders the Dockerfile copies, and third-party packages from the dependency closure of
its extra (so no torch in the operator or gateway image)."""

from __future__ import annotations

import ast
import json
import shlex
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.source_layout import REPO, module_file

IMAGES = {"operator": "kvpilot-operator", "gateway": "kvpilot-gateway", "runtime": "kvpilot-runtime"}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(source: Path, module: str) -> set[str]:
    """Absolute names a module imports at run time (`if TYPE_CHECKING:` blocks skipped); `from a import b`
    gives both a and a.b, since b may be a submodule."""
    package = module if source.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    pending: list[ast.AST] = [ast.parse(source.read_text())]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        pending.extend(ast.iter_child_nodes(node))
    return names


def import_graph(entry: str) -> tuple[set[Path], set[str]]:
    """(kvpilot source files reached from `entry`, top-level third-party modules they import)."""
    files: set[Path] = set()
    third_party: set[str] = set()
    queue = [entry]
    while queue:
        module = queue.pop()
        parts = module.split(".")
        for depth in range(1, len(parts) + 1):  # importing a.b.c runs a, a.b and a.b.c
            name = ".".join(parts[:depth])
            source = module_file(name) if parts[0] == "kvpilot" else None
            if parts[0] != "kvpilot":
                if parts[0] not in sys.stdlib_module_names and parts[0] != "__future__":
                    third_party.add(parts[0])
                break
            if source is None or source in files:
                continue
            files.add(source)
            queue.extend(imported_names(source, name))
    return files, third_party


def dependency_closure(requirements: list[str]) -> set[str]:
    """Canonical names of every distribution these requirements pull in, transitively (extras honoured)."""
    names: set[str] = set()
    walked: set[tuple[str, frozenset[str]]] = set()
    pending = [(Requirement(r), "") for r in requirements]
    while pending:
        requirement, via_extra = pending.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": via_extra}):
            continue
        name = canonicalize_name(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in walked:
            continue
        walked.add(key)
        names.add(name)
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        for extra in ["", *requirement.extras]:
            pending.extend((Requirement(r), extra) for r in requires)
    return names


def image_requirements(image: str) -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project["dependencies"] + project["optional-dependencies"][image]


def copied_folders(image: str) -> set[str]:
    folders: set[str] = set()
    for line in (REPO / "docker" / f"{image}.Dockerfile").read_text().splitlines():
        if line.startswith(("COPY ", "ADD ")) and "--from=" not in line:
            args = line.split(None, 1)[1]
            words = json.loads(args) if args.startswith("[") else shlex.split(args)
            folders.update(Path(w).parts[0] for w in words[:-1])
    return folders


@pytest.mark.parametrize("image", IMAGES)
def test_entrypoint_imports_fit_the_image(image: str) -> None:
    entry = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"][IMAGES[image]]
    module = entry.partition(":")[0]
    assert module_file(module) is not None, f"{module} does not exist yet"
    files, third_party = import_graph(module)
    copied = copied_folders(image)
    missing = {str(f.relative_to(REPO)) for f in files if f.relative_to(REPO).parts[0] not in copied}
    assert not missing, f"{image} image lacks {missing}"
    closure = dependency_closure(image_requirements(image))
    providers = packages_distributions()
    for name in sorted(third_party):
        dists = {canonicalize_name(d) for d in providers.get(name, [])}
        where = dists or "not installed"
        assert dists & closure, f"{image} imports {name} ({where}), not in kvpilot[{image}]"


def test_import_graph_follows_relative_and_lazy_imports() -> None:
    files, third_party = import_graph("kvpilot.cli.main")
    assert module_file("kvpilot.cli.main") in files
    assert module_file("kvpilot.cli") in files
    assert "torch" not in third_party


def test_dependency_closure_is_transitive() -> None:
    closure = dependency_closure(["fastapi>=0.110"])
    assert {"fastapi", "starlette", "pydantic"} <= closure
    assert "torch" not in closure
    assert "torch" in dependency_closure(image_requirements("runtime"))


def test_runtime_image_can_run_the_operators_model_download() -> None:
    """The operator's fetch-model init container runs `python -c HF_DOWNLOAD` in the runtime image."""
    from kvpilot.operator.model_mount import HF_DOWNLOAD

    closure = dependency_closure(image_requirements("runtime"))
    providers = packages_distributions()
    for name in imported_names_of_source(HF_DOWNLOAD):
        if name in sys.stdlib_module_names:
            continue
        assert {canonicalize_name(d) for d in providers.get(name, [])} & closure, name
    dockerfile = (REPO / "docker" / "runtime.Dockerfile").read_text()
    assert "python3.12 -m venv /opt/venv" in dockerfile and "PATH=/opt/venv/bin:$PATH" in dockerfile


def imported_names_of_source(code: str) -> set[str]:
    tree = ast.parse(code)
    names = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    return names | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
