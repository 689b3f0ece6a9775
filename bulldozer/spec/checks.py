"""What ``validate`` and ``submit`` say of a loaded spec beyond its own fields, in one place.

``spec_issues``: what it reaches beyond what the operator configured
(``bulldozer.spec.policy``), and then either everything against its catalog
(``bulldozer.schema.table_check``) or, without the catalog, its two texts in other
languages checked as text (``text_issues``): the filter (pyiceberg's row-filter grammar)
parses, and the query is one read-only SELECT over catalog tables
(``bulldozer.spec.query.check_query``). Their parsers are imported only for a spec that has
the text; a plain check imports no more of pyiceberg.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bulldozer.errors import BulldozerError, SpecError

if TYPE_CHECKING:
    from bulldozer.errors import SpecIssue
    from bulldozer.spec.loader import LoadedSpec

__all__ = ["query_tables", "spec_issues", "text_issues"]


def spec_issues(loaded: LoadedSpec, catalog: bool, home: str | None = None) -> list[SpecIssue]:
    """Every problem of ``loaded`` found beyond its fields: with ``catalog``, against the
    catalog (its table, columns, filter, query, types; ``home``: the embedded one's folder)."""
    if catalog:
        from bulldozer.schema.table_check import check_against_catalog

        return check_against_catalog(loaded, home=home)
    from bulldozer.spec.policy import policy_issues

    return [*policy_issues(loaded), *text_issues(loaded)]


def text_issues(loaded: LoadedSpec) -> list[SpecIssue]:
    """A filter that does not parse and a query the query check refuses, as located issues."""
    dm = loaded.spec.data_movement
    issues = []
    if dm.filter is not None:
        from bulldozer.warehouse.row_filter import parse_issue

        if refused := parse_issue(dm.filter):
            issues.append(loaded.issue(("data_movement", "filter"), refused))
    if dm.source.query is not None:
        issues.extend(query_tables(loaded, dm.source.query)[1])
    return issues


def query_tables(loaded: LoadedSpec, query: str) -> tuple[list[str], list[SpecIssue]]:
    """The tables the spec's ``query`` reads, or (none and) why the query check refuses it,
    as issues at the query's line."""
    from bulldozer.spec.query import check_query

    where = ("data_movement", "source", "query")
    try:
        return check_query(query), []
    except SpecError as exc:
        return [], [loaded.issue(where, issue.message) for issue in exc.issues]
    except BulldozerError as exc:  # DuckDB is not installed: a run could not read it either
        return [], [loaded.issue(where, str(exc))]
