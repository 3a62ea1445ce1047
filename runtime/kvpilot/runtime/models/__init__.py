"""Model families. Each architecture name in config.json maps to one model class."""

from __future__ import annotations

from kvpilot.runtime.config import SUPPORTED_ARCHITECTURES
from kvpilot.runtime.errors import UnsupportedModelError
from kvpilot.runtime.models.llama import LlamaForCausalLM

MODEL_CLASSES: dict[str, type[LlamaForCausalLM]] = dict.fromkeys(SUPPORTED_ARCHITECTURES, LlamaForCausalLM)


def model_class(architecture: str) -> type[LlamaForCausalLM]:
    if architecture not in MODEL_CLASSES:
        raise UnsupportedModelError(
            f"architecture {architecture} is not supported; supported: {', '.join(MODEL_CLASSES)}"
        )
    return MODEL_CLASSES[architecture]
