"""GPU: once the engine has started (its memory-profiling step and CUDA-graph capture run every kernel), a
workload of every prompt length, chunked prefills mixed with decodes and eager decodes compiles no new
Triton kernel variant and no CUDA (NVRTC) build. A compile in the middle of serving stalls every running
request for 0.5-1.5 s: it is what made the first W1/W2 run after a machine start 40% slower (BENCHMARKS.md,
2026-12-01).

Triton specialises integer arguments on their value (== 1, divisible by 16): an argument that changes
every step (a block-table width, a partition count) must be marked do_not_specialize."""

from __future__ import annotations

import gc
import importlib
import pkgutil
from pathlib import Path

import pytest
from kvpilot.runtime.bench_workloads import write_model_dir
from kvpilot.runtime.engine.engine_args import EngineArgs
from kvpilot.runtime.engine.llm_engine import LLMEngine
from kvpilot.runtime.kernels.nvrtc import compile_cuda
from kvpilot.runtime.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu
triton = pytest.importorskip("triton")

# every kind of block-table width (1, multiples of 16, others) and chunk length; 2100 > the graphs' width
PROMPT_LENS = [1, 2, 15, 16, 17, 31, 33, 100, 255, 256, 257, 600, 1023, 1024, 1500, 2100, 3000]


def compiled_variants() -> dict[str, int]:
    """Compiled variants per Triton kernel of kvpilot.runtime.kernels (all devices)."""
    import kvpilot.runtime.kernels as kernels

    counts: dict[str, int] = {}
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"{kernels.__name__}.{info.name}")
        for name, obj in vars(module).items():
            if isinstance(obj, triton.runtime.jit.JITFunction):
                caches = getattr(obj, "device_caches", None)
                if caches is None:
                    pytest.fail("this Triton has no JITFunction.device_caches: update compiled_variants()")
                counts[f"{info.name}.{name}"] = sum(len(entry[0]) for entry in caches.values())
    return counts


def _engine(model_dir: Path, **overrides: object) -> LLMEngine:
    settings: dict[str, object] = dict(
        model=str(model_dir),
        max_model_len=4096,
        max_num_seqs=16,
        max_num_batched_tokens=512,  # long prompts are chunked and share steps with decodes
        device="cuda",
        dtype="bfloat16",
        load_format="dummy",
        seed=3,
    )
    return LLMEngine.from_args(EngineArgs(**{**settings, **overrides}))


def _run(engine: LLMEngine, lens: list[int], max_tokens: int, tag: str) -> None:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    for i, n in enumerate(lens):
        engine.add_request(f"{tag}{i}", [(11 * i + 7 * j) % 5000 + 1 for j in range(n)], params)
    while engine.has_unfinished_requests():
        engine.step()


@pytest.mark.parametrize(
    ("kv_cache_dtype", "quantization"),
    [("auto", None), ("fp8", None), ("auto", "int4"), ("auto", "int8"), ("auto", "fp8")],
)
def test_serving_compiles_nothing_after_start(
    tmp_path: Path, kv_cache_dtype: str, quantization: str | None
) -> None:
    """Quantized weights too: their GEMVs pick a launch shape per bucket of M and compile all of them
    while the model loads (quant/methods.py warm-up)."""
    engine = _engine(
        write_model_dir(tmp_path, "qwen3-0.6b"), kv_cache_dtype=kv_cache_dtype, quantization=quantization
    )
    _run(engine, [8], 2, "warm")  # one short request: the sampler's first use
    before, builds = compiled_variants(), compile_cuda.cache_info().misses
    _run(engine, PROMPT_LENS, 24, "a")
    _run(engine, PROMPT_LENS[::-1][:8], 3, "b")
    after, cuda_builds = compiled_variants(), compile_cuda.cache_info().misses - builds
    grown = {k: (before.get(k, 0), n) for k, n in after.items() if n != before.get(k, 0)}
    del engine  # the next case sizes its KV cache from the free memory
    _collect_engines()
    assert not grown, f"kernels compiled while serving (before, after): {grown}"
    assert cuda_builds == 0, f"{cuda_builds} CUDA kernel builds (NVRTC) while serving"


def _collect_engines() -> None:
    """An engine's runner, CUDA graphs and KV cache sit in reference cycles: free them now, not whenever
    the collector next runs (the next engine would find the GPU still full)."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()
