"""Which attention kernel a step's shape goes to, decided on the host from sizes alone (no triton import:
the attention layer asks it too)."""

from __future__ import annotations

MAX_VERIFY_QUERY_LEN = 16  # Q above this goes to the prefill kernel (tiles of Q x GROUP rows get large)


def uniform_query_len(num_tokens: int, num_seqs: int, max_q_len: int | None) -> bool:
    """Every sequence has exactly max_q_len (<= MAX_VERIFY_QUERY_LEN, > 1) query tokens: the verify kernel's
    steps. Chunks are never empty and none exceeds max_q_len, so num_tokens == num_seqs * max_q_len says it
    without a sync."""
    if max_q_len is None or not 1 < max_q_len <= MAX_VERIFY_QUERY_LEN:
        return False
    return num_tokens == num_seqs * max_q_len
