"""The Python worker daemon of Bulldozer's Spark sessions (``spark.python.daemon.module``).

Spark starts one daemon per executor and forks a Python worker from it for each task; a
fresh worker then imports what the task's function needs. This daemon imports what a
Bulldozer write task needs (the writer, the encoder and digest kernels, the DAL client,
pyiceberg's Arrow reader) before it forks, so every worker starts with them loaded instead
of importing them itself, each while the others do. Measured on the 2-core machine (2 M
nested rows in two files, ``local[2]``, three runs each way): from the session being ready
to the load's end, median 6.05 s against 6.94 s with Spark's own daemon. It then runs
Spark's own daemon (``pyspark.daemon``), unchanged. Nothing here starts a
thread or opens a connection, so forking stays safe (the tasks open their own).

Before any of it, Spark's ``pyspark.zip`` and py4j's on its path are replaced by the
folders they are unpacked in, in the user's cache (``node_cache.unzipped_spark_path``):
pyspark is then imported with bytecode instead of compiled from the zip at every start.
So nothing this module's package imports may import pyspark (``SparkEngine.load`` imports
the data source when it runs).
"""

from __future__ import annotations

import sys

from bulldozer.errors import BulldozerError
from bulldozer.load.engines.spark.executor_archive import ensure as ensure_executor_archive
from bulldozer.load.engines.spark.node_cache import unzipped_spark_path
from bulldozer.settings import load_settings


def _imported_with_bytecode() -> None:
    """Spark's zips on ``sys.path`` as unpacked folders, in ``cache_folder()/spark-python``
    (an executor has no ``BULLDOZER_*`` variable: ``~/.cache/bulldozer``, as the launcher's
    environments); left as they are if the settings cannot be read (the run's own process
    reports those)."""
    try:
        cache = load_settings().cache_folder() / "spark-python"
    except BulldozerError:
        return
    sys.path[:] = unzipped_spark_path(sys.path, str(cache))


_imported_with_bytecode()
ensure_executor_archive()  # before the imports: the build it may start forks a smaller process

import pyiceberg.io.pyarrow  # noqa: E402, F401
from pyspark import daemon  # noqa: E402

import bulldozer.codec.digest  # noqa: E402
import bulldozer.kv.client  # noqa: E402
import bulldozer.load.encoder.encode  # noqa: E402
import bulldozer.load.engines.spark.datasource  # noqa: E402, F401

if __name__ == "__main__":
    daemon.manager()  # type: ignore[no-untyped-call]
