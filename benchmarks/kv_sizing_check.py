"""Sizing truth: the plan's kvCacheTokens against the KV cache the runtime actually allocates.

    source benchmarks/gpu_env.sh && python benchmarks/kv_sizing_check.py --out $OUT/kv_sizing.json

For each weight format (none, fp8, int4 by default) the planner plans Qwen3-8B (or --shape) on one GPU of
--profile with that format pinned; the runtime is then started exactly as the operator's pod would be
(the plan's max_model_len, max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, quantization,
KV dtype; random weights of the real shapes) and its KV-cache tokens compared with the plan's. Target
(issue 12): within 5%. Prints a table at the end.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from kvpilot.operator.planning.model_facts import facts_from_config
from kvpilot.operator.planning.planner import PlanRequest, plan
from kvpilot.operator.planning.profiles import builtin_profiles
from kvpilot.runtime.bench import qwen3_config, write_model_dir


def check(shape: str, profile: str, quantization: str, root: Path) -> dict[str, Any]:
    from kvpilot.runtime.engine.engine_args import EngineArgs
    from kvpilot.runtime.engine.llm_engine import LLMEngine

    facts = facts_from_config(qwen3_config(shape))
    p = plan(
        PlanRequest(facts, builtin_profiles()[profile], quantization=quantization, kv_cache_dtype="bf16")
    )
    if not p.feasible:
        return {"quantization": quantization, "error": p.reason}
    engine = LLMEngine.from_args(
        EngineArgs(
            model=str(write_model_dir(root, shape)),
            max_model_len=p.max_model_len,
            max_num_seqs=p.max_num_seqs,
            max_num_batched_tokens=p.max_num_batched_tokens,
            gpu_memory_utilization=p.gpu_memory_utilization,
            kv_cache_dtype=p.kv_cache_dtype,
            quantization=None if p.quantization == "none" else p.quantization,
            device="cuda",
            dtype="bfloat16",
            load_format="dummy",
        )
    )
    runtime_tokens = engine.runner.num_kv_blocks * engine.runner.block_size
    weights_gib = torch.cuda.memory_allocated() / 2**30
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return {
        "shape": shape,
        "quantization": quantization,
        "plan_kv_cache_tokens": p.kv_cache_tokens,
        "runtime_kv_cache_tokens": runtime_tokens,
        "plan_weight_gib": p.weight_bytes / 2**30,
        "allocated_gib_at_start": weights_gib,
        "plan_vs_runtime": p.kv_cache_tokens / runtime_tokens - 1,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-8b", choices=("qwen3-8b", "qwen3-0.6b"))
    ap.add_argument("--profile", default="h200-141gb")
    ap.add_argument("--quantizations", default="none,fp8,int4")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for q in args.quantizations.split(","):
            rows.append(check(args.shape, args.profile, q, Path(root)))
            print(json.dumps(rows[-1]), flush=True)
            if args.out:
                args.out.write_text(json.dumps(rows, indent=1))
    print("| model | weights | plan kvCacheTokens | runtime KV tokens | plan vs runtime |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {args.shape} | {r['quantization']} | not planned: {r['error'][:80]} | | |")
            continue
        print(
            f"| {r['shape']} | {r['quantization']} | {r['plan_kv_cache_tokens']:,} | "
            f"{r['runtime_kv_cache_tokens']:,} | {r['plan_vs_runtime']:+.1%} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
