"""Layers a pre-quantized checkpoint leaves in 16-bit: compressed-tensors' `ignore`, the
`modules_to_not_convert` / `ignored_layers` of transformers-style AWQ, GPTQ and fp8 configs, and GPTQModel's
`dynamic` keys "-:<regex>" (a "+:<regex>" or bare key overrides bits / group size for the modules it
matches: refused unless it repeats the checkpoint's own values, as one GEMM layout serves every layer).

A pattern is a module name as the checkpoint writes it ("model.layers.0.mlp.down_proj"), a dotted part of
one ("lm_head", "mlp.down_proj", "model.layers.0"), or a regular expression after "re:", matched from the
start of the name (compressed-tensors' convention). The runtime fuses q/k/v and gate/up into one GEMM, so
such a group is 16-bit only when the patterns leave all of its parts 16-bit; a checkpoint that keeps some
of them 16-bit and quantizes the rest is refused at start, naming the layer.
"""

from __future__ import annotations

import re
from typing import Any

from kvpilot.contracts.checkpoint_quant import gptq_dynamic_skips
from kvpilot.runtime.errors import UnsupportedModelError

FIELDS = ("ignore", "modules_to_not_convert", "ignored_layers")


def ignored_patterns(raw: dict[str, Any]) -> tuple[str, ...]:
    """The checkpoint's 16-bit module patterns (its quantization_config), checked to be strings and, after
    "re:", valid regular expressions."""
    patterns: list[str] = []
    for field in FIELDS:
        value = raw.get(field) or []
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise UnsupportedModelError(
                f"config.json quantization_config.{field} must be a list of module names"
            )
        patterns += value
    patterns += _dynamic_skips(raw)
    for pattern in patterns:
        if pattern.startswith("re:"):
            _check_regex(pattern)
    return tuple(patterns)


def _dynamic_skips(raw: dict[str, Any]) -> list[str]:
    """GPTQModel's "-:" keys as "re:" patterns; refuses an override that changes the quantization."""
    try:
        return ["re:" + regex for regex in gptq_dynamic_skips(raw)]
    except ValueError as exc:
        raise UnsupportedModelError(f"config.json {exc}") from exc


def _check_regex(pattern: str) -> None:
    try:
        re.compile(pattern[3:])
    except re.error as exc:
        raise UnsupportedModelError(
            f"config.json quantization_config holds {pattern!r}, not a regular expression: {exc}"
        ) from exc


def is_ignored(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether the checkpoint module `name` is left 16-bit by one of `patterns`."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], name):
                return True
        elif f".{pattern}." in f".{name}.":  # the whole name, or whole dotted parts of it
            return True
    return False


def stays_16bit(module: str, parts: list[str], patterns: tuple[str, ...]) -> bool:
    """Whether our (possibly fused) module, made of the checkpoint modules `parts`, stays 16-bit."""
    ignored = [is_ignored(part, patterns) for part in parts]
    if all(ignored):
        return bool(parts)
    if any(ignored):
        kept = [p for p, i in zip(parts, ignored, strict=True) if i]
        raise UnsupportedModelError(
            f"config.json quantization_config leaves {', '.join(kept)} in 16-bit but quantizes the rest of "
            f"{module}, which kvpilot runs as one fused GEMM; supported: all of {', '.join(parts)} or none"
        )
    return False
