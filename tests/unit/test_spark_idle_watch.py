"""The Spark engine's idle watch (``bulldozer.load.engines.spark._IdleWatch``), a thread
that polls the driver's status tracker during a load."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from bulldozer.load.engines.spark import _IdleWatch


class _GoneDriver:
    """A context whose driver went away: every call to it fails, as py4j's does."""

    def statusTracker(self) -> Any:  # pyspark's name
        raise ConnectionError("Answer from Java side is empty")


def test_a_driver_gone_under_the_watch_ends_it_without_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run ended by its time limit while the watch polled: py4j's "Answer from Java side is
    empty" escaped the thread, and Python printed its traceback on stderr above the run's one
    line. The watch now ends quietly; the run says what ended it."""
    escaped: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args.exc_value))
    with _IdleWatch(_GoneDriver(), timeout=60.0, poll=0.01) as watch:
        watch._thread.join(timeout=10)
        assert not watch._thread.is_alive()
    assert escaped == [] and not watch.fired
