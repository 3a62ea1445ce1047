"""kvpilot runtime: paged-KV inference engine and OpenAI-compatible server.

`from kvpilot.runtime import LLM, SamplingParams` works; importing the package alone stays light (no
torch): the names below load their modules on first access.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "LLM": "kvpilot.runtime.llm",
    "SamplingParams": "kvpilot.runtime.sampling_params",
    "LLMEngine": "kvpilot.runtime.engine.llm_engine",
    "EngineArgs": "kvpilot.runtime.engine.engine_args",
    "RequestOutput": "kvpilot.runtime.engine.output",
    "CompletionOutput": "kvpilot.runtime.engine.output",
    "EngineStats": "kvpilot.runtime.engine.output",
    "TokenLogprob": "kvpilot.runtime.engine.output",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
