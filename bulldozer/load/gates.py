"""Quality gates: checks a new version must pass before the alias moves to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bulldozer.spec.models import QualityGates
from bulldozer.versioning.run_state import GateSummary

if TYPE_CHECKING:
    from bulldozer.load.shadow_read import ShadowReadReport

__all__ = ["GateResult", "evaluate_gates"]


@dataclass(frozen=True)
class GateResult:
    gate: str
    passed: bool
    detail: str

    def as_dict(self) -> GateSummary:
        """As the run record keeps it."""
        return GateSummary(gate=self.gate, passed=self.passed, detail=self.detail)


def evaluate_gates(
    gates: QualityGates,
    rows: int,
    null_counts: dict[str, int],
    previous_rows: int | None,
    shadow: ShadowReadReport | None = None,
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
            said = "no live version to compare with" if previous_rows is None else "the live version holds no rows"
            results.append(GateResult("max_row_count_change", True, said))
    for column, limit in sorted(gates.max_null_fraction.items()):
        fraction = null_counts.get(column, 0) / rows if rows else 0.0
        results.append(
            GateResult(
                f"max_null_fraction[{column}]",
                fraction <= limit,
                f"{fraction:.1%} of {column!r} is null (limit {limit:.0%})",
            )
        )
    results += _shadow_gates(gates, shadow)
    return results


def _shadow_gates(gates: QualityGates, shadow: ShadowReadReport | None) -> list[GateResult]:
    """The shadow read's gates (each passes when there is no live version to compare with)."""
    out = []
    for gate, limit, kind, of in (
        ("max_missing_fraction", gates.max_missing_fraction, "missing", "sampled keys"),
        ("max_added_fraction", gates.max_added_fraction, "added", "sampled keys"),
        ("max_changed_fraction", gates.max_changed_fraction, "changed", "sampled keys both versions hold"),
    ):
        if limit is None:
            continue
        if shadow is None:
            out.append(GateResult(gate, True, "no live version to compare with"))
            continue
        fraction = getattr(shadow, f"{kind}_fraction")
        count = getattr(shadow, kind)
        out.append(
            GateResult(
                gate,
                fraction <= limit,
                f"{count:,} {kind} ({fraction:.1%} of the {of}) in a shadow read of {shadow.sampled:,} keys "
                f"vs {shadow.live} (limit {limit:.1%})",
            )
        )
    return out
