"""Quality harness: perplexity of a model over a fixed text, per engine configuration.

    python -m kvpilot.runtime.eval                      # SmolLM2-135M-Instruct, the default configurations
    python -m kvpilot.runtime.eval --reference --json out.json
    python -m kvpilot.runtime.eval --model DIR|FILE.gguf --config dtype=bfloat16 --config dtype=bf16,kv=fp8

See perplexity.py for the method; eval_text.txt is the fixed text (written for kvpilot, CC0-1.0).
"""

from kvpilot.runtime.eval.perplexity import (
    DEFAULT_WINDOW,
    EVAL_TEXT,
    EngineConfig,
    PerplexityResult,
    engine_perplexity,
    load_text,
    transformers_perplexity,
    windows,
)

__all__ = [
    "DEFAULT_WINDOW",
    "EVAL_TEXT",
    "EngineConfig",
    "PerplexityResult",
    "engine_perplexity",
    "load_text",
    "transformers_perplexity",
    "windows",
]
