"""Perplexity of a model over a fixed text, computed from the engine's own prompt logprobs.

The text (eval_text.txt by default) is tokenized once without special tokens and cut into consecutive
windows of `window` tokens (the last one shorter). Every window is one engine request with
prompt_logprobs=0 and max_tokens=1, so each token after a window's first is scored given the window
before it; the perplexity is exp(mean negative log-likelihood) over all scored tokens. All windows go to
the engine at once and are batched and chunked like any other requests (prefix caching never applies:
requests that ask for prompt logprobs take no cache hits).

The same windows scored by Hugging Face transformers (`transformers_perplexity`, float32 on CPU) are the
reference the tests hold the engine to.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

EVAL_TEXT = Path(__file__).with_name("eval_text.txt")
DEFAULT_WINDOW = 1024


@dataclass(frozen=True)
class EngineConfig:
    """One row of the table: the engine settings that change quality."""

    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    quantization: str = "none"

    @classmethod
    def parse(cls, spec: str) -> EngineConfig:
        """'dtype=bfloat16,kv_cache_dtype=fp8' (keys: dtype, kv_cache_dtype or kv, quantization)."""
        fields: dict[str, str] = {}
        aliases = {"kv": "kv_cache_dtype", "kv_cache": "kv_cache_dtype", "quant": "quantization"}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, value = part.partition("=")
            key = aliases.get(key.strip(), key.strip())
            if not sep or key not in ("dtype", "kv_cache_dtype", "quantization") or not value.strip():
                raise ValueError(
                    f"bad engine configuration {spec!r}: use e.g. dtype=bfloat16,kv_cache_dtype=fp8"
                )
            fields[key] = value.strip()
        return cls(**fields)

    def engine_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {"dtype": self.dtype, "kv_cache_dtype": self.kv_cache_dtype}
        if self.quantization not in ("none", ""):
            args["quantization"] = self.quantization
        return args


@dataclass
class PerplexityResult:
    engine: str  # "kvpilot" or "transformers"
    config: EngineConfig
    device: str
    perplexity: float | None
    nll_per_token: float | None
    num_scored_tokens: int
    seconds: float
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["config"] = asdict(self.config)
        return out


def load_text(path: str | Path | None = None) -> tuple[str, str]:
    """(text, sha256 of its bytes)."""
    data = Path(path or EVAL_TEXT).read_bytes()
    return data.decode("utf-8"), hashlib.sha256(data).hexdigest()


def windows(token_ids: list[int], window: int) -> list[list[int]]:
    """Consecutive windows of `window` tokens; a last window of a single token (nothing to score) is
    dropped."""
    if window < 2:
        raise ValueError(f"window must be at least 2 tokens, got {window}")
    parts = [token_ids[i : i + window] for i in range(0, len(token_ids), window)]
    return [p for p in parts if len(p) >= 2]


def _from_nll(total_nll: float, count: int) -> tuple[float, float]:
    mean = total_nll / count
    return math.exp(mean), mean


def engine_perplexity(
    model: str,
    parts: list[list[int]],
    config: EngineConfig,
    *,
    device: str = "auto",
    **engine_args: Any,
) -> PerplexityResult:
    """Score the windows with the kvpilot engine (offline LLM API) under `config`."""
    from kvpilot.runtime.llm import LLM
    from kvpilot.runtime.sampling_params import SamplingParams

    window = max(len(p) for p in parts)
    started = time.perf_counter()
    kwargs: dict[str, Any] = {
        "device": device,
        "max_model_len": window + 1,
        "max_num_batched_tokens": max(window, 512),
        "max_num_seqs": 8,
        **config.engine_args(),
        **engine_args,
    }
    try:
        llm = LLM(model, **kwargs)
    except Exception as exc:  # an unsupported configuration is a row with an error, not a crash
        return PerplexityResult("kvpilot", config, device, None, None, 0, 0.0, f"{type(exc).__name__}: {exc}")
    loaded = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
    outs = llm.generate(parts, params)
    total, count = 0.0, 0
    for out in outs:
        if out.error or out.prompt_logprobs is None:
            return PerplexityResult("kvpilot", config, device, None, None, 0, 0.0, out.error or "no logprobs")
        for entry in out.prompt_logprobs[1:]:
            if entry is None:  # only the first prompt token has no logprob
                return PerplexityResult(
                    "kvpilot", config, device, None, None, 0, 0.0, "a prompt logprob is missing"
                )
            total -= entry.logprob
            count += 1
    ppl, nll = _from_nll(total, count)
    runner = llm.engine.runner
    return PerplexityResult(
        "kvpilot",
        config,
        str(getattr(runner, "device", device)),
        ppl,
        nll,
        count,
        time.perf_counter() - loaded,
        extra={
            "load_seconds": loaded - started,
            "dtype": str(getattr(runner, "dtype", "")).removeprefix("torch."),
            "kv_cache_dtype": str(getattr(runner, "kv_cache_dtype", "")).removeprefix("torch."),
        },
    )


def transformers_perplexity(model_dir: str | Path, parts: list[list[int]]) -> PerplexityResult:
    """The same windows scored by Hugging Face transformers (float32, CPU): the reference."""
    import torch
    from kvpilot.runtime.gguf_model import resolve_model_dir
    from transformers import AutoModelForCausalLM

    config = EngineConfig(dtype="float32")
    started = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(resolve_model_dir(model_dir), dtype=torch.float32).eval()
    loaded = time.perf_counter()
    total, count = 0.0, 0
    with torch.inference_mode():
        for part in parts:
            ids = torch.tensor([part])
            logprobs = torch.log_softmax(hf(ids).logits[0, :-1].float(), dim=-1)
            total -= float(logprobs.gather(1, ids[0, 1:, None]).sum())
            count += len(part) - 1
    ppl, nll = _from_nll(total, count)
    return PerplexityResult(
        "transformers",
        config,
        "cpu",
        ppl,
        nll,
        count,
        time.perf_counter() - loaded,
        extra={"load_seconds": loaded - started, "dtype": "float32", "kv_cache_dtype": "-"},
    )
