"""Incremental detokenization adds up to the full decode; split characters are held, not garbled."""

from __future__ import annotations

import random

from kvpilot.runtime.engine.detokenizer import IncrementalDetokenizer

from tests.runtime.fake_model import EOS_TOKEN_ID, FakeTokenizer

TOK = FakeTokenizer()


def stream(ids: list[int], prompt: list[int] | None = None, skip_special: bool = True) -> list[str]:
    detok = IncrementalDetokenizer(TOK, prompt or [TOK.encode("x")[0]], skip_special)
    return [detok.add(t) for t in ids] + [detok.flush()]


def test_multibyte_characters_split_across_tokens_are_held_until_complete() -> None:
    ids = [TOK.vocab.index(bytes([b])) for b in "a€b".encode()]  # € is 3 bytes: 3 tokens
    assert stream(ids) == ["a", "", "", "€", "b", ""]


def test_deltas_add_up_to_the_full_decode_for_random_streams() -> None:
    rng = random.Random(0)
    for _ in range(200):
        text = "".join(
            rng.choice(["a", " cat", "é", "€", "STOP", "\n", "ing", "日本"])
            for _ in range(rng.randint(1, 12))
        )
        data, ids, i = text.encode(), [], 0
        while i < len(data):  # random split, often inside a character
            n = rng.randint(1, 3)
            ids.extend(TOK.vocab.index(data[i + j : i + j + 1]) for j in range(min(n, len(data) - i)))
            i += n
        deltas = stream(ids)
        assert "".join(deltas) == text
        assert all("\ufffd" not in d for d in deltas)


def test_incomplete_tail_is_flushed_like_a_full_decode() -> None:
    ids = [TOK.encode("a")[0], TOK.vocab.index(b"\xe2")]  # a dangling first byte of a 3-byte character
    deltas = stream(ids)
    assert deltas[:2] == ["a", ""] and "".join(deltas) == TOK.decode(ids) == "a\ufffd"


def test_special_tokens_skipped_or_kept() -> None:
    ids = [TOK.encode("a")[0], EOS_TOKEN_ID, TOK.encode("b")[0]]
    assert "".join(stream(ids)) == "ab"
    assert "".join(stream(ids, skip_special=False)) == "a<eos>b"


def test_prompt_context_does_not_leak_into_output() -> None:
    prompt = TOK.encode("the cat sat on the mat")
    assert "".join(stream(TOK.encode(" and"), prompt)) == " and"
