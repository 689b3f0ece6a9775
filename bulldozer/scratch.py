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

A file written whole and then moved into place (an archive, a record in the cache) is written
beside it under a name of the writing process's own (``partial_path``), so two processes
writing it at once never share one; ``sweep_partials`` deletes those of processes that are
gone.

A folder for Unix sockets (``sockets=True``: a DAL's) is made where a socket's path fits in
the kernel's limit (``bulldozer.sockets.SOCKET_PATH_MAX``): in the temporary
directory when it is short enough, else in the first of ``SOCKET_ROOTS`` that is (a
``$TMPDIR`` deep in a scheduler's or a container's work folder otherwise kept the embedded
DAL from listening at all).
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

from bulldozer import sockets
from bulldozer.errors import BackendUnavailableError

__all__ = ["folder", "make", "partial_path", "remove", "socket_root", "sweep", "sweep_partials"]

PREFIX = "bulldozer-"
OWNER = ".owner"
#: the longest name Bulldozer gives a socket in a folder of its own (``kvd-metrics.sock``), with room
SOCKET_NAME_MAX = 24
#: where a folder for sockets goes when the temporary directory's path is too long for them
SOCKET_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")
_RANDOM = 8  # the characters tempfile.mkdtemp adds to a prefix

_held: dict[Path, int] = {}
_lock = threading.Lock()


def make(kind: str, root: Path | None = None, sockets: bool = False) -> Path:
    """A new private folder ``bulldozer-<kind>-XXXXXXXX`` in ``root`` (the temporary
    directory; for ``sockets``, a place where a socket's path fits: ``socket_root``),
    locked by this process until ``remove``; abandoned ones are swept first."""
    if sockets and root is None:
        root = socket_root(kind)
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
def folder(kind: str, root: Path | None = None, sockets: bool = False) -> Iterator[Path]:
    """``make``, removed on exit."""
    path = make(kind, root, sockets)
    try:
        yield path
    finally:
        remove(path)


def socket_root(kind: str) -> Path | None:
    """Where a folder of ``kind`` for Unix sockets goes: None (the temporary directory) when
    a socket's path in it fits in ``SOCKET_PATH_MAX``, else the first of ``SOCKET_ROOTS``
    where it does and this user may make folders; a BackendUnavailableError saying so
    when there is none."""

    def room(root: str) -> bool:  # the longest socket path a folder made there would hold
        return sockets.fits(os.path.join(root, f"{PREFIX}{kind}-" + "X" * _RANDOM, "x" * SOCKET_NAME_MAX))

    temporary = tempfile.gettempdir()
    if room(temporary):
        return None
    for root in SOCKET_ROOTS:
        if room(root) and os.path.isdir(root) and os.access(root, os.W_OK | os.X_OK):
            return Path(root)
    raise BackendUnavailableError(
        f"no folder for the DAL's sockets: the temporary directory {temporary} is too long a path for a Unix "
        f"socket (at most {sockets.SOCKET_PATH_MAX} bytes with the socket's name), and none of "
        f"{', '.join(SOCKET_ROOTS)} is writable; set TMPDIR to a shorter path"
    )


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


def partial_path(final: Path) -> Path:
    """Where this process writes ``final`` before moving it into place whole (``os.replace``):
    ``<name>.<pid>.partial`` beside it, so two processes writing the same file at once each
    write their own (with one shared name, one's move took the file the other still wrote,
    which then failed: ``No such file or directory``)."""
    return final.with_name(f"{final.name}.{os.getpid()}.partial")


def sweep_partials(folder: Path, pattern: str = "*.partial") -> list[Path]:
    """Delete the files ``partial_path`` named in ``folder`` (those matching ``pattern``) whose
    process is gone: one killed, or ended without its clean-up, left its partial file for good
    (a driver's class-data archive is ≈ 170 MiB, an executors' environment ≈ 400 MiB); the
    files deleted. A live process's (another user's too) is left alone."""
    removed: list[Path] = []
    try:
        partials = list(folder.glob(pattern))
    except OSError:
        return removed
    for partial in partials:
        pid = partial.name.rsplit(".", 2)[-2] if partial.name.endswith(".partial") else ""
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            try:
                partial.unlink(missing_ok=True)
            except OSError:  # a folder this user may not write in: left, as before
                continue
            removed.append(partial)
        except OSError:
            continue  # alive, and another user's (this one may not signal it)
    return removed
