"""The SQL a spec's ``source.query`` may hold: one read-only SELECT over catalog tables.

A job spec is untrusted input, so its query is checked before anything runs it, on DuckDB's
own parse tree: one statement, a SELECT, reading only ``namespace.table`` names (and its own
CTEs) and the table functions that make rows from their arguments; no PRAGMA, SET, COPY,
ATTACH, INSTALL / LOAD or CALL, no paths or table functions that read files or run SQL, no
functions that read the process's configuration. Every connection that then runs it is
sandboxed by DuckDB's own settings as well (``SANDBOX``: no file system, no network, no
extensions, no Python objects but the registered sources; locked once set up).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from bulldozer.errors import CatalogError, SpecError, SpecIssue
from bulldozer.redaction import first_line

__all__ = [
    "ALLOWED_TABLE_FUNCTIONS",
    "REFUSED_FUNCTIONS",
    "SANDBOX",
    "check_query",
    "duckdb_module",
    "table_references",
]

#: DuckDB settings of every connection that runs a spec's SQL: no file system, no network,
#: no extensions, no Python objects but the registered sources; locked once they are set up.
SANDBOX = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "allow_unsigned_extensions": False,
    "python_enable_replacements": False,
}
#: Table functions a query may call: they make rows from their arguments and read nothing.
ALLOWED_TABLE_FUNCTIONS = frozenset({"unnest", "range", "generate_series"})
#: Scalar functions a query may not call: they read the process's configuration.
REFUSED_FUNCTIONS = frozenset({"current_setting", "getenv", "getvariable", "current_database", "current_schema"})
#: DuckDB's own schemas: a query reads the catalog's tables, never these.
RESERVED_SCHEMAS = frozenset({"information_schema", "pg_catalog", "main", "temp", "system"})
#: Kinds of FROM items a query may use (SHOW / DESCRIBE / SUMMARIZE and the like are refused).
_TABLE_REFS = frozenset({"BASE_TABLE", "JOIN", "SUBQUERY", "TABLE_FUNCTION", "EXPRESSION_LIST", "EMPTY"})
_FIELD = "data_movement.source.query"
_TABLE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")


def _refuse(message: str) -> SpecError:
    return SpecError([SpecIssue("spec", _FIELD, message)])


def _walk(tree: Any) -> Iterator[dict[str, Any]]:
    """Every object of the parse tree (without recursion: a tree is as deep as the query)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(reversed(node.values()))
        elif isinstance(node, list):
            stack.extend(reversed(node))


def check_query(query: str) -> list[str]:
    """The ``namespace.table`` names a spec's query reads, once it is shown to be one
    read-only SELECT that reads only such tables (and its own CTEs). Anything else — more
    than one statement, PRAGMA / SET / COPY / ATTACH / INSTALL / LOAD / CALL, table functions
    that read files or run SQL, paths in FROM, functions that read the configuration — is
    refused with a SpecError naming the construct. The connections that then run it are
    sandboxed by DuckDB's own settings as well (``SANDBOX``)."""
    return sorted(table_references(query))


def table_references(query: str) -> dict[str, int]:
    """``check_query``'s tables, each with the number of places the query reads it from (a
    self-join, or a table in a subquery of its own query, reads it twice; a CTE read twice,
    which DuckDB materializes, once)."""
    duckdb = duckdb_module()
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise _refuse(f"the query does not parse: {first_line(exc)}") from None
    if len(statements) != 1:
        raise _refuse(f"the query must be one SELECT statement, not {len(statements)} statements")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise _refuse(f"the query must be a SELECT statement, not {kind.name}")
    con = duckdb.connect(config=SANDBOX)
    try:
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [query]).fetchall()[0][0])
    except RecursionError:
        raise _refuse("the query nests its expressions too deeply to be checked") from None
    finally:
        con.close()
    if tree.get("error"):
        raise _refuse(f"the query must be a plain SELECT: {tree.get('error_message', 'it cannot be analysed')}")
    nodes = list(_walk(tree))
    ctes = {entry["key"] for node in nodes for entry in (node.get("cte_map") or {}).get("map", [])}
    tables: dict[str, int] = {}
    for node in nodes:
        kind = node.get("type")
        if "sample" in node and "alias" in node and isinstance(kind, str):  # a FROM item
            if kind not in _TABLE_REFS:
                raise _refuse(f"the query may only read tables ({kind} is not allowed)")
            if kind == "BASE_TABLE":
                schema, name = node.get("schema_name", ""), node.get("table_name", "")
                if node.get("catalog_name") or node.get("at_clause"):
                    raise _refuse(f"the query may only read catalog tables as namespace.table, not {name!r}")
                if not schema:
                    if name in ctes:
                        continue
                    raise _refuse(f"the query reads {name!r}; name tables as namespace.table")
                if _TABLE_RE.fullmatch(f"{schema}.{name}") is None or name.startswith("__"):
                    raise _refuse(f"the query reads {schema}.{name!r}; name tables as namespace.table")
                if schema.lower() in RESERVED_SCHEMAS:
                    raise _refuse(f"the query reads {schema}.{name}; {schema} is DuckDB's schema, not the catalog's")
                tables[f"{schema}.{name}"] = tables.get(f"{schema}.{name}", 0) + 1
            elif kind == "TABLE_FUNCTION":
                function = (node.get("function") or {}).get("function_name", "")
                if function.lower() not in ALLOWED_TABLE_FUNCTIONS:
                    raise _refuse(
                        f"the query calls the table function {function}(); a query may read only catalog tables "
                        f"(allowed: {', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))})"
                    )
        elif node.get("class") == "FUNCTION" and str(node.get("function_name", "")).lower() in REFUSED_FUNCTIONS:
            raise _refuse(f"the query calls {node['function_name']}(), which reads the process's configuration")
    return tables


def duckdb_module() -> Any:
    """The ``duckdb`` module, or a CatalogError saying which extra installs it."""
    try:
        import duckdb
    except ImportError as exc:
        raise CatalogError("query sources and keep_latest need DuckDB: pip install 'bulldozer[sql]'") from exc
    return duckdb
