"""A spec's SQL is untrusted: the corpus of escape attempts below is refused by the query
check before anything runs, and (defence in depth) by DuckDB's own sandbox settings on the
connection that runs a checked query."""

from __future__ import annotations

import pytest

from bulldozer.errors import SpecError
from bulldozer.spec.query import check_query, table_references

duckdb = pytest.importorskip("duckdb", reason="the sql extra is part of the test install")

T = "sample.user_item_scores"

#: (what it tries, the query, a word the refusal names)
ESCAPES = [
    ("read a file with a table function", "SELECT content FROM read_text('/etc/passwd')", "read_text"),
    ("read the runner's environment", "SELECT content FROM read_text('/proc/self/environ')", "read_text"),
    ("read bytes of a file", "SELECT content FROM read_blob('/etc/shadow')", "read_blob"),
    ("list folders", "SELECT * FROM glob('/home/*')", "glob"),
    ("fetch over the network", "SELECT * FROM read_csv('http://127.0.0.1:1/x.csv')", "read_csv"),
    (
        "read parquet files by path",
        f"SELECT * FROM {T} UNION ALL SELECT * FROM read_parquet('/tmp/*.parquet')",
        "read_parquet",
    ),
    ("sniff a file", "SELECT * FROM sniff_csv('/etc/passwd')", "sniff_csv"),
    ("a path in FROM (replacement scan)", "SELECT * FROM '/etc/passwd'", "/etc/passwd"),
    ("a URL in FROM", "SELECT * FROM 'https://example.invalid/x.parquet'", "example.invalid"),
    ("a Python object in FROM (replacement scan)", "SELECT * FROM os", "'os'"),
    ("the sources' internal registrations", "SELECT * FROM __src_0", "__src_0"),
    ("write a file", "COPY (SELECT 1) TO '/tmp/bulldozer-x.csv'", "COPY"),
    ("export the database", "EXPORT DATABASE '/tmp/bulldozer-x'", "EXPORT"),
    ("attach a database file", "ATTACH '/tmp/bulldozer-x.db' AS x", "ATTACH"),
    ("install an extension", "INSTALL httpfs", "LOAD"),  # DuckDB calls INSTALL a LOAD statement
    ("load an extension", "LOAD httpfs", "LOAD"),
    ("a pragma", "PRAGMA version", "PRAGMA"),
    ("change a setting", "SET enable_external_access = true", "SET"),
    ("call a procedure", "CALL pragma_version()", "CALL"),
    ("create a table", "CREATE TABLE sample.x AS SELECT 1", "CREATE"),
    ("two statements", f"SELECT * FROM {T}; SELECT * FROM read_text('/etc/passwd')", "2 statements"),
    ("a statement behind a line comment", f"SELECT * FROM {T} --\n; COPY (SELECT 1) TO '/tmp/x'", "2 statements"),
    ("a statement behind a block comment", f"SELECT * FROM {T} /* x */; ATTACH '/tmp/x.db'", "2 statements"),
    ("a file read in a CTE", "WITH x AS (SELECT * FROM read_text('/etc/passwd')) SELECT * FROM x", "read_text"),
    (
        "a file read in a subquery",
        f"SELECT * FROM {T} WHERE user_id IN (SELECT 1 FROM glob('/root/*'))",
        "glob",
    ),
    (
        "a file read in a scalar subquery",
        f"SELECT (SELECT content FROM read_text('/etc/hostname')) AS h FROM {T}",
        "read_text",
    ),
    ("dynamic SQL", "SELECT * FROM query('SELECT * FROM read_text(''/etc/passwd'')')", "query"),
    ("a table by dynamic name", "SELECT * FROM query_table('x')", "query_table"),
    ("the settings", "SELECT * FROM duckdb_settings()", "duckdb_settings"),
    ("a setting's value", "SELECT current_setting('home_directory') AS h", "current_setting"),
    ("an environment variable", "SELECT getenv('HOME') AS h", "getenv"),
    ("DuckDB's own catalog", "SELECT * FROM information_schema.tables", "information_schema"),
    ("a catalog-qualified table", "SELECT * FROM system.main.duckdb_settings", "catalog tables"),
    ("time travel past the pinned snapshot", f"SELECT * FROM {T} AT (VERSION => 1)", "catalog tables"),
    ("describe", f"DESCRIBE {T}", "SHOW_REF"),
    ("summarize", f"SUMMARIZE {T}", "SHOW_REF"),
    ("a statement that does not parse", "SELECT * FROM (", "does not parse"),
    # deeper than Python's recursion: one line, where the parse tree's reader raised RecursionError
    ("nesting to overflow the check", "SELECT " + "abs(" * 600 + "1" + ")" * 600 + f" AS x FROM {T}", "too deeply"),
    (
        "a file read under 200 subqueries",
        "SELECT * FROM " + "(SELECT * FROM " * 200 + "read_text('/etc/passwd')" + ")" * 200,
        "read_text",
    ),
]


@pytest.mark.parametrize(("what", "query", "named"), ESCAPES, ids=[e[0] for e in ESCAPES])
def test_every_escape_attempt_is_refused_by_the_check(what: str, query: str, named: str) -> None:
    with pytest.raises(SpecError) as refused:
        check_query(query)
    (issue,) = refused.value.issues
    assert issue.path == "data_movement.source.query"
    assert named.lower() in issue.message.lower(), issue.message


def test_the_corpus_is_large_enough() -> None:
    assert len(ESCAPES) >= 20


@pytest.mark.parametrize(
    "query",
    [
        f"SELECT user_id, item_id, locale, score FROM {T}",
        f"WITH top AS (SELECT * FROM {T} WHERE score > 0.5) SELECT * FROM top",
        f"SELECT a.user_id, count(*) AS n FROM {T} a JOIN {T} b USING (user_id) GROUP BY a.user_id",
        f"SELECT *, row_number() OVER (PARTITION BY user_id ORDER BY score) AS r FROM {T}",
        f"SELECT user_id, x FROM {T}, unnest([1, 2]) AS t(x)",
        "SELECT * FROM range(3) r(i)",
        f"SELECT * FROM (SELECT * FROM {T}) s WHERE s.user_id IN (SELECT user_id FROM {T})",
        f"SELECT 'read_text(''/etc/passwd'')' AS s FROM {T}",  # the text of a call, as a string, is data
    ],
)
def test_plain_selects_over_catalog_tables_pass(query: str) -> None:
    assert check_query(query) == [T] or check_query(query) == []


@pytest.mark.parametrize(
    ("query", "reads"),
    [
        (f"SELECT * FROM {T}", 1),
        (f"SELECT a.user_id FROM {T} a JOIN {T} b USING (user_id)", 2),
        (f"SELECT * FROM {T} WHERE user_id IN (SELECT user_id FROM {T})", 2),
        (f"WITH x AS (SELECT * FROM {T}) SELECT * FROM x a JOIN x b USING (user_id)", 1),  # DuckDB materializes x
    ],
)
def test_the_places_a_query_reads_a_table_from_are_counted(query: str, reads: int) -> None:
    """A table read from two places is copied into DuckDB before the query runs
    (``load.source``): its scan is a stream, read once."""
    assert table_references(query) == {T: reads}


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT content FROM read_text('/etc/passwd')",
        "SELECT * FROM glob('/*')",
        "SELECT * FROM read_csv('http://127.0.0.1:1/x.csv')",
        "COPY (SELECT 1) TO '/tmp/bulldozer-sandbox.csv'",
        "ATTACH '/tmp/bulldozer-sandbox.db' AS x",
        "INSTALL httpfs",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        "SELECT * FROM source_rows",  # a Python variable of this frame
    ],
)
def test_the_connection_that_runs_a_query_is_sandboxed_by_duckdb_too(statement: str) -> None:
    import pyarrow as pa

    from bulldozer.load.source import SqlSource, _connect

    source_rows = pa.table({"a": [1]})  # noqa: F841 - what a replacement scan would find
    con = _connect(SqlSource("SELECT 1", {}))
    try:
        with pytest.raises(duckdb.Error):
            con.execute(statement)
    finally:
        con.close()
