"""Combining a query's pieces into the load's batches (``bulldozer.load.batches``), and
reading a query's files a bounded way ahead (``bulldozer.load.source.files_ahead``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from bulldozer.load.batches import combined


def _pieces(sizes: list[int], width: int) -> list[pa.RecordBatch]:
    start, pieces = 0, []
    for size in sizes:
        ids = list(range(start, start + size))
        columns = [pa.array(ids, pa.int64()), pa.array([b"x" * width] * size, pa.binary())]
        pieces.append(pa.record_batch(columns, names=["id", "pad"]))
        start += size
    return pieces


@pytest.mark.parametrize(
    ("sizes", "width", "rows", "nbytes", "expected"),
    [
        ([], 1, 4, 10**9, []),
        ([3], 1, 4, 10**9, [3]),  # fewer than a batch: as it came
        ([2, 2, 2, 2, 1], 1, 4, 10**9, [4, 4, 1]),  # by rows
        ([2, 3, 2], 1, 4, 10**9, [5, 2]),  # a batch ends at the piece that reaches the rows
        ([2, 2, 2, 2], 100, 100, 300, [4, 4]),  # by bytes: ~400 bytes a batch, each at most one piece past 300
        ([2, 2], 1_000, 100, 300, [2, 2]),  # a piece past the bytes alone: a batch of its own
        ([0, 2, 0], 1, 4, 10**9, [2]),
    ],
)
def test_pieces_are_combined_up_to_the_rows_or_bytes_of_a_batch_in_order(
    sizes: list[int], width: int, rows: int, nbytes: int, expected: list[int]
) -> None:
    batches = list(combined(_pieces(sizes, width), rows, nbytes))
    assert [b.num_rows for b in batches] == expected
    ids = [i for b in batches for i in b.column("id").to_pylist()]
    assert ids == list(range(sum(sizes)))


class _Files:
    """A split reader of made-up files (``n`` one-row batches each) counting the batches it
    has made."""

    def __init__(self) -> None:
        self.made = 0
        self.lock = threading.Lock()

    def batches(self, task: Any, following: str | None) -> Iterator[pa.RecordBatch]:
        for i in range(task.n):
            with self.lock:
                self.made += 1
            yield pa.record_batch([pa.array([task.file.file_path]), pa.array([i])], names=["file", "i"])


def _tasks(sizes: list[int]) -> list[Any]:
    return [SimpleNamespace(file=SimpleNamespace(file_path=f"f{k}"), n=n) for k, n in enumerate(sizes)]


def test_a_querys_files_are_read_ahead_a_bounded_number_of_batches_in_order() -> None:
    """pyiceberg's reader decoded every file of a query's table as fast as it could and kept
    what the query had not taken: memory grew with the table. ``files_ahead`` reads a few
    files ahead, each a few batches ahead, and stops reading when its consumer goes."""
    from bulldozer.load.source import FILE_DEPTH, FILES_AHEAD, files_ahead

    sizes = [30, 1, 0, 25, 40, 2, 30]
    reader = _Files()
    taken, ahead = [], 0
    for batch in files_ahead(reader, _tasks(sizes)):
        taken.append((batch.column(0)[0].as_py(), batch.column(1)[0].as_py()))
        time.sleep(0.002)  # a consumer slower than the reading
        with reader.lock:
            ahead = max(ahead, reader.made - len(taken))
    assert taken == [(f"f{k}", i) for k, n in enumerate(sizes) for i in range(n)]
    assert 0 < ahead <= FILES_AHEAD * (FILE_DEPTH + 2), ahead
    gone = _Files()
    stream = files_ahead(gone, _tasks([1_000] * 5))
    next(stream)
    stream.close()  # the query stopped early: the readers stop too
    made = gone.made
    time.sleep(0.2)
    assert gone.made == made <= FILES_AHEAD * (FILE_DEPTH + 2)
