"""Query sources and the keep_latest duplicate policy (local engine, DuckDB over pinned scans)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bulldozer.cli.main import app
from bulldozer.errors import (
    AliasNotFoundError,
    CatalogError,
    DuplicateKeyError,
    SourceDataError,
    SpecError,
    TableNotFoundError,
)
from bulldozer.kv import KvClient
from bulldozer.load.runner import run_job
from bulldozer.schema.compat import check_compatibility
from bulldozer.spec import load_spec_text
from bulldozer.spec.loader import LoadedSpec
from bulldozer.spec.models import CatalogConfig
from bulldozer.warehouse.catalog import open_catalog
from bulldozer.warehouse.sample import create_sample_warehouse, generate_sample
from tests.integration.kv_fixtures import only_refusals
from tests.integration.test_run import KEY, _cli, read

pytest.importorskip("duckdb", reason="the sql extra is part of the default install (scripts/bootstrap.sh)")
pytestmark = pytest.mark.integration


def job(source: str, values: str = "[rating, price, profile, recent_orders]", extra: str = "") -> LoadedSpec:
    text = f"""apiVersion: bulldozer/v1
kind: MoveDataToKvDal
metadata: {{name: scores, owner: tests}}
data_movement:
  source: {source}
  key_columns: [user_id, item_id, locale]
  value_columns: {values}
{extra}
key_value_dal:
  alias: scores
  quality_gates: {{min_rows: 1}}
bulldozer_protobuf: {{package: tests.scores}}
"""
    return load_spec_text(text, "job.yaml", env={})


@pytest.fixture
def home(tmp_path: Path) -> Path:
    create_sample_warehouse(tmp_path, rows=2_000)
    return tmp_path


def test_query_source_keeps_the_table_field_numbers(home: Path, dal: KvClient) -> None:
    from_table = run_job(job("{table: sample.user_item_scores}"), dal, home=str(home))
    before = read(dal, "scores", KEY)
    query = (
        "{query: 'SELECT user_id, item_id, locale, rating, price, profile, recent_orders, rating * 2 AS doubled "
        "FROM sample.user_item_scores WHERE item_id < 50'}"
    )
    query_job = job(query, "[rating, price, profile, recent_orders, doubled]")
    from_query = run_job(query_job, dal, home=str(home))
    after = read(dal, "scores", KEY)
    # `bulldozer proto` describes a query source's schema as the run derived it
    (home / "query.yaml").write_text(query_job.text)
    printed = CliRunner().invoke(
        app, ["proto", str(home / "query.yaml"), "--home", str(home), "--out", str(home / "p")]
    )
    assert printed.exit_code == 0, printed.output
    stored = dal.describe(from_query.version).value_descriptor_set
    generated = (home / "p" / "scores.binpb").read_bytes()
    assert (
        check_compatibility(stored, generated).differences == [] == check_compatibility(generated, stored).differences
    )
    assert "doubled = " in (home / "p" / "scores.proto").read_text()
    assert from_query.outcome == "succeeded" and 0 < from_query.rows <= from_table.rows
    assert from_query.snapshots == from_table.snapshots  # the table was read at its pinned snapshot
    assert after is not None and before is not None
    assert {k: after[k] for k in before} == before  # same numbers: the same values decode the same
    assert after["doubled"] == pytest.approx(2 * before["user_rating" if "user_rating" in before else "rating"])


def test_a_query_that_does_not_parse(home: Path, dal: KvClient) -> None:
    with pytest.raises(SpecError, match="the query does not parse"):
        run_job(job("{query: 'SELEC user_id FRM sample.user_item_scores'}"), dal, home=str(home))
    [refused] = only_refusals(dal)  # no data; the refused run is kept with its reason
    assert "the query does not parse" in refused.failure_reason


def test_a_query_reading_a_missing_table(home: Path, dal: KvClient) -> None:
    with pytest.raises(TableNotFoundError, match=r"sample\.missing"):
        run_job(job("{query: 'SELECT * FROM sample.missing'}"), dal, home=str(home))


def test_a_query_that_does_not_bind(home: Path, dal: KvClient) -> None:
    """Refused at the spec's line, by a run and by ``validate --catalog`` alike (the run said
    ``spec: data_movement.source.query: …``, and validate found nothing wrong)."""
    from bulldozer.schema.table_check import check_against_catalog

    unbound = job("{query: 'SELECT no_such_column FROM sample.user_item_scores'}")
    with pytest.raises(SpecError, match="the query cannot run") as refused:
        run_job(unbound, dal, home=str(home))
    said = [str(i) for i in refused.value.issues]
    assert len(said) == 1 and said[0].startswith("job.yaml:5:12: data_movement.source.query: the query cannot run: ")
    assert [str(i) for i in check_against_catalog(unbound, home=str(home))] == said


def test_a_value_column_the_query_does_not_select(home: Path, dal: KvClient) -> None:
    from bulldozer.schema.table_check import check_against_catalog

    query = "{query: 'SELECT user_id, item_id, locale, rating FROM sample.user_item_scores'}"
    spec = job(query, "[rating, price]")
    with pytest.raises(SpecError) as refused:
        run_job(spec, dal, home=str(home))
    said = [str(i) for i in refused.value.issues]
    assert said == ["job.yaml:7:27: data_movement.value_columns[1]: the query has no column 'price'"]
    assert [str(i) for i in check_against_catalog(spec, home=str(home))] == said  # validate --catalog


@pytest.mark.parametrize(
    "query",
    [
        "SELECT 1 AS user_id, 1 AS item_id, 'x' AS locale, content AS rating FROM read_text('/etc/passwd')",
        "SELECT * FROM sample.user_item_scores, (SELECT content FROM read_text('/proc/self/environ')) e",
        "SELECT * FROM sample.user_item_scores WHERE locale IN (SELECT file FROM glob('/*'))",
        "SELECT * FROM 'http://127.0.0.1:9/x.parquet'",
    ],
)
def test_a_hostile_query_is_refused_before_anything_is_read_or_written(
    query: str, home: Path, dal: KvClient, tmp_path: Path
) -> None:
    source = "{query: " + "'" + query.replace("'", "''") + "'}"
    with pytest.raises(SpecError, match=r"data_movement\.source\.query"):
        run_job(job(source), dal, home=str(home))
    [refused] = only_refusals(dal)  # nothing read or written: the refusal is kept with its reason
    assert "data_movement.source.query" in refused.failure_reason
    spec_file = tmp_path / "hostile.yaml"
    spec_file.write_text(job(source).text)
    for catalog in (["--catalog"], []):  # a plain validate checks the query's text too (it said "valid")
        refused = _cli(["validate", str(spec_file), *catalog, "--home", str(home)], home)
        assert refused.returncode == 2, refused.stdout
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{spec_file}:5:") and "data_movement.source.query" in lines[0]
        assert "root:" not in refused.stderr + refused.stdout  # nothing of /etc/passwd


def test_validate_catalog_checks_a_query_sources_tables(home: Path, tmp_path: Path) -> None:
    spec_file = tmp_path / "q.yaml"
    spec_file.write_text(job("{query: 'SELECT * FROM sample.missing'}").text)
    refused = _cli(["validate", str(spec_file), "--catalog", "--home", str(home)], home)
    assert refused.returncode == 2 and "sample.missing" in refused.stderr
    spec_file.write_text(job("{query: 'SELECT * FROM sample.user_item_scores WHERE item_id < 5'}").text)
    ok = _cli(["validate", str(spec_file), "--catalog", "--home", str(home)], home)
    assert ok.returncode == 0, ok.stderr


def test_a_filter_with_a_query_source_is_refused_not_ignored() -> None:
    with pytest.raises(SpecError, match=r"data_movement\.filter: filter applies to a table source"):
        job("{query: 'SELECT * FROM sample.user_item_scores'}", extra='  filter: "item_id < 5"')


def _add_newer_duplicates(home: Path, updated_shift: int) -> Any:
    table = open_catalog(CatalogConfig(), home).load_table("sample.user_item_scores")
    newer = generate_sample(10, variant=5)  # the first 10 keys again, other values
    import pyarrow.compute as pc

    newer = newer.set_column(
        newer.schema.get_field_index("updated_at"),
        "updated_at",
        pc.add(newer.column("updated_at").cast("int64"), updated_shift).cast(newer.schema.field("updated_at").type),
    )
    table.append(newer.cast(table.schema().as_arrow()))
    return table


KEEP_LATEST = "  duplicate_keys: {policy: keep_latest, order_by: updated_at}"


def test_keep_latest_picks_the_newest_row_deterministically(home: Path, dal: KvClient) -> None:
    _add_newer_duplicates(home, updated_shift=10**12)  # the appended rows are newer
    values = "[rating, price, updated_at]"
    record = run_job(job("{table: sample.user_item_scores}", values, KEEP_LATEST), dal, home=str(home))
    assert record.rows == 2_000  # one row per key
    first_key = {"user_id": 1_000_000, "item_id": 1, "locale": "en_US"}
    newest = generate_sample(10, variant=5).slice(0, 1).to_pylist()[0]
    assert read(dal, "scores", first_key)["price"] == str(newest["price"])


def test_keep_latest_refuses_ties(home: Path, dal: KvClient) -> None:
    _add_newer_duplicates(home, updated_shift=-5 * 86_400_000_000)  # variant 5's day shift undone: a tie
    with pytest.raises(DuplicateKeyError, match="tie on 'updated_at'"):
        run_job(
            job("{table: sample.user_item_scores}", "[rating, price, updated_at]", KEEP_LATEST), dal, home=str(home)
        )


def test_a_query_may_read_a_table_from_two_places(home: Path, dal: KvClient) -> None:
    """A self-join, or a table read again in a subquery: a table's scan is a stream, read
    once, and the second read failed the run with DuckDB's "This RecordBatchReader has
    already been consumed" (which ``validate --catalog`` had passed). Such a table is copied
    into DuckDB first."""
    query = (
        "SELECT a.user_id, a.item_id, a.locale, b.rating FROM sample.user_item_scores a "
        "JOIN sample.user_item_scores b ON a.user_id = b.user_id AND a.item_id = b.item_id AND a.locale = b.locale "
        "WHERE a.item_id IN (SELECT item_id FROM sample.user_item_scores WHERE item_id < 50)"
    )
    record = run_job(job(f'{{query: "{query}"}}', "[rating]"), dal, home=str(home))
    table = open_catalog(CatalogConfig(), home).load_table("sample.user_item_scores").scan().to_arrow()
    assert record.rows == sum(1 for item in table.column("item_id").to_pylist() if item < 50) > 0


def test_a_query_reads_the_files_other_writers_wrote_as_the_table_source_does(tmp_path: Path, dal: KvClient) -> None:
    """pyiceberg keeps each file's own Arrow types: ``large_string`` and ``large_list`` from
    a file pyiceberg wrote, ``string`` and ``list`` from one Spark, Trino or pyarrow wrote,
    while the stream a query reads declares the large ones. DuckDB read a batch as the
    stream declared it: a query over a table Spark had written to failed ("an Arrow batch
    carried column 'tags' with a list whose offsets 4294967296 to 8392366098336 do not fit
    its child"), and what it read of such a batch was not the file's rows. A table with a
    file of each kind loads the same records from a query as from the table itself."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.schema import Schema
    from pyiceberg.types import BinaryType, ListType, LongType, NestedField, StringType

    catalog = open_catalog(CatalogConfig(), tmp_path)
    catalog.create_namespace("other")
    table = catalog.create_table(
        "other.mixed",
        Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "v", StringType(), required=False),
            NestedField(3, "tags", ListType(4, StringType(), element_required=False), required=False),
            NestedField(5, "b", BinaryType(), required=False),
        ),
    )

    def rows(ids: range) -> dict[str, list[Any]]:
        return {
            "id": list(ids),
            "v": [f"v{i}" * 3 for i in ids],
            "tags": [[f"t{i}", "x"] for i in ids],
            "b": [bytes([i % 256]) * 5 for i in ids],
        }

    table.append(pa.table(rows(range(300)), schema=table.schema().as_arrow()))  # large types
    small = pa.schema(
        [("id", pa.int64(), False), ("v", pa.string()), ("tags", pa.list_(pa.string())), ("b", pa.binary())]
    )
    other = Path(table.location().removeprefix("file://")) / "data" / "other-writer.parquet"
    pq.write_table(pa.table(rows(range(300, 600)), schema=small), other)
    table.add_files([f"file://{other}"])
    assert pq.read_schema(other).field("tags").type == pa.list_(pa.string())  # not what pyiceberg writes

    def spec(source: str) -> LoadedSpec:
        text = f"""apiVersion: bulldozer/v1
kind: MoveDataToKvDal
metadata: {{name: mixed, owner: tests}}
data_movement: {{source: {source}, key_columns: [id], value_columns: [v, tags, b]}}
key_value_dal: {{alias: mixed}}
bulldozer_protobuf: {{package: tests.mixed}}
"""
        return load_spec_text(text, "job.yaml", env={})

    from_table = run_job(spec("{table: other.mixed}"), dal, home=str(tmp_path))
    from_query = run_job(spec("{query: 'SELECT id, v, tags, b FROM other.mixed'}"), dal, home=str(tmp_path))
    made = [dal.describe(r.version) for r in (from_table, from_query)]
    assert [(m.record_count, m.digest) for m in made] == [(600, made[0].digest)] * 2
    value = {"v": "v450" * 3, "tags": {"values": ["t450", "x"]}, "b": base64.b64encode(bytes([450 % 256]) * 5).decode()}
    assert read(dal, "mixed", {"id": 450}) == value  # a row of the other writer's file


@pytest.mark.parametrize("float_type", ["DOUBLE", "FLOAT"])
def test_keep_latest_takes_a_nan_for_no_value(home: Path, dal: KvClient, float_type: str) -> None:
    """DuckDB orders NaN above every number: the row whose ``order_by`` was NaN was kept as
    the newest of its key. A NaN is no value now, as a null is: never the latest while a row
    of its key has a number, and two of them tie as two nulls do."""
    rows = "SELECT user_id, item_id, locale, {label} AS v, {value}::{t} AS o FROM sample.user_item_scores"
    query = " UNION ALL ".join(
        rows.format(label=label, value=value, t=float_type)
        for label, value in (("'number'", "1.5"), ("'nan'", "'NaN'"))
    )
    values, keep = "[v]", "  duplicate_keys: {policy: keep_latest, order_by: o}"
    record = run_job(job(f'{{query: "{query}"}}', values, keep), dal, home=str(home))
    assert record.rows == 2_000
    first_key = {"user_id": 1_000_000, "item_id": 1, "locale": "en_US"}
    assert read(dal, "scores", first_key)["v"] == "number"
    twice = f"{query} UNION ALL " + rows.format(label="'nan again'", value="'NaN'", t=float_type)
    only_nans = twice.replace("'number' AS v, 1.5", "'number' AS v, 'NaN'")
    with pytest.raises(DuplicateKeyError, match="tie on 'o'"):
        run_job(job(f'{{query: "{only_nans}"}}', values, keep), dal, home=str(home))


def test_keep_latest_names_a_column_the_table_has_not(home: Path, dal: KvClient) -> None:
    """A table read with keep_latest goes through DuckDB: a key column it lacks was a raw
    ``BinderException`` from the ties query, and a value column "the query has no column";
    both are the table's, at the spec's line."""
    spec = job("{table: sample.user_item_scores}", "[ratingg, price, updated_at]", KEEP_LATEST)
    with pytest.raises(SpecError) as refused:
        run_job(spec, dal, home=str(home))
    assert [str(i) for i in refused.value.issues] == [
        "job.yaml:7:19: data_movement.value_columns[0]: the table has no column 'ratingg'; did you mean 'rating'?"
    ]
    good = job("{table: sample.user_item_scores}", "[rating, price, updated_at]", KEEP_LATEST)
    keyless = load_spec_text(good.text.replace("key_columns: [user_id,", "key_columns: [user_idd,"), "job.yaml", env={})
    with pytest.raises(SpecError) as refused:
        run_job(keyless, dal, home=str(home))
    assert [str(i) for i in refused.value.issues] == [
        "job.yaml:6:17: data_movement.key_columns[0]: the table has no column 'user_idd'; did you mean 'user_id'?"
    ]


def test_keep_latest_by_a_nested_column_is_refused_at_its_line(home: Path, dal: KvClient) -> None:
    """DuckDB orders structs, lists and maps too, so keep_latest by one picked "the latest" row
    by a nested value, which says nothing of which row is newer; the run, a plan and validate
    --catalog refuse it at order_by, and a query's result column is held to it as well."""
    _add_newer_duplicates(home, updated_shift=10**12)
    for column, kind in (("profile", "struct"), ("recent_orders", "list")):
        nested = KEEP_LATEST.replace("updated_at", column)
        said = (
            f"job.yaml:8:41: data_movement.duplicate_keys.order_by: {column!r} is a {kind} column; the latest "
            "row is the one with the greatest value of a column of plain values (a timestamp, a version number)"
        )
        spec = job("{table: sample.user_item_scores}", "[rating, price, updated_at]", nested)
        with pytest.raises(SpecError) as refused:
            run_job(spec, dal, home=str(home))
        assert [str(i) for i in refused.value.issues] == [said]
        query = job("{query: 'SELECT * FROM sample.user_item_scores'}", "[rating, price, updated_at]", nested)
        with pytest.raises(SpecError) as refused:
            run_job(query, dal, home=str(home))
        assert [str(i) for i in refused.value.issues] == [said]
    # refused before anything was loaded: each run kept as a FAILED version holding nothing
    assert {(v.state.value, v.record_count) for v in dal.list_namespaces("scores")} == {("FAILED", 0)}


def test_without_keep_latest_the_same_duplicates_fail(home: Path, dal: KvClient) -> None:
    _add_newer_duplicates(home, updated_shift=10**12)
    with pytest.raises(DuplicateKeyError, match="rows sharing a key"):
        run_job(job("{table: sample.user_item_scores}", "[rating, price, updated_at]"), dal, home=str(home))


def test_spark_refuses_sql_sources_clearly(home: Path, dal: KvClient) -> None:
    from bulldozer.load.engines.base import LoadEngine

    class NoSql(LoadEngine):  # stands for any engine without SQL support (e.g. spark)
        name = "nosql"

        def prepare(self, *a: Any) -> None:  # Spark's driver was started for a run refused outright
            raise AssertionError("must not be started")

        def load(self, *a: Any) -> Any:
            raise AssertionError("must not be called")

        def key_hashes_of(self, *a: Any) -> Any:
            raise AssertionError

        def find_keys(self, *a: Any) -> Any:
            raise AssertionError

    with pytest.raises(CatalogError, match="need --engine local"):
        run_job(job("{query: 'SELECT * FROM sample.user_item_scores'}"), dal, home=str(home), engine=NoSql())


def test_plan_of_a_query_source(home: Path, dal: KvClient) -> None:
    from bulldozer.load.plan import plan_run

    plan = plan_run(job("{query: 'SELECT * FROM sample.user_item_scores WHERE item_id < 20'}"), dal, str(home))
    assert plan.rows == 2_000 and plan.table == "query over sample.user_item_scores"
    assert dal.list_namespaces() == []


def test_a_query_spills_only_where_the_operator_allows(home: Path, tmp_path: Path) -> None:
    """DuckDB spills a query larger than its memory to ``.tmp`` in the working directory, up to
    90 % of that disk: a spec's query could fill a scheduler's disk there. It spills only into
    a private scratch folder, bounded by BULLDOZER_QUERY_SPILL (and its memory by
    BULLDOZER_QUERY_MEMORY); a query that needs more fails the run in one line."""
    import os
    import subprocess
    import sys

    def run(rows: int, spill: str) -> subprocess.CompletedProcess[str]:
        query = (
            "SELECT user_id + r.range * 10000000 AS user_id, item_id, locale, rating, price, profile, recent_orders "
            f"FROM sample.user_item_scores, range({rows // 2_000}) r "
            "ORDER BY md5(locale || r.range::varchar || item_id::varchar)"
        )
        spec = tmp_path / "big.yaml"
        spec.write_text(job("{query: '" + query.replace("'", "''") + "'}").text)
        limits = {"BULLDOZER_QUERY_MEMORY": "64MiB", "BULLDOZER_QUERY_SPILL": spill}
        return subprocess.run(
            [sys.executable, "-m", "bulldozer.cli.main", "run", str(spec), "-q"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "BULLDOZER_HOME": str(home), "TMPDIR": str(scratch), **limits},
            cwd=cwd,
        )

    cwd, scratch = tmp_path / "cwd", tmp_path / "scratch"
    cwd.mkdir()
    scratch.mkdir()
    refused = run(2_000_000, "8MiB")
    said = refused.stderr.strip().splitlines()
    assert refused.returncode == 1 and len(said) == 1, refused.stderr
    assert "the query needs more than the memory and disk the operator allows" in said[0]
    assert "BULLDOZER_QUERY_SPILL 8MiB" in said[0] and "PRAGMA" not in said[0]
    done = run(200_000, "1GiB")
    assert done.returncode == 0, done.stderr
    assert list(cwd.iterdir()) == []  # no .tmp where the command ran
    assert [p.name for p in scratch.iterdir() if p.name.startswith("bulldozer-query-")] == []  # removed


def test_a_query_writes_no_more_than_the_operator_allows(home: Path, tmp_path: Path) -> None:
    """A query can make rows from nothing (``range``): without a bound, one spec's version
    grew until the shared store was full. BULLDOZER_QUERY_OUTPUT bounds what a query writes
    into its version: past it the run fails in one line, its version FAILED, the alias where
    it was (here: nowhere yet); under it the run goes through."""
    from bulldozer.kv.connect import connect

    spec = tmp_path / "made.yaml"
    spec.write_text(
        job(
            "{query: 'SELECT user_id + r.range * 10000000 AS user_id, item_id, locale, rating, price, profile, "
            "recent_orders FROM sample.user_item_scores, range(150) r'}"
        ).text
    )
    refused = _cli(["run", str(spec), "-q"], home, {"BULLDOZER_QUERY_OUTPUT": "2MiB"})
    said = refused.stderr.strip().splitlines()
    assert refused.returncode == 1 and len(said) == 1, refused.stderr
    assert said[0].startswith(
        "error: the query wrote more than the 2.0 MiB of records a spec's query may write into its version "
        "(BULLDOZER_QUERY_OUTPUT): "
    ), said
    with connect("embedded", home=str(home)) as client:
        (version,) = client.list_namespaces(alias="scores")
        assert version.state.value == "FAILED" and "BULLDOZER_QUERY_OUTPUT" in version.failure_reason
        with pytest.raises(AliasNotFoundError):
            client.get_alias("scores")
    done = _cli(["run", str(spec), "-q", "--json"], home, {"BULLDOZER_QUERY_OUTPUT": "1GiB"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == 300_000


@pytest.mark.parametrize(
    ("column", "said"),
    [
        ("hash(user_id) AS rating", "the column 'rating' is an unsigned 64-bit integer (DuckDB's hash() returns one)"),
        ("18446744073709551615::UBIGINT AS rating", "the column 'rating' is an unsigned 64-bit integer"),
        ("{'h': hash(user_id)} AS rating", "the column 'rating.h' is an unsigned 64-bit integer"),
        (
            "'a'::ENUM('a', 'b') AS rating",
            "(an ENUM: cast it to its values' type in the query, e.g. CAST(col AS VARCHAR))",
        ),
        (
            "[1.5, 2]::FLOAT[2] AS rating",
            "(an ARRAY of fixed size: cast it to a list in the query, e.g. CAST(col AS FLOAT[]))",
        ),
        ("INTERVAL 1 DAY AS rating", "(an INTERVAL: store a number in the query, e.g. epoch(col) for its seconds)"),
        ("NULL AS rating", "(a bare NULL has no type: give it one in the query, e.g. CAST(NULL AS VARCHAR))"),
        ("TIMETZ '12:00:00+05:00' AS rating", "the column 'rating' is a TIME WITH TIME ZONE, whose offset Arrow drops"),
        ("{'t': TIMETZ '12:00:00+05:00'} AS rating", "(its type: STRUCT(t TIME WITH TIME ZONE))"),
        ("'101'::BIT AS rating", "the column 'rating' is a BIT string, which Arrow carries as DuckDB's internal bytes"),
    ],
)
def test_a_query_column_of_a_type_the_store_cannot_hold_is_refused_saying_how_to_cast_it(
    column: str, said: str, home: Path, dal: KvClient
) -> None:
    """DuckDB's UBIGINT (hash() returns one) was stored as a long: 18446744073709551615 read
    back as -1, and every hash past 2^63 as a negative number. The other types were refused
    without a word on what to write instead."""
    from bulldozer.errors import BulldozerError
    from bulldozer.schema.table_check import check_against_catalog

    spec = job(f'{{query: "SELECT user_id, item_id, locale, {column} FROM sample.user_item_scores"}}', "[rating]")
    with pytest.raises(BulldozerError) as refused:
        run_job(spec, dal, home=str(home))
    assert said in str(refused.value)
    only_refusals(dal)
    [issue] = check_against_catalog(spec, home=str(home))
    assert issue.path == "data_movement.source.query" and said in issue.message


def test_a_querys_time_zone_is_utc_whatever_the_machines(home: Path) -> None:
    """DuckDB took the machine's zone: ``event_time::DATE`` (a timestamptz) was another day,
    and so another key, on a worker whose TZ is New York's than on one in Tokyo."""
    query = (
        "SELECT user_id, item_id, locale, event_time::DATE AS rating, strftime(event_time, '%H') AS price "
        "FROM sample.user_item_scores"
    )
    spec = home / "zoned.yaml"
    spec.write_text(job(f'{{query: "{query}"}}', "[rating, price]").text)
    seen = []
    for zone in ("America/New_York", "Asia/Tokyo"):
        run = _cli(["run", str(spec), "--json", "-q"], home, env={"TZ": zone})
        assert run.returncode == 0, run.stderr
        scan = _cli(["scan", "scores", "--limit", "50"], home, env={"TZ": zone})
        seen.append([json.loads(line) for line in scan.stdout.splitlines()])
    assert seen[0] == seen[1]
    table = open_catalog(CatalogConfig(), home).load_table("sample.user_item_scores").scan().to_arrow()
    utc = {
        (r["user_id"], r["item_id"], r["locale"]): (t.date().isoformat(), f"{t.hour:02d}") if t else (None, None)
        for r in table.select(["user_id", "item_id", "locale", "event_time"]).to_pylist()
        for t in [r["event_time"]]
    }
    for line in seen[0]:
        k = line["key"]
        assert (line["value"]["rating"], line["value"]["price"]) == utc[(k["user_id"], k["item_id"], k["locale"])]


def test_a_query_that_cannot_compute_a_value_from_the_rows_fails_without_retries(home: Path, dal: KvClient) -> None:
    """A cast out of range at run time was DuckDB's raw ConversionException, which a
    scheduler took for a transient failure and retried: the same rows fail the same way."""
    from bulldozer.kv.types import State

    spec = job(
        '{query: "SELECT user_id, item_id, locale, hash(user_id)::BIGINT AS rating FROM sample.user_item_scores"}',
        "[rating]",
    )
    with pytest.raises(
        SourceDataError, match=r"^the query failed on the source rows: Conversion Error: .*INT64"
    ) as failed:
        run_job(spec, dal, home=str(home))
    assert failed.value.retryable is False
    assert [n.state for n in dal.list_namespaces("scores")] == [State.FAILED]


def test_a_querys_batches_are_bounded_by_their_bytes_not_only_their_rows(tmp_path: Path) -> None:
    """A query's rows were read 65,536 at a time whatever they held: 10 k rows of 5 KB, one
    50 MB batch (20 k rows of 200 KB: one of 4 GB). They are read in DuckDB's pieces and
    combined up to the bytes of a batch, so a batch holds about ``BATCH_BYTES`` (at most one
    piece more); narrow rows still come 65,536 a batch."""
    from bulldozer.load.batches import BATCH_BYTES, BATCH_ROWS, PIECE_ROWS
    from bulldozer.load.source import QueryReader, build_sql_source, schema_at
    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse.catalog import open_catalog

    create_sample_warehouse(tmp_path, rows=80_000)
    catalog = open_catalog(CatalogConfig(), tmp_path)
    wide = "{query: 'SELECT user_id, item_id, locale, repeat(locale, 1000) AS padding FROM sample.user_item_scores WHERE item_id < 10'}"
    source = build_sql_source(job(wide, "[padding]"), catalog, schema_at)
    batches = list(QueryReader(source))
    rows = sum(b.num_rows for b in batches)
    assert rows > 2 * PIECE_ROWS and sum(b.nbytes for b in batches) > 2 * BATCH_BYTES
    piece = max(b.nbytes / b.num_rows for b in batches) * PIECE_ROWS
    assert len(batches) > 2 and max(b.nbytes for b in batches) <= BATCH_BYTES + piece
    narrow = build_sql_source(job("{query: 'SELECT * FROM sample.user_item_scores'}"), catalog, schema_at)
    sizes = [b.num_rows for b in QueryReader(narrow)]
    assert sum(sizes) == 80_000 and sizes[0] == BATCH_ROWS
