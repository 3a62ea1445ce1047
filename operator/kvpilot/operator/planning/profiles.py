"""GPU profiles: the built-in catalog (gpu_catalog.yaml) merged with the administrator's ConfigMap."""

from __future__ import annotations

from importlib import resources
from typing import Any, Literal

import yaml
from kvpilot.operator.spec import describe
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

GIB = 1024**3
PROFILES_KEY = "profiles.yaml"
DEFAULT_TOLERATIONS = ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)


class ProfileError(ValueError):
    """An admin profile list that can't be used; the previous profiles stay in force."""


class GpuProfile(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=63)
    memory_gi_b: float = Field(gt=0, alias="memoryGiB")
    bandwidth_g_bps: float = Field(gt=0, alias="bandwidthGBps")
    bf16_tflops: float = Field(gt=0)
    fp8: bool = False
    interconnect: Literal["nvlink", "pcie"] = "pcie"
    gpus_per_node: int = Field(8, ge=1, le=64)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=lambda: [dict(t) for t in DEFAULT_TOLERATIONS])
    runtime_image: str | None = None

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gi_b * GIB)

    @property
    def ridge_tokens(self) -> float:
        """Tokens per weight read at which a 16-bit matmul turns compute-bound (FLOPs per byte / 1)."""
        return self.bf16_tflops * 1e12 / (self.bandwidth_g_bps * 1e9)


def parse_profiles(text: str, source: str) -> list[GpuProfile]:
    """A YAML list of profiles; ProfileError says which entry and field is wrong."""
    try:
        items = yaml.safe_load(text) if text.strip() else []
    except yaml.YAMLError as exc:
        raise ProfileError(f"{source}: not valid YAML: {exc}") from None
    if items is None:
        return []
    if not isinstance(items, list):
        raise ProfileError(f"{source}: must be a YAML list of GPU profiles")
    profiles: list[GpuProfile] = []
    for index, item in enumerate(items):
        try:
            profiles.append(GpuProfile.model_validate(item))
        except ValidationError as exc:
            raise ProfileError(f"{source}[{index}]: {describe(exc).replace('spec.', '', 1)}") from None
    names = [p.name for p in profiles]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ProfileError(f"{source}: profile names repeat: {', '.join(duplicates)}")
    return profiles


def builtin_profiles() -> dict[str, GpuProfile]:
    text = resources.files("kvpilot.operator.planning").joinpath("gpu_catalog.yaml").read_text()
    return {p.name: p for p in parse_profiles(text, "gpu_catalog.yaml")}


def merge_profiles(builtins: dict[str, GpuProfile], admin: list[GpuProfile]) -> dict[str, GpuProfile]:
    """Admin entries add to the built-ins; an admin entry with a built-in's name replaces it."""
    return {**builtins, **{p.name: p for p in admin}}


class ProfileStore:
    """The profiles in force: built-ins plus the latest valid admin ConfigMap. Owned by the operator run."""

    def __init__(self, builtins: dict[str, GpuProfile] | None = None) -> None:
        self._builtins = builtins if builtins is not None else builtin_profiles()
        self._profiles = dict(self._builtins)

    def get(self, name: str) -> GpuProfile | None:
        return self._profiles.get(name)

    def names(self) -> list[str]:
        return sorted(self._profiles)

    def load_configmap(self, configmap: dict[str, Any] | None) -> set[str]:
        """Replace the admin profiles with the ConfigMap's (None: none); returns the names that changed."""
        text = ((configmap or {}).get("data") or {}).get(PROFILES_KEY, "")
        name = ((configmap or {}).get("metadata") or {}).get("name", "configmap")
        return self.load_admin(parse_profiles(text, f"{name}/{PROFILES_KEY}"))

    def load_admin(self, admin: list[GpuProfile]) -> set[str]:
        """Replace the admin profiles; returns the names whose profile changed (added, edited, removed)."""
        merged = merge_profiles(self._builtins, admin)
        changed = {n for n in set(merged) | set(self._profiles) if merged.get(n) != self._profiles.get(n)}
        self._profiles = merged
        return changed
