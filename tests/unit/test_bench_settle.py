"""A benchmark measures the embedded store at its size (bench.common.settle): the runs
before the rounds grow its file until a run writes only into pages the file holds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bench.common import CliRun, grew_after_settling, measured_growth, settle, store_bytes

MIB = 2**20


def fake_runs(home: Path, growth: list[int]) -> tuple[list[int], Callable[[], CliRun]]:
    """A run that grows the store's file by the next of ``growth`` bytes (0 once they run out)."""
    store = home / "kv" / "data.mdb"
    done: list[int] = []

    def run() -> CliRun:
        store.parent.mkdir(parents=True, exist_ok=True)
        grow = growth[len(done)] if len(done) < len(growth) else 0
        with store.open("ab") as f:
            f.write(b"\0" * grow)
        done.append(grow)
        return CliRun({}, 0.5 + len(done), 0, 0)

    return done, run


def test_settling_runs_until_the_file_stops_growing(tmp_path: Path) -> None:
    done, run = fake_runs(tmp_path, [8 * MIB, 4 * MIB, 2 * MIB, 10_000])
    runs = settle(run, tmp_path)
    # the fourth run grew it by under 1 %: the run records' pages, not room for a version
    assert [r["grew_bytes"] for r in runs] == [8 * MIB, 4 * MIB, 2 * MIB, 10_000]
    assert runs[0]["seconds"] == 1.5 and runs[-1]["bytes"] == store_bytes(tmp_path) == 14 * MIB + 10_000
    assert len(done) == 4


def test_settling_stops_after_most_runs_and_at_once_on_a_settled_store(tmp_path: Path) -> None:
    done, run = fake_runs(tmp_path, [MIB] * 10)
    assert len(settle(run, tmp_path, most=3)) == 3 == len(done)
    _, run = fake_runs(tmp_path, [])
    assert [r["grew_bytes"] for r in settle(run, tmp_path)] == [0]


def test_growth_in_the_measured_runs_is_told_beyond_one_percent(tmp_path: Path) -> None:
    assert store_bytes(tmp_path) == 0  # no store yet
    _, run = fake_runs(tmp_path, [100 * MIB, 3 * MIB])
    settled = settle(run, tmp_path, most=1)
    done, grew = measured_growth(run, tmp_path)
    assert isinstance(done, CliRun) and grew == 3 * MIB
    assert grew_after_settling(settled, grew) == "; it grew 3 MiB more in the measured runs"
    assert grew_after_settling(settled, MIB) == ""
