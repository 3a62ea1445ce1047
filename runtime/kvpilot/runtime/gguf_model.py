"""GGUF models (llama.cpp, Ollama): a .gguf file is converted once into a Hugging Face-style directory,
which the runtime then loads through its normal loader.

The conversion (`convert_gguf`) writes
  config.json            from the GGUF metadata (<arch>.block_count, .embedding_length, ...)
  model.safetensors      every tensor dequantized by the `gguf` package (float32 by default, so the
                         GGUF's values are kept exactly), renamed to Hugging Face names; Llama's Q/K rows
                         are un-permuted (llama.cpp's converter interleaves them for its rotary kernel)
  tokenizer.json         built with the `tokenizers` library from the GGUF's BPE vocabulary and merges
                         (tokenizer.ggml.*), control tokens as special added tokens, the pre-tokenizer
                         llama.cpp uses for tokenizer.ggml.pre
  tokenizer_config.json  bos/eos/unk/pad tokens and the chat template (tokenizer.chat_template)
  generation_config.json the eos (and end-of-turn) token ids

`resolve_model_dir(path)` is what the loaders call: a Hugging Face directory is returned unchanged; a
.gguf file, or a directory holding exactly one .gguf file and no config.json, is converted into the
cache (`cache_dir()`: $KVPILOT_CACHE_DIR, else ~/.cache/kvpilot) under a key made of the file's SHA-256,
once per machine. A conversion is written to a temporary directory and renamed into place, so a
crashed or concurrent conversion never leaves a half-written model behind.

What is refused, with a message naming the problem: an unreadable, truncated or corrupted file, an
architecture other than llama/qwen2/qwen3, a tensor type the `gguf` package cannot dequantize, a
missing or non-BPE tokenizer section, an unknown pre-tokenizer, Llama 3 rope frequency tensors.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from kvpilot.runtime.errors import ModelLoadError, UnsupportedModelError
from kvpilot.runtime.gguf_tensors import convert_tensors, projection_types, require_int
from kvpilot.runtime.gguf_tokenizer import build_tokenizer_files

log = logging.getLogger(__name__)

CONVERTER_VERSION = 2  # bump when the converted files change: old cache entries are then ignored
GGUF_SUFFIX = ".gguf"

# GGUF general.architecture -> Hugging Face architecture
ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

_memo: dict[tuple[str, int, int, str], Path] = {}
_memo_lock = threading.Lock()


# ---- finding and caching ------------------------------------------------------------------------
def find_gguf(path: str | Path) -> Path | None:
    """The GGUF file `path` names: the file itself, or the single .gguf in a directory without a
    config.json. None for anything else (a Hugging Face directory, a missing path)."""
    path = Path(path)
    if path.suffix.lower() == GGUF_SUFFIX and not path.is_dir():
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {path} does not exist")
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.iterdir() if p.suffix.lower() == GGUF_SUFFIX and p.is_file())
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise ModelLoadError(f"{path} holds several GGUF files ({names}); pass --model with the one to serve")
    return found[0] if found else None


def cache_dir() -> Path:
    """Where converted GGUF models live: $KVPILOT_CACHE_DIR, else $XDG_CACHE_HOME/kvpilot, else
    ~/.cache/kvpilot (a `gguf/` folder under it)."""
    root = os.environ.get("KVPILOT_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kvpilot"


def resolve_model_dir(path: str | Path) -> Path:
    """A directory the loaders can read: `path` itself, or the converted copy of the GGUF it names."""
    gguf_file = find_gguf(path)
    if gguf_file is None:
        return Path(path)
    stat = gguf_file.stat()
    key = (str(gguf_file.resolve()), stat.st_size, stat.st_mtime_ns, str(cache_dir()))
    with _memo_lock:  # every loader asks (config, tokenizer, weights): convert and hash once per process
        if key not in _memo:
            _memo[key] = convert_cached(gguf_file)
        return _memo[key]


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 23):
            digest.update(chunk)
    return digest.hexdigest()


def convert_cached(gguf_file: str | Path, root: str | Path | None = None, dtype: str = "float32") -> Path:
    """The converted directory for `gguf_file` under `root` (default: cache_dir()/gguf), converting it
    on the first call for this file content."""
    gguf_file = Path(gguf_file)
    root = Path(root) if root is not None else cache_dir() / "gguf"
    try:
        digest = file_digest(gguf_file)
    except OSError as exc:
        raise ModelLoadError(f"cannot read GGUF file {gguf_file}: {exc}") from exc
    target = root / f"{gguf_file.stem}-{digest[:16]}-v{CONVERTER_VERSION}-{dtype}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    log.info("converting %s into %s (once per file)", gguf_file, target)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        convert_gguf(gguf_file, scratch, dtype=dtype)
        scratch.chmod(0o755)  # mkdtemp made it private; the cache is shared like any model directory
        try:
            os.replace(scratch, target)
        except OSError:  # another process finished the same conversion first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


# ---- conversion ---------------------------------------------------------------------------------
def read_gguf(gguf_file: str | Path) -> Any:
    """A gguf.GGUFReader over the file; any failure to parse it becomes one ModelLoadError."""
    from gguf import GGUFReader

    try:
        return GGUFReader(str(gguf_file))
    except Exception as exc:  # the reader raises ValueError, struct/numpy errors, ... on a bad file
        raise ModelLoadError(
            f"cannot read GGUF file {gguf_file}: {type(exc).__name__}: {exc} "
            "(is the file truncated or corrupted?)"
        ) from exc


def gguf_metadata(reader: Any) -> dict[str, Any]:
    """Every key/value field of the file as plain Python values."""
    meta: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        try:
            meta[name] = field.contents()
        except (UnicodeDecodeError, ValueError, IndexError) as exc:
            raise ModelLoadError(f"GGUF metadata field {name} is unreadable: {exc}") from exc
    return meta


def convert_gguf(gguf_file: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Write the Hugging Face-style files for `gguf_file` into `out_dir` (see the module docstring)."""
    import torch
    from safetensors.torch import save_file

    gguf_file, out_dir = Path(gguf_file), Path(out_dir)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
    if torch_dtype is None:
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
    reader = read_gguf(gguf_file)
    meta = gguf_metadata(reader)
    arch = gguf_architecture(meta, gguf_file)
    tokenizer_files = build_tokenizer_files(meta, gguf_file)  # before the weights: fail fast
    tensors = convert_tensors(reader, meta, arch, torch_dtype, gguf_file)
    config = hf_config(meta, arch, tie_word_embeddings="lm_head.weight" not in tensors, dtype=dtype)
    if config["vocab_size"] != tensors["model.embed_tokens.weight"].shape[0]:
        raise ModelLoadError(
            f"{gguf_file.name}: the token embedding has {tensors['model.embed_tokens.weight'].shape[0]} rows "
            f"but the metadata says vocab_size {config['vocab_size']}"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    for name, content in tokenizer_files.items():
        (out_dir / name).write_text(content, encoding="utf-8")
    source = {
        "gguf_file": gguf_file.name,
        "general.name": meta.get("general.name"),
        "projection_types": projection_types(reader),
    }
    (out_dir / "kvpilot_source.json").write_text(json.dumps(source, indent=2) + "\n")
    # written last: its presence marks a complete conversion
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def source_projection_types(model_dir: str | Path) -> dict[str, int]:
    """The projection types a converted GGUF directory came from ({} for anything else)."""
    path = Path(model_dir) / "kvpilot_source.json"
    if not path.is_file():
        return {}
    types = json.loads(path.read_text()).get("projection_types")
    return types if isinstance(types, dict) else {}


def gguf_architecture(meta: dict[str, Any], gguf_file: Path) -> str:
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(f"{gguf_file.name}: GGUF metadata lacks general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{gguf_file.name}: GGUF architecture {arch!r} is not supported; "
            f"supported: {', '.join(ARCHITECTURES)}"
        )
    return arch


def hf_config(meta: dict[str, Any], arch: str, *, tie_word_embeddings: bool, dtype: str) -> dict[str, Any]:
    """config.json fields from the <arch>.* metadata."""
    heads = require_int(meta, f"{arch}.attention.head_count")
    hidden = require_int(meta, f"{arch}.embedding_length")
    kv_heads = meta.get(f"{arch}.attention.head_count_kv") or heads
    tokens = meta.get("tokenizer.ggml.tokens") or []
    vocab = meta.get(f"{arch}.vocab_size") or len(tokens)
    scaling_type = meta.get(f"{arch}.rope.scaling.type")
    rope_scaling = None
    if scaling_type not in (None, "none"):
        if scaling_type != "linear":
            raise UnsupportedModelError(f"GGUF rope scaling type {scaling_type!r} is not supported")
        rope_scaling = {"rope_type": "linear", "factor": float(meta[f"{arch}.rope.scaling.factor"])}
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": MODEL_TYPES[arch],
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": require_int(meta, f"{arch}.feed_forward_length"),
        "num_hidden_layers": require_int(meta, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv_heads),
        "head_dim": int(meta.get(f"{arch}.attention.key_length") or hidden // heads),
        "hidden_act": "silu",
        "max_position_embeddings": int(meta.get(f"{arch}.context_length") or 2048),
        "rms_norm_eps": float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": tie_word_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": dtype,
    }
    for key in ("bos", "eos", "padding"):
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
        if isinstance(token_id, int):
            config["pad_token_id" if key == "padding" else f"{key}_token_id"] = token_id
    return config
