"""Spark's zips on a Python worker's path, unpacked and compiled once in the user's cache
(``node_cache.unzipped_spark_path``, which the executors' worker daemon applies before it
imports pyspark). The zips here are small ones under Spark's names; the Spark suites check
the real ones (``test_spark_datasource.py``, ``test_spark_cluster.py``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bulldozer.load.engines.spark.node_cache import unzipped_spark_path


def _zips(folder: Path) -> list[str]:
    """A ``pyspark.zip`` and a py4j source zip as Spark ships them (modules as source)."""
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / "pyspark.zip", "w") as packed:
        packed.writestr("pyspark/__init__.py", "")
        packed.writestr("pyspark/probe.py", "WHERE = __file__\n")
        packed.writestr("pyspark/pandas/frame.py", "")  # pyspark's pandas API: not compiled
    with zipfile.ZipFile(folder / "py4j-0.10.9.9-src.zip", "w") as packed:
        packed.writestr("py4j/__init__.py", "WHERE = __file__\n")
    return [str(folder / "pyspark.zip"), str(folder / "py4j-0.10.9.9-src.zip")]


def test_spark_s_zips_are_unpacked_once_with_their_bytecode_and_the_rest_of_the_path_kept(tmp_path: Path) -> None:
    zips, cache = _zips(tmp_path / "lib"), tmp_path / "cache" / "spark-python"
    path = ["/work/site-packages", *zips, "/other.zip"]
    # several daemons at once on a cold node: each gets complete folders, one of each is left
    with ThreadPoolExecutor(4) as pool:
        found = list(pool.map(lambda _: unzipped_spark_path(path, str(cache)), range(4)))
    assert all(p == found[0] for p in found)
    unzipped = found[0]
    assert unzipped[0] == "/work/site-packages" and unzipped[-1] == "/other.zip"
    assert all(Path(p).parent == cache for p in unzipped[1:3]) and len(os.listdir(cache)) == 2
    assert (cache.stat().st_mode & 0o777) == 0o700
    # the modules' bytecode is there, unchecked hash-based (PEP 552), and a worker imports
    # them from the folder, whatever PYTHONDONTWRITEBYTECODE says
    probe = Path(unzipped[1]) / "pyspark" / "probe.py"
    pyc = Path(importlib.util.cache_from_source(str(probe))).read_bytes()
    assert pyc[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(pyc[4:8], "little") == 0b01
    frame = Path(unzipped[1]) / "pyspark" / "pandas" / "frame.py"
    assert frame.is_file() and not Path(importlib.util.cache_from_source(str(frame))).exists()
    done = subprocess.run(
        [sys.executable, "-c", "import pyspark.probe, py4j; print(pyspark.probe.WHERE); print(py4j.WHERE)"],
        env={"PYTHONPATH": os.pathsep.join(unzipped[1:3]), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == [str(probe), str(Path(unzipped[2]) / "py4j" / "__init__.py")]
    # a later start finds them: nothing unpacked again, the folders marked used
    os.utime(unzipped[1], (0, 0))
    probe.with_name("marker").write_text("kept")
    assert unzipped_spark_path(path, str(cache)) == unzipped
    assert probe.with_name("marker").read_text() == "kept" and time.time() - Path(unzipped[1]).stat().st_mtime < 60
    # another Spark's zip (other content) gets a folder of its own
    with zipfile.ZipFile(zips[0], "a") as packed:
        packed.writestr("pyspark/new.py", "")
    assert unzipped_spark_path(path, str(cache))[1] != unzipped[1]


def test_a_path_without_spark_s_zips_or_a_cache_not_the_user_s_own_is_left_as_it_is(tmp_path: Path) -> None:
    zips = _zips(tmp_path / "lib")
    assert unzipped_spark_path(["/a", "/b.zip"], str(tmp_path / "unused")) == ["/a", "/b.zip"]
    assert not (tmp_path / "unused").exists()
    # a link in the cache's place (to wherever it leads): its content could be anyone's
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "linked").symlink_to(elsewhere)
    assert unzipped_spark_path(zips, str(tmp_path / "linked")) == zips
    assert os.listdir(elsewhere) == []
    if os.geteuid() == 0:  # where the suite may give a folder away
        given = tmp_path / "given"
        given.mkdir(mode=0o700)
        os.chown(given, 65534, 65534)
        assert unzipped_spark_path(zips, str(given)) == zips and os.listdir(given) == []
    # a cache that cannot be made (a file in its way)
    (tmp_path / "file").write_text("")
    assert unzipped_spark_path(zips, str(tmp_path / "file" / "cache")) == zips


def test_a_zip_that_cannot_be_read_stays_on_the_path(tmp_path: Path) -> None:
    zips, cache = _zips(tmp_path / "lib"), tmp_path / "cache"
    Path(zips[0]).write_bytes(b"not a zip")
    unzipped = unzipped_spark_path(zips, str(cache))
    assert unzipped[0] == zips[0] and Path(unzipped[1]).parent == cache
    assert [name for name in os.listdir(cache) if name.startswith(".")] == []  # nothing half unpacked left
