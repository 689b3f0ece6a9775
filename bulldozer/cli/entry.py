"""The ``bulldozer`` command's entry point: a ``run`` goes to the home's warm loader when
one is running (bulldozer.cli.loader), before this process imports anything heavy; every other
command, and a run no loader takes, runs here (bulldozer.cli.main)."""

from __future__ import annotations

import os
import sys


def main() -> None:
    try:
        from bulldozer.cli.loader.client import hand_over

        code = hand_over(sys.argv[1:])
        if code is not None:
            # the command ran in the loader: nothing of this process's needs finalizing
            # (its interpreter's teardown took 10 ms of a warm run)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        from bulldozer.cli.main import main as here
    except KeyboardInterrupt:  # Ctrl-C before a command's own handler is reached (SIGTERM kills until then)
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    here()


if __name__ == "__main__":
    main()
