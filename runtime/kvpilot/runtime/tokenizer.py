"""The serving tokenizer: Hugging Face's fast tokenizer file read with the `tokenizers` library (no
transformers at runtime), plus what tokenizer_config.json and generation_config.json say about special
tokens and the chat template."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from kvpilot.runtime.errors import InvalidRequestError, ModelLoadError
from kvpilot.runtime.gguf_model import resolve_model_dir
from tokenizers import Tokenizer as FastTokenizer


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return data


def _token_text(value: Any) -> str | None:
    """Special tokens appear as a string or as {"content": ...} in tokenizer_config.json."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(model_dir: Path, config: dict[str, Any]) -> str | None:
    """chat_template.jinja (transformers 5 layout) wins over tokenizer_config.json's chat_template; a
    list of named templates yields the one named "default"."""
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile like transformers does: sandboxed, trim_blocks/lstrip_blocks, loop controls, tojson,
    raise_exception and strftime_now available to the template."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateError as exc:
        raise ModelLoadError(f"the chat template does not compile: {exc}") from exc


class Tokenizer:
    def __init__(
        self,
        fast: FastTokenizer,
        *,
        bos_token: str | None,
        eos_token: str | None,
        extra_eos_token_ids: Sequence[int] = (),
        chat_template: str | None = None,
    ) -> None:
        self._fast = fast
        self.bos_token, self.eos_token = bos_token, eos_token
        self.bos_token_id: int | None = fast.token_to_id(bos_token) if bos_token else None
        eos_id = fast.token_to_id(eos_token) if eos_token else None
        self.eos_token_ids: frozenset[int] = frozenset(
            [*([eos_id] if eos_id is not None else []), *extra_eos_token_ids]
        )
        self.vocab_size: int = fast.get_vocab_size(with_added_tokens=True)
        self.chat_template = chat_template
        self._compiled = compile_chat_template(chat_template) if chat_template else None

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer:
        model_dir = resolve_model_dir(model_dir)  # a GGUF model: its converted copy
        tokenizer_file = model_dir / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ModelLoadError(f"tokenizer.json not found in {model_dir} (a fast tokenizer is required)")
        try:
            fast = FastTokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # the tokenizers library raises a bare Exception on bad files
            raise ModelLoadError(f"cannot read {tokenizer_file}: {exc}") from exc
        config_file = model_dir / "tokenizer_config.json"
        config = _read_json(config_file) if config_file.is_file() else {}
        generation_file = model_dir / "generation_config.json"
        generation = _read_json(generation_file) if generation_file.is_file() else {}
        extra_eos = generation.get("eos_token_id")
        extra_eos = [extra_eos] if isinstance(extra_eos, int) else list(extra_eos or [])
        return cls(
            fast,
            bos_token=_token_text(config.get("bos_token")),
            eos_token=_token_text(config.get("eos_token")),
            extra_eos_token_ids=extra_eos,
            chat_template=_chat_template(model_dir, config),
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._fast.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._fast.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._fast.token_to_id(token)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **template_kwargs: Any
    ) -> str:
        """Render the conversation as a prompt string (extra kwargs, e.g. tools, go to the template)."""
        if self._compiled is None:
            raise InvalidRequestError(
                "this model has no chat template; use the completions API or a model with one",
                param="messages",
            )
        try:
            return self._compiled.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                **template_kwargs,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise InvalidRequestError(f"cannot apply the chat template: {exc}", param="messages") from exc
