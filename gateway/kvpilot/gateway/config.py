"""Gateway configuration: a pydantic model, loadable from YAML/JSON or built from flags.

Example (YAML)::

    pools:
      qwen3-8b:
        policy: prefix-aware          # prefix-aware | least-load | round-robin
        endpoints: [http://10.0.0.5:8000, http://10.0.0.6:8000]
        autoscaling: {minReplicas: 0, maxReplicas: 4, targetQueueDepth: 4, scaleDownDelaySeconds: 300}
    limits: {maxQueued: 256, holdTimeoutSeconds: 120}
    apiKeysFile: /etc/kvpilot/api-keys     # optional; one key per line; off when absent
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class PolicyName(StrEnum):
    PREFIX_AWARE = "prefix-aware"
    LEAST_LOAD = "least-load"
    ROUND_ROBIN = "round-robin"


class AutoscalingSpec(_Model):
    """Same field names as the InferenceService's `spec.autoscaling`."""

    min_replicas: int = Field(0, ge=0, alias="minReplicas")
    max_replicas: int = Field(1, ge=0, alias="maxReplicas")
    target_queue_depth: float = Field(4.0, gt=0, alias="targetQueueDepth")
    scale_down_delay_seconds: float = Field(300.0, ge=0, alias="scaleDownDelaySeconds")
    window_seconds: float = Field(
        10.0, gt=0, alias="windowSeconds", description="moving window averaged for scale-up decisions"
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"maxReplicas ({self.max_replicas}) < minReplicas ({self.min_replicas})")
        return self


class PrefixSettings(_Model):
    block_chars: int = Field(
        64, ge=8, alias="blockChars", description="characters per hashed block (~16 tokens, a runtime block)"
    )
    max_blocks: int = Field(512, ge=1, alias="maxBlocks", description="only the first N blocks are hashed")
    memory_blocks: int = Field(
        65536, ge=1, alias="memoryBlocks", description="block hashes remembered per replica (LRU)"
    )
    load_factor: float = Field(1.25, ge=1.0, alias="loadFactor")
    load_slack: float = Field(1.0, ge=0.0, alias="loadSlack")


class KubeTarget(_Model):
    """The InferenceService a pool belongs to (cluster mode): the autoscaler writes its /scale."""

    namespace: str
    name: str


class PoolConfig(_Model):
    policy: PolicyName = PolicyName.PREFIX_AWARE
    endpoints: tuple[str, ...] = ()
    autoscaling: AutoscalingSpec | None = None
    max_inflight_per_replica: int | None = Field(None, ge=1, alias="maxInflightPerReplica")
    inference_service: KubeTarget | None = Field(None, alias="inferenceService")

    @field_validator("endpoints")
    @classmethod
    def _urls(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(normalize_url(url) for url in urls)


def normalize_url(url: str) -> str:
    """`http://host:port` without a trailing slash; anything else is a clear error."""
    if not re.fullmatch(r"https?://[^/\s]+/?", url):
        raise ValueError(f"endpoint must look like http://host:port, got {url!r}")
    return url.rstrip("/")


class Limits(_Model):
    max_queued: int = Field(
        256, ge=0, alias="maxQueued", description="requests waiting in the gateway per pool; beyond it 429"
    )
    hold_timeout_seconds: float = Field(
        120.0,
        gt=0,
        alias="holdTimeoutSeconds",
        description="wait for a ready replica (scale from zero), then 503",
    )
    queue_timeout_seconds: float = Field(
        30.0, gt=0, alias="queueTimeoutSeconds", description="wait for a free replica slot, then 429"
    )
    retry_after_seconds: int = Field(5, ge=1, alias="retryAfterSeconds")
    max_attempts: int = Field(3, ge=1, alias="maxAttempts", description="replicas tried before 1st byte")
    max_request_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1,
        alias="maxRequestBytes",
        description="413 for a larger request body (checked before it is parsed)",
    )


class Timeouts(_Model):
    connect_seconds: float = Field(5.0, gt=0, alias="connectSeconds")
    read_seconds: float = Field(600.0, gt=0, alias="readSeconds", description="max gap between bytes")
    write_seconds: float = Field(30.0, gt=0, alias="writeSeconds")
    first_byte_seconds: float = Field(
        120.0,
        gt=0,
        alias="firstByteSeconds",
        description="a streaming attempt that sends no byte by then is retried on another replica",
    )
    stalled_seconds: float = Field(
        5.0,
        gt=0,
        alias="stalledSeconds",
        description="once a replica fails its health checks, a silent gap this long ends its requests",
    )
    request_body_seconds: float = Field(
        30.0, gt=0, alias="requestBodySeconds", description="408 when a client's body takes longer"
    )
    request_head_seconds: float = Field(
        30.0, gt=0, alias="requestHeadSeconds", description="close a connection whose request head is late"
    )


class HealthSettings(_Model):
    interval_seconds: float = Field(2.0, gt=0, alias="intervalSeconds")
    timeout_seconds: float = Field(2.0, gt=0, alias="timeoutSeconds")
    unhealthy_threshold: int = Field(2, ge=1, alias="unhealthyThreshold")
    healthy_threshold: int = Field(1, ge=1, alias="healthyThreshold")


class AutoscalerSettings(_Model):
    interval_seconds: float = Field(1.0, gt=0, alias="intervalSeconds")
    count_running: bool = Field(
        True, alias="countRunning", description="queue depth includes running requests, not only waiting ones"
    )


class GatewayConfig(_Model):
    pools: dict[str, PoolConfig] = Field(default_factory=dict)
    default_pool: PoolConfig = Field(
        default_factory=PoolConfig,
        alias="defaultPool",
        description="settings for pools found by discovery but not listed",
    )
    prefix: PrefixSettings = Field(default_factory=PrefixSettings)
    limits: Limits = Field(default_factory=Limits)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    health: HealthSettings = Field(default_factory=HealthSettings)
    autoscaler: AutoscalerSettings = Field(default_factory=AutoscalerSettings)
    api_keys_file: Path | None = Field(None, alias="apiKeysFile")


def load_config(path: Path) -> GatewayConfig:
    """Read a YAML or JSON config file; pydantic raises a ValidationError that names the bad field."""
    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    return GatewayConfig.model_validate(data or {})
