"""Tensor parallel on two GPUs (issue 14): W3 (Qwen3-8B shape) at tp 1 and tp 2, W3-70B and W2-70B
(Llama-3.1-70B shape, random bf16 weights) at tp 2, the NCCL all-reduce cost per step, and the cost of
broadcasting each step's inputs from rank 0. One command; a table at the end; JSON and logs under --out.

    source benchmarks/gpu_env.sh && python benchmarks/bench_parallel.py --out $OUT

More cases (--cases, --no-allreduce): pipeline parallel 2 with and without micro-batches (W2 shape on
Qwen3-8B: the split steps and micro-batches are reported), and int4 weights at tp 2 vs tp 1 (W3):

    python benchmarks/bench_parallel.py --out $OUT --no-allreduce \
        --cases W2-8B-pp2-micro,W2-8B-pp2-whole,W3-8B-int4-tp2,W3-8B-int4-tp1

Each engine runs in its own subprocess (a clean GPU and a fresh process group). The all-reduce cost is
timed two ways: a standalone NCCL all-reduce of one step's activation size, inside a CUDA graph of as
many all-reduces as a decode step holds (2 per layer + the LM head's all-gather), and from a torch
profile of tp 2 decode steps (the NCCL kernels' device time per step).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kvpilot.runtime.distributed.launch import NO_MULTICAST_ENV  # torch-free: imported before torch

os.environ.update(NO_MULTICAST_ENV)  # before torch/NCCL start, in this process and every child

LLAMA_70B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "max_position_embeddings": 131072,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
DEVICE, DTYPE = "cuda", "bfloat16"  # (a CPU smoke test patches these)
# KVPILOT_BENCH_EAGER=1: no decode CUDA graphs (a fallback if capturing the NCCL collectives fails)
ENFORCE_EAGER = os.environ.get("KVPILOT_BENCH_EAGER") == "1"
# name: (shape, tp, num_seqs, input range, output len, what to report, target)
CASES: dict[str, tuple[str, int, int, tuple[int, int], int, str, str]] = {
    "W3-8B-tp2": ("qwen3-8b", 2, 1, (1024, 1024), 256, "tpot", "<= 3.2 ms"),
    "W3-70B-tp2": ("llama-70b", 2, 1, (1024, 1024), 256, "tpot", "<= 20 ms (floor ~16.5)"),
    "W2-70B-tp2": ("llama-70b", 2, 256, (100, 1024), 256, "throughput", ">= 1,800 tok/s (floor ~3,400)"),
    "W3-8B-tp1": ("qwen3-8b", 1, 1, (1024, 1024), 256, "tpot", "5.0 ms (before)"),
    # pipeline parallel 2 (issue 14 item 3): micro-batched steps vs whole steps (never split)
    "W2-8B-pp2-micro": ("qwen3-8b", 1, 256, (100, 1024), 256, "throughput", "> W2-8B-pp2-whole"),
    "W2-8B-pp2-whole": ("qwen3-8b", 1, 256, (100, 1024), 256, "throughput", "(no micro-batches)"),
    # quantized weights split across ranks: int4 at load, tp 2 vs tp 1
    "W3-8B-int4-tp2": ("qwen3-8b", 2, 1, (1024, 1024), 256, "tpot", "< W3-8B-int4-tp1"),
    "W3-8B-int4-tp1": ("qwen3-8b", 1, 1, (1024, 1024), 256, "tpot", "(one GPU)"),
}
# more EngineArgs of a case (pipeline size, quantization, micro-batching off)
CASE_ARGS: dict[str, dict[str, Any]] = {
    "W2-8B-pp2-micro": {"pipeline_parallel_size": 2},
    "W2-8B-pp2-whole": {"pipeline_parallel_size": 2, "pipeline_ridge_tokens": 1 << 30},
    "W3-8B-int4-tp2": {"quantization": "int4"},
    "W3-8B-int4-tp1": {"quantization": "int4"},
}
DEFAULT_CASES = ("W3-8B-tp2", "W3-70B-tp2", "W2-70B-tp2", "W3-8B-tp1")
# (label, hidden, all-reduces + all-gathers per decode step, batch rows)
COLLECTIVES = [
    ("qwen3-8b b1", 4096, 2 * 36 + 1, 1),
    ("llama-70b b1", 8192, 2 * 80 + 1, 1),
    ("llama-70b b256", 8192, 2 * 80 + 1, 256),
]


def model_dir(root: Path, shape: str) -> Path:
    from kvpilot.runtime.bench_workloads import write_model_dir

    if shape != "llama-70b":
        return write_model_dir(root, shape)
    base = write_model_dir(root, "qwen3-8b")  # for the fixture tokenizer files
    out = root / shape
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (out / name).write_bytes((base / name).read_bytes())
    (out / "config.json").write_text(json.dumps(LLAMA_70B))
    return out


def requests(
    num_seqs: int, lens: tuple[int, int], out_len: int, seed: int = 0
) -> list[tuple[list[int], int]]:
    import random

    rng = random.Random(seed)
    return [
        ([rng.randrange(1000, 100000) for _ in range(rng.randint(*lens))], out_len) for _ in range(num_seqs)
    ]


def nccl_time_per_step(engine: Any, reqs: list[tuple[list[int], int]], steps: int = 32) -> float | None:
    """Device time of NCCL kernels per decode step, from a torch profile of `steps` steps (seconds)."""
    import torch
    from kvpilot.runtime.sampling_params import SamplingParams
    from torch.profiler import ProfilerActivity, profile

    for i, (prompt, _) in enumerate(reqs):
        params = SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True, detokenize=False)
        engine.add_request(f"prof-{i}", prompt, params)
    for _ in range(4):  # prefill and the first decodes
        engine.step()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    while engine.has_unfinished_requests():
        engine.step()
    total_us = sum(e.self_device_time_total for e in prof.key_averages() if "nccl" in e.key.lower())
    return total_us / steps / 1e6 if total_us else None


def run_case(name: str, root: Path, out: Path) -> None:
    """One engine in this process (rank 0; tp 2 spawns rank 1): warm up, measure, profile."""
    from kvpilot.runtime.bench import run_ours
    from kvpilot.runtime.engine.engine_args import EngineArgs
    from kvpilot.runtime.engine.llm_engine import LLMEngine

    shape, tp, num_seqs, lens, out_len, measure, _ = CASES[name]
    extra = CASE_ARGS.get(name, {})
    ranks = tp * extra.get("pipeline_parallel_size", 1)
    start = time.perf_counter()
    engine = LLMEngine.from_args(
        EngineArgs(
            model=str(model_dir(root, shape)),
            tensor_parallel_size=tp,
            max_model_len=4096,
            max_num_seqs=256 if num_seqs > 1 else 8,
            max_num_batched_tokens=8192,
            gpu_memory_utilization=0.9,
            device=DEVICE,
            dtype=DTYPE,
            load_format="dummy",
            enable_prefix_caching=False,
            enforce_eager=ENFORCE_EAGER,
            **extra,
        )
    )
    load_s = time.perf_counter() - start
    reqs = requests(num_seqs, lens, out_len)
    run_ours(engine, requests(4, (64, 128), 8, seed=1), "warm")
    run_ours(engine, [(reqs[0][0], 4)], "warm-shape")
    runner = engine.runner
    if ranks > 1:
        runner.broadcast_seconds, runner.broadcast_steps = 0.0, 0
    stage = getattr(runner, "pipeline", None)
    before = (stage.steps, stage.split_steps, stage.micro_batches) if stage is not None else None
    result: dict[str, Any] = {"case": name, "load_s": load_s, **run_ours(engine, reqs, name)}
    result["kv_tokens_per_rank"] = runner.num_kv_blocks * runner.block_size
    if stage is not None and before is not None:  # steps / split steps / their micro-batches in the run
        result["pipeline_steps"] = [stage.steps - before[0], stage.split_steps - before[1]]
        result["pipeline_micro_batches"] = stage.micro_batches - before[2]
    if ranks > 1:
        result["broadcast_us_per_step"] = runner.broadcast_seconds / max(1, runner.broadcast_steps) * 1e6
        if measure == "tpot" and tp > 1:
            result["nccl_s_per_step"] = nccl_time_per_step(engine, reqs[:1])
        runner.shutdown()
    out.write_text(json.dumps(result))


def allreduce_worker(rank: int, world: int, port: int, out: str) -> None:
    """Timed NCCL all-reduces of one decode step's activations: eager, and inside a CUDA graph."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=device
    )
    results = []
    for label, hidden, per_step, rows in COLLECTIVES:
        x = torch.randn(rows, hidden, dtype=torch.bfloat16, device=device)
        for _ in range(10):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(per_step):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        eager = (time.perf_counter() - t0) / per_step
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(per_step):
                dist.all_reduce(x)
        graph.replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            graph.replay()
        torch.cuda.synchronize()
        in_graph = (time.perf_counter() - t0) / 20 / per_step
        results.append(
            {
                "label": label,
                "bytes": rows * hidden * 2,
                "per_step": per_step,
                "eager_us": eager * 1e6,
                "graph_us": in_graph * 1e6,
                "graph_ms_per_step": in_graph * per_step * 1e3,
            }
        )
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.barrier()
    os._exit(0)  # no destroy_process_group after capture: it can hang (pytorch/pytorch#115388)


def run_allreduce(out: Path) -> None:
    import torch.multiprocessing as mp
    from kvpilot.runtime.distributed.launch import free_port

    mp.spawn(allreduce_worker, args=(2, free_port(), str(out)), nprocs=2, join=True)


def table(results: dict[str, Any], collectives: list[dict[str, Any]]) -> str:
    lines = [
        "| case | result | target | broadcast/step | NCCL/step (profile) | KV tokens/rank | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        target = CASES[name][6]
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'][:80]} | {target} | | | | |")
            continue
        got = (
            f"{r['tpot_s'] * 1e3:.2f} ms/token"
            if CASES[name][5] == "tpot"
            else f"{r['output_tok_s']:,.0f} out tok/s"
        )
        bcast = f"{r['broadcast_us_per_step']:.0f} µs" if "broadcast_us_per_step" in r else "-"
        if "pipeline_steps" in r:  # split steps / steps (micro-batches)
            steps, split = r["pipeline_steps"]
            got += f", {split}/{steps} steps split ({r['pipeline_micro_batches']} micro-batches)"
        nccl = f"{r['nccl_s_per_step'] * 1e3:.3f} ms" if r.get("nccl_s_per_step") else "-"
        lines.append(
            f"| {name} | {got} | {target} | {bcast} | {nccl} | {r['kv_tokens_per_rank']:,} | "
            f"{r['load_s']:.0f} s |"
        )
    lines += [
        "",
        "| all-reduce (tp 2, bf16) | bytes | per step | eager µs | in graph µs | ms/step in graph |",
        "|---|---|---|---|---|---|",
    ]
    for c in collectives:
        lines.append(
            f"| {c['label']} | {c['bytes']:,} | {c['per_step']} | {c['eager_us']:.1f} | "
            f"{c['graph_us']:.1f} | {c['graph_ms_per_step']:.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/kvpilot-out")))
    p.add_argument("--root", type=Path, default=Path("/tmp/kvpilot-bench"))
    p.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"of {', '.join(CASES)}")
    p.add_argument("--no-allreduce", action="store_true", help="skip the standalone all-reduce timing")
    p.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case in this process
    p.add_argument("--allreduce", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--budget", type=int, default=540, help="seconds for everything (10-minute device cap)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.case or args.allreduce:
        if args.case:
            run_case(args.case, args.root, args.out / f"parallel-{args.case}.json")
        else:
            run_allreduce(args.out / "parallel-allreduce.json")
        sys.stdout.flush()
        os._exit(0)  # no NCCL teardown after CUDA-graph capture (it can hang: pytorch/pytorch#115388)
    env = {**os.environ, **NO_MULTICAST_ENV}
    results: dict[str, Any] = {}
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    jobs = [] if args.no_allreduce else [("allreduce", ["--allreduce"])]
    jobs += [(c, ["--case", c]) for c in args.cases.split(",")]
    deadline = time.monotonic() + args.budget
    for name, flags in jobs:
        log = args.out / f"parallel-{name}.log"
        cmd = [sys.executable, __file__, "--out", str(args.out), "--root", str(args.root), *flags]
        with log.open("w") as handle:
            try:
                left = max(1.0, deadline - time.monotonic())
                code = subprocess.run(
                    cmd, env=env, stdout=handle, stderr=subprocess.STDOUT, timeout=left
                ).returncode
            except subprocess.TimeoutExpired:
                code = -1
        path = args.out / f"parallel-{name}.json"
        if name != "allreduce":
            results[name] = (
                json.loads(path.read_text())
                if code == 0 and path.exists()
                else {"error": f"exit {code}, see {log.name}: " + log.read_text()[-200:]}
            )
        print(f"{name}: exit {code}", flush=True)
    collectives_path = args.out / "parallel-allreduce.json"
    collectives = json.loads(collectives_path.read_text()) if collectives_path.exists() else []
    (args.out / "parallel.json").write_text(
        json.dumps({"cases": results, "allreduce": collectives}, indent=1)
    )
    print(table(results, collectives))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
