"""The two texts a spec writes in other languages, checked as text: the filter (pyiceberg's
row-filter grammar) parses, and the query is one read-only SELECT over catalog tables
(``bulldozer.spec.query.check_query``).

Neither needs the catalog, so a plain ``validate`` reports them at the spec's line as it
does the spec's own fields (``validate --catalog`` and a run check them again, bound to the
table). Their parsers are imported only for a spec that has the text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bulldozer.errors import BulldozerError, SpecError

if TYPE_CHECKING:
    from bulldozer.errors import SpecIssue
    from bulldozer.spec.loader import LoadedSpec

__all__ = ["text_issues"]


def text_issues(loaded: LoadedSpec) -> list[SpecIssue]:
    """A filter that does not parse and a query the query check refuses, as located issues."""
    dm = loaded.spec.data_movement
    issues = []
    if dm.filter is not None:
        from bulldozer.warehouse.row_filter import parse_issue

        if refused := parse_issue(dm.filter):
            issues.append(loaded.issue(("data_movement", "filter"), refused))
    if dm.source.query is not None:
        from bulldozer.spec.query import check_query

        where = ("data_movement", "source", "query")
        try:
            check_query(dm.source.query)
        except SpecError as exc:
            issues.extend(loaded.issue(where, issue.message) for issue in exc.issues)
        except BulldozerError as exc:  # DuckDB is not installed: a run could not read it either
            issues.append(loaded.issue(where, str(exc)))
    return issues
