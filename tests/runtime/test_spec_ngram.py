"""Prompt-lookup proposals."""

from __future__ import annotations

from kvpilot.runtime.engine.sequence import Sequence
from kvpilot.runtime.engine.spec_decode.ngram import NgramProposer, ngram_draft
from kvpilot.runtime.sampling_params import SamplingParams


def test_longest_suffix_match_wins() -> None:
    # suffix [7, 8, 9]: matched at the start (followed by 1 2 3); [8, 9] alone also matches later (5 5)
    tokens = [7, 8, 9, 1, 2, 3, 4, 8, 9, 5, 5, 6, 7, 8, 9]
    assert ngram_draft(tokens, 3, 3, 1) == [1, 2, 3]
    assert ngram_draft(tokens, 3, 2, 1) == [5, 5, 6]  # n <= 2: the latest [8, 9]


def test_no_match_no_draft_and_limits() -> None:
    assert ngram_draft([1, 2, 3, 4], 4, 3, 1) == []
    assert ngram_draft([1, 2, 1], 4, 3, 1) == [2, 1]  # what follows, up to the end
    assert ngram_draft([5, 6, 5, 6], 0, 3, 1) == []
    assert ngram_draft([5], 2, 3, 1) == []
    assert ngram_draft([1, 2, 9, 1, 2], 2, 3, 2) == [9, 1]  # min_n 2: [2] alone would not count
    assert ngram_draft([3, 9, 4, 3], 2, 3, 2) == []


def test_inside_a_repeated_run_a_full_draft_is_found() -> None:
    assert ngram_draft([4, 4, 4, 4, 4, 4], 3, 2, 1) == [4, 4, 4]


def test_proposer_reads_prompt_and_output() -> None:
    seq = Sequence(0, [10, 11, 12, 13], SamplingParams(), max_tokens=8)
    seq.append_token(10)
    seq.append_token(11)
    assert NgramProposer(3, 1).propose([seq], [2]) == [[12, 13]]


def test_benchmark_oracles_replay_and_stay_wrong_off_track() -> None:
    from kvpilot.runtime.engine.spec_decode.oracle import OracleProposer

    prompt, known = [1, 2, 3], [10, 11, 12, 13, 14]
    seq = Sequence(0, prompt, SamplingParams(), max_tokens=8)
    seq.append_token(10)
    replay = OracleProposer({tuple(prompt): known}, wrong=False, vocab_size=100)
    wrong = OracleProposer({tuple(prompt): known}, wrong=True, vocab_size=100)
    assert replay.propose([seq], [3]) == [[11, 12, 13]]
    assert wrong.propose([seq], [3]) == [[12, 13, 14]]  # each the known token + 1
    assert wrong.propose([seq], [6]) == [[12, 13, 14, 15, 15, 16]]  # past the known end: last + 1 + j
    seq.append_token(99)  # off the known continuation (rounding flipped a near-tie)
    assert replay.propose([seq], [3]) == [[]]
    assert wrong.propose([seq], [3]) == [[0, 1, 2]]  # after 99, in id order, wrapping
