"""`python -m kvpilot.runtime.eval`: one table row per engine configuration, optionally JSON.

The table's last column compares each row's perplexity with the first row (with --reference: with
transformers' float32 perplexity on the same windows). Exit status 1 if a row failed or, with
--max-delta, if a row's perplexity differs from the baseline by more than that fraction: later issues
use it as their quality gate (e.g. --config dtype=bfloat16 --config dtype=bfloat16,kv=fp8 --max-delta 0.02).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kvpilot.runtime.eval",
        description="Perplexity over a fixed text per engine configuration.",
    )
    p.add_argument("--model", help="model directory or .gguf (default: the built-in SmolLM2-135M-Instruct)")
    p.add_argument(
        "--text", type=Path, default=EVAL_TEXT, help="UTF-8 text to score (default: the shipped one)"
    )
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="tokens per scored window")
    p.add_argument(
        "--config",
        action="append",
        metavar="SPEC",
        help="engine configuration, repeatable: dtype=...,kv_cache_dtype=...,quantization=... "
        "(default: float32 and bfloat16 on CPU; bfloat16 and bfloat16 with an fp8 KV cache on CUDA)",
    )
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--reference", action="store_true", help="also score with transformers (float32, CPU)")
    p.add_argument("--max-delta", type=float, help="fail when a row's perplexity is off the baseline by more")
    p.add_argument(
        "--json", type=Path, help="write the results here as JSON ('-': stdout instead of the table)"
    )
    return p


def default_configs(device: str) -> list[EngineConfig]:
    import torch

    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return [EngineConfig(dtype="bfloat16"), EngineConfig(dtype="bfloat16", kv_cache_dtype="fp8")]
    return [EngineConfig(dtype="float32"), EngineConfig(dtype="bfloat16")]


def table(results: list[PerplexityResult], baseline: PerplexityResult | None) -> str:
    header = ("engine", "dtype", "quantization", "kv cache", "device", "tokens", "perplexity", "vs base", "s")
    rows = [header]
    for r in results:
        delta = ""
        if r.perplexity is not None and baseline is not None and baseline.perplexity and r is not baseline:
            delta = f"{(r.perplexity / baseline.perplexity - 1) * 100:+.3f}%"
        elif r is baseline:
            delta = "base"
        rows.append(
            (
                r.engine,
                r.extra.get("dtype") or r.config.dtype,
                r.config.quantization,
                r.extra.get("kv_cache_dtype") or r.config.kv_cache_dtype,
                r.device,
                str(r.num_scored_tokens),
                f"{r.perplexity:.4f}" if r.perplexity is not None else "error (below)",
                delta,
                f"{r.seconds:.1f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines += [f"error ({r.config}): {r.error}" for r in results if r.error]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        configs = [EngineConfig.parse(spec) for spec in args.config] if args.config else None
    except ValueError as exc:
        parser().error(str(exc))
    if args.model is None:
        from kvpilot.runtime.default_model import smollm2_gguf

        model = str(smollm2_gguf())
    else:
        model = args.model
    from kvpilot.runtime.tokenizer import Tokenizer

    text, digest = load_text(args.text)
    token_ids = Tokenizer.from_dir(model).encode(text, add_special_tokens=False)
    parts = windows(token_ids, args.window)
    results: list[PerplexityResult] = []
    baseline: PerplexityResult | None = None
    if args.reference:
        baseline = transformers_perplexity(model, parts)
        results.append(baseline)
    for config in configs or default_configs(args.device):
        results.append(engine_perplexity(model, parts, config, device=args.device))
    if baseline is None:
        baseline = next((r for r in results if r.perplexity is not None), None)
    report: dict[str, Any] = {
        "model": model,
        "text": {"path": str(args.text), "sha256": digest, "tokens": len(token_ids)},
        "window": args.window,
        "baseline": baseline.engine if baseline else None,
        "results": [r.as_dict() for r in results],
    }
    if args.json is not None and str(args.json) == "-":
        print(json.dumps(report, indent=2))
    else:
        print(f"model: {model}\ntext: {args.text} ({len(token_ids)} tokens, windows of {args.window})")
        print(table(results, baseline))
        if args.json is not None:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
    failed = any(r.perplexity is None for r in results)
    if args.max_delta is not None and baseline is not None and baseline.perplexity:
        failed |= any(
            r.perplexity is not None and abs(r.perplexity / baseline.perplexity - 1) > args.max_delta
            for r in results
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
