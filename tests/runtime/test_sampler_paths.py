"""Sampler fast paths (plain greedy argmax, processing only the rows that need it) give exactly what the
general path gives: every row processed on a clone of the whole batch."""

from __future__ import annotations

import random

import pytest
import torch
from kvpilot.runtime.engine.sample_row import SampleRow
from kvpilot.runtime.engine.sampler import SampledToken, Sampler
from kvpilot.runtime.sampling_params import SamplingParams

VOCAB = 97


class GeneralSampler(Sampler):
    """The general path: clone, process every row, argmax / sample the greedy / random subsets."""

    def sample(self, logits: torch.Tensor, rows: list[SampleRow]) -> list[SampledToken]:
        raw = logits.float()
        processed = self._process(raw.clone(), rows)
        greedy = [i for i, r in enumerate(rows) if r.params.greedy]
        rand = [i for i, r in enumerate(rows) if not r.params.greedy]
        token_ids = torch.empty(len(rows), dtype=torch.long)
        if greedy:
            token_ids[greedy] = processed[greedy].argmax(dim=-1)
        if rand:
            token_ids[rand] = self._sample_random(processed[rand], [rows[i] for i in rand])
        return self._results(raw, token_ids.tolist(), rows)


def random_row(rng: random.Random, kinds: list[str]) -> SampleRow:
    kind = rng.choice(kinds)
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 20))]
    output = [rng.randrange(VOCAB) for _ in range(rng.randrange(0, 20))]
    params: dict[str, object] = {"temperature": 0.0}
    banned: frozenset[int] = frozenset()
    if kind == "banned":
        banned = frozenset(rng.sample(range(VOCAB), 3)) | {VOCAB + 5}  # one out of the vocabulary
    elif kind == "penalised":
        params.update(repetition_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1)
    elif kind == "seeded":
        params.update(temperature=0.7, top_p=0.9, top_k=20, seed=rng.randrange(100))
    elif kind == "random":
        params.update(temperature=1.0, min_p=0.05)
    elif kind == "random_banned":
        params.update(temperature=0.9, presence_penalty=0.5)
        banned = frozenset({rng.randrange(VOCAB)})
    if rng.random() < 0.2:
        params["logprobs"] = rng.choice([0, 3])
    return SampleRow(SamplingParams(**params), prompt, output, banned)


@pytest.mark.parametrize(
    "kinds",
    [
        ["greedy"],
        ["greedy", "banned"],
        ["greedy", "penalised", "banned"],
        ["greedy", "seeded", "random"],
        ["greedy", "banned", "penalised", "seeded", "random", "random_banned"],
        ["seeded", "random_banned"],
    ],
)
def test_fast_paths_equal_the_general_path(kinds: list[str]) -> None:
    rng = random.Random(len(kinds) * 31 + len(kinds[0]))
    for trial in range(15):
        rows = [random_row(rng, kinds) for _ in range(rng.randrange(1, 24))]
        logits = torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(trial)) * 4
        before = logits.clone()
        fast = Sampler(seed=trial).sample(logits, rows)
        general = GeneralSampler(seed=trial).sample(logits, rows)
        assert fast == general
        assert torch.equal(logits, before)  # the caller's logits are never modified


def test_plain_greedy_batch_is_the_argmax_without_logprobs() -> None:
    logits = torch.randn(64, VOCAB, generator=torch.Generator().manual_seed(3))
    rows = [SampleRow(SamplingParams(temperature=0.0), [1], []) for _ in range(64)]
    tokens = Sampler().sample(logits, rows)
    assert [t.token_id for t in tokens] == logits.argmax(dim=-1).tolist()
    assert all(t.logprob is None and t.top_logprobs == [] for t in tokens)
    assert all(type(t.token_id) is int for t in tokens)


def test_half_precision_logits_match_their_float32_copy() -> None:
    logits = torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    rows = [SampleRow(SamplingParams(temperature=0.0, logprobs=2), [1], []) for _ in range(8)]
    assert Sampler().sample(logits, rows) == GeneralSampler().sample(logits.float(), rows)
