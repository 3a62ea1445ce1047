"""Where W4's time to first token goes: one 1024-token prefill, profiled on the GPU.

    source benchmarks/gpu_env.sh && python benchmarks/profile_prefill.py [--workload W4] [--samples 3]

Builds the workload's engine as `python -m kvpilot.runtime.bench` does (random weights of the real shape),
warms it, then for each sample adds the request and steps until its first token under torch.profiler.
Prints, per sample: the wall TTFT, the host time before the first kernel starts, the span from the first
kernel's start to the last one's end, the time after the last kernel, and the sum of kernel times; then the
kernel time by category (GEMM, attention, norm, ...) and the top kernels. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

CATEGORIES = (  # first match wins; names as CUDA kernels appear in the profiler
    ("gemm", re.compile(r"gemm|gemv|cutlass|xmma|nvjet|cublas|splitK", re.I)),
    ("prefill attention", re.compile(r"prefill|_attn|attention", re.I)),
    ("qkv prepare", re.compile(r"qkv_prepare", re.I)),
    ("rms norm", re.compile(r"rms", re.I)),
    ("silu_mul", re.compile(r"silu", re.I)),
    ("embedding / index", re.compile(r"index|embedding|gather", re.I)),
    ("copies", re.compile(r"copy|memcpy|memset|fill", re.I)),
)


def category(name: str) -> str:
    return next((cat for cat, pattern in CATEGORIES if pattern.search(name)), "other")


def one_sample(engine: Any, prompt: list[int], tag: str) -> dict[str, Any]:
    """Profile one request from add_request to its first token; times in µs."""
    import torch
    from kvpilot.runtime.sampling_params import SamplingParams
    from torch.profiler import ProfilerActivity, profile

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as prof, torch.profiler.record_function("ttft"):
        t0 = time.perf_counter()
        engine.add_request(tag, prompt, params)
        while not any(o.new_token_ids for o in engine.step()):
            pass
        wall_us = (time.perf_counter() - t0) * 1e6
    events = prof.events()
    window = next(e for e in events if e.name == "ttft")
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and e.name != "ttft"]
    start = min(e.time_range.start for e in kernels)
    end = max(e.time_range.end for e in kernels)
    by_cat: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    for e in kernels:
        by_cat[category(e.name)] += e.time_range.elapsed_us()
        by_name[e.name[:70]] += e.time_range.elapsed_us()
    return {
        "wall_us": wall_us,
        "before_first_kernel_us": start - window.time_range.start,
        "kernel_span_us": end - start,
        "after_last_kernel_us": window.time_range.end - end,
        "kernel_sum_us": sum(by_cat.values()),
        "kernels": len(kernels),
        "by_category": dict(by_cat),
        "top": sorted(by_name.items(), key=lambda kv: -kv[1])[:12],
    }


def timed_sample(engine: Any, prompt: list[int], tag: str, hot: bool = False) -> dict[str, float]:
    """No profiler: host timestamps around the model's forward (all its kernels launched when it returns)
    and CUDA events on either side of it, in ms. launch ~ device means the host could not get ahead."""
    import torch
    from kvpilot.runtime.sampling_params import SamplingParams

    model, marks = engine.runner.model, {}
    forward = model.forward
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed_forward(*args: Any, **kwargs: Any) -> Any:
        marks["enter"] = time.perf_counter()
        start.record()
        out = forward(*args, **kwargs)
        end.record()
        marks["launched"] = time.perf_counter()
        return out

    model.forward = timed_forward
    try:
        torch.cuda.synchronize()
        if hot:  # ~40 ms of matmuls queued ahead: the forward starts on a busy, clocked-up GPU
            a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
            for _ in range(30):
                a @ a
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
        engine.add_request(tag, prompt, params)
        t0 = time.perf_counter()
        while not any(o.new_token_ids for o in engine.step()):
            pass
        done = time.perf_counter()
    finally:
        del model.forward  # back to the class's method
    return {
        "ttft": (done - t0) * 1e3,
        "to_forward": (marks["enter"] - t0) * 1e3,
        "launch": (marks["launched"] - marks["enter"]) * 1e3,
        "device_forward": start.elapsed_time(end),
        "after_launch": (done - marks["launched"]) * 1e3,
    }


def layer_timeline(engine: Any, prompt: list[int], tag: str) -> list[tuple[int, float, float]]:
    """(layer, host ms, device ms) when each decoder layer's launches begin, both since the forward's
    start: device ~ host means the device waited for the host to launch that layer."""
    import torch
    from kvpilot.runtime.sampling_params import SamplingParams

    layers = engine.runner.model.model.layers
    events = [torch.cuda.Event(enable_timing=True) for _ in range(len(layers) + 1)]
    host: list[float] = [0.0] * (len(layers) + 1)

    def mark(index: int) -> Any:
        def hook(*_: Any) -> None:
            host[index] = time.perf_counter()
            events[index].record()

        return hook

    handles = [layer.register_forward_pre_hook(mark(i + 1)) for i, layer in enumerate(layers)]
    handles.append(engine.runner.model.register_forward_pre_hook(mark(0)))
    try:
        torch.cuda.synchronize()
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
        engine.add_request(tag, prompt, params)
        while not any(o.new_token_ids for o in engine.step()):
            pass
    finally:
        for handle in handles:
            handle.remove()
    return [
        (i - 1, (host[i] - host[0]) * 1e3, events[0].elapsed_time(events[i])) for i in range(1, len(events))
    ]


def main() -> None:
    from kvpilot.runtime.bench import build_engine
    from kvpilot.runtime.bench_workloads import SHAPES, WORKLOADS, make_requests, write_model_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="W4")
    p.add_argument("--samples", type=int, default=3)
    args = p.parse_args()
    w = WORKLOADS[args.workload]
    bench_args = argparse.Namespace(
        max_num_seqs=256, max_num_batched_tokens=8192, quantization="none", kv_cache_dtype="auto", engine=[]
    )
    with tempfile.TemporaryDirectory() as root:
        engine = build_engine(write_model_dir(Path(root), w.shape), w, bench_args)
        prompt = make_requests(w, SHAPES[w.shape]["vocab_size"], 0)[0][0]
        for i in range(3):  # warm: Triton compiles, cuBLAS heuristics, the allocator
            one_sample(engine, prompt, f"warm-{i}")
        samples = [one_sample(engine, prompt, f"s-{i}") for i in range(args.samples)]
        timed = [timed_sample(engine, prompt, f"t-{i}") for i in range(5)]
        timed += [timed_sample(engine, prompt, f"h-{i}", hot=True) for i in range(5)]
        timeline = layer_timeline(engine, prompt, "layers")
    print("layer starts, ms since the forward began: | layer | host | device | device - host |")
    for layer, host_ms, device_ms in timeline:
        if layer < 4 or layer % 6 == 0 or layer == len(timeline) - 1:
            print(f"| {layer} | {host_ms:.2f} | {device_ms:.2f} | {device_ms - host_ms:+.2f} |")
    print("no profiler, ms (rows 6-10: the GPU busy right before, their ttft includes that work):")
    print("| ttft | to forward | forward launch (host) | forward on device | after |")
    for t in timed:
        print("| " + " | ".join(f"{t[k]:.2f}" for k in t) + " |")
    keys = ("wall_us", "before_first_kernel_us", "kernel_span_us", "after_last_kernel_us", "kernel_sum_us")
    print(f"{args.workload}: {len(prompt)}-token prompt, {samples[0]['kernels']} kernels per prefill")
    print("| sample | " + " | ".join(k.removesuffix("_us") + " µs" for k in keys) + " |")
    for i, s in enumerate(samples):
        print(f"| {i} | " + " | ".join(f"{s[k]:,.0f}" for k in keys) + " |")
    last = samples[-1]
    print("| kernel category (last sample) | µs | share of kernel sum |")
    for cat, us in sorted(last["by_category"].items(), key=lambda kv: -kv[1]):
        print(f"| {cat} | {us:,.0f} | {us / last['kernel_sum_us']:.1%} |")
    print("| top kernels (last sample) | µs |")
    for name, us in last["top"]:
        print(f"| {name} | {us:,.0f} |")


if __name__ == "__main__":
    main()
