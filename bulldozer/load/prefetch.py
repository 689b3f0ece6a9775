"""Read ahead: iterate a source of batches on its own thread, a bounded number ahead of its
consumer, so reading (Parquet decoding, mostly outside the GIL) overlaps encoding and
sending instead of alternating with them.

The consumer gets the items in order; an error raised while reading is raised in the
consumer when it reaches that point; a consumer that stops early (an error of its own)
makes the reader stop and close its source on the reader's thread (a generator's
``finally``, e.g. closing a DuckDB connection, runs where the generator ran). A reader
waiting inside its source for the next item (a query computing for hours before its first
batch) is stopped by the ``interrupt`` the caller gives, else waited for.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

__all__ = ["read_ahead"]

T = TypeVar("T")

_END = object()


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


@contextmanager
def read_ahead(
    source: Iterable[T], depth: int, name: str = "read-ahead", interrupt: Callable[[], None] | None = None
) -> Iterator[Iterator[T]]:
    """``source``'s items, read on a daemon thread at most ``depth`` ahead of the consumer.
    ``depth <= 0`` iterates ``source`` in the caller's thread (no thread, no buffering).
    ``interrupt`` makes ``source`` stop waiting for its next item, from another thread: it is
    called until the reader has ended, once the consumer has gone."""
    if depth <= 0:
        yield iter(source)
        return
    slots: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(item: object) -> bool:
        """Queue ``item`` unless the consumer has gone; False once it has."""
        while not stop.is_set():
            try:
                slots.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        items = iter(source)
        try:
            for item in items:
                if not offer(item):
                    return
            offer(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            offer(_Failed(exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def consume() -> Iterator[T]:
        while True:
            item = slots.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        yield consume()
    finally:
        stop.set()
        # unblock a reader waiting on a full queue, then let it close its source
        while thread.is_alive():
            if interrupt is not None:
                interrupt()
            with suppress(queue.Empty):
                slots.get(timeout=0.05)
            thread.join(timeout=0.05)
