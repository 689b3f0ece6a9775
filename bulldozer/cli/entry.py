"""The ``bulldozer`` command's entry point: a ``run`` goes to the home's warm loader when
one is running (bulldozer.cli.loader), before this process imports anything heavy; every other
command, and a run no loader takes, runs here (bulldozer.cli.main).

The process ends as soon as the command is done: ``main`` registers ``_end`` as the first
exit handler, so it runs last — after the interpreter has waited for the command's threads
and run every other exit handler (logging's flush among them) — and ends the process there,
with the command's exit code, without the interpreter tearing itself down module by module
and object by object to free memory the kernel frees at once (20-30 ms of a run's exit,
measured side by side on a 500 k-row run). Only a command that ended as it means to (an
exit code, or returning) ends so; an unexpected exception goes the usual way."""

from __future__ import annotations

import atexit
import os
import sys

#: the exit code the command ended with, once it did (``_end`` ends the process with it)
_status: int | None = None


def _ends_with(code: object) -> None:
    """Note the exit status ``sys.exit(code)`` gives (a message as the code: 1)."""
    global _status
    _status = code if isinstance(code, int) else 0 if code is None else 1


def _end() -> None:
    if _status is None:
        return
    if "logging" in sys.modules:  # its own exit handler has flushed it, unless it came first
        sys.modules["logging"].shutdown()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return  # the interpreter's own exit says so (a closed pipe: exit code 120)
    os._exit(_status)


def main() -> None:
    atexit.register(_end)  # registered first, it runs last
    try:
        from bulldozer.cli.loader.client import hand_over

        code = hand_over(sys.argv[1:])
        if code is not None:  # the command ran in the loader
            _ends_with(code)
            sys.exit(code)
        from bulldozer.cli.main import main as here
    except KeyboardInterrupt:  # Ctrl-C before a command's own handler is reached (SIGTERM kills until then)
        print("error: interrupted", file=sys.stderr)
        _ends_with(130)
        sys.exit(130)
    try:
        here()
    except SystemExit as exc:
        _ends_with(exc.code)
        raise
    _ends_with(None)


if __name__ == "__main__":
    main()
