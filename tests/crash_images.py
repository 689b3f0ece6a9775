"""What a machine crash (power lost, a kernel panic, a VM reset) can leave of a file that
processes wrote, built from a record of their writes and flushes (tests/write_recorder.c,
loaded with LD_PRELOAD).

Until a flush (fsync, fdatasync) returns, a write is in the page cache only, and the kernel
writes cached pages back in whatever order it likes, one page at a time. So a crash at any
instant leaves: every write made before the last flush, each write made through an O_DSYNC
descriptor, and of the other writes since the flush any subset of their pages (``image``).
A test marks in the log what it was told was done (``mark``): a crash after the mark must
keep it.
"""

from __future__ import annotations

import fcntl
import random
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PAGE", "Write", "build_recorder", "image", "mark", "read_log", "recorded"]

PAGE = 4096
_SOURCE = Path(__file__).with_name("write_recorder.c")


def build_recorder(into: Path) -> Path:
    """The recorder as a shared library, compiled into ``into`` with the machine's C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc is not None, "a C compiler (cc) builds the write recorder"
    library = into / "write_recorder.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(library), str(_SOURCE), "-ldl"], check=True)
    return library


def recorded(library: Path, log: Path, file: Path) -> dict[str, str]:
    """The environment that makes a process (and its children) record its writes to ``file``."""
    return {"LD_PRELOAD": str(library), "WRITE_RECORDER_LOG": str(log), "WRITE_RECORDER_FILE": str(file)}


@dataclass(frozen=True)
class Write:
    """One record of the log: a write (``durable``: through an O_DSYNC descriptor), a flush
    (``data`` None), or a test's mark (``mark``)."""

    offset: int
    data: bytes | None
    durable: bool = False
    mark: str = ""

    @property
    def flush(self) -> bool:
        return self.data is None and not self.mark


def mark(log: Path, text: str) -> None:
    """Note ``text`` in the log, after every write and flush recorded so far (the recorder's
    lock: an exclusive flock on the log)."""
    data = text.encode()
    with log.open("ab") as out:
        fcntl.flock(out, fcntl.LOCK_EX)
        out.write(b"M" + struct.pack("<qq", 0, len(data)) + data)


def read_log(log: Path) -> list[Write]:
    raw, at, out = log.read_bytes(), 0, []
    while at < len(raw):
        kind = raw[at : at + 1]
        offset, length = struct.unpack_from("<qq", raw, at + 1)
        at += 17
        if kind == b"S":
            out.append(Write(offset, None))
            continue
        if kind == b"M":
            out.append(Write(offset, None, mark=raw[at : at + length].decode()))
            at += length
            continue
        assert kind in (b"W", b"D"), f"a damaged log at byte {at - 17}"
        out.append(Write(offset, raw[at : at + length], kind == b"D"))
        at += length
    return out


def image(base: bytes, log: list[Write], crash_at: int, rng: random.Random, keep: float | None = None) -> bytes:
    """The file a crash just before record ``crash_at`` of ``log`` can leave, starting from
    ``base`` (on the disk when the log began): what the last flush made durable, and each
    page of every later write with the chance ``keep`` (default: a chance drawn per image,
    so images with almost none and almost all of them are made as well)."""
    last_flush = max((i for i in range(crash_at) if log[i].flush), default=-1)
    keep = rng.random() if keep is None else keep
    out = bytearray(base)
    for i, write in enumerate(log[:crash_at]):
        if write.data is None:
            continue
        if i < last_flush or write.durable:
            _put(out, write.offset, write.data)
            continue
        for at in range(0, len(write.data), PAGE):  # the page cache writes pages back one by one
            if rng.random() < keep:
                _put(out, write.offset + at, write.data[at : at + PAGE])
    return bytes(out)


def _put(out: bytearray, offset: int, data: bytes) -> None:
    if len(out) < offset + len(data):
        out.extend(bytes(offset + len(data) - len(out)))
    out[offset : offset + len(data)] = data
