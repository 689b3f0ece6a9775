"""The Spark engine on a real standalone cluster: a master and a worker started by
``scripts/services/spark.sh`` on loopback (one per test session), whose executors run in
the worker's JVM and Python workers — outside this process's tree, with a clean
environment: no virtualenv, no ``BULLDOZER_*``. Bulldozer reaches them only through the
archive ``bulldozer spark package`` builds (``BULLDOZER_SPARK_ARCHIVE``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from bulldozer.kv import KvClient
from bulldozer.load.engines.spark import SparkEngine, stop_spark_session
from bulldozer.load.engines.spark.package import MANIFEST
from bulldozer.load.runner import run_job
from bulldozer.spec import load_spec_text
from tests.conftest import REPO
from tests.integration import services
from tests.integration.test_run_spark import TEMPLATE, home

pytestmark = [pytest.mark.integration, pytest.mark.spark]
__all__ = ["home"]  # test_run_spark's module warehouse: 3,000 rows in three files, the session stopped after it


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The executors' environment, built by the CLI as a user would."""
    output = tmp_path_factory.mktemp("spark-env") / "bulldozer-env.zip"
    done = subprocess.run(
        [sys.executable, "-m", "bulldozer.cli.main", "spark", "package", "--no-compress", "--json", "-o", str(output)],
        capture_output=True,
        text=True,
        check=True,
    )
    summary = json.loads(done.stdout)
    assert Path(summary["archive"]) == output.resolve() and output.stat().st_size == summary["archive_bytes"]
    names = {d.split("==")[0].lower() for d in summary["distributions"]}
    assert {"bulldozer", "pyarrow", "grpcio", "protobuf", "pandas"} <= names and "pyspark" not in names
    return output


def test_a_job_on_a_standalone_cluster_stores_what_the_local_engine_stores(
    home: Path, archive: Path, dal: KvClient
) -> None:
    from bulldozer.load.engines.spark.package import archive_conf

    master = services.spark_master()
    spec = load_spec_text(
        TEMPLATE.replace("    in_flight_batches: 4 ", "    partitions: 4\n    in_flight_batches: 4 "),
        "job.yaml",
        env={},
    )
    engine = SparkEngine(master=master, conf=archive_conf(archive))
    on_cluster = run_job(spec, dal, engine=engine, home=str(home))
    assert on_cluster.outcome == "succeeded" and on_cluster.rows == 3_000 and on_cluster.engine == "spark"
    assert not engine.shared_keys_unchecked  # four tasks, three files: Spark read the table, by key
    # without write.partitions the worker's two cores take the three files: the executors'
    # tasks read them themselves
    split_reads = run_job(load_spec_text(TEMPLATE, "job.yaml", env={}), dal, engine=engine, home=str(home))
    assert engine.shared_keys_unchecked and split_reads.rows == 3_000
    assert dal.describe(split_reads.version).digest == dal.describe(on_cluster.version).digest
    # the tasks ran on the worker's executor, not in this driver (local mode's executor id is "driver")
    from bulldozer.load.engines.spark.session import spark_session

    session = spark_session("lake", None, str(home), master, archive_conf(archive))
    executors = session.sparkContext._jsc.sc().getExecutorMemoryStatus().size()  # driver + the worker's
    assert session.sparkContext.master == master and executors >= 2
    # the executors' Python workers import Bulldozer from the shipped environment, not from
    # this checkout or its virtualenv: unpacked once into the worker's user's cache (the
    # launcher's, package.launcher_archive), which every application's executors share
    with zipfile.ZipFile(archive) as packed:
        ident = json.loads(packed.read(MANIFEST))["id"]
    where = session.sparkContext.parallelize(range(4), 4).map(lambda _: __import__("bulldozer").__file__).collect()
    shared = f"/.cache/bulldozer/spark-env/{ident}/lib/"
    assert all(shared in path and not path.startswith(str(REPO)) for path in where), where
    # and pyspark from the worker's pyspark.zip unpacked and compiled in that cache, not
    # compiled from the zip at each start (node_cache.unzipped_spark_path)
    pyspark_files = (
        session.sparkContext.parallelize(range(2), 2).map(lambda _: __import__("pyspark").__file__).collect()
    )
    assert all("/.cache/bulldozer/spark-python/" in path for path in pyspark_files), pyspark_files
    # the executor JVMs start with the driver's later C2 (session.C2_LATER): each task reads
    # the command line of the JVM its Python worker descends from
    from bulldozer.load.engines.spark.session import C2_LATER

    def tier4_flags(_: object) -> list[str]:  # in a task (defined here: shipped by value)
        import os

        pid = os.getppid()
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            if args[0].endswith(b"java"):
                return [arg.decode() for arg in args if arg.startswith(b"-XX:Tier4")]
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        return []

    flags = session.sparkContext.parallelize(range(2), 2).map(tier4_flags).collect()
    assert flags == [list(C2_LATER)] * 2, flags
    try:
        # while this session holds the worker's cores, another application's run gets no
        # executor: it fails in one line instead of waiting for ever
        _a_run_no_executor_takes_fails_in_one_line(home, dal, master)
    finally:
        stop_spark_session()  # its executors hold the worker's cores until it stops
    local_spec = load_spec_text(TEMPLATE, "job.yaml", env={})
    local = run_job(local_spec, dal, engine="local", home=str(home))
    assert dal.describe(local.version).digest == dal.describe(on_cluster.version).digest  # byte for byte


def test_a_cluster_s_executors_get_iceberg_s_jars_with_spark_sql_alone(home: Path, archive: Path) -> None:
    """The split reads' tasks run Python alone: the executors fetch the packages' jars (133 MB)
    only once Spark SQL starts on the context (the by-key path: Iceberg's reader), and
    Bulldozer's jar never (the driver's class path has them all: session._sql_jars)."""
    from bulldozer.load.engines.spark import session
    from bulldozer.load.engines.spark.catalog import JAVA_JAR
    from bulldozer.load.engines.spark.package import archive_conf

    master, conf = services.spark_master(), archive_conf(archive)
    stop_spark_session()
    if "spark.jars.packages" in session._packages():  # the first start here resolves them into spark.jars
        session.spark_context("lake", None, str(home), master, conf)
        stop_spark_session()
    try:
        context = session.spark_context("lake", None, str(home), master, conf)
        driver = context.getConf().get("spark.driver.extraClassPath", "")
        assert "iceberg-spark-runtime" in driver and (str(JAVA_JAR) in driver or not JAVA_JAR.is_file())

        def shipped() -> list[str]:
            return [jar for jar in context._jsc.sc().listJars().mkString("\n").split("\n") if jar]

        assert shipped() == []
        spark = session.spark_session("lake", None, str(home), master, conf)
        jars = shipped()
        assert any("iceberg-spark-runtime" in jar for jar in jars) and not any(JAVA_JAR.name in jar for jar in jars)
        assert (
            spark.sql("SELECT count(DISTINCT user_id, item_id, locale) FROM lake.sample.user_item_scores").collect()[0][
                0
            ]
            == 3_000
        )
    finally:
        stop_spark_session()


def test_executors_start_from_their_node_s_class_archive_which_the_first_without_one_makes(
    home: Path, archive: Path
) -> None:
    """An executor JVM that did not map the worker folder's class-data archive has its node
    make it once the JVM exited (``executor_archive``): the next application's executors
    start from it."""
    from bulldozer.load.engines.spark import session
    from bulldozer.load.engines.spark.package import archive_conf

    master, conf = services.spark_master(), archive_conf(archive)

    def sharing(_: object) -> tuple[str, bool]:  # in a task: its JVM's archive, and whether the JVM maps it
        import os

        pid = os.getppid()
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            if args[0].endswith(b"java"):
                asked = [arg.decode() for arg in args if arg.startswith(b"-XX:SharedArchiveFile=")][-1]
                path = os.path.realpath(os.path.join(os.readlink(f"/proc/{pid}/cwd"), asked.split("=", 1)[1]))
                with open(f"/proc/{pid}/maps") as maps:
                    return path, any(line.rstrip("\n").endswith(f" {path}") for line in maps)
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        return "", False

    def application() -> tuple[str, bool]:
        try:
            context = session.spark_context("lake", None, str(home), master, conf)
            found: set[tuple[str, bool]] = set(context.parallelize(range(2), 2).map(sharing).collect())
            (one,) = found  # both tasks in the worker's one executor
            return one
        finally:
            stop_spark_session()

    stop_spark_session()
    path, mapped = application()
    if mapped:  # made after an earlier test's application: once more without it
        Path(path).unlink()
        path, mapped = application()
    assert not mapped and Path(path).parent.name == "work", path  # the worker's folder (spark.sh)
    deadline = time.monotonic() + 120  # made after the JVM exited (the application stopped)
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert application() == (path, True)


def test_a_master_and_its_worker_answer_the_probe_and_log_no_error_of_it() -> None:
    """``_MasterProbe`` against a real master: no web server, and not silent, as Spark's
    protocol reads its frame: a StreamFailure (type 8) for the stream it asked. The master
    logs the probe's connections as it logs a bare one, with no error. A worker's port
    answers as well (a master URL naming it is left to Spark's minute)."""
    from bulldozer.load.engines.spark.session import _check_master

    master = services.spark_master()
    folder = Path(services._folders["spark"])
    logs = [folder / "master.log", folder / "worker.log"]
    before = [len(log.read_text()) for log in logs]
    worker_port = int(re.findall(r"started service 'sparkWorker' on port (\d+)", logs[1].read_text())[-1])
    for url in (master, f"spark://127.0.0.1:{worker_port}"):
        probe = _check_master(url)
        assert probe is not None and probe.web_server() is None, url
        assert probe.silent() is False, url
        assert probe.reply[8] == 8 and b"Stream '/files/bulldozer-probe" in probe.reply, (url, probe.reply)
    for log, size in zip(logs, before, strict=True):  # (the session's other runs on the cluster log beside)
        logged = log.read_text()[size:]
        assert "bulldozer-probe" not in logged and "stream" not in logged.lower(), logged


def _spark_run(master: str, dal: KvClient) -> list[str]:
    """``bulldozer run``'s arguments for the main job on ``master``, quiet, into ``dal``."""
    return ["run", "templates/move_data_to_kv_dal.yaml", "--engine", "spark", "--master", master, "-q",
            "--endpoint", dal.target]  # fmt: skip


def _a_run_no_executor_takes_fails_in_one_line(home: Path, dal: KvClient, master: str) -> None:
    """This process's application holds the worker's cores: Spark would make another wait
    for ever; the run fails after ``BULLDOZER_SPARK_IDLE_TIMEOUT`` with one line, and
    nothing is flipped."""
    from bulldozer.kv.types import State
    from tests.integration.test_run import _cli

    live = dal.get_alias("user_item_scores").namespace
    before = {ns.name for ns in dal.list_namespaces("user_item_scores")}
    done = _cli(
        _spark_run(master, dal),
        home,
        env={"BULLDOZER_SPARK_IDLE_TIMEOUT": "5"},
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == (
        f"error: no Spark task ran for 5 s on {master}: the cluster has no free cores, or its executors cannot "
        "reach this driver (BULLDOZER_SPARK_DRIVER_HOST); the version is not flipped"
    )
    assert not [line for line in lines if "Traceback" in line or "Exception" in line or " WARN " in line], lines
    new = [ns for ns in dal.list_namespaces("user_item_scores") if ns.name not in before]
    assert len(new) == 1 and new[0].state == State.FAILED
    assert dal.get_alias("user_item_scores").namespace == live


def test_the_cli_runs_on_the_cluster_with_the_configured_archive_and_stays_quiet(
    home: Path, archive: Path, dal: KvClient
) -> None:
    """``bulldozer run --engine spark --master spark://…`` with ``BULLDOZER_SPARK_ARCHIVE``:
    the version is the local engine's, and ``-q`` leaves stderr without Spark's progress
    bar or log lines (Spark logs at Bulldozer's level: warnings and worse)."""
    from tests.integration.test_run import _cli

    master = services.spark_master()
    done = _cli(
        [*_spark_run(master, dal), "--json"],
        home,
        env={"BULLDOZER_SPARK_ARCHIVE": str(archive)},
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["outcome"] == "succeeded" and record["engine"] == "spark" and record["rows"] == 3_000
    noise = [line for line in done.stderr.splitlines() if "[Stage" in line or " INFO " in line or " WARN " in line]
    assert noise == [], done.stderr
    local = run_job(load_spec_text(TEMPLATE, "job.yaml", env={}), dal, engine="local", home=str(home))
    assert dal.describe(local.version).digest == dal.describe(record["version"]).digest


def test_the_archive_carries_the_daemon_s_modules_as_bytecode_executors_need_not_check(archive: Path) -> None:
    """The modules the executors' worker daemon preloads come with unchecked hash-based
    bytecode (PEP 552: Spark's unpacking drops file times, which would make timestamped
    bytecode stale); the rest is source only."""
    import importlib.util
    import marshal

    import bulldozer.load.encoder.encode as encode

    site = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    with zipfile.ZipFile(archive) as packed:
        names = set(packed.namelist())
        pyc = f"{site}/{importlib.util.cache_from_source('bulldozer/load/encoder/encode.py')}"
        data = packed.read(pyc)
        source = packed.read(f"{site}/bulldozer/load/encoder/encode.py")
    assert data[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(data[4:8], "little") == 0b01
    assert data[8:16] == importlib.util.source_hash(source)
    code = marshal.loads(data[16:])
    assert encode.__file__.endswith(code.co_filename) and "RowEncoder" in code.co_names
    # a module the daemon does not import ships as source only
    assert f"{site}/bulldozer/console/app.py" in names
    # its manifest comes last: the launcher's interpreter and folder, and an id of the content
    with zipfile.ZipFile(archive) as packed:
        last = packed.infolist()[-1]
        manifest = json.loads(packed.read(last))
    assert last.filename == MANIFEST and manifest["site"] == site and len(manifest["id"]) == 32
    assert f"{site}/{importlib.util.cache_from_source('bulldozer/console/app.py')}" not in names


def test_package_refuses_a_path_it_cannot_write_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "bulldozer.cli.main", "spark", "package", "-o", str(blocker / "env.zip")],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [f"error: cannot write the archive {blocker / 'env.zip'}: File exists"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_two_packs_to_one_archive_at_once_both_write_it_whole(tmp_path: Path) -> None:
    """Two ``bulldozer spark package`` writing the same archive at once (two deploy jobs) wrote
    one shared ``env.zip.partial``: the first's move took the file the second still wrote, and
    the second failed with ``cannot write the archive ...: No such file or directory``. Each
    now writes its own partial file and moves it into place whole; a dead process's partial
    file is deleted by the next pack."""
    import zipfile

    output = tmp_path / "env.zip"
    stale = tmp_path / "env.zip.999999999.partial"  # no such process
    stale.write_bytes(b"left by a killed pack")
    command = [sys.executable, "-m", "bulldozer.cli.main", "spark", "package", "--no-compress", "-o", str(output)]
    packs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    said = [pack.communicate(timeout=300) for pack in packs]
    assert [pack.returncode for pack in packs] == [0, 0], said
    with zipfile.ZipFile(output) as archive:
        assert archive.testzip() is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.zip"]
