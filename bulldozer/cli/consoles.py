"""The terminal consoles the command line prints through (rich's), made when a command
first prints through one (``bulldozer.cli.common.console``): a command asked for JSON
prints its output without them, and importing rich's console, table, text and markup
modules took 24-25 ms of such a command's start on the 2-core machine (measured after the
rest of a run's command line was imported)."""

from __future__ import annotations

import contextlib
from typing import Any

from rich.console import Console

from bulldozer.cli.process import to_null

#: soft_wrap: never break lines at the terminal width (output is read by scripts and tests
#: too); markup off: a string is printed as written (a path, a name, a pattern with brackets
#: in it), the styled parts of a line are made with ``common.line``
OPTIONS: dict[str, Any] = {"highlight": False, "soft_wrap": True, "markup": False}
ERR_OPTIONS: dict[str, Any] = {**OPTIONS, "stderr": True}


class OutputConsole(Console):
    """A console whose reader may go away (``| head``, a log pipe closed): what is left of
    its output goes nowhere, and the command goes on to its end and its own exit code.
    rich's own exits 1 at once, so ``bulldozer run SPEC 2>&1 | head -1`` stopped the run
    at its second line, and a run whose ``✓`` line met a closed pipe after the flip said
    it failed (exit 1 is promised only when the alias did not move)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            to_null(self.file.fileno())  # Python's own buffer flushes there at exit
