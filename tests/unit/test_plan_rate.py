"""``bulldozer plan``'s estimate: the rate an earlier run of the job measured, in rows its
load stage read per second of that stage (``load.plan.measured_rate``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bulldozer.load.plan import DEFAULT_RATE, measured_rate
from bulldozer.versioning.run_state import RunRecord


def record(
    run_id: str, mode: str = "full", rows: int = 10_000_000, load: float = 7.0, outcome: str = "succeeded", **more: Any
) -> RunRecord:
    delta = {"base": "a__v1", "files_removed": 1, "files_added": 2, "rows_read": 200_000, "added": 1, "changed": 1}
    return RunRecord(
        run_id=run_id,
        job="a",
        alias="a",
        rows=rows,
        timings={"load": load},
        outcome=outcome,
        mode=mode,
        delta={**delta, "deleted": 1} if mode == "delta" else {},  # type: ignore[typeddict-item]
        **more,
    )


def test_a_delta_runs_rate_is_the_rows_it_read_not_its_versions() -> None:
    # newest first: a delta that read 200 k rows in 0.2 s, then the full run before it
    newest_first = [record("d1", "delta", load=0.2), record("f1")]
    rate, source = measured_rate(newest_first, "local", "full")
    assert (rate, source) == (pytest.approx(10_000_000 / 7.0), "measured by local run f1")  # not 50 M rows/s
    rate, source = measured_rate(newest_first, "local", "delta")
    assert (rate, source) == (pytest.approx(1_000_000), "measured by local delta run d1")


def test_a_mode_no_run_measured_takes_the_newest_other_and_no_run_the_default() -> None:
    only_deltas = [record("d2", "delta", load=0.4), record("d1", "delta", load=0.2)]
    assert measured_rate(only_deltas, "local", "full") == (pytest.approx(500_000), "measured by local delta run d2")
    assert measured_rate([record("f1")], "local", "delta")[1] == "measured by local run f1"
    default = (DEFAULT_RATE, "default estimate (no earlier local run measured one)")
    assert measured_rate([], "local", "full") == default


def test_runs_of_another_engine_failed_or_unmeasured_are_not_taken() -> None:
    skipped = [
        record("s1", engine="spark"),
        record("x1", outcome="failed"),
        record("z1", load=0.0),
        record("e1", rows=0),
        None,  # a version without a run record
    ]
    assert measured_rate(skipped, "local", "full")[1].startswith("default estimate")
    assert measured_rate([*skipped, record("f1", load=2.0)], "local", "full") == (
        pytest.approx(5_000_000),
        "measured by local run f1",
    )
    assert measured_rate(skipped, "spark", "full")[1] == "measured by spark run s1"


def test_older_records_than_the_newest_of_the_planned_mode_are_not_read() -> None:
    def newest_first() -> Iterator[RunRecord | None]:
        yield record("d1", "delta", load=0.2)
        yield record("f2", load=5.0)
        raise AssertionError("an older record was read")

    assert measured_rate(newest_first(), "local", "full")[1] == "measured by local run f2"
