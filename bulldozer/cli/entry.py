"""The ``bulldozer`` command's entry point: a ``run`` goes to the home's warm loader when
one is running (bulldozer.cli.loader), before this process imports anything but that
hand-over and the process tuning (both light); every other
command, and a run no loader takes, runs here (bulldozer.cli.main), with a child compiling
its modules ahead when the bytecode cache is empty (``process.compile_ahead``). Either way
the process ends as soon as the command is done (``process.end_when_done``)."""

from __future__ import annotations

import sys

from bulldozer.cli import process


def main() -> None:
    process.standard_streams()
    process.end_when_done()
    try:
        from bulldozer.cli.loader.client import hand_over

        code = hand_over(sys.argv[1:])
        if code is not None:  # the command ran in the loader
            process.ending(code)
            sys.exit(code)
        process.compile_ahead(sys.argv[1:])  # an empty bytecode cache: a second core compiles too
        from bulldozer.cli.main import main as here
    except KeyboardInterrupt:  # Ctrl-C before a command's own handler is reached (SIGTERM kills until then)
        print("error: interrupted", file=sys.stderr)
        process.ending(130)
        sys.exit(130)
    try:
        here()
    except SystemExit as exc:
        process.ending(exc.code)
        raise
    process.ending(None)


if __name__ == "__main__":
    main()
