"""The bounds of the batches a load reads from its source, whatever reads them: at most
``BATCH_ROWS`` rows and about ``BATCH_BYTES`` bytes a batch, so one batch of wide rows
does not take the machine's memory (a file's own reader sizes its batches by the file's
uncompressed sizes, ``warehouse.pyiceberg_fast``; a query's are combined from pieces,
``combined``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa

__all__ = ["BATCH_BYTES", "BATCH_ROWS", "PIECE_ROWS", "combined"]

BATCH_ROWS = 65_536
#: About the most bytes of a batch a reader decodes: above what ``BATCH_ROWS`` rows of the
#: benchmark's tables hold (2.2 MiB flat, 8.5 MiB nested: their batches are as before), the
#: writer's batch bytes. 20 k rows of 200 KB values: 9.2 GiB peak anonymous memory → 1.3 GiB
#: (64 MiB: 1.7 GiB)
BATCH_BYTES = 16 * 1024 * 1024
#: The rows of each piece a query's batches are combined from: DuckDB's vector. A query's
#: rows were read 65,536 at a time whatever they held (20 k rows of 200 KB values: one 4 GB
#: batch); read in pieces and combined, 10 M rows of (bigint, varchar, decimal) took as long
#: (0.12-0.16 s against 0.13-0.18 s, 3 runs each)
PIECE_ROWS = 2_048


def combined(
    pieces: Iterable[pa.RecordBatch], rows: int = BATCH_ROWS, nbytes: int = BATCH_BYTES
) -> Iterator[pa.RecordBatch]:
    """``pieces`` (batches of one schema) combined into batches of ``rows`` rows, or fewer
    where they hold ``nbytes`` bytes first: a batch holds at most ``nbytes`` plus one piece."""
    held: list[pa.RecordBatch] = []
    held_rows = held_bytes = 0
    for piece in pieces:
        held.append(piece)
        held_rows += piece.num_rows
        held_bytes += piece.nbytes
        if held_rows >= rows or held_bytes >= nbytes:
            yield held[0] if len(held) == 1 else pa.concat_batches(held)
            held, held_rows, held_bytes = [], 0, 0
    if held_rows:
        yield held[0] if len(held) == 1 else pa.concat_batches(held)
