"""The warm loader: a long-lived process that runs ``bulldozer run`` with its imports, its
compiled kernels and the embedded DAL already loaded, for schedulers that run many jobs.

A one-shot ``bulldozer run`` pays ≈ 0.4 s before its first row on this 2-core machine:
the interpreter, ≈ 0.3 s of imports (pyiceberg's table module alone ≈ 0.2 s, pyarrow,
gRPC, pydantic) and the embedded DAL's own start. ``bulldozer loader start`` starts a
process (``server``) that imports all of it once, keeps an embedded DAL over the home's
store running, and listens on a Unix socket in ``<home>/loader/`` (a folder only its user
can enter; a connection from another user is refused by its peer credentials).

While it runs, ``bulldozer run`` hands itself over (``client``): it finds the running
loaders of its user in a registry (``registry``: a folder only that user may enter, one link
per loader to its socket), sends one its arguments, working directory, environment and
umask, and its standard input, output and error as file descriptors; the loader resolves
the command's home from them as the command would (the settings, which it has imported:
the caller does not, which saves it ≈ 0.15–0.2 s) and, when that home is its own, *forks* a
child that becomes that command — the same
arguments, environment, working directory and terminal — and runs it in the already
warm interpreter. The command's output reaches the caller's terminal directly, its
signals (Ctrl-C, SIGTERM) are passed on, and its exit code comes back as the caller's.
The child dies with the caller: it watches the caller's process and kills itself (its
run's version stays LOADING and resumable, as after any crash) when the caller is gone.

So a run through the loader is the one-shot run, started faster: same code (a loader whose
installation changed since it started — an upgraded package or distribution, a rebuilt data
plane — refuses every command, which runs on its own, and stops: ``installed``), same settings
(read by the child from the caller's environment), same isolation (one process per run,
nothing of one run survives into the next), and the one-shot command stays correct on its
own — with no loader running, or ``BULLDOZER_LOADER=off``, nothing changes. Runs with
``--engine spark`` are not handed over (the loader's interpreter runs without pandas,
which only Spark's driver needs; Spark's own start-up dwarfs Python's).
"""

from __future__ import annotations

import os
import struct

# Light at import (os and struct only): the caller's hand-over imports this package before
# anything else (bulldozer.cli.loader.client); pathlib, hashlib and typing together took
# ≈ 15 ms of that process's start.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

__all__ = [
    "REQUEST_HEADER",
    "flat_json",
    "loader_folder",
    "option",
    "registry",
    "registry_link",
    "socket_path",
    "takes",
    "to_json",
]

#: a request to the loader: this header (the JSON body's length), then the body; the caller's
#: descriptors travel with the first bytes (SCM_RIGHTS). Replies are JSON lines.
REQUEST_HEADER = struct.Struct("!I")


# The caller's side of the wire writes and reads JSON without the json module: importing
# it imports re and enum (json's decoder compiles regular expressions), ≈ 10 ms of a
# hand-over's start. Strings are quoted and unquoted by json's own C helpers (``_json``).
def _quote(text: str) -> str:
    from _json import encode_basestring_ascii

    return str(encode_basestring_ascii(text))


def to_json(value: object) -> str:
    """``value`` (a str, an int, a list of them or a str-keyed dict of them, nested) as the
    JSON ``json.dumps`` writes for it (ASCII, its separators); TypeError for anything else."""
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int.__repr__(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(to_json(item) for item in value) + "]"
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return "{" + ", ".join(f"{_quote(key)}: {to_json(item)}" for key, item in value.items()) + "}"
    raise TypeError(f"not sent to a loader: {type(value).__name__}")


def flat_json(line: bytes) -> dict[str, int | str] | None:
    """A JSON object of str keys and int or str values as ``json.dumps`` writes one (what
    the loader replies to a run: its pid, its exit code, why it refused); None for any other
    line, which the caller takes as no reply."""
    from _json import scanstring

    try:
        text = line.decode()
        if text[:1] != "{" or text[-1:] != "}":
            return None
        fields: dict[str, int | str] = {}
        at = 1
        while text[at:] != "}":
            if text[at] != '"':
                return None
            key, at = scanstring(text, at + 1)
            if text[at : at + 2] != ": ":
                return None
            at += 2
            value: int | str
            if text[at] == '"':
                value, at = scanstring(text, at + 1)
            else:
                end = at + (text[at] == "-")
                while "0" <= text[end] <= "9":
                    end += 1
                value, at = int(text[at:end]), end  # ValueError when no digit follows
            fields[key] = value
            if text[at:] != "}":
                if text[at : at + 2] != ", ":
                    return None
                at += 2
        return fields
    except (UnicodeDecodeError, ValueError, IndexError):
        return None


def loader_folder(home: Path) -> Path:
    """Where a home's loader keeps its socket, its pid and its log."""
    return home / "loader"


def socket_path(home: Path) -> Path:
    return loader_folder(home) / "loader.sock"


def registry() -> str:
    """Where this user's running loaders are listed: ``$XDG_RUNTIME_DIR``, else ``/tmp``
    (not ``$TMPDIR``, which differs between a scheduler's tasks), then
    ``bulldozer-loaders-<uid>``. A caller uses it only when this user owns it and no one else
    may enter it, and sends its request only to a socket this user's process listens on."""
    return os.path.join(os.environ.get("XDG_RUNTIME_DIR") or "/tmp", f"bulldozer-loaders-{os.getuid()}")


def registry_link(home: Path) -> Path:
    """The registry's link to ``home``'s loader socket."""
    import hashlib
    from pathlib import Path

    return Path(registry()) / (hashlib.sha256(str(home).encode()).hexdigest()[:24] + ".sock")


def takes(argv: Sequence[str]) -> bool:
    """Whether a loader takes ``bulldozer ARGV``: only ``run``, and not on Spark (see the
    package's docstring). The one rule for both callers: the Python one asks it before it
    connects, and the loader refuses what it does not take (``"refused": "not taken"``), which
    is how the native one (native/launcher), which sends every command, learns it."""
    from bulldozer.cli.commands import invoked

    if invoked(argv) != "run" or "--help" in argv or "--version" in argv:
        return False
    return option(argv[argv.index("run") :], "--engine") in (None, "local")


def option(argv: Sequence[str], name: str) -> str | None:
    """The value of the option ``name`` in ``argv`` (``--name V`` or ``--name=V``)."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None
