"""Lossless verification of drafted tokens against the target's logits.

Each sampled sequence of a verification step owns d+1 consecutive logits rows: row j is the target's
prediction after the sequence's tokens and the first j drafts (d = 0 for a sequence without drafts).

Greedy requests: the target's token of row j (argmax of the processed logits, exactly as without
speculation) is compared with draft j; the drafts up to the first mismatch are accepted and the
target's token at the mismatch (or at row d, when all match) follows them. The emitted tokens are
therefore the target's own greedy tokens, and their logprobs are those of the same rows.

Random requests: rejection sampling. Draft j (drawn from a proposal distribution q_j) is accepted
with probability min(1, p_j(x)/q_j(x)), p_j being the target's distribution after temperature, top-k/p,
min-p and penalties; at the first rejection a token is drawn from norm(max(0, p_j - q_j)), and when all
d are accepted a bonus token is drawn from p_d. Every emitted token is then distributed exactly as the
target's. The proposers here are deterministic (n-gram lookup, a greedy draft model): q_j is a point
mass on the draft, so acceptance is p_j(x) and the residual is p_j without x, renormalised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from kvpilot.runtime.engine.sample_row import SampleRow
from kvpilot.runtime.engine.sampler import SampledToken, stream_seed


@dataclass(frozen=True)
class VerifyGroup:
    """One sequence's rows: rows[j] is the sampler row for logits row j (output extended by draft[:j])."""

    rows: list[SampleRow]
    draft: list[int]


def rejection_sample(
    p: torch.Tensor, draft: list[int], generator: torch.Generator, q: torch.Tensor | None = None
) -> list[int]:
    """Emitted tokens (the accepted drafts, then one more) for target probabilities p [d+1, vocab] and
    proposal probabilities q [d, vocab] (None: each draft is a point mass)."""
    d = len(draft)
    if p.shape[0] != d + 1 or (q is not None and q.shape[0] != d):
        raise ValueError(f"{p.shape[0]} target rows for {d} drafts")
    device = p.device
    index = torch.tensor(draft, dtype=torch.long, device=device)
    p_draft = p[:d].gather(1, index[:, None])[:, 0]  # [d]
    q_draft = q[:d].gather(1, index[:, None])[:, 0] if q is not None else torch.ones_like(p_draft)
    uniform = torch.rand(d, generator=generator, device=device)
    rejected = (uniform * q_draft >= p_draft).tolist()  # accept when u < p/q
    for j, reject in enumerate(rejected):
        if reject:
            proposal = (
                q[j] if q is not None else torch.nn.functional.one_hot(index[j], p.shape[1]).to(p.dtype)
            )
            residual = (p[j] - proposal).clamp_(min=0)
            if float(residual.sum()) <= 0:  # p == q on every token: nothing to correct
                residual = p[j]
            token = int(torch.multinomial(residual, 1, generator=generator))
            return [*draft[:j], token]
    return [*draft, int(torch.multinomial(p[d], 1, generator=generator))]


def verify(sampler: Any, logits: torch.Tensor, groups: list[VerifyGroup]) -> list[list[SampledToken]]:
    """The tokens each group emits, with the logprobs its request asks for. `logits` holds the groups'
    rows one after the other."""
    starts, total = [], 0
    for g in groups:
        if len(g.rows) != len(g.draft) + 1:
            raise ValueError(f"{len(g.rows)} rows for {len(g.draft)} drafts")
        starts.append(total)
        total += len(g.rows)
    if logits.shape[0] != total:
        raise ValueError(f"{logits.shape[0]} logits rows for {total} verification rows")
    out: list[list[SampledToken]] = [[] for _ in groups]
    greedy = [i for i, g in enumerate(groups) if g.rows[0].params.greedy]
    if greedy:
        _verify_greedy(sampler, logits, groups, starts, greedy, out)
    random = [i for i, g in enumerate(groups) if not g.rows[0].params.greedy]
    if random:
        _verify_random(sampler, logits, groups, starts, random, out)
    return out


def _rows_of(
    groups: list[VerifyGroup], starts: list[int], which: list[int]
) -> tuple[list[int], list[SampleRow]]:
    index: list[int] = []
    rows: list[SampleRow] = []
    for i in which:
        index.extend(range(starts[i], starts[i] + len(groups[i].rows)))
        rows.extend(groups[i].rows)
    return index, rows


def _verify_greedy(
    sampler: Any,
    logits: torch.Tensor,
    groups: list[VerifyGroup],
    starts: list[int],
    which: list[int],
    out: list[list[SampledToken]],
) -> None:
    index, rows = _rows_of(groups, starts, which)
    sampled = sampler.sample(logits[index] if len(index) != logits.shape[0] else logits, rows)
    offset = 0
    for i in which:
        draft = groups[i].draft
        mine = sampled[offset : offset + len(draft) + 1]
        offset += len(draft) + 1
        accepted = 0
        while accepted < len(draft) and mine[accepted].token_id == draft[accepted]:
            accepted += 1
        out[i] = mine[: accepted + 1]


def _verify_random(
    sampler: Any,
    logits: torch.Tensor,
    groups: list[VerifyGroup],
    starts: list[int],
    which: list[int],
    out: list[list[SampledToken]],
) -> None:
    index, rows = _rows_of(groups, starts, which)
    raw = logits[index]
    probs = sampler.probs(raw, rows)
    offset = 0
    for i in which:
        group, n = groups[i], len(groups[i].rows)
        tokens = rejection_sample(
            probs[offset : offset + n], group.draft, _generator(sampler, group, raw.device)
        )
        emitted_rows = group.rows[: len(tokens)]
        out[i] = sampler.results(raw[offset : offset + len(tokens)], tokens, emitted_rows)
        offset += n


def _generator(sampler: Any, group: VerifyGroup, device: torch.device) -> torch.Generator:
    """A seeded request draws from its own stream (seeded by its position), others from the sampler's."""
    row = group.rows[0]
    seed = row.params.seed
    if seed is None:
        return sampler.generator(device)
    generator = torch.Generator(device=device)
    generator.manual_seed(stream_seed(seed, len(row.output_token_ids)))
    return generator
