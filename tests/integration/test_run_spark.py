"""The main job with the Spark engine (pyspark local mode + Iceberg's Spark runtime on the
same SQLite catalog pyiceberg writes). Slow to start (~10 s), so the suite shares one
warehouse and one Spark session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bulldozer.errors import QualityGateError
from bulldozer.kv import KvClient
from bulldozer.load.runner import run_job
from bulldozer.spec import load_spec_text
from bulldozer.spec.models import CatalogConfig
from bulldozer.warehouse.catalog import open_catalog
from bulldozer.warehouse.sample import create_sample_warehouse, overwrite_sample
from tests.conftest import REPO
from tests.integration.test_run import KEY, read

pytest.importorskip("pyspark", reason="the spark extra is part of the default install (scripts/bootstrap.sh)")
pytestmark = [pytest.mark.integration, pytest.mark.spark]
TEMPLATE = (REPO / "templates" / "move_data_to_kv_dal.yaml").read_text()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("spark-home")
    create_sample_warehouse(path, rows=3_000, chunk_rows=1_000)  # three files
    yield path
    from bulldozer.load.engines.spark import stop_spark_session

    stop_spark_session()


def test_spark_and_local_store_identical_versions(home: Path, dal: KvClient) -> None:
    from bulldozer.load.engines.spark import SparkEngine

    spec = load_spec_text(TEMPLATE, "job.yaml", env={})
    engine = SparkEngine()
    spark = run_job(spec, dal, engine=engine, home=str(home))
    assert spark.outcome == "succeeded" and spark.rows == 3_000 and spark.engine == "spark"
    assert engine.shared_keys_unchecked  # three files for the cores: the tasks read them themselves
    from_spark = read(dal, "user_item_scores", KEY)
    local = run_job(spec, dal, engine="local", home=str(home))
    assert local.snapshot_id == spark.snapshot_id
    assert dal.describe(local.version).digest == dal.describe(spark.version).digest  # byte-identical
    assert read(dal, "user_item_scores", KEY) == from_spark


def test_one_small_file_is_read_in_place_by_one_task(tmp_path: Path, dal: KvClient) -> None:
    """Fewer files than cores, but small: one task reads the file itself (spreading its rows
    over both cores by key cost Spark SQL's start, a JVM read and a shuffle: 14.7 s against
    5.2 s for the whole command, measured), and stores what the local engine stores."""
    from bulldozer.load.engines.spark import SparkEngine

    home = tmp_path / "home"
    create_sample_warehouse(home, rows=2_000)  # one file
    spec = load_spec_text(TEMPLATE, "job.yaml", env={})
    engine = SparkEngine()  # local[*]: a core per CPU, two here
    spark = run_job(spec, dal, engine=engine, home=str(home))
    assert engine.shared_keys_unchecked  # the task read the file: no Spark read by key
    local = run_job(spec, dal, engine="local", home=str(home))
    assert (spark.rows, dal.describe(spark.version).digest) == (2_000, dal.describe(local.version).digest)


def test_spark_v2_after_the_table_changes_and_a_failing_gate_keeps_it(home: Path, dal: KvClient) -> None:
    spec = load_spec_text(TEMPLATE, "job.yaml", env={})
    table = open_catalog(CatalogConfig(), home).load_table("sample.user_item_scores")
    first = run_job(spec, dal, engine="spark", home=str(home))
    before = read(dal, "user_item_scores", KEY)
    overwrite_sample(table, rows=3_000, variant=2)
    second = run_job(spec, dal, engine="spark", home=str(home))
    after = read(dal, "user_item_scores", KEY)
    assert second.snapshot_id != first.snapshot_id and after != before
    overwrite_sample(table, rows=200, variant=3)  # shrinks by 93 %
    with pytest.raises(QualityGateError):
        run_job(spec, dal, engine="spark", home=str(home))
    assert dal.get_alias("user_item_scores").namespace == second.version
    assert read(dal, "user_item_scores", KEY) == after


def test_the_first_spark_run_leaves_the_driver_s_class_archive_and_the_next_starts_from_it(
    dal: KvClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine's first Spark run resolves the packages and keeps their files
    (``session._packages``); the next, its driver JVM having them on its class path
    (``session._driver_class_path``), writes the archive of the classes it loaded as it exits
    (``session._class_archive_options``; the first makes none: its class path differs); the
    archive is kept only once complete, and later runs start from it. None writes anything
    else on stdout."""
    import json

    from bulldozer.load.engines.spark import session
    from tests.integration.test_run import _cli

    home = tmp_path / "home"
    create_sample_warehouse(home, rows=3_000, chunk_rows=1_000)
    cache = tmp_path / "cache"
    args = ["run", "templates/move_data_to_kv_dal.yaml", "--engine", "spark", "--master", "local[2]", "-q", "--json",
            "--endpoint", dal.target]  # fmt: skip
    first = _cli(args, home, env={"BULLDOZER_CACHE": str(cache)})
    assert first.returncode == 0, first.stderr
    # the local files Spark resolved the packages to (``session._packages``), and no archive
    (jars,) = [path.name for path in (cache / "spark").iterdir()]
    assert jars.startswith("jars-"), jars
    files = (cache / "spark" / jars).read_text().split()
    assert len(files) == len(session.PACKAGES) and all(Path(f).is_file() and f.endswith(".jar") for f in files), files
    second = _cli(args, home, env={"BULLDOZER_CACHE": str(cache)})
    assert second.returncode == 0, second.stderr
    kept = sorted(path.name for path in (cache / "spark").iterdir())
    archives = [name for name in kept if name.endswith(".jsa")]
    assert len(archives) == 1 and archives[0].startswith("driver-") and len(kept) == 2, kept
    third = _cli(args, home, env={"BULLDOZER_CACHE": str(cache)})
    assert third.returncode == 0, third.stderr
    records = [json.loads(done.stdout) for done in (first, second, third)]
    assert len({record["digest"] for record in records}) == 1 and records[2]["engine_start"] > 0
    assert sorted(path.name for path in (cache / "spark").iterdir()) == kept  # used, not rebuilt
    # which options a driver gets: the archive to start from once it exists, else the one to
    # write; the resolved jars once known, else the packages to resolve
    try:
        monkeypatch.setenv("BULLDOZER_CACHE", str(cache))
        local = session._driver_class_path(session._packages())
        assert local[: len(files)] == [Path(f) for f in files]
        assert session._class_archive_options(local)[0] == f"-XX:SharedArchiveFile={cache / 'spark' / archives[0]}"
        assert session._packages() == {"spark.jars": ",".join(files)}
        monkeypatch.setenv("BULLDOZER_CACHE", str(tmp_path / "empty"))
        assert session._class_archive_options(local, make=False) == []
        assert session._class_archive_options()[0].startswith("-XX:ArchiveClassesAtExit=")
        assert session._packages() == {
            "spark.jars.packages": ",".join(session.PACKAGES),
            "spark.jars.excludes": session.EXCLUDED,
        }
    finally:
        session._ARCHIVE_BUILD = None


def test_two_drivers_starting_together_on_a_machine_that_never_resolved_the_packages_both_start(
    tmp_path: Path,
) -> None:
    """Ivy's resolution of the Iceberg and JDBC packages is not safe twice at once in one Ivy
    home: two drivers starting together before either had resolved them both failed ("download
    failed: ...iceberg-spark-runtime...jar", "FileNotFoundException .../sqlite-jdbc...jar"), as
    two Airflow tasks or two test workers on a new machine do. Now one resolves while the
    other waits (``session._resolving``) and then starts from the files it resolved. A fresh
    Ivy home and cache make this machine new (the packages come from Maven Central again)."""
    import os
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from bulldozer.load.engines.spark.session import spark_context\n"
        "context = spark_context(home=sys.argv[1], master='local[1]', conf={'spark.jars.ivy': sys.argv[2]})\n"
        "print(context.parallelize(range(10)).sum())\n"
    )
    cache, ivy = tmp_path / "cache", tmp_path / "ivy"
    env = {**os.environ, "BULLDOZER_CACHE": str(cache)}
    drivers = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "home"), str(ivy)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    said = [driver.communicate(timeout=600) for driver in drivers]
    assert [driver.returncode for driver in drivers] == [0, 0], said
    assert [out.split()[-1] for out, _ in said] == ["45", "45"], said
    (record,) = (cache / "spark").glob("jars-*.txt")  # resolved once, kept for the next start
    assert all(Path(jar).is_relative_to(ivy) for jar in record.read_text().split())
    assert not list((cache / "spark").glob("*.partial"))


def test_an_event_log_the_operators_spark_defaults_enable_keeps_no_catalog_secret(tmp_path: Path) -> None:
    """A cluster's ``spark-defaults.conf`` (``SPARK_CONF_DIR``) commonly turns Spark's event
    log on for its history server, which then shows every application's settings. Spark
    redacts the values of settings named by ``spark.redaction.regex``, whose default
    (``secret|password|token|access[.]?key``) missed a REST catalog's ``credential`` (its
    OAuth2 client secret), an ``Authorization`` header and ADLS's account key: the event log
    kept them in clear. Now every name ``bulldozer.redaction`` holds a secret's is Spark's
    too; the log still holds the settings (their names), with the values hidden."""
    import json
    import os
    import subprocess
    import sys

    secrets = {
        "credential": "client-id:CLIENT-SECRET-0451",
        "header.Authorization": "Bearer BEARER-0451",
        "adls.account-key": "ACCOUNT-KEY-0451",
        "s3.secret-access-key": "S3-SECRET-0451",
        "jdbc.password": "PASSWORD-0451",
    }
    conf, events = tmp_path / "conf", tmp_path / "events"
    conf.mkdir()
    events.mkdir()
    defaults = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events.as_uri(),
        "spark.eventLog.compress": "false",  # one file of JSON lines, to read here
        "spark.eventLog.rolling.enabled": "false",
    }
    (conf / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in defaults.items()))
    script = (
        "import json, sys\n"
        "from bulldozer.load.engines.spark.session import spark_context, stop_spark_session\n"
        "from bulldozer.warehouse.catalog import embedded_catalog_properties\n"
        "catalog = {**embedded_catalog_properties(sys.argv[1]), **json.loads(sys.argv[2])}\n"
        "context = spark_context('lake', catalog, sys.argv[1], 'local[1]')\n"
        "print(context.parallelize(range(10)).sum())\n"
        "stop_spark_session()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "home"), json.dumps(secrets)],
        env={**os.environ, "SPARK_CONF_DIR": str(conf)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (log,) = [path for path in events.iterdir() if not path.name.endswith(".inprogress")]
    text = log.read_text()
    assert all(f"spark.sql.catalog.lake.{name}" in text for name in secrets)  # the settings were logged
    assert [name for name, value in secrets.items() if value in text] == []


def test_the_operators_spark_defaults_join_what_bulldozer_sets_instead_of_being_dropped(tmp_path: Path) -> None:
    """Spark takes a setting given to the context over ``spark-defaults.conf``'s, so the
    operator's Java options for the driver (a system property, a JVM flag) and its redaction
    pattern were dropped without a word. Now each joins Bulldozer's
    (``session.JOINED_WITH_DEFAULTS``): the operator's flag wins over Bulldozer's, a name
    either pattern matches is redacted; a setting Bulldozer sets itself is named in the log."""
    import os
    import subprocess
    import sys

    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        "# the operator's\n"
        "spark.driver.extraJavaOptions  -Dbulldozer.probe=operator \\\n"
        "    -XX:Tier4InvocationThreshold=7000\n"
        "spark.redaction.regex=(?i)house[.]key\n"
        "spark.ui.enabled true\n"
    )
    script = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from bulldozer.load.engines.spark.session import spark_context, stop_spark_session\n"
        "context = spark_context(home=sys.argv[1], master='local[1]')\n"
        "jvm = context._jvm\n"
        "bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(\n"
        "    jvm.java.lang.Class.forName('com.sun.management.HotSpotDiagnosticMXBean'))\n"
        "regex = jvm.java.util.regex.Pattern.compile(context.getConf().get('spark.redaction.regex'))\n"
        "print(jvm.java.lang.System.getProperty('bulldozer.probe'),\n"
        "      bean.getVMOption('Tier4InvocationThreshold').getValue(),\n"
        "      bean.getVMOption('Tier4CompileThreshold').getValue(),\n"
        "      *[regex.matcher(name).find() for name in ('spark.house.key', 'JDBC.PASSWORD', 'spark.app.name')])\n"
        "stop_spark_session()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "home")],
        env={**os.environ, "SPARK_CONF_DIR": str(conf)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # the operator's property and flag (theirs last), Bulldozer's other C2 thresholds; both patterns
    assert done.stdout.split()[-6:] == ["operator", "7000", "150000", "True", "True", "False"], done.stdout
    (said,) = [line for line in done.stderr.splitlines() if "spark-defaults.conf" in line]
    assert said.endswith("which Bulldozer sets itself: spark.ui.enabled"), said


def test_a_partial_class_archive_of_a_process_that_is_gone_is_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that ended without its ``atexit`` (killed, or a test worker's ``os._exit``)
    left its driver's partial class-data archive (≈ 170 MiB) in the cache for good: one test
    run left four. The next driver's start deletes those of processes that are gone."""
    import subprocess
    import sys

    from bulldozer.load.engines.spark import session

    monkeypatch.setenv("BULLDOZER_CACHE", str(tmp_path / "cache"))
    path = session.class_archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        partials = {pid: path.with_name(f"{path.name}.{pid}.partial") for pid in (int(gone.stdout), alive.pid)}
        for partial in partials.values():
            partial.write_bytes(b"archive")
        assert session._class_archive_options()[0].startswith("-XX:ArchiveClassesAtExit=")
        assert not partials[int(gone.stdout)].exists()
        assert partials[alive.pid].exists()  # still being written, perhaps
    finally:
        alive.kill()
        alive.wait()
        session._ARCHIVE_BUILD = None


def test_a_driver_spark_refuses_to_start_fails_the_run_in_one_line(dal: KvClient, tmp_path: Path) -> None:
    """The engine starts Spark in the background while the schema and create stages run;
    when spark-submit refuses to start the driver, the load stage fails with spark-submit's
    reason in one line (not a gateway's "exited before sending its port number"), the new
    version is FAILED and the alias stays."""
    from bulldozer.kv.types import State
    from tests.integration.test_run import _cli

    home = tmp_path / "home"
    create_sample_warehouse(home, rows=3_000)
    run_job(load_spec_text(TEMPLATE, "job.yaml", env={}), dal, home=str(home), engine="local")
    live = dal.get_alias("user_item_scores").namespace
    args = ["run", "templates/move_data_to_kv_dal.yaml", "--engine", "spark", "--master", "nowhere://at-all",
            "--endpoint", dal.target]  # fmt: skip
    done = _cli(args, home)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "error: Spark's driver did not start on nowhere://at-all: "
        "Master must either be yarn or start with spark, k8s, or local"
    ), done.stderr
    assert "Traceback" not in done.stderr and "JAVA_GATEWAY" not in done.stderr
    newest = max(dal.list_namespaces("user_item_scores"), key=lambda ns: ns.created)
    assert newest.state == State.FAILED and dal.get_alias("user_item_scores").namespace == live


def test_a_standalone_master_no_one_answers_at_fails_the_run_at_once_in_one_line(dal: KvClient, tmp_path: Path) -> None:
    """``--master spark://host:port`` where nothing listens: Spark tried it three times, 20 s
    apart, stopped the application, and the run failed a minute later with a Java stack
    trace of several KB on its "one" line. It fails at once now, saying which master, and
    the alias stays."""
    import time

    from tests.integration.test_kv_server import _free_port
    from tests.integration.test_run import _cli
    from tests.integration.test_spark_datasource import _live

    home = tmp_path / "home"
    create_sample_warehouse(home, rows=1_000)
    port = _free_port()  # nothing listens there
    master = f"spark://127.0.0.1:{port}"
    before = _live(dal, "user_item_scores")
    args = [
        "run",
        "templates/move_data_to_kv_dal.yaml",
        "--engine",
        "spark",
        "--master",
        master,
        "--endpoint",
        dal.target,
    ]
    started = time.monotonic()
    done = _cli(args, home)
    assert done.returncode == 1 and time.monotonic() - started < 30, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: the Spark master {master} cannot be reached (127.0.0.1:{port}: Connection refused): "
        "is it up, and its URL right?"
    ), done.stderr
    assert "Py4J" not in done.stderr and "Traceback" not in done.stderr
    assert _live(dal, "user_item_scores") == before


def test_a_standalone_master_url_naming_a_web_server_is_one_line_at_once(dal: KvClient, tmp_path: Path) -> None:
    """``--master spark://host:port`` naming a web server (the master's web UI, say): the
    connection is taken, so Spark tried to register for a minute, then stopped the context,
    and the run failed with the Java stack trace of the first job of a stopped context as
    its one line. Then it said after that minute that no Spark master answered there. Now
    the web server's answer to the master check's probe refuses the run as its driver
    starts, and the alias stays."""
    import http.server
    import threading
    import time

    from tests.integration.test_run import _cli
    from tests.integration.test_spark_datasource import _live

    home = tmp_path / "home"
    create_sample_warehouse(home, rows=1_000)
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    node = f"127.0.0.1:{web.server_address[1]}"
    master = f"spark://{node}"
    before = _live(dal, "user_item_scores")
    try:
        args = ["run", "templates/move_data_to_kv_dal.yaml", "--engine", "spark", "--master", master,
                "--endpoint", dal.target]  # fmt: skip
        started = time.monotonic()
        done = _cli(args, home)
        took = time.monotonic() - started
    finally:
        web.shutdown()
        web.server_close()
    assert done.returncode == 1 and took < 40, (took, done.stderr)  # Spark's own registration: over 60 s
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: the Spark master {master} is a web server, not a Spark master: {node} answered "
        "'<!DOCTYPE HTML>' (a master takes applications on its own port, 7077 by default; its web UI's is 8080, "
        "its REST server's 6066)"
    ), done.stderr
    assert "Py4J" not in done.stderr and "Traceback" not in done.stderr and "\tat " not in done.stderr
    assert _live(dal, "user_item_scores") == before


def test_a_standalone_master_url_where_a_silent_service_listens_is_one_line(dal: KvClient, tmp_path: Path) -> None:
    """``--master spark://host:port`` naming a service that takes the connection and never
    answers: Spark tried to register for a minute, then stopped the context, and the run
    failed with the Java stack trace of the first job of a stopped context as its one line.
    A master answers the probe's whole frame at once (test_spark_cluster): the run now says
    in ``_SILENT_SECONDS`` that nothing answered there, and the alias stays."""
    import time

    from bulldozer.load.engines.spark.session import _SILENT_SECONDS
    from tests.integration.test_run import _cli
    from tests.integration.test_spark_datasource import _live
    from tests.listeners import loopback_listener

    home = tmp_path / "home"
    create_sample_warehouse(home, rows=1_000)
    before = _live(dal, "user_item_scores")
    with loopback_listener(hold=True) as node:  # every connection held open, unanswered
        master = f"spark://{node}"
        args = ["run", "templates/move_data_to_kv_dal.yaml", "--engine", "spark", "--master", master,
                "--endpoint", dal.target]  # fmt: skip
        started = time.monotonic()
        done = _cli(args, home)
        took = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    said = done.stderr.strip().splitlines()[-1]
    assert said == (
        f"error: the Spark master {master} did not answer: what listens at {node} took the connection and said "
        "nothing in 10 s, where a Spark master answers at once (is it the master's port, 7077 by default? is a "
        "proxy or firewall holding the connection?)"
    ), done.stderr
    assert "Py4J" not in done.stderr and "Traceback" not in done.stderr and "\tat " not in done.stderr
    assert _live(dal, "user_item_scores") == before
    assert took < 60, f"{took:.0f} s: Spark's own minute of registrations, not the probe's {_SILENT_SECONDS} s"


@pytest.mark.parametrize(("host", "said"), [("nohost.invalid", "Name or service not known"),
                                            ("192.0.2.1", "Cannot assign requested address")])  # fmt: skip
def test_a_driver_host_this_machine_cannot_listen_on_is_one_line(
    host: str, said: str, dal: KvClient, tmp_path: Path
) -> None:
    """BULLDOZER_SPARK_DRIVER_HOST naming no address of this machine: the driver failed to
    start with netty's Java stack trace (UnresolvedAddressException, BindException) as the
    run's one line. It says which setting and why now."""
    from tests.integration.test_run import _cli

    home = tmp_path / "home"
    create_sample_warehouse(home, rows=1_000)
    args = ["run", "templates/move_data_to_kv_dal.yaml", "--engine", "spark", "--master", "local[1]",
            "--endpoint", dal.target]  # fmt: skip
    done = _cli(args, home, {"BULLDOZER_SPARK_DRIVER_HOST": host})
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: the Spark driver cannot listen on {host} (BULLDOZER_SPARK_DRIVER_HOST): {said}; "
        "name an address of this machine"
    ), done.stderr
    assert "Py4J" not in done.stderr and "Traceback" not in done.stderr


def test_bad_data_in_a_spark_run_is_one_line_on_stderr(dal: KvClient, tmp_path: Path) -> None:
    """A task that meets bad data (keys repeated across the table's files, spread by key so
    one task finds them) fails the run with the engine's one line: Spark's own lines about
    the failed tasks (the executor's traceback, "Lost task", "Aborting commit") stay at
    INFO and DEBUG."""
    from tests.integration.test_run import _cli

    home = tmp_path / "home"
    create_sample_warehouse(home, rows=3_000, chunk_rows=1_000)
    table = open_catalog(CatalogConfig(), home).load_table("sample.user_item_scores")
    table.append(table.scan().to_arrow().slice(0, 5))  # five keys twice, in different files
    spec = tmp_path / "job.yaml"
    spec.write_text(TEMPLATE.replace("    in_flight_batches: 4 ", "    partitions: 5\n    in_flight_batches: 4 "))
    args = ["run", str(spec), "--engine", "spark", "--master", "local[2]", "--endpoint", dal.target]
    done = _cli(args, home)  # the default level: Spark's warnings and errors show
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("error: the source has rows sharing a key"), done.stderr
    marks = ("Exception in task", "Lost task", "Aborting", "Traceback", "PythonException")
    spark = [line for line in lines if any(mark in line for mark in marks) or line.startswith(("\tat ", "Caused by:"))]
    assert not spark, done.stderr


def test_a_spark_run_whose_terminal_hangs_up_is_recorded_as_failed_and_cleans_up(tmp_path: Path) -> None:
    """As a local run (test_run.py): the terminal closes once the version is LOADING, while
    the Spark driver's JVM may still be starting (in a thread, beside the create stage). The
    JVM runs in a process group of its own, so the hang-up reaches the driver's Python side
    alone, which records the run as failed and exits 129; the JVM ends with it. (One still
    starting outlived the run for good: ``session._end_starting_gateway``.)"""
    import time

    from tests.integration.test_run import hang_up_mid_load

    hang_up_mid_load(tmp_path, "--engine", "spark", "--master", "local[2]")
    deadline = time.monotonic() + 10  # it ends once its driver has (0.8 s here)
    while (left := _spark_jvms(tmp_path / "h")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"the run's JVM outlived it: {left}"


def _spark_jvms(home: Path) -> list[int]:
    """The Spark driver JVMs of runs in ``home``: SparkSubmit processes whose environment
    names it (a JVM's command line holds no path of the run: the catalog's settings reach
    it after it starts, ``session.AFTER_LAUNCH_PREFIX``; a check by that path passed when
    the JVM outlived its run)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if b"org.apache.spark.deploy.SparkSubmit" in (entry / "cmdline").read_bytes() and (
                f"BULLDOZER_HOME={home}".encode() in (entry / "environ").read_bytes().split(b"\0")
            ):
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue  # not a process, or gone meanwhile
    return found


def test_a_spark_run_past_its_time_limit_is_one_line(dal: KvClient, tmp_path: Path) -> None:
    """The time limit (as SIGTERM or Ctrl-C would) reaches the run while it waits on the JVM
    for its Spark job: py4j logged "KeyboardInterrupt while sending command." through the
    root logger, then "Exception occurred while shutting down connection", each with a
    traceback, before the run's one line. Now only that line; the version is FAILED."""
    from bulldozer.kv.types import State
    from tests.integration.test_run import _cli

    home = tmp_path / "home"
    create_sample_warehouse(home, rows=3_000)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        TEMPLATE.replace(
            "    # records_per_second: 50000     # optional throttle", "    records_per_second: 10"
        ).replace("  retry_delay: 5m\n", "  retry_delay: 5m\n  timeout: 20s\n")
    )
    args = ["run", str(spec), "--engine", "spark", "--master", "local[2]", "--endpoint", dal.target, "-q"]
    done = _cli(args, home)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: the run took longer than its time limit, 20s (metadata.timeout)"
    ]
    (version,) = dal.list_namespaces("user_item_scores")
    assert version.state == State.FAILED
