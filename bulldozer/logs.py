"""Logging setup: plain text for people, one JSON object per line for machines; and the
log files of the processes a command starts (``log_file``), bounded in number and size."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bulldozer.redaction import visible

__all__ = ["LOG_FILE_CAP_BYTES", "LOG_KEEP_DAYS", "configure_logging", "log_file", "open_log"]

#: a log file is not appended to once it is this large (the next one of the day is)
LOG_FILE_CAP_BYTES = 32 * 1024 * 1024
#: log files are deleted once they are this many days old
LOG_KEEP_DAYS = 7


class TextFormatter(logging.Formatter):
    """A line per record for people: the message's control characters shown as escapes
    (``redaction.visible``), so text quoted from a table or a request keeps the record on
    its one line and never drives the terminal; a traceback keeps its lines."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        shown = logging.makeLogRecord(record.__dict__)
        shown.msg, shown.args = visible(record.getMessage()), None
        return super().format(shown)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data)


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger("bulldozer")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def log_file(folder: Path, name: str, cap_bytes: int = LOG_FILE_CAP_BYTES, keep_days: int = LOG_KEEP_DAYS) -> Path:
    """The file a process called ``name`` (``dal``, ``loader``) started now appends its log to:
    one per day (``NAME-YYYY-MM-DD.log``, UTC), shared by every such process of the day
    (each line of the JSON format carries the writer's pid), and the day's next one
    (``NAME-YYYY-MM-DD.N.log``) once it holds ``cap_bytes``. Files of ``name`` older than
    ``keep_days`` are deleted. So a home's logs stay bounded however many commands run:
    one process per command used to leave one file per command."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    cutoff = time.time() - keep_days * 86400
    for old in folder.glob(f"{name}-*.log"):
        try:
            if old.stat().st_mtime < cutoff:
                old.unlink()
        except OSError:
            pass  # another process pruned it first
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    n = 0
    while True:
        path = folder / (f"{name}-{day}.log" if n == 0 else f"{name}-{day}.{n}.log")
        try:
            if path.stat().st_size < cap_bytes:
                return path
        except FileNotFoundError:
            return path
        n += 1


def open_log(path: Path) -> int:
    """An append-only descriptor of ``path`` (created private to this user)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
