"""Our Tokenizer (tokenizers library) agrees with transformers' AutoTokenizer on the same files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from kvpilot.runtime.errors import InvalidRequestError, ModelLoadError
from kvpilot.runtime.tokenizer import Tokenizer

TEXTS = [
    "",
    "Hello world",
    "The lighthouse keeper kept a notebook for every season.",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "<|im_start|>user\nhi there<|im_end|>\n",
    "Zürich, naïve café, 東京 and an emoji 😀 — unseen-in-training: qzxjkv",
    "def f(x):\n    return x ** 2  # square\n",
]
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of Canada?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye 👋"},
    ],
]


@pytest.fixture(scope="module", params=["llama3", "qwen3"])
def both(request: pytest.FixtureRequest, tiny_checkpoint_factory: Callable) -> tuple[Tokenizer, object]:
    from transformers import AutoTokenizer

    path = tiny_checkpoint_factory(request.param)
    return Tokenizer.from_dir(path), AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_matches_transformers(both: tuple, text: str, add_special_tokens: bool) -> None:
    ours, theirs = both
    assert ours.encode(text, add_special_tokens) == theirs.encode(text, add_special_tokens=add_special_tokens)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_matches_transformers(both: tuple, text: str, skip_special_tokens: bool) -> None:
    ours, theirs = both
    ids = ours.encode(text)
    expected = theirs.decode(ids, skip_special_tokens=skip_special_tokens)
    assert ours.decode(ids, skip_special_tokens) == expected
    if not skip_special_tokens and ours.bos_token_id is None:
        assert ours.decode(ids, skip_special_tokens) == text  # byte-level BPE round-trips exactly


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(
    both: tuple, conversation: list, add_generation_prompt: bool
) -> None:
    ours, theirs = both
    expected = theirs.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours.apply_chat_template(conversation, add_generation_prompt) == expected
    assert expected.endswith("<|im_start|>assistant\n") == add_generation_prompt


def test_special_token_ids(both: tuple) -> None:
    ours, theirs = both
    assert ours.vocab_size == len(theirs)
    assert ours.bos_token_id == theirs.bos_token_id
    assert theirs.eos_token_id in ours.eos_token_ids
    generation = json.loads((Path(theirs.name_or_path) / "generation_config.json").read_text())
    assert set(generation["eos_token_id"]) <= ours.eos_token_ids


def test_llama_style_prepends_bos_and_qwen_does_not(llama3_checkpoint: Path, qwen3_checkpoint: Path) -> None:
    llama, qwen = Tokenizer.from_dir(llama3_checkpoint), Tokenizer.from_dir(qwen3_checkpoint)
    assert llama.bos_token_id is not None and llama.encode("hi")[0] == llama.bos_token_id
    assert llama.encode("hi", add_special_tokens=False) == llama.encode("hi")[1:]
    assert qwen.bos_token_id is None and qwen.encode("hi") == qwen.encode("hi", add_special_tokens=False)
    assert qwen.eos_token_ids == {qwen.token_to_id("<|im_end|>"), qwen.token_to_id("<|endoftext|>")}


def test_missing_tokenizer_file_is_named(qwen3_checkpoint: Path, copy_checkpoint: Callable) -> None:
    path = copy_checkpoint(qwen3_checkpoint)
    (path / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json not found"):
        Tokenizer.from_dir(path)


def test_corrupt_tokenizer_file(qwen3_checkpoint: Path, copy_checkpoint: Callable) -> None:
    path = copy_checkpoint(qwen3_checkpoint)
    (path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": 12')
    with pytest.raises(ModelLoadError, match=r"cannot read .*tokenizer\.json"):
        Tokenizer.from_dir(path)


def test_no_chat_template_is_a_request_error(qwen3_checkpoint: Path, copy_checkpoint: Callable) -> None:
    path = copy_checkpoint(qwen3_checkpoint)
    config = json.loads((path / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = Tokenizer.from_dir(path)
    assert tokenizer.chat_template is None
    with pytest.raises(InvalidRequestError, match="no chat template") as info:
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert info.value.param == "messages"


def test_template_jinja_file_wins_and_raise_exception_is_a_request_error(
    qwen3_checkpoint: Path, copy_checkpoint: Callable
) -> None:
    path = copy_checkpoint(qwen3_checkpoint)
    (path / "chat_template.jinja").write_text(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be from the user') }}"
        "{% endif %}{{ bos_token }}{{ messages | tojson }}"
    )
    tokenizer = Tokenizer.from_dir(path)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "é"}])
    assert rendered == '[{"role": "user", "content": "é"}]'
    with pytest.raises(InvalidRequestError, match="first message must be from the user"):
        tokenizer.apply_chat_template([{"role": "assistant", "content": "hi"}])


def test_template_kwargs_reach_the_template(qwen3_checkpoint: Path, copy_checkpoint: Callable) -> None:
    path = copy_checkpoint(qwen3_checkpoint)
    (path / "chat_template.jinja").write_text("{{ 'think' if enable_thinking else 'no-think' }}")
    tokenizer = Tokenizer.from_dir(path)
    assert tokenizer.apply_chat_template([], enable_thinking=True) == "think"
    assert tokenizer.apply_chat_template([], enable_thinking=False) == "no-think"
