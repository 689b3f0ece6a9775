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
import json
import random
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PAGE", "Write", "build_recorder", "crash_problems", "image", "mark", "read_log", "recorded"]

PAGE = 4096
_SOURCE = Path(__file__).with_name("write_recorder.c")
_REPO = Path(__file__).resolve().parents[1]
#: a process that opens each embedded store (a folder) given on stdin, one per line, and
#: prints a line of JSON of what it finds there: a damaged store can crash LMDB itself
_CHECK = """
import json, sys
from bulldozer.kv.backends.config import EmbeddedConfig
from bulldozer.kv.backends.embedded import EmbeddedEngine
for line in sys.stdin:
    try:
        engine = EmbeddedEngine(EmbeddedConfig(path=line.strip(), map_size=1 << 30))
        found = {}
        for alias in engine.list_aliases():
            record = engine.get_namespace(alias.namespace)
            measured = engine.measure(alias.namespace)
            found[alias.alias] = [alias.namespace, record.state.value, record.digest, measured.value]
        engine.close()
        print(json.dumps({"aliases": found}), flush=True)
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
"""


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


def crash_problems(
    tmp_path: Path,
    log: Path,
    flipped: list[str],
    digests: set[int],
    rng: random.Random,
    alias: str = "crash",
    count: int = 120,
) -> tuple[list[str], int]:
    """What is wrong with ``count`` embedded stores a crash could leave (``image``, from the
    record ``log`` of a store made empty), each opened in turn (a third of them crashed just
    after a flip was answered, its ``mark``): each must open, and ``alias`` point at an ACTIVE
    version whose records measure as its seal did (one of ``digests``), the last of
    ``flipped`` marked before the crash or a later one. Returns (problems, images made)."""
    writes = read_log(log)
    made = next(i for i, w in enumerate(writes) if w.flush)  # the store is made, then its first flush
    answered = [i for i, w in enumerate(writes) if w.mark]
    images: list[tuple[Path, int]] = []  # where, and the earliest flip it must keep (-1: none)
    for n in range(count):
        crash_at = rng.randrange(made, len(writes) + 1) if n % 3 else rng.choice(answered) + rng.randrange(1, 4)
        crash_at = min(crash_at, len(writes))
        folder = tmp_path / "images" / f"{n}-at-{crash_at}"
        folder.mkdir(parents=True)
        (folder / "data.mdb").write_bytes(image(b"", writes, crash_at, rng))
        kept = [flipped.index(w.mark) for w in writes[:crash_at] if w.mark]
        images.append((folder, kept[-1] if kept else -1))
    bad: list[str] = []
    left = list(images)
    while left:  # a store damaged enough crashes the process opening it: the rest in another
        checker = subprocess.run(
            [sys.executable, "-c", _CHECK], input="\n".join(str(f) for f, _ in left), capture_output=True,
            text=True, cwd=_REPO, timeout=600,
        )  # fmt: skip
        said = checker.stdout.splitlines()
        for (folder, must_keep), line in zip(left, said, strict=False):
            found = json.loads(line)
            if "error" in found:
                bad.append(f"{folder.name}: {found['error']}")
                continue
            if must_keep >= 0 and alias not in found["aliases"]:
                bad.append(f"{folder.name}: the alias is gone, though its flip to {flipped[must_keep]} was answered")
            for name, (target, state, digest, measured) in found["aliases"].items():
                if state != "ACTIVE" or digest not in digests or measured != digest:
                    bad.append(f"{folder.name}: {name} -> {target} {state}, sealed {digest}, measured {measured}")
                elif target not in flipped[max(must_keep, 0) :]:
                    bad.append(
                        f"{folder.name}: {name} -> {target}, though its flip to {flipped[must_keep]} was answered"
                    )
        if len(said) < len(left):
            bad.append(f"{left[len(said)][0].name}: the process opening it died ({checker.returncode})")
        left = left[len(said) + 1 :]
    shutil.rmtree(tmp_path / "images")
    return bad, len(images)
