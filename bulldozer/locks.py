"""Work done once per machine into a shared folder, one process at a time.

What Bulldozer fetches or builds on first use — Spark's packages resolved into Ivy's home,
protoc and the gRPC plugins in its cache — two processes starting together on a new
machine did at once, into the same files: both Spark drivers failed (Ivy is not safe twice
at once), and a code generator could run a plugin another process was still writing. The
process that does the work holds ``held``'s lock (``flock`` on a file; the kernel releases
it however the process ends) and the others wait, then find the work done. A lock that
cannot be made or taken in time is only a lost optimisation: the work then runs unlocked,
as it did before.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["WAIT", "held", "in_cache"]

log = logging.getLogger(__name__)

#: how long a process waits for another's first-use work (a cold Ivy resolution or Maven fetch)
WAIT = 600.0


@contextlib.contextmanager
def held(path: Path, what: str, wait: float = WAIT) -> Iterator[bool]:
    """Hold the exclusive lock on the file ``path`` (made if missing) while the block runs,
    waiting up to ``wait`` seconds for another process's ``what``; yields whether it is held.
    The block checks again whether the work is still to do."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    except OSError as exc:
        log.debug("no lock %s for %s (%s)", path, what, exc)
        yield False
        return
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    log.warning("another process has held %s for %.0f s (%s); going on without it", path, wait, what)
                    yield False
                    return
                time.sleep(0.1)
            else:
                break
        yield True
    finally:
        os.close(fd)


def in_cache(name: str) -> Path:
    """The lock file ``name`` in Bulldozer's cache (``locks/<name>.lock``, where the service
    scripts keep theirs too), for work done into the cache."""
    from bulldozer.settings import load_settings

    return load_settings().cache_folder() / "locks" / f"{name}.lock"
