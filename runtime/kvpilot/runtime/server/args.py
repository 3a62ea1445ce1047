"""`kvpilot-runtime` flags (vLLM's names) and the checks that refuse what this build cannot do.

Parsing imports nothing heavy: a refused flag fails in well under a second, before torch is imported.
"""

from __future__ import annotations

import argparse
from typing import Any

SUPPORTED_QUANTIZATION = (None, "none")
# What the model runner implements (runtime/engine/model_runner.py); int8 KV is planned, not built.
SUPPORTED_KV_CACHE_DTYPES = (
    "auto",
    "float32",
    "fp32",
    "bfloat16",
    "bf16",
    "float16",
    "fp16",
    "half",
    "fp8",
    "fp8_e4m3",
)
LOAD_FORMATS = ("auto", "dummy")
DEVICES = ("auto", "cuda", "cpu")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvpilot-runtime", description="OpenAI-compatible server for one model directory."
    )
    p.add_argument("--model", required=True, help="Hugging Face model directory (config.json, safetensors)")
    p.add_argument("--served-model-name", default=None, help="name clients use; defaults to --model")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--quantization", default=None)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument(
        "--load-format",
        choices=LOAD_FORMATS,
        default="auto",
        help="dummy: random weights of the checkpoint's shapes (benchmarks)",
    )
    p.add_argument(
        "--num-kv-blocks",
        type=int,
        default=None,
        help="KV-cache blocks to allocate (default: sized from memory); tests use small numbers",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--max-waiting-requests",
        type=int,
        default=256,
        help="503 + Retry-After for a request that would make the waiting queue longer than "
        "this (an empty queue always admits one request)",
    )
    p.add_argument(
        "--shutdown-grace-seconds",
        type=float,
        default=30.0,
        help="on SIGTERM, how long running requests may take to finish",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def unsupported(args: argparse.Namespace) -> list[str]:
    """Why this build cannot serve with these flags (empty when it can). Never silently ignored."""
    problems = []
    if args.quantization not in SUPPORTED_QUANTIZATION:
        problems.append(
            f"--quantization {args.quantization} is not supported by this runtime build (supported: none)"
        )
    if args.tensor_parallel_size != 1:
        problems.append(
            f"--tensor-parallel-size {args.tensor_parallel_size} is not supported by this "
            "runtime build (single device only)"
        )
    if args.kv_cache_dtype not in SUPPORTED_KV_CACHE_DTYPES:
        problems.append(
            f"--kv-cache-dtype {args.kv_cache_dtype} is not supported by this runtime build "
            f"(supported: {', '.join(SUPPORTED_KV_CACHE_DTYPES)})"
        )
    return problems


def _flag(name: str) -> str:
    return name.replace("_", "-")


def invalid(args: argparse.Namespace) -> list[str]:
    positive = ["max_num_seqs", "max_num_batched_tokens", "block_size", "tensor_parallel_size"]
    problems = [f"--{_flag(name)} must be positive" for name in positive if getattr(args, name) < 1]
    for name in ("max_model_len", "num_kv_blocks"):
        value = getattr(args, name)
        if value is not None and value < 1:
            problems.append(f"--{_flag(name)} must be positive")
    if not 0.0 < args.gpu_memory_utilization <= 1.0:
        problems.append("--gpu-memory-utilization must be in (0, 1]")
    if not 0 <= args.port <= 65535:
        problems.append("--port must be in [0, 65535]")
    if args.max_waiting_requests < 0:
        problems.append("--max-waiting-requests must be non-negative")
    if args.shutdown_grace_seconds < 0:
        problems.append("--shutdown-grace-seconds must be non-negative")
    return problems


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parses and checks the flags; exits 2 with every problem listed (argparse's convention)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    problems = invalid(args) + unsupported(args)
    if problems:
        parser.error("; ".join(problems))
    return args


def served_name(args: argparse.Namespace) -> str:
    return args.served_model_name or args.model


def engine_args_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The EngineArgs fields, by name (the server itself never imports the engine at parse time)."""
    return {
        "model": args.model,
        "served_model_name": served_name(args),
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "block_size": args.block_size,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "kv_cache_dtype": args.kv_cache_dtype,
        "quantization": None if args.quantization == "none" else args.quantization,
        "tensor_parallel_size": args.tensor_parallel_size,
        "enable_prefix_caching": args.enable_prefix_caching,
        "device": args.device,
        "dtype": args.dtype,
        "num_kv_blocks": args.num_kv_blocks,
        "seed": args.seed,
        "load_format": args.load_format,
    }


def cache_config_labels(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "cache_dtype": args.kv_cache_dtype,
        "enable_prefix_caching": args.enable_prefix_caching,
        "gpu_memory_utilization": args.gpu_memory_utilization,
    }
