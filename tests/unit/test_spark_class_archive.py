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
