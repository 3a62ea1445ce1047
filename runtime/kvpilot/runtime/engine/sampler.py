"""Turning a step's logits into tokens: penalties, banned tokens, greedy or seeded random sampling,
and logprobs. One SampleRow per logits row (the runner returns them in chunk order)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import torch
from kvpilot.runtime.engine.output import TokenLogprob
from kvpilot.runtime.engine.sample_row import SampleRow, needs_penalties
from kvpilot.runtime.layers.logits_processing import (
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
    sample_with_noise,
)

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    logprob: float | None  # log_softmax of the raw logits; None unless params.logprobs is set
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)  # params.logprobs entries


def stream_seed(seed: int, index: int) -> int:
    """The generator seed for token `index` of a request seeded with `seed` (splitmix64 finaliser)."""
    x = (seed * 0x9E3779B97F4A7C15 + index + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & ((1 << 63) - 1)


def _check_rows(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    if logits.shape[0] != len(rows):
        raise ValueError(f"{logits.shape[0]} logits rows for {len(rows)} sample rows")


_PLAIN_GREEDY = attrgetter("plain_greedy")


@dataclass
class _RowPlan:
    """Which rows need what, found in one pass over the rows."""

    plain_greedy: list[int]  # greedy rows with nothing to process: the argmax of the raw logits
    processed: list[int]  # rows with banned tokens or penalties (greedy or random)
    random: list[int]  # rows sampled with temperature
    any_logprobs: bool

    @property
    def plain_greedy_only(self) -> bool:
        return not self.processed and not self.random

    @classmethod
    def of(cls, rows: list[SampleRow]) -> _RowPlan:
        if all(map(_PLAIN_GREEDY, rows)):  # the common case, one attribute per row
            return cls(list(range(len(rows))), [], [], False)
        plain_greedy: list[int] = []
        processed: list[int] = []
        random: list[int] = []
        any_logprobs = False
        for i, row in enumerate(rows):
            params = row.params
            if row.banned_token_ids or needs_penalties(params):
                processed.append(i)
                if not params.greedy:
                    random.append(i)
            elif not params.greedy:
                random.append(i)
            else:
                plain_greedy.append(i)
            if params.logprobs is not None:
                any_logprobs = True
        return cls(plain_greedy, processed, random, any_logprobs)


class SampledIds:
    """A step's sampled token ids, still on the device: `ids` feeds the next step's input ids there,
    tolist() reads them back. On CUDA they are copied to pinned memory as soon as they are sampled, so
    tolist() waits for this step only, not for the steps launched after it."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids
        self._host, self._ready = ids, None
        if ids.is_cuda:
            self._host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
            self._host.copy_(ids, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()

    def tolist(self) -> list[int]:
        if self._ready is not None:
            self._ready.synchronize()
        return self._host.tolist()


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}  # unseeded rows, per device

    def sample(self, logits: torch.Tensor, rows: list[SampleRow]) -> list[SampledToken]:
        _check_rows(logits, rows)
        if not rows:
            return []
        plan = _RowPlan.of(rows)
        # never modified: processing works on copies of the rows that need it; a plain argmax reads the
        # logits as they are (widening 16-bit values is exact, so the argmax is the same)
        raw = logits if plan.plain_greedy_only and not plan.any_logprobs else logits.float()
        token_ids: list[int] = self._token_ids(raw, rows, plan).tolist()  # one copy to the host
        if not plan.any_logprobs:
            return [SampledToken(token, None, []) for token in token_ids]
        return self._results(raw, token_ids, rows)

    def sample_ids(self, logits: torch.Tensor, rows: list[SampleRow]) -> SampledIds:
        """The token ids only (no logprobs), left on the device: nothing waits for the step to end."""
        _check_rows(logits, rows)
        plan = _RowPlan.of(rows)
        if plan.any_logprobs:
            raise ValueError("sample_ids gives no logprobs: use sample() for rows that ask for them")
        return SampledIds(self._token_ids(logits if plan.plain_greedy_only else logits.float(), rows, plan))

    def _token_ids(self, raw: torch.Tensor, rows: list[SampleRow], plan: _RowPlan) -> torch.Tensor:
        """Greedy rows: argmax of their (processed) logits; random rows: _sample_random."""
        if plan.plain_greedy_only:  # the common case: one argmax
            return raw.argmax(dim=-1)
        if plan.plain_greedy:
            token_ids = raw.argmax(dim=-1)  # every row: cheaper than gathering the plain greedy ones
        else:
            token_ids = torch.empty(len(rows), dtype=torch.long, device=raw.device)
        position = {i: k for k, i in enumerate(plan.processed)}
        processed = raw[:0]
        if plan.processed:
            processed = self._process(raw[plan.processed], [rows[i] for i in plan.processed])
            greedy = [i for i in plan.processed if rows[i].params.greedy]
            if greedy:
                token_ids[greedy] = processed[[position[i] for i in greedy]].argmax(dim=-1)
        if plan.random:
            random = raw[plan.random]
            moved = [(k, position[i]) for k, i in enumerate(plan.random) if i in position]
            if moved:
                random[[k for k, _ in moved]] = processed[[j for _, j in moved]]
            token_ids[plan.random] = self._sample_random(random, [rows[i] for i in plan.random])
        return token_ids

    def _process(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """Banned tokens to -inf, then penalties on the rows that ask for them."""
        vocab = logits.shape[-1]
        for i, row in enumerate(rows):
            banned = [t for t in row.banned_token_ids if 0 <= t < vocab]
            if banned:
                logits[i, banned] = float("-inf")
        penalised = [i for i, r in enumerate(rows) if needs_penalties(r.params)]
        if penalised:
            logits[penalised] = apply_penalties(
                logits[penalised], *self._penalty_inputs([rows[i] for i in penalised], vocab, logits.device)
            )
        return logits

    @staticmethod
    def _penalty_inputs(rows: list[SampleRow], vocab: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        def counts(ids: Sequence[int]) -> torch.Tensor:
            ids_t = torch.tensor([t for t in ids if 0 <= t < vocab], dtype=torch.long, device=device)
            return torch.bincount(ids_t, minlength=vocab)

        prompt_mask = torch.stack([counts(r.prompt_token_ids) > 0 for r in rows])
        output_counts = torch.stack([counts(r.output_token_ids) for r in rows])

        def column(name: str) -> torch.Tensor:
            return torch.tensor([getattr(r.params, name) for r in rows], dtype=torch.float32, device=device)

        return (
            prompt_mask,
            output_counts,
            column("repetition_penalty"),
            column("frequency_penalty"),
            column("presence_penalty"),
        )

    def probs(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """The distribution each random row is sampled from: banned tokens and penalties applied, then
        temperature, min_p, top_k and top_p. float32 [rows, vocab] (speculative verification's target)."""
        _check_rows(logits, rows)
        raw = logits.float().clone()
        processed = [i for i, r in enumerate(rows) if r.banned_token_ids or needs_penalties(r.params)]
        if processed:
            raw[processed] = self._process(raw[processed], [rows[i] for i in processed])
        return self._random_probs(raw, rows)

    def generator(self, device: torch.device) -> torch.Generator:
        """The generator of unseeded rows on `device` (speculative verification draws from it too)."""
        return self._generator(device)

    def _sample_random(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        probs = self._random_probs(logits, rows)
        return sample_with_noise(probs, self._noise(rows, logits.shape[-1], logits.device))

    def _random_probs(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        device, vocab = logits.device, logits.shape[-1]

        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        logits = logits / column([r.params.temperature for r in rows])[:, None]
        min_p = column([r.params.min_p for r in rows])
        if bool((min_p > 0).any()):
            logits = apply_min_p(logits, min_p)
        top_k = column([r.params.top_k if r.params.top_k > 0 else vocab for r in rows])
        top_p = column([r.params.top_p for r in rows])
        if bool((top_k < vocab).any() or (top_p < 1.0).any()):
            logits = apply_top_k_top_p(logits, top_k, top_p)
        return torch.softmax(logits, dim=-1)

    def _noise(self, rows: list[SampleRow], vocab: int, device: torch.device) -> torch.Tensor:
        """Exp(1) noise per row: from the request's own stream when seeded, else the sampler's."""
        noise = torch.empty(len(rows), vocab, device=device)
        unseeded = [i for i, r in enumerate(rows) if r.params.seed is None]
        if unseeded:
            noise[unseeded] = torch.empty(len(unseeded), vocab, device=device).exponential_(
                generator=self._generator(device)
            )
        for i, row in enumerate(rows):
            if row.params.seed is not None:
                generator = torch.Generator(device=device)
                generator.manual_seed(stream_seed(row.params.seed, len(row.output_token_ids)))
                noise[i].exponential_(generator=generator)
        return noise

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device)
            self._generators[device].manual_seed(self.seed)
        return self._generators[device]

    @staticmethod
    def results(raw: torch.Tensor, token_ids: list[int], rows: list[SampleRow]) -> list[SampledToken]:
        """SampledTokens for chosen `token_ids`, with the logprobs their rows ask for (from raw logits)."""
        return Sampler._results(raw.float(), token_ids, rows)

    @staticmethod
    def _results(raw: torch.Tensor, token_ids: list[int], rows: list[SampleRow]) -> list[SampledToken]:
        wanted = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        logprobs = torch.log_softmax(raw[wanted], dim=-1) if wanted else None
        position = {row_index: k for k, row_index in enumerate(wanted)}
        results = []
        for i, (token, row) in enumerate(zip(token_ids, rows, strict=True)):
            n = row.params.logprobs
            if n is None or logprobs is None:
                results.append(SampledToken(token, None, []))
                continue
            row_logprobs = logprobs[position[i]]
            top = torch.topk(row_logprobs, n) if n > 0 else None
            pairs = list(zip(top.indices.tolist(), top.values.tolist(), strict=True)) if top else []
            results.append(SampledToken(token, float(row_logprobs[token]), pairs))
        return results


PROMPT_LOGPROBS_SLICE = 512  # rows per log_softmax: bounds the temporaries of a long prompt chunk


def prompt_logprobs(logits: torch.Tensor, target_ids: Sequence[int], num_top: int) -> list[TokenLogprob]:
    """Prompt logprobs (vLLM's SamplingParams.prompt_logprobs): row i of `logits` predicts target_ids[i];
    each entry holds that token's log_softmax of the raw logits, its rank (1 + tokens more likely) and
    the num_top most likely tokens."""
    if logits.shape[0] != len(target_ids):
        raise ValueError(f"{logits.shape[0]} logits rows for {len(target_ids)} prompt tokens")
    out: list[TokenLogprob] = []
    for begin in range(0, len(target_ids), PROMPT_LOGPROBS_SLICE):
        targets = list(target_ids[begin : begin + PROMPT_LOGPROBS_SLICE])
        rows = torch.log_softmax(logits[begin : begin + len(targets)].float(), dim=-1)
        index = torch.tensor(targets, dtype=torch.long, device=rows.device)[:, None]
        chosen = rows.gather(1, index)
        ranks = (rows > chosen).sum(dim=-1) + 1
        pairs: list[list[tuple[int, float]]] = [[] for _ in targets]
        if num_top > 0:
            top = torch.topk(rows, num_top, dim=-1)
            indices, values = top.indices.tolist(), top.values.tolist()
            pairs = [list(zip(i, v, strict=True)) for i, v in zip(indices, values, strict=True)]
        out.extend(
            TokenLogprob(token, logprob, top, rank)
            for token, logprob, rank, top in zip(
                targets, chosen[:, 0].tolist(), ranks.tolist(), pairs, strict=True
            )
        )
    return out
