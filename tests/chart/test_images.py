"""docker/*.Dockerfile can't be built here; these checks catch what would break a build or a pod: copied
paths that don't exist or that .dockerignore drops, an entrypoint that isn't a console script, root users,
and torch sneaking into the operator or gateway image."""

from __future__ import annotations

import ast
import fnmatch
import json
import shlex
import tomllib
from pathlib import Path

import pytest

from tests.source_layout import REPO, module_file

IMAGES = {"operator": "kvpilot-operator", "gateway": "kvpilot-gateway", "runtime": "kvpilot-runtime"}


def final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def copy_sources(instructions: list[tuple[str, str]]) -> list[str]:
    """Build-context paths of every COPY/ADD (copies from other stages excluded)."""
    sources: list[str] = []
    for keyword, args in instructions:
        if keyword not in ("COPY", "ADD"):
            continue
        words = json.loads(args) if args.startswith("[") else shlex.split(args)
        if any(word.startswith("--from=") for word in words):
            continue
        sources.extend(w for w in words[:-1] if not w.startswith("--"))
    return sources


def dockerignored(path: str, rules: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides."""
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/")
        candidates = [pattern, pattern.removeprefix("**/")]
        if any(fnmatch.fnmatchcase(p, c) for p in prefixes for c in candidates):
            ignored = not negate
    return ignored


def dockerignore_rules() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def console_scripts() -> dict[str, str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.mark.parametrize("image", IMAGES)
def test_copied_paths_exist_and_reach_the_build(dockerfile, image: str) -> None:
    sources = copy_sources(dockerfile(image))
    assert sources, "the image copies the project in"
    rules = dockerignore_rules()
    for source in sources:
        assert (REPO / source).exists(), f"{image}: COPY {source} does not exist"
        assert not dockerignored(source, rules), f"{image}: .dockerignore drops {source}"


@pytest.mark.parametrize("image", IMAGES)
def test_entrypoint_is_a_console_script(dockerfile, image: str) -> None:
    [entrypoint] = [
        json.loads(args) for keyword, args in final_stage(dockerfile(image)) if keyword == "ENTRYPOINT"
    ]
    assert entrypoint == [IMAGES[image]]
    target = console_scripts()[entrypoint[0]]
    module, _, function = target.partition(":")
    source = module_file(module)
    assert source is not None and source.exists(), (
        f"{entrypoint[0]} -> {module}: {source.relative_to(REPO)} is missing"
    )
    defined = {
        node.name
        for node in ast.parse(source.read_text()).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert function in defined, f"{module} defines no {function}()"
    copied = {Path(s).parts[0] for s in copy_sources(dockerfile(image))}
    assert source.relative_to(REPO).parts[0] in copied, f"{image} image does not copy {source.parent}"


@pytest.mark.parametrize("image", IMAGES)
def test_runs_as_non_root(dockerfile, image: str) -> None:
    stage = final_stage(dockerfile(image))
    users = [i for i, (keyword, _) in enumerate(stage) if keyword == "USER"]
    assert users, f"{image}: no USER in the final stage"
    user = stage[users[-1]][1].split(":")[0]
    assert user not in {"root", "0"}
    assert users[-1] < next(i for i, (keyword, _) in enumerate(stage) if keyword == "ENTRYPOINT")
    if user.isdigit():
        assert int(user) >= 1000


@pytest.mark.parametrize("image", ["operator", "gateway"])
def test_slim_images_install_only_their_extra(dockerfile, image: str) -> None:
    instructions = dockerfile(image)
    assert all(args.startswith("python:3.12-slim") for keyword, args in instructions if keyword == "FROM")
    installs = " ".join(args for keyword, args in instructions if keyword == "RUN" and "pip " in args)
    assert f"[{image}]" in installs
    for heavy in ("[runtime]", "[all]", "torch", "triton", "runtime,", ",runtime"):
        assert heavy not in installs, f"{image} image installs {heavy}"
    copied = {Path(s).parts[0] for s in copy_sources(instructions)}
    assert "runtime" not in copied


def test_runtime_image_has_cuda_and_the_runtime_extra(dockerfile) -> None:
    instructions = dockerfile("runtime")
    [base] = [args for keyword, args in instructions if keyword == "FROM"]
    assert base.startswith(("nvidia/cuda:12.", "pytorch/pytorch:"))
    installs = " ".join(args for keyword, args in instructions if keyword == "RUN")
    assert ".[runtime]" in installs and "gcc" in installs  # Triton compiles launchers at run time
    assert ("EXPOSE", "8000") in instructions


def test_dockerignore_matching() -> None:
    rules = ["*", "!cli/", "**/__pycache__"]
    assert dockerignored("tests", rules)
    assert not dockerignored("cli", rules)
    assert not dockerignored("cli/main.py", rules)
    assert dockerignored("cli/__pycache__/main.cpython-312.pyc", rules)
