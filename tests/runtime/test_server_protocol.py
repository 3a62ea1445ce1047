"""Request parsing and the mapping to SamplingParams (pure, no server)."""

from __future__ import annotations

import json

import pytest
from kvpilot.runtime.server.openai_errors import APIError
from kvpilot.runtime.server.protocol import ChatCompletionRequest, CompletionRequest, parse_request
from kvpilot.runtime.server.responses import ChoiceState, usage


def completion(**fields: object) -> CompletionRequest:
    return parse_request(CompletionRequest, json.dumps({"model": "m", "prompt": "x", **fields}).encode())


def chat(**fields: object) -> ChatCompletionRequest:
    return parse_request(
        ChatCompletionRequest,
        json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], **fields}).encode(),
    )


def test_fields_map_to_sampling_params() -> None:
    [params] = completion(
        max_tokens=7,
        temperature=0,
        top_p=0.5,
        top_k=3,
        min_p=0.1,
        stop="END",
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        ignore_eos=True,
        logprobs=2,
        seed=5,
        user="u1",
    ).sampling_params()
    assert (params.max_tokens, params.temperature, params.top_p) == (7, 0, 0.5)
    assert (params.top_k, params.min_p) == (3, 0.1)
    assert params.stop == ["END"] and params.ignore_eos and params.logprobs == 2 and params.seed == 5
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -0.5, 1.2)


def test_defaults_follow_openai() -> None:
    [params] = completion().sampling_params()
    assert params.max_tokens == 16 and params.temperature == 1.0 and params.logprobs is None
    [chat_params] = chat().sampling_params()
    assert chat_params.max_tokens is None  # the engine fills in max_model_len - prompt length


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    [params] = chat(max_tokens=10, max_completion_tokens=4).sampling_params()
    assert params.max_tokens == 4


def test_n_choices_get_offset_seeds() -> None:
    assert [p.seed for p in completion(n=3, seed=7).sampling_params()] == [7, 8, 9]
    assert [p.seed for p in completion(n=2).sampling_params()] == [None, None]


def test_chat_logprobs_map_to_top_count() -> None:
    assert chat(logprobs=True, top_logprobs=4).sampling_params()[0].logprobs == 4
    assert chat(logprobs=True).sampling_params()[0].logprobs == 0
    assert chat().sampling_params()[0].logprobs is None


def test_prompt_forms() -> None:
    assert completion(prompt="a").prompts() == ["a"]
    assert completion(prompt=["a", "b"]).prompts() == ["a", "b"]
    assert completion(prompt=[1, 2]).prompts() == [[1, 2]]
    assert completion(prompt=[[1], [2, 3]]).prompts() == [[1], [2, 3]]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": "1"}, "temperature"),
        ({"n": 1.5}, "n"),
        ({"stream": "yes"}, "stream"),
        ({"prompt": ["a", 1]}, "prompt"),
        ({"stop": 3}, "stop"),
        ({"seed": "1"}, "seed"),
    ],
)
def test_wrong_types_are_400_naming_the_field(fields: dict, param: str) -> None:
    with pytest.raises(APIError) as exc:
        completion(**fields)
    assert exc.value.status == 400 and exc.value.param == param


def test_too_many_generations_in_one_request_is_400() -> None:
    with pytest.raises(APIError) as exc:
        completion(prompt=["p"] * 20, n=100).prompts()
    assert exc.value.status == 400 and "1024" in exc.value.message


def test_unknown_fields_are_ignored() -> None:
    assert completion(frobnicate=True, metadata={"a": 1}).prompts() == ["x"]


def test_usage_counts_a_shared_prompt_once() -> None:
    choices = [
        ChoiceState(0, True, num_prompt_tokens=5, num_output_tokens=3),
        ChoiceState(1, False, num_prompt_tokens=5, num_output_tokens=4),
    ]
    assert usage(choices)["prompt_tokens"] == 5 and usage(choices)["completion_tokens"] == 7
    assert usage(choices)["total_tokens"] == 12


# ---- hostile or sloppy input (issue 17): each is a 400 naming the field, never a 500 downstream


def error_of(make: object, **fields: object) -> APIError:
    with pytest.raises(APIError) as exc:
        request = make(**fields)  # type: ignore[operator]
        request.sampling_params()
    assert exc.value.status == 400
    return exc.value


def test_model_is_required() -> None:
    with pytest.raises(APIError) as exc:
        parse_request(CompletionRequest, b'{"prompt": "x"}')
    assert exc.value.status == 400 and exc.value.param == "model"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_k": 10**400}, "top_k"),
        ({"top_k": 2**40}, "top_k"),
        ({"max_tokens": 2**63}, "max_tokens"),
        ({"seed": 2**64}, "seed"),
        ({"min_tokens": 2**40}, "min_tokens"),
        ({"stop_token_ids": [2**40]}, "stop_token_ids"),
        ({"prompt": [2**40]}, "prompt"),
    ],
)
def test_huge_numbers_are_400(fields: dict, param: str) -> None:
    assert error_of(completion, **fields).param == param


def test_non_finite_floats_are_400() -> None:
    with pytest.raises(APIError) as exc:
        parse_request(CompletionRequest, b'{"model": "m", "prompt": "x", "temperature": NaN}')
    assert exc.value.status == 400 and exc.value.param == "temperature"


def test_min_tokens_above_max_tokens_is_400() -> None:
    assert error_of(completion, min_tokens=10, max_tokens=5).param == "min_tokens"
    assert error_of(chat, min_tokens=10, max_completion_tokens=5).param == "min_tokens"
    assert completion(min_tokens=5, max_tokens=5).sampling_params()[0].min_tokens == 5


def test_empty_stop_string_is_400() -> None:
    assert error_of(completion, stop="").param == "stop"
    assert error_of(completion, stop=["a", ""]).param == "stop"


def test_stop_strings_are_bounded_in_count_and_length() -> None:
    assert error_of(completion, stop=[f"s{i}" for i in range(100_000)]).param == "stop"
    assert error_of(completion, stop="x" * 10_000).param == "stop"
    assert error_of(completion, stop_token_ids=list(range(5000))).param == "stop_token_ids"
    assert len(completion(stop=[f"s{i}" for i in range(64)]).sampling_params()[0].stop) == 64


def test_top_logprobs_error_names_top_logprobs() -> None:
    err = error_of(chat, logprobs=True, top_logprobs=1000)
    assert err.param == "top_logprobs" and "top_logprobs" in err.message


def test_lone_surrogate_gets_a_clear_message() -> None:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}'
    with pytest.raises(APIError) as exc:
        parse_request(ChatCompletionRequest, body)
    assert exc.value.status == 400 and "surrogate" in exc.value.message


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000 + b"]" * 100_000, b'{"model": "m", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}"],
)
def test_deep_nesting_and_huge_integer_literals_are_400(body: bytes) -> None:
    with pytest.raises(APIError) as exc:
        parse_request(CompletionRequest, body)
    assert exc.value.status == 400
