"""The class-data archive of a standalone cluster's executor JVMs (``executor_archive``): the
driver's options, the dump command built from an executor's command line, and the guards
of ``ensure`` and ``build`` — here with stand-in processes whose command lines read as an
executor JVM's. The real JVMs, the dump and the mapping are checked on the test cluster
(``test_spark_cluster.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bulldozer.load.engines.spark import executor_archive
from bulldozer.load.engines.spark.executor_archive import (
    ARCHIVE,
    CLASS_LIST,
    EXECUTOR_MAIN,
    dump_command,
    ensure,
    identity,
    java_options,
)

_EXECUTOR_ARGS = [
    "/usr/lib/jvm/java-17/bin/java",
    "-cp",
    "/opt/spark/conf:/opt/spark/jars/*",
    "-Xmx1024M",
    "--add-modules=jdk.incubator.vector",
    "-XX:SharedArchiveFile=../../bulldozer-executor-0123456789abcdef.jsa",
    f"-XX:DumpLoadedClassList={CLASS_LIST}",
    "-Xlog:disable",
    "-Xlog:all=warning,cds*=off:stderr",
    "-XX:Tier4InvocationThreshold=50000",
    EXECUTOR_MAIN,
    "--driver-url",
    "spark://CoarseGrainedScheduler@127.0.0.1:45121",
    "--executor-id",
    "0",
]


def test_applications_of_one_configuration_share_an_archive_another_class_path_gets_its_own() -> None:
    base = {"spark.executor.extraJavaOptions": "-Dapp={{APP_ID}} -Dx=1", "spark.app.name": "a"}
    ident = identity("4.1.4", base)
    assert ARCHIVE.fullmatch(f"bulldozer-executor-{ident}.jsa")
    # Spark's per-application placeholders and the settings the JVM never sees do not count
    assert (
        identity("4.1.4", {**base, "spark.executor.extraJavaOptions": "-Dapp= -Dx=1", "spark.app.name": "b"}) == ident
    )
    assert identity("4.1.4", {**base, "spark.executor.extraClassPath": "/opt/extra.jar"}) != ident
    assert identity("4.1.4", {**base, "spark.executor.extraJavaOptions": "-Dx=2"}) != ident
    assert identity("4.1.5", base) != ident


def test_the_options_name_the_archive_in_the_worker_folder_and_list_the_classes() -> None:
    options = java_options("0123456789abcdef")
    assert options[:2] == [
        "-XX:SharedArchiveFile=../../bulldozer-executor-0123456789abcdef.jsa",
        f"-XX:DumpLoadedClassList={CLASS_LIST}",
    ]
    assert set(executor_archive.QUIET) <= set(options)


def test_the_dump_takes_the_executor_s_options_and_class_path_not_its_sharing_or_main_class() -> None:
    command = dump_command(_EXECUTOR_ARGS, "/real/java", "/w/list", "/w/out.partial")
    assert command == [
        "/real/java",
        "-cp",
        "/opt/spark/conf:/opt/spark/jars/*",
        "-Xmx1024M",
        "--add-modules=jdk.incubator.vector",
        "-XX:Tier4InvocationThreshold=50000",
        "-Xshare:dump",
        "-XX:SharedClassListFile=/w/list",
        "-XX:SharedArchiveFile=/w/out.partial",
        "-Xlog:disable",
    ]


@pytest.fixture
def worker(tmp_path: Path) -> Path:
    """A worker folder with an application's executor folder, its JVM's class list in it."""
    folder = tmp_path / "work"
    executor = folder / "app-1" / "0"
    executor.mkdir(parents=True)
    folder.chmod(0o755)
    (executor / CLASS_LIST).write_text("java/lang/Object\njava/lang/String\njava/lang/Th")
    return folder


def _stand_in(args: list[str], cwd: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line reads ``python -c CODE ARGS[1:]``, sleeping in ``cwd``."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *args[1:]], cwd=cwd)
    try:
        for _ in range(100):  # until its command line is the new one (after exec)
            if EXECUTOR_MAIN.encode() in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
                break
            time.sleep(0.01)
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def jvm(worker: Path) -> Iterator[subprocess.Popen[bytes]]:
    yield from _stand_in(_EXECUTOR_ARGS, worker / "app-1" / "0")


def _lock(worker: Path) -> Path:
    return worker / "bulldozer-executor-0123456789abcdef.lock"


def _building(jvm: int) -> bool:
    """Whether a build for JVM ``jvm`` runs (``python -s -P -c BUILD JVM FD TARGET``)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args[4:6] == [executor_archive.BUILD.encode(), str(jvm).encode()]:
            return True
    return False


def test_an_executor_that_did_not_map_its_archive_starts_a_build_that_a_failed_dump_leaves_without_a_trace(
    worker: Path, jvm: subprocess.Popen[bytes]
) -> None:
    assert ensure(jvm.pid)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not _lock(worker).exists():  # the build takes it first
        time.sleep(0.05)
    jvm.kill()  # the build waits for the JVM to exit, then dumps with the JVM's program:
    jvm.wait()  # here Python, which refuses -Xshare:dump
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _building(jvm.pid):
        time.sleep(0.1)
    assert sorted(p.name for p in worker.iterdir()) == ["app-1", _lock(worker).name]  # no archive, no partial


def test_no_build_for_a_jvm_not_asked_for_an_archive(worker: Path) -> None:
    """A local driver (its own archive, no class list), or an operator's ``-Xshare:off``."""
    driver = [a for a in _EXECUTOR_ARGS if not a.startswith("-XX:DumpLoadedClassList")]
    off = [*_EXECUTOR_ARGS[:4], "-Xshare:off", *_EXECUTOR_ARGS[4:]]
    theirs = [*_EXECUTOR_ARGS[:6], "-XX:SharedArchiveFile=/opt/theirs.jsa", *_EXECUTOR_ARGS[6:]]
    for args in (driver, off, theirs):
        for proc in _stand_in(args, worker / "app-1" / "0"):
            assert not ensure(proc.pid)
    assert not ensure(os.getpid())  # a Python worker's parent that is no JVM at all


def test_no_build_in_a_worker_folder_others_can_write_in(worker: Path, jvm: subprocess.Popen[bytes]) -> None:
    worker.chmod(0o777)
    assert not ensure(jvm.pid)
    worker.chmod(0o755)
    assert ensure(jvm.pid)


def test_an_archive_built_within_the_hour_is_not_built_again(worker: Path, jvm: subprocess.Popen[bytes]) -> None:
    """One the JVM did not map (made for another Java): not rebuilt for every application."""
    made = worker / "bulldozer-executor-0123456789abcdef.jsa"
    made.write_bytes(b"an archive for another JVM")
    assert not ensure(jvm.pid)
    os.utime(made, (time.time() - 2 * 3600, time.time() - 2 * 3600))  # built two hours ago
    assert ensure(jvm.pid)


def test_old_unused_archives_are_dropped_the_kept_and_recent_stay(tmp_path: Path) -> None:
    day_ago = time.time() - 2 * 86400
    names = [f"bulldozer-executor-{n:016x}.jsa" for n in range(4)]
    for age, name in enumerate(names):
        path = tmp_path / name
        path.write_bytes(b"x")
        path.with_suffix(".lock").write_bytes(b"")
        if age >= 2:  # the two oldest: unused for two days
            os.utime(path, (day_ago - age, day_ago - age))
    (tmp_path / ".bulldozer-classes-stale.partial").write_bytes(b"x")
    os.utime(tmp_path / ".bulldozer-classes-stale.partial", (day_ago, day_ago))
    executor_archive._drop_unused(str(tmp_path), str(tmp_path / names[0]))
    # the one just made, one more used last (KEPT = 2), and every one used within a day
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([names[0], names[1], f"{names[0][:-4]}.lock", f"{names[1][:-4]}.lock"])


def test_a_cluster_s_executors_are_asked_for_their_archive_unless_the_operator_says_how_they_share() -> None:
    from bulldozer.load.engines.spark.session import _ask_executors_for_their_archive

    theirs = "-XX:Tier4InvocationThreshold=50000 -Dtheirs=1"
    options = {"spark.executor.extraJavaOptions": theirs}
    _ask_executors_for_their_archive("spark://10.0.0.1:7077", options)
    asked = options["spark.executor.extraJavaOptions"]
    assert asked.startswith("-XX:SharedArchiveFile=../../bulldozer-executor-") and asked.endswith(theirs)
    for master, operator in (
        ("local[2]", theirs),  # the driver's JVM runs the tasks: its own archive
        ("spark://10.0.0.1:7077", "-Xshare:on"),
        ("spark://10.0.0.1:7077", "-XX:SharedArchiveFile=/opt/executor.jsa"),
        ("spark://10.0.0.1:7077", "-XX:ArchiveClassesAtExit=/opt/executor.jsa"),
    ):
        options = {"spark.executor.extraJavaOptions": operator}
        _ask_executors_for_their_archive(master, options)
        assert options == {"spark.executor.extraJavaOptions": operator}
