"""The ``bulldozer`` Spark data source (``df.write.format("bulldozer")``) and its writer, the
one Spark write path: a DataFrame becomes a verified, flipped version; ``bulldozer run
--engine spark`` writes with it in ``write.partitions`` tasks, fed the table's file splits
or (fewer splits than tasks) Spark's read of the table by key; bad DataFrames are refused
with the error a user can act on, and a failed write never moves the alias.

One Spark session (``local[2,2]``: two cores, a failed task is tried twice) is shared by
the module; its Python workers — those that run the data source's driver side too — get
``BULLDOZER_HOME`` on the module's warehouse (``spark.executorEnv``)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bulldozer.errors import AliasNotFoundError, DuplicateKeyError, LoadError, SchemaError, SourceDataError, SpecError
from bulldozer.kv import KvClient
from bulldozer.kv.types import State
from bulldozer.load.runner import run_job
from bulldozer.spec import load_spec_text
from bulldozer.spec.models import CatalogConfig
from bulldozer.versioning.run_state import ledger_of, run_record_of
from bulldozer.warehouse.catalog import open_catalog
from bulldozer.warehouse.sample import create_sample_warehouse
from tests.conftest import REPO
from tests.integration.kv_fixtures import only_refusals

pytest.importorskip("pyspark", reason="the spark extra is part of the default install (scripts/bootstrap.sh)")
pytestmark = [pytest.mark.integration, pytest.mark.spark]
TEMPLATE = (REPO / "templates" / "move_data_to_kv_dal.yaml").read_text()
TABLE = "lake.sample.user_item_scores"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spark-ds")
    create_sample_warehouse(path, rows=3_000, chunk_rows=1_000)
    return path


@pytest.fixture(scope="module")
def spark(home: Path) -> Iterator[Any]:
    from bulldozer.load.engines.spark import spark_session, stop_spark_session
    from bulldozer.load.engines.spark.datasource import register

    # the data source's driver side runs in Python workers with the session's executor
    # environment: the embedded catalog it reads field numbers from is this module's
    # its specs name this module's DALs on loopback, which the operator lets specs name
    env = {"spark.executorEnv.BULLDOZER_HOME": str(home), "spark.executorEnv.BULLDOZER_SPEC_ENDPOINTS": "127.0.0.1:*"}
    session = spark_session("lake", None, str(home), "local[2,2]", env)
    register(session)
    yield session
    stop_spark_session()


def _spec_file(tmp_path: Path, dal: KvClient, **replace: str) -> Path:
    text = TEMPLATE.replace(
        "  # endpoint: dal.example.com:7110  # default: --endpoint, $BULLDOZER_ENDPOINT, the profile's, else embedded",
        f"  endpoint: {dal.target}",
    )
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def _write(frame: Any, **options: str) -> None:
    from bulldozer.load.engines.spark.datasource import worker_error

    writer = frame.write.format("bulldozer").mode("overwrite")
    for key, value in options.items():
        writer = writer.option(key, value)
    try:
        writer.save()
    except Exception as exc:
        raise worker_error(exc) from None


def _live(dal: KvClient, alias: str) -> str | None:
    """The version ``alias`` points at; None when it points nowhere yet."""
    try:
        return dal.get_alias(alias).namespace
    except AliasNotFoundError:
        return None


def test_a_dataframe_becomes_the_live_version_byte_identical_to_the_local_engine(
    spark: Any, home: Path, dal: KvClient, tmp_path: Path
) -> None:
    spec = _spec_file(tmp_path, dal)
    frame = spark.read.table(TABLE).repartition(3)
    _write(frame, spec=str(spec))
    written = dal.get_alias("user_item_scores").namespace
    info = dal.describe(written)
    record = run_record_of(info)
    assert info.state == State.ACTIVE and info.record_count == 3_000
    assert record is not None and record.outcome == "succeeded" and record.engine == "spark"
    assert [g["gate"] for g in record.gates] == ["min_rows", "max_row_count_change", "max_null_fraction[nickname]"]
    local = run_job(load_spec_text(spec.read_text(), "job.yaml", env={}), dal, engine="local", home=str(home))
    assert dal.describe(local.version).digest == info.digest  # the same records, byte for byte


def test_the_driver_jvm_compiles_with_c2_later(spark: Any) -> None:
    """The driver JVM took ``session.C2_LATER``: each Tier4 threshold as the JVM itself reports
    it (HotSpot's diagnostic bean), not as the options were written."""
    from bulldozer.load.engines.spark.session import C2_LATER

    jvm = spark.sparkContext._jvm
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    asked = dict(option.removeprefix("-XX:").split("=") for option in C2_LATER)
    assert len(asked) == 4
    assert {name: bean.getVMOption(name).getValue() for name in asked} == asked


def test_the_workers_import_pyspark_with_bytecode_not_from_spark_s_zip(spark: Any) -> None:
    """Spark puts its ``pyspark.zip`` and py4j's first on its Python workers' path, which
    Python imports by compiling their sources at every start; the daemon replaces them with
    the folders they are unpacked and compiled in, in the user's cache (``node_cache``)."""
    from bulldozer.settings import load_settings

    def where_pyspark_is(_: Any) -> tuple[str, str, bool]:  # pickled by value: the test module stays here
        """In a Python worker: the files pyspark and py4j were imported from, and whether
        the bytecode of ``pyspark.worker`` was there to import."""
        import importlib.util
        import os

        import py4j
        import pyspark
        import pyspark.worker

        cached = importlib.util.cache_from_source(pyspark.worker.__file__ or "")
        return pyspark.__file__ or "", py4j.__file__ or "", os.path.isfile(cached)

    found = spark.sparkContext.parallelize(range(2), 2).map(where_pyspark_is).collect()
    cache = load_settings().cache_folder() / "spark-python"
    for pyspark_file, py4j_file, compiled in found:
        assert Path(pyspark_file).is_relative_to(cache) and Path(py4j_file).is_relative_to(cache)
        assert ".zip" not in pyspark_file and compiled


def test_options_name_the_job_without_a_spec(spark: Any, dal: KvClient) -> None:
    frame = spark.createDataFrame([(i, f"name-{i}", i * 0.5) for i in range(500)], "id long, name string, score double")
    _write(frame, alias="by_options", key_columns="id", endpoint=dal.target, min_rows="10")
    info = dal.describe(dal.get_alias("by_options").namespace)
    assert info.record_count == 500 and info.state == State.ACTIVE
    # the gates come from the options: 500 rows fail min_rows=1000, and the alias stays
    with pytest.raises(Exception, match="min_rows"):
        _write(frame, alias="by_options", key_columns="id", endpoint=dal.target, min_rows="1000")
    assert dal.get_alias("by_options").namespace == info.name
    newest = dal.list_namespaces("by_options")[-1]
    assert newest.state == State.FAILED and "min_rows" in newest.failure_reason


def test_computed_nested_columns_are_stored_and_read_back(spark: Any, dal: KvClient) -> None:
    """A DataFrame's own struct, list and map columns (no table behind them) get field
    numbers derived from their paths, and read back as written."""
    from bulldozer.cli.common import open_version
    from bulldozer.schema.decode import message_to_json

    frame = spark.sql(
        "SELECT id, named_struct('x', id * 1.5D, 'tag', concat('t', id)) AS point, array(id, id + 1) AS near, "
        "map('double', id * 2) AS calc FROM range(20)"
    )
    _write(frame, alias="nested_frame", key_columns="id", endpoint=dal.target, min_rows="1")
    alias, name, _info, key_cls, value_cls = open_version(dal, "nested_frame")
    records = {
        message_to_json(key_cls.FromString(k))["id"]: message_to_json(value_cls.FromString(v))
        for k, v in dal.scan(alias=f"{alias}@{name}", limit=100)
    }
    assert len(records) == 20
    # (int64 as JSON strings, lists and maps in their wrapper messages: protobuf's JSON mapping)
    assert records["7"] == {
        "point": {"x": 10.5, "tag": "t7"},
        "near": {"values": ["7", "8"]},
        "calc": {"entries": {"double": "14"}},
    }


@pytest.mark.parametrize(
    ("columns", "keys", "error", "message"),
    [
        ("id long, v string", "missing", SchemaError, "missing"),
        ("id double, v string", "id", SchemaError, "key column 'id'"),
        ("id struct<a:int>, v string", "id", SchemaError, "key column 'id'"),
    ],
    ids=["missing-key", "float-key", "struct-key"],
)
def test_a_key_that_cannot_be_a_key_is_refused_before_a_version_exists(
    spark: Any, dal: KvClient, columns: str, keys: str, error: type[Exception], message: str
) -> None:
    first = "(1, 'a')" if "struct" not in columns else "(named_struct('a', 1), 'a')"
    frame = spark.sql(f"SELECT * FROM VALUES {first} AS t(id, v)").selectExpr(
        *[f"CAST({c.split()[0]} AS {c.split(' ', 1)[1]}) AS {c.split()[0]}" for c in columns.split(", ")]
    )
    with pytest.raises(error, match=message):
        _write(frame, alias="bad_keys", key_columns=keys, endpoint=dal.target)
    [refused] = only_refusals(dal, "bad_keys")  # no data version; the refusal is kept with its reason
    assert message in refused.failure_reason


def test_duplicate_and_null_keys_fail_the_version_and_keep_the_alias(spark: Any, dal: KvClient) -> None:
    good = spark.createDataFrame([(i, "v") for i in range(100)], "id long, v string")
    _write(good, alias="dups", key_columns="id", endpoint=dal.target, min_rows="1")
    live = dal.get_alias("dups").namespace
    in_one_task = spark.createDataFrame([(i % 50, "v") for i in range(100)], "id long, v string").coalesce(1)
    with pytest.raises(DuplicateKeyError, match=r'sharing a key, e\.g\. \{"id": '):
        _write(in_one_task, alias="dups", key_columns="id", endpoint=dal.target, min_rows="1")
    # rows 0-49 in one task, 50-99 in the other: every key once in each
    across = (
        spark.createDataFrame([(i, i % 50, str(i)) for i in range(100)], "n long, id long, v string")
        .repartitionByRange(2, "n")
        .drop("n")
    )
    with pytest.raises(DuplicateKeyError, match="another partition"):
        _write(across, alias="dups", key_columns="id", endpoint=dal.target, min_rows="1")
    nulls = spark.createDataFrame([(None, "v"), (1, "w")], "id long, v string")
    with pytest.raises(SourceDataError, match="null"):
        _write(nulls, alias="dups", key_columns="id", endpoint=dal.target, min_rows="1")
    assert dal.get_alias("dups").namespace == live
    failed = [ns for ns in dal.list_namespaces("dups") if ns.name != live]
    assert len(failed) == 3 and all(ns.state == State.FAILED for ns in failed)


def test_a_killed_python_worker_is_retried_and_counted_once(spark: Any, dal: KvClient) -> None:
    """The first attempt of partition 1 dies mid-write (its Python worker exits); Spark
    retries it, and the digest check counts the retried partition's rows once."""
    from pyspark.sql.functions import col, udf

    @udf("long", useArrow=False)  # type: ignore[misc]  # (no inference from the hints: they are strings here)
    def die_once(value: int) -> int:
        from pyspark import TaskContext

        context = TaskContext.get()
        if value == 700 and context is not None and context.attemptNumber() == 0:
            os._exit(1)
        return value

    frame = spark.range(0, 1_000, numPartitions=2).select(die_once(col("id")).alias("id"), (col("id") * 2).alias("v"))
    _write(frame, alias="retried", key_columns="id", endpoint=dal.target, min_rows="1")
    info = dal.describe(dal.get_alias("retried").namespace)
    assert info.record_count == 1_000 and info.state == State.ACTIVE


def test_a_write_that_fails_for_good_marks_the_version_failed(spark: Any, dal: KvClient) -> None:
    from pyspark.sql.functions import col, udf

    @udf("long", useArrow=False)  # type: ignore[misc]  # (no inference from the hints: they are strings here)
    def always_die(value: int) -> int:
        if value == 700:
            os._exit(1)
        return value

    good = spark.range(0, 10).select(col("id"), col("id").alias("v"))
    _write(good, alias="killed", key_columns="id", endpoint=dal.target, min_rows="1")
    live = dal.get_alias("killed").namespace
    frame = spark.range(0, 1_000, numPartitions=2).select(always_die(col("id")).alias("id"), col("id").alias("v"))
    with pytest.raises(LoadError) as raised:  # the worker crashed: Spark's error, in one line
        _write(frame, alias="killed", key_columns="id", endpoint=dal.target, min_rows="1")
    assert str(raised.value).startswith("the Spark job failed (Task ") and "\n" not in str(raised.value)
    assert "): Python worker exited unexpectedly (crashed)" in str(raised.value)
    assert dal.get_alias("killed").namespace == live
    newest = dal.list_namespaces("killed")[-1]
    assert newest.name != live and newest.state == State.FAILED


def test_a_task_s_own_python_error_is_one_line_naming_it() -> None:
    """A Python worker's exception that is not Bulldozer's (here: a task function the
    worker's Bulldozer does not have) fails the run with Spark's summary and the exception's
    line, not Py4J's page of two stack traces."""
    from bulldozer.load.engines.spark.datasource import worker_error

    text = (
        "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 0.0 failed 1 times, "
        "most recent failure: Lost task 1.0 in stage 0.0 (TID 1) (192.0.2.2 executor driver): "
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/venv/pyspark/worker.py", line 3361, in main\n'
        "    func, profiler, deserializer, serializer = read_command(pickleSer, infile)\n"
        "AttributeError: Can't get attribute '_no_rows' on <module 'bulldozer.load.engines.spark'>\n"
        "\n\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:645)\n"
        "Caused by: org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
    )
    error = worker_error(RuntimeError(text))
    assert isinstance(error, LoadError) and str(error) == (
        "the Spark job failed (Task 1 in stage 0.0 failed 1 times): "
        "AttributeError: Can't get attribute '_no_rows' on <module 'bulldozer.load.engines.spark'>"
    )
    other = RuntimeError("the JVM went away")  # not a failed job: left as it is
    assert worker_error(other) is other


def test_a_java_exception_of_the_driver_is_one_line_with_its_root_cause(spark: Any) -> None:
    """Spark's driver raised it (here: Hadoop has no file system for ``s3:``, as the by-key
    path met on an S3 table without Iceberg's S3 client): the run said ``run failed:
    Py4JJavaError: An error occurred …`` with both Java stack traces on one 20 KB line."""
    from py4j.protocol import Py4JJavaError

    from bulldozer.load.engines.spark.datasource import worker_error

    jvm = spark.sparkContext._jvm
    with pytest.raises(Py4JJavaError) as raised:
        jvm.org.apache.iceberg.hadoop.Util.getFs(
            jvm.org.apache.hadoop.fs.Path("s3://lake/t"), spark._jsc.hadoopConfiguration()
        )
    error = worker_error(raised.value)
    assert isinstance(error, LoadError) and str(error) == (
        "the Spark job failed: RuntimeIOException: Failed to get file system for path: s3://lake/t "
        '(its cause: UnsupportedFileSystemException: No FileSystem for scheme "s3")'
    )


@pytest.mark.parametrize(
    ("mode", "options", "message"),
    [
        ("append", {"alias": "x", "key_columns": "id"}, "overwrite"),
        ("overwrite", {"alias": "x", "key_columns": "id", "batch": "9"}, "unknown option"),
        ("overwrite", {"alias": "x"}, "key_columns"),
        ("overwrite", {"alias": "x", "key_columns": "id", "endpoint": "embedded"}, "executors reach"),
        ("overwrite", {"alias": "x", "key_columns": "id", "endpoint": "127.0.0.1:1", "table": "sample.nope"}, "nope"),
    ],
    ids=["append", "unknown-option", "no-keys", "embedded", "unknown-table"],
)
def test_options_are_applied_or_refused(spark: Any, mode: str, options: dict[str, str], message: str) -> None:
    from bulldozer.load.engines.spark.datasource import worker_error

    frame = spark.createDataFrame([(1, "a")], "id long, v string")
    writer = frame.write.format("bulldozer").mode(mode)
    for key, value in options.items():
        writer = writer.option(key, value)
    with pytest.raises(Exception, match=message) as raised:
        try:
            writer.save()
        except Exception as exc:
            raise worker_error(exc) from None
    assert "Traceback" not in str(raised.value)


def test_spec_fields_a_dataframe_write_cannot_apply_are_refused_by_name(
    spark: Any, dal: KvClient, tmp_path: Path
) -> None:
    spec = _spec_file(
        tmp_path,
        dal,
        **{
            "  duplicate_keys: fail": "  duplicate_keys: fail\n  filter: score > 0\n  ref: audit",
            "    in_flight_batches: 4 ": "    records_per_second: 1000\n    in_flight_batches: 4 ",
        },
    )
    frame = spark.read.table(TABLE)
    before = dal.list_namespaces("user_item_scores")
    with pytest.raises(SpecError) as raised:
        _write(frame, spec=str(spec))
    text = str(raised.value)
    assert "data_movement.filter" in text and "key_value_dal.write.records_per_second" in text
    assert "data_movement.ref: a DataFrame write does not read the table: read the table at that branch" in text
    assert dal.list_namespaces("user_item_scores") == before  # refused before a version existed
    # a spec file's endpoint is the spec's: only a DAL the operator configured (an option's is the program's)
    elsewhere = _spec_file(tmp_path, dal, **{f"  endpoint: {dal.target}": "  endpoint: dal.example.com:7110"})
    with pytest.raises(SpecError, match=r"key_value_dal\.endpoint: a spec may name only a DAL the operator configured"):
        _write(frame, spec=str(elsewhere))


@pytest.mark.parametrize(("partitions", "reads_splits"), [(3, True), (4, False)])
def test_the_engine_writes_in_the_spec_s_partitions(
    spark: Any, home: Path, dal: KvClient, partitions: int, reads_splits: bool
) -> None:
    """As many write tasks as ``write.partitions`` says: fed the table's three files when
    there are enough of them, else Spark's read of the table spread over them by key."""
    from bulldozer.load.engines.spark import SparkEngine

    text = TEMPLATE.replace("    in_flight_batches: 4 ", f"    partitions: {partitions}\n    in_flight_batches: 4 ")
    engine = SparkEngine()
    record = run_job(load_spec_text(text, "job.yaml", env={}), dal, engine=engine, home=str(home))
    assert engine.shared_keys_unchecked is reads_splits  # split reads: tasks do not share keys
    ledger = ledger_of(dal.describe(record.version))
    assert len(ledger) == partitions and sum(v[0] for v in ledger.values()) == 3_000
    assert all(v[0] for v in ledger.values())  # every task wrote rows
    local = run_job(load_spec_text(TEMPLATE, "job.yaml", env={}), dal, engine="local", home=str(home))
    assert dal.describe(local.version).digest == dal.describe(record.version).digest
    assert record.engine_start > 0 and local.engine_start == 0
    from bulldozer.load.plan import plan_run

    # plan estimates Spark from this Spark run, the local engine from its own
    assert plan_run(load_spec_text(text, "job.yaml", env={}), dal, str(home), "spark").rate_source == (
        f"measured by spark run {record.run_id}"
    )
    with pytest.raises(Exception, match=r"write\.partitions"):
        run_job(load_spec_text(text, "job.yaml", env={}), dal, engine="local", home=str(home))


@pytest.mark.parametrize("partitions", [4, 5])
def test_duplicate_keys_in_the_table_are_named_by_the_engine(
    spark: Any, home: Path, dal: KvClient, partitions: int
) -> None:
    """Rows sharing a key in different files: with one task per file (4: split reads) the
    tasks cannot see each other's keys, the seal counts fewer records than were sent and the
    run names the keys; spread by key (5) they meet in one task, which names them."""
    table = open_catalog(CatalogConfig(), home).load_table("sample.user_item_scores")
    rows = table.scan().to_arrow().slice(0, 5)
    table.append(rows)  # five keys now appear twice, in different files (four files)
    live = _live(dal, "user_item_scores")
    text = TEMPLATE.replace("    in_flight_batches: 4 ", f"    partitions: {partitions}\n    in_flight_batches: 4 ")
    try:
        with pytest.raises(DuplicateKeyError, match=re.escape('sharing a key, e.g. {"user_id": ')) as raised:
            run_job(load_spec_text(text, "job.yaml", env={}), dal, engine="spark", home=str(home))
        named = rows.column("user_id").to_pylist()
        assert any(f'"user_id": {key}' in str(raised.value) for key in named), raised.value
        versions = dal.list_namespaces("user_item_scores")
        assert max(versions, key=lambda ns: ns.created).state == State.FAILED
        assert _live(dal, "user_item_scores") == live
    finally:
        table.overwrite(table.scan(snapshot_id=table.history()[-2].snapshot_id).to_arrow())


def test_spark_finds_the_source_by_name_where_bulldozer_is_installed(dal: KvClient, tmp_path: Path) -> None:
    """A user's own session, no ``register``: Spark looks up ``pyspark_*`` modules and
    finds ``pyspark_bulldozer`` (here on ``PYTHONPATH``, as an installed package is)."""
    import subprocess
    import sys

    script = (
        "from pyspark.sql import SparkSession\n"
        "spark = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate()\n"
        "frame = spark.createDataFrame([(i, f'v{i}') for i in range(10)], 'id long, v string')\n"
        "frame.write.format('bulldozer').mode('overwrite').option('alias', 'found')"
        f".option('key_columns', 'id').option('endpoint', '{dal.target}').option('min_rows', '1').save()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert dal.describe(dal.get_alias("found").namespace).record_count == 10


@pytest.mark.parametrize("endpoint", ["localhost:70o0", "dal.example:99999"])
def test_a_malformed_endpoint_is_refused_at_once(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's BULLDOZER_ENDPOINT, or the program's ``endpoint`` option, that no DAL can
    be dialled at is one line before anything is written, not a 60 s wait on a channel."""
    import time

    from bulldozer.errors import InvalidArgumentError
    from bulldozer.load.engines.spark.datasource import _job_writer

    monkeypatch.setenv("BULLDOZER_ENDPOINT", endpoint)
    began = time.monotonic()
    with pytest.raises(InvalidArgumentError, match="is not a DAL endpoint: give embedded or HOST:PORT"):
        _job_writer({"alias": "typo", "key_columns": "id"}, None)
    monkeypatch.delenv("BULLDOZER_ENDPOINT")
    if endpoint.endswith("99999"):  # the spec's pattern takes it; no port has that number
        with pytest.raises(InvalidArgumentError, match="a port from 1 to 65535"):
            _job_writer({"alias": "typo", "key_columns": "id", "endpoint": endpoint}, None)
    assert time.monotonic() - began < 10
