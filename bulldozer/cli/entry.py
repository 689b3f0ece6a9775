"""The ``bulldozer`` command's entry point: a ``run`` goes to the home's warm loader when
one is running (bulldozer.cli.loader), before this process imports anything but that
hand-over and the process tuning (both light); every other
command, and a run no loader takes, runs here (bulldozer.cli.main), with a child compiling
its modules ahead when the bytecode cache is empty (``process.compile_ahead``). Either way
the process ends as soon as the command is done (``process.end_when_done``).

Where the install step built it, the ``bulldozer`` command is the native launcher
(native/launcher): it hands a command over itself, without starting Python, and starts
Python only for a command no loader takes, at ``local``, which does not ask again."""

from __future__ import annotations

import sys

from bulldozer.cli import process

TYPE_CHECKING = False  # typing is not imported before a hand-over (bulldozer.cli.loader.client)
if TYPE_CHECKING:
    from typing import NoReturn

__all__ = ["local", "main"]


def main() -> None:
    process.standard_streams()
    process.end_when_done()
    try:
        from bulldozer.cli.loader.client import hand_over

        code = hand_over(sys.argv[1:])
        if code is not None:  # the command ran in the loader
            process.ending(code)
            sys.exit(code)
    except KeyboardInterrupt:  # Ctrl-C before a command's own handler is reached (SIGTERM kills until then)
        _interrupted()
    _here()


def local() -> None:
    """The command run in this process: what the native launcher starts when no loader took
    it (``sys.argv`` the command line, its first item the launcher's name)."""
    process.standard_streams()
    process.end_when_done()
    _here()


def _here() -> None:
    try:
        process.compile_ahead(sys.argv[1:])  # an empty bytecode cache: a second core compiles too
        from bulldozer.cli.main import main as here
    except KeyboardInterrupt:
        _interrupted()
    try:
        here()
    except SystemExit as exc:
        process.ending(exc.code)
        raise
    process.ending(None)


def _interrupted() -> NoReturn:
    print("error: interrupted", file=sys.stderr)
    process.ending(130)
    sys.exit(130)


if __name__ == "__main__":
    main()
