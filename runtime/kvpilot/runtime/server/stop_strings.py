"""Stop strings matched in one pass over the text, whatever their number (an Aho-Corasick automaton).

Same contract as the engine's StopStringMatcher (engine/stop.py, which the offline LLM uses): feed() returns
the text safe to emit and holds back the longest tail that could still become a stop string; the earliest
match wins (ties: the first listed stop string); the matched stop string is dropped from the text, or kept
with include_stop_str_in_output. The difference is cost: the engine's matcher searches for every stop string
at every token (a request with many strings slowed every other request on the event loop); this one walks
each character once through an automaton built once per distinct stop list, so the cost per character does
not depend on how many stop strings there are.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from kvpilot.runtime.engine.stop import StringMatch


@dataclass(frozen=True)
class _Automaton:
    """goto[state][char] -> state; fail[state]; depth[state] = length of the state's prefix;
    best[state] = (length, list index) of the longest stop string that ends at this state (or None)."""

    goto: tuple[dict[str, int], ...]
    fail: tuple[int, ...]
    depth: tuple[int, ...]
    best: tuple[tuple[int, int] | None, ...]
    stops: tuple[str, ...]

    def step(self, state: int, char: str) -> int:
        goto, fail = self.goto, self.fail
        while True:
            nxt = goto[state].get(char)
            if nxt is not None:
                return nxt
            if state == 0:
                return 0
            state = fail[state]


@functools.lru_cache(maxsize=256)
def build_automaton(stops: tuple[str, ...]) -> _Automaton:
    """The automaton for a stop list (cached: the n choices of a request, and repeated lists, share it)."""
    goto: list[dict[str, int]] = [{}]
    depth = [0]
    terminal: list[tuple[int, int] | None] = [None]
    for index, stop in enumerate(stops):
        state = 0
        for char in stop:
            nxt = goto[state].get(char)
            if nxt is None:
                nxt = goto[state][char] = len(goto)
                goto.append({})
                depth.append(depth[state] + 1)
                terminal.append(None)
            state = nxt
        if stop and terminal[state] is None:  # a repeated string keeps its first position
            terminal[state] = (len(stop), index)
    fail = [0] * len(goto)
    best = list(terminal)
    queue = deque(goto[0].values())
    while queue:  # breadth first: a state's failure target is shallower, hence already complete
        state = queue.popleft()
        for char, child in goto[state].items():
            queue.append(child)
            target = fail[state]
            while target and char not in goto[target]:
                target = fail[target]
            fail[child] = goto[target].get(char, 0) if goto[target].get(char) != child else 0
            if best[child] is None:
                best[child] = best[fail[child]]
    return _Automaton(tuple(goto), tuple(fail), tuple(depth), tuple(best), stops)


class StopStrings:
    """Drop-in for the engine's StopStringMatcher (feed/flush/matched), linear in the text's length."""

    def __init__(self, stop: Sequence[str], include_stop_str_in_output: bool = False) -> None:
        self._automaton = build_automaton(tuple(s for s in stop if s))
        self._include = include_stop_str_in_output
        self._state = 0
        self._pending = ""  # text received but not yet emitted: always the state's prefix
        self.matched: str | None = None

    def feed(self, text: str, can_stop: bool = True) -> StringMatch:
        if self.matched is not None:
            return StringMatch("", self.matched)
        pending = self._pending + text
        if not can_stop or not self._automaton.stops:
            self._pending, self._state = "", 0
            return StringMatch(pending, None)
        found = self._scan(text, len(self._pending))
        if found is not None:
            start, stop = found
            self.matched, self._pending, self._state = stop, "", 0
            end = start + len(stop) if self._include else start
            return StringMatch(pending[:end], stop)
        hold = self._automaton.depth[self._state]
        self._pending = pending[len(pending) - hold :] if hold else ""
        return StringMatch(pending[: len(pending) - hold], None)

    def _scan(self, text: str, offset: int) -> tuple[int, str] | None:
        """Walks `text` (which follows `offset` held-back characters); the earliest-starting match."""
        automaton, state = self._automaton, self._state
        best: tuple[int, int] | None = None  # (start, list index)
        for i, char in enumerate(text, offset):
            state = automaton.step(state, char)
            ending = automaton.best[state]
            if ending is not None:
                length, index = ending
                candidate = (i + 1 - length, index)
                if best is None or candidate < best:
                    best = candidate
            if best is not None and i + 1 - automaton.depth[state] > best[0]:
                break  # every later match would start after the one we have
        self._state = state
        return None if best is None else (best[0], automaton.stops[best[1]])

    def flush(self) -> str:
        """The request ended for another reason: what was held back was not a stop string after all."""
        text, self._pending, self._state = self._pending, "", 0
        return "" if self.matched is not None else text
