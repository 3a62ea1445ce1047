"""The tokenizer files of a converted GGUF (gguf_model.convert_gguf): tokenizer.json built with the
`tokenizers` library from the GGUF's BPE vocabulary and merges (tokenizer.ggml.*), control tokens as special
added tokens and the pre-tokenizer llama.cpp uses for tokenizer.ggml.pre; tokenizer_config.json and
generation_config.json from the same metadata."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvpilot.runtime.errors import ModelLoadError, UnsupportedModelError

# Pre-tokenizer regexes, as llama.cpp (llama-vocab.cpp) and the original tokenizer.json files define them.
_GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> how text is split before BPE
PRE_TOKENIZERS = ("default", "gpt2", "smollm", "llama-bpe", "llama3", "qwen2")

# GGUF token types (gguf.TokenType): CONTROL and USER_DEFINED tokens are added tokens, never split
_CONTROL, _USER_DEFINED = 3, 4


def _pre_tokenizer(pre: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre in ("default", "gpt2"):
        return byte_level
    if pre == "smollm":  # digits one by one, then GPT-2's split (SmolLM's own tokenizer.json)
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    pattern = {"llama-bpe": _LLAMA3_PATTERN, "llama3": _LLAMA3_PATTERN, "qwen2": _QWEN2_PATTERN}.get(pre)
    if pattern is None:
        raise UnsupportedModelError(
            f"GGUF pre-tokenizer {pre!r} is not supported; supported: {', '.join(PRE_TOKENIZERS)}"
        )
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )


def _token_id_text(meta: dict[str, Any], key: str, tokens: list[str]) -> str | None:
    token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
    if isinstance(token_id, int) and 0 <= token_id < len(tokens):
        return tokens[token_id]
    return None


def build_tokenizer_files(meta: dict[str, Any], gguf_file: Path) -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json and generation_config.json text from tokenizer.ggml.*."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    model = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if model is None or not tokens:
        raise ModelLoadError(
            f"{gguf_file.name}: the GGUF has no tokenizer section (tokenizer.ggml.model/tokens missing); "
            "kvpilot needs the tokenizer inside the file"
        )
    if model != "gpt2":
        raise UnsupportedModelError(
            f"{gguf_file.name}: GGUF tokenizer model {model!r} is not supported; only byte-level BPE "
            "('gpt2', as Llama 3, Qwen and SmolLM use)"
        )
    merges = meta.get("tokenizer.ggml.merges")
    if not merges:
        raise ModelLoadError(f"{gguf_file.name}: the BPE tokenizer has no merges (tokenizer.ggml.merges)")
    pre = meta.get("tokenizer.ggml.pre") or "default"
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ModelLoadError(f"{gguf_file.name}: the tokenizer vocabulary has duplicate tokens")
    try:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
    except Exception as exc:  # the tokenizers library raises bare Exceptions
        raise ModelLoadError(f"{gguf_file.name}: the BPE vocabulary/merges are inconsistent: {exc}") from exc
    tokenizer = Tokenizer(bpe)
    if pre == "qwen2":
        tokenizer.normalizer = normalizers.NFC()
    try:
        tokenizer.pre_tokenizer = _pre_tokenizer(pre)
    except UnsupportedModelError as exc:
        raise UnsupportedModelError(f"{gguf_file.name}: {exc}") from exc
    tokenizer.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or []
    special = [i for i, t in enumerate(types) if t in (_CONTROL, _USER_DEFINED)]
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i in special if types[i] == _CONTROL]
    )
    tokenizer.add_tokens(
        [AddedToken(tokens[i], special=False, normalized=False) for i in special if types[i] != _CONTROL]
    )
    bos = _token_id_text(meta, "bos", tokens)
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
    if add_bos:
        bos_id = vocab[bos]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    if tokenizer.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise ModelLoadError(f"{gguf_file.name}: the rebuilt tokenizer does not match the vocabulary size")
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get(f"{meta.get('general.architecture')}.context_length") or 2048),
    }
    for key, name in (("bos", "bos_token"), ("eos", "eos_token"), ("unknown", "unk_token")):
        text = _token_id_text(meta, key, tokens)
        if text is not None:
            config[name] = text
    pad = _token_id_text(meta, "padding", tokens)
    if pad is not None:
        config["pad_token"] = pad
    if add_bos:
        config["add_bos_token"] = True
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        config["chat_template"] = template
    eos_ids = sorted(
        {meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in meta}
    )
    generation: dict[str, Any] = {}
    if eos_ids:
        generation["eos_token_id"] = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    bos_token_id = meta.get("tokenizer.ggml.bos_token_id")
    if isinstance(bos_token_id, int):
        generation["bos_token_id"] = bos_token_id
    return {
        "tokenizer.json": tokenizer.to_str(),
        "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n",
        "generation_config.json": json.dumps(generation, indent=2) + "\n",
    }
