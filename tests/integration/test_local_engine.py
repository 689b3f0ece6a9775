"""The local engine's reading: plain Parquet files read a batch at a time by their own
reader, others streamed by pyiceberg's reader, both on a reader thread; the public
file-at-once path as a fallback; and the Arrow memory pool a load allocates from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import ArrowScan

from bulldozer.cli.process import use_load_memory_pool
from bulldozer.codec.digest import digest_pairs
from bulldozer.errors import AliasNotFoundError, LoadError
from bulldozer.kv import KvClient
from bulldozer.load.engines import local
from bulldozer.load.runner import run_job
from bulldozer.spec import load_spec_text
from bulldozer.versioning.run_state import LEDGER_LABEL
from bulldozer.warehouse.sample import create_sample_warehouse
from tests.conftest import REPO

pytestmark = pytest.mark.integration
TEMPLATE = (REPO / "templates" / "move_data_to_kv_dal.yaml").read_text()
ROWS, FILE_ROWS = 3_000, 1_000


@pytest.fixture
def home(tmp_path: Path) -> Path:
    create_sample_warehouse(tmp_path, rows=ROWS, chunk_rows=FILE_ROWS)  # three data files, three splits
    return tmp_path


def _run(home: Path, dal: KvClient) -> tuple[str, int, dict[str, object]]:
    record = run_job(load_spec_text(TEMPLATE, "job.yaml", env={}), dal, home=str(home))
    info = dal.describe(record.version)
    return record.digest, record.rows, json.loads(info.labels.get(LEDGER_LABEL, "{}"))


def test_files_are_streamed_not_decoded_whole(home: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch) -> None:
    def whole_file(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the file-at-once path was used")

    read_by_parquet: list[str] = []
    original = local.parquet_batches

    def spy(arrow_scan: ArrowScan, task: Any, batch_rows: int, batch_bytes: int) -> Any:
        batches = original(arrow_scan, task, batch_rows, batch_bytes)
        if batches is not None:
            read_by_parquet.append(task.file.file_path)
        return batches

    monkeypatch.setattr(ArrowScan, "to_record_batches", whole_file)
    monkeypatch.setattr(local, "parquet_batches", spy)
    _digest, rows, ledger = _run(home, dal)
    assert rows == ROWS
    assert len(ledger) == ROWS // FILE_ROWS  # one ledger entry per file, in the ledger after its batches
    assert len(read_by_parquet) == ROWS // FILE_ROWS  # plain files: the Parquet batch reader


def _evolved_table(tmp_path: Path) -> Any:
    """A table whose files predate its schema: the first file has (id, a, gone), the second
    (id, a, b) after ``b`` was added and ``gone`` dropped, and ``a`` is renamed ``renamed``."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    catalog = SqlCatalog("evolved", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=tmp_path.as_uri())
    catalog.create_namespace("ns")
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "a", StringType(), required=False),
        NestedField(3, "gone", StringType(), required=False),
    )
    table = catalog.create_table("ns.t", schema=schema)
    table.append(pa.table({"id": [1, 2, 3], "a": ["x", None, "z"], "gone": ["g", "g", "g"]}))
    with table.update_schema() as update:
        update.add_column("b", LongType())
        update.delete_column("gone")
    table.append(pa.table({"id": [4, 5], "a": ["u", "v"], "b": [40, None]}))
    with table.update_schema() as update:
        update.rename_column("a", "renamed")
    return catalog.load_table("ns.t")


def _both_readers(table: Any, scan: Any) -> tuple[pa.Table, pa.Table]:
    from pyiceberg.io.pyarrow import _read_all_delete_files

    tasks = local.scan_tasks(scan)
    arrow_scan = ArrowScan(table.metadata, table.io, scan.projection(), scan.row_filter, scan.case_sensitive)
    ours = [
        batch
        for task in tasks
        for batch in local.parquet_batches(arrow_scan, task, local.BATCH_ROWS, local.BATCH_BYTES) or []
    ]
    theirs = list(
        arrow_scan._record_batches_from_scan_tasks_and_deletes(tasks, _read_all_delete_files(table.io, tasks))
    )
    return pa.Table.from_batches(ours), pa.Table.from_batches(theirs)


def test_the_parquet_batch_reader_reads_evolved_files_as_pyiceberg_does(tmp_path: Path) -> None:
    table = _evolved_table(tmp_path)
    for columns in (("*",), ("renamed", "b"), ("b", "id")):
        ours, theirs = _both_readers(table, table.scan(selected_fields=columns))
        assert ours.num_rows == 5
        assert ours.schema.equals(theirs.schema) and ours.equals(theirs), columns
    ours, _ = _both_readers(table, table.scan())
    by_id = {row["id"]: row for row in ours.to_pylist()}
    assert by_id[2] == {"id": 2, "renamed": None, "b": None}  # the column added later: null in old files
    assert by_id[4] == {"id": 4, "renamed": "u", "b": 40}


def test_a_row_filter_is_applied_by_the_files_own_reader_as_pyicebergs_reader_applies_it(tmp_path: Path) -> None:
    """A filtered task went through pyiceberg's reader, which takes no batch size (131,072
    rows a batch, whatever they held). The file's own reader now applies the filter as
    pyiceberg's reader does: translated to each file's columns (a renamed column, one an old
    file lacks, one a filter reads but the scan does not select), on the same rows."""
    table = _evolved_table(tmp_path)
    for row_filter, selected in (
        ("id > 2", ("*",)),
        ("renamed = 'u' or renamed is null", ("id", "b")),  # renamed: a in the files
        ("b is null", ("*",)),  # b: missing from the first file, null there
        ("b > 10", ("id",)),  # a filter column the scan does not select
    ):
        ours, theirs = _both_readers(table, table.scan(row_filter=row_filter, selected_fields=selected))
        assert ours.schema.equals(theirs.schema), row_filter
        assert ours.sort_by("id").to_pylist() == theirs.sort_by("id").to_pylist(), row_filter
    b_null, _ = _both_readers(table, table.scan(row_filter="b is null"))
    assert sorted(b_null.column("id").to_pylist()) == [1, 2, 3, 5]


def test_a_row_filter_skips_the_row_groups_its_statistics_rule_out(tmp_path: Path) -> None:
    """pyiceberg's reader skips a file's row groups the filter rules out by their statistics;
    the file's own reader does too (a filter on a sorted column of one large file would
    otherwise decode all of it), reading the same rows."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse import pyiceberg_fast
    from bulldozer.warehouse.catalog import open_catalog

    catalog = open_catalog(CatalogConfig(), tmp_path)
    catalog.create_namespace("g")
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "v", StringType()))
    table = catalog.create_table("g.t", schema=schema, properties={"write.parquet.row-group-limit": "250"})
    fields = [pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())]
    table.append(pa.table([pa.array(range(1_000)), pa.array([f"v{i}" for i in range(1_000)])], pa.schema(fields)))
    (task,) = local.scan_tasks(table.scan())
    path = task.file.file_path.removeprefix("file://")
    assert pq.ParquetFile(path).metadata.num_row_groups == 4
    ours, theirs = _both_readers(table, table.scan(row_filter="id >= 600 and id < 700"))
    assert ours.to_pylist() == theirs.to_pylist() and ours.column("id").to_pylist() == list(range(600, 700))
    parquet = pq.ParquetFile(path)
    with open(path, "rb") as fin:
        read = list(pyiceberg_fast._row_group_batches(parquet, fin, pc.field("id") >= 600, 1_000, ["id"]))
    assert [(first, batch.num_rows) for first, batch in read] == [(500, 250), (750, 250)]  # not groups 0 and 1


def test_a_batch_of_large_rows_is_bounded_by_its_bytes_not_only_its_rows(tmp_path: Path) -> None:
    """A file's own reader decoded ``BATCH_ROWS`` rows a batch whatever they held: 20 k rows
    of 200 KB values took 9.2 GiB of anonymous memory to load (one 4 GiB batch, then its
    records), and 65 k rows of 1 MB values (a store takes values of up to 32 MiB) would
    not have fitted this machine. A batch is now about ``BATCH_BYTES`` by the file's sizes
    (that load: 1.3 GiB, the rest the allocator's cache), and rows of a few dozen bytes keep
    their ``BATCH_ROWS``. A row filter too (it was read by pyiceberg's reader, 131,072 rows
    a batch whatever they held)."""
    import pyarrow.parquet as pq
    from pyiceberg.schema import Schema
    from pyiceberg.types import BinaryType, LongType, NestedField

    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse.catalog import open_catalog

    catalog = open_catalog(CatalogConfig(), tmp_path)
    catalog.create_namespace("w")
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "blob", BinaryType()))
    table = catalog.create_table("w.blobs", schema=schema)
    rows, size = 1_000, 100_000  # 100 MB in one row group, 1 MB compressed
    fields = [pa.field("id", pa.int64(), nullable=False), pa.field("blob", pa.binary())]
    data = pa.table(
        [pa.array(range(rows)), pa.array([b"%07d " % i * (size // 8) for i in range(rows)])], pa.schema(fields)
    )
    table.append(data)
    (task,) = local.scan_tasks(table.scan())
    assert pq.ParquetFile(task.file.file_path.removeprefix("file://")).metadata.num_row_groups == 1
    batches = list(local.task_batches(table, table.scan(), task))
    assert sum(b.num_rows for b in batches) == rows and len(batches) > 1
    assert max(b.nbytes for b in batches) <= local.BATCH_BYTES * 1.1
    ids = table.scan(selected_fields=("id",))  # the narrow column alone: one batch, as before
    (task,) = local.scan_tasks(ids)
    assert [b.num_rows for b in local.task_batches(table, ids, task)] == [rows]
    # a row filter went through pyiceberg's reader, which takes no batch size: one 100 MB batch
    filtered = table.scan(row_filter="id >= 10 and id < 990")
    (task,) = local.scan_tasks(filtered)
    batches = list(local.task_batches(table, filtered, task))
    assert [i for b in batches for i in b.column("id").to_pylist()] == list(range(10, 990))
    assert len(batches) > 1 and max(b.nbytes for b in batches) <= local.BATCH_BYTES * 1.1


@pytest.mark.parametrize("column", ["string", "binary"])
def test_a_dictionary_column_repeating_a_large_value_is_read_in_batches_of_bounded_bytes(
    column: str, tmp_path: Path
) -> None:
    """A dictionary-encoded column holds each distinct value once, so its chunk's sizes say
    nothing of its rows: 400 rows repeating one 1 MiB value are a 1 MB column chunk (a few
    KB on disk), and batches sized by it were all 400 rows at once: 400 MB a batch (at
    3,000 rows, 3 GB, 4.1 GiB of memory and 41 s for a 66 KB file). A batch is now bounded
    by the dictionary's longest entry too; its neighbour column keeps its rows."""
    import pyarrow.parquet as pq
    from pyiceberg.schema import Schema
    from pyiceberg.types import BinaryType, LongType, NestedField, StringType

    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse.catalog import open_catalog

    catalog = open_catalog(CatalogConfig(), tmp_path)
    catalog.create_namespace("w")
    kind = StringType() if column == "string" else BinaryType()
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "big", kind))
    table = catalog.create_table("w.repeated", schema=schema)
    rows, size = 400, 1 << 20  # 400 MB as written: one data file
    value: str | bytes = "x" * size if column == "string" else b"x" * size
    fields = [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("big", pa.string() if column == "string" else pa.binary()),
    ]
    table.append(pa.table([pa.array(range(rows)), pa.array([value] * rows)], pa.schema(fields)))
    (task,) = local.scan_tasks(table.scan())
    chunk = pq.ParquetFile(task.file.file_path.removeprefix("file://")).metadata.row_group(0).column(1)
    assert chunk.has_dictionary_page and chunk.total_uncompressed_size < 2 * size  # the value, once
    batches = list(local.task_batches(table, table.scan(), task))
    assert sum(b.num_rows for b in batches) == rows
    assert max(b.nbytes for b in batches) <= local.BATCH_BYTES * 1.1
    assert all(v == value for b in batches[:2] for v in b.column("big").to_pylist())
    ids = table.scan(selected_fields=("id",))  # the narrow column alone: one batch, as before
    (task,) = local.scan_tasks(ids)
    assert [b.num_rows for b in local.task_batches(table, ids, task)] == [rows]


def test_a_spec_filter_loads_exactly_the_matching_rows(home: Path, dal: KvClient) -> None:
    from bulldozer.warehouse.catalog import load_table, open_catalog

    text = TEMPLATE.replace(
        "  key_columns: [user_id, item_id, locale]",
        '  filter: "item_id < 20"\n  key_columns: [user_id, item_id, locale]',
    )
    table = load_table(open_catalog(None, home), "sample.user_item_scores")
    expected = table.scan(row_filter="item_id < 20").to_arrow().num_rows
    assert 0 < expected < ROWS
    record = run_job(
        load_spec_text(text.replace("min_rows: 1000", "min_rows: 1"), "job.yaml", env={}), dal, home=str(home)
    )
    assert record.rows == expected
    assert dal.describe(record.version).record_count == expected


def test_the_pinned_pyiceberg_has_the_streaming_reader() -> None:
    # private pieces of pyiceberg: an upgrade that drops them falls back to whole files (slower, same data)
    assert local.streaming_reader(ArrowScan.__new__(ArrowScan)) is not None


def test_without_pyicebergs_streaming_reader_the_public_path_loads_the_same_records(
    home: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    streamed = _run(home, dal)
    monkeypatch.setattr(local, "streaming_reader", lambda arrow_scan: None)
    assert _run(home, dal)[:2] == streamed[:2]  # same rows, same digest


@pytest.mark.parametrize("reader", ["parquet", "pyiceberg"])
def test_a_failing_read_fails_the_run_and_leaves_no_reader_behind(
    home: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch, reader: str
) -> None:
    import threading

    import pyarrow.parquet as pq

    owner: Any = pq.ParquetFile if reader == "parquet" else ArrowScan
    method = "iter_batches" if reader == "parquet" else "_record_batches_from_scan_tasks_and_deletes"
    if reader == "pyiceberg":
        monkeypatch.setattr(local, "parquet_batches", lambda arrow_scan, task, batch_rows, batch_bytes: None)
    original = getattr(owner, method)
    calls = {"n": 0}

    def second_file_fails(self: Any, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk read error in the second file")
        yield from original(self, *args, **kwargs)

    monkeypatch.setattr(owner, method, second_file_fails)
    with pytest.raises(
        LoadError, match=r"^cannot read the data file file://\S+\.parquet: disk read error in the second file$"
    ):
        run_job(load_spec_text(TEMPLATE, "job.yaml", env={}), dal, home=str(home))
    assert not any(t.name == "source-reader" for t in threading.enumerate())
    with pytest.raises(AliasNotFoundError):
        dal.get_alias("user_item_scores")  # never flipped


def test_loads_allocate_from_jemalloc_unless_the_environment_chose_a_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    before = pa.default_memory_pool()
    try:
        try:
            pa.jemalloc_memory_pool()
        except NotImplementedError:
            expected = before.backend_name  # a pyarrow built without jemalloc keeps its default
        else:
            expected = "jemalloc"
        assert use_load_memory_pool() == expected == pa.default_memory_pool().backend_name
        monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "system")
        pa.set_memory_pool(pa.system_memory_pool())
        assert use_load_memory_pool() == "system"  # the user's choice stands
    finally:
        pa.set_memory_pool(before)


def test_a_writers_acknowledgement_waiter_covers_what_was_sent_before_it(dal: KvClient) -> None:
    from bulldozer.errors import NamespaceNotFoundError
    from bulldozer.names import new_version_name

    name = new_version_name("acks")
    dal.create_namespace(name, "acks")
    with dal.writer(name, batch_records=10, in_flight=8) as writer:
        writer.add_many((b"k%03d" % i, b"v") for i in range(95))
        acknowledged = writer.sent_so_far()  # sends the 5 buffered records too
        covered = list(writer._pending)
        assert len(covered) == 8  # in flight: the window; the 2 before them were waited for already
        writer.add_many((b"later%03d" % i, b"v") for i in range(30))  # the writer goes on meanwhile
        acknowledged()
        assert all(f.done() for f in covered)
    expected = digest_pairs([(b"k%03d" % i, b"v") for i in range(95)] + [(b"later%03d" % i, b"v") for i in range(30)])
    assert dal.seal(name, expected_records=125, expected_digest=expected.value).verified
    with dal.writer("acks__v20000101000000_000000") as missing:  # no such version: every batch fails
        missing.add(b"k", b"v")
        fails = missing.sent_so_far()
        with pytest.raises(NamespaceNotFoundError):
            fails()
        with pytest.raises(NamespaceNotFoundError):
            missing.sync()


def test_duplicate_key_hashes_are_found_sorted_or_not() -> None:
    import numpy as np

    from bulldozer.codec.digest import duplicate_hashes as _duplicates

    rng = np.random.default_rng(7)
    pieces = [rng.integers(0, 2**63, 1000, dtype=np.int64).view(np.uint64) for _ in range(3)]
    pieces[2][17] = pieces[0][500]  # one key in two batches
    assert _duplicates(pieces) == {int(pieces[0][500])}  # unsorted pieces (a resumed run adds some)
    assert _duplicates([np.sort(np.concatenate(pieces))]) == {int(pieces[0][500])}  # sorted by the engine
    assert _duplicates([np.sort(np.concatenate(pieces[:2]))]) == set()
    assert _duplicates([]) == set()


def test_the_next_local_file_is_read_ahead_into_the_page_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    advised: list[str] = []
    real = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        assert advice == os.POSIX_FADV_WILLNEED
        advised.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    data, escaped = tmp_path / "a b.parquet", tmp_path / "a%20b.parquet"
    data.write_bytes(b"x" * 1000)
    escaped.write_bytes(b"x" * 1000)
    local._will_need(f"file://{data}")  # a location as pyiceberg writes it: the path as it stands
    local._will_need(str(data))
    local._will_need(data.as_uri())  # escaped: pyiceberg's reader opens a%20b.parquet, and so does this
    local._will_need("s3://bucket/key.parquet")  # left to that file system
    local._will_need(str(tmp_path / "gone.parquet"))  # best effort: no error
    local._will_need(None)
    assert advised == [str(data), str(data), str(escaped)]


def test_a_fifo_in_the_next_files_place_is_not_waited_on(tmp_path: Path) -> None:
    """The read-ahead of the next split's file opened it before anything checked it, and a
    FIFO there (no writer ever comes) held the load in that open for good."""
    import os
    import threading

    fifo = tmp_path / "part-1.parquet"
    os.mkfifo(fifo)
    advised = threading.Thread(target=local._will_need, args=(str(fifo),), daemon=True)
    advised.start()
    advised.join(5)
    try:
        assert not advised.is_alive(), "the read-ahead waited on a FIFO"
    finally:
        if advised.is_alive():  # the code before: free its thread (a writer comes)
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_load_advises_each_next_split_file(home: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []
    monkeypatch.setattr(local, "_will_need", seen.append)
    _run(home, dal)
    files = sorted(p.as_uri() for p in (home / "warehouse").rglob("*.parquet"))  # the splits' order
    assert len(files) == ROWS // FILE_ROWS
    # as each split starts, the next one's file; after the last split, nothing
    assert seen == [*files[1:], None]
