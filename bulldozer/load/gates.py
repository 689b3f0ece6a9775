"""Quality gates: checks a new version must pass before the alias moves to it."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bulldozer.spec.models import QualityGates

__all__ = ["GateResult", "evaluate_gates"]


@dataclass(frozen=True)
class GateResult:
    gate: str
    passed: bool
    detail: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def evaluate_gates(
    gates: QualityGates, rows: int, null_counts: dict[str, int], previous_rows: int | None
) -> list[GateResult]:
    results = [
        GateResult("min_rows", rows >= gates.min_rows, f"{rows:,} rows (minimum {gates.min_rows:,})"),
    ]
    if gates.max_row_count_change is not None:
        if previous_rows:
            change = abs(rows - previous_rows) / previous_rows
            results.append(
                GateResult(
                    "max_row_count_change",
                    change <= gates.max_row_count_change,
                    f"{rows:,} rows vs {previous_rows:,} in the live version: {change:+.1%} "
                    f"(limit ±{gates.max_row_count_change:.0%})".replace("+", "±", 1),
                )
            )
        else:
            results.append(GateResult("max_row_count_change", True, "no live version to compare with"))
    for column, limit in sorted(gates.max_null_fraction.items()):
        fraction = null_counts.get(column, 0) / rows if rows else 0.0
        results.append(
            GateResult(
                f"max_null_fraction[{column}]",
                fraction <= limit,
                f"{fraction:.1%} of {column!r} is null (limit {limit:.0%})",
            )
        )
    return results
