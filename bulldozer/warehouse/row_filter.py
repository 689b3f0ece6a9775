"""A spec's ``data_movement.filter``: pyiceberg's row-filter grammar, bound to the table.

The filter is untrusted text: it is only ever parsed by pyiceberg's parser (comparisons,
``IN``, ``IS [NOT] NULL``, ``IS [NOT] NAN``, ``[NOT] LIKE 'prefix%'`` of a column and
literals, with ``AND``, ``OR``, ``NOT``; no functions) and bound to the table's schema, on
every engine (the Spark engine builds Columns from the bound expression:
``bulldozer.load.engines.spark.row_filter``). ``filter_issue`` says in one line why a filter
cannot apply — it does not parse, names no column, tests a list or map column, or compares
a uuid column, which Arrow has no kernel for — checked by ``validate --catalog`` and by a
run's schema stage, before anything is loaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["GRAMMAR", "bound_filter", "filter_issue", "parse_issue"]

#: what a filter may say, for the one line that refuses one
GRAMMAR = (
    "a filter is pyiceberg's row-filter grammar: comparisons, IN, IS [NOT] NULL, IS [NOT] NAN and "
    "[NOT] LIKE 'prefix%' of a column and literals, with AND, OR, NOT (no functions)"
)


def bound_filter(text: str, schema: Any, case_sensitive: bool = True) -> Any:
    """``text`` parsed and bound to the Iceberg ``schema`` (pyiceberg raises on either)."""
    from pyiceberg.expressions import parser
    from pyiceberg.expressions.visitors import bind

    return bind(schema, parser.parse(text), case_sensitive=case_sensitive)


def _not_parsed(text: str, exc: Any) -> str:
    near = text[exc.loc : exc.loc + 30]
    return f"the filter does not parse at character {exc.loc + 1} ({near!r}): {GRAMMAR}"


def parse_issue(text: str) -> str | None:
    """Why the filter ``text`` does not parse, in one line (None: it does); what can be said
    of it without the table (a plain ``validate``)."""
    from pyiceberg.expressions import parser
    from pyparsing import ParseBaseException

    try:
        parser.parse(text)
    except ParseBaseException as exc:
        return _not_parsed(text, exc)
    return None


def filter_issue(text: str, schema: Any) -> str | None:
    """Why the filter ``text`` cannot apply to a table of ``schema``, in one line (None: it can)."""
    from pyparsing import ParseBaseException

    try:
        bound = bound_filter(text, schema)
    except ParseBaseException as exc:
        return _not_parsed(text, exc)
    except Exception as exc:  # the binder: no such column, a literal the column's type cannot hold
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"the filter cannot apply to the table: {first}"
    return next(_unevaluable(bound), None)


def _unevaluable(expr: Any) -> Iterator[str]:
    """Why pyiceberg's scan would fail mid-run on a predicate of the bound filter ``expr``:
    a list or map column (the scan cannot project one for a filter), or a uuid column compared
    with literals (Arrow has no kernel comparing its uuid type; IS NULL needs none)."""
    from pyiceberg.expressions import And, BoundLiteralPredicate, BoundPredicate, BoundSetPredicate, Not, Or
    from pyiceberg.types import ListType, MapType, UUIDType

    if isinstance(expr, And | Or):
        yield from _unevaluable(expr.left)
        yield from _unevaluable(expr.right)
    elif isinstance(expr, Not):
        yield from _unevaluable(expr.child)
    elif isinstance(expr, BoundPredicate):
        field = expr.term.ref().field
        if isinstance(field.field_type, ListType | MapType):
            kind = "list" if isinstance(field.field_type, ListType) else "map"
            yield (
                f"the filter tests the {kind} column {field.name!r}, which pyiceberg's scan cannot filter on: "
                "filter on a column of plain values"
            )
        elif isinstance(field.field_type, UUIDType) and isinstance(expr, BoundLiteralPredicate | BoundSetPredicate):
            yield (
                f"the filter compares the uuid column {field.name!r}, which pyiceberg's scan cannot evaluate: "
                "filter on another column"
            )
