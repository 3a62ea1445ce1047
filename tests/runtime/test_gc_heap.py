"""freeze_startup_heap: what exists at startup leaves the collector's generations; later garbage is still
collected."""

from __future__ import annotations

import gc
import weakref

from kvpilot.runtime.engine.gc_heap import freeze_startup_heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_startup_objects_are_frozen_and_new_cycles_still_collected() -> None:
    startup = _Node()
    try:
        frozen = freeze_startup_heap()
        assert frozen > 0 and gc.get_freeze_count() == frozen
        assert not any(o is startup for o in gc.get_objects())  # out of every generation
        later = _Node()
        ref = weakref.ref(later)
        del later
        gc.collect()
        assert ref() is None
    finally:
        gc.unfreeze()
