"""``local``: load with pyiceberg + Arrow on this machine, no JVM.

The pinned snapshot is planned into file-scan tasks (the splits); each task is read as a
stream of Arrow record batches on a reader thread a few batches ahead
(``bulldozer.load.prefetch``), encoded column-wise, and sent through the client's batch
writer while the next batch is encoded (the writer keeps several batches in flight on gRPC's
own threads). A plain Parquet file is read by its own batch reader a batch at a time; a
task with a row filter or delete files goes through pyiceberg's reader (the filter pushed
into the scan), which decodes a row group at a time (both shortcuts past pyiceberg's public
API live in ``bulldozer.warehouse.pyiceberg_fast``, with their measured reasons). Memory
stays bounded by a row group and a few batches, whatever the table's size, and a file's own
reader makes a batch of large rows fewer rows (``BATCH_BYTES``).
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from bulldozer.codec.digest import Digest, digest_and_key_hashes, key_hashes
from bulldozer.errors import LoadError
from bulldozer.kv.client import KvClient
from bulldozer.load.batches import BATCH_BYTES, BATCH_ROWS
from bulldozer.load.encoder.encode import RowEncoder
from bulldozer.load.engines.base import LoadEngine, LoadPlan, LoadResult, Progress, SplitDone, SplitResult
from bulldozer.load.prefetch import read_ahead
from bulldozer.spec.models import JobSpec
from bulldozer.warehouse.equality_deletes import Applied, EqualityDeletesCache
from bulldozer.warehouse.files import checked_tasks, unreadable_file, verify_task_files
from bulldozer.warehouse.pyiceberg_fast import parquet_batches, streaming_reader

__all__ = ["LocalEngine", "SplitReader", "scan_tasks", "source_scan", "split_id", "task_batches", "with_next_file"]

#: Batches the reader thread decodes ahead of the encoder.
READ_AHEAD = 4


def split_id(task: Any) -> str:
    """A stable id of one Iceberg file-scan task."""
    raw = f"{task.file.file_path}|{getattr(task, 'start', 0)}|{getattr(task, 'length', 0)}"
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def source_scan(table: Any, spec: JobSpec, snapshot_id: int, columns: list[str]) -> Any:
    """The pyiceberg scan of the job's source table at ``snapshot_id``: ``columns``, the
    spec's row filter."""
    from pyiceberg.expressions import AlwaysTrue

    row_filter: Any = spec.data_movement.filter or AlwaysTrue()
    return table.scan(row_filter=row_filter, selected_fields=tuple(columns), snapshot_id=snapshot_id)


def _scan(plan: LoadPlan, columns: list[str]) -> Any:
    return source_scan(plan.table, plan.spec, plan.snapshot_id, columns)


def scan_tasks(scan: Any) -> list[Any]:
    """The scan's file-scan tasks (the splits), in file order; each file under the table's
    location or a root the operator allows (``warehouse.files``)."""
    return sorted(checked_tasks(scan), key=lambda t: t.file.file_path)


def _will_need(location: str | None) -> None:
    """Ask the kernel to read a local data file into the page cache in the background
    (best effort; other file systems are left to their own read-ahead). The reader asks for
    the next split's file as it starts a split: that file's reads then overlap this one's
    work instead of waiting behind whatever the disk is busy with at the split boundary
    (the DAL's fsync of the split just loaded, measured as a 0.8 s stall). Opened without
    blocking and without following a last link: the file is not checked yet (its reader
    checks it, ``warehouse.file_io``), and a FIFO put in its place held this open until a
    writer came, which none does."""
    if not location:
        return
    from pyiceberg.io.pyarrow import PyArrowFileIO

    scheme, _, path = PyArrowFileIO.parse_location(location)  # the path its reader opens (not unquoted)
    if scheme != "file":
        return
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass(frozen=True)
class SplitReader:
    """What reading a scan's splits needs without the table's catalog: the table's metadata
    and file IO, the scan's projection and row filter. It pickles (the Spark engine's write
    tasks read their own splits with it, on the executors)."""

    metadata: Any
    io: Any
    projection: Any
    row_filter: Any
    case_sensitive: bool = True
    #: the equality deletes read last, for the next splits they apply to as well
    deletes: EqualityDeletesCache = field(default_factory=EqualityDeletesCache, compare=False, repr=False)

    @classmethod
    def of(cls, table: Any, scan: Any) -> SplitReader:
        return cls(table.metadata, table.io, scan.projection(), scan.row_filter, scan.case_sensitive)

    def batches(self, task: Any, next_location: str | None = None) -> Iterator[pa.RecordBatch]:
        """One split's batches of at most ``BATCH_ROWS`` rows, as the load sends them
        (``next_location``: the file read after this one, asked into the page cache), its
        equality deletes applied (``warehouse.equality_deletes``: pyiceberg applies its
        positional ones)."""
        from pyiceberg.io.pyarrow import ArrowScan

        _will_need(next_location)
        deletes = Applied(self.metadata, self.io, self.projection, self.case_sensitive, task, self.deletes)
        arrow_scan = ArrowScan(self.metadata, self.io, deletes.projection, self.row_filter, self.case_sensitive)
        try:
            batches = parquet_batches(arrow_scan, task, BATCH_ROWS, BATCH_BYTES)
            if batches is None:
                verify_task_files(self.io, [task])  # pyiceberg's reader reads them as they are
                streaming = streaming_reader(arrow_scan)
                batches = streaming(task) if streaming is not None else arrow_scan.to_record_batches([task])
            for batch in batches:
                if deletes:
                    batch = deletes.kept(batch)
                for start in range(0, batch.num_rows, BATCH_ROWS):
                    yield batch.slice(start, BATCH_ROWS)
        except (OSError, pa.ArrowException) as exc:
            raise unreadable_file(task.file.file_path, exc) from exc


def with_next_file(tasks: list[Any]) -> list[tuple[Any, str | None]]:
    """Each split with the file read after it (None after the last): its reader asks for
    that file ahead (``_will_need``)."""
    following: list[str | None] = [t.file.file_path for t in tasks[1:]]
    return list(zip(tasks, [*following, None] if tasks else [], strict=True))  # none: a filter kept no file


def task_batches(table: Any, scan: Any, task: Any, next_location: str | None = None) -> Iterator[pa.RecordBatch]:
    """One split's batches of at most ``BATCH_ROWS`` rows, as the load sends them."""
    return SplitReader.of(table, scan).batches(task, next_location)


def _split_stream(splits: list[tuple[str, Iterable[pa.RecordBatch]]]) -> Iterator[tuple[str, pa.RecordBatch | None]]:
    """(split id, batch) for every batch of every split, then (split id, None) once the
    split's last batch has been read."""
    for sid, batches in splits:
        for batch in batches:
            if batch.num_rows:
                yield sid, batch
        yield sid, None


def _interrupter(splits: list[tuple[str, Iterable[pa.RecordBatch]]]) -> Callable[[], None]:
    """What stops the splits' queries (a QueryReader's ``interrupt``) when the load ends early."""
    stops = [stop for _sid, batches in splits if (stop := getattr(batches, "interrupt", None)) is not None]

    def interrupt() -> None:
        for stop in stops:
            stop()

    return interrupt


def _record_split(acknowledged: Callable[[], None], on_split: SplitDone, split: SplitResult) -> None:
    acknowledged()
    on_split(split)


def _past_output_bound(bound: int, written: int) -> LoadError:
    from pydantic import ByteSize

    return LoadError(
        f"the query wrote more than the {ByteSize(bound).human_readable(separator=' ')} of records a spec's query "
        f"may write into its version (BULLDOZER_QUERY_OUTPUT): {ByteSize(written).human_readable(separator=' ')} "
        "so far; the version is not kept"
    )


class LocalEngine(LoadEngine):
    name = "local"
    runs_sql = True

    def _splits(self, plan: LoadPlan, columns: list[str]) -> list[tuple[str, int, Iterable[pa.RecordBatch]]]:
        """(split id, rows expected, lazy batches) for each split of the source; the scan is
        planned once, and a split's file is only read when its batches are iterated."""
        if plan.sql is not None:
            from bulldozer.load.source import QueryReader

            return [("sql", 0, QueryReader(plan.sql, columns))]
        scan = _scan(plan, columns)
        reader = SplitReader.of(plan.table, scan)
        return [
            (split_id(task), task.file.record_count, reader.batches(task, then))
            for task, then in with_next_file(scan_tasks(scan))
        ]

    def load(self, plan: LoadPlan, client: KvClient, on_split: SplitDone, progress: Progress) -> LoadResult:
        splits = self._splits(plan, plan.columns)
        expected = sum(rows for _sid, rows, _batches in splits)
        encoder = RowEncoder(plan.proto, limits=client.describe_store())
        result = LoadResult(splits=dict(plan.done))
        write = plan.spec.key_value_dal.write
        done_rows = sum(s.rows for s in plan.done.values())
        progress(done_rows, expected)
        # a query's one split: what it wrote so far is that split's (a query run is never resumed by split)
        bound = plan.sql.max_output_bytes if plan.sql is not None else None
        with client.writer(
            plan.version,
            batch_records=write.batch_size,
            batch_bytes=write.max_batch_bytes,
            in_flight=write.in_flight_batches,
        ) as writer:
            throttle = Throttle(write.records_per_second)
            todo = [(sid, batches) for sid, _rows, batches in splits if sid not in plan.done]
            split: SplitResult | None = None
            recorded: list[Future[None]] = []
            with (
                read_ahead(_split_stream(todo), READ_AHEAD, "source-reader", _interrupter(todo)) as stream,
                ThreadPoolExecutor(1, thread_name_prefix="split-ledger") as ledger,
            ):
                for sid, batch in stream:
                    split = split or SplitResult(sid, 0, Digest())
                    if batch is None:
                        # The split is read and sent: the ledger says so once all of it is
                        # acknowledged, on the ledger's thread and in split order, while the
                        # next split is sent (no pause to drain the writer at each split).
                        recorded.append(ledger.submit(_record_split, writer.sent_so_far(), on_split, split))
                        result.splits[sid] = split
                        split = None
                        continue
                    encoded = encoder.encode(batch)
                    writer.add_arrays(encoded.keys, encoded.values)
                    split.rows += batch.num_rows
                    digest, hashes = digest_and_key_hashes(encoded.keys, encoded.values)
                    split.digest.add(digest)
                    if bound is not None and split.digest.bytes > bound:
                        raise _past_output_bound(bound, split.digest.bytes)
                    for name in batch.schema.names:
                        nulls = batch.column(name).null_count
                        if nulls:
                            split.null_counts[name] = split.null_counts.get(name, 0) + nulls
                    result.key_hashes.append(hashes)
                    done_rows += batch.num_rows
                    progress(done_rows, expected)
                    throttle.wait(batch.num_rows)
                for done in recorded:
                    done.result()  # a failed acknowledgement or ledger write fails the load
        return result

    def key_hashes_of(self, plan: LoadPlan, split_ids: set[str] | None) -> list[np.ndarray[Any, Any]]:
        encoder = RowEncoder(plan.proto)
        out = []
        for sid, _rows, batches in self._splits(plan, [f.column for f in plan.proto.key.fields]):
            if split_ids is None or sid in split_ids:
                out += [key_hashes(encoder.encode_keys(batch)) for batch in batches]
        return out

    def find_keys(self, plan: LoadPlan, hashes: set[int], limit: int = 3) -> list[dict[str, Any]]:
        columns = [f.column for f in plan.proto.key.fields]
        encoder = RowEncoder(plan.proto)
        found: list[dict[str, Any]] = []
        wanted = np.array(sorted(hashes), dtype=np.uint64)
        for _sid, _rows, batches in self._splits(plan, columns):
            for batch in batches:
                h = key_hashes(encoder.encode_keys(batch))
                hits = np.nonzero(np.isin(h, wanted))[0]
                for i in hits[: limit - len(found)]:
                    found.append({c: batch.column(c)[int(i)].as_py() for c in columns})
                if len(found) >= limit:
                    return found
        return found


class Throttle:
    """Keeps the send rate under ``records_per_second`` (None: no limit)."""

    def __init__(self, rate: int | None) -> None:
        self.rate = rate
        self.started = time.monotonic()
        self.sent = 0

    def wait(self, n: int) -> None:
        if not self.rate:
            return
        self.sent += n
        ahead = self.sent / self.rate - (time.monotonic() - self.started)
        if ahead > 0:
            time.sleep(ahead)
