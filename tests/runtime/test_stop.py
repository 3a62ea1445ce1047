"""Stop strings: matched across token boundaries, never leaked, truncated (or kept when asked)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from kvpilot.runtime.engine.llm_engine import LLMEngine
from kvpilot.runtime.engine.stop import StopStringMatcher, banned_token_ids, token_stop_reason
from kvpilot.runtime.sampling_params import SamplingParams

from tests.runtime.fake_model import EOS_TOKEN_ID, FakeRunner, FakeSampler, FakeTokenizer

TOK = FakeTokenizer()
WORDS = ["the", " cat", " sat", " on", " a", " mat", "\n\n", "er", "ing", " é", "x", "€", "S", "T"]
STOPS = ["STOP", "##", "é€"]  # pairwise disjoint characters, so "earliest match" is unambiguous
REPLACEMENT = "\ufffd"


def feed_all(matcher: StopStringMatcher, pieces: list[str]) -> tuple[str, str | None, list[str]]:
    emitted = []
    for p in pieces:
        m = matcher.feed(p)
        emitted.append(m.text)
        if m.stop is not None:
            return "".join(emitted), m.stop, emitted
    emitted.append(matcher.flush())
    return "".join(emitted), None, emitted


def test_matcher_holds_back_possible_starts_and_releases_them() -> None:
    m = StopStringMatcher(["STOP"])
    assert m.feed("abc S").text == "abc "
    assert m.feed("T").text == ""
    assert m.feed("x").text == "STx"  # it was not a stop string after all
    assert m.feed("STO").text == ""
    assert m.flush() == "STO"


def test_matcher_truncates_or_includes() -> None:
    assert feed_all(StopStringMatcher(["STOP"]), ["a S", "TO", "P tail"])[:2] == ("a ", "STOP")
    assert feed_all(StopStringMatcher(["STOP"], True), ["a S", "TO", "P tail"])[:2] == ("a STOP", "STOP")
    assert feed_all(StopStringMatcher(["b", "ab"]), ["xab"])[:2] == ("x", "ab")  # earliest start wins
    m = StopStringMatcher(["x"])
    assert m.feed("ax").stop == "x" and m.feed("more").text == "" and m.flush() == ""


def test_matcher_can_stop_false_passes_everything_through() -> None:
    m = StopStringMatcher(["STOP"])
    assert m.feed("a STOP b", can_stop=False).text == "a STOP b"
    assert m.feed("ST").text == ""


def test_token_stop_rules() -> None:
    assert token_stop_reason(0, eos_token_ids={0}, stop_token_ids=[], ignore_eos=False) == (True, None)
    assert token_stop_reason(0, eos_token_ids={0}, stop_token_ids=[], ignore_eos=True) == (False, None)
    assert token_stop_reason(5, eos_token_ids={0}, stop_token_ids=[5], ignore_eos=True) == (True, 5)
    assert banned_token_ids(1, 2, eos_token_ids={0}, stop_token_ids=[5], ignore_eos=False) == {0, 5}
    assert banned_token_ids(1, 2, eos_token_ids={0}, stop_token_ids=[5], ignore_eos=True) == {5}
    assert banned_token_ids(2, 2, eos_token_ids={0}, stop_token_ids=[5], ignore_eos=False) == set()


def random_tokenization(text: str, rng: random.Random) -> list[int]:
    """Split the UTF-8 bytes at random points (inside characters too) into vocabulary tokens."""
    data, ids, i = text.encode(), [], 0
    while i < len(data):
        n = rng.randint(1, 4)
        piece = data[i : i + n]
        token = TOK.vocab.index(piece) if piece in TOK.vocab[1:] else None
        ids.extend([token] if token else [TOK.vocab.index(bytes([b])) for b in piece])
        i += n
    return ids


def scripted_engine(scripts: dict[int, list[int]]) -> LLMEngine:
    """A fake model that, for the prompt [k], generates scripts[k] token by token, then EOS."""

    def logits_fn(context: Sequence[int]) -> list[float]:
        script = scripts[context[0]]
        step = len(context) - 1
        logits = [0.0] * TOK.vocab_size
        logits[script[step] if step < len(script) else EOS_TOKEN_ID] = 1.0
        return logits

    runner = FakeRunner(num_kv_blocks=256, block_size=4, max_model_len=512, logits_fn=logits_fn)
    return LLMEngine(runner, TOK, FakeSampler(), max_num_seqs=64, max_num_batched_tokens=256)


def expected(text: str, stops: list[str], include: bool) -> tuple[str, str | None]:
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return text, None
    index, stop = min(hits)
    return text[: index + len(stop) if include else index], stop


@pytest.mark.parametrize("include", [False, True])
def test_stop_strings_never_leak_over_random_token_splits(include: bool) -> None:
    rng = random.Random(1234 + include)
    cases = {}
    for k in range(1, 61):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 14))]
        for _ in range(rng.randint(0, 2)):
            words.insert(rng.randint(0, len(words)), rng.choice([*STOPS, "ST", "é", "#"]))
        text = "".join(words)
        stops = rng.sample(STOPS, rng.randint(1, 3))
        cases[k] = (text, stops, random_tokenization(text, rng))
    engine = scripted_engine({k: ids for k, (_, _, ids) in cases.items()})
    for k, (_, stops, ids) in cases.items():
        engine.add_request(
            str(k), [k], SamplingParams(max_tokens=len(ids), stop=stops, include_stop_str_in_output=include)
        )
    streamed: dict[str, str] = {}
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            streamed[out.request_id] = streamed.get(out.request_id, "") + out.new_text
            text, stops, _ = cases[int(out.request_id)]
            want, _ = expected(text, stops, include)
            assert want.startswith(streamed[out.request_id]), "emitted text that is not in the answer"
            assert REPLACEMENT not in out.new_text
            if out.finished:
                final[out.request_id] = out
    for k, (text, stops, ids) in cases.items():
        want, stop = expected(text, stops, include)
        out = final[str(k)]
        assert streamed[str(k)] == want, (text, stops)
        if stop is None:
            assert (out.finish_reason, out.stop_reason, out.num_output_tokens) == ("length", None, len(ids))
        else:
            assert (out.finish_reason, out.stop_reason) == ("stop", stop)


def test_stop_string_is_checked_only_after_min_tokens() -> None:
    ids = TOK.encode("##ab##cd")
    engine = scripted_engine({1: ids})
    engine.add_request("r", [1], SamplingParams(max_tokens=len(ids), stop=["##"], min_tokens=2))
    text = ""
    while engine.has_unfinished_requests():
        for out in engine.step():
            text += out.new_text
            last = out
    assert text == "##ab" and last.stop_reason == "##"
