"""Every bad spec in tests/specs/bad is refused with located, actionable messages that
match its golden file (tests/specs/bad/NAME.expected); a changed message is a visible diff.

Regenerate the goldens after an intended change with BULLDOZER_UPDATE_GOLDENS=1."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bulldozer.errors import SpecError
from bulldozer.spec import load_spec
from tests.conftest import REPO, SPECS, update_goldens

BAD = sorted((SPECS / "bad").glob("*.yaml"))
FILE_LEVEL = {"empty", "comments_only"}  # problems of the whole file have no line


def _issues(path: Path) -> list[str]:
    rel = path.relative_to(REPO).as_posix()
    with pytest.raises(SpecError) as info:
        load_spec(rel)
    return [str(i) for i in info.value.issues]


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_spec_matches_golden(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("BULLDOZER_TEST_SURELY_UNSET", raising=False)
    lines = _issues(path)
    assert lines, "a bad spec must produce at least one issue"
    rel = path.relative_to(REPO).as_posix()
    for line in lines:
        assert line.startswith(rel + ":")
        if path.stem not in FILE_LEVEL:
            assert re.match(re.escape(rel) + r":\d+:\d+: ", line), f"no line:column in {line!r}"
        assert "Traceback" not in line
    golden = path.with_suffix(".expected")
    text = "\n".join(lines) + "\n"
    if update_goldens() or not golden.exists():
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8")


def test_every_bad_spec_has_a_golden() -> None:
    for path in BAD:
        assert path.with_suffix(".expected").exists(), f"{path.name} has no golden file"


def test_all_errors_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    lines = _issues(SPECS / "bad" / "many_errors.yaml")
    fields = {line.split(": ")[1].rstrip(":") for line in lines}
    assert {"metadata.schedule", "data_movement.key_columns[1]", "key_value_dal.alias"} <= fields


def test_cli_refuses_the_whole_corpus_without_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bulldozer.cli.main",
            "validate",
            *[str(p.relative_to(REPO)) for p in BAD],
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    for path in BAD:
        assert str(path.relative_to(REPO)) in proc.stderr


def test_file_over_one_mib_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * (1024 * 1024) + "\n")
    with pytest.raises(SpecError, match="limit is 1048576"):
        load_spec(big)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="is a directory"):
        load_spec(tmp_path)


def test_non_utf8_file(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"name: \xe9t\xe9\n")
    with pytest.raises(SpecError, match="not UTF-8"):
        load_spec(bad)
