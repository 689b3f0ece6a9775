"""The driver JVM's class-data archive (``session.class_archive_path``): named for what the
JVM checks it against, so a class path whose files changed gets a new one instead of an
archive the JVM ignores without a word; the archives nothing starts from any more go."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bulldozer.load.engines.spark import session


def test_a_class_path_file_changed_names_another_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A virtualenv made again installs pyspark's jars again (same version, new times), and
    a rebuilt Bulldozer jar changes too: the JVM would refuse the old archive."""
    monkeypatch.setenv("BULLDOZER_CACHE", str(tmp_path / "cache"))
    jar = tmp_path / "bulldozer-iceberg.jar"
    jar.write_bytes(b"PK\x05\x06" + bytes(18))
    monkeypatch.setattr(session, "JAVA_JAR", jar)
    before = session.class_archive_path()
    assert before is not None and before.parent == tmp_path / "cache" / "spark"
    assert session.class_archive_path() == before  # the same files: the same archive
    os.utime(jar, (time.time() - 60, time.time() - 60))
    assert session.class_archive_path() != before
    jar.unlink()  # not built: not on the class path
    assert session.class_archive_path() not in (before, None)


def test_a_new_archive_keeps_the_two_others_started_from_last(tmp_path: Path) -> None:
    made = tmp_path / "driver-new.jsa"
    made.write_bytes(b"new")
    ages = {"driver-a.jsa": 50, "driver-b.jsa": 40, "driver-c.jsa": 30, "driver-d.jsa": 20, "jars-1.txt": 99}
    for name, age in ages.items():
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (time.time() - age * 3600, time.time() - age * 3600))
    session._drop_unused_class_archives(made)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "driver-c.jsa",
        "driver-d.jsa",
        "driver-new.jsa",
        "jars-1.txt",
    ]


def test_a_driver_starting_from_an_archive_marks_it_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BULLDOZER_CACHE", str(tmp_path / "cache"))
    path = session.class_archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    path.chmod(0o444)  # as the JVM leaves it
    os.utime(path, (0, 0))
    assert session._class_archive_options()[0] == f"-XX:SharedArchiveFile={path}"
    assert time.time() - path.stat().st_mtime < 60


def test_a_folder_with_files_on_the_driver_s_class_path_gets_no_archive_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Java refuses class-data sharing with a folder holding files on the class path (it
    writes no archive and ignores one), and Spark's launcher puts the operator's
    ``SPARK_CONF_DIR`` there: asked to write an archive at every exit, each such driver
    paid for the attempt (19.1-19.7 s against 13.9-14.6 s without the options)."""
    monkeypatch.setenv("BULLDOZER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(session, "_ARCHIVE_BUILD", None)  # restored after: no driver here writes one
    for name in ("SPARK_CONF_DIR", "SPARK_HOME", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH"):
        monkeypatch.delenv(name, raising=False)
    conf = tmp_path / "conf"
    conf.mkdir()
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    assert session._class_archive_options()[0].startswith("-XX:ArchiveClassesAtExit=")  # empty: harmless
    (conf / "spark-defaults.conf").write_text("spark.eventLog.enabled true\n")
    assert session._class_archive_options() == []
    assert session._ARCHIVE_BUILD is None  # the earlier call's build is not this driver's
    monkeypatch.delenv("SPARK_CONF_DIR")
    assert session._class_archive_options() != []
    hadoop = tmp_path / "hadoop"
    hadoop.mkdir()
    (hadoop / "core-site.xml").write_text("<configuration/>")
    monkeypatch.setenv("HADOOP_CONF_DIR", str(hadoop))
    assert session._crowded_class_path() == f"{hadoop} (HADOOP_CONF_DIR)"
    assert session._class_archive_options() == []


def test_the_class_path_folders_are_those_spark_s_launcher_adds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bulldozer.settings import spark_class_path_folders

    for name in ("SPARK_CONF_DIR", "SPARK_HOME", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH"):
        monkeypatch.delenv(name, raising=False)
    assert spark_class_path_folders(tmp_path) == [("SPARK_HOME/conf", tmp_path / "conf")]
    monkeypatch.setenv("SPARK_HOME", "/opt/spark")
    monkeypatch.setenv("YARN_CONF_DIR", "/etc/yarn")
    monkeypatch.setenv("SPARK_DIST_CLASSPATH", "/etc/hive:/opt/hadoop/jars/*")
    assert spark_class_path_folders(tmp_path) == [
        ("SPARK_HOME/conf", Path("/opt/spark/conf")),
        ("YARN_CONF_DIR", Path("/etc/yarn")),
        ("SPARK_DIST_CLASSPATH", Path("/etc/hive")),
    ]
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "c"))
    assert spark_class_path_folders(tmp_path)[0] == ("SPARK_CONF_DIR", tmp_path / "c")
