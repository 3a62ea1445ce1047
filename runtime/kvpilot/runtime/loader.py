"""Loading Hugging Face safetensors weights (single file or sharded) into our models.

Name mapping: checkpoint tensors keep Hugging Face's names except q/k/v_proj, which fill the row shards
of self_attn.qkv_proj, and gate/up_proj, which fill mlp.gate_up_proj. Every tensor the model needs must
be present exactly once with the right shape, or a ModelLoadError names the culprit.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from kvpilot.runtime.config import ModelConfig
from kvpilot.runtime.distributed.comm import Comm
from kvpilot.runtime.distributed.quant_sharding import local_g_idx, quantized_split, whole_rows_at_load
from kvpilot.runtime.distributed.sharding import TensorSplit
from kvpilot.runtime.errors import ModelLoadError
from kvpilot.runtime.gguf_model import resolve_model_dir, source_projection_types
from kvpilot.runtime.layers.kernel_ops import KernelOps
from kvpilot.runtime.layers.linear import Linear
from kvpilot.runtime.models import model_class
from kvpilot.runtime.quant import QuantConfig, attach_quant_methods, finish_quant_methods, parse_quant_config
from kvpilot.runtime.quant.gguf_grid import grid_note
from safetensors import safe_open
from torch import nn

if TYPE_CHECKING:  # the model module imports the distributed helpers
    from kvpilot.runtime.models.llama import LlamaForCausalLM

log = logging.getLogger(__name__)

# checkpoint module name -> (our fused module name, shard index)
PACKED_MODULES: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
_FUSED_PARTS: dict[str, list[str]] = {}
for _part, (_fused, _) in PACKED_MODULES.items():
    _FUSED_PARTS.setdefault(_fused, []).append(_part)
# Static per-layer K/V-cache scales (llm-compressor's k_scale/v_scale, older kv_scale, NVIDIA ModelOpt's on
# k_proj/v_proj): the 8-bit cache computes per-token-head scales on write, at least as fine as any static
# per-layer scale, so these are accepted and not used.
KV_SCALE_SUFFIXES = (
    *("self_attn.k_scale", "self_attn.v_scale", "self_attn.kv_scale"),
    *("k_proj.k_scale", "v_proj.v_scale"),
)
# weight_shape: compressed-tensors' record of a packed weight's [N, K], which weight_packed's checked shape
# already fixes
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "weight_shape", *KV_SCALE_SUFFIXES)
EMBEDDING, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"

ParamSlot = tuple[str, int | None]  # (our parameter name, shard index within a fused weight or None)


def checkpoint_to_param(name: str) -> ParamSlot:
    """'model.layers.0.self_attn.k_proj.weight' -> ('model.layers.0.self_attn.qkv_proj.weight', 1)."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in PACKED_MODULES:
        fused, shard = PACKED_MODULES[parts[-2]]
        return ".".join([*parts[:-2], fused, parts[-1]]), shard
    return name, None


def param_to_checkpoint(name: str, shard: int | None) -> str:
    """Inverse of checkpoint_to_param: the checkpoint tensor that fills (name, shard)."""
    if shard is None:
        return name
    parts = name.split(".")
    return ".".join([*parts[:-2], _FUSED_PARTS[parts[-2]][shard], parts[-1]])


def checkpoint_modules(module: str) -> list[str]:
    """The checkpoint modules our module is made of: 'model.layers.0.self_attn.qkv_proj' -> its q/k/v_proj."""
    parent, _, leaf = module.rpartition(".")
    return [f"{parent}.{part}" for part in _FUSED_PARTS[leaf]] if leaf in _FUSED_PARTS else [module]


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint, checked to exist."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"cannot read {index}: {exc}") from exc
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"weight shard(s) listed in {index.name} are missing: {', '.join(missing)}")
        return files
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    if any(model_dir.glob("*.bin")) or any(model_dir.glob("*.pt")):
        raise ModelLoadError(f"{model_dir} holds only PyTorch pickle weights; kvpilot loads safetensors only")
    raise ModelLoadError(
        f"no weights in {model_dir}: expected model.safetensors or model.safetensors.index.json"
    )


def iter_checkpoint_slices(files: list[Path]) -> Iterator[tuple[str, Any]]:
    """(name, lazy slice) for every tensor: reading `slice[...]` reads only those rows/columns from disk
    (each tensor-parallel rank reads its own slices, read_split)."""
    for path in files:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open handles are not mappings)
                    yield name, handle.get_slice(name)
        except ModelLoadError:
            raise
        except Exception as exc:  # safetensors raises its own error types and OSError/RuntimeError
            raise ModelLoadError(f"cannot read weights file {path.name}: {exc}") from exc


def read_split(lazy: Any, split: TensorSplit | None) -> torch.Tensor:
    """The rank's slice of one checkpoint tensor (all of it when split is None)."""
    if split is None:
        return lazy[...]
    end = split.start + split.length
    return lazy[(slice(None),) * split.dim + (slice(split.start, end),)]


def rank_target(param: torch.Tensor, split: TensorSplit | None) -> torch.Tensor:
    """Where a slice goes: the whole parameter, or its first rows when the rank's block is padded (the
    padding rows are zeroed)."""
    if split is None or split.padded_to is None or split.length == param.shape[0]:
        return param
    param[split.length :].zero_()
    return param[: split.length]


def required_slots(model: nn.Module, tied: bool) -> set[ParamSlot]:
    """Every (tensor, shard) the checkpoint must fill; a quantized Linear asks its method which."""
    slots: set[ParamSlot] = set()
    modules = dict(model.named_modules())
    for module_name, module in modules.items():
        if isinstance(module, Linear) and module.quant_method is not None:
            shards = range(len(module.shard_sizes)) if len(module.shard_sizes) > 1 else [None]
            suffixes = module.quant_method.required_suffixes
            slots.update((f"{module_name}.{suffix}", shard) for suffix in suffixes for shard in shards)
    for name, _ in model.named_parameters():
        if tied and name == "lm_head.weight":
            continue
        owner = modules[name.rsplit(".", 1)[0]]
        if isinstance(owner, Linear) and len(owner.shard_sizes) > 1:
            slots.update((name, shard) for shard in range(len(owner.shard_sizes)))
        else:
            slots.add((name, None))
    return slots


def _checkpoint_slot(name: str, params: dict[str, Any], tied: bool) -> ParamSlot:
    """The slot a checkpoint tensor fills; a tied embedding fills the LM head of a last pipeline stage
    that has no embedding of its own."""
    if tied and name == EMBEDDING and EMBEDDING not in params and LM_HEAD in params:
        return LM_HEAD, None
    return checkpoint_to_param(name)


def load_weights(
    model: nn.Module, model_dir: Path, config: ModelConfig, quant: QuantConfig | None = None
) -> None:
    """Copy every checkpoint tensor (this rank's slice of it) into its (possibly fused) parameter,
    casting to the model's dtype; a quantized layer's tensors go to its method (`quant`: the format). A
    pipeline stage ignores the other stages' tensors."""
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    tied = config.tie_word_embeddings
    partial = getattr(model, "is_partial", False)
    needed = required_slots(model, tied and EMBEDDING in params)
    loaded: set[ParamSlot] = set()
    for name, lazy in iter_checkpoint_slices(weight_files(model_dir)):
        slot = _checkpoint_slot(name, params, tied)
        if quant is not None and _load_quantized(modules, slot, name, lazy, quant):
            loaded.add(slot)
            continue
        if slot not in needed:
            if not partial and not name.endswith(_IGNORED_SUFFIXES) and name != LM_HEAD:
                log.warning("ignoring unexpected checkpoint tensor %s", name)
            continue
        param_name, shard = slot
        owner_name, leaf = param_name.rsplit(".", 1)
        owner = modules[owner_name]
        target = params[param_name].data
        if shard is not None:
            target = target[owner.shard_rows(shard)]
        split = owner.checkpoint_split(leaf, shard) if hasattr(owner, "checkpoint_split") else None
        target = rank_target(target, split)
        tensor = read_split(lazy, split)
        _require_16bit_values(name, tensor)
        if tuple(target.shape) != tuple(tensor.shape):
            what = "for this rank's slice of" if split else "for"
            raise ModelLoadError(
                f"tensor {name} has shape {tuple(lazy.get_shape())}, expected "
                f"{tuple(target.shape)} {what} this config.json"
            )
        target.copy_(tensor)
        loaded.add(slot)
    missing = sorted(param_to_checkpoint(*slot) for slot in needed - loaded)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ModelLoadError(
            f"checkpoint in {model_dir} is incomplete: missing tensor(s) {', '.join(missing[:5])}{more}"
        )


def _require_16bit_values(name: str, tensor: torch.Tensor) -> None:
    """A 16-bit layer's tensor holding 8-bit floats or integers is a quantized checkpoint whose config does
    not say so: cast without its scales it would serve garbage, so loading stops instead."""
    if tensor.is_floating_point() and tensor.element_size() > 1:
        return
    raise ModelLoadError(
        f"tensor {name} holds {str(tensor.dtype).removeprefix('torch.')} values, but config.json declares "
        "no quantization for it (quantization_config, or hf_quant_config.json beside it); a quantized "
        "checkpoint needs its quantization_config"
    )


def _load_quantized(
    modules: dict[str, nn.Module], slot: ParamSlot, name: str, lazy: Any, quant: QuantConfig
) -> bool:
    """Hand a tensor of a quantized Linear (this rank's slice of it, distributed/quant_sharding.py) to its
    method; False when it is not one of those."""
    module_name, _, suffix = slot[0].rpartition(".")
    owner = modules.get(module_name)
    if not isinstance(owner, Linear) or owner.quant_method is None:
        return False
    method = owner.quant_method
    if suffix not in method.required_suffixes and suffix not in method.optional_suffixes:
        return False
    split = owner.weight_splits[slot[1] or 0]
    try:
        if suffix == "weight" and whole_rows_at_load(quant, split):
            method.input_split = split  # quantized over whole rows, then cut (quant/tp_split.py)
            tensor = lazy[...]
        else:
            tensor = read_split(lazy, quantized_split(quant, suffix, tuple(lazy.get_shape()), split))
            if suffix in ("g_idx", "weight_g_idx") and split is not None and split.dim == 1:
                tensor = local_g_idx(tensor, split, quant)
        method.load(owner, suffix, tensor, slot[1])
    except ModelLoadError as exc:
        raise ModelLoadError(f"tensor {name}: {exc}") from exc
    return True


def init_dummy_weights(model: nn.Module, seed: int) -> None:
    """Random weights of the right shapes, made on the model's device (benchmarks: shapes are real,
    values are not). Norm weights are 1, everything else N(0, 0.02)."""
    generator: torch.Generator | None = None
    for name, param in model.named_parameters():
        if generator is None:
            generator = torch.Generator(device=param.device)
            generator.manual_seed(seed)
        if "norm" in name:
            param.data.fill_(1.0)
        else:
            param.data.normal_(0.0, 0.02, generator=generator)
    for module in model.modules():
        if isinstance(module, Linear) and module.quant_method is not None and generator is not None:
            module.quant_method.init_dummy(module, generator)


LOAD_FORMATS = ("auto", "dummy")


def load_model(
    model_dir: str | Path,
    config: ModelConfig,
    *,
    device: torch.device,
    dtype: torch.dtype,
    ops: KernelOps,
    max_positions: int | None = None,
    load_format: str = "auto",
    seed: int = 0,
    comm: Comm | None = None,
    quantization: str | None = None,
) -> LlamaForCausalLM:
    """Build the model for `config` directly on `device` in `dtype` and fill it from the checkpoint
    (load_format "auto") or with seeded random values ("dummy": no weight files needed). With `comm`
    (tensor / pipeline parallel) the model is this rank's part and each rank reads only its slices.
    Quantized weights: the checkpoint's config.json quantization_config, or `quantization`
    (--quantization) to quantize a 16-bit checkpoint at load (kvpilot.runtime.quant)."""
    if load_format not in LOAD_FORMATS:
        raise ModelLoadError(f"unknown load_format {load_format!r}; use one of {', '.join(LOAD_FORMATS)}")
    cls = model_class(config.architecture)
    quant = parse_quant_config(config.quantization_config, quantization)
    with torch.device("meta"):
        model = cls(config, ops, max_positions=max_positions, rope_device=device, comm=comm)
    if quant is not None:
        attach_quant_methods(
            model, quant, dtype=dtype, device=device, backend=ops.name, checkpoint_parts=checkpoint_modules
        )
    model = model.to(dtype=dtype).to_empty(device=device)
    if config.tie_word_embeddings:
        model.tie_weights()
    if load_format == "dummy":
        init_dummy_weights(model, seed)
    else:
        resolved = resolve_model_dir(model_dir)  # GGUF: its converted copy
        load_weights(model, resolved, config, quant)
        note = grid_note(source_projection_types(resolved), None if quant is None else quant.method)
        if note is not None and (comm is None or comm.rank.rank == 0):
            log.info(note)
    finish_quant_methods(model)
    model.eval()
    model.requires_grad_(False)
    return model
