"""--speculative-config: vLLM's JSON, parsed and checked into one frozen dataclass (torch-free).

  {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
  {"model": "/models/draft", "num_speculative_tokens": 4}            (method "draft_model" implied)
  {"method": "replay" | "wrong", "num_speculative_tokens": 4}        (benchmarks only: see oracle.py)

Unknown keys are refused (a typo must not silently turn speculation off), as are unknown methods and
num_speculative_tokens < 1. Back-off knobs (policy.py) may be given too; their defaults suit most runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

NGRAM, DRAFT_MODEL, REPLAY, WRONG = "ngram", "draft_model", "replay", "wrong"
METHODS = (NGRAM, DRAFT_MODEL, REPLAY, WRONG)
_METHOD_ALIASES = {"draft": DRAFT_MODEL, "eagle_draft": DRAFT_MODEL}


class SpeculativeConfigError(ValueError):
    """--speculative-config is not valid JSON or names something this runtime cannot do."""


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    model: str | None = None  # the draft model directory (method draft_model)
    prompt_lookup_max: int = 4  # longest n-gram matched (method ngram)
    prompt_lookup_min: int = 1  # shortest n-gram matched
    # back-off (policy.py): no speculation at or above this many running decodes ...
    max_batch_size: int = 64
    # ... nor while the smoothed acceptance rate is below this (re-probed every backoff_probe_interval steps)
    min_acceptance_rate: float = 0.2
    backoff_probe_interval: int = 16  # the fewest steps between probes (policy.py spaces them by cost)
    backoff: bool = True  # false: always speculate num_speculative_tokens (to measure "before back-off")
    verify_cost_ratio: float = 1.5  # verify step / decode step until the engine has measured it
    # false: keep verify_cost_ratio, measure nothing: which steps speculate then depends on the tokens
    # only, so seeded sampled requests repeat exactly run to run (measured costs vary with the timing)
    measure_costs: bool = True
    probe_overhead: float = 0.01  # the share of the time probes may waste while backed off

    @classmethod
    def from_json(cls, text: str) -> SpeculativeConfig:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise SpeculativeConfigError(f"--speculative-config is not valid JSON: {err}") from None
        if not isinstance(raw, dict):
            raise SpeculativeConfigError("--speculative-config must be a JSON object")
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SpeculativeConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise SpeculativeConfigError(
                f"--speculative-config: unknown key(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        values = dict(raw)
        method = values.get("method")
        if method is None:
            method = DRAFT_MODEL if values.get("model") else None
        method = _METHOD_ALIASES.get(method, method) if isinstance(method, str) else method
        if method not in METHODS:
            raise SpeculativeConfigError(
                f"--speculative-config: method {values.get('method')!r} is not one of {', '.join(METHODS)} "
                '(or give "model" for a draft model)'
            )
        values["method"] = method
        if "num_speculative_tokens" not in values:
            raise SpeculativeConfigError("--speculative-config: num_speculative_tokens is required")
        config = cls(**values)
        problems = config.problems()
        if problems:
            raise SpeculativeConfigError("--speculative-config: " + "; ".join(problems))
        return config

    def problems(self) -> list[str]:
        found = []
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                found.append(f"{name} must be an integer >= 1, got {value!r}")
        if not found and self.prompt_lookup_min > self.prompt_lookup_max:
            found.append(
                f"prompt_lookup_min ({self.prompt_lookup_min}) exceeds prompt_lookup_max "
                f"({self.prompt_lookup_max})"
            )
        if self.method == DRAFT_MODEL and not (isinstance(self.model, str) and self.model):
            found.append('a draft model needs "model": the draft checkpoint\'s directory')
        if self.method != DRAFT_MODEL and self.model is not None:
            found.append(f'"model" is only for a draft model, not method {self.method!r}')
        if isinstance(self.max_batch_size, bool) or not isinstance(self.max_batch_size, int):
            found.append(f"max_batch_size must be an integer, got {self.max_batch_size!r}")
        if not isinstance(self.min_acceptance_rate, (int, float)) or not 0 <= self.min_acceptance_rate < 1:
            found.append(f"min_acceptance_rate must be in [0, 1), got {self.min_acceptance_rate!r}")
        interval = self.backoff_probe_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            found.append(f"backoff_probe_interval must be an integer >= 1, got {interval!r}")
        for name in ("backoff", "measure_costs"):
            if not isinstance(getattr(self, name), bool):
                found.append(f"{name} must be true or false, got {getattr(self, name)!r}")
        ratio = self.verify_cost_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio >= 1:
            found.append(f"verify_cost_ratio must be a number >= 1, got {ratio!r}")
        overhead = self.probe_overhead
        if isinstance(overhead, bool) or not isinstance(overhead, (int, float)) or not 0 < overhead < 1:
            found.append(f"probe_overhead must be in (0, 1), got {overhead!r}")
        return found

    def to_json(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)}, sort_keys=True)
