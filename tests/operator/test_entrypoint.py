"""The kvpilot-operator command line and the kopf settings it runs with."""

from __future__ import annotations

import kopf
import pytest
from kvpilot.operator.__main__ import parse_args
from kvpilot.operator.handlers import plain, settings


def test_flags() -> None:
    config = parse_args(["--namespace", "ml", "--profiles-configmap", "gpus", "--profiles-namespace", "sys"])
    assert (config.namespaces, config.profiles_configmap, config.profiles_ns) == (("ml",), "gpus", "sys")
    everywhere = parse_args(["--all-namespaces"])
    assert everywhere.namespaces == () and everywhere.profiles_configmap == "kvpilot-gpu-profiles"
    with pytest.raises(SystemExit):
        parse_args(["--namespace", "ml", "--all-namespaces"])


def test_profiles_namespace_defaults_to_the_pod_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "kvpilot-system")
    assert parse_args(["--namespace", "ml"]).profiles_ns == "kvpilot-system"


def test_settings_stay_within_the_charts_rbac() -> None:
    s = settings()
    assert s.scanning.disabled  # no CRD or namespace listing
    assert isinstance(s.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert isinstance(s.persistence.diffbase_storage, kopf.AnnotationsDiffBaseStorage)


def test_plain_copies_read_only_views() -> None:
    body = kopf.Body({"spec": {"a": [1, {"b": 2}]}, "metadata": {"name": "x"}})
    assert plain(body) == {"spec": {"a": [1, {"b": 2}]}, "metadata": {"name": "x"}}
    assert type(plain(body)["spec"]) is dict
