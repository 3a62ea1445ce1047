"""The repo root holds a folder named operator/: it must never shadow the standard library's operator
module, whatever puts the working directory on sys.path (`python -m`, `python -c`, the REPL)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.source_layout import COMPONENTS, REPO, module_file


@pytest.mark.parametrize(
    "argv",
    [
        ["-c", "import collections, operator; assert operator.eq(1, 1); print('ok')"],
        ["-m", "pip", "--version"],
        [
            "-c",
            "import kvpilot.operator.planning.planner, kvpilot.runtime.config, kvpilot.gateway.routing;"
            " print('ok')",
        ],
    ],
)
def test_commands_from_the_repo_root_do_not_shadow_the_stdlib(argv: list[str]) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ""}
    done = subprocess.run(
        [sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_no_component_folder_is_itself_a_package() -> None:
    """A root folder with an __init__.py would be importable under its own name (operator!)."""
    for component in COMPONENTS:
        assert not (REPO / component / "__init__.py").exists()
        assert not (REPO / component / "kvpilot" / "__init__.py").exists(), "kvpilot is a namespace package"
        assert module_file(f"kvpilot.{component}") is not None
