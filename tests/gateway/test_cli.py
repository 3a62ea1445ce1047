"""`kvpilot-gateway` flags -> GatewayConfig, environment defaults, and the cluster-mode wiring."""

from __future__ import annotations

import pytest
from kvpilot.gateway.__main__ import autoscaling_defaults, build_app, build_config, main, parse_args
from kvpilot.gateway.config import PolicyName


def test_flags_and_config_file_merge(tmp_path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text("pools:\n  a: {endpoints: ['http://10.0.0.1:8000/']}\nlimits: {maxQueued: 3}\n")
    args = parse_args(["--config", str(path), "--pool", "b=http://h:1,http://h:2", "--policy", "least-load"])
    config = build_config(args)
    assert config.pools["a"].endpoints == ("http://10.0.0.1:8000",)
    assert config.pools["b"].endpoints == ("http://h:1", "http://h:2")
    assert config.pools["b"].policy is PolicyName.LEAST_LOAD and config.limits.max_queued == 3


def test_bad_input_is_a_clear_error_not_a_crash(tmp_path, capsys) -> None:
    assert main(["--pool", "nourl"]) == 2
    assert "MODEL=URL" in capsys.readouterr().err
    assert main(["--pool", "m=ftp://x"]) == 2
    assert "http://host:port" in capsys.readouterr().err


def test_environment_defaults_for_inference_services(monkeypatch) -> None:
    monkeypatch.setenv("KVPILOT_AUTOSCALING_WINDOW_SECONDS", "20")
    monkeypatch.setenv("KVPILOT_AUTOSCALING_TARGET_QUEUE_DEPTH", "8")
    assert autoscaling_defaults() == {"windowSeconds": 20.0, "targetQueueDepth": 8.0}
    monkeypatch.setenv("KVPILOT_AUTOSCALING_SCALE_DOWN_DELAY_SECONDS", "soon")
    with pytest.raises(ValueError, match="SCALE_DOWN_DELAY"):
        autoscaling_defaults()


def test_cluster_mode_builds_an_app(monkeypatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "kvpilot-system")
    args = parse_args(["--kubernetes", "--kube-api-url", "http://127.0.0.1:1", "--namespace", "ml"])
    assert args.lease_namespace == "kvpilot-system" and args.namespace == "ml"
    app = build_app(args, build_config(args))
    assert {route.path for route in app.routes} >= {"/v1/chat/completions", "/v1/completions", "/metrics"}
