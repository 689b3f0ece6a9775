"""The log files of the processes commands start stay bounded (bulldozer.logs.log_file)."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

from bulldozer.logs import log_file


def test_one_file_a_day_then_the_next_once_it_is_full(tmp_path: Path) -> None:
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    first = log_file(tmp_path / "logs", "dal", cap_bytes=100)
    assert first == tmp_path / "logs" / f"dal-{day}.log"
    first.write_bytes(b"x" * 99)
    assert log_file(tmp_path / "logs", "dal", cap_bytes=100) == first  # not full: shared
    first.write_bytes(b"x" * 100)
    second = log_file(tmp_path / "logs", "dal", cap_bytes=100)
    assert second == tmp_path / "logs" / f"dal-{day}.1.log"
    second.write_bytes(b"x" * 100)
    assert log_file(tmp_path / "logs", "dal", cap_bytes=100).name == f"dal-{day}.2.log"
    assert log_file(tmp_path / "logs", "loader", cap_bytes=100).name == f"loader-{day}.log"  # by name


def test_old_files_are_deleted(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    old, recent, other = logs / "dal-2020-01-01.log", logs / "dal-2020-01-02.log", logs / "runs.log"
    for path in (old, recent, other):
        path.write_text("line\n")
    eight_days_ago = time.time() - 8 * 86400
    os.utime(old, (eight_days_ago, eight_days_ago))
    os.utime(other, (eight_days_ago, eight_days_ago))
    log_file(logs, "dal", keep_days=7)
    assert not old.exists()
    assert recent.exists() and other.exists()  # recent enough, or not a log of this name


def test_a_log_line_stays_one_line_and_never_drives_the_terminal() -> None:
    import logging
    import sys

    from bulldozer.logs import TextFormatter

    record = logging.LogRecord("bulldozer.x", logging.INFO, __file__, 1, "read %s", ("a\x1b[2J\nfake INFO line",), None)
    line = TextFormatter().format(record)
    assert line.endswith("bulldozer.x: read a\\x1b[2J\\nfake INFO line") and "\n" not in line
    assert record.getMessage() == "read a\x1b[2J\nfake INFO line"  # the record itself is left as it was
    try:
        raise ValueError("x")
    except ValueError:
        failed = logging.LogRecord("bulldozer.x", logging.ERROR, __file__, 1, "boom", None, sys.exc_info())
    assert "Traceback (most recent call last):\n" in TextFormatter().format(failed)  # a traceback keeps its lines
