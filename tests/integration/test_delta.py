"""Delta versions (``data_movement.mode: delta | auto``) on a real Iceberg catalog and DAL.

The property test changes a table over several snapshots with every kind of write pyiceberg
makes — appends, copy-on-write updates and deletes, a compaction that rewrites every file
with the same rows, a whole-table overwrite — and after each one runs the job as a delta
on one alias and in full on another: the versions' digests, counts and contents must be
equal, on every engine. The other tests cover each reason a delta falls back to full."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from bulldozer.errors import DuplicateKeyError, NamespaceStateError, SourceDataError, VerificationError
from bulldozer.kv import KvClient
from bulldozer.kv.types import State
from bulldozer.load.runner import run_job
from bulldozer.spec import load_spec_text
from bulldozer.spec.loader import LoadedSpec
from bulldozer.spec.models import CatalogConfig
from bulldozer.versioning.run_state import RunRecord, loaded_of
from bulldozer.warehouse.catalog import open_catalog
from tests.integration.kv_fixtures import Harness

pytestmark = pytest.mark.integration

SPEC = """\
apiVersion: bulldozer/v1
kind: MoveDataToKvDal
metadata: {{name: {alias}, owner: tests}}
data_movement:
  source: {{table: {table}}}
  key_columns: [id]
  value_columns: [name, score]
  mode: {mode}
key_value_dal:
  alias: {alias}
  quality_gates: {{min_rows: 0}}
bulldozer_protobuf:
  package: bulldozer.jobs.{alias}
"""

SCHEMA = pa.schema(
    [pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()), pa.field("score", pa.float64())]
)


def job(alias: str, mode: str, table: str = "deltas.items", extra: str = "") -> LoadedSpec:
    return load_spec_text(SPEC.format(alias=alias, mode=mode, table=table) + extra, "job.yaml", env={})


def rows(ids: list[int], rng: random.Random, tag: str = "") -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": [None if rng.random() < 0.1 else f"n{i}{tag}" for i in ids],
            "score": [rng.random() for _ in ids],
        },
        schema=SCHEMA,
    )


def make_table(home: Path, name: str = "deltas.items", files: int = 4, per_file: int = 50) -> Any:
    catalog = open_catalog(CatalogConfig(), home)
    catalog.create_namespace_if_not_exists(name.split(".")[0])
    if catalog.table_exists(name):
        catalog.drop_table(name)
    table = catalog.create_table(name, schema=SCHEMA)
    rng = random.Random(1)
    for f in range(files):
        table.append(rows(list(range(f * per_file, (f + 1) * per_file)), rng))
    return table


def contents(client: KvClient, version: str) -> dict[bytes, bytes]:
    return dict(client.scan(namespace=version))


def change(table: Any, rng: random.Random, kind: str, next_id: list[int]) -> None:
    """One write of ``kind`` to ``table`` (a new snapshot)."""
    from pyiceberg.expressions import In

    ids = table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    some = sorted(rng.sample(ids, min(len(ids), rng.randint(1, 12)))) if ids else []
    if kind == "append":
        new = list(range(next_id[0], next_id[0] + rng.randint(1, 30)))
        next_id[0] += len(new)
        table.append(rows(new, rng))
    elif kind == "update" and some:
        table.overwrite(rows(some, rng, "u"), overwrite_filter=In("id", some))
    elif kind == "delete" and some:
        table.delete(In("id", some))
    elif kind == "compact":
        table.overwrite(table.scan().to_arrow())  # every file rewritten, the same rows
    elif kind == "overwrite":
        kept = [i for i in ids if rng.random() > 0.2]
        new = list(range(next_id[0], next_id[0] + 10))
        next_id[0] += 10
        table.overwrite(rows(kept + new, rng, "o"))


def test_every_delta_version_equals_a_full_rebuild(kv: Harness, tmp_path: Path) -> None:
    home = tmp_path / "home"
    table = make_table(home)
    delta_alias, full_alias = kv.alias(), kv.alias()
    first = run_job(job(delta_alias, "delta"), kv.client, home=str(home))
    assert first.mode == "full" and first.full_reason == "there is no live version to build on"
    rng = random.Random(kv.engine_name)
    next_id = [10_000]
    kinds = ["append", "update", "delete", "compact", "overwrite", "nothing", "update", "delete"]
    for kind in kinds:
        change(table, rng, kind, next_id)
        delta = run_job(job(delta_alias, "delta"), kv.client, home=str(home))
        full = run_job(job(full_alias, "full"), kv.client, home=str(home))
        assert delta.mode == "delta", (kind, delta.full_reason)
        assert full.mode == "full" and not full.full_reason
        assert (delta.rows, delta.digest) == (full.rows, full.digest), kind
        assert contents(kv.client, delta.version) == contents(kv.client, full.version), kind
        assert delta.snapshot_id == full.snapshot_id == table.refresh().current_snapshot().snapshot_id
        summary = delta.delta
        if kind == "compact":  # rewritten files, the same rows: nothing to write
            assert summary["files_removed"] and summary["files_added"]
            assert summary["deleted"] == summary["changed"] == summary["added"] == 0
        if kind == "nothing":
            assert summary["rows_read"] == 0
        if kind in ("append", "update", "delete"):  # each wrote what it should have, and only that
            wrote = {k: summary[k] for k in ("added", "changed", "deleted") if summary[k]}
            assert set(wrote) == {{"append": "added", "update": "changed", "delete": "deleted"}[kind]}, summary
        info = kv.client.describe(delta.version)
        assert info.state == State.ACTIVE and info.verified and info.base == summary["base"]
        assert kv.client.describe(summary["base"]).state == State.RETIRED  # intact: a rollback target
        # the null counts the quality gates see are derived too
        assert loaded_of(info) == loaded_of(kv.client.describe(full.version)), kind


@pytest.mark.spark
def test_every_delta_over_merge_on_read_deletes_and_upserts_equals_a_full_rebuild(
    tmp_path: Path, dal: KvClient
) -> None:
    """A table changed merge-on-read — Spark SQL's row-level DELETE, UPDATE and MERGE
    (positional delete files), a change-data writer's upserts (equality delete files, the
    new rows in the same commit), its delete files rewritten, its data files compacted with
    their deletes applied — gets a delta version for each change, equal to a full rebuild
    and to what Iceberg's reader reads; a delta reads the files whose deletes changed, not
    the table. (Until now a snapshot with a delete file made every run a full one.)"""
    from bulldozer.load.engines.spark.session import spark_session, stop_spark_session
    from bulldozer.load.plan import plan_run
    from tests.integration.iceberg_java import JavaTable

    home = tmp_path / "home"
    make_table(home, files=4, per_file=50)
    arrow = open_catalog(CatalogConfig(), home).load_table("deltas.items").schema().as_arrow()
    name, rng = "lake.deltas.items", random.Random(11)
    stop_spark_session()  # a session of another home in this worker
    spark = spark_session("lake", None, str(home), "local[2]")

    def sql(text: str) -> None:
        spark.sql(f"REFRESH TABLE {name}")
        spark.sql(text).collect()

    def upsert(label: str, deleted: list[int], written: list[int]) -> None:
        items = JavaTable(spark, name)
        ids = pa.table({"id": deleted}, schema=pa.schema([arrow.field("id")]))
        new = items.data_file(f"{label}-rows", rows(written, rng, label).cast(arrow))
        items.commit(rows=[new], deletes=[items.equality_deletes(f"{label}-ids", ids)])

    # keys whose rows lie in every file's id range: the delete applies to every file, and the
    # base's records of its keys are what they lose; some of those rows have a null name
    spread = [0, 25, 130, 131, *range(150, 190, 3), 1_000]
    assert spark.sql(f"SELECT count(*) FROM {name} WHERE name IS NULL AND id IN {tuple(spread)}").collect()[0][0]

    def upsert_across_then_delete() -> None:  # 130 and 131 in a file read again for the DELETE
        upsert("across", spread, [25])
        sql(f"DELETE FROM {name} WHERE id IN (131, 132)")

    names = ["n17", "n18", "n140", "n-none"]
    by_name = {"deleted": spark.sql(f"SELECT count(*) FROM {name} WHERE name IN {tuple(names)}").collect()[0][0]}

    def delete_by_name() -> None:  # not by the key: the files it applies to are read again
        items = JavaTable(spark, name)
        deleted = pa.table({"name": names}, schema=pa.schema([arrow.field("name")]))
        items.commit(deletes=[items.equality_deletes("by-name", deleted)])

    def append_a_deleted_key() -> None:  # later than its delete: kept
        open_catalog(CatalogConfig(), home).load_table("deltas.items").append(rows([12], rng, "again"))

    changes: list[tuple[str, Any, dict[str, int]]] = [
        ("delete", lambda: sql(f"DELETE FROM {name} WHERE id IN (3, 60, 61, 199)"), {"deleted": 4}),
        ("update", lambda: sql(f"UPDATE {name} SET name = concat('u', coalesce(name, '')) WHERE id % 40 = 1"), {}),
        (
            "merge",
            lambda: sql(
                f"MERGE INTO {name} t USING (SELECT * FROM VALUES (5L, 'm5'), (62L, NULL), (900L, 'm900') AS s(id, name)) s "
                "ON t.id = s.id WHEN MATCHED AND s.name IS NULL THEN DELETE "
                "WHEN MATCHED THEN UPDATE SET t.name = s.name WHEN NOT MATCHED THEN INSERT (id, name, score) "
                "VALUES (s.id, s.name, 0.5)"
            ),
            {"changed": 1, "deleted": 1, "added": 1},
        ),
        # 3 is gone already; ids 3-13: a range few files' bounds hold, and the others cannot
        # lose a row to it: taken by key too
        (
            "upsert",
            lambda: upsert("upsert", [3, 10, 11, 12, 13], [10, 11, 500]),
            {"changed": 2, "deleted": 2, "added": 1},
        ),
        ("append after the upsert", append_a_deleted_key, {"added": 1}),
        ("delete by name", delete_by_name, by_name),
        ("upsert across the table", upsert_across_then_delete, {"changed": 1, "deleted": len(spread) - 1}),
        (
            "delete files rewritten",
            lambda: sql(
                "CALL lake.system.rewrite_position_delete_files(table => 'deltas.items', options => map('rewrite-all', 'true'))"
            ),
            {},
        ),
        (
            "compaction",
            lambda: sql(
                "CALL lake.system.rewrite_data_files(table => 'deltas.items', options => map('rewrite-all', 'true', "
                "'remove-dangling-deletes', 'true'))"
            ),
            {},
        ),
    ]
    try:
        sql(
            f"ALTER TABLE {name} SET TBLPROPERTIES ('write.delete.mode' = 'merge-on-read', "
            "'write.update.mode' = 'merge-on-read', 'write.merge.mode' = 'merge-on-read')"
        )
        run_job(job("items_delta", "delta"), dal, home=str(home))
        for kind, make, wrote in changes:
            make()
            planned = plan_run(job("items_delta", "delta"), dal, str(home))  # what `bulldozer plan` says
            delta = run_job(job("items_delta", "delta"), dal, home=str(home))
            full = run_job(job("items_full", "full"), dal, home=str(home))
            assert delta.mode == "delta", (kind, delta.full_reason)
            assert (delta.rows, delta.digest) == (full.rows, full.digest), kind
            assert contents(dal, delta.version) == contents(dal, full.version), kind
            spark.sql(f"REFRESH TABLE {name}")
            assert full.rows == spark.sql(f"SELECT count(*) FROM {name}").collect()[0][0], kind
            summary = delta.delta
            if kind == "update":
                wrote = {"changed": spark.sql(f"SELECT count(*) FROM {name} WHERE id % 40 = 1").collect()[0][0]}
            assert {k: summary[k] for k in ("added", "changed", "deleted") if summary[k]} == wrote, (kind, summary)
            if kind == "delete":  # three files' rows are read, on both sides; the fourth not
                assert (summary["files_reread"], summary["files_removed"], summary["files_added"]) == (3, 0, 0)
                assert summary["rows_read"] == 150 + 150 - 4
            if kind == "upsert":  # no file read but the new one: 10-13 by key (3 is no record)
                assert (summary["files_reread"], summary["keys_looked_up"], summary["deleted_by_key"]) == (0, 5, 4)
            elif kind == "delete by name":  # the files whose name bounds hold those names, not all
                live = open_catalog(CatalogConfig(), home).load_table("deltas.items").inspect.data_files().num_rows
                assert 1 <= summary["files_reread"] < live, (summary, live)
            # the plan counts each file once, and the keys the deletes by key name
            files = summary["files_removed"] + summary["files_added"] + summary["files_reread"]
            assert (planned.mode, planned.delta_files) == ("delta", files), (kind, planned)
            assert planned.delta_keys == {"upsert": 5, "upsert across the table": len(spread)}.get(kind, 0), kind
            if kind == "upsert across the table":  # one file read again (the DELETE's): the others by key
                assert summary["files_reread"] == 1 and summary["deleted_by_key"] == len(spread) - 3, (
                    summary
                )  # not 130, 131, 1000
            elif kind != "upsert":
                assert not summary["keys_looked_up"], (kind, summary)
            # the null counts the quality gates see are derived too
            assert loaded_of(dal.describe(delta.version)) == loaded_of(dal.describe(full.version)), kind
            if kind == "delete files rewritten":
                assert summary["files_reread"] and summary["rows_read"]
    finally:
        stop_spark_session()


@pytest.mark.spark
def test_a_delta_takes_by_key_only_the_rows_a_partitions_deletes_can_reach(tmp_path: Path, dal: KvClient) -> None:
    """A partition's equality deletes reach its files only: deleting by ``id`` in region eu,
    an id whose row lives in us stays, so the delta reads eu's files again rather than
    take the base's records by key (us's id range holds the deleted ids). Deleting by
    (id, region), as Flink's upserts of a table partitioned by a key column do, the other
    partition's region bounds show none of its rows can be deleted: taken by key."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType

    from bulldozer.load.engines.spark.session import spark_session, stop_spark_session
    from tests.integration.iceberg_java import JavaTable

    home = tmp_path / "home"
    catalog = open_catalog(CatalogConfig(), home)
    catalog.create_namespace("deltas")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "region", StringType(), required=True),
        NestedField(3, "name", StringType()),
        NestedField(4, "score", DoubleType()),
    )
    by_region = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))
    table = catalog.create_table("deltas.regional", schema, partition_spec=by_region)
    arrow = schema.as_arrow()

    def regional(ids: list[int], tag: str = "") -> pa.Table:
        regions = ["eu" if i % 2 == 0 else "us" for i in ids]
        names = [f"n{i}{tag}" for i in ids]
        return pa.table({"id": ids, "region": regions, "name": names, "score": [i / 2 for i in ids]}, schema=arrow)

    table.append(regional(list(range(100))))  # a file per region
    by_id = job("regional", "delta", table="deltas.regional")
    by_both = load_spec_text(
        by_id.text.replace("key_columns: [id]", "key_columns: [id, region]")
        .replace("alias: regional", "alias: regional_both")
        .replace("name: regional", "name: regional_both"),
        "job.yaml",
        env={},
    )
    full_id = job("regional_full", "full", table="deltas.regional")
    for spec in (by_id, by_both):
        run_job(spec, dal, home=str(home))
    stop_spark_session()
    spark = spark_session("lake", None, str(home), "local[2]")
    try:
        items = JavaTable(spark, "lake.deltas.regional")
        eu = items.data_file("eu-rows", regional([2], "x"), items.spec(), "region=eu")
        ids = pa.table({"id": [2, 3, 4]}, schema=pa.schema([arrow.field("id")]))  # 3 lives in us: kept
        items.commit(rows=[eu], deletes=[items.equality_deletes("eu-ids", ids, items.spec(), "region=eu")])
        delta, full = run_job(by_id, dal, home=str(home)), run_job(full_id, dal, home=str(home))
        assert delta.mode == "delta" and (delta.rows, delta.digest) == (full.rows, full.digest) and full.rows == 99
        summary = delta.delta
        said = (summary["changed"], summary["deleted"], summary["files_reread"], summary["keys_looked_up"])
        assert said == (1, 1, 1, 0), summary
        assert run_job(by_both, dal, home=str(home)).delta["files_reread"] == 1  # its key is not (id) alone
        # by (id, region): the us file's region bounds show no row of it can be deleted
        both = pa.table(
            {"id": [6, 8], "region": ["eu", "eu"]}, schema=pa.schema([arrow.field("id"), arrow.field("region")])
        )
        items.commit(deletes=[items.equality_deletes("eu-both", both, items.spec(), "region=eu")])
        spark.sql("REFRESH TABLE lake.deltas.regional")
        expected = spark.sql("SELECT count(*) FROM lake.deltas.regional").collect()[0][0]
    finally:
        stop_spark_session()
    delta = run_job(by_both, dal, home=str(home))
    assert delta.mode == "delta" and delta.rows == expected == 97
    summary = delta.delta
    assert (summary["files_reread"], summary["deleted_by_key"], summary["deleted"]) == (0, 2, 2), summary
    assert contents(dal, delta.version) == contents(
        dal,
        run_job(
            load_spec_text(
                by_both.text.replace("mode: delta", "mode: full").replace("alias: regional_both", "alias: rb_full"),
                "job.yaml",
                env={},
            ),
            dal,
            home=str(home),
        ).version,
    )


V3_SPEC = """\
apiVersion: bulldozer/v1
kind: MoveDataToKvDal
metadata: {{name: {alias}, owner: tests}}
data_movement:
  source: {{table: db.events}}
  key_columns: [id]
  mode: {mode}
key_value_dal:
  alias: {alias}{write}
bulldozer_protobuf:
  package: bulldozer.jobs.{alias}
"""


@pytest.mark.spark
def test_a_v3_tables_deletion_vectors_load_on_every_engine_and_as_deltas(tmp_path: Path, dal: KvClient) -> None:
    """Iceberg v3's deletion vectors (Spark's row-level DELETE and UPDATE on a format-version
    3 table: one Puffin file of many data files' vectors, each replaced by a merged one at
    the next change): the local engine, the Spark engine by key and its own splits load the
    version Iceberg's reader reads, and a delta across further changes equals a full run."""
    from bulldozer.load.engines.spark.session import spark_session, stop_spark_session

    def spec(alias: str, mode: str = "full", partitions: int = 0) -> LoadedSpec:
        write = f"\n  write:\n    partitions: {partitions}" if partitions else ""
        return load_spec_text(V3_SPEC.format(alias=alias, mode=mode, write=write), "job.yaml", env={})

    open_catalog(CatalogConfig(), tmp_path).create_namespace("db")
    stop_spark_session()
    spark = spark_session("lake", None, str(tmp_path), "local[2]")
    try:
        spark.sql(
            "CREATE TABLE lake.db.events (id BIGINT NOT NULL, v STRING) USING iceberg TBLPROPERTIES "
            "('format-version' = '3', 'write.delete.mode' = 'merge-on-read', 'write.update.mode' = 'merge-on-read')"
        )
        spark.sql("INSERT INTO lake.db.events SELECT id, concat('v', cast(id AS STRING)) FROM range(0, 1000)")
        spark.sql("DELETE FROM lake.db.events WHERE id % 7 = 0")
        spark.sql("UPDATE lake.db.events SET v = 'u' WHERE id % 11 = 0")
        kinds = {r[0] for r in spark.sql("SELECT file_format FROM lake.db.events.delete_files").collect()}
        read = spark.sql("SELECT count(*) FROM lake.db.events").collect()[0][0]
    finally:
        stop_spark_session()
    assert kinds == {"PUFFIN"} and read == 857
    reference = run_job(spec("by_key", partitions=4), dal, engine="spark", home=str(tmp_path))
    for engine, loaded in (("local", spec("local")), ("spark", spec("splits", partitions=1))):
        record = run_job(loaded, dal, engine=engine, home=str(tmp_path))
        assert (record.rows, record.digest) == (reference.rows, reference.digest) == (857, reference.digest), engine
    run_job(spec("delta", "delta"), dal, home=str(tmp_path))
    spark = spark_session("lake", None, str(tmp_path), "local[2]")
    try:
        spark.sql("DELETE FROM lake.db.events WHERE id % 13 = 0")
        spark.sql("UPDATE lake.db.events SET v = 'w' WHERE id % 17 = 0")
        spark.sql("INSERT INTO lake.db.events VALUES (5000, 'new')")
    finally:
        stop_spark_session()
    delta = run_job(spec("delta", "delta"), dal, home=str(tmp_path))
    full = run_job(spec("local"), dal, home=str(tmp_path))
    assert delta.mode == "delta" and (delta.rows, delta.digest) == (full.rows, full.digest), delta.full_reason
    assert contents(dal, delta.version) == contents(dal, full.version)
    assert delta.delta["files_reread"] and delta.delta["added"] == 1


def test_a_delta_reads_only_the_changed_files(tmp_path: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """...and plans them from the manifests the two snapshots do not share: a day's append
    opens its one new manifest, not the table's twenty."""
    import pyiceberg.table

    home = tmp_path / "home"
    table = make_table(home, files=20, per_file=100)
    run_job(job("items", "auto"), dal, home=str(home))
    table.append(rows(list(range(5000, 5010)), random.Random(2)))
    opened: list[str] = []
    open_manifest = pyiceberg.table._open_manifest

    def counted(io: Any, manifest: Any, *args: Any) -> Any:
        opened.append(manifest.manifest_path)
        return open_manifest(io, manifest, *args)

    monkeypatch.setattr(pyiceberg.table, "_open_manifest", counted)
    record = run_job(job("items", "auto"), dal, home=str(home))
    monkeypatch.undo()
    assert len(opened) == 1 and len(table.refresh().current_snapshot().manifests(table.io)) == 21
    assert record.mode == "delta" and record.delta["files_added"] == 1 and record.delta["files_removed"] == 0
    assert record.delta["rows_read"] == 10 and record.rows == 2_010
    reason = dal.alias_history("items")[0].reason  # the history says what the flip was
    assert "a delta from" in reason and "10 keys added, 0 changed, 0 deleted" in reason
    # auto writes a full version when most of the table changed
    table.overwrite(rows(list(range(3000)), random.Random(3)))
    record = run_job(job("items", "auto"), dal, home=str(home))
    assert record.mode == "full" and "a full run reads less" in record.full_reason


def test_a_deltas_changed_files_are_read_while_its_version_is_made(
    tmp_path: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The changed files are read on a thread of their own from the moment the plan is known
    (``delta.read_ahead``), so the reading overlaps the create stage's calls to the store, in
    a run and in a scheduler's load stage alike (on the code before, the load stage read them
    on the main thread); a read that fails fails the load stage, leaving the version FAILED
    and the alias where it was."""
    import threading

    import bulldozer.load.delta as delta
    from bulldozer.errors import LoadError
    from bulldozer.load.runner import run_stage

    home = tmp_path / "home"
    table = make_table(home)
    run_job(job("items", "delta"), dal, home=str(home))
    events: list[str] = []
    read_of: Callable[..., Any] = delta._Read.of.__func__  # type: ignore[attr-defined]
    create = KvClient.create_namespace

    def reading(cls: Any, *args: Any) -> Any:
        events.append(f"read on {threading.current_thread().name}")
        return read_of(cls, *args)

    def creating(self: KvClient, *args: Any, **kwargs: Any) -> Any:
        events.append("create")
        return create(self, *args, **kwargs)

    monkeypatch.setattr(delta._Read, "of", classmethod(reading))
    monkeypatch.setattr(KvClient, "create_namespace", creating)
    runs: list[Callable[[], RunRecord]] = [
        lambda: run_job(job("items", "delta"), dal, home=str(home)),
        lambda: run_stage("load", job("items", "delta"), dal, run_key="day-3", home=str(home)),
    ]
    for day, run in enumerate(runs):
        events.clear()
        table.append(rows(list(range(1000 + 10 * day, 1010 + 10 * day)), random.Random(day)))
        assert run().mode == "delta"
        assert sorted(events) == ["create", "read on delta-read-ahead"]  # once, on its thread

    def failing(cls: Any, *args: Any) -> Any:
        raise LoadError("a changed file could not be read")

    live = dal.get_alias("items").namespace
    monkeypatch.setattr(delta._Read, "of", classmethod(failing))
    table.append(rows(list(range(2000, 2010)), random.Random(7)))
    with pytest.raises(LoadError, match="could not be read"):
        run_job(job("items", "delta"), dal, home=str(home))
    failed = dal.list_namespaces("items")[-1]
    assert failed.state == State.FAILED and "could not be read" in failed.failure_reason
    assert dal.get_alias("items").namespace == live


#: a delta run whose create fails while its changed files are still being read (each read
#: takes a minute), in a process of its own: exit code 3 once the run has failed
_FAILS_BEFORE_ITS_LOAD = """
import random, sys, time
from pathlib import Path

import bulldozer.load.delta as delta
from bulldozer.errors import BackendUnavailableError
from bulldozer.kv import KvClient, KvDal, create_engine
from bulldozer.load.runner import run_job
from tests.integration.test_delta import job, make_table, rows

home = Path(sys.argv[1])
table = make_table(home)
client = KvClient.in_process(KvDal(create_engine({"type": "memory"})), principal="tester")
assert run_job(job("items", "delta"), client, home=str(home)).mode == "full"
table.append(rows(list(range(1000, 1010)), random.Random(2)))
read = delta._Rows.read

def slow(self, *args):
    time.sleep(60)
    return read(self, *args)

def refused(self, *args, **kwargs):
    raise BackendUnavailableError("the DAL went away")

delta._Rows.read, KvClient.create_namespace = slow, refused
try:
    run_job(job("items", "delta"), client, home=str(home))
except BackendUnavailableError:
    print("the run failed", flush=True)
sys.exit(3)
"""


def test_a_delta_that_fails_before_its_load_does_not_wait_at_exit_for_its_read(tmp_path: Path) -> None:
    """The changed files are read on daemon threads (``delta._in_background``): a process
    whose run failed in its create stage, while the files were still being read, ends at
    once. On the code before, the interpreter waited at exit for the removed side's read
    (a ``ThreadPoolExecutor``'s thread): here, a minute."""
    import subprocess
    import sys
    import time

    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", _FAILS_BEFORE_ITS_LOAD, str(tmp_path / "home")],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout.strip()) == (3, "the run failed"), done.stderr[-2000:]
    assert time.monotonic() - started < 40  # not the minute the reads take


def test_a_delta_of_a_branch_or_tag_equals_a_full_rebuild_also_when_the_ref_moves_back(
    tmp_path: Path, dal: KvClient
) -> None:
    """``ref``: a delta builds on the version of the ref's earlier head, whatever main did
    meanwhile; a tag moved back to an older snapshot is a delta too (the files its new head
    lacks are the removed side), equal to a full rebuild each time."""
    from pyiceberg.expressions import In

    home = tmp_path / "home"
    table = make_table(home, files=4, per_file=50)
    first = table.current_snapshot().snapshot_id
    table.manage_snapshots().create_branch(first, "audit").create_tag(first, "published").commit()
    rng = random.Random(5)
    for ref in ("audit", "published"):
        run_job(job(f"d_{ref}", f"delta\n  ref: {ref}"), dal, home=str(home))

    def both(ref: str) -> RunRecord:
        delta = run_job(job(f"d_{ref}", f"delta\n  ref: {ref}"), dal, home=str(home))
        full = run_job(job(f"f_{ref}", f"full\n  ref: {ref}"), dal, home=str(home))
        assert delta.mode == "delta", (ref, delta.full_reason)
        assert delta.snapshot_id == full.snapshot_id == table.refresh().snapshot_by_name(ref).snapshot_id
        assert (delta.rows, delta.digest) == (full.rows, full.digest), ref
        assert contents(dal, delta.version) == contents(dal, full.version), ref
        return delta

    table.append(rows(list(range(1000, 1020)), rng), branch="audit")
    table.delete(In("id", [3, 60]), branch="audit")
    table.append(rows(list(range(2000, 2100)), rng))  # main moves too: no ref reads it
    audited = both("audit")
    assert (audited.rows, audited.delta["added"], audited.delta["deleted"]) == (218, 20, 2)
    moved = table.refresh().snapshot_by_name("audit").snapshot_id
    table.manage_snapshots().remove_tag("published").create_tag(moved, "published").commit()
    assert both("published").rows == 218  # forward to the audited head
    table.manage_snapshots().remove_tag("published").create_tag(first, "published").commit()
    back = both("published")  # and back: its 20 rows gone, its 2 back
    assert (back.rows, back.delta["added"], back.delta["deleted"]) == (200, 2, 20)


def test_a_delta_keeps_the_specs_write_rate(tmp_path: Path, dal: KvClient) -> None:
    """records_per_second bounds a delta's writes as a full run's, deletes included (a delta
    ignored it), and the version is the one a full rebuild makes."""
    from pyiceberg.expressions import In

    home = tmp_path / "home"
    table = make_table(home)

    def paced(alias: str, mode: str) -> LoadedSpec:
        text = SPEC.format(alias=alias, mode=mode, table="deltas.items").replace(
            "  quality_gates: {min_rows: 0}",
            "  quality_gates: {min_rows: 0}\n  write: {records_per_second: 400, batch_size: 20}",
        )
        return load_spec_text(text, "job.yaml", env={})

    run_job(paced("paced", "delta"), dal, home=str(home))
    rng = random.Random(5)
    table.overwrite(rows(list(range(0, 40)), rng, "u"), overwrite_filter=In("id", list(range(0, 40))))
    table.delete(In("id", list(range(100, 130))))
    table.append(rows(list(range(1000, 1030)), rng))
    delta = run_job(paced("paced", "delta"), dal, home=str(home))
    full = run_job(job("unpaced", "full"), dal, home=str(home))
    assert delta.mode == "delta" and (delta.delta["changed"], delta.delta["deleted"], delta.delta["added"]) == (
        40,
        30,
        30,
    )
    # 70 deletes and 70 puts at 400 records/s: at least (140 - 20) / 400 = 0.3 s of writing
    assert delta.timings["load"] >= 0.3, delta.timings
    assert (delta.rows, delta.digest) == (full.rows, full.digest)
    assert contents(dal, delta.version) == contents(dal, full.version)


def test_the_engine_is_started_ahead_for_full_runs_only(tmp_path: Path, dal: KvClient) -> None:
    """``LoadEngine.prepare`` (Spark: start the driver and the executors' Python workers
    in the background) runs as the schema stage of a full run begins (once the spec is not
    refused outright), before its work; a ``delta`` or ``auto`` run, which often does not
    use the engine, does not start it ahead."""
    from bulldozer.load.engines.local import LocalEngine
    from bulldozer.spec.models import JobSpec

    home = tmp_path / "home"
    make_table(home)
    stages: list[str] = []

    class Recording(LocalEngine):
        def prepare(self, spec: JobSpec, home: str | None) -> None:
            stages.append(f"prepare {spec.data_movement.mode}")

    def run(mode: str) -> RunRecord:
        return run_job(job("items", mode), dal, engine=Recording(), home=str(home), on_stage=stages.append)

    assert run("full").mode == "full"
    assert stages[:2] == ["schema", "prepare full"] and stages.count("prepare full") == 1
    stages.clear()
    # delta and auto runs: the first writes a full version (the spec changed), the next a delta
    assert [run("delta").mode, run("delta").mode, run("auto").mode, run("auto").mode] == ["full", "delta"] * 2
    assert "schema" in stages and not [stage for stage in stages if stage.startswith("prepare")]


def _reason(record: RunRecord) -> str:
    assert record.mode == "full" and record.outcome == "succeeded"
    return record.full_reason


def test_a_delta_falls_back_to_full_saying_why(tmp_path: Path, dal: KvClient) -> None:
    import pyarrow.parquet as pq
    from pyiceberg.expressions import In
    from pyiceberg.types import StringType

    home = tmp_path / "home"
    table = make_table(home)
    run_job(job("items", "delta"), dal, home=str(home))
    # the spec changed (another quality gate)
    other = job("items", "delta", extra="").text.replace("{min_rows: 0}", "{min_rows: 0, max_null_fraction: {name: 1}}")
    assert "the spec changed since" in _reason(run_job(load_spec_text(other, "job.yaml", env={}), dal, home=str(home)))
    run_job(job("items", "delta"), dal, home=str(home))  # the first spec again: full (its live version is the other's)
    table.append(rows([900], random.Random(4)))
    assert run_job(job("items", "delta"), dal, home=str(home)).mode == "delta"
    # the table replaced under the same name (a new table UUID)
    table = make_table(home)
    assert "was replaced (its UUID changed)" in _reason(run_job(job("items", "delta"), dal, home=str(home)))
    # the table's schema changed (a column added, then a snapshot written with it)
    with table.update_schema() as update:
        update.add_column("extra", StringType())
    table.append(rows([902], random.Random(6)).append_column("extra", pa.array(["x"])))
    assert "the table's schema changed" in _reason(run_job(job("items", "delta"), dal, home=str(home)))
    # the live version's snapshot expired
    live = dal.describe(dal.get_alias("items").namespace)
    table.append(rows([901], random.Random(5)))
    table.maintenance.expire_snapshots().by_id(live.snapshot_id).commit()
    assert "has expired" in _reason(run_job(job("items", "delta"), dal, home=str(home)))
    # the live version's snapshot's manifest list damaged (a full run reads none of it)
    live = dal.describe(dal.get_alias("items").namespace)
    table.append(rows([903], random.Random(7)))
    listing = Path(table.snapshot_by_id(live.snapshot_id).manifest_list.removeprefix("file://"))
    listing.write_bytes(listing.read_bytes()[: listing.stat().st_size // 2])
    said = "the two snapshots cannot be compared: cannot read the metadata of table deltas.items: "
    assert said in _reason(run_job(job("items", "delta"), dal, home=str(home)))
    # a file of the live version's snapshot that the delta would read is gone (deleted as an
    # orphan while its snapshot was kept), or written again in place: a full run reads none
    for damage in ("gone", "written again"):
        live = dal.describe(dal.get_alias("items").namespace)
        before = {str(p) for p in (home / "warehouse").rglob("*.parquet")}
        ids = table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()[:3]
        table.overwrite(rows(ids, random.Random(8), "u"), overwrite_filter=In("id", ids))  # rewrites a file
        now = {t.file.file_path for t in table.scan().plan_files()}
        then = {t.file.file_path for t in table.scan(snapshot_id=live.snapshot_id).plan_files()}
        old = Path(sorted(then - now)[0].removeprefix("file://"))  # a file the delta reads
        assert str(old) in before
        if damage == "gone":
            old.unlink()
        else:
            pq.write_table(pq.read_table(old).slice(1), old)
        said = f"a file of the base snapshot {live.snapshot_id} is not as it was committed (cannot read the data file"
        if damage == "written again":
            said = f"a file of the base snapshot {live.snapshot_id} is not as it was committed (the data file"
        fallback = run_job(job("items", "delta"), dal, home=str(home))
        assert said in _reason(fallback) and str(old) in fallback.full_reason, fallback.full_reason
        assert run_job(job("items", "delta"), dal, home=str(home)).mode == "delta"  # and from it, deltas again
    # a live version not loaded by this job's runs
    assert "no live version" in _reason(run_job(job("fresh", "delta"), dal, home=str(home)))


def test_mode_auto_writes_a_full_version_where_the_store_copies_a_base_record_by_record(
    kv: Harness, tmp_path: Path
) -> None:
    """A delta's base is layered (embedded) or copied inside the store (Redis): auto writes a
    delta. Copied record by record (Cassandra), a delta costs about a full run: auto writes a
    full version and says why; mode delta writes a delta all the same."""
    from bulldozer.kv.types import BaseCopy

    home = tmp_path / "home"
    table = make_table(home, files=2, per_file=20)
    alias = kv.alias()
    run_job(job(alias, "auto"), kv.client, home=str(home))
    table.append(rows([500], random.Random(1)))
    record = run_job(job(alias, "auto"), kv.client, home=str(home))
    if kv.engine.base_copy == BaseCopy.RECORDS:
        assert "copies a base version record by record" in _reason(record)
        assert "the spec changed" in _reason(run_job(job(alias, "delta"), kv.client, home=str(home)))
        table.append(rows([501], random.Random(2)))
        assert run_job(job(alias, "delta"), kv.client, home=str(home)).mode == "delta"
    else:
        assert record.mode == "delta", record.full_reason


def test_a_delta_refuses_a_duplicate_key_the_base_holds(
    kv: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new key the base holds is put over the base's pair: the store's running digest is
    then not exact, the seal measures the version whole and finds a record fewer than the
    delta expects, and the run names the key. On every engine, since each keeps (or not) a
    running digest its own way."""
    from bulldozer.load.runner import run_stage

    home = tmp_path / "home"
    table = make_table(home, files=3, per_file=20)
    alias = kv.alias()
    base = run_job(job(alias, "delta"), kv.client, home=str(home))
    table.append(rows([7, 1000], random.Random(6)))  # key 7 is already in an unchanged file
    with pytest.raises(DuplicateKeyError, match='"id": 7'):
        run_job(job(alias, "delta"), kv.client, home=str(home))
    assert kv.client.get_alias(alias).namespace == base.version
    failed = [r for r in kv.client.list_namespaces(alias) if r.name != base.version]
    assert [r.state for r in failed] == [State.FAILED]
    assert "verification failed at seal" in failed[0].failure_reason
    # a scheduler's stages, each its own process: the verify stage finds the key from the
    # snapshots the load stage recorded, even once the table has moved on
    loaded = run_stage("load", job(alias, "delta"), kv.client, run_key="day-2", home=str(home))
    assert loaded.mode == "delta" and loaded.delta["added"] == 2
    table.append(rows([2000], random.Random(8)))
    with pytest.raises(DuplicateKeyError, match='"id": 7'):
        run_stage("verify", job(alias, "delta"), kv.client, run_key="day-2", home=str(home))
    assert kv.client.describe(loaded.version).state == State.FAILED
    assert kv.client.get_alias(alias).namespace == base.version
    # should finding the key fail, the seal's own error stands
    from bulldozer.load import delta

    def unreadable(*_args: object) -> None:
        raise OSError("the changed files are gone")

    loaded = run_stage("load", job(alias, "delta"), kv.client, run_key="day-3", home=str(home))
    monkeypatch.setattr(delta._Read, "of", unreadable)
    with pytest.raises(VerificationError, match="verification failed at seal"):
        run_stage("verify", job(alias, "delta"), kv.client, run_key="day-3", home=str(home))
    assert kv.client.get_alias(alias).namespace == base.version


def test_a_delta_refuses_a_key_its_changed_files_hold_twice(tmp_path: Path, dal: KvClient) -> None:
    home = tmp_path / "home"
    table = make_table(home)
    base = run_job(job("items", "delta"), dal, home=str(home))
    table.append(rows([9001, 9002], random.Random(6)))
    table.append(rows([9001], random.Random(7)))  # a new key, in two of the new files
    with pytest.raises(DuplicateKeyError, match='"id": 9001'):
        run_job(job("items", "delta"), dal, home=str(home))
    assert dal.get_alias("items").namespace == base.version


def test_a_delta_refuses_a_changed_file_that_is_not_the_one_its_snapshot_committed(
    tmp_path: Path, dal: KvClient
) -> None:
    """A delta reads its changed files with the full run's reader, so a file written again
    in place after its snapshot committed it is refused there too (naming it), and the
    alias stays on the base."""
    import pyarrow.parquet as pq

    home = tmp_path / "home"
    table = make_table(home)
    base = run_job(job("items", "delta"), dal, home=str(home))
    before = set((home / "warehouse").rglob("*.parquet"))
    table.append(rows([9001, 9002, 9003], random.Random(6)))
    (added,) = set((home / "warehouse").rglob("*.parquet")) - before
    pq.write_table(pq.read_table(added).slice(0, 2), added)  # 9003 gone from the file
    with pytest.raises(
        SourceDataError, match=f"{re.escape(added.as_uri())} holds 2 rows where the table's snapshot committed 3"
    ):
        run_job(job("items", "delta"), dal, home=str(home))
    assert dal.get_alias("items").namespace == base.version


def test_a_delta_spec_refuses_what_cannot_be_a_delta() -> None:
    from bulldozer.errors import SpecError

    text = SPEC.format(alias="items", mode="delta", table="deltas.items").replace(
        "  source: {table: deltas.items}", "  source: {query: 'SELECT * FROM deltas.items'}"
    )
    with pytest.raises(SpecError, match="a query source is loaded in full"):
        load_spec_text(text, "job.yaml", env={})


def test_a_killed_delta_is_resumed_to_the_same_version(tmp_path: Path, dal: KvClient) -> None:
    from bulldozer.load.runner import JobRun

    home = tmp_path / "home"
    table = make_table(home)
    run_job(job("items", "delta"), dal, home=str(home))
    change(table, random.Random(7), "update", [10_000])
    change(table, random.Random(8), "delete", [10_000])
    # a first attempt applies the delta and dies before its seal
    attempt = JobRun(job("items", "delta"), dal, home=str(home))
    attempt.schema()
    version = attempt.create(None)
    attempt.load()
    attempt.stop_beating()  # its process dies (its heartbeat with it)
    assert dal.describe(version).state == State.LOADING
    resumed = run_job(job("items", "delta"), dal, home=str(home), resume=version)
    full = run_job(job("items_full", "full"), dal, home=str(home))
    assert resumed.version == version and resumed.mode == "delta" and resumed.resumed
    assert (resumed.rows, resumed.digest) == (full.rows, full.digest)
    with pytest.raises(NamespaceStateError, match="cannot resume"):
        run_job(job("items", "delta"), dal, home=str(home), resume=version)


class _Killed(BaseException):
    """The run's process dying at this point."""


def _killed_after_the_version_is_made(client: KvClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next run dies after the DAL created its delta version, before it learns the copy of
    the base finished: the state a kill during a base's copy (or layering) leaves."""
    from bulldozer.versioning.run_state import BASE_COPIED_LABEL

    real = client.set_labels

    def dying(name: str, labels: dict[str, str]) -> Any:
        if BASE_COPIED_LABEL in labels:
            monkeypatch.setattr(client, "set_labels", real)
            raise _Killed
        return real(name, labels)

    monkeypatch.setattr(client, "set_labels", dying)


def test_a_delta_killed_while_its_base_was_copied_is_never_resumed_over_a_partial_base(
    tmp_path: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bulldozer.load.runner import run_stage

    home = tmp_path / "home"
    table = make_table(home)
    base = run_job(job("items", "delta"), dal, home=str(home))
    change(table, random.Random(7), "update", [10_000])
    # resumed by hand: refused, and the version failed, so nothing retries it
    _killed_after_the_version_is_made(dal, monkeypatch)
    with pytest.raises(_Killed):
        run_job(job("items", "delta"), dal, home=str(home))
    (killed,) = [v for v in dal.list_namespaces("items") if v.state == State.LOADING]
    with pytest.raises(NamespaceStateError, match=r"its copy of the base .* was interrupted"):
        run_job(job("items", "delta"), dal, home=str(home), resume=killed.name)
    assert dal.describe(killed.name).state == State.FAILED
    assert dal.get_alias("items").namespace == base.version
    # a scheduler's retried load stage (same run key): a new version, then verified and flipped
    _killed_after_the_version_is_made(dal, monkeypatch)
    with pytest.raises(_Killed):
        run_stage("load", job("items", "delta"), dal, run_key="day-2", home=str(home))
    for stage in ("load", "verify", "flip", "retention"):
        record = run_stage(stage, job("items", "delta"), dal, run_key="day-2", home=str(home))
    full = run_job(job("items_full", "full"), dal, home=str(home))
    assert record.mode == "delta" and not record.resumed
    assert (record.rows, record.digest) == (full.rows, full.digest)
    assert dal.get_alias("items").namespace == record.version
    assert contents(dal, record.version) == contents(dal, full.version)


@dataclass
class LayeredStore:
    """An embedded store behind a DAL on this machine: its engine and a client of the DAL."""

    engine: Any
    client: KvClient
    #: native: bulldozer-kvd in front, doing the engine's long jobs (layer merges,
    #: measurements); python: the Python DAL alone, which does them; fallback: kvd's jobs
    #: fail, so the engine does them itself
    plane: str

    def next_version(
        self,
        previous: str,
        expected: dict[bytes, bytes],
        gone: Iterable[bytes] = (),
        changed: dict[bytes, bytes] | None = None,
        forget_digest: bool = False,
    ) -> str:
        """A new verified version of alias "layers", live: made from ``previous`` (or, with
        none, holding ``expected``), the keys ``gone`` deleted and ``changed`` put, deleted
        first where ``expected`` holds them; ``expected`` becomes its contents. With
        ``forget_digest``, as if loaded before running digests: its seal measures it whole."""
        from bulldozer.codec.digest import digest_pairs
        from bulldozer.names import new_version_name

        name = new_version_name("layers")
        self.client.create_namespace(name, "layers", base=previous)
        if previous:
            gone, changed = list(gone), changed or {}
            self.client.delete(name, gone + [k for k in changed if k in expected])
            for key in gone:
                expected.pop(key, None)
            expected.update(changed)
            self.client.put(name, sorted(changed.items()))
        else:
            self.client.put(name, sorted(expected.items()))
        if forget_digest:
            with self.engine.env.begin(write=True) as txn:
                txn.delete(name.encode(), db=self.engine._digests)
        want = digest_pairs(sorted(expected.items()))
        sealed = self.client.seal(name, want.count, want.value)
        assert sealed.verified and (sealed.record_count, sealed.digest, sealed.bytes) == (
            want.count,
            want.value,
            want.bytes,
        )
        self.client.compare_and_set_alias("layers", previous or None, name)
        return name


@pytest.fixture(params=["native", "python", "fallback"])
def layered(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LayeredStore]:
    from bulldozer.kv.backends import create_engine
    from bulldozer.kv.server.app import create_server

    plane = request.param
    engine: Any = create_engine({"type": "embedded", "path": str(tmp_path / "kv"), "map_size": 1024**3})
    server, port = create_server("127.0.0.1:0", engine, data_plane="native" if plane == "native" else "python")
    client = KvClient(f"127.0.0.1:{port}")
    assert (engine._kvd_binary is not None) == (plane == "native")
    if plane == "fallback":
        engine.use_kvd(Path("/bin/false"))  # a kvd that fails every job
    try:
        yield LayeredStore(engine, client, plane)
    finally:
        client.close()
        server.stop(1)


def test_a_version_reading_through_a_dropped_base_keeps_it_until_it_goes(layered: LayeredStore) -> None:
    """Embedded layers: a base's data outlives its drop while a version reads through it,
    and goes with the last such version; a version made from a chain MAX_LAYERS deep reads
    through to a base further down, holding only what the layers above it changed, and
    merges a larger layer only once as much has stacked on it (size tiers). The layers are
    merged by bulldozer-kvd when it fronts the engine, else (or when it fails) by the engine
    itself: the same."""
    import lmdb

    from bulldozer.codec.digest import digest_pairs
    from bulldozer.kv.v1 import shared
    from bulldozer.names import new_version_name

    engine, client = layered.engine, layered.client
    deep = shared.STORE_MAX_LAYERS
    steps = 2 * deep + 2
    expected = {b"k%03d" % i: b"v0" for i in range(10 * steps)}
    expected.update({b"p%03d" % i: b"v0" for i in range(30 * steps)})  # a bottom the layers never outgrow here
    versions: list[str] = []
    contents: list[dict[bytes, bytes]] = []
    for step in range(steps):
        gone = [b"k%03d" % (step * 10 + i) for i in range(3)]
        new = {b"k%03d" % (step * 10 + i): b"v%d" % step for i in range(3, 6)}
        new[b"n%d" % step] = b"fresh"
        if step <= deep:  # what the first merge takes in outweighs the layers stacked on it later
            new.update({b"e%d_%d" % (step, i): b"extra" for i in range(3)})
        name = layered.next_version(versions[-1] if versions else "", expected, gone, new)
        versions.append(name)
        contents.append(dict(expected))
        keys = sorted(expected) + [b"k%03d" % (step * 10) for step in range(steps)]
        assert client.batch_get(keys, alias="layers")[1] == [expected.get(k) for k in keys]  # through Go
        assert dict(client.scan(alias="layers")) == expected
        assert len(engine._chain(name)) <= deep + 1
    assert len(engine._chain(versions[deep])) == deep + 1
    merged = versions[deep + 1]
    assert engine._chain(merged) == [merged, versions[0]]  # the layers above the bottom, merged
    with engine.env.begin() as txn:  # its own pairs: only what differs from the bottom
        own = {bytes(k): bytes(v) for k, v in txn.cursor(db=engine._db(merged))}
    assert own == {k: v for k, v in contents[deep + 1].items() if contents[0].get(k) != v}
    assert len(own) <= 7 * (deep + 1)
    # as deep again: the small ones merge, the larger merged one stays below
    assert len(engine._chain(versions[2 * deep])) == deep + 1
    live = versions[-1]
    assert engine._chain(live) == [live, merged, versions[0]]
    # drop every older version: the live one's chain keeps what it reads
    for name in versions[:-1]:
        client.drop(name)
    assert dict(client.scan(alias="layers")) == expected
    assert client.batch_get(sorted(expected), alias="layers")[1] == [expected[k] for k in sorted(expected)]
    with engine.env.begin() as txn:
        kept = {n for n in versions if txn.get(b"ns." + n.encode()) is not None}
    assert kept == {versions[0], merged, live}  # what the live one reads stays (zombies); the rest is gone
    # a new full version goes live; dropping the layered one frees its base too
    full = new_version_name("layers")
    client.create_namespace(full, "layers")
    client.put(full, [(b"x", b"y")])
    client.seal(full, 1, digest_pairs([(b"x", b"y")]).value)
    client.compare_and_set_alias("layers", live, full)
    client.drop(live)
    with engine.env.begin() as txn:
        assert {n for n in versions if txn.get(b"ns." + n.encode()) is not None} == set()
        assert list(txn.cursor(db=engine._layers)) == []
    with pytest.raises(lmdb.NotFoundError):
        engine.env.open_db(b"del." + live.encode(), create=False)


def test_a_chain_whose_layers_outgrow_its_bottom_is_compacted_flat(layered: LayeredStore) -> None:
    """Embedded layers: once the layers above a chain's bottom hold ``COMPACT_BOTTOM_AT``
    times the bottom's entries, the next version made from it merges the bottom in too: it
    is flat (no base, no tombstones), holds exactly what a read through the old chain saw,
    and the chains after it start from it, so dropping the older versions frees the old
    chain whole. By bulldozer-kvd when it fronts the engine, else by the engine: the same."""
    import lmdb

    from bulldozer.kv.backends import embedded

    engine, client = layered.engine, layered.client
    rng = random.Random(29)

    def above_and_bottom(chain: list[str]) -> tuple[int, int]:
        with engine.env.begin() as txn:
            bottom = txn.stat(engine._db(chain[-1]))["entries"]
            above = sum(txn.stat(engine._db(n))["entries"] + txn.stat(engine._tomb(n))["entries"] for n in chain[:-1])
        return above, bottom

    expected = {b"k%04d" % i: b"v0" for i in range(400)}
    versions: list[str] = []
    compacted: list[int] = []
    for step in range(80):
        base_chain = engine._chain(versions[-1]) if versions else []
        present = sorted(expected)
        gone = rng.sample(present, 8)
        changed = {k: b"v%d" % step for k in rng.sample(present, 12) if k not in gone}
        changed.update({b"n%03d-%d" % (step, i): b"fresh" for i in range(4)})
        name = layered.next_version(versions[-1] if versions else "", expected, gone, changed)
        versions.append(name)
        chain = engine._chain(name)
        if versions[1:] and chain == [name]:
            above, bottom = above_and_bottom(base_chain)
            assert above >= embedded.COMPACT_BOTTOM_AT * bottom, (above, bottom)  # only when due
            compacted.append(step)
            with pytest.raises(lmdb.NotFoundError):  # flat: no tombstones at all
                engine.env.open_db(b"del." + name.encode(), create=False)
            with engine.env.begin() as txn:  # its own pairs: the whole version, nothing else
                assert {bytes(k): bytes(v) for k, v in txn.cursor(db=engine._db(name))} == expected
        keys = sorted(expected) + [b"k%04d" % i for i in range(0, 400, 7)]
        assert client.batch_get(keys, alias="layers")[1] == [expected.get(k) for k in keys]  # through Go
        assert dict(client.scan(alias="layers")) == expected
        if len(compacted) == 2:
            break
    assert len(compacted) == 2, "the chain never outgrew its bottom"
    assert compacted[1] - compacted[0] > 4  # a new chain starts from the flat version
    live = versions[-1]
    for name in versions[:-1]:
        client.drop(name)
    with engine.env.begin() as txn:
        kept = {n for n in versions if txn.get(b"ns." + n.encode()) is not None}
    assert kept == {live}  # the old chains went with their versions
    assert dict(client.scan(alias="layers")) == expected


def test_a_seal_without_an_exact_running_digest_measures_through_the_layers(
    layered: LayeredStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Embedded: a layered version whose running digest is unknown (here: forgotten) is
    measured whole at its seal, through its layers: by bulldozer-kvd when it fronts the
    engine (the engine's own reading is then never used), else (or when it fails) by the
    engine itself: the same count, digest and bytes."""
    engine = layered.engine
    read_here = 0
    iterate = engine.iterate

    def counted(name: str, chunk: int = 50_000) -> Iterator[list[tuple[bytes, bytes]]]:
        nonlocal read_here
        read_here += 1
        return iterate(name, chunk)

    monkeypatch.setattr(engine, "iterate", counted)
    expected = {b"k%04d" % i: b"v0" for i in range(3000)}
    previous = ""
    for step in range(3):  # a bottom and two layers, each deleting and changing keys
        gone = [b"k%04d" % i for i in range(step, 3000, 7)]
        changed = {b"k%04d" % i: b"v%d" % step for i in range(step, 3000, 5)} | {b"new%d" % step: b"x"}
        previous = layered.next_version(previous, expected, gone, changed, forget_digest=True)
    assert len(engine._chain(previous)) == 3
    assert read_here == (0 if layered.plane == "native" else 3)


def test_a_kvd_job_whose_dal_is_gone_does_nothing(tmp_path: Path) -> None:
    """bulldozer-kvd's jobs for the embedded engine (a layer merge, a measurement) end with
    the DAL that started them: a job whose parent is not that DAL exits at once, without
    writing or printing a result (a merge's write transaction, should its DAL die midway,
    commits nothing)."""
    import subprocess

    from bulldozer.kv.backends import create_engine
    from bulldozer.kv.server.native import kvd_binary
    from bulldozer.kv.types import NamespaceRecord

    binary = kvd_binary()
    assert binary is not None, "bulldozer-kvd is built by scripts/build_native.sh"
    engine: Any = create_engine({"type": "embedded", "path": str(tmp_path / "kv"), "map_size": 1024**3})
    try:
        engine.create_namespace(NamespaceRecord(name="m__v1", alias="m"))
        engine.write_batch("m__v1", [b"k"], [b"v"])
        engine.ingest("m__v1")
        engine.create_namespace(NamespaceRecord(name="m__v2", alias="m"))
        someone_else = subprocess.Popen(["sleep", "30"])
        try:
            for job in (["--measure=m__v1"], ["--merge-into=m__v2", "--merge-layers=m__v1"]):
                done = subprocess.run(
                    [str(binary), *engine.config.kvd_arguments(), f"--parent-pid={someone_else.pid}", *job],
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                )
                assert done.returncode == 1 and done.stdout == "", (job, done.stdout, done.stderr)
                assert "the parent process is gone" in done.stderr
        finally:
            someone_else.kill()
            someone_else.wait()
        with engine.env.begin() as txn:
            assert txn.stat(engine._db("m__v2"))["entries"] == 0  # nothing merged
        # with its DAL as the parent, the same job runs
        engine.use_kvd(binary)
        assert engine.measure("m__v1").count == 1
    finally:
        engine.close()


@pytest.mark.parametrize("stage", ["load", "verify", "flip"])
def test_a_delta_run_killed_at_a_stage_leaves_the_alias_and_is_finished(tmp_path: Path, stage: str) -> None:
    """A real SIGKILL of ``bulldozer run`` as a delta's stage starts (the layer or copy made,
    the changes applied, the version sealed): the alias stays on the complete version it
    pointed at, and the delta is finished (resumed, or run again) to a full run's digest."""
    import json
    import time

    from tests.integration.test_run import _cli, _dal_processes

    home = tmp_path / "h"
    table = make_table(home)
    spec, full_spec = home / "delta.yaml", home / "full.yaml"
    spec.write_text(job("items", "delta").text)
    full_spec.write_text(job("items_full", "full").text)
    first = json.loads(_cli(["run", str(spec), "--json"], home).stdout)
    change(table, random.Random(9), "update", [10_000])
    change(table, random.Random(10), "delete", [10_000])
    killed = _cli(["run", str(spec), "-q"], home, fault=f"kill-at:{stage}")
    assert killed.returncode == -9, killed.stderr
    deadline = time.monotonic() + 15
    while _dal_processes(home / "kv") and time.monotonic() < deadline:
        time.sleep(0.2)
    alias = json.loads(_cli(["alias", "show", "items", "--json"], home).stdout)
    assert alias["namespace"] == first["version"]  # never a partial version
    runs = json.loads(_cli(["runs", "items", "--json"], home).stdout)
    (left,) = [r for r in runs if r["version"] != first["version"]]
    if stage == "flip":
        assert left["state"] == "SEALED"  # verified, never flipped: a new run supersedes it
        finished = _cli(["run", str(spec), "--json"], home)
    else:
        assert left["state"] == "LOADING"
        finished = _cli(["run", str(spec), "--resume", left["version"], "--json"], home)
    assert finished.returncode == 0, finished.stderr
    record = json.loads(finished.stdout)
    full = json.loads(_cli(["run", str(full_spec), "--json"], home).stdout)
    assert record["mode"] == "delta" and (record["rows"], record["digest"]) == (full["rows"], full["digest"])
    assert json.loads(_cli(["alias", "show", "items", "--json"], home).stdout)["namespace"] == record["version"]


def test_a_delta_replaces_text_an_older_release_stored_that_a_run_now_refuses(
    kv: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The base was loaded before runs refused text that is not UTF-8; the table's owner
    then fixed those rows. The delta reads the removed file to subtract the base's records
    from its digest: it must encode them as the base stored them, not refuse them (the run
    that replaces them failed with `column 'name' holds text that is not UTF-8`)."""
    import numpy as np
    import pyarrow.parquet as pq
    from pyiceberg.expressions import In

    from bulldozer.load.encoder import encode

    home = tmp_path / "home"
    table = make_table(home, files=2)
    raw = [b"caf\xe9", b"ok", b"na\xefve"]  # Latin-1
    offsets = np.cumsum([0, *map(len, raw)], dtype=np.int32)
    names = pa.Array.from_buffers(pa.string(), 3, [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(raw))])
    bad = pa.table({"id": pa.array([900, 901, 902], pa.int64()), "name": names, "score": [0.1, 0.2, 0.3]})
    written = Path(table.location().removeprefix("file://")) / "data" / "latin1.parquet"
    pq.write_table(bad.cast(SCHEMA), written, write_statistics=False)  # pyiceberg's statistics would decode it
    table.add_files([str(written)])
    delta_alias, full_alias = kv.alias(), kv.alias()
    with monkeypatch.context() as older_release:
        older_release.setattr(encode, "_require_text", lambda arr, column: None)
        assert run_job(job(delta_alias, "delta"), kv.client, home=str(home)).mode == "full"
    table.delete(In("id", [900, 901, 902]))  # the whole file: nothing rewritten
    table.append(pa.table({"id": [900, 901, 902], "name": ["café", "ok", "naïve"], "score": [0.1, 0.2, 0.3]}, SCHEMA))
    delta = run_job(job(delta_alias, "delta"), kv.client, home=str(home))
    full = run_job(job(full_alias, "full"), kv.client, home=str(home))
    assert delta.mode == "delta", delta.full_reason
    assert (delta.delta["changed"], delta.delta["added"], delta.delta["deleted"]) == (2, 0, 0)
    assert (delta.rows, delta.digest) == (full.rows, full.digest)
    assert contents(kv.client, delta.version) == contents(kv.client, full.version)
