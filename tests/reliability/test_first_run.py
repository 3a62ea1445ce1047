"""First-run friction (issue 17): plan offline, `| head`, a busy port, the banner's curl line."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO / "examples" / "qwen3-8b-h100.yaml")


def kvpilot(*args: str, **kwargs: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvpilot.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


def test_the_readme_plan_works_offline() -> None:
    done = kvpilot("plan", "-f", EXAMPLE, "--offline", "-o", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["feasible"] is True


def test_a_closed_pipe_is_not_a_traceback() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "kvpilot.cli.main", "plan", "-f", EXAMPLE, "--offline"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # `| head` that already exited: the first write gets EPIPE
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0
    assert "Traceback" not in err and "BrokenPipeError" not in err


def test_a_busy_port_says_to_pass_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = kvpilot("up", "--port", str(port), "--model-dir", "/nonexistent")
    assert done.returncode == 2
    assert f"port {port}" in done.stderr and "--port" in done.stderr and "Traceback" not in done.stderr


def test_the_banner_curl_line_bounds_the_answer() -> None:
    from kvpilot.cli.stack import banner

    curl = next(line for line in banner("m", "http://127.0.0.1:8080", 1).splitlines() if "curl" in line)
    body = json.loads(curl.split("-d '", 1)[1].rstrip("'"))
    assert 0 < body["max_tokens"] <= 256 and body["model"] == "m"


def test_the_gateway_cli_names_port_when_it_is_busy(capsys) -> None:
    from kvpilot.gateway.__main__ import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["--pool", "m=http://127.0.0.1:1", "--host", "127.0.0.1", "--port", str(port)]) == 2
    assert "--port" in capsys.readouterr().err
