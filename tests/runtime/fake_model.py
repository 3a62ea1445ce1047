"""A torch-free stand-in for the model side: runner, tokenizer and sampler with the contract's shapes.

The fake "model" keeps a real paged KV store (a dict from slot to token) and computes its logits for a
sequence from the tokens it reads back through the block table, never from the request: a wrong slot,
a stale or unwritten block, a bad prefix-cache hit or a broken preemption changes the output (or raises).
Scheduler, engine and server tests use it to run in milliseconds without weights.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from kvpilot.runtime.engine.batch import SeqChunk, StepBatch

LogitsFn = Callable[[Sequence[int]], list[float]]
EOS_TOKEN_ID = 0
NUM_BYTE_TOKENS = 256
PIECES = [
    "the",
    " the",
    " cat",
    " sat",
    " on",
    " mat",
    "ing",
    "er",
    " a",
    "STOP",
    "ST",
    "OP",
    "</s",
    "s>",
    "\n\n",
    "##",
    "é",
    "€",
]


def hashed_logits(vocab_size: int) -> LogitsFn:
    """Pseudo-random logits that depend on every token of the context (and only on it)."""

    def logits(context: Sequence[int]) -> list[float]:
        rng = random.Random(hash(tuple(context)))
        return [rng.random() for _ in range(vocab_size)]

    return logits


class FakeTokenizer:
    """Byte-level: ids 1..256 are single bytes, then multi-byte pieces; id 0 is the special EOS."""

    def __init__(self) -> None:
        self.vocab: list[bytes] = [b"<eos>"] + [bytes([b]) for b in range(NUM_BYTE_TOKENS)]
        self.vocab += [p.encode() for p in PIECES]
        self.vocab_size = len(self.vocab)
        self.eos_token_ids = frozenset({EOS_TOKEN_ID})
        self.bos_token_id: int | None = None
        self.chat_template: str | None = None
        self._by_bytes = {v: i for i, v in enumerate(self.vocab) if i != EOS_TOKEN_ID}
        self._longest = max(len(v) for v in self.vocab)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        data, ids, i = text.encode(), [], 0
        while i < len(data):
            for n in range(min(self._longest, len(data) - i), 0, -1):
                token = self._by_bytes.get(data[i : i + n])
                if token is not None:
                    ids.append(token)
                    i += n
                    break
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        special = {EOS_TOKEN_ID} if skip_special_tokens else set()
        return b"".join(self.vocab[i] for i in ids if i not in special).decode("utf-8", errors="replace")


@dataclass
class FakeRunner:
    """Paged "KV cache" of tokens; logits_fn(context read back from the cache) gives each row's logits."""

    num_kv_blocks: int = 64
    block_size: int = 4
    max_model_len: int = 256
    vocab_size: int = NUM_BYTE_TOKENS + 1 + len(PIECES)
    logits_fn: LogitsFn | None = None
    fail_on_token: int | None = None  # execute() raises when a chunk contains it (a "poisoned" request)
    batches: list[StepBatch] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.model_config = SimpleNamespace(vocab_size=self.vocab_size)
        self.kv: dict[int, int] = {}
        if self.logits_fn is None:
            self.logits_fn = hashed_logits(self.vocab_size)

    def _slot(self, chunk: SeqChunk, pos: int) -> int:
        return chunk.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def execute(self, batch: StepBatch, prev_sampled: FakeSampledIds | None = None) -> list[list[float]]:
        """A negative token -1 - r is a placeholder for row r of the previous step's sampled ids."""
        self.batches.append(batch)
        inputs = [self._fill(chunk.token_ids, prev_sampled) for chunk in batch.chunks]
        if self.fail_on_token is not None and any(self.fail_on_token in ids for ids in inputs):
            raise ValueError(f"poisoned token {self.fail_on_token}")
        rows: list[list[float]] = []
        for chunk, token_ids in zip(batch.chunks, inputs, strict=True):
            if len(chunk.block_table) * self.block_size < chunk.context_len:
                raise IndexError(f"block table of seq {chunk.seq_id} too short for {chunk.context_len}")
            for i, token in enumerate(token_ids):
                self.kv[self._slot(chunk, chunk.start_pos + i)] = token
            if chunk.sample:
                context = [self.kv[self._slot(chunk, p)] for p in range(chunk.context_len)]
                rows.append(self.logits_fn(context))  # type: ignore[misc]
        return rows

    @staticmethod
    def _fill(token_ids: list[int], prev_sampled: FakeSampledIds | None) -> list[int]:
        if all(t >= 0 for t in token_ids):
            return token_ids
        if prev_sampled is None:
            raise ValueError("a placeholder token without the previous step's sampled ids")
        return [prev_sampled.ids[-1 - t] if t < 0 else t for t in token_ids]


class FakeSampledIds:
    """The fake "device" ids: `ids` feeds the next step, tolist() is the read-back the engine delays."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.read_back = False

    def tolist(self) -> list[int]:
        self.read_back = True
        return list(self.ids)


@dataclass(frozen=True)
class FakeSampledToken:
    token_id: int
    logprob: float | None
    top_logprobs: list[tuple[int, float]]


class FakeSampler:
    """Greedy over the allowed tokens; 'logprobs' are the raw logits (enough to check plumbing)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def sample(self, logits: Sequence[Sequence[float]], rows: Sequence[Any]) -> list[FakeSampledToken]:
        if len(logits) != len(rows):
            raise ValueError(f"{len(logits)} logit rows for {len(rows)} sample rows")
        return [self._one(list(row_logits), row) for row_logits, row in zip(logits, rows, strict=True)]

    def sample_ids(self, logits: Sequence[Sequence[float]], rows: Sequence[Any]) -> FakeSampledIds:
        if any(row.params.logprobs is not None for row in rows):
            raise ValueError("sample_ids gives no logprobs: use sample() for rows that ask for them")
        return FakeSampledIds([t.token_id for t in self.sample(logits, rows)])

    def _one(self, logits: list[float], row: Any) -> FakeSampledToken:
        token = greedy_token(logits, row.banned_token_ids)
        n = row.params.logprobs
        if n is None:
            return FakeSampledToken(token, None, [])
        top = sorted(range(len(logits)), key=lambda t: -logits[t])[:n]
        return FakeSampledToken(token, logits[token], [(t, logits[t]) for t in top])


def greedy_token(logits: Sequence[float], banned: frozenset[int] = frozenset()) -> int:
    return max((t for t in range(len(logits)) if t not in banned), key=lambda t: logits[t])


def reference_greedy(
    logits_fn: LogitsFn, prompt: Sequence[int], max_tokens: int, eos_token_id: int | None = None
) -> list[int]:
    """What a correct engine must generate with the fake model: greedy over the true context."""
    context, out = list(prompt), []
    for _ in range(max_tokens):
        token = greedy_token(logits_fn(context))
        out.append(token)
        context.append(token)
        if token == eos_token_id:
            break
    return out
