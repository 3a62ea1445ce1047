"""Request admission, without an engine: prompt ids in the vocabulary, max_tokens within the room left."""

from __future__ import annotations

import pytest
from kvpilot.runtime.engine.admission import max_tokens_for, prompt_token_ids
from kvpilot.runtime.errors import InvalidRequestError


class _Tokenizer:
    def encode(self, text: str) -> list[int]:
        return [ord(c) % 50 for c in text]


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "prompt is empty"),
        ("", "prompt is empty"),
        ([1, 50], r"prompt token id 50 is not in the vocabulary \[0, 50\)"),
        ([1, -1], "prompt token id -1"),
        ([True], "prompt token id True"),
        ([1.0], "prompt token id 1.0"),
        (7, "a string or a list of token ids"),
    ],
)
def test_bad_prompts_are_refused_naming_the_field(prompt: object, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message) as err:
        prompt_token_ids(prompt, _Tokenizer(), 50)  # type: ignore[arg-type]
    assert err.value.param == "prompt"


def test_prompts_become_token_ids() -> None:
    assert prompt_token_ids("ab", _Tokenizer(), 50) == [47, 48]
    assert prompt_token_ids((3, 4), _Tokenizer(), 50) == [3, 4]


def test_max_tokens_within_the_smaller_of_model_length_and_cache() -> None:
    assert max_tokens_for(10, None, max_model_len=100, kv_capacity=1000) == 90
    assert max_tokens_for(10, None, max_model_len=100, kv_capacity=40) == 30
    assert max_tokens_for(10, 30, max_model_len=100, kv_capacity=40) == 30
    with pytest.raises(
        InvalidRequestError, match="exceeds the limit of 40: the KV cache holds only 40"
    ) as err:
        max_tokens_for(10, 31, max_model_len=100, kv_capacity=40)
    assert err.value.param == "max_tokens"
    with pytest.raises(InvalidRequestError, match="leaving no room to generate: max_model_len is 100"):
        max_tokens_for(100, None, max_model_len=100, kv_capacity=1000)
