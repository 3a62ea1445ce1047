"""InferenceService spec as validated input: mirrors the CRD's openAPIV3Schema and its CEL rules.

The API server enforces the schema in a cluster; this model enforces the same rules where there is no
API server (`kvpilot plan -f`) and guards the operator against objects that predate a schema change.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

URI_PATTERN = (
    r"^(hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*"
    r"|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[^\s]*)?"
    r"|s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?)$"
)
Quantization = Literal["auto", "none", "fp8", "int8", "int4", "awq", "gptq"]
KvCacheDtype = Literal["auto", "bf16", "fp16", "fp8", "int8"]
MAX_PARALLEL = 64
CONFIG_REQUIRED = "spec.model.config (the model's config.json) is required for pvc:// and s3:// sources"


class SpecError(ValueError):
    """The spec breaks a schema rule; the message names the field."""


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, strict=True
    )


class ModelSource(_Model):
    uri: str = Field(pattern=URI_PATTERN, max_length=512)
    revision: str = Field("main", pattern=r"^[A-Za-z0-9._/-]+$", max_length=128)
    served_name: str | None = Field(None, min_length=1, max_length=256)
    config: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _config_where_unreadable(self) -> ModelSource:
        # CEL: self.uri.startsWith('hf://') || has(self.config)
        if not self.uri.startswith("hf://") and self.config is None:
            raise ValueError(CONFIG_REQUIRED)
        return self

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0]

    @property
    def location(self) -> str:
        """Everything after the scheme: org/repo, claim/path or bucket/prefix."""
        return self.uri.split("://", 1)[1]


class GpuRequest(_Model):
    profile: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=63)
    count: int | None = Field(None, ge=1, le=256)


class Workload(_Model):
    max_model_len: int | None = Field(None, ge=16, le=1_048_576)
    concurrency: int | None = Field(None, ge=1, le=4096)
    avg_context_len: int | None = Field(None, ge=1, le=1_048_576)

    @model_validator(mode="after")
    def _avg_within_max(self) -> Workload:
        if self.avg_context_len and self.max_model_len and self.avg_context_len > self.max_model_len:
            raise ValueError("workload.avgContextLen must not exceed workload.maxModelLen")
        return self


def _auto_or_degree(value: Any) -> int | str:
    # CEL: type(self) == string ? self == 'auto' : (self >= 1 && self <= 64)
    if value == "auto" or (type(value) is int and 1 <= value <= MAX_PARALLEL):
        return value
    raise ValueError(f"must be 'auto' or an integer from 1 to {MAX_PARALLEL}, got {value!r}")


Degree = Annotated[int | str, BeforeValidator(_auto_or_degree)]


class Parallelism(_Model):
    tensor: Degree = "auto"
    pipeline: Degree = "auto"


class Autoscaling(_Model):
    min_replicas: int = Field(1, ge=0, le=1000)
    max_replicas: int = Field(4, ge=1, le=1000)
    target_queue_depth: float = Field(4.0, gt=0)
    scale_down_delay_seconds: int = Field(300, ge=0, le=86400)

    @model_validator(mode="after")
    def _min_le_max(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError("autoscaling.minReplicas must not exceed autoscaling.maxReplicas")
        return self


class RuntimeOverrides(_Model):
    image: str | None = Field(None, min_length=1, max_length=512)
    args: list[str] = Field(default_factory=list, max_length=64)
    env: list[dict[str, Any]] = Field(default_factory=list, max_length=128)
    resources: dict[str, Any] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _env_named(cls, env: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for item in env:
            if not isinstance(item.get("name"), str) or not item["name"]:
                raise ValueError("every runtime.env entry needs a name")
        return env


class Speculative(_Model):
    """Speculative decoding, passed to the runtime as --speculative-config (vLLM's JSON)."""

    method: Literal["ngram", "draftModel"]
    num_speculative_tokens: int = Field(4, ge=1, le=16)
    prompt_lookup_max: int = Field(4, ge=1, le=16)
    prompt_lookup_min: int = Field(1, ge=1, le=16)
    draft_model: ModelSource | None = None

    @model_validator(mode="after")
    def _method_fields(self) -> Speculative:
        # CEL: self.method == 'draftModel' ? has(self.draftModel) : !has(self.draftModel)
        if (self.method == "draftModel") != (self.draft_model is not None):
            raise ValueError("speculative.draftModel is required for method draftModel and only for it")
        # CEL: self.promptLookupMin <= self.promptLookupMax
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("speculative.promptLookupMin must not exceed speculative.promptLookupMax")
        return self

    def runtime_config(self, draft_dir: str | None) -> str:
        """The runtime's --speculative-config JSON (the draft model at `draft_dir` in the pod)."""
        if self.method == "draftModel":
            return json.dumps({"model": draft_dir, "num_speculative_tokens": self.num_speculative_tokens})
        return json.dumps(
            {
                "method": "ngram",
                "num_speculative_tokens": self.num_speculative_tokens,
                "prompt_lookup_max": self.prompt_lookup_max,
                "prompt_lookup_min": self.prompt_lookup_min,
            }
        )


class InferenceServiceSpec(_Model):
    model: ModelSource
    gpu: GpuRequest
    workload: Workload = Field(default_factory=Workload)
    quantization: Quantization = "auto"
    kv_cache_dtype: KvCacheDtype = "auto"
    parallelism: Parallelism = Field(default_factory=Parallelism)
    replicas: int = Field(1, ge=0, le=1000)
    autoscaling: Autoscaling | None = None
    runtime: RuntimeOverrides = Field(default_factory=RuntimeOverrides)
    speculative: Speculative | None = None

    @model_validator(mode="after")
    def _replicas_within_autoscaling(self) -> InferenceServiceSpec:
        if self.autoscaling is not None and self.replicas > self.autoscaling.max_replicas:
            raise ValueError("spec.replicas must not exceed spec.autoscaling.maxReplicas")
        return self


def parse_spec(spec: Any) -> InferenceServiceSpec:
    """Validate a raw spec mapping; SpecError carries every problem, each with its field path."""
    if not isinstance(spec, dict):
        raise SpecError("spec: must be an object")
    try:
        return InferenceServiceSpec.model_validate(spec)
    except ValidationError as exc:
        raise SpecError(describe(exc)) from None


def describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in ("spec", *error["loc"]) if not str(p).startswith("function-after"))
        message = error["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}")
    return "; ".join(parts)
