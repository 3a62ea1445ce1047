"""Sizing truth for tensor-parallel plans on the 2 x H200 machine: the operator's plan (KV tokens per GPU)
against what each rank of `kvpilot-runtime` started with that plan's flags allocates (within 5%).

    source benchmarks/gpu_env.sh && python benchmarks/check_parallel_sizing.py --out $OUT

For each model shape the planner plans on the h200-141gb profile with 2 GPUs (tensor parallel 2); the
runtime is built from exactly the plan's values (the flags the operator renders) with random weights, and
every rank allocates the same number of KV blocks (the fewest any rank can hold). Exit status 1 when a
shape is off by more than 5%.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_parallel import LLAMA_70B, NO_MULTICAST, model_dir

PROFILE, GPUS, TOLERANCE = "h200-141gb", 2, 0.05
# case: (model shape, weight quantization pinned in the spec; "auto": the planner's choice)
CASES = {
    "qwen3-8b": ("qwen3-8b", "auto"),
    "llama-70b": ("llama-70b", "auto"),
    "llama-70b-int4": ("llama-70b", "int4"),  # quantized weights split across the ranks (int4 at load)
}


def plan_for(shape: str, root: Path, quantization: str = "auto") -> tuple[Any, int]:
    """The plan, and the KV bytes per token per GPU it sized with."""
    from kvpilot.operator.planning.model_facts import facts_from_config
    from kvpilot.operator.planning.planner import PlanRequest, plan
    from kvpilot.operator.planning.profiles import builtin_profiles
    from kvpilot.operator.planning.sizing import kv_bytes_per_token

    path = model_dir(root, shape) / "config.json"
    facts = facts_from_config(LLAMA_70B if shape == "llama-70b" else json.loads(path.read_text()))
    request = PlanRequest(
        facts, builtin_profiles()[PROFILE], quantization=quantization, tensor=GPUS, gpu_count=GPUS
    )
    p = plan(request)
    kv_dtype = p.kv_cache_dtype if p.kv_cache_dtype != "auto" else "bf16"
    return p, kv_bytes_per_token(facts, kv_dtype, p.tensor_parallel or 1, p.pipeline_parallel or 1)


def run_shape(case: str, root: Path, out: Path) -> None:
    from kvpilot.operator.planning.sizing import BLOCK_SIZE
    from kvpilot.runtime.distributed.group import build_runner
    from kvpilot.runtime.engine.engine_args import EngineArgs

    shape, quantization = CASES[case]
    p, per_gpu = plan_for(shape, root, quantization)
    if not p.feasible:
        out.write_text(json.dumps({"shape": case, "error": p.reason}))
        return
    args = EngineArgs(
        model=str(model_dir(root, shape)),
        max_model_len=p.max_model_len,
        max_num_seqs=p.max_num_seqs,
        max_num_batched_tokens=p.max_num_batched_tokens,
        block_size=BLOCK_SIZE,
        gpu_memory_utilization=p.gpu_memory_utilization,
        kv_cache_dtype=p.kv_cache_dtype,
        tensor_parallel_size=p.tensor_parallel,
        pipeline_parallel_size=p.pipeline_parallel,
        device="cuda",
        dtype="bfloat16",
        load_format="dummy",
        quantization=None if p.quantization == "none" else p.quantization,
    )
    runner = build_runner(args)
    allocated = runner.num_kv_blocks * runner.block_size
    result = {
        "shape": case,
        "plan": p.summary,
        "planned_kv_tokens": p.kv_cache_tokens,
        "allocated_kv_tokens_per_rank": allocated,
        "ratio": allocated / p.kv_cache_tokens,
        "planned_kv_bytes_per_token": per_gpu,
        "runtime_kv_bytes_per_token": runner._block_bytes() // runner.block_size,
    }
    runner.shutdown()
    out.write_text(json.dumps(result))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/kvpilot-out")))
    p.add_argument("--root", type=Path, default=Path("/tmp/kvpilot-bench"))
    p.add_argument("--shape", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.shape:
        run_shape(args.shape, args.root, args.out / f"sizing-{args.shape}.json")
        sys.stdout.flush()
        os._exit(0)  # no NCCL teardown after CUDA-graph capture (it can hang: pytorch/pytorch#115388)
    rows, ok = [], True
    for shape in CASES:
        log = args.out / f"sizing-{shape}.log"
        cmd = [sys.executable, __file__, "--out", str(args.out), "--root", str(args.root), "--shape", shape]
        with log.open("w") as handle:
            code = subprocess.run(
                cmd, env={**os.environ, **NO_MULTICAST}, stdout=handle, stderr=subprocess.STDOUT, timeout=280
            ).returncode
        path = args.out / f"sizing-{shape}.json"
        r = (
            json.loads(path.read_text())
            if code == 0 and path.exists()
            else {"shape": shape, "error": f"exit {code}"}
        )
        rows.append(r)
        ok = ok and "ratio" in r and abs(r["ratio"] - 1) <= TOLERANCE
    print("| shape | plan | planned KV tokens/GPU | allocated per rank | ratio | KV B/token plan / runtime |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "ratio" not in r:
            print(f"| {r['shape']} | failed: {r['error'][:100]} | | | | |")
            continue
        planned, allocated = r["planned_kv_tokens"], r["allocated_kv_tokens_per_rank"]
        per_token = f"{r['planned_kv_bytes_per_token']:,} / {r['runtime_kv_bytes_per_token']:,}"
        print(
            f"| {r['shape']} | {r['plan']} | {planned:,} | {allocated:,} | {r['ratio']:.3f} | {per_token} |"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
