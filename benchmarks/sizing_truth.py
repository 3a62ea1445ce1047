"""Sizing truth on the GPU: the operator's planned kvCacheTokens against what the runtime allocates.

For each (model shape, weight quantization, KV-cache dtype): plan for the H200 profile with those settings
pinned, start the runtime's engine with the plan's own arguments (random weights of the shape), and compare
the plan's kvCacheTokens with the engine's KV blocks x block size. The target is within 5%.

    python benchmarks/sizing_truth.py --case qwen3-8b:none:bf16 --case qwen3-8b:none:fp8 ...
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_CASES = (
    "qwen3-0.6b:none:bf16",
    "qwen3-8b:none:bf16",
    "qwen3-8b:none:fp8",
    "qwen3-8b:none:int8",
)


def planned(shape: str, quantization: str, kv_dtype: str, max_model_len: int) -> Any:
    from kvpilot.operator.planning.model_facts import facts_from_config
    from kvpilot.operator.planning.planner import PlanRequest, plan
    from kvpilot.operator.planning.profiles import builtin_profiles
    from kvpilot.runtime.bench_workloads import qwen3_config

    request = PlanRequest(
        facts=facts_from_config(qwen3_config(shape)),
        profile=builtin_profiles()["h200-141gb"],
        max_model_len=max_model_len,
        quantization=quantization,
        kv_cache_dtype=kv_dtype,
        tensor=1,
        pipeline=1,
    )
    return plan(request)


def allocated_tokens(model_dir: Path, p: Any) -> int:
    import torch
    from kvpilot.runtime.engine.engine_args import EngineArgs
    from kvpilot.runtime.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_args(
        EngineArgs(
            model=str(model_dir),
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
    tokens = engine.stats().num_kv_blocks * engine.runner.block_size
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return tokens


def main(argv: list[str] | None = None) -> int:
    from kvpilot.runtime.bench_workloads import write_model_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", help="shape:quantization:kv_dtype (repeatable)")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.case or DEFAULT_CASES:
            shape, quantization, kv_dtype = case.split(":")
            p = planned(shape, quantization, kv_dtype, args.max_model_len)
            if not p.feasible:
                rows.append({"case": case, "error": p.reason})
                continue
            got = allocated_tokens(write_model_dir(Path(tmp), shape), p)
            rows.append({"case": case, "planned": p.kv_cache_tokens, "allocated": got})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    print("| shape:weights:KV | planned kvCacheTokens | runtime allocated | plan vs runtime |")
    print("|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['case']} | {r['error'][:60]} | | |")
        else:
            off = r["planned"] / r["allocated"] - 1
            print(f"| {r['case']} | {r['planned']:,} | {r['allocated']:,} | {off:+.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
