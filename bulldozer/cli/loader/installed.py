"""Whether the code a loader's commands would run changed since the loader started.

A loader runs the code it imported when it started; once an upgrade (``pip install``,
``git pull`` and the bootstrap, a rebuilt data plane) has changed any of it, a command it
forked would run the old code, and import the rest from the new. What counts
(``Installed``): every file of the bulldozer package (bytecode caches aside), the native
data plane's binary, and the installed distributions (their ``.dist-info`` folders name
their versions).

``CodeWatch`` answers for every command. On Linux it has the kernel watch those folders
(inotify): a command's check reads what the kernel queued since the last, one system call
that finds nothing. Scanning them instead (``Installed.stamp``: 353 entries) took 3.4 ms of
every warm command on this machine, 5.1 ms while it ran slow (timeline marks, medians of 11
warm deltas: 1 % of a warm delta, 2–3 % of a warm run with nothing to write). Where inotify
is not to be had (another system, the user's watch limit reached) it scans as before, and
where the code lies on a file system that another machine may change (a network one, FUSE):
the kernel reports only the changes made through it (``local_file_systems``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import struct
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CodeWatch", "Installed", "local_file_systems"]

# inotify(7)
_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE = 0x2, 0x4, 0x8
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_Q_OVERFLOW, _IN_IGNORED = 0x400, 0x800, 0x4000, 0x8000
_IN_ONLYDIR = 0x01000000
_ENTRIES = _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE  # what a folder holds
_CONTENTS = _ENTRIES | _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE  # and what its files hold
_SELF = _IN_DELETE_SELF | _IN_MOVE_SELF  # the watched folder itself
_GONE = _SELF | _IN_IGNORED  # (IN_IGNORED: its watch removed, as it went)
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name

Stamp = dict[str, tuple[int, int, int]]

#: file systems changed only through this machine's kernel, which inotify hears of
_LOCAL = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "zfs", "bcachefs", "tmpfs", "ramfs", "overlay"})


def local_file_systems(folders: list[str], mountinfo: str | None = None) -> bool:
    """Whether every folder lies on a file system of ``_LOCAL`` (``mountinfo``: the text of
    ``/proc/self/mountinfo``, read when None; a folder under no mount it lists is not)."""
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
                mountinfo = f.read()
        except OSError:
            return False
    mounts: list[tuple[str, str]] = []  # (mount point, file system type)
    for line in mountinfo.splitlines():
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) >= 5 and rest:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4])  # \040: a space
            mounts.append((point, rest.split()[0]))
    for folder in folders:
        real = os.path.realpath(folder)
        under = [(p, t) for p, t in mounts if real == p or real.startswith(p.rstrip("/") + "/")]
        if not under or max(under, key=lambda m: len(m[0]))[1] not in _LOCAL:
            return False
    return True


@dataclass(frozen=True)
class Installed:
    """What a command would run: ``package``'s files (bytecode caches aside), the
    ``.dist-info`` entries of the ``libraries`` folders, and the file ``binary``."""

    package: str
    libraries: tuple[str, ...] = ()
    binary: str | None = None

    @classmethod
    def here(cls) -> Installed:
        """This installation's: the bulldozer package, the interpreter's site-packages
        folders, the data plane's binary as the settings name it."""
        import bulldozer
        from bulldozer.kv.server.native import kvd_binary

        paths = sysconfig.get_paths()
        kvd = kvd_binary()
        return cls(
            os.path.dirname(bulldozer.__file__),
            tuple(sorted({paths["purelib"], paths["platlib"]})),
            str(kvd) if kvd is not None else None,
        )

    def package_folders(self) -> list[str]:
        """The package's folder and every folder under it but bytecode caches."""
        return [folder for folder, _ in self._package()]

    def _package(self) -> list[tuple[str, list[os.DirEntry[str]]]]:
        """Each of ``package_folders`` with the files in it, in one pass over the tree."""
        found: list[tuple[str, list[os.DirEntry[str]]]] = []
        pending = [self.package]
        while pending:
            folder = pending.pop()
            files: list[os.DirEntry[str]] = []
            with contextlib.suppress(OSError), os.scandir(folder) as entries:
                for entry in entries:
                    if not entry.is_dir(follow_symlinks=False):
                        files.append(entry)
                    elif entry.name != "__pycache__":
                        pending.append(entry.path)
            found.append((folder, files))
        return found

    def stamp(self) -> Stamp:
        """Each file that counts by (inode, modification time, size); each distribution by
        its ``.dist-info`` name."""
        stamp: Stamp = {}
        for _, files in self._package():
            for entry in files:
                with contextlib.suppress(OSError):  # gone meanwhile: missing from the stamp
                    st = entry.stat()
                    stamp[entry.path] = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self.binary is not None:
            with contextlib.suppress(OSError):
                st = os.stat(self.binary)
                stamp[self.binary] = (st.st_ino, st.st_mtime_ns, st.st_size)
        for library in self.libraries:
            with contextlib.suppress(OSError):
                for name in os.listdir(library):
                    if name.endswith(".dist-info"):
                        stamp[os.path.join(library, name)] = (0, 0, 0)
        return stamp


class CodeWatch:
    """Whether ``installed`` changed since this was made (``changed``): watched by the kernel
    where it can (inotify), else scanned again each time. Once changed, it stays changed."""

    def __init__(self, installed: Installed, use_inotify: bool = True) -> None:
        self.installed = installed
        self._fd: int | None = None
        self._counts: dict[int, Callable[[str], bool]] = {}  # per watch: whether a change of an entry counts
        if use_inotify:
            self._watch()
        # scanned only where the kernel does not watch (after trying: a change between is in
        # one or the other); None where it does
        self._stamp: Stamp | None = installed.stamp() if self._fd is None else None
        self._changed = False

    @property
    def watched_by_kernel(self) -> bool:
        return self._fd is not None

    def changed(self) -> bool:
        if not self._changed:
            if self._fd is not None:
                self._changed = self._queued()
            elif self._stamp is not None:
                self._changed = self.installed.stamp() != self._stamp
        return self._changed

    def close(self) -> None:
        """Stop watching (a loader's child closes what the loader holds); ``changed`` then
        says what the kernel had reported until now."""
        if self._fd is not None:
            self.changed()
            os.close(self._fd)
            self._fd = None

    def _watch(self) -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            init, add = libc.inotify_init1, libc.inotify_add_watch
        except (OSError, AttributeError):  # not Linux
            return
        add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        watches: list[tuple[str, int, Callable[[str], bool]]] = [
            (folder, _CONTENTS, lambda name: True) for folder in self.installed.package_folders()
        ]
        watches += [(lib, _ENTRIES, lambda name: name.endswith(".dist-info")) for lib in self.installed.libraries]
        if self.installed.binary is not None:
            folder, binary = os.path.split(self.installed.binary)
            watches.append((folder or ".", _CONTENTS, lambda name: name == binary))
        if not local_file_systems([folder for folder, _, _ in watches]):
            return
        fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return
        for folder, mask, counts in watches:
            wd = add(fd, os.fsencode(folder), mask | _SELF | _IN_ONLYDIR)
            if wd < 0:  # the user's watch limit reached, a folder gone: scan instead
                os.close(fd)
                self._counts.clear()
                return
            self._counts[wd] = counts
        self._fd = fd

    def _queued(self) -> bool:
        """Whether an event the kernel queued since the last read counts."""
        assert self._fd is not None
        counts = False
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return counts
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, _, size = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size : at + _EVENT.size + size].rstrip(b"\0").decode(errors="replace")
                at += _EVENT.size + size
                counts = counts or self._counts_event(wd, mask, name)

    def _counts_event(self, wd: int, mask: int, name: str) -> bool:
        if mask & (_IN_Q_OVERFLOW | _GONE):  # events lost, or a watched folder gone: assume a change
            return True
        if not name or name == "__pycache__":  # the folder itself, or its bytecode cache
            return False
        counts = self._counts.get(wd)
        return counts is not None and counts(name)
