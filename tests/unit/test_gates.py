"""bulldozer.load.gates: what each quality gate says of a version before its flip."""

from __future__ import annotations

from bulldozer.load.gates import evaluate_gates
from bulldozer.spec.models import QualityGates


def _change(previous_rows: int | None, rows: int) -> tuple[bool, str]:
    gates = QualityGates(min_rows=0, max_row_count_change=0.5)
    (result,) = [r for r in evaluate_gates(gates, rows, {}, previous_rows) if r.gate == "max_row_count_change"]
    return result.passed, result.detail


def test_the_row_count_change_is_measured_against_the_live_version() -> None:
    assert _change(1_000, 1_400) == (True, "1,400 rows vs 1,000 in the live version: ±40.0% (limit ±50%)")
    assert _change(1_000, 400)[0] is False


def test_a_live_version_without_rows_is_said_as_such() -> None:
    """It said "no live version to compare with" for a live version that holds no rows."""
    assert _change(None, 10) == (True, "no live version to compare with")
    assert _change(0, 10) == (True, "the live version holds no rows")
