"""Logit processing and sampling ops, batched over rows (vLLM semantics).

Order used by the engine's Sampler: banned tokens -> penalties -> (greedy argmax) -> temperature ->
min-p -> top-k -> top-p -> sample. Masked tokens get -inf.
"""

from __future__ import annotations

import torch


def apply_penalties(
    logits: torch.Tensor,  # [rows, vocab] float32, modified and returned
    prompt_mask: torch.Tensor,  # [rows, vocab] bool: token occurs in the prompt
    output_counts: torch.Tensor,  # [rows, vocab]: occurrences in the generated output
    repetition: torch.Tensor,  # [rows]
    frequency: torch.Tensor,  # [rows]
    presence: torch.Tensor,  # [rows]
) -> torch.Tensor:
    """Repetition penalty over prompt and output tokens (positive logits divided, negative multiplied);
    frequency (per occurrence) and presence (once) penalties over output tokens, subtracted."""
    output_mask = output_counts > 0
    seen = prompt_mask | output_mask
    penalty = torch.where(seen, repetition[:, None], torch.ones_like(logits))
    logits = torch.where(logits > 0, logits / penalty, logits * penalty)
    logits -= frequency[:, None] * output_counts.to(logits.dtype)
    logits -= presence[:, None] * output_mask.to(logits.dtype)
    return logits


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens whose probability is below min_p times the most likely token's probability."""
    probs = torch.softmax(logits, dim=-1)
    threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """top_k [rows] (vocab size = off): keep tokens whose logit is >= the k-th largest (ties kept).
    top_p [rows] (1.0 = off): keep the smallest set of most likely tokens whose mass reaches top_p
    (the most likely token always survives)."""
    vocab = logits.shape[-1]
    ordered, order = logits.sort(dim=-1, descending=False)
    kth = ordered.gather(1, (vocab - top_k.clamp(1, vocab)).long()[:, None])
    ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= (1 - top_p)[:, None]
    drop[:, -1] = False
    ordered = ordered.masked_fill(drop, float("-inf"))
    return ordered.scatter(1, order, ordered)


def sample_with_noise(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Draw one token per row: argmax(probs / q) with q ~ Exp(1) is a sample from probs (the
    exponential race), so the randomness lives entirely in `noise` [rows, vocab]."""
    return (probs / noise).argmax(dim=-1)
