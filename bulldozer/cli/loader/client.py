"""Hand a ``bulldozer run`` over to a warm loader (see the package's docstring).

Called by the command line's entry point before it imports anything else — the settings
included: the loader resolves the command's home. ``hand_over`` returns None whenever the
command should run here as usual: no loader registered, none that answers, or every one
refuses it (not its home, ``BULLDOZER_LOADER=off``, stopping), or a command no loader takes.

What this process imports is all a warm run pays for before the loader takes over, so it is
the standard library's sockets, JSON and signals only (no pathlib, typing or contextlib):
the caller's start, interpreter included, went from ≈ 40 ms to ≈ 27 ms.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import struct
import sys

from bulldozer.cli.commands import invoked
from bulldozer.cli.loader import REQUEST_HEADER, option, registry, socket_path
from bulldozer.sockets import at_unix_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path
    from typing import Any

__all__ = ["hand_over", "request", "status"]

#: how long the loader may take to fork the command (it answers in milliseconds)
_FIRST_REPLY_SECONDS = 30.0


def _takes(argv: Sequence[str]) -> bool:
    """Only ``run``, and not on Spark (see the package's docstring)."""
    if invoked(argv) != "run" or "--help" in argv or "--version" in argv:
        return False
    return option(argv[argv.index("run") :], "--engine") in (None, "local")


def _loaders() -> list[str]:
    """The registered loaders' sockets; none when the registry is not this user's alone."""
    folder = registry()
    try:
        info = os.lstat(folder)
        names = os.listdir(folder)
    except OSError:
        return []
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return []
    return sorted(os.path.join(folder, name) for name in names if name.endswith(".sock"))


def request(path: str | Path, message: dict[str, Any], fds: Sequence[int] = (), timeout: float = 5.0) -> socket.socket:
    """Connect to the loader socket ``path`` and send ``message`` (with ``fds``); the
    connection. OSError when nothing listens there, or a process of another user does (it
    gets nothing: a command's environment may hold secrets)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        at_unix_path(path, sock.connect)
        _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != os.getuid():
            raise PermissionError(f"{path}: a process of uid {uid} listens there")
        body = json.dumps(message).encode()
        data = REQUEST_HEADER.pack(len(body)) + body
        sent = socket.send_fds(sock, [data], list(fds))
        if sent < len(data):
            sock.sendall(data[sent:])
    except OSError:
        sock.close()
        raise
    return sock


def _replies(sock: socket.socket) -> Any:
    buffered = b""
    while True:
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            yield json.loads(line)
        chunk = sock.recv(65536)
        if not chunk:
            return
        buffered += chunk


def status(home: Path) -> dict[str, Any] | None:
    """The loader's status, or None when no loader answers for ``home``."""
    try:
        with request(socket_path(home), {"op": "status"}) as sock:
            for reply in _replies(sock):
                return dict(reply)
    except (OSError, ValueError):
        return None
    return None


def hand_over(argv: Sequence[str]) -> int | None:
    """Run ``bulldozer ARGV`` in a loader that takes it; its exit code, or None to run it here."""
    if not _takes(argv):
        return None
    loaders = _loaders()
    if not loaders:
        return None
    umask = os.umask(0)
    os.umask(umask)
    try:
        cwd = os.getcwd()
    except OSError:
        return None  # a working directory that is gone: the command says so itself
    message = {"argv": list(argv), "cwd": cwd, "env": dict(os.environ), "umask": umask}
    for path in loaders:
        try:
            sock = request(path, message, fds=(0, 1, 2))
        except OSError:
            continue  # no loader listens there (a stale link), or not this user's
        with sock:
            code = _follow(sock, path)
        if code is not None:
            return code
    return None


def _follow(sock: socket.socket, path: str) -> int | None:
    """The command's exit code once the loader at ``path`` forked it; None when it refused."""
    sock.settimeout(_FIRST_REPLY_SECONDS)
    replies: Iterator[Any] = _replies(sock)
    try:
        first = next(replies, None)
    except TimeoutError:
        # it may have forked the command meanwhile: running it here too could run it twice
        # (the command, if it started, dies with this process)
        print(
            f"error: the loader at {path} did not answer within {_FIRST_REPLY_SECONDS:.0f} s; stop it "
            "(bulldozer loader stop) or run without it (BULLDOZER_LOADER=off)",
            file=sys.stderr,
        )
        return 1
    except (OSError, ValueError):
        first = None
    if first is not None and "exit" in first:
        return int(first["exit"])  # the command died before it could say its pid
    if first is not None and first.get("refused") == "upgraded":
        print(
            f"warning: the loader at {path} ran code older than this installation; it is stopping, and this "
            "command runs on its own (bulldozer loader start starts a loader with the new code)",
            file=sys.stderr,
        )
    if first is None or "pid" not in first:
        return None  # refused (not its home, stopping, upgraded), or gone before it forked: nothing ran
    sock.settimeout(None)
    child = int(first["pid"])

    def forward(signum: int, _frame: Any) -> None:
        try:  # noqa: SIM105 (contextlib is not imported here: see the module's docstring)
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        for reply in replies:
            if "exit" in reply:
                return int(reply["exit"])
    except (OSError, ValueError):
        pass
    print(
        f"bulldozer: the loader stopped while this command (pid {child}) ran; its outcome is in the run's "
        "record (bulldozer runs)",
        file=sys.stderr,
    )
    return 1
