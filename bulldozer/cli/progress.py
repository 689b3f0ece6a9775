"""The progress of a long command on stderr (``bulldozer run``'s load, ``bulldozer namespace
verify``'s read-back): a bar on a terminal; a line every ``PROGRESS_LINE_SECONDS`` where no
bar shows (a scheduler's task log); nothing with ``--json`` or ``-q``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from bulldozer.cli.common import err_console, made

if TYPE_CHECKING:
    from rich.progress import Progress

__all__ = ["PROGRESS_LINE_SECONDS", "Reporter", "reporting"]

#: without a terminal (a scheduler's task log), a long step prints its progress this often
PROGRESS_LINE_SECONDS = 10.0


class _Lines:
    """The progress as a line every ``every`` seconds, for logs where no bar shows."""

    def __init__(self, what: str, unit: str, every: float) -> None:
        self.what, self.unit, self.every = what, unit, every
        self.started = time.monotonic()
        self.last = self.started

    def update(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        rate = done / (now - self.started) if now > self.started else 0.0
        of = f" of {total:,}" if total else ""
        eta = f", about {max(total - done, 0) / rate:,.0f} s left" if total and rate else ""
        err_console.print(f"· {self.what}: {done:,}{of} {self.unit}, {rate:,.0f} {self.unit}/s{eta}", highlight=False)


class Reporter:
    """Where a command's progress goes: the terminal's bar, the log's lines, or nowhere."""

    def __init__(self, bar: Progress | None, lines: _Lines | None) -> None:
        self._bar, self._lines = bar, lines

    def stage(self, name: str) -> None:
        """The command entered its step ``name``: the bar's title, or a line of its own."""
        if self._bar is not None:
            self._bar.update(self._bar.task_ids[0], description=name)
        if self._lines is not None:
            err_console.print(f"· {name}")

    def update(self, done: int, total: int) -> None:
        """``done`` of ``total`` (0: not known yet)."""
        if self._bar is not None:
            elapsed = self._bar.tasks[0].elapsed or 0.0
            rate = f"{done / elapsed:,.0f}" if elapsed else "-"
            self._bar.update(self._bar.task_ids[0], completed=done, total=total or None, rate=rate)
        if self._lines is not None:
            self._lines.update(done, total)


@contextlib.contextmanager
def reporting(what: str, unit: str, *, quiet: bool) -> Iterator[Reporter]:
    """A reporter of ``what``'s progress in ``unit``: nowhere when ``quiet`` (``--json``,
    ``-q``), else on a bar where stderr is a terminal (rich's progress module is imported
    only then: 9 ms of a run's start), else a line every ``PROGRESS_LINE_SECONDS``."""
    if quiet or not err_console.is_terminal:
        yield Reporter(None, None if quiet else _Lines(what, unit, PROGRESS_LINE_SECONDS))
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(f"{{task.fields[rate]}} {unit}/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=made(err_console), transient=True) as shown:
        shown.add_task(what, total=None, rate="-")
        yield Reporter(shown, None)
