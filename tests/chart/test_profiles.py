"""The GPU profiles the chart hands the operator parse with the operator's own profile parser, including
the commented examples in values.yaml (what administrators copy)."""

from __future__ import annotations

import re

import yaml
from kvpilot.operator.planning.profiles import PROFILES_KEY, builtin_profiles, parse_profiles


def commented_examples(values_text: str) -> list[dict]:
    """The `# Examples:` block under gpuProfiles, uncommented."""
    block = values_text.split("  # Examples:\n", 1)[1]
    lines = []
    for line in block.splitlines():
        if not line.startswith("  #"):
            break
        lines.append(re.sub(r"^  # ?", "", line))
    return yaml.safe_load("\n".join(lines))


def test_rendered_profiles_parse_in_the_operator(everything_manifests, everything_values) -> None:
    configmap = everything_manifests.get("ConfigMap", "kvpilot-gpu-profiles")
    assert PROFILES_KEY in configmap["data"]
    profiles = parse_profiles(configmap["data"][PROFILES_KEY], "chart")
    assert [p.name for p in profiles] == [p["name"] for p in everything_values["gpuProfiles"]["profiles"]]
    assert profiles[0].node_selector == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}


def test_default_profiles_parse_as_empty(default_manifests) -> None:
    configmap = default_manifests.get("ConfigMap", "kvpilot-gpu-profiles")
    assert parse_profiles(configmap["data"][PROFILES_KEY], "chart") == []


def test_commented_examples_are_valid(chart_dir, render) -> None:
    examples = commented_examples((chart_dir / "values.yaml").read_text())
    assert len(examples) == 3
    manifests = render({"gpuProfiles": {"profiles": examples}})  # the chart's schema accepts them
    text = manifests.get("ConfigMap", "kvpilot-gpu-profiles")["data"][PROFILES_KEY]
    parsed = {p.name: p for p in parse_profiles(text, "values.yaml examples")}
    assert set(parsed) == {e["name"] for e in examples}
    builtins = builtin_profiles()
    overridden = set(parsed) & set(builtins)
    assert overridden == {"h200-141gb"}
    assert parsed["h200-141gb"].runtime_image == "ghcr.io/kvpilot/runtime:0.1.0"
