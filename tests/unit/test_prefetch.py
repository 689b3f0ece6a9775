"""The local engine's read-ahead: order, errors, early stops, and the reader really running ahead."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from bulldozer.load.prefetch import read_ahead


@pytest.mark.parametrize("depth", [0, 1, 3, 100])
def test_items_arrive_in_order(depth: int) -> None:
    with read_ahead(range(1000), depth) as items:
        assert list(items) == list(range(1000))


def test_an_empty_source() -> None:
    with read_ahead(iter(()), 2) as items:
        assert list(items) == []


def test_the_reader_runs_on_its_own_thread_at_most_depth_ahead() -> None:
    produced: list[int] = []
    threads: set[str] = set()

    def source() -> Iterator[int]:
        for i in range(10):
            threads.add(threading.current_thread().name)
            produced.append(i)
            yield i

    with read_ahead(source(), 2, name="reader-under-test") as items:
        first = next(items)
        deadline = time.monotonic() + 5
        # the reader fills the queue (2) and holds one more item it cannot place yet
        while len(produced) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert first == 0
        assert len(produced) == 4, "read exactly depth items ahead of the consumer, plus the one it waits to place"
        assert list(items) == list(range(1, 10))
    assert threads == {"reader-under-test"}


def test_an_error_while_reading_reaches_the_consumer_after_the_items_before_it() -> None:
    def source() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("bad file")

    seen: list[int] = []
    with pytest.raises(ValueError, match="bad file"), read_ahead(source(), 4) as items:
        for item in items:
            seen.append(item)
    assert seen == [1, 2]


def test_a_consumer_that_stops_early_stops_the_reader_and_closes_the_source_on_its_thread() -> None:
    closed_on: list[str] = []
    produced: list[int] = []

    def source() -> Iterator[int]:
        try:
            for i in range(1_000_000):
                produced.append(i)
                yield i
        finally:
            closed_on.append(threading.current_thread().name)

    with pytest.raises(RuntimeError, match="encoder failed"), read_ahead(source(), 2, name="src") as items:
        for item in items:
            if item == 3:
                raise RuntimeError("encoder failed")
    assert closed_on == ["src"]
    assert len(produced) < 10  # it stopped reading, it did not run to the end
    assert not any(t.name == "src" for t in threading.enumerate())


def test_depth_zero_reads_in_the_callers_thread() -> None:
    where: list[str] = []

    def source() -> Iterator[int]:
        where.append(threading.current_thread().name)
        yield 1

    with read_ahead(source(), 0) as items:
        assert list(items) == [1]
    assert where == [threading.current_thread().name]


def test_a_reader_waiting_inside_its_source_is_interrupted_when_the_consumer_stops() -> None:
    """A source blocked on its next item (a query computing its first rows) ends only when
    told to: the consumer's exit calls ``interrupt`` until the reader has ended."""
    told = threading.Event()
    closed = threading.Event()

    def source() -> Iterator[int]:
        try:
            yield 1
            if not told.wait(timeout=60):  # the next item takes "hours"
                raise AssertionError("never interrupted")
            raise RuntimeError("interrupted")
        finally:
            closed.set()

    started = time.monotonic()
    with pytest.raises(ValueError, match="the consumer's own"), read_ahead(source(), 2, interrupt=told.set) as items:
        assert next(items) == 1
        raise ValueError("the consumer's own error")
    assert closed.is_set() and time.monotonic() - started < 10
