"""The server's stop-string automaton against the engine's reference matcher, on generated inputs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kvpilot.runtime.engine.stop import StopStringMatcher
from kvpilot.runtime.server.stop_strings import StopStrings, build_automaton

ALPHABET = "abc"
stops = st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1, max_size=5)
chunks = st.lists(st.tuples(st.text(ALPHABET, max_size=6), st.booleans()), max_size=8)


def run(matcher: StopStringMatcher | StopStrings, pieces: list[tuple[str, bool]]) -> list[object]:
    out: list[object] = []
    for text, can_stop in pieces:
        match = matcher.feed(text, can_stop)
        out.append((match.text, match.stop))
    out.append(matcher.flush())
    return out


@settings(max_examples=400, deadline=None)
@given(stops, chunks, st.booleans())
def test_same_output_as_the_engine_matcher(stop: list[str], pieces: list[tuple[str, bool]], include: bool):
    assert run(StopStrings(stop, include), pieces) == run(StopStringMatcher(stop, include), pieces)


def test_earliest_start_wins_and_ties_go_to_the_first_listed() -> None:
    assert StopStrings(["bc", "abcd"]).feed("abcd").stop == "abcd"
    assert StopStrings(["ab", "abc"]).feed("abc").stop == "ab"
    assert StopStrings(["abc", "ab"], True).feed("xabcx").text == "xabc"


def test_holds_back_a_possible_prefix_across_tokens() -> None:
    matcher = StopStrings(["STOP"])
    assert matcher.feed("hello ST").text == "hello "
    assert matcher.feed("OP and more").stop == "STOP"


def test_many_stop_strings_share_one_automaton_per_list() -> None:
    many = tuple(f"never-{i}" for i in range(64))
    assert build_automaton(many) is build_automaton(many)
    matcher = StopStrings(list(many))
    assert matcher.feed("x" * 1000).text == "x" * 1000  # no false match, nothing held
