"""Hand a ``bulldozer run`` over to the home's warm loader (see the package's docstring).

Called by the command line's entry point before it imports anything heavy; ``hand_over``
returns None whenever the command should run here as usual: no loader, a loader that does
not answer or refuses, ``BULLDOZER_LOADER=off``, or a command it does not take.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bulldozer.cli.loader import REQUEST_HEADER, socket_path

__all__ = ["hand_over", "request", "status"]

#: how long the loader may take to fork the command (it answers in milliseconds)
_FIRST_REPLY_SECONDS = 30.0


def _option(argv: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _home(argv: Sequence[str]) -> Path | None:
    """The home the command acts on, as the command would resolve it; None if that fails
    (the command then runs here and reports the problem itself)."""
    from bulldozer.settings import load_settings, select_profile

    try:
        select_profile(_option(argv, "--profile"))
        settings = load_settings()
        if settings.loader == "off":
            return None
        sub = argv[argv.index("run") + 1 :]
        return settings.home_path(_option(sub, "--home"))
    except Exception:
        return None
    finally:
        select_profile(None)


def _takes(argv: Sequence[str]) -> bool:
    """Only ``run``, and not on Spark (see the package's docstring)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):  # the root's options: only --profile takes a value
        i += 2 if argv[i] == "--profile" else 1
    if i >= len(argv) or argv[i] != "run" or "--help" in argv or "--version" in argv:
        return False
    return _option(argv[i:], "--engine") in (None, "local")


def request(home: Path, message: dict[str, Any], fds: Sequence[int] = (), timeout: float = 5.0) -> socket.socket:
    """Connect to ``home``'s loader and send ``message`` (with ``fds``); the connection."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(str(socket_path(home)))
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
        with request(home, {"op": "status"}) as sock:
            for reply in _replies(sock):
                return dict(reply)
    except (OSError, ValueError):
        return None
    return None


def hand_over(argv: Sequence[str]) -> int | None:
    """Run ``bulldozer ARGV`` in the home's loader; its exit code, or None to run it here."""
    if not _takes(argv):
        return None
    home = _home(argv)
    if home is None or not socket_path(home).exists():
        return None
    umask = os.umask(0)
    os.umask(umask)
    try:
        cwd = os.getcwd()
    except OSError:
        return None  # a working directory that is gone: the command says so itself
    message = {"argv": list(argv), "cwd": cwd, "env": dict(os.environ), "umask": umask, "home": str(home)}
    try:
        sock = request(home, message, fds=(0, 1, 2))
    except OSError:
        return None  # no loader listens there (a stale socket): run here
    with sock:
        sock.settimeout(_FIRST_REPLY_SECONDS)
        replies = _replies(sock)
        try:
            first = next(replies, None)
        except TimeoutError:
            # it may have forked the command meanwhile: running it here too could run it twice
            # (the command, if it started, dies with this process)
            print(
                f"error: the loader for {home} did not answer within {_FIRST_REPLY_SECONDS:.0f} s; stop it "
                "(bulldozer loader stop) or run without it (BULLDOZER_LOADER=off)",
                file=sys.stderr,
            )
            return 1
        except (OSError, ValueError):
            first = None
        if first is None or "pid" not in first:
            return None  # refused, or gone before it forked: nothing ran, run here
        sock.settimeout(None)
        child = int(first["pid"])

        def forward(signum: int, _frame: Any) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

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
