"""Built-in GPU catalog and admin profiles from the ConfigMap."""

from __future__ import annotations

import pytest
from kvpilot.operator.planning.profiles import ProfileError, ProfileStore, builtin_profiles, parse_profiles

BUILTINS = {"a10g", "l4", "l40s", "a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "rtx3090", "rtx4090"}
ADMIN = """
- name: h100-80gb
  memoryGiB: 79.65
  bandwidthGBps: 3350
  bf16Tflops: 989
  fp8: true
  interconnect: nvlink
  gpusPerNode: 8
  nodeSelector: {cloud.google.com/gke-accelerator: nvidia-h100-80gb}
  tolerations: []
  runtimeImage: registry.example.com/kvpilot/runtime:0.1.0-cu128
- name: mi-lab-4090
  memoryGiB: 24
  bandwidthGBps: 1008
  bf16Tflops: 165
  fp8: true
  gpusPerNode: 2
"""


def test_builtin_catalog() -> None:
    profiles = builtin_profiles()
    assert set(profiles) == BUILTINS
    assert {n for n, p in profiles.items() if p.fp8} == {"l4", "l40s", "h100-80gb", "h200-141gb", "rtx4090"}
    assert {n for n, p in profiles.items() if p.interconnect == "nvlink"} == {
        "a100-40gb",
        "a100-80gb",
        "h100-80gb",
        "h200-141gb",
    }
    for profile in profiles.values():
        assert profile.node_selector["nvidia.com/gpu.product"].startswith("NVIDIA-")
        assert profile.tolerations == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
        assert profile.runtime_image is None
    assert profiles["h200-141gb"].memory_bytes > profiles["h100-80gb"].memory_bytes
    assert round(profiles["h100-80gb"].ridge_tokens) == 295


def test_admin_profiles_override_and_add() -> None:
    store = ProfileStore()
    changed = store.load_configmap(
        {"metadata": {"name": "kvpilot-gpu-profiles"}, "data": {"profiles.yaml": ADMIN}}
    )
    assert changed == {"h100-80gb", "mi-lab-4090"}
    h100 = store.get("h100-80gb")
    assert h100 is not None and h100.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert h100.tolerations == [] and h100.runtime_image.endswith("cu128")  # type: ignore[union-attr]
    lab = store.get("mi-lab-4090")
    assert lab is not None and lab.interconnect == "pcie" and lab.gpus_per_node == 2
    assert store.get("l4") == builtin_profiles()["l4"]


def test_removing_admin_profiles_restores_builtins() -> None:
    store = ProfileStore()
    store.load_configmap({"data": {"profiles.yaml": ADMIN}})
    assert store.load_configmap(None) == {"h100-80gb", "mi-lab-4090"}
    assert store.get("mi-lab-4090") is None
    assert store.get("h100-80gb") == builtin_profiles()["h100-80gb"]
    assert store.load_configmap({"data": {"profiles.yaml": "[]"}}) == set()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x", "must be a YAML list"),
        (
            "- {name: x, memoryGiB: 24, bandwidthGBps: 1, bf16Tflops: 1, interconnect: infiniband}",
            "profiles.yaml[0]: interconnect",
        ),
        ("- {name: x, bandwidthGBps: 1, bf16Tflops: 1}", "profiles.yaml[0]: memoryGiB: Field required"),
        ("- {name: X_Y, memoryGiB: 1, bandwidthGBps: 1, bf16Tflops: 1}", "profiles.yaml[0]: name"),
        (
            "- {name: x, memoryGiB: 1, bandwidthGBps: 1, bf16Tflops: 1}\n"
            "- {name: x, memoryGiB: 2, bandwidthGBps: 1, bf16Tflops: 1}",
            "profile names repeat: x",
        ),
        ("- [unclosed", "not valid YAML"),
    ],
)
def test_bad_admin_profiles_are_refused_whole(text: str, message: str) -> None:
    store = ProfileStore()
    with pytest.raises(ProfileError) as caught:
        store.load_configmap({"data": {"profiles.yaml": text}})
    assert message in str(caught.value)
    assert store.names() == sorted(BUILTINS)


def test_empty_text_is_no_profiles() -> None:
    assert parse_profiles("", "x") == [] and parse_profiles("# nothing\n", "x") == []
