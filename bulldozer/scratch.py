"""A process's scratch folders in the temporary directory (a DAL's sockets and port files,
the Spark driver's environment): private to the process, removed when it is done with
them, and removed by the next Bulldozer process that makes one when it died first.

A process killed with SIGKILL (or by the kernel's OOM killer) runs no clean-up, so its
folders used to stay in ``/tmp`` for good: the crash tests alone left ≈ 25 a CI run. Each
folder now holds a lock file (``.owner``) that its maker keeps locked (``flock``) while it
runs — and a child it forks, which shares the lock — and the kernel releases the lock when
the last of them exits, however it exits. ``make`` first removes every ``bulldozer-*``
folder of this user whose lock it can take. The lock file gets its name only once it is
locked, so a folder being made is never mistaken for an abandoned one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["folder", "make", "remove", "sweep"]

PREFIX = "bulldozer-"
OWNER = ".owner"

_held: dict[Path, int] = {}
_lock = threading.Lock()


def make(kind: str, root: Path | None = None) -> Path:
    """A new private folder ``bulldozer-<kind>-XXXXXXXX`` in ``root`` (the temporary
    directory), locked by this process until ``remove``; abandoned ones are swept first."""
    sweep(root)
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-", dir=root))
    fd = os.open(path / f"{OWNER}.new", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(path / f"{OWNER}.new", path / OWNER)
    except BaseException:
        os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        raise
    with _lock:
        _held[path] = fd
    return path


def remove(path: Path) -> None:
    """Remove a folder ``make`` made, and let go of its lock."""
    shutil.rmtree(path, ignore_errors=True)
    with _lock:
        fd = _held.pop(path, None)
    if fd is not None:
        os.close(fd)


@contextlib.contextmanager
def folder(kind: str, root: Path | None = None) -> Iterator[Path]:
    """``make``, removed on exit."""
    path = make(kind, root)
    try:
        yield path
    finally:
        remove(path)


def sweep(root: Path | None = None) -> list[Path]:
    """Remove this user's scratch folders in ``root`` (the temporary directory) whose
    makers are gone (their lock is free); the folders removed. Folders without a lock file
    — being made, or not made by ``make`` — are left alone."""
    removed: list[Path] = []
    uid = os.getuid()
    try:
        entries = list(os.scandir(root or tempfile.gettempdir()))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            fd = os.open(os.path.join(entry.path, OWNER), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its maker (or a child it forked) still runs
        else:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
        finally:
            os.close(fd)
    return removed
