"""What the executors' Python keeps unpacked once per node and user, from zips a start finds:

- the environment a job ships (``package.launcher_archive``): the launcher runs this file
  as its ``bin/unpack.py`` (``unpack.py SOURCE TARGET KEEP``) when the folder is missing;
- Spark's own ``pyspark.zip`` and py4j's, first on every Python worker's path: Python
  imports a module from a zip by compiling its source, at every start, and writes no
  bytecode. The worker daemon (``daemon``) imports them from a folder they are unpacked in
  instead (``unzipped_spark_path``), compiled when unpacked (once per node: 0.38 s,
  ``NOT_COMPILED`` left out). Measured on the 2-core machine, the daemon's imports:
  0.84-0.96 s from the zips, 0.61-0.64 s with the bytecode (3 starts each).

A folder is unpacked beside its final name and renamed into place: the first rename wins,
the others drop theirs, and no start runs a folder half unpacked. A zip's file modes are
kept. A cache folder is used only when it is the user's own, which no one else can write
in (``private``); else the zips stay on the path as they are.

Standard library only: the launcher runs this file under the base interpreter alone
(``-s -I``), without Bulldozer's environment.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import sys
import tempfile
import time
import zipfile

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the launcher runs this file)
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["NOT_COMPILED", "SPARK_ZIPS", "SPARK_ZIPS_KEPT", "private", "stale", "unpack", "unzipped_spark_path"]

#: Spark's zips on a Python worker's path (``SPARK_HOME/python/lib``), by file name
SPARK_ZIPS = re.compile(r"pyspark\.zip|py4j-[0-9A-Za-z.]+-src\.zip")
#: unpacked zips a node's cache keeps at least (two per Spark version, ~16 MB each)
SPARK_ZIPS_KEPT = 6
#: what is not compiled when unpacked, which Bulldozer's workers never import: pyspark's
#: pandas API, its ML libraries, pipelines and tests (970 of pyspark 4.1's 1,170 modules:
#: 0.38 s instead of 1.2 s on a node's first start). Imported all the same, if ever: from
#: source, as from the zip
NOT_COMPILED = re.compile(r"/pyspark/(pandas|ml|mllib|testing|pipelines)/|/tests/")
#: what a start unpacks into, and what a clean-up renames a folder to before removing it
_UNPACKING = re.compile(r"\.(unpacking|removing)-")


def unpack(source: str, target: str, keep: int = 0, compiled: bool = False) -> None:
    """``source`` unpacked as the folder ``target`` (its modes kept); with ``compiled``, the
    bytecode of its modules beside them (unchecked hash-based, PEP 552: the folder does not
    change once in place; written whatever ``PYTHONDONTWRITEBYTECODE`` says, which would
    leave them compiled at every start). With ``keep``, then drop what the cache folder need
    not keep: folders a killed start left half unpacked (or removed) an hour ago, and those
    beyond the ``keep`` used last that no start used for a day (a start touches its
    folder), so one a running application still reads stays."""
    parent = os.path.dirname(target)
    partial = tempfile.mkdtemp(prefix=".unpacking-", dir=parent)
    placed = False
    try:
        with zipfile.ZipFile(source) as packed:
            for info in packed.infolist():
                path = packed.extract(info, partial)
                mode = (info.external_attr >> 16) & 0o777
                if mode and not info.is_dir():
                    os.chmod(path, mode)
        if compiled:
            import compileall
            import py_compile

            unchecked = py_compile.PycInvalidationMode.UNCHECKED_HASH
            compileall.compile_dir(partial, quiet=2, rx=NOT_COMPILED, invalidation_mode=unchecked)
        try:
            os.rename(partial, target)
            placed = True
        except OSError:
            if not os.path.isdir(target):
                raise
    finally:
        if not placed:
            shutil.rmtree(partial, ignore_errors=True)
    if keep:
        _drop_unused(parent, target, keep)


def _drop_unused(parent: str, target: str, keep: int) -> None:
    partials, unused = stale(parent, target, keep, lambda name: not name.startswith("."), _UNPACKING.match)
    for path in partials:
        shutil.rmtree(path, ignore_errors=True)
    for path in unused:
        gone = tempfile.mkdtemp(prefix=".removing-", dir=parent)
        with contextlib.suppress(OSError):
            os.rename(path, os.path.join(gone, "unpacked"))
        shutil.rmtree(gone, ignore_errors=True)


def stale(
    parent: str, made: str, keep: int, entry: Callable[[str], object], partial: Callable[[str], object]
) -> tuple[list[str], list[str]]:
    """What the cache folder ``parent`` need not keep, by its names: the partial ones
    (``partial``) a killed start left over an hour ago, and the entries (``entry``) besides
    ``made`` beyond the ``keep`` used last (a start marks what it uses) that none used for a
    day, so that one a running application still reads stays."""
    now, partials, others = time.time(), [], []
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        try:
            used = os.stat(path).st_mtime
        except OSError:
            continue
        if partial(name):
            if now - used > 3600:
                partials.append(path)
        elif entry(name) and path != made:
            others.append((used, path))
    return partials, [path for used, path in sorted(others, reverse=True)[keep - 1 :] if now - used > 86400]


def private(folder: str) -> bool:
    """``folder``, made if missing, is this user's own and no one else's to write in (mode
    700, not a link to wherever it leads): only then is what it holds trusted."""
    try:
        os.makedirs(folder, exist_ok=True)
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False
        if info.st_mode & 0o777 != 0o700:
            os.chmod(folder, 0o700)
    except OSError:
        return False
    return True


def unzipped_spark_path(path: list[str], cache: str) -> list[str]:
    """``path`` (a Python worker's ``sys.path``) with each of Spark's zips (``SPARK_ZIPS``)
    replaced by the folder it is unpacked in, in ``cache`` and named by its content,
    unpacking it first when missing. Unchanged when ``cache`` is not ``private``; an entry
    whose zip cannot be read or unpacked stays as it is (imported as before, only slower)."""
    if not any(SPARK_ZIPS.fullmatch(os.path.basename(entry)) for entry in path) or not private(cache):
        return list(path)
    unzipped = []
    for entry in path:
        if SPARK_ZIPS.fullmatch(os.path.basename(entry)) and os.path.isfile(entry):
            with contextlib.suppress(OSError, zipfile.BadZipFile):
                entry = _unpacked(entry, cache)
        unzipped.append(entry)
    return unzipped


def _unpacked(source: str, cache: str) -> str:
    content = hashlib.sha256()
    with open(source, "rb") as packed:
        for block in iter(lambda: packed.read(1 << 20), b""):
            content.update(block)
    target = os.path.join(cache, content.hexdigest()[:32])
    if os.path.isdir(target):
        os.utime(target)  # used now: kept by ``unpack``'s clean-up
    else:
        unpack(source, target, SPARK_ZIPS_KEPT, compiled=True)
    return target


if __name__ == "__main__":  # the launcher's bin/unpack.py
    unpack(sys.argv[1], sys.argv[2], int(sys.argv[3]))
