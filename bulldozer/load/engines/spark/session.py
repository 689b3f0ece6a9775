"""The SparkSession Bulldozer runs on: Iceberg's Spark runtime and the catalog of the job.

For the embedded warehouse the catalog is a JDBC catalog on the very SQLite file pyiceberg
writes (the catalog names match: ``lake``). One session is kept while the catalog, home and
master stay the same (Spark catalogs load once). Spark's own log level follows Bulldozer's
(``bulldozer`` logger), and its console progress bar is off unless asked for (``-q`` and
non-terminal runs never show it).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bulldozer.settings import load_settings, pyspark_python
from bulldozer.warehouse.catalog import bulldozer_home

log = logging.getLogger(__name__)

__all__ = ["ICEBERG_RUNTIME", "SQLITE_JDBC", "spark_log_level", "spark_session", "stop_spark_session"]

ICEBERG_RUNTIME = "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0"
SQLITE_JDBC = "org.xerial:sqlite-jdbc:3.46.1.3"
_SESSION: Any = None
_SESSION_KEY: tuple[object, ...] = ()


def spark_session(
    catalog_name: str = "lake",
    properties: dict[str, str] | None = None,
    home: str | None = None,
    master: str | None = None,
    conf: dict[str, str] | None = None,
) -> Any:
    """A SparkSession with the Iceberg catalog configured, reused while the catalog, home,
    master and ``conf`` (extra Spark properties, e.g. ``spark.archives``) are the same."""
    global _SESSION, _SESSION_KEY
    key = (
        catalog_name,
        tuple(sorted((properties or {}).items())),
        str(bulldozer_home(home)),
        master,
        tuple(sorted((conf or {}).items())),
    )
    if _SESSION is not None:
        if key == _SESSION_KEY:
            return _SESSION
        stop_spark_session()
    from pyspark.sql import SparkSession

    pyspark_python()
    settings = load_settings()
    master = master or settings.spark_master
    level = spark_log_level()
    prefix = f"spark.sql.catalog.{catalog_name}"
    builder = (
        SparkSession.builder.appName("bulldozer")
        .master(master)
        .config("spark.jars.packages", f"{ICEBERG_RUNTIME},{SQLITE_JDBC}")
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config(prefix, "org.apache.iceberg.spark.SparkCatalog")
        .config(f"{prefix}.cache-enabled", "false")  # each run must see the latest snapshots
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        # Bulldozer shows its own progress (or none: -q, no terminal); Spark's bar would
        # write over it
        .config("spark.ui.showConsoleProgress", "false")
        # Spark logs at Bulldozer's level from the JVM's first line on (not only after
        # setLogLevel): the driver reads the shipped log4j2 configuration
        .config(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={_LOG4J2} -Dbulldozer.spark.level={level}"
        )
        .config("spark.driver.host", settings.spark_driver_host)
        .config("spark.driver.bindAddress", settings.spark_driver_host)
        # the batches of the Python workers land in jemalloc's pool (bulldozer.cli.process)
        .config("spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.driver.memory", settings.spark_driver_memory)
    )
    for prop, value in (conf or {}).items():
        builder = builder.config(prop, value)
    if properties:
        for prop, value in properties.items():
            builder = builder.config(f"{prefix}.{prop}", value)
    else:
        root = bulldozer_home(home)
        builder = (
            builder.config(f"{prefix}.type", "jdbc")
            .config(f"{prefix}.uri", f"jdbc:sqlite:{root / 'catalog.db'}")
            .config(f"{prefix}.warehouse", (root / "warehouse").as_uri())
        )
    with _in_driver_folder():
        try:
            _SESSION = builder.getOrCreate()
        except Exception as exc:
            # Seen once under a loaded CI machine: the gateway JVM died silently while starting
            # (nothing on stderr) and the same command passed when run again. Start it once more.
            if "JAVA_GATEWAY_EXITED" not in str(exc):
                raise
            log.warning("the Spark gateway JVM exited while starting (%s); starting it once more", exc)
            _SESSION = builder.getOrCreate()
    _SESSION.sparkContext.setLogLevel(level)
    if "spark.archives" in (conf or {}) and not master.startswith("local"):
        from bulldozer.load.engines.spark.package import EXECUTOR_PYTHON

        # the Python workers run the shipped environment's interpreter (package.archive_conf)
        _SESSION.sparkContext.pythonExec = EXECUTOR_PYTHON
    _SESSION_KEY = key
    return _SESSION


@contextlib.contextmanager
def _in_driver_folder() -> Iterator[None]:
    """Start Spark's JVM in a folder of its own where ``bulldozer_env`` is this Python's
    environment. A cluster's executors run their Python workers as
    ``./bulldozer_env/bin/python`` (the shipped archive, unpacked in their working
    directory); Spark runs the data source's planning in Python workers on the driver
    with that same name, relative to the driver JVM's working directory — this folder."""
    import sys
    import tempfile

    from pyspark import SparkContext

    from bulldozer.load.engines.spark.package import ARCHIVE_DIR

    if SparkContext._gateway is not None:  # the JVM runs (started here before)
        yield
        return
    global _DRIVER_FOLDER
    if _DRIVER_FOLDER is None:
        folder = Path(tempfile.mkdtemp(prefix="bulldozer-spark-driver-"))
        atexit.register(shutil.rmtree, folder, True)
        env = folder / ARCHIVE_DIR
        if sys.prefix != sys.base_prefix:  # a virtualenv: its bin/python finds its pyvenv.cfg
            env.symlink_to(sys.prefix, target_is_directory=True)
        else:
            (env / "bin").mkdir(parents=True)
            (env / "bin" / "python").symlink_to(sys.executable)
        _DRIVER_FOLDER = folder
    before = os.getcwd()
    os.chdir(_DRIVER_FOLDER)
    try:
        yield
    finally:
        os.chdir(before)


_DRIVER_FOLDER: Path | None = None


def stop_spark_session() -> None:
    """Stop the session ``spark_session`` keeps (a no-op without one)."""
    global _SESSION, _SESSION_KEY
    if _SESSION is not None:
        _SESSION.stop()
        _SESSION, _SESSION_KEY = None, ()


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
