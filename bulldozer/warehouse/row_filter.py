"""A spec's ``data_movement.filter``: pyiceberg's row-filter grammar, bound to the table.

The filter is untrusted text: it is only ever parsed by pyiceberg's parser (comparisons,
``IN``, ``IS [NOT] NULL``, ``IS [NOT] NAN``, ``[NOT] LIKE 'prefix%'`` of a column and
literals, with ``AND``, ``OR``, ``NOT``; no functions) and bound to the table's schema, on
every engine (the Spark engine builds Columns from the bound expression:
``bulldozer.load.engines.spark.row_filter``). ``filter_issue`` says in one line why a filter
cannot apply — it does not parse, names no column of the table (with the closest one), holds
a literal its column's type cannot hold as written (which pyiceberg would round or misread),
tests a list or map column, or compares a uuid column, which Arrow has no kernel for —
checked by ``validate --catalog``, ``plan`` and a run's schema stage, before anything is
loaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal, localcontext
from typing import Any

from bulldozer.names import did_you_mean
from bulldozer.redaction import first_line

__all__ = ["GRAMMAR", "filter_issue", "parse_issue"]

#: what a filter may say, for the one line that refuses one
GRAMMAR = (
    "a filter is pyiceberg's row-filter grammar: comparisons, IN, IS [NOT] NULL, IS [NOT] NAN and "
    "[NOT] LIKE 'prefix%' of a column and literals, with AND, OR, NOT (no functions)"
)


def _parsed(text: str) -> tuple[Any, str | None]:
    """``text`` parsed by pyiceberg's parser, or None and why it does not parse in one line.

    Besides pyparsing's refusal of the grammar, the parser raises what its parse actions
    raise: a ValueError for a LIKE whose ``%`` is not at the end, and pydantic's
    ValidationError for true or false under AND, OR or NOT (its And, Or and Not take no
    constants). Each is the filter's own fault, so each is a line, never a traceback."""
    from pydantic import ValidationError
    from pyiceberg.expressions import parser
    from pyparsing import ParseBaseException

    try:
        return parser.parse(text), None
    except ParseBaseException as exc:
        if exc.loc >= len(text.rstrip()):
            return None, f"the filter does not parse: it ends where more should follow: {GRAMMAR}"
        near = text[exc.loc : exc.loc + 30]
        return None, f"the filter does not parse at character {exc.loc + 1} ({near!r}): {GRAMMAR}"
    except ValidationError as exc:
        return None, (
            f"the filter does not parse: pyiceberg cannot put true or false under {exc.title.upper()}; "
            "leave the constant out"
        )
    except ValueError as exc:
        return None, f"the filter does not parse: {first_line(exc)}"


def parse_issue(text: str) -> str | None:
    """Why the filter ``text`` does not parse, in one line (None: it does); what can be said
    of it without the table (a plain ``validate``)."""
    return _parsed(text)[1]


def filter_issue(text: str, schema: Any) -> str | None:
    """Why the filter ``text`` cannot apply to a table of ``schema``, in one line (None: it can)."""
    from pyiceberg.expressions.visitors import bind

    parsed, unparsed = _parsed(text)
    if unparsed:
        return unparsed
    if unknown := next(_unknown_columns(parsed, schema), None):
        return unknown
    if mismatch := next(_literal_mismatches(parsed, schema), None):
        return mismatch
    try:
        bound = bind(schema, parsed, case_sensitive=True)
    except Exception as exc:  # the binder: no such column, a literal the column's type cannot hold
        return f"the filter cannot apply to the table: {first_line(exc)}"
    return next(_unevaluable(bound), None)


def _predicates(expr: Any) -> Iterator[Any]:
    """The predicates of a filter expression, parsed or bound, under its AND, OR and NOT, in
    the filter's order (without recursion: a filter nests as deep as it is long)."""
    from pyiceberg.expressions import And, Not, Or

    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, And | Or):
            stack += [node.right, node.left]
        elif isinstance(node, Not):
            stack.append(node.child)
        else:
            yield node


def _unknown_columns(expr: Any, schema: Any) -> Iterator[str]:
    """A column the parsed (unbound) filter ``expr`` names that the table has not, with the
    closest it has (the binder said ``Could not find field with name ratng,
    case_sensitive=True``); a nested one by its dotted path (``profile.tier``)."""
    from pyiceberg.expressions import Reference, UnboundPredicate

    for predicate in _predicates(expr):
        if not (isinstance(predicate, UnboundPredicate) and isinstance(predicate.term, Reference)):
            continue
        name = predicate.term.name
        try:
            schema.find_field(name, case_sensitive=True)
        except ValueError:
            hint = f"; {hint}" if (hint := did_you_mean(name, schema.column_names, fold_case=True)) else ""
            yield f"the filter names {name!r}, which is no column of the table{hint}"


def _literal_mismatches(expr: Any, schema: Any) -> Iterator[str]:
    """A literal in the parsed (unbound) filter ``expr`` its column's type cannot hold as written:
    - a fraction compared with an integer column, which pyiceberg's binder silently rounds to
      an integer (half to even; a string such as ``'1.5'`` it truncates), a different filter:
      ``user_id = 7.5`` kept the rows of 8, ``user_id > 1.5`` dropped those of 2;
    - a decimal column compared with a number of another scale, which the binder refuses
      with ``Could not convert 1.5 into a decimal(12, 2)``: said with the way to write it;
    - a decimal column compared with a number wider than it, which Arrow refuses mid-load;
    - a date, time or timestamp column compared with an integer, which the binder takes as a
      count since the epoch (days, or microseconds): ``signup_date > 20240101`` is a date in
      the year 57,000, and ``updated_at > 1700000000`` (seconds) 28 minutes after 1970."""
    from pyiceberg.expressions import LiteralPredicate, SetPredicate
    from pyiceberg.types import (
        DateType,
        DecimalType,
        IntegerType,
        LongType,
        TimestampNanoType,
        TimestampType,
        TimestamptzNanoType,
        TimestamptzType,
        TimeType,
    )

    temporal = DateType | TimeType | TimestampType | TimestamptzType | TimestampNanoType | TimestamptzNanoType
    for predicate in _predicates(expr):
        if not isinstance(predicate, LiteralPredicate | SetPredicate):
            continue
        try:
            field = predicate.term.bind(schema, case_sensitive=True).ref().field
        except Exception:  # no such column: the binder says so
            continue
        literals = [predicate.literal] if isinstance(predicate, LiteralPredicate) else sorted(predicate.literals)
        kind = field.field_type
        if isinstance(kind, temporal):
            number = next((lit.value for lit in literals if isinstance(lit.value, int)), None)
            if number is not None:
                yield (
                    f"the filter compares the {kind} column {field.name!r} with the number {number}: "
                    + _TEMPORAL[str(kind)]
                )
            continue
        if not isinstance(kind, IntegerType | LongType | DecimalType):
            continue
        for written in (literal.value for literal in literals):
            if (value := _number(written)) is None:
                continue  # not a number: the binder refuses it
            shown = f"{written!r}" if isinstance(written, str) else f"{value}"
            if not isinstance(kind, DecimalType):
                if value != value.to_integral_value():
                    yield (
                        f"the filter compares the integer column {field.name!r} with {shown}, which pyiceberg "
                        "would round to an integer (a different filter): compare it with an integer"
                    )
                continue
            scale, whole = kind.scale, kind.precision - kind.scale
            if value.adjusted() >= whole and value != 0:
                yield (
                    f"the filter compares the column {field.name!r}, a {kind}, with {shown}, "
                    f"which has more than its {whole} digits before the point"
                )
            # an integer is any decimal's scale, but pyiceberg takes a string only of the column's
            if value.as_tuple().exponent in ((-scale,) if isinstance(written, str) else (0, -scale)):
                continue
            with localcontext(prec=len(value.as_tuple().digits) + scale + 1):  # exact, however long
                exact = value.quantize(Decimal(1).scaleb(-scale))
            said = f"write it as {exact}" if exact == value else f"it has more than {scale}"
            yield (
                f"the filter compares the column {field.name!r}, a {kind}, with {shown}: "
                f"a number compared with it has exactly {scale} decimal places ({said})"
            )


#: how to write a value of each temporal type, and what pyiceberg makes of a number instead
_TEMPORAL = {
    "date": "pyiceberg would read it as days since 1970-01-01; write the date as a string, e.g. '2024-01-31'",
    "time": "pyiceberg would read it as microseconds since midnight; write the time as a string, e.g. '13:45:00'",
    "timestamp": (
        "pyiceberg would read it as microseconds since 1970-01-01; write the time as a string, "
        "e.g. '2024-01-31T13:45:00'"
    ),
    "timestamptz": (
        "pyiceberg would read it as microseconds since 1970-01-01 UTC; write the time as a string, "
        "e.g. '2024-01-31T13:45:00+00:00'"
    ),
    "timestamp_ns": (
        "pyiceberg would read it as a count since 1970-01-01; write the time as a string, e.g. '2024-01-31T13:45:00'"
    ),
    "timestamptz_ns": (
        "pyiceberg would read it as a count since 1970-01-01 UTC; write the time as a string, "
        "e.g. '2024-01-31T13:45:00+00:00'"
    ),
}


def _number(written: Any) -> Decimal | None:
    """A filter's literal as the number pyiceberg's binder makes of it for a numeric column:
    an integer, a decimal, or a string that holds a finite number (``'1.5'``), else None."""
    from decimal import InvalidOperation

    if isinstance(written, bool):
        return None
    if isinstance(written, int | Decimal):
        return Decimal(written)
    if isinstance(written, str):
        try:
            number = Decimal(written)
        except InvalidOperation:
            return None
        return number if number.is_finite() else None
    return None


def _unevaluable(expr: Any) -> Iterator[str]:
    """Why pyiceberg's scan would fail mid-run on a predicate of the bound filter ``expr``:
    a list or map column (the scan cannot project one for a filter), or a uuid column compared
    with literals (Arrow has no kernel comparing its uuid type; IS NULL needs none)."""
    from pyiceberg.expressions import BoundLiteralPredicate, BoundPredicate, BoundSetPredicate
    from pyiceberg.types import ListType, MapType, UUIDType

    for predicate in _predicates(expr):
        if not isinstance(predicate, BoundPredicate):
            continue
        field = predicate.term.ref().field
        if isinstance(field.field_type, ListType | MapType):
            kind = "list" if isinstance(field.field_type, ListType) else "map"
            yield (
                f"the filter tests the {kind} column {field.name!r}, which pyiceberg's scan cannot filter on: "
                "filter on a column of plain values"
            )
        elif isinstance(field.field_type, UUIDType) and isinstance(
            predicate, BoundLiteralPredicate | BoundSetPredicate
        ):
            yield (
                f"the filter compares the uuid column {field.name!r}, which pyiceberg's scan cannot evaluate: "
                "filter on another column"
            )
