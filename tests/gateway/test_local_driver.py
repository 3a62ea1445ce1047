"""Scale from zero on one machine: a request is held while the LocalDriver starts a runtime, then served;
the pool scales back to zero after the delay, and no runtime process outlives the gateway."""

from __future__ import annotations

import sys

import httpx
import openai
from gateway_testing import ServerThread, gateway_config, metric_value, wait_until
from kvpilot.gateway.app import create_app
from kvpilot.gateway.autoscale.local import LocalDriver, LocalModel


def test_scale_from_zero_serves_the_held_request_then_scales_to_zero(tiny_model_dir, tmp_path) -> None:
    autoscaling = {
        "minReplicas": 0,
        "maxReplicas": 1,
        "targetQueueDepth": 4,
        "scaleDownDelaySeconds": 1,
        "windowSeconds": 1,
    }
    config = gateway_config(
        {"tiny": {"autoscaling": autoscaling}},
        autoscaler={"intervalSeconds": 0.2},
        limits={"holdTimeoutSeconds": 120},
    )
    command = (sys.executable, "-m", "kvpilot.runtime")
    driver = LocalDriver({"tiny": LocalModel(tiny_model_dir)}, command=command, log_dir=tmp_path)
    with ServerThread(create_app(config, discovery=[driver], driver=driver)) as gw:
        assert driver.replicas["tiny"] == []  # nothing runs before the first request
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=120)
        reply = client.completions.create(
            model="tiny", prompt="hello", max_tokens=3, extra_body={"ignore_eos": True}
        )
        assert reply.usage.completion_tokens == 3
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert metric_value(metrics, "kvpilot_gateway_scaling_decisions_total", direction="up") == 1
        (replica,) = driver.replicas["tiny"]
        process = replica.process
        assert replica.ready and process.poll() is None

        # Idle for longer than scaleDownDelaySeconds: back to zero, the process is stopped.
        def scaled_down() -> bool:
            metrics = httpx.get(f"{gw.url}/metrics").text
            return metric_value(metrics, "kvpilot_gateway_scaling_decisions_total", direction="down") == 1

        wait_until(scaled_down, timeout=30)  # counted once the driver has stopped the process
        assert driver.replicas["tiny"] == [] and process.poll() is not None
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert metric_value(metrics, "kvpilot_gateway_pool_desired_replicas", model="tiny") == 0
        client.completions.create(model="tiny", prompt="again", max_tokens=2)  # and from zero once more
        second = driver.replicas["tiny"][0].process
    assert second.poll() is not None  # the app's shutdown stopped it: no orphans
