"""Per-request sampling parameters, validated once at the edge (pure Python, no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpilot.runtime.errors import InvalidRequestError

MAX_LOGPROBS = 20
MAX_INT32 = 2**31 - 1  # counts and top_k beyond this are refused (they overflow the sampler's tensors)
GREEDY_TEMPERATURE = 1e-5  # temperatures below this sample greedily, as in vLLM


@dataclass
class SamplingParams:
    """What to generate and how. Field names and semantics follow vLLM's SamplingParams.

    A temperature below GREEDY_TEMPERATURE (0, say) is greedy. top_k <= 0 disables top-k. A seed makes
    sampling reproducible regardless of which other requests share the batch (the sampler derives the random
    stream from (seed, index of the generated token)).
    """

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # number of top alternatives to return (0 = only the chosen token)
    # logprob of every prompt token after the first (+ this many top alternatives); such a request
    # never reuses cached prefix blocks, since cached tokens get no logits (as in vLLM)
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    detokenize: bool = True  # False: token ids only (benchmarks feed and read ids)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        self._validate()

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    def _validate(self) -> None:
        checks: list[tuple[bool, str, str]] = [
            (
                self.max_tokens is None or 1 <= self.max_tokens <= MAX_INT32,
                "max_tokens",
                f"must be in [1, {MAX_INT32}]",
            ),
            (0.0 <= self.temperature <= 100.0, "temperature", "must be in [0, 100]"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (
                -1 <= self.top_k <= MAX_INT32,
                "top_k",
                f"must be -1, 0 (disabled) or a positive integer up to {MAX_INT32}",
            ),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]"),
            (0.0 < self.repetition_penalty <= 10.0, "repetition_penalty", "must be in (0, 10]"),
            (0 <= self.min_tokens <= MAX_INT32, "min_tokens", f"must be in [0, {MAX_INT32}]"),
            (
                self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
                "logprobs",
                f"must be in [0, {MAX_LOGPROBS}]",
            ),
            (
                self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS,
                "prompt_logprobs",
                f"must be in [0, {MAX_LOGPROBS}]",
            ),
            (all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings"),
            (
                all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
                "stop_token_ids",
                "must be non-negative integers",
            ),
        ]
        for ok, param, rule in checks:
            if not ok:
                raise InvalidRequestError(f"{param} {rule}, got {getattr(self, param)!r}", param=param)
