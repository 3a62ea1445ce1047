"""Sampler properties: greedy, masks of top-k/top-p/min-p, penalties, banned tokens, seeded
reproducibility across batch compositions, and logprobs of the raw logits."""

from __future__ import annotations

import math

import pytest
import torch
from kvpilot.runtime.engine.sample_row import SampleRow
from kvpilot.runtime.engine.sampler import Sampler, stream_seed
from kvpilot.runtime.layers.logits_processing import apply_min_p, apply_penalties, apply_top_k_top_p
from kvpilot.runtime.sampling_params import SamplingParams

VOCAB = 32


def row(
    prompt: tuple[int, ...] = (1, 2),
    output: tuple[int, ...] = (),
    banned: frozenset[int] = frozenset(),
    **params: object,
) -> SampleRow:
    return SampleRow(SamplingParams(**params), list(prompt), list(output), banned)


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def kept(masked: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(masked)).flatten().tolist())


def test_greedy_is_argmax_and_ignores_the_random_stream() -> None:
    logits = random_logits(4)
    rows = [row(temperature=0.0), row(temperature=0.0, seed=3), row(temperature=1e-7), row(temperature=0.0)]
    tokens = Sampler(seed=1).sample(logits, rows)
    assert [t.token_id for t in tokens] == logits.argmax(dim=-1).tolist()
    assert all(t.logprob is None and t.top_logprobs == [] for t in tokens)


def test_top_k_keeps_exactly_the_k_largest_and_ties() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0, 4.0, 4.0, -2.0, 3.0, 2.0]])
    off = torch.tensor([1.0])
    assert kept(apply_top_k_top_p(logits, torch.tensor([3.0]), off)[0]) == {1, 3, 4}
    assert kept(apply_top_k_top_p(logits, torch.tensor([2.0]), off)[0]) == {1, 3, 4}  # tie at the 2nd
    assert kept(apply_top_k_top_p(logits, torch.tensor([1.0]), off)[0]) == {1}
    assert kept(apply_top_k_top_p(logits, torch.tensor([8.0]), off)[0]) == set(range(8))
    masked = apply_top_k_top_p(logits, torch.tensor([3.0]), off)[0]
    assert torch.equal(masked[[1, 3, 4]], logits[0, [1, 3, 4]])  # kept logits unchanged, in place


def test_top_p_keeps_the_smallest_set_reaching_the_mass() -> None:
    probs = torch.tensor([0.05, 0.4, 0.1, 0.25, 0.2])  # sorted: 0.4, 0.25, 0.2, 0.1, 0.05
    logits = probs.log()[None]
    k_off = torch.tensor([5.0])
    expected = {0.3: {1}, 0.5: {1, 3}, 0.64: {1, 3}, 0.66: {1, 3, 4}, 0.9: {1, 3, 4, 2}, 1.0: set(range(5))}
    for top_p, keep in expected.items():
        assert kept(apply_top_k_top_p(logits, k_off, torch.tensor([top_p]))[0]) == keep, top_p
    both = apply_top_k_top_p(logits.repeat(2, 1), torch.tensor([2.0, 5.0]), torch.tensor([0.9, 0.3]))
    assert [kept(r) for r in both] == [{1, 3}, {1}]  # top-p renormalises after top-k; rows independent


def test_min_p_is_relative_to_the_most_likely_token() -> None:
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    logits = (probs.log() + 7.0)[None]  # any shift: min-p works on probabilities
    assert kept(apply_min_p(logits, torch.tensor([0.25]))[0]) == {0, 1, 2}  # threshold 0.125
    assert kept(apply_min_p(logits, torch.tensor([0.35]))[0]) == {0, 1}  # threshold 0.175
    assert kept(apply_min_p(logits, torch.tensor([0.0]))[0]) == set(range(5))


def test_sampling_never_picks_a_masked_token_and_covers_the_kept_ones() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, :4] = torch.tensor([3.0, 2.5, 2.0, 1.0])
    sampler = Sampler(seed=0)
    seen = {sampler.sample(logits, [row(top_k=3)])[0].token_id for _ in range(200)}
    assert seen == {0, 1, 2}
    seen = {sampler.sample(logits, [row(min_p=0.5)])[0].token_id for _ in range(200)}
    assert seen == {0, 1}  # e^2.0 / e^3.0 < 0.5


def test_sample_frequencies_follow_the_distribution() -> None:
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = torch.full((1, VOCAB), -1e9)
    logits[0, :3] = probs.log()
    sampler = Sampler(seed=0)
    draws = [sampler.sample(logits, [row()])[0].token_id for _ in range(3000)]
    freqs = torch.bincount(torch.tensor(draws), minlength=3)[:3].float() / len(draws)
    torch.testing.assert_close(freqs, probs, atol=0.04, rtol=0)


def test_temperature_sharpens_and_flattens() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    sampler = Sampler(seed=0)

    def top_share(temperature: float) -> float:
        draws = [sampler.sample(logits, [row(temperature=temperature)])[0].token_id for _ in range(1000)]
        return draws.count(0) / len(draws)

    assert top_share(0.2) > 0.95 > top_share(1.0) > top_share(5.0) > 0.3


def test_penalties_change_exactly_the_right_logits() -> None:
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0, 1.0]])
    prompt_mask = torch.tensor([[True, True, False, False, False, False]])
    output_counts = torch.tensor([[0, 0, 3, 1, 0, 0]])
    out = apply_penalties(
        logits.clone(),
        prompt_mask,
        output_counts,
        torch.tensor([2.0]),
        torch.tensor([0.5]),
        torch.tensor([0.25]),
    )
    # token 0,1: prompt only -> repetition; 2,3: output -> repetition, frequency x count, presence; 4,5: none
    expected = torch.tensor([[1.0, -4.0, 1.0 - 1.5 - 0.25, -4.0 - 0.5 - 0.25, 1.0, 1.0]])
    torch.testing.assert_close(out, expected)


def test_sampler_applies_penalties_from_prompt_and_output_ids() -> None:
    logits = torch.tensor([[5.0, 4.9, 4.8, 0.0] + [-10.0] * (VOCAB - 4)])
    sampler = Sampler()
    plain = row(prompt=(0,), output=(1, 1), temperature=0.0)
    assert sampler.sample(logits, [plain])[0].token_id == 0
    prompt_only = row(prompt=(0,), temperature=0.0, repetition_penalty=1.1)
    assert sampler.sample(logits, [prompt_only])[0].token_id == 1
    penalised = row(prompt=(0,), output=(1,), temperature=0.0, repetition_penalty=1.1)
    assert sampler.sample(logits, [penalised])[0].token_id == 2
    # presence/frequency look at the output only: the prompt token 0 keeps its logit
    assert (
        sampler.sample(logits, [row(prompt=(0,), output=(1,), temperature=0.0, presence_penalty=0.5)])[
            0
        ].token_id
        == 0
    )
    assert (
        sampler.sample(logits, [row(prompt=(2,), output=(0, 0), temperature=0.0, frequency_penalty=0.1)])[
            0
        ].token_id
        == 1
    )


def test_banned_tokens_are_never_sampled() -> None:
    logits = torch.zeros(2, VOCAB)
    logits[:, 7] = 50.0
    sampler = Sampler(seed=0)
    rows = [row(temperature=0.0, banned=frozenset({7})), row(banned=frozenset({7, 8}))]
    for _ in range(50):
        tokens = [t.token_id for t in sampler.sample(logits, rows)]
        assert 7 not in tokens and tokens[1] != 8
    assert sampler.sample(logits[:1], [row(temperature=0.0)])[0].token_id == 7


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    """Same (seed, output length) -> same token, alone or among other rows, in any position."""
    logits = random_logits(6, seed=4)
    target = logits[2:3]
    params = {"seed": 1234, "top_p": 0.9, "top_k": 20, "temperature": 0.8}
    alone = [
        Sampler(seed=s).sample(target, [row(output=(5,) * n, **params)])[0].token_id
        for s, n in [(0, 0), (1, 1), (2, 2), (3, 3)]
    ]
    for sampler_seed in (0, 99):
        rows = [row(), row(seed=7), row(output=(), **params), row(temperature=0.0), row(), row(seed=1)]
        batch = logits.clone()
        batch[2] = target[0]
        assert Sampler(seed=sampler_seed).sample(batch, rows)[2].token_id == alone[0]
        shuffled = [rows[2], *rows[:2], *rows[3:]]
        assert (
            Sampler(seed=sampler_seed)
            .sample(torch.cat([target, logits[:2], logits[3:]]), shuffled)[0]
            .token_id
            == alone[0]
        )
    for n in range(4):  # the stream follows the output length, so resuming after preemption repeats it
        assert Sampler(seed=5).sample(target, [row(output=(5,) * n, **params)])[0].token_id == alone[n]


def test_seeded_streams_differ_by_seed_and_position() -> None:
    logits = torch.zeros(1, VOCAB)
    by_seed = {Sampler().sample(logits, [row(seed=s)])[0].token_id for s in range(40)}
    by_step = {Sampler().sample(logits, [row(seed=1, output=(0,) * n)])[0].token_id for n in range(40)}
    assert len(by_seed) > 10 and len(by_step) > 10  # uniform over 32 tokens: many distinct draws
    assert len({stream_seed(1, i) for i in range(1000)} | {stream_seed(2, i) for i in range(1000)}) == 2000


def test_unseeded_rows_follow_the_sampler_seed() -> None:
    logits = torch.zeros(3, VOCAB)
    rows = [row(), row(), row()]

    def draws(seed: int) -> list[int]:
        sampler = Sampler(seed=seed)
        return [t.token_id for _ in range(5) for t in sampler.sample(logits, rows)]

    assert draws(0) == draws(0) != draws(1)


@pytest.mark.parametrize("n", [0, 1, 5])
def test_logprobs_are_log_softmax_of_the_raw_logits(n: int) -> None:
    logits = random_logits(3, seed=9)
    rows = [
        row(temperature=0.0, logprobs=n, repetition_penalty=2.0, prompt=tuple(range(10))),
        row(logprobs=n, temperature=0.5, seed=1),
        row(temperature=0.0),
    ]
    tokens = Sampler().sample(logits, rows)
    expected = torch.log_softmax(logits, dim=-1)
    for i in (0, 1):
        token = tokens[i]
        assert math.isclose(token.logprob, expected[i, token.token_id].item(), abs_tol=1e-6)
        top = torch.topk(expected[i], n)
        assert [t for t, _ in token.top_logprobs] == top.indices.tolist()
        torch.testing.assert_close(torch.tensor([lp for _, lp in token.top_logprobs]), top.values)
    assert tokens[2].logprob is None and tokens[2].top_logprobs == []


def test_row_count_mismatch_and_empty_batch() -> None:
    with pytest.raises(ValueError, match="2 logits rows for 1 sample rows"):
        Sampler().sample(torch.zeros(2, VOCAB), [row()])
    assert Sampler().sample(torch.zeros(0, VOCAB), []) == []


def test_bf16_logits_sample_like_their_float32_widening() -> None:
    """The runner hands the sampler the LM head's bf16 logits: a plain argmax reads them as they are,
    everything else widens them first; both give exactly what float32 logits of the same values give."""
    torch.manual_seed(0)
    logits = torch.randn(4, 50).to(torch.bfloat16)
    logits[1, 7] = logits[1, 9] = logits[1].max() + 1  # a tie: the first index wins in both dtypes
    greedy = [row(temperature=0.0) for _ in range(4)]
    sampler = Sampler(seed=1)
    assert sampler.sample_ids(logits, greedy).ids.tolist() == logits.float().argmax(-1).tolist()
    assert sampler.sample_ids(logits, greedy).ids.tolist()[1] == 7
    with_logprobs = [row(temperature=0.0, logprobs=2) for _ in range(4)]
    from_bf16 = sampler.sample(logits, with_logprobs)
    from_fp32 = Sampler(seed=1).sample(logits.float(), with_logprobs)
    assert [t.token_id for t in from_bf16] == [t.token_id for t in from_fp32]
    assert [t.logprob for t in from_bf16] == [t.logprob for t in from_fp32]
