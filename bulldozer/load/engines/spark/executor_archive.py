"""The class-data archive a standalone cluster's executor JVMs start from, made on each node.

An executor JVM loads and verifies several thousand of Spark's classes before it registers
with the driver, and a driver on a cluster waits for that before its first task: every
application pays it, on every node. Started from a class-data archive (AppCDS) of the
classes an earlier executor loaded, it is there ≈ 1 s sooner (section "measured" below).
The driver has one of its own (``session._class_archive_options``), which it makes as it
exits; an executor cannot do the same, since Java 17 has no "start from this archive, or
make it when missing" (Java 19's ``-XX:+AutoCreateSharedArchive``) and the driver cannot
see the nodes' files. So the work is split:

- The driver (``java_options``, for ``spark://`` masters) asks every executor JVM to start
  from ``../../bulldozer-executor-ID.jsa``, a path relative to the executor's working folder
  (``WORKER_DIR/APP_ID/EXECUTOR_ID`` on a standalone worker): a file in the worker's own
  folder, named by what the driver decides of the executors' JVM (``identity``). A JVM whose
  archive is missing, or does not match its build and class path, starts without one and
  says nothing. The JVM also lists the classes it loads into its working folder
  (``CLASS_LIST``; the worker deletes the folder with the application).
- On the node, the executor's Python worker daemon calls ``ensure``. When the JVM did not
  map the archive, it starts a detached process (``BUILD``: ``main``, then ``build``) in the
  daemon's environment that waits for the JVM to exit (the application's end; ``WAIT_SECONDS`` at most),
  dumps a static archive of the classes it listed, with the JVM's own options and class
  path (``-Xshare:dump``), at the lowest CPU priority, into a partial file, and renames it
  into place: the node's next executor starts from it. One build at a time per archive
  (a lock), none again within ``REBUILT_AFTER`` of the archive's last build or use (an
  archive that never maps is not rebuilt for every application), and the folder keeps the
  ``KEPT`` archives used last, plus every one used within a day.

Trust: an archive is code the JVM runs. The daemon builds one only in a folder that is its
user's own and no one else can write in; the JVM reads it where the worker's own files are
(its applications' jars are fetched into the same folder).

Measured on the 2-core machine (loopback cluster, 1 worker × 2 cores, 2 M nested rows,
whole command, 5 alternating rounds on a node with the archive): median 7.96 → 7.08 s, the
load stage's wait for Spark (``engine_start``) 4.3 → 3.3 s. The archive's build, once per
node: ≈ 10 s of one core, after the application. A JVM asked for an archive that is missing
starts without Java's own default archive too, and lists its classes: a new cluster's first
application took 9.4-9.5 s against 8.9-9.0 s (2 pairs, each on a cluster started for it);
on a node kept from building (4 alternating rounds) the median was 7.76 s either way.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

from bulldozer.load.engines.spark.node_cache import stale

__all__ = [
    "ARCHIVE",
    "BUILD",
    "CLASS_LIST",
    "EXECUTOR_MAIN",
    "KEPT",
    "QUIET",
    "REBUILT_AFTER",
    "WAIT_SECONDS",
    "build",
    "dump_command",
    "ensure",
    "identity",
    "java_options",
    "main",
]

#: an executor archive's file name
ARCHIVE = re.compile(r"bulldozer-executor-[0-9a-f]{16}\.jsa")
#: the file in an executor's working folder its JVM lists its loaded classes in
CLASS_LIST = "bulldozer-classes.lst"
#: the main class of a standalone cluster's executor JVM
EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
#: the JVM's warnings to stderr, its class-data sharing's off (a mismatched archive is
#: ignored without a word either way)
QUIET = ("-Xlog:disable", "-Xlog:all=warning,cds*=off:stderr")
#: how long a build waits for its executor JVM to exit before it dumps the classes listed so far
WAIT_SECONDS = 120.0
#: an archive built or used this recently is not built again by an executor that did not map it
REBUILT_AFTER = 3600.0
#: the archives a worker folder keeps at least (≈ 70 MB each), those used last
KEPT = 2
#: the options of a JVM's command line that take their value as the next argument
_WITH_VALUE = frozenset({"-cp", "-classpath", "--class-path", "-p", "--module-path", "--add-modules", "--add-opens"})
#: Spark's placeholders in executor options, replaced per application and executor
_PLACEHOLDER = re.compile(r"\{\{[A-Z_]+\}\}")
#: a build's partial files (its class list's copy, its archive being dumped)
_PARTIAL = re.compile(r"\.bulldozer-classes-.*\.partial")
#: the program ``ensure`` starts a build with (``python -s -P -c BUILD JVM FD TARGET``)
BUILD = "from bulldozer.load.engines.spark.executor_archive import main; main()"


def identity(spark_version: str, conf: Mapping[str, str]) -> str:
    """The archive's ID for executors a driver of ``spark_version`` starts with ``conf`` (its
    settings): what of them shapes the executor JVM's classes and class path. Spark's
    per-application placeholders (``{{APP_ID}}``) are left out, so every application of a
    configuration shares one archive."""
    keys = ("spark.executor.defaultJavaOptions", "spark.executor.extraJavaOptions", "spark.executor.extraClassPath")
    parts = [spark_version, *(f"{key}={_PLACEHOLDER.sub('', conf.get(key, ''))}" for key in keys)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def java_options(ident: str) -> list[str]:
    """The executor JVM's options: start from the worker folder's archive ``ident`` (relative
    to the executor's working folder), and list the loaded classes for ``ensure``."""
    return [
        f"-XX:SharedArchiveFile=../../bulldozer-executor-{ident}.jsa",
        f"-XX:DumpLoadedClassList={CLASS_LIST}",
        *QUIET,
    ]


def _last(args: Sequence[str], prefix: str) -> str | None:
    """The value of the last ``prefixVALUE`` option before the main class (the JVM takes an
    option's last value), or None."""
    found = None
    for arg in args:
        if arg == EXECUTOR_MAIN:
            break
        if arg.startswith(prefix):
            found = arg[len(prefix) :]
    return found


def _process_args(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return [arg.decode("utf-8", "surrogateescape") for arg in cmdline.read().split(b"\0")[:-1]]


def _mapped(pid: int, path: str) -> bool:
    """Whether process ``pid`` maps the file ``path`` (the JVM maps the archive it uses)."""
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="surrogateescape") as maps:
        return any(line.rstrip("\n").endswith(f" {path}") for line in maps)


def _writable_by_others(folder: str) -> bool:
    """Whether ``folder`` is not this user's own, is a link, or someone else may write in it."""
    try:
        info = os.lstat(folder)
    except OSError:
        return True
    return not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or bool(info.st_mode & 0o022)


def _recent(path: str) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime < REBUILT_AFTER
    except OSError:
        return False


def ensure(jvm: int | None = None) -> bool:
    """On an executor node, from its Python worker daemon (whose parent is the executor's
    JVM, ``jvm``): when that JVM was asked to start from a Bulldozer archive (``java_options``)
    and mapped it, mark the archive used; when it did not (missing, or made for another Java
    or class path), start the detached ``build`` of it from the classes the JVM listed.
    Nothing in any other process (a local driver, an executor the options did not reach) or
    when anything is amiss: the archive only makes the next start faster. Whether it
    started a build."""
    jvm = os.getppid() if jvm is None else jvm
    try:
        args = _process_args(jvm)
        archive = _last(args, "-XX:SharedArchiveFile=")
        if EXECUTOR_MAIN not in args or archive is None or _last(args, "-XX:DumpLoadedClassList=") != CLASS_LIST:
            return False
        if not ARCHIVE.fullmatch(os.path.basename(archive)) or _last(args, "-Xshare:") is not None:
            return False
        cwd = os.readlink(f"/proc/{jvm}/cwd")
        target = os.path.realpath(os.path.join(cwd, archive))
        if _mapped(jvm, target):
            os.utime(target)  # used now: kept by ``_drop_unused``
            return False
        if _writable_by_others(os.path.dirname(target)) or _recent(target):
            return False
        listed = os.open(os.path.join(cwd, CLASS_LIST), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            subprocess.Popen(
                [sys.executable, "-s", "-P", "-c", BUILD, str(jvm), str(listed), target],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(listed,),
                start_new_session=True,  # outlives the daemon and the JVM, which the worker kills
            )
        finally:
            os.close(listed)
    except (OSError, ValueError):
        return False
    return True


def dump_command(args: Sequence[str], java: str, class_list: str, output: str) -> list[str]:
    """The command that dumps a static archive of ``class_list`` into ``output`` for JVMs
    started as ``args`` (an executor's command line, run by ``java``): its options and class
    path, without its own archive, class list, sharing and logging options, and its main
    class and arguments."""
    options: list[str] = []
    dropped = ("-XX:SharedArchiveFile=", "-XX:DumpLoadedClassList=", "-Xshare:", "-Xlog:")
    rest = iter(args[1:])
    for arg in rest:
        if arg == EXECUTOR_MAIN or not arg.startswith("-"):
            break
        if arg in _WITH_VALUE:
            options += [arg, next(rest, "")]
        elif not arg.startswith(dropped):
            options.append(arg)
    return [
        java,
        *options,
        "-Xshare:dump",
        f"-XX:SharedClassListFile={class_list}",
        f"-XX:SharedArchiveFile={output}",
        "-Xlog:disable",
    ]


def _started(pid: int) -> str:
    """The start time of process ``pid`` (tells it from a later one given the same number)."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as status:
        return status.read().rsplit(")", 1)[1].split()[19]


def _complete_lines(fd: int) -> bytes:
    """What the class list holds, but a last line the JVM had not finished writing."""
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    listed = b"".join(chunks)
    return listed[: listed.rfind(b"\n") + 1]


def build(jvm: int, listed: int, target: str) -> bool:
    """Make ``target``, the archive of the classes JVM ``jvm`` listed (the open class list
    ``listed``): after the JVM exits (``WAIT_SECONDS`` at most), with its options, one build
    at a time, renamed into place when the JVM that dumps it succeeded. Whether it did."""
    folder = os.path.dirname(target)
    args, java, born = _process_args(jvm), os.readlink(f"/proc/{jvm}/exe"), _started(jvm)
    lock = os.open(f"{target[: -len('.jsa')]}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)
        return False  # another executor's build of it runs
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        with contextlib.suppress(OSError, IndexError):
            while time.monotonic() < deadline and _started(jvm) == born:
                time.sleep(0.5)
        if _recent(target):  # made by another build since ``ensure`` looked, before this one took the lock
            return False
        os.nice(19)
        fd, class_list = tempfile.mkstemp(prefix=".bulldozer-classes-", suffix=".partial", dir=folder)
        output = f"{class_list[: -len('.partial')]}.jsa.partial"
        try:
            with os.fdopen(fd, "wb") as copy:
                copy.write(_complete_lines(listed))
            done = subprocess.run(
                dump_command(args, java, class_list, output),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )
            if done.returncode != 0 or not os.path.getsize(output):
                return False
            os.replace(output, target)
        finally:
            for partial in (class_list, output):
                with contextlib.suppress(OSError):
                    os.unlink(partial)
        _drop_unused(folder, target)
        return True
    finally:
        os.close(lock)


def _drop_unused(folder: str, made: str) -> None:
    """Delete the folder's other archives (and their locks) but the ``KEPT`` used last and
    those used within a day, and partial files a killed build left an hour ago."""
    partials, unused = stale(folder, made, KEPT, ARCHIVE.fullmatch, _PARTIAL.fullmatch)
    for path in [*partials, *unused, *(f"{path[: -len('.jsa')]}.lock" for path in unused)]:
        with contextlib.suppress(OSError):
            os.unlink(path)


def main(argv: Sequence[str] | None = None) -> None:
    """``ensure``'s detached build (``BUILD``): JVM_PID CLASS_LIST_FD TARGET."""
    jvm, listed, target = sys.argv[1:] if argv is None else argv
    with contextlib.suppress(Exception):  # nothing to report to: its output goes nowhere
        build(int(jvm), int(listed), target)
