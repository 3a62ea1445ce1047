"""`kvpilot up`'s LocalDriver supervises its runtimes like a Deployment (issue 17): a killed process is
reaped, logged and replaced with back-off; runtimes start through this interpreter, not PATH."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import pytest
from gateway_testing import HERE, wait_until_async
from kvpilot.gateway.autoscale.local import RUNTIME_COMMAND, LocalDriver, LocalModel, backoff_delay

FAKE = (sys.executable, str(HERE / "fake_runtime_process.py"))


class Sink:
    def __init__(self) -> None:
        self.endpoints: dict[str, list[str]] = {}

    def set_endpoints(self, model: str, urls: list[str]) -> None:
        self.endpoints[model] = list(urls)


def test_runtimes_start_through_this_interpreter() -> None:
    assert (sys.executable, "-m", "kvpilot.runtime") == RUNTIME_COMMAND
    assert LocalDriver({"m": LocalModel(Path("/x"))}).command == RUNTIME_COMMAND


def test_a_killed_replica_is_reaped_logged_and_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        driver = LocalDriver(
            {"m": LocalModel(tmp_path)}, command=FAKE, log_dir=tmp_path, backoff=0.2, poll_interval=0.05
        )
        sink = Sink()
        supervisor = asyncio.ensure_future(driver.run(sink))
        try:
            await driver.scale_model("m", 2)
            await wait_until_async(lambda: len(sink.endpoints.get("m", [])) == 2, timeout=30)
            victim = driver.replicas["m"][0]
            os.kill(victim.process.pid, signal.SIGKILL)
            await wait_until_async(lambda: victim not in driver.replicas["m"], timeout=10)
            assert victim.process.returncode == -signal.SIGKILL  # reaped: no <defunct> child left
            await wait_until_async(
                lambda: len(sink.endpoints["m"]) == 2 and victim.url not in sink.endpoints["m"], timeout=30
            )
            assert driver.restarts["m"] == 1
        finally:
            supervisor.cancel()
            await driver.aclose()

    with caplog.at_level(logging.WARNING, logger="kvpilot.gateway.autoscale.local"):
        asyncio.run(main())
    assert "exited with code -9" in caplog.text and "replacing it in" in caplog.text


def test_back_off_doubles_up_to_its_cap() -> None:
    assert [backoff_delay(n, 1.0, 30.0) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff_delay(10_000, 1.0, 30.0) == 30


def test_a_crash_loop_is_retried_with_growing_delays(tmp_path: Path) -> None:
    crash = (sys.executable, "-c", "raise SystemExit(1)")

    async def main() -> LocalDriver:
        driver = LocalDriver(
            {"m": LocalModel(tmp_path)},
            command=crash,
            log_dir=tmp_path,
            backoff=0.05,
            max_backoff=0.2,
            poll_interval=0.02,
        )
        supervisor = asyncio.ensure_future(driver.run(Sink()))
        try:
            await driver.scale_model("m", 1)
            await wait_until_async(lambda: driver.restarts["m"] >= 3, timeout=30)
        finally:
            supervisor.cancel()
            await driver.aclose()
        return driver

    driver = asyncio.run(main())
    assert driver._failures["m"] >= 3  # never reset: no replacement ever became healthy
    assert all(r.process.returncode is not None for r in driver.replicas["m"])
