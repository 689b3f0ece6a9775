"""Check a loaded spec against the warehouse: the table exists, every named column
exists (with a "did you mean"), the filter parses, and the schema maps to protobuf.
Problems are reported as located spec issues, like the spec's own validation."""

from __future__ import annotations

from typing import Any

from bulldozer.errors import BulldozerError, SchemaError, SpecError, SpecIssue
from bulldozer.names import did_you_mean
from bulldozer.schema.iceberg import generate_proto
from bulldozer.spec.loader import LoadedSpec
from bulldozer.spec.policy import policy_issues
from bulldozer.warehouse.catalog import load_table, open_catalog, pinned_snapshot

__all__ = ["check_against_catalog", "column_issues", "order_by_issues", "require_columns", "require_filter"]


def _column_issue(
    loaded: LoadedSpec, path: tuple[str | int, ...], col: str, names: list[str], source: str = "table"
) -> SpecIssue:
    hint = f"; {hint}" if (hint := did_you_mean(col, names)) else ""
    return loaded.issue(path, f"the {source} has no column {col!r}{hint}")


def column_issues(loaded: LoadedSpec, names: list[str], source: str = "table") -> list[SpecIssue]:
    """Every column the spec names (keys, values, renames, the duplicate policy's order_by,
    the null-fraction gates) that a ``source`` (the table, the query) with the columns
    ``names`` has not, located in the spec with the closest column: what ``validate
    --catalog`` says, and a run's schema stage about the snapshot or query it reads."""
    dm = loaded.spec.data_movement
    named: list[tuple[tuple[str | int, ...], str]] = [
        *((("data_movement", "key_columns", i), col) for i, col in enumerate(dm.key_columns)),
        *((("data_movement", "value_columns", i), col) for i, col in enumerate(dm.value_columns or ())),
        *((("data_movement", "renames", col), col) for col in dm.renames),
        *(
            [(("data_movement", "duplicate_keys", "order_by"), dm.duplicate_keys.order_by)]
            if dm.duplicate_keys.order_by
            else []
        ),
        *(
            (("key_value_dal", "quality_gates", "max_null_fraction", col), col)
            for col in loaded.spec.key_value_dal.quality_gates.max_null_fraction
        ),
    ]
    known = set(names)
    return [_column_issue(loaded, path, col, names, source) for path, col in named if col not in known]


def require_columns(loaded: LoadedSpec, source_schema: Any, source: str = "table") -> None:
    """Raise SpecError with ``column_issues`` when the Iceberg schema ``source_schema`` (of
    the table, or of the query's result) lacks a column the spec names, or with
    ``order_by_issues`` when keep_latest orders by a nested one: what a run, a plan, ``proto``
    and ``client`` say before they generate a schema, which would refuse it with no place in
    the spec."""
    if unknown := column_issues(loaded, [f.name for f in source_schema.fields], source) or order_by_issues(
        loaded, source_schema
    ):
        raise SpecError(unknown)


def order_by_issues(loaded: LoadedSpec, source_schema: Any) -> list[SpecIssue]:
    """``keep_latest``'s ``order_by`` naming a struct, list or map column: DuckDB orders those
    too, so a run picked "the latest" row by a nested value, which says nothing of which row
    is newer."""
    order_by = loaded.spec.data_movement.duplicate_keys.order_by
    field = next((f for f in source_schema.fields if f.name == order_by), None)
    if field is None or field.field_type.is_primitive:
        return []
    return [
        loaded.issue(
            ("data_movement", "duplicate_keys", "order_by"),
            f"{order_by!r} is a {type(field.field_type).__name__.removesuffix('Type').lower()} column; "
            "the latest row is the one with the greatest value "
            "of a column of plain values (a timestamp, a version number)",
        )
    ]


def require_filter(loaded: LoadedSpec, table_schema: Any) -> None:
    """Raise SpecError at the spec's filter when it cannot apply to a table of the Iceberg
    ``table_schema`` (``row_filter.filter_issue``): what a run's schema stage and a plan say
    before a scan binds it (pyiceberg would plan it, or round its numbers, silently)."""
    text = loaded.spec.data_movement.filter
    if text is not None and (refused := _check_filter(loaded, text, table_schema)):
        raise SpecError(refused)


def check_against_catalog(loaded: LoadedSpec, catalog: Any = None, home: str | None = None) -> list[SpecIssue]:
    """Every problem of ``loaded`` against its catalog, and what it reaches beyond what the
    operator configured (``bulldozer.spec.policy``; empty when it is fine)."""
    refused = policy_issues(loaded)
    if any(issue.path.startswith("data_movement.catalog") for issue in refused):
        return refused  # a catalog the operator did not configure is not opened
    return [*refused, *_table_issues(loaded, catalog, home)]


def _table_issues(loaded: LoadedSpec, catalog: Any, home: str | None) -> list[SpecIssue]:
    spec = loaded.spec
    dm = spec.data_movement
    if dm.source.query is not None:
        return _check_query(loaded, dm.source.query, catalog, home)
    assert dm.source.table is not None
    try:
        catalog = catalog or open_catalog(dm.catalog, home, create=False)
        table = load_table(catalog, dm.source.table)
    except BulldozerError as exc:
        return [loaded.issue(("data_movement", "source", "table"), str(exc))]
    pinned, missing = None, []
    if dm.snapshot_id is not None or dm.ref is not None:
        pinned, lacking = pinned_snapshot(table, dm.source.table, dm.snapshot_id, dm.ref)
        if lacking is not None:
            missing = [loaded.issue(("data_movement", lacking[0]), lacking[1])]
    # the columns a run reads are those of the snapshot it reads (a pinned one may predate a
    # column, or have one since dropped); its filter binds to the table's current schema
    schema = table.schema()
    if pinned is not None and pinned.schema_id is not None:
        schema = table.metadata.schema_by_id(pinned.schema_id) or schema
    issues = column_issues(loaded, [f.name for f in schema.fields]) + order_by_issues(loaded, schema)
    if dm.filter is not None:
        issues.extend(_check_filter(loaded, dm.filter, table.schema()))
    issues.extend(missing)
    if not issues:
        try:
            generate_proto(spec, schema, dm.source.table)
        except SchemaError as exc:
            issues.append(loaded.issue(("data_movement",), str(exc)))
    return issues


def _check_filter(loaded: LoadedSpec, text: str, schema: Any) -> list[SpecIssue]:
    from bulldozer.warehouse.row_filter import filter_issue

    refused = filter_issue(text, schema)
    return [loaded.issue(("data_movement", "filter"), refused)] if refused else []


def _check_query(loaded: LoadedSpec, query: str, catalog: Any, home: str | None) -> list[SpecIssue]:
    """A query source: one read-only SELECT (``check_query``) whose every table is in the
    catalog, and whose result has every column the spec names, each of a type that maps to
    protobuf."""
    from bulldozer.spec.checks import query_tables

    where = ("data_movement", "source", "query")
    tables, issues = query_tables(loaded, query)
    if issues:
        return issues
    try:
        catalog = catalog or open_catalog(loaded.spec.data_movement.catalog, home, create=False)
    except BulldozerError as exc:
        return [loaded.issue(("data_movement", "catalog"), str(exc))]
    for name in tables:
        try:
            load_table(catalog, name)
        except BulldozerError as exc:
            issues.append(loaded.issue(where, str(exc)))
    if issues:
        return issues
    # its result's columns, as a run derives them (planned over empty tables: no row is read)
    from bulldozer.load.source import source_schema

    try:
        schema, source_name = source_schema(loaded, catalog)
        generate_proto(loaded.spec, schema, source_name)
    except SpecError as exc:
        return list(exc.issues)
    except BulldozerError as exc:
        return [loaded.issue(where, str(exc))]
    return []
