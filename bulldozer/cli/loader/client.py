"""Hand a ``bulldozer run`` over to a warm loader (see the package's docstring).

Called by the command line's entry point before it imports anything else — the settings
included: the loader resolves the command's home. ``hand_over`` returns None whenever the
command should run here as usual: no loader registered, none that answers, or every one
refuses it (not its home, ``BULLDOZER_LOADER=off``, stopping), or a command no loader takes.

What this process imports is all a warm run pays for before the loader takes over, so it is
the standard library's sockets, JSON and signals only (no pathlib, typing or contextlib):
the caller's start, interpreter included, went from ≈ 40 ms to ≈ 27 ms. And not their
Python modules, but the C modules under them (``_socket``, ``_signal``; JSON through
``bulldozer.cli.loader.to_json`` and ``flat_json``): ``socket`` and ``signal`` import
``enum`` for their constants, and ``json`` imports ``re``, whose imports and compiled
expressions were most of what was left. Interleaved process starts importing what a
hand-over imports (60 each): median 41.8 -> 26.8 ms; a warm run with nothing to write, whole
command, in alternating blocks of 10 runs per loader (60 and 80 runs each, two sessions):
median 155.6 -> 148.5 and 144.6 -> 141.3 ms, fastest 126.1 -> 118.0 and 123.4 -> 115.6 ms.
"""

from __future__ import annotations

# the C modules under signal and socket (see the module's docstring); _signal has no stub
import _signal  # type: ignore[import-not-found]
import _socket
import os
import stat
import struct
import sys

from bulldozer.cli.loader import REQUEST_HEADER, flat_json, registry, socket_path, takes, to_json
from bulldozer.sockets import at_unix_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path
    from typing import Any

__all__ = ["hand_over", "request", "status"]

#: how long the loader may take to fork the command (it answers in milliseconds)
_FIRST_REPLY_SECONDS = 30.0


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


def request(path: str | Path, message: dict[str, Any], fds: Sequence[int] = (), timeout: float = 5.0) -> Any:
    """Connect to the loader socket ``path`` and send ``message`` (with ``fds``); the
    connection (a ``_socket.socket``: no context manager). OSError when nothing listens
    there, or a process of another user does (it gets nothing: a command's environment may
    hold secrets)."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        at_unix_path(path, sock.connect)
        _, uid, _ = struct.unpack("3i", sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12))
        if uid != os.getuid():
            raise PermissionError(f"{path}: a process of uid {uid} listens there")
        body = to_json(message).encode()
        data = REQUEST_HEADER.pack(len(body)) + body
        rights = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else []
        sent = sock.sendmsg([data], rights)  # what socket.send_fds does
        if sent < len(data):
            sock.sendall(data[sent:])
    except OSError:
        sock.close()
        raise
    return sock


def _lines(sock: Any) -> Iterator[bytes]:
    """The lines ``sock`` receives, without their newline, until it closes."""
    buffered = b""
    while True:
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            yield line
        chunk = sock.recv(65536)
        if not chunk:
            return
        buffered += chunk


def status(home: Path) -> dict[str, Any] | None:
    """The loader's status, or None when no loader answers for ``home``."""
    import json

    try:
        sock = request(socket_path(home), {"op": "status"})
    except OSError:
        return None
    try:
        for line in _lines(sock):
            return dict(json.loads(line))
    except (OSError, ValueError):
        return None
    finally:
        sock.close()
    return None


def hand_over(argv: Sequence[str]) -> int | None:
    """Run ``bulldozer ARGV`` in a loader that takes it; its exit code, or None to run it here."""
    if not takes(argv):
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
        try:
            code = _follow(sock, path)
        finally:
            sock.close()
        if code is not None:
            return code
    return None


def _follow(sock: Any, path: str) -> int | None:
    """The command's exit code once the loader at ``path`` forked it; None when it refused.
    A reply line this caller cannot read counts as none (``flat_json``)."""
    sock.settimeout(_FIRST_REPLY_SECONDS)
    replies = (flat_json(line) for line in _lines(sock))
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

    for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
        _signal.signal(sig, forward)
    try:
        for reply in replies:
            if reply is not None and "exit" in reply:
                return int(reply["exit"])
    except (OSError, ValueError):
        pass
    print(
        f"bulldozer: the loader stopped while this command (pid {child}) ran; its outcome is in the run's "
        "record (bulldozer runs)",
        file=sys.stderr,
    )
    return 1
