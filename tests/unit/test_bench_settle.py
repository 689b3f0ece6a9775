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


def test_a_steady_spec_is_the_template_with_versions_dropped_as_they_retire(tmp_path: Path) -> None:
    from datetime import timedelta

    from bench.common import steady_spec
    from bench.side_by_side import SAMPLE_SPEC
    from bulldozer.spec.loader import load_spec

    template = load_spec(SAMPLE_SPEC).spec
    assert (template.key_value_dal.retention.keep_versions, template.key_value_dal.retention.grace_period) == (
        2,
        timedelta(hours=24),
    )  # under it, every run a benchmark makes keeps its version: the store grows for good
    steady = load_spec(steady_spec(SAMPLE_SPEC, tmp_path / "steady.yaml")).spec
    retention = steady.key_value_dal.retention
    assert (retention.keep_versions, retention.grace_period) == (1, timedelta(0))
    mended = template.model_copy(
        update={"key_value_dal": template.key_value_dal.model_copy(update={"retention": retention})}
    )
    assert steady == mended  # nothing else of the job changed
