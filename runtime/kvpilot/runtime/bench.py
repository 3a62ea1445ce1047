"""`python -m kvpilot.runtime.bench`: DESIGN.md's workloads W1–W4 on random weights of real model shapes.

No download: a model directory holds the real config.json of the shape plus the tiny fixture tokenizer, and
the runner initialises random weights on the device (`load_format="dummy"`). Prompts are random token ids
and outputs ignore EOS, so the work is exactly the workload's. The same run can time Hugging Face
transformers' continuous batching (`generate_batch`, attn "paged|sdpa") on the same inputs.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvpilot.runtime.bench_timeline import StepTimeline, format_summary, summarise
from kvpilot.runtime.bench_workloads import (
    SHAPES,
    WEIGHT_BYTES,
    WORKLOADS,
    Workload,
    make_requests,
    physical_floor_s,
    qwen3_config,
    write_model_dir,
)
from kvpilot.runtime.engine.gc_heap import freeze_startup_heap


def engine_overrides(pairs: list[str]) -> dict[str, Any]:
    """`--engine kv_cache_dtype=fp8` -> {"kv_cache_dtype": "fp8"}, typed like EngineArgs' field."""
    import dataclasses

    from kvpilot.runtime.engine.engine_args import EngineArgs

    fields = {f.name: f for f in dataclasses.fields(EngineArgs)}
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in fields:
            raise SystemExit(f"--engine {pair!r}: expected NAME=VALUE with NAME an EngineArgs field")
        kind = str(fields[name].type).split("|")[0].strip()
        parsers: dict[str, Callable[[str], Any]] = {
            "int": int,
            "float": float,
            "bool": lambda v: v.lower() in ("1", "true", "yes"),
        }
        out[name] = parsers.get(kind, str)(value)
    return out


def build_engine(model_dir: Path, w: Workload, args: argparse.Namespace) -> Any:
    from kvpilot.runtime.engine.engine_args import EngineArgs
    from kvpilot.runtime.engine.llm_engine import LLMEngine

    settings: dict[str, Any] = dict(
        model=str(model_dir),
        max_model_len=max(4096, w.input_len[1] + w.output_len[1]),
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=0.9,
        device="cuda",
        dtype="bfloat16",
        load_format="dummy",
        enable_prefix_caching=False,
        quantization=None if args.quantization == "none" else args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    return LLMEngine.from_args(EngineArgs(**{**settings, **engine_overrides(args.engine)}))


def tpot(first: dict[str, float], last: dict[str, float], counts: dict[str, int]) -> float:
    """Mean time per output token after the first, over the requests that produced more than one."""
    per_request = [(last[r] - first[r]) / (counts[r] - 1) for r in first if counts[r] > 1]
    return sum(per_request) / len(per_request) if per_request else 0.0


def run_ours(engine: Any, reqs: list[tuple[list[int], int]], tag: str) -> dict[str, float]:
    from kvpilot.runtime.sampling_params import SamplingParams

    for i, (prompt, out_len) in enumerate(reqs):
        engine.add_request(
            f"{tag}-{i}",
            prompt,
            SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True, detokenize=False),
        )
    first_token: dict[str, float] = {}
    last_token: dict[str, float] = {}
    counts: dict[str, int] = {}
    t0 = time.perf_counter()
    generated = 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        for o in outputs:
            generated += len(o.new_token_ids)
            if o.new_token_ids:
                now = time.perf_counter() - t0
                first_token.setdefault(o.request_id, now)
                last_token[o.request_id] = now
                counts[o.request_id] = counts.get(o.request_id, 0) + len(o.new_token_ids)
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "output_tokens": generated,
        "output_tok_s": generated / wall,
        "ttft_s": min(first_token.values()) if first_token else float("nan"),
        # per request: (time to its last token - time to its first) / (its tokens - 1), averaged
        "tpot_s": tpot(first_token, last_token, counts),
    }


def run_hf(shape: str, reqs: list[tuple[list[int], int]], max_new_tokens: int) -> dict[str, float]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.for_model(**{k: v for k, v in qwen3_config(shape).items() if k != "architectures"})
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(
            config, torch_dtype=torch.bfloat16, attn_implementation="paged|sdpa"
        ).eval()
    gen = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    inputs = [p for p, _ in reqs]
    model.generate_batch(inputs=inputs[:4], generation_config=gen)  # warm-up: graphs, allocator
    t0 = time.perf_counter()
    out = model.generate_batch(inputs=inputs, generation_config=gen)
    wall = time.perf_counter() - t0
    generated = sum(len(o.generated_tokens) for o in out.values())
    del model
    torch.cuda.empty_cache()
    return {"wall_s": wall, "output_tokens": generated, "output_tok_s": generated / wall}


def run_workload(w: Workload, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from kvpilot.runtime.engine.model_runner import kv_dtype_name

    model_dir = write_model_dir(root, w.shape)
    reqs = make_requests(w, SHAPES[w.shape]["vocab_size"], args.seed)
    engine = build_engine(model_dir, w, args)
    freeze_startup_heap()  # as the engine-core process does after startup
    run_ours(engine, make_requests(Workload("warm", w.shape, 4, (64, 128), (8, 8), "x"), 150000, 1), "warm")
    run_ours(engine, [(reqs[0][0], 4)], "warm-shape")  # the workload's own shapes: JIT and cuBLAS choices
    if args.profile_dir is not None:
        profile_engine(engine, reqs, w.name, args.profile_dir, args.profile_skip, args.profile_steps)
        if args.profile_only:
            return {"workload": asdict(w), "profiled": str(args.profile_dir)}
    timeline = StepTimeline()
    detach = timeline.attach(engine.runner)
    result: dict[str, Any] = {"workload": asdict(w), "ours": run_ours(engine, reqs, w.name)}
    end = time.perf_counter()  # run_ours returns as its last step's outputs arrive
    detach()
    result["timeline"] = summarise(timeline.records, end)
    print(
        f"{w.name} step timeline (launch to next launch):\n{format_summary(result['timeline'])}", flush=True
    )
    result["quantization"], result["kv_cache_dtype"] = args.quantization, args.kv_cache_dtype
    if w.measure == "ttft":  # one step is a noisy sample: report the median of several
        ttfts = sorted(run_ours(engine, reqs, f"{w.name}-{i}")["ttft_s"] for i in range(7))
        result["ours"]["ttft_samples_s"] = ttfts
        result["ours"]["ttft_s"] = ttfts[len(ttfts) // 2]
    kv_dtype = kv_dtype_name(engine.runner.kv_cache_dtype)
    floor = physical_floor_s(w, reqs, kv_dtype, args.quantization)
    result["floor_s"] = floor
    kv_tokens = engine.stats().num_kv_blocks * engine.runner.block_size
    result["kv_cache"] = {"dtype": kv_dtype, "tokens": kv_tokens}
    if w.measure == "throughput":
        result["floor_tok_s"] = sum(o for _, o in reqs) / floor
    if args.hf and w.measure == "throughput":
        side = reqs[: args.hf_seqs]
        side = [(p, args.hf_output) for p, _ in side]
        result["side_by_side"] = {
            "num_seqs": len(side),
            "output_len": args.hf_output,
            "ours": run_ours(engine, side, w.name + "-side"),
        }
        del engine
        torch.cuda.empty_cache()
        try:
            result["side_by_side"]["hf"] = run_hf(w.shape, side, args.hf_output)
        except Exception as exc:  # the comparison must not lose our own numbers
            result["side_by_side"]["hf_error"] = f"{type(exc).__name__}: {exc}"
    return result


def profile_engine(
    engine: Any,
    reqs: list[tuple[list[int], int]],
    tag: str,
    out_dir: Path,
    skip_steps: int = 60,
    steps: int = 20,
) -> None:
    """Where a steady-state step's time goes: all requests admitted, prefill over, `steps` steps profiled
    for host functions (cProfile) and device kernels (torch.profiler); the rest is aborted."""
    import cProfile
    import io
    import pstats

    import torch
    from kvpilot.runtime.sampling_params import SamplingParams
    from torch.profiler import ProfilerActivity, profile

    out_dir.mkdir(parents=True, exist_ok=True)
    ids = [f"{tag}-prof-{i}" for i in range(len(reqs))]
    for rid, (prompt, out_len) in zip(ids, reqs, strict=True):
        engine.add_request(
            rid,
            prompt,
            SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True, detokenize=False),
        )
    for _ in range(skip_steps):
        engine.step()
    host, walls = cProfile.Profile(), []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tprof:
        host.enable()
        for _ in range(steps):
            t0 = time.perf_counter()
            engine.step()
            walls.append(time.perf_counter() - t0)
        host.disable()
        torch.cuda.synchronize()
    running = engine.stats().num_running
    for rid in ids:
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    text = io.StringIO()
    pstats.Stats(host, stream=text).sort_stats("tottime").print_stats(25)
    median_ms = sorted(walls)[len(walls) // 2] * 1e3
    head = f"steps {skip_steps}..{skip_steps + steps}: median wall {median_ms:.2f} ms, running {running}\n"
    (out_dir / f"{tag}-host.txt").write_text(head + text.getvalue())
    table = tprof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    (out_dir / f"{tag}-device.txt").write_text(head + table)
    print(head, flush=True)


def summary_row(r: dict[str, Any]) -> str:
    w, ours = r["workload"], r["ours"]
    if w["measure"] == "throughput":
        got, floor, unit = ours["output_tok_s"], r["floor_tok_s"], "out tok/s"
        ratio = got / floor
    elif w["measure"] == "tpot":
        got, floor, unit = ours["tpot_s"] * 1e3, r["floor_s"] / w["output_len"][0] * 1e3, "ms/token"
        ratio = floor / got
    else:
        got, floor, unit = ours["ttft_s"] * 1e3, r["floor_s"] * 1e3, "ms TTFT"
        ratio = floor / got
    side = r.get("side_by_side", {})
    hf = side.get("hf", {}).get("output_tok_s")
    vs = f"{side['ours']['output_tok_s'] / hf:.1f}x HF" if hf else side.get("hf_error", "")[:40]
    kv = r.get("kv_cache", {})
    name = w["name"] + ("" if r.get("quantization", "none") == "none" else f" {r['quantization']}")
    shape = f"{w['shape']}, KV {kv.get('dtype', '?')} ({kv.get('tokens', 0):,} tokens)"
    return f"| {name} | {shape} | {got:,.1f} {unit} | {floor:,.1f} | {ratio:.0%} | {vs} |"


def release_device_memory() -> None:
    import gc

    import torch

    gc.unfreeze()  # the engine was frozen with the startup heap (freeze_startup_heap)
    gc.collect()  # the engine, its runner and CUDA graphs sit in reference cycles
    torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="W1,W2,W3,W4")
    p.add_argument("--root", type=Path, default=Path("/tmp/kvpilot-bench"))
    p.add_argument("--out", type=Path, default=None, help="write all numbers as JSON here")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an EngineArgs setting, repeatable (e.g. --engine kv_cache_dtype=fp8)",
    )
    p.add_argument("--profile-dir", type=Path, default=None, help="write host/device profiles here")
    p.add_argument("--profile-only", action="store_true", help="with --profile-dir: skip the measurement")
    p.add_argument("--profile-skip", type=int, default=60, help="steps run before the profiled ones")
    p.add_argument("--profile-steps", type=int, default=20, help="steps profiled")
    p.add_argument("--hf", action="store_true", help="also time transformers' generate_batch side by side")
    p.add_argument("--hf-seqs", type=int, default=64)
    p.add_argument("--hf-output", type=int, default=256)
    p.add_argument("--quantization", default="none", choices=tuple(WEIGHT_BYTES), help="weights at load")
    p.add_argument("--kv-cache-dtype", default="auto", help="KV-cache element type (auto: bf16)")
    args = p.parse_args(argv)
    results = []
    for name in args.workloads.split(","):
        results.append(run_workload(WORKLOADS[name], args.root, args))
        release_device_memory()  # the next workload's engine sizes its KV cache from the free memory
        print(json.dumps(results[-1]), flush=True)
        if args.out:
            args.out.write_text(json.dumps(results, indent=1))
    print("| workload | shape | ours | floor | of floor | side by side |\n|---|---|---|---|---|---|")
    for r in results:
        if "ours" in r:
            print(summary_row(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
