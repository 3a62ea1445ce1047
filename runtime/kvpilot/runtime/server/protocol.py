"""OpenAI request bodies (pydantic, strict types, unknown fields ignored) and their SamplingParams.

Field names are OpenAI's; the extensions top_k, min_p, repetition_penalty, ignore_eos, min_tokens,
stop_token_ids, skip_special_tokens, include_stop_str_in_output, add_generation_prompt and (completions)
prompt_logprobs are vLLM's.
Range checks live in SamplingParams (one place); this module checks types, OpenAI-only rules and the
sizes a client could use to make one request expensive: every integer fits 32 bits (a seed 64), floats are
finite, and lists (stop strings, stop token ids, prompts, messages) have bounded length.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Literal

from kvpilot.runtime.errors import InvalidRequestError
from kvpilot.runtime.sampling_params import MAX_LOGPROBS, SamplingParams
from kvpilot.runtime.server.openai_errors import (
    APIError,
    from_invalid_request,
    from_validation_error,
    invalid_request,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_CHOICES = 128
MAX_GENERATIONS = 1024  # prompts x n in one HTTP request
MAX_STOP_STRINGS = 64  # stop strings per request (OpenAI allows 4); matching cost does not grow with it
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 1024
MAX_MESSAGES = 4096
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
Prompt = str | list[int]

# Bounded numbers: huge integers (10**400) or counts are refused here with a 400 naming the field, so
# nothing downstream (the sampler, msgpack to the engine core) ever sees a value it cannot represent.
Int32 = Annotated[int, Field(ge=-INT32_MAX - 1, le=INT32_MAX)]
Count = Annotated[int, Field(ge=0, le=INT32_MAX)]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
StopString = Annotated[str, Field(max_length=MAX_STOP_STRING_CHARS)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False


class _GenerationRequest(_Strict):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str = Field(max_length=1024)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    temperature: float | None = None
    top_p: float | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    seed: Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM extensions
    top_k: Int32 | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: Count = 0
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def _check_common(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise invalid_request("stream_options is only allowed when stream is true", "stream_options")
        if self.logit_bias:
            raise invalid_request("logit_bias is not supported by this server", "logit_bias")

    def _base_params(
        self, max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None = None
    ) -> SamplingParams:
        if max_tokens is not None and self.min_tokens > max_tokens:
            raise invalid_request(
                f"min_tokens ({self.min_tokens}) must be less than or equal to max_tokens ({max_tokens})",
                "min_tokens",
            )
        fields: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "seed": self.seed,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "stop": [] if self.stop is None else self.stop,
            "stop_token_ids": self.stop_token_ids or [],
            "ignore_eos": self.ignore_eos,
            "min_tokens": self.min_tokens,
            "logprobs": logprobs,
            "prompt_logprobs": prompt_logprobs,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
        }
        try:
            return SamplingParams(**{k: v for k, v in fields.items() if v is not None or k == "max_tokens"})
        except InvalidRequestError as err:
            raise from_invalid_request(err) from err

    def per_choice(self, params: SamplingParams) -> list[SamplingParams]:
        """`n` choices are `n` engine requests; a seed is offset per choice so the choices differ."""
        if params.seed is None:
            return [params] * self.n
        return [replace(params, seed=params.seed + i) for i in range(self.n)]


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: Count | None = 16
    logprobs: Int32 | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: Int32 | None = None
    prompt_logprobs: Int32 | None = None  # vLLM extension: logprobs of the prompt tokens (+ top-k)

    def prompts(self) -> list[Prompt]:
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise invalid_request("prompt must not be empty", "prompt")
        if isinstance(prompt[0], int):
            return [list(prompt)]
        if len(prompt) * self.n > MAX_GENERATIONS:
            raise invalid_request(
                f"{len(prompt)} prompts x n={self.n} asks for more than {MAX_GENERATIONS} "
                "generations in one request",
                "prompt",
            )
        return list(prompt)

    def sampling_params(self) -> list[SamplingParams]:
        self._check_common()
        if self.echo:
            raise invalid_request("echo is not supported by this server", "echo")
        if self.suffix is not None:
            raise invalid_request("suffix is not supported by this server", "suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise invalid_request("best_of must be equal to n (beam search is not supported)", "best_of")
        return self.per_choice(self._base_params(self.max_tokens, self.logprobs, self.prompt_logprobs))


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def as_template_input(self) -> dict[str, str]:
        content = self.content
        if isinstance(content, list):
            content = "\n".join(part.text for part in content)
        message = {"role": self.role, "content": content or ""}
        if self.name is not None:
            message["name"] = self.name
        return message


class ResponseFormat(_Strict):
    type: Literal["text"]


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    logprobs: bool = False
    top_logprobs: Int32 | None = None
    add_generation_prompt: bool = True
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None

    def template_messages(self) -> list[dict[str, str]]:
        return [m.as_template_input() for m in self.messages]

    def sampling_params(self) -> list[SamplingParams]:
        self._check_common()
        if self.tools:
            raise invalid_request("tool calling is not supported by this server", "tools")
        if self.tool_choice not in (None, "none"):
            raise invalid_request("tool calling is not supported by this server", "tool_choice")
        if self.top_logprobs is not None and not self.logprobs:
            raise invalid_request("top_logprobs requires logprobs to be true", "top_logprobs")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_LOGPROBS:
            raise invalid_request(
                f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {self.top_logprobs}", "top_logprobs"
            )
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self.per_choice(self._base_params(max_tokens, logprobs))


def parse_request(model: type[_GenerationRequest], body: bytes) -> Any:
    """Validates a JSON body; any problem becomes a 400 APIError."""
    try:
        return model.model_validate_json(body)
    except ValidationError as err:
        raise from_validation_error(err) from err


__all__ = ["APIError", "ChatCompletionRequest", "CompletionRequest", "Prompt", "parse_request"]
