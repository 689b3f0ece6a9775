"""The SparkSession Bulldozer runs on: Iceberg's Spark runtime and the catalog of the job.

The job's pyiceberg catalog is opened as Iceberg's Java runtime spells it
(``bulldozer.load.engines.spark.catalog``): for the embedded warehouse, a JDBC catalog on
the very SQLite file pyiceberg writes (the catalog names match: ``lake``). One session is
kept while the catalog, home and master stay the same (Spark catalogs load once). Spark's
own log level follows Bulldozer's (``bulldozer`` logger), and its console progress bar is
off unless asked for (``-q`` and non-terminal runs never show it).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bulldozer import locks, scratch
from bulldozer.errors import LoadError
from bulldozer.load.engines.spark import executor_archive
from bulldozer.load.engines.spark.catalog import JAVA_JAR, spark_catalog_properties
from bulldozer.redaction import SECRET_SETTING
from bulldozer.settings import (
    java_executable,
    load_settings,
    pyspark_python,
    spark_class_path_folders,
    spark_properties_files,
)
from bulldozer.spec.models import EMBEDDED_CATALOG
from bulldozer.warehouse.catalog import bulldozer_home, embedded_catalog_properties

log = logging.getLogger(__name__)

__all__ = [
    "ICEBERG_AWS_BUNDLE",
    "ICEBERG_RUNTIME",
    "PACKAGES",
    "SQLITE_JDBC",
    "gateway_popen_kwargs",
    "spark_context",
    "spark_log_level",
    "spark_session",
    "stop_spark_session",
]

ICEBERG_RUNTIME = "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0"
#: Iceberg's S3 client (``S3FileIO``, with the AWS SDK it needs): Iceberg's Spark reader
#: reads a table in S3 (or an S3-compatible store) with it, as pyiceberg does with its own
ICEBERG_AWS_BUNDLE = "org.apache.iceberg:iceberg-aws-bundle:1.12.0"
#: the JDBC drivers of the databases a SQL catalog may be kept in (``catalog.py``)
SQLITE_JDBC = "org.xerial:sqlite-jdbc:3.46.1.3"
POSTGRES_JDBC = "org.postgresql:postgresql:42.7.14"
MARIADB_JDBC = "org.mariadb.jdbc:mariadb-java-client:3.5.6"  # MySQL's servers too
#: the driver's packages (Maven coordinates), resolved by spark-submit on a machine's first start
PACKAGES = (ICEBERG_RUNTIME, ICEBERG_AWS_BUNDLE, SQLITE_JDBC, POSTGRES_JDBC, MARIADB_JDBC)
#: what the packages depend on that the driver does not run: pgjdbc's Checker Framework
#: annotations (compile-time only), so the packages resolve to one jar each
EXCLUDED = "org.checkerframework:checker-qual"
#: The driver's and the executors' JVMs compile a method with C2, Java's optimizing compiler,
#: once it has run ten times as often as Java's defaults ask (the Tier4 thresholds; C1 still
#: compiles early). A Spark start runs thousands of methods a few thousand times each, and
#: with the defaults C2 compiled them on one of the machine's cores while the start and the
#: run's Python side wanted both; the methods a long job runs hot still reach C2. Measured on
#: the 2-core machine, interleaved rounds (README, "Spark"): 2 M nested rows read in place,
#: whole command median 6.43 -> 5.97 s on ``local[2]`` (4 rounds each); on the loopback
#: cluster 8.93 -> 8.55 s with the driver's (7 each), and 8.55 -> 8.22 s and 9.41 -> 8.94 s
#: with the executors' too (7 and 6 each); 1.6 M rows in one file read by key on ``local[2]``
#: (the JVM reading and shuffling every row) 22.08-22.75 -> 20.66-21.97 s (2 each). C1 alone
#: (``-XX:TieredStopAtLevel=1``) started as fast but read by key in 25.5-28.7 s.
C2_LATER = (
    "-XX:Tier4InvocationThreshold=50000",
    "-XX:Tier4MinInvocationThreshold=6000",
    "-XX:Tier4CompileThreshold=150000",
    "-XX:Tier4BackEdgeThreshold=400000",
)
_SESSION: Any = None
#: the packages' files a cluster's executors take when Spark SQL starts on the context
#: (``spark_session``), not before (``_sql_jars``)
_SQL_JARS: list[str] = []
_CONTEXT: Any = None
_CONTEXT_KEY: tuple[object, ...] = ()
_CONTEXT_LOCK = threading.Lock()
#: The application id Spark gives a context its cluster manager gave none (TaskScheduler's
#: default): a standalone master's are ``app-<time>-<n>``, given as it registers the driver.
_UNREGISTERED_APPLICATION = "spark-application-"


def spark_session(
    catalog_name: str = EMBEDDED_CATALOG,
    properties: dict[str, str] | None = None,
    home: str | None = None,
    master: str | None = None,
    conf: dict[str, str] | None = None,
) -> Any:
    """A SparkSession with the Iceberg catalog configured, reused while the catalog, home,
    master and ``conf`` (extra Spark properties, e.g. ``spark.archives``) are the same: the
    context of ``spark_context`` with Spark SQL on it (≈ 1.5 s more on this machine: the
    Iceberg extensions and the session state)."""
    global _SESSION
    spark_context(catalog_name, properties, home, master, conf)
    if _SESSION is None:
        from pyspark.sql import SparkSession

        _SESSION = SparkSession.builder.getOrCreate()  # on spark_context's context
        for jar in _SQL_JARS:  # Iceberg's reader and writer run in the executors' JVMs
            _SESSION.sparkContext._jsc.addJar(jar)  # Spark's Java API (pyspark has no addJar)
    return _SESSION


def spark_context(
    catalog_name: str = EMBEDDED_CATALOG,
    properties: dict[str, str] | None = None,
    home: str | None = None,
    master: str | None = None,
    conf: dict[str, str] | None = None,
) -> Any:
    """The SparkContext of Bulldozer's Spark sessions (what RDD jobs need, without Spark
    SQL), configured for the Iceberg catalog as ``spark_session`` needs; reused while the
    catalog, home, master and ``conf`` are the same. Safe to call from a thread other than
    the one that uses it (the engine starts it ahead, ``SparkEngine.prepare``)."""
    global _CONTEXT, _CONTEXT_KEY, _SQL_JARS
    key = (
        catalog_name,
        tuple(sorted((properties or {}).items())),
        str(bulldozer_home(home)),
        master,
        tuple(sorted((conf or {}).items())),
    )
    with _CONTEXT_LOCK:
        if _CONTEXT is not None:
            if key == _CONTEXT_KEY:
                return _CONTEXT
            stop_spark_session()
        pyspark_python()
        settings = load_settings()
        master = master or settings.spark_master
        probe = _check_master(master)
        _check_driver_host(settings.spark_driver_host)
        level = spark_log_level()
        with _resolving((conf or {}).get("spark.jars.ivy")) as packages:
            context = _start_context(catalog_name, properties, home, master, conf, settings, level, packages, probe)
        _CONTEXT, _CONTEXT_KEY, _SQL_JARS = context, key, _sql_jars(master, packages)
        return context


def _check_master(master: str, timeout: float = 5.0) -> _MasterProbe | None:
    """Refuse a standalone master (``spark://host:port[,host:port...]``) none of whose
    hosts takes a connection, in one line: Spark tried it three times, 20 s apart, then
    stopped the application, and the run failed a minute later with a Java stack trace
    (a job of a stopped SparkContext). The first host that takes one is probed while the
    driver starts (``_MasterProbe``); None for any other master."""
    import socket

    from bulldozer.sockets import host_port

    if not master.startswith("spark://"):
        return None
    reasons = []
    for node in master.removeprefix("spark://").split(","):
        if (reached := host_port(node)) is None:
            reasons.append(f"{node}: not host:port")
            continue
        try:
            connection = socket.create_connection(reached, timeout=timeout)
        except OSError as exc:
            reasons.append(f"{node}: {exc.strerror or exc}")
            continue
        return _MasterProbe(node, reached, connection)
    raise LoadError(f"the Spark master {master} cannot be reached ({'; '.join(reasons)}): is it up, and its URL right?")


#: The frame ``_MasterProbe`` sends, of Spark's RPC protocol (``network-common``): a
#: StreamRequest (its length, 8 bytes big-endian; its type, 6; the stream id's length, 4
#: bytes, and the id) for a file no master serves. A Spark master answers it at once with a
#: StreamFailure ("Stream ... was not found", type 8) and logs nothing of it. The id holds a
#: blank line, so that a web server answers the frame's first part as a request it cannot
#: parse (a master waits for the rest of the frame, and its log shows the connection as
#: "got disassociated").
_STREAM_ID = b"/files/bulldozer-probe\r\n\r\n."
_FRAME = (8 + 1 + 4 + len(_STREAM_ID)).to_bytes(8, "big") + b"\x06" + len(_STREAM_ID).to_bytes(4, "big") + _STREAM_ID
#: how long past the probe's start an answer to the frame's first part is waited for once
#: the driver runs: a web server on this machine answered in 1-72 ms (Python's http.server,
#: the master's own web UI and REST server), and the driver's JVM takes longer than this to start
_PROBE_SECONDS = 0.5
#: how long an answer to the whole frame is waited for: a master on this machine answered
#: in 2 ms, 118 ms the first time after it started; Spark itself waits a minute (three
#: registrations, 20 s apart) for a master that does not answer
_SILENT_SECONDS = 10.0


class _MasterProbe:
    """What listens at a standalone master's node, asked on a thread of its own while the
    driver starts. A master URL naming its web UI's port (8080) or its REST server's (6066)
    instead of the master's own (7077) was taken, and Spark tried to register there for a
    minute (its constants: three tries, 20 s apart) before the run failed: such a web server
    answers the frame's first part at once, and the run is refused as the driver is up. A
    service that takes a connection and never answers (a proxy holding it, a program that
    reads and says nothing) cost the same minute: ``silent`` asks it the whole frame, which
    a master answers at once."""

    def __init__(self, node: str, address: tuple[str, int], connection: Any) -> None:
        import time

        self.node, self.address = node, address
        self.answer = b""  # to the frame's first part
        self.reply = b""  # to the whole frame (``silent``)
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._ask, args=(connection,), name="spark-master-probe", daemon=True)
        self._thread.start()

    def _ask(self, connection: Any) -> None:
        with contextlib.suppress(OSError), connection:
            connection.settimeout(2.0)
            connection.sendall(_FRAME[:-1])
            self.answer = connection.recv(256)

    def web_server(self) -> str | None:
        """The first line of the answer when it came from a web server (an HTTP status line,
        or an HTML page: a server taking the probe for HTTP/0.9); None otherwise, a Spark
        master's silence included (whatever else answers is left for Spark to judge)."""
        import time

        self._thread.join(max(0.0, self._started + _PROBE_SECONDS - time.monotonic()))
        return _web_answer(self.answer)

    def silent(self, seconds: float = _SILENT_SECONDS) -> bool:
        """Whether what listens, asked the whole frame on a new connection, answered nothing
        in ``seconds``: no byte, no close, no reset. Not asked of a master that requires
        authentication (``_authenticates``): it logs a stream request from a peer that has
        not authenticated as an error, with its stack trace."""
        import socket

        try:
            connection = socket.create_connection(self.address, timeout=seconds)
        except OSError:
            return False  # it took the first: gone since, or refusing; Spark says which
        with connection:
            try:
                connection.sendall(_FRAME)
                self.reply = connection.recv(256)
            except TimeoutError:
                return True
            except OSError:
                pass  # reset: something answered
        return False


def _authenticates(conf: Any, gateway: Any) -> bool:
    """Whether the driver authenticates to its master (``spark.authenticate``): set in the
    run's Spark properties, or in the operator's Spark defaults, which spark-submit made the
    driver JVM's system properties. Any value but ``false`` counts: the probe holds back."""
    value = conf.get("spark.authenticate") or gateway.jvm.java.lang.System.getProperty("spark.authenticate")
    return value is not None and str(value).strip().lower() != "false"


def _web_answer(answer: bytes) -> str | None:
    """``answer``'s first line (at most 80 characters) when it is a web server's: an HTTP
    status line or the start of an HTML page; None otherwise."""
    head = answer.lstrip()
    if not (head.startswith(b"HTTP/") or head[:14].lower().startswith((b"<!doctype html", b"<html"))):
        return None
    return head.splitlines()[0].decode("latin-1")[:80]


def _check_driver_host(host: str) -> None:
    """Refuse, in one line, a driver host (``BULLDOZER_SPARK_DRIVER_HOST``) this machine
    cannot listen on: Spark's driver failed to start with a Java stack trace of netty's
    (``UnresolvedAddressException``, ``BindException``) as the run's one line."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.bind(address)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise LoadError(
            f"the Spark driver cannot listen on {host} (BULLDOZER_SPARK_DRIVER_HOST): {reason}; "
            "name an address of this machine"
        ) from None


def _start_context(
    catalog_name: str,
    properties: dict[str, str] | None,
    home: str | None,
    master: str,
    conf: dict[str, str] | None,
    settings: Any,
    level: str,
    packages: dict[str, str],
    probe: _MasterProbe | None = None,
) -> Any:
    """The SparkContext ``spark_context`` starts, its driver given the ``packages``
    (``PACKAGES``); refused before it registers when ``probe`` found a web server, or a
    service that answers nothing."""
    from pyspark import SparkConf, SparkContext

    prefix = f"spark.sql.catalog.{catalog_name}"
    defaults = operator_spark_defaults()
    resolving = "spark.jars.packages" in packages
    ours = _driver_class_path(packages) if master.startswith("local") or not resolving else []
    theirs = [Path(entry) for entry in defaults.get("spark.driver.extraClassPath", "").split(os.pathsep) if entry]
    # a local driver's first start on a machine resolves the packages (into spark.jars): the
    # next, with their files on its class path, makes the archive (one made now, never used)
    sharing = _class_archive_options([*ours, *theirs], make=not (resolving and master.startswith("local")))
    options = {
        "spark.app.name": "bulldozer",
        "spark.master": master,
        **packages,
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.cache-enabled": "false",  # each run must see the latest snapshots
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.redaction.regex": REDACTION_REGEX,
        # Bulldozer shows its own progress (or none: -q, no terminal); Spark's bar would
        # write over it
        "spark.ui.showConsoleProgress": "false",
        # Spark logs at Bulldozer's level from the JVM's first line on (not only after
        # setLogLevel): the driver reads the shipped log4j2 configuration
        "spark.driver.extraJavaOptions": " ".join(
            (
                f"-Dlog4j2.configurationFile={_LOG4J2}",
                f"-Dbulldozer.spark.level={level}",
                f"-Dbulldozer.spark.tasks.level={level if level in ('DEBUG', 'INFO') else 'OFF'}",
                # the JVM's temporary files (Spark's local folders, unless the operator's
                # spark.local.dir says where; lz4-java's native library) in the driver's
                # scratch folder: a driver killed (its run's time limit) left them in /tmp
                f"-Djava.io.tmpdir={_driver_tmp()}",
                *C2_LATER,
                *sharing,
            )
        ),
        "spark.driver.host": settings.spark_driver_host,
        "spark.driver.bindAddress": settings.spark_driver_host,
        # a cluster's executor JVMs start as the driver's does (in local mode the driver
        # runs the tasks): the operator's executor options from spark-defaults.conf follow
        "spark.executor.extraJavaOptions": " ".join(C2_LATER),
        # the batches of the Python workers land in jemalloc's pool (bulldozer.cli.process)
        "spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL": "jemalloc",
        # the Python workers import nothing from their working directory: in local mode the
        # driver's, wherever the command was started (bulldozer.settings.python_command)
        "spark.executorEnv.PYTHONSAFEPATH": "1",
        # what Spark SQL's Python runners add to their workers' environment: with it in
        # every job's, the RDD jobs' (the start's, split reads) and Spark SQL's (the by-key
        # write) fork their workers from one daemon, which the start brought up; else the
        # by-key write started a second daemon (importing Bulldozer again, about 1 s)
        "spark.executorEnv.SPARK_SIMPLIFIED_TRACEBACK": "1",
        "spark.sql.shuffle.partitions": "8",
        # Python workers forked with Bulldozer's modules already imported (``daemon``)
        "spark.python.daemon.module": "bulldozer.load.engines.spark.daemon",
        "spark.driver.memory": settings.spark_driver_memory,
        **(conf or {}),
    }
    catalog = properties or embedded_catalog_properties(home)
    java = spark_catalog_properties(catalog_name, catalog, settings.catalog_timeout)
    options.update({f"{prefix}.{k}": v for k, v in java.items()})
    # the jars: the driver's on its class path (``_driver_class_path``) once the packages are
    # resolved (a cluster's executors get the packages' files with Spark SQL, ``_sql_jars``),
    # else spark.jars: the packages', the run's, and Bulldozer's (the driver's from its
    # start; a context's jars reach executors only)
    jars = [(conf or {}).get("spark.jars", "")]
    if ours:
        options["spark.driver.extraClassPath"] = os.pathsep.join(map(str, ours))
    else:
        jars = [packages.get("spark.jars", ""), *jars, str(JAVA_JAR) if JAVA_JAR.is_file() else ""]
    options.pop("spark.jars", None)
    if any(jars):
        options["spark.jars"] = ",".join(filter(None, jars))
    options = with_operator_defaults(options, defaults)
    _ask_executors_for_their_archive(master, options)
    # A cluster's executors are asked for as the context starts, and Spark copies and
    # unpacks the context's archives on the driver before that: added once it runs, the
    # executors' environment is unpacked on the driver while their JVMs start. Measured
    # on the loopback cluster (3 interleaved pairs): the whole command 21.9 s against 23.0 s.
    archives = options.pop("spark.archives", "") if not master.startswith("local") else ""
    spark_conf = SparkConf(loadDefaults=False).setAll(list(options.items()))
    gateway = _start_driver(spark_conf)
    if "spark.jars.packages" in options:
        # spark-submit resolved the packages into its own spark.jars, with the jars given
        # (Bulldozer's): the context's settings would replace that with the jars given alone
        # (or none), and a cluster's executors would lack the packages
        resolved = gateway.jvm.java.lang.System.getProperty("spark.jars")
        if resolved:
            spark_conf.set("spark.jars", resolved)
    if probe is not None and (said := probe.web_server()) is not None:
        raise LoadError(
            f"the Spark master {master} is a web server, not a Spark master: {probe.node} answered {said!r} "
            "(a master takes applications on its own port, 7077 by default; its web UI's is 8080, its REST "
            "server's 6066)"
        )
    if probe is not None and not _authenticates(spark_conf, gateway) and probe.silent():
        raise LoadError(
            f"the Spark master {master} did not answer: what listens at {probe.node} took the connection and "
            f"said nothing in {_SILENT_SECONDS:.0f} s, where a Spark master answers at once (is it the master's "
            "port, 7077 by default? is a proxy or firewall holding the connection?)"
        )
    context = SparkContext(conf=spark_conf, gateway=gateway)
    if master.startswith("spark://") and context.applicationId.startswith(_UNREGISTERED_APPLICATION):
        # Something answered the probe but not as a master (a worker's port, a master that
        # requires authentication the driver lacks, another Spark version): Spark tried three
        # times, 20 s apart (its constants), and is stopping the context. The run failed with
        # a Java stack trace as its one line, from the first job of a stopped context.
        context.stop()
        raise LoadError(
            f"the Spark master {master} did not take the application: what listens there did not answer as a "
            "Spark master in a minute (is it the master's port, 7077 by default, and not a worker's? does the "
            "master require authentication, or run another Spark version?)"
        )
    if "spark.jars.packages" in options:
        _remember_jars(context.getConf().get("spark.jars", ""))
    context.setLogLevel(level)
    for archive in filter(None, archives.split(",")):
        _add_archive(context, archive)
    if archives:
        from bulldozer.load.engines.spark.package import EXECUTOR_PYTHON

        # the Python workers run the shipped environment's interpreter (package.archive_conf)
        context.pythonExec = EXECUTOR_PYTHON
    return context


def _ask_executors_for_their_archive(master: str, options: dict[str, str]) -> None:
    """On a standalone cluster (``spark://``), the executor JVMs start from their worker's
    class-data archive, made on the node by the first executor without one
    (``executor_archive``): its options go first in ``options``' executor Java options.
    Nothing when the operator's options say how the executors share classes (``-Xshare:``,
    an archive of their own): ``-Xshare:on`` with an archive not made yet would stop every
    executor."""
    executor = options.get("spark.executor.extraJavaOptions", "")
    if not master.startswith("spark://") or re.search(
        r"-Xshare:|-XX:(SharedArchiveFile|ArchiveClassesAtExit)", executor
    ):
        return
    import pyspark

    node = executor_archive.java_options(executor_archive.identity(pyspark.__version__, options))
    options["spark.executor.extraJavaOptions"] = " ".join([*node, executor]).strip()


#: The settings Bulldozer gives the driver that the operator's ``spark-defaults.conf`` may
#: give too, where both count: Spark takes a setting given to the context over the file's, so
#: the file's was dropped without a word (its Java options, its redaction of secrets, its
#: jars and SQL extensions). Each joins the two values: the JVMs' options the operator's last
#: (the JVM takes an option's last value, so theirs win), a name either pattern matches
#: redacted, both lists of jars, class path entries and extensions.
JOINED_WITH_DEFAULTS: dict[str, Callable[[str, str], str]] = {
    "spark.driver.extraJavaOptions": lambda ours, theirs: f"{ours} {theirs}",
    "spark.executor.extraJavaOptions": lambda ours, theirs: f"{ours} {theirs}",
    "spark.redaction.regex": lambda ours, theirs: f"(?:{ours})|(?:{theirs})",
    "spark.jars": lambda ours, theirs: f"{ours},{theirs}",
    "spark.driver.extraClassPath": lambda ours, theirs: f"{ours}{os.pathsep}{theirs}",
    "spark.sql.extensions": lambda ours, theirs: f"{ours},{theirs}",
}


def operator_spark_defaults() -> dict[str, str]:
    """The operator's Spark defaults: ``spark-defaults.conf`` in the configuration folder
    Spark's launcher reads, or the properties file ``PYSPARK_SUBMIT_ARGS`` names
    (``settings.spark_properties_files``), read as spark-submit reads them (Java properties
    files in UTF-8, bytes that are not UTF-8 replaced, each value trimmed); none without a
    file. One that cannot be read is one line, as spark-submit would refuse it."""
    import pyspark
    from jproperties import Properties, PropertyError

    settings: dict[str, str] = {}
    for path in spark_properties_files(Path(pyspark.__file__).parent):
        if not path.is_file():
            continue
        read = Properties()
        try:
            read.load(path.read_bytes().decode("utf-8", errors="replace"))
        except (OSError, PropertyError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)
            raise LoadError(f"the operator's Spark defaults {path} cannot be read: {why}") from None
        settings.update({str(key): str(value.data).strip() for key, value in read.items()})
    return settings


def with_operator_defaults(options: dict[str, str], defaults: dict[str, str]) -> dict[str, str]:
    """``options`` with the operator's ``defaults`` joined in where both count
    (``JOINED_WITH_DEFAULTS``). The other settings both give are Bulldozer's to set (its
    master, the driver's memory and address, its catalog...): their names, never their
    values, are logged once, as the file's values Spark will not use."""
    joined = dict(options)
    for key, join in JOINED_WITH_DEFAULTS.items():
        if options.get(key) and defaults.get(key):
            joined[key] = join(options[key], defaults[key])
    replaced = sorted(
        key
        for key, value in defaults.items()
        if key in options and key not in JOINED_WITH_DEFAULTS and value != options[key]
    )
    if replaced:
        log.info(
            "the Spark driver does not use these settings of the operator's spark-defaults.conf, which Bulldozer "
            "sets itself: %s",
            ", ".join(replaced),
        )
    return joined


def _driver_class_path(packages: dict[str, str]) -> list[Path]:
    """What the driver takes on its class path rather than as ``spark.jars``: the packages'
    files once resolved (``_packages``) and Bulldozer's jar if built. A ``local`` driver's JVM
    runs the tasks too; a cluster's executors get the packages' files with Spark SQL
    (``_sql_jars``). As ``spark.jars`` a local executor fetched each from the driver's file server
    into a folder of its own before its first task (0.35 s here, Iceberg's runtime and AWS
    bundle most of it), and their classes were outside the class-data archive. Measured on
    the 2-core machine, interleaved rounds (README, "Spark"): 2 M nested rows read in place,
    whole command median 6.30 -> 5.77 s (4 each); 1.6 M rows in one file by key 21.7-21.9 ->
    20.2-20.8 s (2 each)."""
    jars = [Path(jar) for jar in _package_files(packages)]
    return [*jars, JAVA_JAR] if JAVA_JAR.is_file() else jars


def _package_files(packages: dict[str, str]) -> list[str]:
    """The packages' resolved files (``_packages``' ``spark.jars``; none while resolving)."""
    return [jar for jar in packages.get("spark.jars", "").split(",") if jar]


def _sql_jars(master: str, packages: dict[str, str]) -> list[str]:
    """The packages' files a cluster's executors take only when Spark SQL starts on the
    context (``spark_session``: Iceberg's reader and writer, the by-key path), once resolved:
    the split reads' tasks run Python alone, and the executors fetched the jars from the
    driver before their first task (133 MB: Iceberg's runtime, its AWS bundle, the catalogs'
    JDBC drivers; 0.39 s of an executor's start in its log on the loopback cluster). Bulldozer's
    jar is the driver's alone. None for a local driver (its class path is the executor's) or
    packages being resolved (spark-submit puts them in ``spark.jars``)."""
    if master.startswith("local") or "spark.jars.packages" in packages:
        return []
    return _package_files(packages)


def _add_archive(context: Any, archive: str) -> None:
    """Add ``archive`` (an entry of ``spark.archives``) to ``context``: the environment
    ``bulldozer spark package`` built as a file beside its launcher, which the executors
    unpack themselves (``package.launcher_archive``: Spark would also unpack it on the
    driver, which never runs it); any other archive as Spark adds archives. Measured on the
    loopback cluster (2 M nested rows, 3 alternating runs each): see README."""
    import tempfile
    from urllib.parse import urlsplit
    from urllib.request import url2pathname

    from bulldozer.load.engines.spark.package import ARCHIVE_DIR, launcher_archive

    where = urlsplit(archive)
    if where.fragment == ARCHIVE_DIR and where.scheme in ("", "file"):
        environment = Path(url2pathname(where.path))
        launcher = launcher_archive(environment, Path(tempfile.mkdtemp(prefix="launcher-", dir=_driver_folder())))
        if launcher is not None:
            context.addFile(str(environment))
            context.addArchive(f"{launcher.as_uri()}#{ARCHIVE_DIR}")
            return
    context.addArchive(archive)


def _start_driver(conf: Any) -> Any:
    """Spark's JVM (started once per process, with ``conf``), to run contexts in:

    - in a folder of its own where ``bulldozer_env`` is this Python's environment. A
      cluster's executors run their Python workers as ``./bulldozer_env/bin/python`` (the
      shipped archive, unpacked in their working directory); Spark runs the data source's
      planning in Python workers on the driver with that same name, relative to the
      driver JVM's working directory — this folder;
    - with its stderr (spark-submit's dependency resolution, the JVM's own notices,
      log4j's console) read line by line into the ``bulldozer.spark`` logger at each
      line's level, so Spark says what Bulldozer's log level lets through and no more.
    """
    global _GATEWAY
    if _GATEWAY is not None:
        return _GATEWAY
    _py4j_to_the_spark_log()
    try:
        try:
            gateway = _launch(conf)
        except _Exited as exited:
            if exited.reason:
                raise
            # Seen under a loaded machine: the gateway JVM died while starting with no error
            # on stderr and the same command passed when run again: once more then. (One
            # cause, gRPC's fork handler killing the child before spark-submit ran, is gone:
            # _GatewayPopen.)
            said = f"its last line: {exited.last!r}" if exited.last else "it wrote nothing"
            log.warning("the Spark gateway JVM exited while starting without an error (%s); starting it again", said)
            gateway = _launch(conf)
    except _Exited as exited:
        reason = exited.reason or "it exited without saying why (its output is logged at debug level)"
        raise LoadError(f"Spark's driver did not start on {conf.get('spark.master')}: {reason}") from None
    _GATEWAY = gateway
    if _ARCHIVE_BUILD is not None:
        atexit.register(_finish_class_archive, gateway, *_ARCHIVE_BUILD)
    return gateway


def _py4j_to_the_spark_log() -> None:
    """py4j's log records (its WARNING and above) to the ``bulldozer.spark`` logger at DEBUG.

    py4j narrates its connections at INFO (down to "Closing down clientserver connection"
    from a finalizer at exit, after logging's streams closed). When Ctrl-C, SIGTERM or the
    run's time limit reaches the thread waiting on the JVM, it logs "KeyboardInterrupt while
    sending command." through the root logger (configuring it with ``basicConfig`` when it
    has no handler), then "Exception occurred while shutting down connection" through its
    own, each with a traceback: a run stopped during a Spark load printed both before its
    one line. What py4j reports is raised to Bulldozer as well, which says it in that line.
    A root logger without a handler gets ``logging.lastResort``, which prints what it printed
    before (WARNING and above, their message), so that ``basicConfig`` changes nothing; a
    host that configured logging (Airflow) keeps its own."""
    py4j = logging.getLogger("py4j")
    py4j.setLevel(logging.WARNING)
    py4j.propagate = False
    if not any(isinstance(h, _ToSparkDebug) for h in py4j.handlers):
        py4j.addHandler(_ToSparkDebug())
    root = logging.getLogger()
    if not any(isinstance(f, _Py4jRootRecords) for f in root.filters):
        root.addFilter(_Py4jRootRecords())
    if not root.handlers and logging.lastResort is not None:
        root.addHandler(logging.lastResort)


class _ToSparkDebug(logging.Handler):
    """A record to the ``bulldozer.spark`` logger at DEBUG, its traceback with it."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger("bulldozer.spark").debug("py4j: %s", record.getMessage(), exc_info=record.exc_info)


class _Py4jRootRecords(logging.Filter):
    """The root logger's records py4j made, to ``_ToSparkDebug`` instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "root" or f"{os.sep}py4j{os.sep}" not in record.pathname:
            return True
        _ToSparkDebug().emit(record)
        return False


class _Exited(Exception):
    """The gateway JVM exited while starting; ``reason``: its uncaught exception's message
    (empty without one), ``last``: the last line it wrote."""

    def __init__(self, reason: str, last: str) -> None:
        super().__init__(reason)
        self.reason, self.last = reason, last


class _GatewayPopen(dict[str, Any]):
    """The keyword arguments pyspark's ``launch_gateway`` starts the JVM with, less the
    ``preexec_fn`` it adds (to ignore SIGINT in the JVM): a Python function to run between
    fork and exec makes Python fork in full, and gRPC's fork handler then restarts its
    poller thread in the child, which dies on the epoll descriptor ``close_fds`` closed
    (SIGABRT, ``Epoll1Poller … epoll_wait error: Bad file descriptor``, grpc/grpc#43055,
    open for grpcio ≥ 1.80) before it runs spark-submit — whenever this process has a gRPC
    channel, as a run has its DAL's. Measured here with grpcio 1.85.3 and a channel busy in
    another thread: 13–15 of 500 such forks died, 0 of 500 without ``preexec_fn``. The
    JVM gets its own process group instead (``process_group``): a Ctrl-C at the terminal
    reaches Bulldozer and not the JVM, as pyspark means, and the JVM ends at the end of
    its stdin when this process does."""

    def __setitem__(self, key: str, value: Any) -> None:
        if key != "preexec_fn":
            super().__setitem__(key, value)


def gateway_popen_kwargs(**kwargs: Any) -> dict[str, Any]:
    """``popen_kwargs`` for pyspark's ``launch_gateway`` (``_GatewayPopen``) with ``kwargs``."""
    return _GatewayPopen(process_group=0, **kwargs)


#: the settings the driver JVM is started without (``_launch``): read by Spark SQL as a
#: catalog is first used, from the context's settings, they may hold the catalog's secrets
AFTER_LAUNCH_PREFIX = "spark.sql.catalog."
#: the settings whose values Spark hides wherever it writes its settings out (an event log
#: an operator's ``spark-defaults.conf`` enables, the environment ``spark.logConf`` logs):
#: those Spark's own default names, and every name ``bulldozer.redaction`` holds a secret's.
#: Spark's default missed a REST catalog's ``credential`` (its OAuth2 client secret), a
#: header's ``Authorization`` and ADLS's account key: an event log kept them in clear.
REDACTION_REGEX = f"(?i)secret|password|token|access[.]?key|{SECRET_SETTING}"


def _launch(conf: Any) -> Any:
    """pyspark's ``launch_gateway`` with the JVM's stderr on a pipe relayed from before it
    starts (``_relay``), so when the JVM exits while starting (spark-submit refusing its
    arguments) its reason is known: ``_Exited``.

    pyspark starts the JVM as ``spark-submit --conf KEY=VALUE …`` with every setting it is
    given, and a process's arguments are readable by every user of the machine
    (``/proc/PID/cmdline``, ``ps``) for as long as it runs: the catalog's settings — its
    S3 secret key, its database password, its REST credential — were. The JVM is started
    without them (``AFTER_LAUNCH_PREFIX``); the context gets them from Python over the
    gateway's socket, with the rest of its settings."""
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    conf = SparkConf(loadDefaults=False).setAll(
        [(key, value) for key, value in conf.getAll() if not key.startswith(AFTER_LAUNCH_PREFIX)]
    )

    read_end, write_end = os.pipe()
    failures: list[str] = []
    said: list[str] = []  # its last line
    relay = threading.Thread(target=_relay, args=(os.fdopen(read_end, "rb"), failures, said), name="spark-stderr")
    relay.daemon = True
    relay.start()
    # its stdout too: nothing of the JVM's reaches the command's own output (a run's --json;
    # the JVM said "Error occurred during initialization of VM" there when a run refused
    # before the load ended while it started, its folder removed under it)
    popen = gateway_popen_kwargs(cwd=str(_driver_folder()), stdout=write_end, stderr=write_end)
    # A process that ends while the JVM starts (a run stopped while its Spark start thread
    # waits here) removes the driver's folder, where the JVM writes its port, at exit:
    # registered after that removal, this ends the JVM first.
    atexit.register(_end_starting_gateway)
    try:
        with _temporary_files_in(_driver_folder()):
            return launch_gateway(conf, popen_kwargs=popen)  # type: ignore[no-untyped-call]
    except BaseException as exc:
        if not isinstance(exc, Exception) or "JAVA_GATEWAY_EXITED" not in str(exc):
            _end_starting_gateway()  # interrupted (Ctrl-C, SIGTERM, SIGHUP, the time limit) while it started
            raise
        os.close(write_end)
        write_end = -1
        relay.join(timeout=10)  # the JVM exited: the relay reads its last lines to the pipe's end
        raise _Exited(failures[-1] if failures else "", said[-1] if said else "") from None
    finally:
        atexit.unregister(_end_starting_gateway)
        if write_end >= 0:
            os.close(write_end)  # the JVM holds its own copy


def _end_starting_gateway(grace: float = 10.0) -> None:
    """End the gateway JVM this process was starting when ``launch_gateway`` was
    interrupted, or the process ended meanwhile: the folder the JVM writes its port to is
    removed then (by pyspark, or with the driver's folder), the JVM's main thread fails to
    write it and never watches its stdin (by whose end it exits with its driver), and
    py4j's server thread kept it running for good, 2 GiB of heap, after the run had ended.
    pyspark keeps no handle on it: it is this process's child that leads a process group of
    its own (``gateway_popen_kwargs``) and runs SparkSubmit."""
    import signal
    import time

    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        if fields[1] != me or fields[2] != entry.name or b"org.apache.spark.deploy.SparkSubmit" not in command:
            continue
        pid = int(entry.name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)  # its shutdown hooks remove what it extracted
        deadline = time.monotonic() + grace
        while not _reaped(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _reaped(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _reaped(pid: int) -> bool:
    """Whether this process's child ``pid`` has ended (and is reaped now)."""
    try:
        return os.waitpid(pid, os.WNOHANG) != (0, 0)
    except ChildProcessError:
        return True


@contextlib.contextmanager
def _temporary_files_in(folder: Path) -> Iterator[None]:
    """Python's temporary files in ``folder`` meanwhile (``tempfile.tempdir``). pyspark's
    ``launch_gateway`` makes a folder in the temporary directory for the JVM to write its
    port and secret to, removed once read: a run killed while the JVM started left it in
    /tmp. In the driver's scratch folder it goes with that folder, at exit or by the next
    Bulldozer process (``bulldozer.scratch``)."""
    import tempfile

    saved = tempfile.tempdir
    tempfile.tempdir = str(folder)
    try:
        yield
    finally:
        tempfile.tempdir = saved


_GATEWAY: Any = None
_DRIVER_FOLDER: Path | None = None
#: (partial, final) paths of the class-data archive this process's driver JVM writes at exit
_ARCHIVE_BUILD: tuple[Path, Path] | None = None


def _jars_record() -> Path:
    """Where the local paths of the packages' jars, as Spark resolved them, are kept."""
    key = hashlib.sha256(",".join(PACKAGES).encode()).hexdigest()[:16]
    return load_settings().cache_folder() / "spark" / f"jars-{key}.txt"


def _packages() -> dict[str, str]:
    """The driver's ``PACKAGES`` (Iceberg's runtime and AWS bundle, the JDBC drivers):
    ``spark.jars`` with the local files an earlier start resolved (kept by
    ``_remember_jars``; all must still exist), else
    ``spark.jars.packages`` (spark-submit resolves them through Ivy: fetched from Maven
    Central the first time, checked against Ivy's cache on every start). Measured here: the
    driver starts ≈ 0.3–0.5 s sooner with the files than with the packages."""
    try:
        jars = _jars_record().read_text().split()
    except OSError:
        jars = []
    if len(jars) == len(PACKAGES) and all(Path(jar).is_file() for jar in jars):
        return {"spark.jars": ",".join(jars)}
    return {"spark.jars.packages": ",".join(PACKAGES), "spark.jars.excludes": EXCLUDED}


@contextlib.contextmanager
def _resolving(ivy: str | None = None) -> Iterator[dict[str, str]]:
    """The driver's packages (``_packages``) for a context started inside the block, with
    the packages' resolution one process at a time (``bulldozer.locks``).

    Ivy's resolution is not safe to run twice at once in one Ivy home: two drivers starting
    together on a machine that had not resolved the packages yet both failed (``download
    failed: ...iceberg-spark-runtime...jar``, ``FileNotFoundException
    .../sqlite-jdbc-3.46.1.3.jar``), as two Airflow tasks or two test workers do. So a start
    that must resolve holds the lock of that Ivy home (``spark.jars.ivy``, else Spark's
    default ``~/.ivy2.5.2``) until its driver runs and ``_remember_jars`` kept the files,
    and a start that waited for it reads the packages again: the files the other resolved."""
    packages = _packages()
    if "spark.jars.packages" not in packages:
        yield packages
        return
    home = Path(ivy).expanduser() if ivy else Path.home() / ".ivy2.5.2"
    with locks.held(home / "bulldozer-resolve.lock", "resolving Spark's packages"):
        yield _packages()  # resolved by the process this one waited for, if it did


def _remember_jars(resolved: str) -> None:
    """Keep the local files spark-submit resolved the packages to (``spark.jars`` of a
    context started with ``spark.jars.packages``) for the next start: each package's by the
    name Ivy gives its file (``GROUP_ARTIFACT-VERSION.jar``), the other jars given with them
    (Bulldozer's, the operator's ``spark.jars``) left out. Counted by number instead, the
    operator's jars made every start resolve again, and a local one without an archive."""
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    uris = [urlparse(jar) for jar in resolved.split(",") if jar]
    files = {Path(url2pathname(uri.path)).name: url2pathname(uri.path) for uri in uris if uri.scheme in ("file", "")}
    names = ["{}_{}-{}.jar".format(*package.split(":")) for package in PACKAGES]
    jars = [files.get(name, "") for name in names]
    if not all(jar and Path(jar).is_file() for jar in jars):
        return
    record = _jars_record()
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        partial = scratch.partial_path(record)
        partial.write_text("\n".join(jars) + "\n")
        os.replace(partial, record)
    except OSError as exc:  # only an optimisation
        log.debug("could not keep the resolved Spark jars (%s)", exc)


def class_archive_path(class_path: Sequence[Path] = ()) -> Path | None:
    """The driver JVM's class-data-sharing archive for this Java, pyspark install and Iceberg
    runtime, with ``class_path`` (the files of ``spark.driver.extraClassPath``) on its class
    path (in Bulldozer's cache; it may not exist yet), or None without a ``java``."""
    import pyspark

    java = java_executable()
    if java is None:
        return None
    java = java.resolve()
    # the JVM build and the class path (Spark's jars where this pyspark is, the packages,
    # Bulldozer's jar), its files with their sizes and times: the JVM ignores an archive
    # whose class path files changed, silently. A new virtualenv (its pyspark's jars
    # installed again, the same version) kept finding the old name, and every driver of it
    # started without the archive: 6.5-7.9 s against 3.9-5.0 s (2 M nested rows, local[2]).
    parts = (
        java,
        java.stat().st_mtime_ns,
        pyspark.__file__,
        pyspark.__version__,
        *PACKAGES,
        *_class_path_files(class_path),
    )
    identity = "|".join(str(part) for part in parts)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return load_settings().cache_folder() / "spark" / f"driver-{digest}.jsa"


def _class_path_files(class_path: Sequence[Path] = ()) -> list[str]:
    """The driver's class path files as the JVM checks an archive against them: Spark's
    jars, Bulldozer's and ``class_path``'s, each with its size and modification time."""
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    files = []
    for jar in dict.fromkeys([*jars, JAVA_JAR, *class_path]):  # Bulldozer's counted once (a local driver's too)
        with contextlib.suppress(OSError):  # Bulldozer's jar is not built: none on the class path
            stat = jar.stat()
            files.append(f"{jar}:{stat.st_size}:{stat.st_mtime_ns}")
    return files


def _class_archive_options(class_path: Sequence[Path] = (), make: bool = True) -> list[str]:
    """The driver JVM's options for class data sharing (AppCDS): start from the archive of
    the classes an earlier driver loaded, or write that archive when this JVM exits (the
    first Spark run of a machine: the archive is complete once the JVM exited cleanly,
    ``_finish_class_archive``). The JVM checks an archive against its own build and class
    path and ignores one that does not match. Its warnings (classes it cannot archive) are
    off, and the JVM's other warnings go to stderr (relayed) instead of the command's
    stdout. Measured here (2 cores, ``local[2]``, 3 runs each): the session starts in
    3.6–4.0 s against 6.1–8.7 s, and its first Python job takes 1.9–2.2 s against 2.8–3.8 s.
    ``make``: False, an archive that does not exist yet is not made by this driver."""
    global _ARCHIVE_BUILD
    _ARCHIVE_BUILD = None  # what these options ask of this driver decides, not an earlier call's
    path = class_archive_path(class_path)
    if path is None:
        return []
    crowded = _crowded_class_path(class_path)
    if crowded:
        log.info(
            "the Spark driver starts without a class-data archive: its class path holds the folder %s, which Java's "
            "class-data sharing refuses (an archive is neither made nor used while a folder with files is on it)",
            crowded,
        )
        return []
    quiet = " ".join(executor_archive.QUIET)
    scratch.sweep_partials(path.parent, "*.jsa.*.partial")
    if path.exists():
        with contextlib.suppress(OSError):
            os.utime(path)  # used now (``_drop_unused_class_archives``)
        return [f"-XX:SharedArchiveFile={path}", quiet]
    if not make:
        return []
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return []
    partial = scratch.partial_path(path)
    _ARCHIVE_BUILD = (partial, path)
    return [f"-XX:ArchiveClassesAtExit={partial}", quiet]


def _crowded_class_path(class_path: Sequence[Path] = ()) -> str:
    """The first folder holding files that the driver JVM's class path will have (named with
    the variable that put it there), or "". Java's class-data sharing refuses those: a JVM
    asked to write an archive writes none, and one asked to start from an archive ignores
    it. Every run then paid for the attempt: with an operator's ``SPARK_CONF_DIR`` (a
    ``spark-defaults.conf`` in it), ``local[2]`` on 2 M nested rows took 19.1-19.7 s against
    11.7 s with the archive, the driver asked to write one at each exit. Without the options
    such a run takes what a driver without an archive does."""
    import pyspark

    folders = spark_class_path_folders(Path(pyspark.__file__).parent)
    folders += [("spark.driver.extraClassPath", entry) for entry in class_path]
    for variable, folder in folders:
        if folder.name == "*":  # Java's wildcard: every jar of the folder
            return f"{folder} ({variable})"
        with contextlib.suppress(OSError):
            if folder.is_dir() and any(folder.iterdir()):
                return f"{folder} ({variable})"
    return ""


def _finish_class_archive(gateway: Any, partial: Path, final: Path) -> None:
    """At exit of the process whose driver JVM writes the class-data archive: stop Spark,
    let the JVM exit (it writes the archive as it does, ≈ 5 s once per machine) and keep the
    archive only when the JVM exited cleanly (a killed one leaves a partial file, deleted)."""
    try:
        stop_spark_session()
        gateway.proc.stdin.close()  # pyspark's gateway server exits at the end of its input
        gateway.proc.wait(timeout=120)
    except Exception as exc:  # exiting: the archive is only an optimisation
        log.debug("the Spark driver did not exit cleanly (%s); no class-data archive", exc)
    if gateway.proc.returncode == 0 and partial.exists() and partial.stat().st_size:
        os.replace(partial, final)
        _drop_unused_class_archives(final)
    else:
        partial.unlink(missing_ok=True)


#: the class-data archives kept besides one just made: those started from last
CLASS_ARCHIVES_KEPT = 2


def _drop_unused_class_archives(made: Path) -> None:
    """Delete the other drivers' archives (~70 MB each) but the ``CLASS_ARCHIVES_KEPT`` a
    start used last (each start marks its archive used): every virtualenv made again (a CI
    run's) makes one, which nothing starts from once it is gone. A driver running from one
    deleted keeps its mapping; one starting from it runs without (the JVM says nothing)."""
    others = []
    for other in made.parent.glob("driver-*.jsa"):
        with contextlib.suppress(OSError):
            if other != made:
                others.append((other.stat().st_mtime, other))
    for _, other in sorted(others, reverse=True)[CLASS_ARCHIVES_KEPT:]:
        with contextlib.suppress(OSError):
            other.unlink()


#: ``26/11/25 14:57:13 WARN Utils: message`` (the layout of log4j2.properties)
_LOG_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) (.*)$")
#: ``Exception in thread "main" org.apache.spark.SparkException: Master must either be…``
_UNCAUGHT = re.compile(r'^Exception in thread "[^"]*" ([\w.$]+)(?:: (.*))?$')
_PYTHON_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
}


def _relay(stream: Any, failures: list[str], said: list[str]) -> None:
    """Spark's output (the driver JVM's stderr and stdout) into the ``bulldozer.spark``
    logger: a log line at its level (the lines of a stack trace after it too), anything
    else (ivy's resolution report, the JVM's notices) at DEBUG. The message of each
    uncaught exception's line (spark-submit refusing its arguments) goes to ``failures``;
    the last line read is ``said[-1]``."""
    spark_log = logging.getLogger("bulldozer.spark")
    level = logging.DEBUG
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip()
        if not line:
            continue
        said[:] = [line]
        uncaught = _UNCAUGHT.match(line)
        if uncaught is not None:
            failures.append(uncaught.group(2) or uncaught.group(1))
        match = _LOG_LINE.match(line)
        if match is not None:
            level = _PYTHON_LEVELS[match.group(1)]
            spark_log.log(level, "%s", match.group(2))
        elif line[0].isspace() or line.startswith(("Caused by", "\tat ")):
            spark_log.log(level, "%s", line)  # a stack trace: at its log line's level
        else:
            level = logging.DEBUG
            spark_log.debug("%s", line)


def _driver_folder() -> Path:
    global _DRIVER_FOLDER
    if _DRIVER_FOLDER is None:
        from bulldozer.load.engines.spark.package import ARCHIVE_DIR

        folder = scratch.make("spark-driver")
        atexit.register(scratch.remove, folder)
        env = folder / ARCHIVE_DIR
        if sys.prefix != sys.base_prefix:  # a virtualenv: its bin/python finds its pyvenv.cfg
            env.symlink_to(sys.prefix, target_is_directory=True)
        else:
            (env / "bin").mkdir(parents=True)
            (env / "bin" / "python").symlink_to(sys.executable)
        _DRIVER_FOLDER = folder
    return _DRIVER_FOLDER


def _driver_tmp() -> Path:
    """The driver JVM's temporary directory, in the driver's scratch folder."""
    tmp = _driver_folder() / "tmp"
    tmp.mkdir(exist_ok=True)
    return tmp


def stop_spark_session() -> None:
    """Stop the context ``spark_context`` keeps and its session (a no-op without one)."""
    global _SESSION, _CONTEXT, _CONTEXT_KEY, _SQL_JARS
    if _SESSION is not None:
        _SESSION.stop()
    elif _CONTEXT is not None:
        _CONTEXT.stop()
    _SESSION, _CONTEXT, _CONTEXT_KEY, _SQL_JARS = None, None, (), []


#: log4j2 configuration of the driver: the console at ``-Dbulldozer.spark.level``
_LOG4J2 = Path(__file__).with_name("log4j2.properties")
_LEVELS = {logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARN", logging.ERROR: "ERROR"}


def spark_log_level() -> str:
    """Spark's log level for Bulldozer's (the ``bulldozer`` logger's effective level):
    DEBUG, INFO, WARN, ERROR or FATAL."""
    level = logging.getLogger("bulldozer").getEffectiveLevel()
    for threshold in sorted(_LEVELS, reverse=True):
        if level >= threshold:
            return _LEVELS[threshold] if level < logging.CRITICAL else "FATAL"
    return "DEBUG"
