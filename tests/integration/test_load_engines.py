"""One behaviour suite over every load engine (``local`` and ``spark``): the same table
gives the same rows and the same digest (the one computed here from the table with the
encoder alone, outside any engine), a spec filter loads exactly the matching rows, and bad
data is refused with the same error, on every engine.

The tables are made once per module; each engine shares one Spark session across its
cases (Spark starts in ≈ 7 s)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from bulldozer.codec.digest import Digest, digest_arrays
from bulldozer.errors import DuplicateKeyError, SourceDataError
from bulldozer.kv import KvClient
from bulldozer.kv.types import State
from bulldozer.load.encoder.encode import RowEncoder
from bulldozer.load.runner import run_job
from bulldozer.schema.job import build_job_schema
from bulldozer.spec import load_spec_text
from bulldozer.spec.loader import LoadedSpec
from bulldozer.spec.models import CatalogConfig
from bulldozer.warehouse.catalog import load_table, open_catalog
from bulldozer.warehouse.sample import create_sample_warehouse, generate_sample
from tests.conftest import REPO
from tests.integration.iceberg_java import JavaTable
from tests.integration.test_run import _cli

pytestmark = pytest.mark.integration
TEMPLATE = (REPO / "templates" / "move_data_to_kv_dal.yaml").read_text()
TABLE = "sample.user_item_scores"
ENGINES = ["local", pytest.param("spark", marks=pytest.mark.spark)]


def _spec(text: str = TEMPLATE) -> LoadedSpec:
    return load_spec_text(text, "job.yaml", env={})


@pytest.fixture(scope="module", autouse=True)
def _spark_session() -> Iterator[None]:
    yield
    from bulldozer.load.engines.spark import stop_spark_session

    stop_spark_session()


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("engines")
    create_sample_warehouse(home, rows=3_000, chunk_rows=1_000)  # three files: three splits
    return home


def _expected_digest(home: Path, loaded: LoadedSpec, row_filter: str | None = None) -> Digest:
    """What a version of the table must hold, from the encoder alone."""
    table = load_table(open_catalog(CatalogConfig(), home), TABLE)
    job = build_job_schema(loaded.spec, table.schema())
    arrow = table.scan(row_filter=row_filter) if row_filter else table.scan()
    encoded = RowEncoder(job.proto).encode(arrow.to_arrow())
    return digest_arrays(encoded.keys, encoded.values)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_stores_the_tables_rows_with_the_expected_digest(engine: str, sample: Path, dal: KvClient) -> None:
    loaded = _spec()
    expected = _expected_digest(sample, loaded)
    record = run_job(loaded, dal, engine=engine, home=str(sample))
    info = dal.describe(record.version)
    assert (record.engine, record.rows, info.record_count) == (engine, 3_000, expected.count)
    assert info.digest == expected.value and info.verified and info.state == State.ACTIVE


@pytest.mark.parametrize("engine", [*ENGINES, pytest.param("spark-by-key", marks=pytest.mark.spark)])
def test_every_engine_loads_exactly_the_rows_a_filter_keeps(engine: str, sample: Path, dal: KvClient) -> None:
    """spark-by-key: more write tasks than the table's three files, so Spark reads the table
    and repartitions it by key, with the filter as Columns (load.engines.spark.row_filter)."""
    text = TEMPLATE.replace(
        "  key_columns: [user_id, item_id, locale]",
        '  filter: "item_id < 20"\n  key_columns: [user_id, item_id, locale]',
    ).replace("min_rows: 1000", "min_rows: 1")
    if engine == "spark-by-key":
        engine, text = (
            "spark",
            text.replace("    in_flight_batches: 4 ", "    partitions: 4\n    in_flight_batches: 4 "),
        )
    loaded = _spec(text)
    expected = _expected_digest(sample, loaded, "item_id < 20")
    assert 0 < expected.count < 3_000
    record = run_job(loaded, dal, engine=engine, home=str(sample))
    info = dal.describe(record.version)
    assert (record.rows, info.record_count, info.digest) == (expected.count, expected.count, expected.value)


@pytest.fixture(scope="module")
def with_refs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample table with three heads: the tag ``published`` at its first snapshot (3 000
    rows), the branch ``audit`` from there with 500 rows more, and main with 200 others."""
    home = tmp_path_factory.mktemp("refs")
    table = create_sample_warehouse(home, rows=3_000, chunk_rows=1_000)
    first = table.current_snapshot().snapshot_id
    table.manage_snapshots().create_tag(first, "published").create_branch(first, "audit").commit()
    schema = table.schema().as_arrow()
    table.append(generate_sample(500, variant=2, start=3_000).cast(schema), branch="audit")
    table.append(generate_sample(200, variant=3, start=5_000).cast(schema))
    return home


@pytest.mark.parametrize(
    ("engine", "ref", "rows"),
    [
        ("local", "audit", 3_500),
        ("local", "published", 3_000),
        ("local-keep-latest", "audit", 3_500),
        pytest.param("spark", "audit", 3_500, marks=pytest.mark.spark),
        pytest.param("spark-by-key", "published", 3_000, marks=pytest.mark.spark),
    ],
)
def test_every_engine_loads_the_branch_or_tag_a_spec_names(
    engine: str, ref: str, rows: int, with_refs: Path, dal: KvClient
) -> None:
    """``data_movement.ref``: the head of that branch or tag, not the current snapshot
    (main's, 3 200 rows), as pyiceberg reads it; spark-by-key: Spark reads that snapshot;
    keep-latest: the query that deduplicates reads it."""
    text = TEMPLATE.replace(
        "  key_columns: [user_id, item_id, locale]", f"  ref: {ref}\n  key_columns: [user_id, item_id, locale]"
    ).replace("alias: user_item_scores", f"alias: at_{ref}")
    if engine == "spark-by-key":
        engine, text = (
            "spark",
            text.replace("    in_flight_batches: 4 ", "    partitions: 4\n    in_flight_batches: 4 "),
        )
    if engine == "local-keep-latest":  # read by a query over the table, pinned at the ref's head
        policy = "duplicate_keys: {policy: keep_latest, order_by: updated_at}"
        engine, text = "local", re.sub(r"duplicate_keys: fail.*", policy, text)
    loaded = _spec(text)
    table = load_table(open_catalog(CatalogConfig(), with_refs), TABLE)
    snapshot = table.snapshot_by_name(ref).snapshot_id
    job = build_job_schema(loaded.spec, table.schema())
    encoded = RowEncoder(job.proto).encode(table.scan(snapshot_id=snapshot).to_arrow())
    expected = digest_arrays(encoded.keys, encoded.values)
    record = run_job(loaded, dal, engine=engine, home=str(with_refs))
    info = dal.describe(record.version)
    assert (record.snapshot_id, record.rows, expected.count) == (snapshot, rows, rows)
    assert (info.record_count, info.digest) == (rows, expected.value)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_loads_an_empty_version_when_a_filter_keeps_no_file(
    engine: str, sample: Path, dal: KvClient
) -> None:
    """A filter the files' statistics rule out everywhere plans no split: the version is empty
    (the min_rows gate says so, or passes at 0), not a failure of the reader's planning."""
    from bulldozer.errors import QualityGateError

    text = TEMPLATE.replace(
        "  key_columns: [user_id, item_id, locale]",
        '  filter: "user_id < 0"\n  key_columns: [user_id, item_id, locale]',
    ).replace("alias: user_item_scores", "alias: emptied")
    with pytest.raises(QualityGateError, match="min_rows"):
        run_job(_spec(text), dal, engine=engine, home=str(sample))
    record = run_job(_spec(text.replace("min_rows: 1000", "min_rows: 0")), dal, engine=engine, home=str(sample))
    assert record.outcome == "succeeded" and record.rows == 0
    assert dal.describe(record.version).record_count == 0


@pytest.mark.spark
@pytest.mark.parametrize("partitions", [pytest.param(3, id="in-place"), pytest.param(4, id="by-key")])
def test_a_filter_is_pyicebergs_grammar_never_spark_sql(
    partitions: int, sample: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spec's filter is untrusted: Spark SQL's reflect() calls static Java methods, so a
    filter handed to Spark as text could read the process's environment and leak it through
    the rows it keeps. On either Spark read path the filter is refused, nothing loaded."""
    from bulldozer.errors import BulldozerError

    monkeypatch.setenv("BULLDOZER_TEST_SECRET", "x")
    leak = "item_id = ascii(substr(reflect('java.lang.System', 'getenv', 'BULLDOZER_TEST_SECRET'), 1, 1))"
    text = (
        TEMPLATE.replace(
            "  key_columns: [user_id, item_id, locale]",
            f'  filter: "{leak}"\n  key_columns: [user_id, item_id, locale]',
        )
        .replace("min_rows: 1000", "min_rows: 1")
        .replace("    in_flight_batches: 4 ", f"    partitions: {partitions}\n    in_flight_batches: 4 ")
        .replace("alias: user_item_scores", "alias: leaked")
    )
    with pytest.raises(BulldozerError) as refused:
        run_job(_spec(text), dal, engine="spark", home=str(sample))
    assert "\n" not in str(refused.value) and "filter" in str(refused.value), str(refused.value)
    assert all(n.state == State.FAILED and n.record_count == 0 for n in dal.list_namespaces("leaked"))


@pytest.fixture(scope="module")
def duplicated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("duplicated")
    create_sample_warehouse(home, rows=2_000)
    table = load_table(open_catalog(CatalogConfig(), home), TABLE)
    table.append(generate_sample(5, variant=3).cast(table.schema().as_arrow()))  # the first 5 keys again
    return home


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_refuses_duplicate_keys_naming_one(engine: str, duplicated: Path, dal: KvClient) -> None:
    with pytest.raises(DuplicateKeyError, match=r'"user_id": 1000000, "item_id": \d+, "locale": "en_US"'):
        run_job(_spec(), dal, engine=engine, home=str(duplicated))
    assert [n.state for n in dal.list_namespaces("user_item_scores")] == [State.FAILED]


@pytest.fixture(scope="module")
def null_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    home = tmp_path_factory.mktemp("null-key")
    catalog = open_catalog(CatalogConfig(), home)
    catalog.create_namespace("sample")
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "name", StringType()))
    table = catalog.create_table("sample.nullable", schema)
    table.append(pa.table({"id": pa.array([1, None, 3], pa.int64()), "name": ["a", "b", "c"]}))
    text = (
        "apiVersion: bulldozer/v1\nkind: MoveDataToKvDal\nmetadata: {name: nullable, owner: tests}\n"
        "data_movement:\n  source: {table: sample.nullable}\n  key_columns: [id]\n"
        "key_value_dal: {alias: nullable}\nbulldozer_protobuf: {package: tests.nullable}\n"
    )
    return home, text


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_refuses_a_null_key(engine: str, null_key: tuple[Path, str], dal: KvClient) -> None:
    home, text = null_key
    with pytest.raises(SourceDataError, match="key column 'id' holds 1 null"):
        run_job(_spec(text), dal, engine=engine, home=str(home))
    assert [n.state for n in dal.list_namespaces("nullable")] == [State.FAILED]


@pytest.fixture(scope="module")
def unreadable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A table whose one data file, written by a writer that checks nothing (as Spark may),
    holds text that is not UTF-8 in ``name`` and a timestamp past the year 9999 in
    ``until`` (Long.MAX_VALUE microseconds, a common "forever")."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    home = tmp_path_factory.mktemp("unreadable")
    catalog = open_catalog(CatalogConfig(), home)
    catalog.create_namespace("sample")
    raw = [b"ok", b"caf\xe9", b"ab"]
    offsets = np.cumsum([0, *map(len, raw)], dtype=np.int32)
    names = pa.Array.from_buffers(pa.string(), 3, [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(raw))])
    rows = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "name": names,
            "until": pa.array([0, 1, 2**63 - 1], pa.timestamp("us")),
        }
    )
    table = catalog.create_table("sample.unreadable", rows.schema)
    data = Path(table.location().removeprefix("file://")) / "data" / "written-elsewhere.parquet"
    data.parent.mkdir(parents=True)
    pq.write_table(rows, data, write_statistics=False)  # pyiceberg's statistics would decode the text
    table.add_files([str(data)])
    return home


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("column", "error"),
    [
        ("name", r"column 'name' holds text that is not UTF-8 \(e\.g\. b'caf\\xe9'\)"),
        ("until", r"column 'until' holds a timestamp outside the years 1 to 9999 \(294247-01-10T04:00:54\.775807\)"),
    ],
)
def test_every_engine_refuses_a_value_no_consumer_could_read(
    engine: str, column: str, error: str, unreadable: Path, dal: KvClient
) -> None:
    """Loaded as they were, each made a verified version go live whose records every
    consumer's parser (text) or conversion (timestamp) refuses: ``bulldozer get`` raised
    ``String field had bad UTF-8`` / ``Timestamp is not valid``."""
    text = (
        "apiVersion: bulldozer/v1\nkind: MoveDataToKvDal\nmetadata: {name: unreadable, owner: tests}\n"
        f"data_movement:\n  source: {{table: sample.unreadable}}\n  key_columns: [id]\n  value_columns: [{column}]\n"
        f"key_value_dal: {{alias: unreadable_{column}}}\nbulldozer_protobuf: {{package: tests.unreadable}}\n"
    )
    with pytest.raises(SourceDataError, match=error):
        run_job(_spec(text), dal, engine=engine, home=str(unreadable))
    assert [n.state for n in dal.list_namespaces(f"unreadable_{column}")] == [State.FAILED]


@pytest.fixture(scope="module")
def long_keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A table keyed by URLs, one of them longer than the embedded store takes as a key."""
    import pyarrow as pa

    home = tmp_path_factory.mktemp("long-keys")
    catalog = open_catalog(CatalogConfig(), home)
    catalog.create_namespace("sample")
    rows = pa.table({"url": ["https://a.example/", "https://b.example/" + "x" * 600], "hits": [1, 2]})
    catalog.create_table("sample.long_keys", rows.schema).append(rows)
    return home


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_refuses_a_record_larger_than_the_store_takes(engine: str, long_keys: Path, dal: KvClient) -> None:
    """The DAL refused such a batch saying ``a key of 621 bytes is over the limit of 511``
    (which row?), and a scheduler retried it. Each engine refuses the record itself, naming
    its key, from the limits the DAL gives (``DescribeStore``); the version is FAILED."""
    info = dal.describe_store()
    assert info is not None and (info.max_key_bytes, info.max_value_bytes) == (511, 32 * 1024 * 1024)
    text = (
        "apiVersion: bulldozer/v1\nkind: MoveDataToKvDal\nmetadata: {name: long_keys, owner: tests}\n"
        "data_movement:\n  source: {table: sample.long_keys}\n  key_columns: [url]\n"
        "key_value_dal: {alias: long_keys}\nbulldozer_protobuf: {package: tests.long_keys}\n"
    )
    error = r'^the record of key \{"url": "https://b\.example/x+….* has a key of 621 bytes \(as protobuf\), and the embedded'
    with pytest.raises(SourceDataError, match=error):
        run_job(_spec(text), dal, engine=engine, home=str(long_keys))
    assert [n.state for n in dal.list_namespaces("long_keys")] == [State.FAILED]


@pytest.mark.parametrize(
    ("engine", "source"),
    [("local", "table"), pytest.param("spark", "table", marks=pytest.mark.spark), ("local", "query")],
)
@pytest.mark.parametrize("damage", ["truncated", "gone"])
def test_every_engine_names_the_data_file_it_cannot_read(engine: str, source: str, damage: str, tmp_path: Path) -> None:
    """A damaged data file failed the local engine's run with ``run failed: OSError:
    Couldn't deserialize thrift: don't know what type: \\x0f``: which of a table's thousands
    of files? Spark printed Iceberg's own log line before its error, and a query source
    printed DuckDB's message with the Python traceback in it. Each one line names the file
    now, the same line everywhere; the version is FAILED and the alias does not exist."""
    home = tmp_path / "h"
    create_sample_warehouse(home, rows=2_000)
    (data,) = (home / "warehouse").rglob("*.parquet")
    if damage == "truncated":  # its footer kept, its middle gone
        whole = data.read_bytes()
        data.write_bytes(whole[: len(whole) // 2] + whole[-2_000:])
    else:
        data.unlink()
    spec = tmp_path / "job.yaml"
    text = (REPO / "templates" / "move_data_to_kv_dal.yaml").read_text()
    if source == "query":
        text = text.replace("table: sample.user_item_scores ", "query: SELECT * FROM sample.user_item_scores ")
    spec.write_text(text)
    done = _cli(["run", str(spec), "-q", "--engine", engine], home)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr and "\x0f" not in done.stderr
    # every reader reads the file's footer first (test_every_engine_refuses_a_data_file_that_is_not_the_one_...):
    # the file's own batch reader, a query's tables, Spark's read by key (one file for two cores) on its driver
    assert done.stderr.startswith(f"error: cannot read the data file file://{data}: "), done.stderr
    listed = _cli(["namespaces", "user_item_scores", "--json"], home)
    assert [n["state"] for n in json.loads(listed.stdout)] == ["FAILED"]


@pytest.fixture(scope="module", params=["fewer rows", "other values"])
def rewritten(request: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A sample of three files, the second written again in place after its snapshot
    committed it: without its last row, or with the same rows holding other values."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    home = tmp_path_factory.mktemp("rewritten")
    create_sample_warehouse(home, rows=3_000, chunk_rows=1_000)
    data = sorted((home / "warehouse").rglob("*.parquet"))[1]
    rows = pq.read_table(data)
    if request.param == "fewer rows":
        pq.write_table(rows.slice(0, 999), data)
        return home, rf"{re.escape(data.as_uri())} holds 999 rows where the table's snapshot committed 1,000: "
    size = data.stat().st_size
    scores = pc.add(rows.column("score"), pa.scalar(0.5, rows.schema.field("score").type))
    pq.write_table(rows.set_column(rows.schema.get_field_index("score"), "score", scores), data)
    assert data.stat().st_size != size  # what the check can see
    return home, rf"{re.escape(data.as_uri())} is [\d,]+ bytes where the table's snapshot committed [\d,]+: "


@pytest.mark.parametrize(
    ("engine", "source"),
    [
        ("local", "table"),
        ("local", "filtered table"),  # read by pyiceberg's reader, not the file's own batch reader
        ("local", "query"),
        pytest.param("spark", "table", marks=pytest.mark.spark),  # three splits for three tasks: split reads
        pytest.param("spark", "filtered table", marks=pytest.mark.spark),  # four tasks: Iceberg's Spark reader
    ],
)
def test_every_engine_refuses_a_data_file_that_is_not_the_one_its_snapshot_committed(
    engine: str, source: str, rewritten: tuple[Path, str], dal: KvClient
) -> None:
    """A data file written again in place with a row less was read as it was: the run
    loaded the table's rows but one, the store's count and digest matched what was read,
    and the alias moved to a version without that row. Its manifest entry says how many
    rows and bytes the snapshot committed; a file that says otherwise is refused, naming it,
    before a row of it is sent."""
    home, said = rewritten
    text = TEMPLATE.replace("alias: user_item_scores", f"alias: rewritten_{uuid.uuid4().hex[:8]}")
    if source == "filtered table":
        filtered = "  filter: \"locale != 'xx'\"\n  key_columns: [user_id, item_id, locale]"
        text = text.replace("  key_columns: [user_id, item_id, locale]", filtered)
    elif source == "query":
        text = text.replace("table: sample.user_item_scores ", "query: SELECT * FROM sample.user_item_scores ")
    if engine == "spark":  # three tasks read the three files; four read the table by key
        tasks = 4 if source == "filtered table" else 3
        text = text.replace("    in_flight_batches: 4 ", f"    partitions: {tasks}\n    in_flight_batches: 4 ")
    loaded = _spec(text)
    with pytest.raises(SourceDataError, match=rf"^the data file {said}it is not the file the snapshot wrote"):
        run_job(loaded, dal, engine=engine, home=str(home))
    versions = dal.list_namespaces(loaded.spec.alias)
    assert [(v.state, v.record_count) for v in versions] == [(State.FAILED, 0)]


@pytest.fixture(scope="module")
def merge_on_read(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A sample of three files whose rows of five users Spark deleted merge-on-read: a
    positional delete file beside the data files, which stay as they were. The rows left."""
    from bulldozer.load.engines.spark.session import spark_session, stop_spark_session

    home = tmp_path_factory.mktemp("merge-on-read")
    create_sample_warehouse(home, rows=3_000, chunk_rows=1_000)
    spark = spark_session("lake", None, str(home), "local[2]")
    try:
        table = f"lake.{TABLE}"
        spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('write.delete.mode' = 'merge-on-read')")
        spark.sql(f"DELETE FROM {table} WHERE user_id < 1000005")
        left = spark.sql(f"SELECT count(*) FROM {table}").collect()[0][0]
    finally:
        stop_spark_session()
    return home, int(left)


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_loads_a_table_with_delete_files_and_refuses_one_written_again(
    engine: str, merge_on_read: tuple[Path, int], dal: KvClient
) -> None:
    """Delete files had been read only by a stand-in in the tests. A table Spark deleted rows
    of merge-on-read loads without them, with the digest of the rows left; and a delete file
    written again in place (a row less: a deleted row back) is refused like a data file."""
    import pyarrow.parquet as pq

    home, left = merge_on_read
    table = open_catalog(CatalogConfig(), home).load_table(TABLE)
    (deletes,) = {f.file_path for t in table.scan().plan_files() for f in t.delete_files}
    alias = f"merge_on_read_{uuid.uuid4().hex[:8]}"
    loaded = _spec(TEMPLATE.replace("alias: user_item_scores", f"alias: {alias}"))
    done = run_job(loaded, dal, engine=engine, home=str(home))
    expected, info = _expected_digest(home, loaded), dal.describe(done.version)  # pyiceberg's reading of the deletes
    assert (done.rows, info.record_count, info.digest) == (left, expected.count, expected.value) and left < 3_000
    path = Path(deletes.removeprefix("file:"))
    whole = path.read_bytes()
    try:
        pq.write_table(pq.read_table(path).slice(1), path)
        said = rf"^the delete file {re.escape(deletes)} holds [\d,]+ rows where the table's snapshot committed [\d,]+: "
        with pytest.raises(SourceDataError, match=said):
            run_job(loaded, dal, engine=engine, home=str(home))
    finally:
        path.write_bytes(whole)
    assert dal.describe_target(alias).name == done.version  # the live version stays


@pytest.fixture(scope="module")
def equality_deletes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, Path]:
    """A sample of three files and an equality delete file of five users' ids (what Flink's
    upserts write; Spark SQL writes none), committed with Iceberg's Java API through Spark.
    The rows left, and the delete file."""
    from urllib.parse import urlsplit

    from bulldozer.load.engines.spark.session import spark_session, stop_spark_session

    home = tmp_path_factory.mktemp("equality-deletes")
    create_sample_warehouse(home, rows=3_000, chunk_rows=1_000)
    spark = spark_session("lake", None, str(home), "local[2]")
    try:
        table = JavaTable(spark, f"lake.{TABLE}")
        user_id = pa.field("user_id", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"1"})
        users = pa.table({"user_id": list(range(1_000_000, 1_000_005))}, schema=pa.schema([user_id]))
        deletes = table.equality_deletes("user-deletes", users)
        table.commit(deletes=[deletes])
        path = Path(urlsplit(deletes.location()).path)
        spark.sql(f"REFRESH TABLE lake.{TABLE}")
        left = spark.sql(f"SELECT count(*) FROM lake.{TABLE}").collect()[0][0]
    finally:
        stop_spark_session()
    return home, int(left), path


@pytest.mark.spark
def test_the_spark_engine_reads_the_operators_sql_catalog_as_the_local_engine_does(
    sample: Path, tmp_path: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator's pyiceberg SQL catalog (``BULLDOZER_CATALOGS``; its type left for
    pyiceberg to infer from the uri) is Iceberg's JDBC catalog on the same SQLite file in
    Spark's JVM. Its properties went to Spark as they were, and the Spark engine failed:
    ``Unknown catalog type: sql``, or without a type (Iceberg's Spark catalog then takes
    Hive) ``Failed to connect to Hive Metastore``, both as Java exceptions. The table here
    lives only in the operator's catalog (the run's home has none), and Spark's reader reads
    it by key (more write tasks than files)."""
    catalog = {"uri": f"sqlite:///{sample / 'catalog.db'}", "warehouse": (sample / "warehouse").as_uri()}
    monkeypatch.setenv("BULLDOZER_CATALOGS", json.dumps({"lake": catalog}))
    home = tmp_path / "home"
    by_key = _spec(TEMPLATE.replace("    in_flight_batches: 4 ", "    partitions: 4\n    in_flight_batches: 4 "))
    expected = _expected_digest(sample, _spec())
    for engine, loaded in (("local", _spec()), ("spark", by_key)):
        record = run_job(loaded, dal, engine=engine, home=str(home))
        info = dal.describe(record.version)
        assert (record.engine, info.record_count, info.digest) == (engine, 3_000, expected.value)
    assert not (home / "catalog.db").exists()


def test_a_catalog_sparks_jvm_cannot_open_is_refused_before_spark_starts(sample: Path, tmp_path: Path) -> None:
    """A pyiceberg SQL catalog on Oracle (the Spark engine ships the JDBC drivers of SQLite,
    PostgreSQL and MariaDB only): ``run`` and ``plan`` with ``--engine spark`` say so in one line, before
    Spark starts or the run reads the table (where pyiceberg could open it, a run failed
    with Java's ``Unknown catalog type: sql`` once its version was loading); the local
    engine is not concerned."""
    catalogs = {"lake": {"type": "sql", "uri": "oracle+oracledb://bob:s3cret@127.0.0.1:1/cat"}}
    said = (
        "catalog 'lake' is a SQL catalog on oracle: the Spark engine opens a SQL catalog in a SQLite file or a "
        "PostgreSQL, MySQL or MariaDB database (Iceberg's JDBC catalog on the same one; it ships no other database's "
        "driver): run the job with the local engine (--engine local), or serve the catalog over REST"
    )
    env = {"BULLDOZER_CATALOGS": json.dumps(catalogs)}
    for command in (["run", "-q"], ["plan"]):
        done = _cli([*command, "templates/move_data_to_kv_dal.yaml", "--engine", "spark"], tmp_path, env)
        assert (done.returncode, done.stderr.splitlines()) == (1, [f"error: {said}"]), done.stderr
    done = _cli(["plan", "templates/move_data_to_kv_dal.yaml"], tmp_path, env)  # pyiceberg's own word on it
    assert done.returncode == 1 and "cannot open catalog 'lake'" in done.stderr and said not in done.stderr
    assert "s3cret" not in done.stderr


@pytest.mark.spark
def test_a_table_with_equality_deletes_loads_on_every_engine_as_icebergs_reader_reads_it(
    equality_deletes: tuple[Path, int, Path], dal: KvClient
) -> None:
    """pyiceberg plans no snapshot with equality deletes: every engine failed with "cannot
    read the metadata of the table: ValueError: PyIceberg does not yet support equality
    deletes", then the local engine and a query refused the table (only the Spark engine
    read it, by key, through Iceberg's reader). Bulldozer now plans and applies them itself:
    the local engine, a query and the Spark engine's own splits load the version Iceberg's
    reader loads, and a delete file written again in place is refused by each reader."""
    import pyarrow.parquet as pq

    from bulldozer.load.plan import plan_run

    home, left, deletes = equality_deletes
    alias = f"equality_deletes_{uuid.uuid4().hex[:8]}"
    loaded = _spec(TEMPLATE.replace("alias: user_item_scores", f"alias: {alias}"))
    by_key = _spec(loaded.text.replace("    in_flight_batches: 4 ", "    partitions: 4\n    in_flight_batches: 4 "))
    in_place = _spec(loaded.text.replace("    in_flight_batches: 4 ", "    partitions: 2\n    in_flight_batches: 4 "))
    reference = dal.describe(run_job(by_key, dal, engine="spark", home=str(home)).version)  # Iceberg's reader
    assert reference.record_count == left == 2_950
    for engine, spec in (("local", loaded), ("spark", in_place)):
        info = dal.describe(run_job(spec, dal, engine=engine, home=str(home)).version)
        assert (info.record_count, info.digest) == (reference.record_count, reference.digest), engine
    query = _spec(loaded.text.replace("table: sample.user_item_scores", f"query: SELECT * FROM {TABLE}"))
    assert dal.describe(run_job(query, dal, engine="local", home=str(home)).version).record_count == left
    live = dal.describe_target(alias).name
    whole = deletes.read_bytes()
    try:
        pq.write_table(pq.read_table(deletes).slice(1), deletes)  # a deleted user back
        said = r"^the delete file \S+/user-deletes\.parquet holds 4 rows where "
        for engine, spec in (("local", loaded), ("local", query), ("spark", by_key)):  # (Spark's splits: local's)
            with pytest.raises(SourceDataError, match=said):
                run_job(spec, dal, engine=engine, home=str(home))
    finally:
        deletes.write_bytes(whole)
    assert dal.describe_target(alias).name == live  # the live version stays
    planned = plan_run(loaded, dal, str(home), engine="spark")  # a dry run says what is read
    assert (planned.files, planned.rows) == (3, 3_000)


CDC = "cdc.users"
MEASURES = "cdc.measures"


def _cdc_rows(schema: pa.Schema, ids: list[int], version: int = 0) -> pa.Table:
    """Rows of ``cdc.users``: even ids in region eu, odd in us; every third id's name null."""
    return pa.table(
        {
            "id": ids,
            "region": ["eu" if i % 2 == 0 else "us" for i in ids],
            "name": [None if i % 3 == 0 else f"n{i}" for i in ids],
            "score": [i * 10 + version for i in ids],
        },
        schema=schema,
    )


@pytest.fixture(scope="module")
def upserts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[int], int]:
    """A table written as a change-data writer writes one (Flink's upserts): equality delete
    files of every kind, committed with Iceberg's Java API through Spark (pyiceberg writes
    none), and positional deletes from Spark SQL; with the ids Iceberg's reader reads.

    Data: ids 0-99 in an unpartitioned file (spec 0, sequence 1), 100-199 after the spec
    became identity(region) (spec 1, sequence 2: a file per region). Then, in one commit
    (sequence 3), equality deletes: global (spec 0) by id, of 5, 150, 151; in partition
    region=eu by id, of 102, 103 (in us: kept) and 7 (in the spec-0 file: kept); global by
    (region, name), of (us, null) and (eu, n10). An upsert (sequence 4): global deletes by id
    of 20 and 21 and a data file with 20's new row (same sequence: kept), and in region=eu
    a delete and a new row of 104. Sequence 5 appends 5 and 3 again (later than their
    deletes: kept); sequence 6 deletes 50 merge-on-read (a positional delete).

    And ``cdc.measures``, whose equality deletes are by a double column (Iceberg's reader
    applies them; Bulldozer refuses to: Java compares NaN and -0.0 otherwise than Arrow),
    with its rows left."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType

    from bulldozer.load.engines.spark.session import spark_session, stop_spark_session

    home = tmp_path_factory.mktemp("upserts")
    catalog = open_catalog(CatalogConfig(), home)
    catalog.create_namespace("cdc")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "region", StringType(), required=True),
        NestedField(3, "name", StringType(), required=False),
        NestedField(4, "score", LongType(), required=False),
        identifier_field_ids=[1],
    )
    table = catalog.create_table(CDC, schema)
    arrow = schema.as_arrow()
    table.append(_cdc_rows(arrow, list(range(100))))
    with table.update_spec() as update:
        update.add_identity("region")
    table.append(_cdc_rows(arrow, list(range(100, 200))))
    stop_spark_session()  # a session of another home in this worker
    spark = spark_session("lake", None, str(home), "local[2]")
    try:
        users = JavaTable(spark, f"lake.{CDC}")
        global_spec, by_region = users.spec(0), users.spec(1)

        def by(columns: list[str], values: dict[str, list[Any]]) -> pa.Table:
            return pa.table(values, schema=pa.schema([arrow.field(c) for c in columns]))

        users.commit(
            deletes=[
                users.equality_deletes("global-ids", by(["id"], {"id": [5, 150, 151]}), global_spec),
                users.equality_deletes("eu-ids", by(["id"], {"id": [102, 103, 7]}), by_region, "region=eu"),
                users.equality_deletes(
                    "global-region-name",
                    by(["region", "name"], {"region": ["us", "eu"], "name": [None, "n10"]}),
                    global_spec,
                ),
            ]
        )
        upserted = users.data_file("upserted", _cdc_rows(arrow, [20, 104], version=1), by_region, "region=eu")
        users.commit(
            rows=[upserted],
            deletes=[
                users.equality_deletes("upsert-ids", by(["id"], {"id": [20, 21]}), global_spec),
                users.equality_deletes("upsert-eu-ids", by(["id"], {"id": [104]}), by_region, "region=eu"),
            ],
        )
        spark.sql(f"REFRESH TABLE lake.{CDC}")
        table = catalog.load_table(CDC)
        table.append(_cdc_rows(arrow, [5, 3], version=2))
        spark.sql(f"REFRESH TABLE lake.{CDC}")
        spark.sql(f"ALTER TABLE lake.{CDC} SET TBLPROPERTIES ('write.delete.mode' = 'merge-on-read')")
        spark.sql(f"DELETE FROM lake.{CDC} WHERE id = 50")
        read = {row[0] for row in spark.sql(f"SELECT id FROM lake.{CDC}").collect()}
        measures = catalog.create_table(
            MEASURES,
            Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "weight", DoubleType())),
        )
        measures.append(pa.table({"id": [1, 2, 3], "weight": [0.5, 1.5, 0.5]}, schema=measures.schema().as_arrow()))
        weights = JavaTable(spark, f"lake.{MEASURES}")
        arrow = measures.schema().as_arrow()
        weights.commit(deletes=[weights.equality_deletes("weights", by(["weight"], {"weight": [0.5]}))])
        spark.sql(f"REFRESH TABLE lake.{MEASURES}")
        measured = spark.sql(f"SELECT count(*) FROM lake.{MEASURES}").collect()[0][0]
    finally:
        stop_spark_session()
    return home, read, int(measured)


def _cdc_spec(
    alias: str, partitions: int | None = None, query: bool = False, table: str = CDC, values: str = ""
) -> LoadedSpec:
    source = f"query: SELECT * FROM {table}" if query else f"table: {table}"
    source += f"\n  value_columns: [{values}]" if values else ""
    write = f"\n  write:\n    partitions: {partitions}" if partitions else ""
    return _spec(
        "apiVersion: bulldozer/v1\nkind: MoveDataToKvDal\nmetadata:\n  name: cdc_users\n  owner: data-platform\n"
        f"data_movement:\n  source:\n    {source}\n  key_columns: [id]\n"
        f"key_value_dal:\n  alias: {alias}{write}\n"
        "bulldozer_protobuf:\n  package: bulldozer.jobs.cdc_users\n"
    )


@pytest.mark.spark
def test_equality_deletes_apply_by_sequence_partition_and_null_as_icebergs_reader_applies_them(
    upserts: tuple[Path, set[int], int], dal: KvClient
) -> None:
    """Every rule of applying equality deletes, against Iceberg's own reader: a delete
    applies to older data only (an upsert's new row and a later append are kept), in its
    partition and spec only, or everywhere from an unpartitioned spec; by several columns,
    a null equal to a null; beside positional deletes. The local engine, a query and the
    Spark engine's own splits load the ids Spark SQL reads, and the version Spark's reader
    loads by key, byte for byte."""
    home, read, _ = upserts
    gone = {5, 150, 151, 102, 10, 20, 21, 104, 50} | {i for i in range(200) if i % 2 and not i % 3}
    assert read == (set(range(200)) - gone) | {3, 5, 20, 104}  # Iceberg's reader, by the rules above
    alias = f"cdc_{uuid.uuid4().hex[:8]}"
    reference = dal.describe(run_job(_cdc_spec(alias, partitions=8), dal, engine="spark", home=str(home)).version)
    assert reference.record_count == len(read)
    for engine, spec in (
        ("local", _cdc_spec(alias)),
        ("spark", _cdc_spec(alias, partitions=2)),  # its tasks read the splits themselves
    ):
        info = dal.describe(run_job(spec, dal, engine=engine, home=str(home)).version)
        assert (info.record_count, info.digest) == (reference.record_count, reference.digest), engine
    queried = dal.describe(run_job(_cdc_spec(alias, query=True), dal, engine="local", home=str(home)).version)
    assert (queried.record_count, queried.digest) == (reference.record_count, reference.digest)
    # a job that loads none of the columns the deletes by (region, name) compare: read all the same
    scores = dal.describe(
        run_job(_cdc_spec(alias, partitions=8, values="score"), dal, engine="spark", home=str(home)).version
    )
    for engine, spec in (("local", _cdc_spec(alias, values="score")), ("spark", _cdc_spec(alias, 2, values="score"))):
        info = dal.describe(run_job(spec, dal, engine=engine, home=str(home)).version)
        assert (info.record_count, info.digest) == (len(read), scores.digest), engine


@pytest.mark.spark
def test_a_table_of_avro_data_files_loads_with_spark_and_is_refused_by_pyicebergs_reader(
    tmp_path: Path, dal: KvClient
) -> None:
    """Iceberg's data files may be Avro (``write.format.default``); pyiceberg's reader reads
    Parquet and ORC only: the local engine failed with "run failed: ValueError: Unsupported
    file format: FileFormat.AVRO" and the Spark engine, whose tasks read the splits with it,
    with the same. The local engine now says why and what to do in one line; the Spark engine
    reads such a snapshot by key through Iceberg's reader; after the advised rewrite the
    local engine loads a version of the same count and digest. A table with a time column
    too (Spark has no time type) is refused in one line by the Spark engine."""
    from bulldozer.errors import SchemaError, UnreadableFilesError
    from bulldozer.load.engines.spark.session import spark_session, stop_spark_session
    from bulldozer.warehouse.files import REWRITE_AS_PARQUET

    open_catalog(CatalogConfig(), tmp_path).create_namespace("db")
    spark = spark_session("lake", None, str(tmp_path), "local[2]")
    try:
        spark.sql(
            "CREATE TABLE lake.db.events (id BIGINT NOT NULL, v STRING, tags ARRAY<STRING>) USING iceberg "
            "TBLPROPERTIES ('write.format.default' = 'avro')"
        )
        spark.sql(
            "INSERT INTO lake.db.events SELECT id, concat('v', cast(id AS STRING)), array('a', cast(id AS STRING)) "
            "FROM range(0, 1000)"
        )
        # another with a time column (added through Iceberg's API: Spark has no time type)
        spark.sql(
            "CREATE TABLE lake.db.timed USING iceberg TBLPROPERTIES ('write.format.default' = 'avro') "
            "AS SELECT * FROM lake.db.events"
        )
        jvm = spark._jvm
        timed = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, "lake.db.timed")
        timed.updateSchema().addColumn("at", jvm.org.apache.iceberg.types.Types.TimeType.get()).commit()
        timed.newAppend().commit()  # a snapshot of that schema (its files as they were)
    finally:
        stop_spark_session()
    text = """apiVersion: bulldozer/v1
kind: MoveDataToKvDal
metadata: {name: events, owner: tests}
data_movement: {source: {table: db.events}, key_columns: [id], value_columns: [v, tags]}
key_value_dal: {alias: avro_events}
bulldozer_protobuf: {package: tests.events}
"""
    loaded = load_spec_text(text, "job.yaml", env={})
    said = r"^the table at \S+ has Avro data files at snapshot \d+ \(\S+\.avro\): .* Parquet and ORC files only; run"
    with pytest.raises(UnreadableFilesError, match=said):
        run_job(loaded, dal, engine="local", home=str(tmp_path))
    done = run_job(loaded, dal, engine="spark", home=str(tmp_path))
    info = dal.describe(done.version)
    assert done.rows == info.record_count == 1_000
    timed = load_spec_text(text.replace("db.events", "db.timed").replace("[v, tags]", "[v, at]"), "t.yaml", env={})
    said = (
        r"^column 'at' holds a time, and Spark has no time type, so Spark's reader cannot read the table, and it has "
        r"Avro data files at snapshot \d+ \(\S+\), which pyiceberg's reader cannot: no engine here reads it until"
    )
    with pytest.raises(SchemaError, match=said):  # neither reader reads it: one line
        run_job(timed, dal, engine="spark", home=str(tmp_path))
    spark = spark_session("lake", None, str(tmp_path), "local[2]")
    try:
        for statement in REWRITE_AS_PARQUET.split(", then "):
            spark.sql(statement.replace("<catalog>", "lake").replace("<table>", "db.events")).collect()
    finally:
        stop_spark_session()
    rewritten = dal.describe(run_job(loaded, dal, engine="local", home=str(tmp_path)).version)
    assert (rewritten.record_count, rewritten.digest) == (info.record_count, info.digest)


@pytest.mark.parametrize("engine", ENGINES)
def test_stage_by_stage_every_engine_builds_the_same_version_a_whole_run_does(
    engine: str, sample: Path, dal: KvClient
) -> None:
    """The stages a scheduler calls one at a time (``run_stage``), each safe to retry: a
    retried load with the same run key keeps the version it made, later stages find it by
    the key, and the flip makes it live with the digest a whole run stores."""
    from bulldozer.load.runner import STAGES, run_stage

    loaded = _spec()
    expected = _expected_digest(sample, loaded)
    key = f"suite-{engine}"
    versions = set()
    for stage in STAGES:
        record = run_stage(stage, loaded, dal, run_key=key, engine=engine, home=str(sample))
        if stage == "load":
            again = run_stage("load", loaded, dal, run_key=key, engine=engine, home=str(sample))
            assert again.version == record.version  # the retry found the version it made
        if record.version:
            versions.add(record.version)
    (version,) = versions
    info = dal.describe(version)
    assert dal.get_alias("user_item_scores").namespace == version
    assert (info.state, info.verified, info.record_count, info.digest) == (
        State.ACTIVE,
        True,
        expected.count,
        expected.value,
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_loads_a_time_column(engine: str, tmp_path: Path, dal: KvClient) -> None:
    """Spark has no time type: a spark run of a one-file table with a time column (Spark then
    reads the table itself, by key) failed 7 s into its load with Java's
    ``UnsupportedOperationException``, a raw error a scheduler retried. Its tasks now read the
    files themselves, as the local engine does; a spec asking for more tasks than there are
    files is refused, saying why."""
    import datetime

    import pyarrow as pa

    from bulldozer.errors import SchemaError

    catalog = open_catalog(CatalogConfig(), tmp_path)
    catalog.create_namespace("sample")
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "at": [datetime.time(12), datetime.time(13, 30)]})
    table = catalog.create_table("sample.times", rows.schema)
    table.append(rows)
    text = (
        "apiVersion: bulldozer/v1\nkind: MoveDataToKvDal\nmetadata: {name: times, owner: tests}\n"
        "data_movement:\n  source: {table: sample.times}\n  key_columns: [id]\n"
        "key_value_dal: {alias: times}\nbulldozer_protobuf: {package: tests.times}\n"
    )
    loaded = _spec(text)
    job = build_job_schema(loaded.spec, table.schema())
    encoded = RowEncoder(job.proto).encode(table.scan().to_arrow())
    record = run_job(loaded, dal, engine=engine, home=str(tmp_path))
    assert (record.rows, dal.describe(record.version).digest) == (2, digest_arrays(encoded.keys, encoded.values).value)
    if engine == "spark":
        four = _spec(text.replace("{alias: times}", "{alias: times, write: {partitions: 4}}"))
        with pytest.raises(SchemaError, match=r"^column 'at' holds a time, and Spark has no time type, .* 1 to read"):
            run_job(four, dal, engine=engine, home=str(tmp_path))


@pytest.mark.spark
def test_equality_deletes_that_cannot_be_applied_exactly_are_refused_and_spark_reads_them(
    upserts: tuple[Path, set[int], int], dal: KvClient
) -> None:
    """Equality deletes by a floating-point column: Arrow and Java may not agree on NaN and
    -0.0, so the local engine and a query refuse the table in one line, before reading a
    row (their versions FAILED), and the Spark engine reads it by key through Iceberg's reader, which applies
    them."""
    from bulldozer.errors import UnreadableFilesError

    home, _, left = upserts
    alias = f"measures_{uuid.uuid4().hex[:8]}"
    said = (
        r"^the table at \S+ has an equality delete file deleting by the floating-point column 'weight' "
        r"\(\S+/weights\.parquet\) at snapshot \d+: the local engine's reader \(pyiceberg\) cannot apply it "
        r"exactly, and rows the table deleted would be loaded; "
    )
    for query, then in ((False, "run it with --engine spark"), (True, "a query's tables are read with it on every")):
        with pytest.raises(UnreadableFilesError, match=said + then):
            run_job(_cdc_spec(alias, query=query, table=MEASURES), dal, engine="local", home=str(home))
    assert {r.state for r in dal.list_namespaces(alias)} == {State.FAILED}  # nothing loaded, nothing live
    done = run_job(_cdc_spec(alias, table=MEASURES), dal, engine="spark", home=str(home))
    assert done.rows == dal.describe(done.version).record_count == left == 1
