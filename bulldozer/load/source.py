"""SQL for the local engine: query sources and the ``keep_latest`` duplicate policy, run by
DuckDB (``bulldozer[sql]``) over streamed pyiceberg scans.

Every table a query names (``namespace.table``) is scanned at one snapshot, pinned when
the run starts, and registered as a streaming Arrow reader, so DuckDB reads it without
copying the table into memory first. The SQL dialect is DuckDB's (joins, filters,
projections, aggregates, window functions, CTEs); a query may only name tables of the
spec's catalog. Aggregates and windows (including ``keep_latest``) hold their state in
memory, as DuckDB does.

Field numbers of a query's output: a column named like a column of a source table, with
the same type, keeps that column's Iceberg field id (and its nested ids), so a job can
move from a table to a query without breaking readers; any other column gets a number
derived from its name (stable across runs and column order), and the fields nested in a
computed struct, list or map numbers derived from their paths.
"""

from __future__ import annotations

import atexit
import contextlib
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bulldozer import scratch
from bulldozer.errors import (
    BulldozerError,
    CatalogError,
    DuplicateKeyError,
    LoadError,
    SchemaError,
    SourceDataError,
    SpecError,
    SpecIssue,
)
from bulldozer.load.batches import BATCH_ROWS, PIECE_ROWS, combined
from bulldozer.redaction import first_line
from bulldozer.settings import load_settings
from bulldozer.spec.models import JobSpec
from bulldozer.spec.query import SANDBOX, duckdb_module, table_references
from bulldozer.warehouse.files import checked_tasks, unreadable

if TYPE_CHECKING:
    from bulldozer.spec.loader import LoadedSpec

__all__ = ["QueryReader", "SqlSource", "build_sql_source", "quote", "sandboxed_connection"]


def quote(identifier: str) -> str:
    """A DuckDB identifier, quoted (embedded quotes doubled): safe for any column name."""
    return '"' + identifier.replace('"', '""') + '"'


def _nested(sql: str) -> str:
    """A checked query as a subquery: on lines of its own, so a trailing ``--`` comment
    cannot swallow the closing parenthesis."""
    return f"\n{sql}\n"


_spill: Path | None = None


def _spill_folder() -> Path:
    """This process's private folder for DuckDB to spill to (``bulldozer.scratch``: removed at
    exit, or by the next Bulldozer process if this one was killed)."""
    global _spill
    if _spill is None:
        _spill = scratch.make("query")
        atexit.register(scratch.remove, _spill)
    return _spill


def sandboxed_connection() -> Any:
    """A DuckDB connection with the ``SANDBOX`` settings (lock it once set up), its memory
    and spill bounded by the operator (``BULLDOZER_QUERY_MEMORY``, ``BULLDOZER_QUERY_SPILL``).
    DuckDB spills a query larger than its memory to ``temp_directory``, by default ``.tmp``
    in the working directory, up to 90 % of that disk: a spec's query could fill a
    scheduler's disk with files there. It spills only into a scratch folder of its own.

    Its time zone is UTC, as the Spark engine's session is: DuckDB's default is the
    machine's, so a TIMESTAMPTZ cast to a DATE or a TIMESTAMP (or formatted, or truncated
    to a day) gave another value on a scheduler's worker in New York than on one in Berlin
    — another key, even. A query wanting another zone says so (``AT TIME ZONE``)."""
    settings = load_settings()
    config: dict[str, Any] = {
        **SANDBOX,
        "temp_directory": str(_spill_folder()),
        "max_temp_directory_size": settings.query_spill.strip(),
    }
    if settings.query_memory:
        config["memory_limit"] = settings.query_memory.strip()
    con = duckdb_module().connect(config=config)
    con.execute("SET TimeZone = 'UTC'")  # not a connect option: the ICU extension defines it
    return con


@dataclass
class SqlSource:
    """A source that DuckDB runs: the SQL, the tables it reads at their pinned snapshots,
    and the Iceberg schema of its output."""

    sql: str
    tables: dict[str, tuple[Any, int]]  # "ns.table" -> (pyiceberg table, snapshot id)
    schema: Any = None
    filters: dict[str, str | None] = field(default_factory=dict)  # pushed into a table's scan
    #: the most a spec's query may write into its version, in key and value bytes
    #: (``BULLDOZER_QUERY_OUTPUT``); None: no bound (and for keep_latest over a table)
    max_output_bytes: int | None = None
    #: the tables the query reads from more than one place (a self-join): each is copied into
    #: DuckDB first (``_connect``), a table's stream being readable once
    read_more_than_once: frozenset[str] = frozenset()

    @property
    def snapshots(self) -> dict[str, int]:
        return {name: snap for name, (_, snap) in self.tables.items()}


def _storage(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Top-level extension columns (uuid) as their storage type: DuckDB reads them as BLOB."""
    if not any(isinstance(f.type, pa.BaseExtensionType) for f in batch.schema):
        return batch
    arrays = [c.storage if isinstance(c.type, pa.BaseExtensionType) else c for c in batch.columns]
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def _storage_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema(
        [pa.field(f.name, f.type.storage_type if isinstance(f.type, pa.BaseExtensionType) else f.type) for f in schema]
    )


def _as_declared(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` in the types ``schema`` declares for the stream DuckDB reads. pyiceberg keeps
    a file's own Arrow types where they mean the same (``string`` from a file Spark, Trino or
    pyarrow wrote; ``large_string`` from one pyiceberg wrote), while the stream's schema says
    ``large_string``; DuckDB reads a batch's buffers as the schema says, not as the batch
    does: a list's 32-bit offsets read as 64-bit failed the query on a table Spark wrote to
    ("offsets 4294967296 to 8392366098336 do not fit its child"), and could read other
    bytes than the rows'."""
    return batch if batch.schema.equals(schema) else batch.cast(schema)


#: how many of a query's table's files are read ahead at once, each on a thread of its own,
#: and how many batches (of about ``BATCH_BYTES`` at most) each reads ahead
FILES_AHEAD = 3
FILE_DEPTH = 4


def files_ahead(reader: Any, tasks: list[Any]) -> Iterator[pa.RecordBatch]:
    """The batches of ``tasks``' files in order, read by the load's own split reader
    (``reader``: a ``local.SplitReader``; positional and equality deletes applied, batches
    bounded by their bytes), the next ``FILES_AHEAD`` files at once, each at most
    ``FILE_DEPTH`` batches ahead.

    pyiceberg's reader, which read a query's tables, decodes every file whole on its
    threads as fast as they go and keeps what the query has not taken yet: a query over a
    10 M-row table held all of it (792 MB peak against 576 MB for the same rows as a table
    source), a larger table the machine's memory. This holds at most
    ``FILES_AHEAD * (FILE_DEPTH + 1)`` batches."""
    from collections import deque
    from contextlib import ExitStack

    from bulldozer.load.engines.local import with_next_file
    from bulldozer.load.prefetch import read_ahead

    upcoming = iter(with_next_file(tasks))
    reading: deque[tuple[ExitStack, Iterator[pa.RecordBatch]]] = deque()

    def start_next() -> None:
        item = next(upcoming, None)
        if item is not None:
            stack = ExitStack()
            task, following = item
            batches = stack.enter_context(read_ahead(reader.batches(task, following), FILE_DEPTH, "query-file"))
            reading.append((stack, batches))

    try:
        for _ in range(FILES_AHEAD):
            start_next()
        while reading:
            stack, batches = reading[0]
            yield from batches
            reading.popleft()
            stack.close()
            start_next()
    finally:
        for stack, _ in reading:
            stack.close()


def _reader(
    name: str, table: Any, snapshot_id: int, row_filter: str | None, failures: list[BulldozerError]
) -> pa.RecordBatchReader:
    """The table's rows at ``snapshot_id`` as a stream DuckDB reads; a data file that cannot
    be read, or is refused, is added to ``failures`` (DuckDB says it with the Python
    traceback in its own message: ``_bounded`` says this instead)."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from bulldozer.load.engines.local import SplitReader

    scan = table.scan(snapshot_id=snapshot_id, row_filter=row_filter or AlwaysTrue())
    # the files the query may read: under the table's location (warehouse.files)
    tasks = checked_tasks(scan, spark_reads=False)
    projected = scan.projection()
    batches = files_ahead(SplitReader.of(table, scan), tasks)

    def stream() -> Iterator[pa.RecordBatch]:
        try:
            for batch in batches:
                yield _as_declared(_storage(batch), schema)
        except BulldozerError as exc:  # a file unreadable, or not the table's (warehouse.file_io)
            failures.append(exc)
            raise
        except (OSError, pa.ArrowException) as exc:
            failures.append(unreadable(f"a data file of {name} at snapshot {snapshot_id}", exc))
            raise failures[-1] from exc

    schema = _storage_schema(schema_to_pyarrow(projected, include_field_ids=False))
    return pa.RecordBatchReader.from_batches(schema, stream())


def _connect(source: SqlSource, empty: bool = False, failures: list[BulldozerError] | None = None) -> Any:
    """A sandboxed connection with the source's tables (``_add_tables``)."""
    con = sandboxed_connection()
    try:
        _add_tables(con, source, empty, failures if failures is not None else [])
    except BaseException:
        con.close()
        raise
    return con


def _add_tables(con: Any, source: SqlSource, empty: bool, said: list[BulldozerError]) -> None:
    """A view in ``con`` of each of the source's tables (empty ones with ``empty``), or a copy
    of one the query reads from more than one place; a data file its query cannot read is
    added to ``said``. The configuration is locked after."""
    schemas = set()
    for i, (name, (table, snap)) in enumerate(sorted(source.tables.items())):
        namespace, table_name = name.split(".")
        if empty:
            arrow_schema = _storage_schema(table.scan(snapshot_id=snap).projection().as_arrow())
            con.register(f"__src_{i}", pa.Table.from_batches([], schema=arrow_schema))
        else:
            con.register(f"__src_{i}", _reader(name, table, snap, source.filters.get(name), said))
        if namespace not in schemas:
            con.execute(f"CREATE SCHEMA {quote(namespace)}")
            schemas.add(namespace)
        # a stream is read once: a table the query reads from two places (a self-join) is
        # copied into DuckDB first (in the memory and spill space the operator allows a query),
        # where its second scan failed "This RecordBatchReader has already been consumed"
        kind = "TABLE" if name in source.read_more_than_once and not empty else "VIEW"
        with _bounded(said):
            con.execute(f"CREATE {kind} {quote(namespace)}.{quote(table_name)} AS SELECT * FROM __src_{i}")
    con.execute("SET lock_configuration = true")


class QueryReader:
    """A query's rows as record batches: the source's query (optionally only ``columns``),
    or ``sql`` over the source's tables, run when first iterated.

    DuckDB runs it on a thread of its own (``read_ahead``), whoever iterates, and
    ``interrupt`` stops it from any thread. In the main thread DuckDB turned a signal into
    its own ``RuntimeError: Query interrupted`` (a SIGTERM the scheduler sent failed the run
    as a query error, the termination lost); on another thread, one waiting for the next
    batch (an aggregate over a huge input may compute for hours before its first) never saw
    its consumer go, so a run told to stop waited for it."""

    def __init__(
        self,
        source: SqlSource,
        columns: list[str] | None = None,
        batch_rows: int = BATCH_ROWS,
        sql: str | None = None,
    ) -> None:
        if sql is None:
            sql = source.sql
            if columns is not None:
                sql = f"SELECT {', '.join(quote(c) for c in columns)} FROM ({_nested(sql)})"
        self._source, self._sql, self._batch_rows = source, sql, batch_rows
        self._con: Any = None
        self._interrupted = False

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        from bulldozer.load.prefetch import read_ahead

        with read_ahead(self._batches(), 1, "query", self.interrupt) as batches:
            yield from batches

    def _batches(self) -> Iterator[pa.RecordBatch]:
        failures: list[BulldozerError] = []
        con = self._con = sandboxed_connection()  # interruptible from here on: a table's copy too
        try:
            if self._interrupted:  # told to stop before the query began
                return
            _add_tables(con, self._source, False, failures)
            with _bounded(failures):
                yield from combined(con.sql(self._sql).to_arrow_reader(PIECE_ROWS), self._batch_rows)
        finally:
            self._con = None
            con.close()

    def interrupt(self) -> None:
        """Stop the query, now or as soon as it runs (an error where it is iterated)."""
        self._interrupted = True
        con = self._con
        if con is not None:
            with contextlib.suppress(duckdb_module().Error):  # closed meanwhile: nothing runs
                con.interrupt()


@contextlib.contextmanager
def _bounded(failures: list[BulldozerError]) -> Iterator[None]:
    """DuckDB running out of the memory and spill space the operator allows a query, as one
    line saying so (DuckDB's own advice, SET or PRAGMA, is not the spec's to follow); a
    value the query cannot compute from the rows (a cast out of range, ...: DuckDB's
    DataError) as a SourceDataError, which a scheduler does not retry (the same rows fail
    the same way; it was a raw DuckDB exception, retried as if transient); a data file the
    query's tables could not read (``failures``) as that file's error."""
    duckdb = duckdb_module()
    try:
        yield
    except (duckdb.Error, OSError, pa.ArrowException) as exc:
        if failures:  # DuckDB says it as its own error, or Arrow's as the query's rows stream out
            raise failures[0] from None
        if not isinstance(exc, duckdb.Error):
            raise
        if isinstance(exc, duckdb.DataError):
            raise SourceDataError(f"the query failed on the source rows: {first_line(exc)}") from None
        if isinstance(exc, duckdb.OutOfMemoryException):
            settings = load_settings()
            first = first_line(exc)
            raise LoadError(
                f"the query needs more than the memory and disk the operator allows a spec's query "
                f"(BULLDOZER_QUERY_MEMORY {settings.query_memory or 'unset: 80 % of RAM'}, BULLDOZER_QUERY_SPILL "
                f"{settings.query_spill.strip()}): {first}"
            ) from None
        raise


def _order_value(schema: Any, order_by: str) -> str:
    """keep_latest's ordering value: the ``order_by`` column, a NaN in a float column taken
    as no value (NULL: never the latest, as a null is not). DuckDB orders NaN above every
    number, so a row whose order_by was NaN was kept as the newest of its key."""
    from pyiceberg.types import DoubleType, FloatType

    o = quote(order_by)
    if isinstance(schema.find_field(order_by).field_type, FloatType | DoubleType):
        return f"(CASE WHEN isnan({o}) THEN NULL ELSE {o} END)"
    return o


def _keep_latest(sql: str, keys: list[str], order: str) -> str:
    """``sql``'s rows, one per key: the one with the greatest ``order`` (``_order_value``)."""
    k = ", ".join(quote(c) for c in keys)
    return (
        f"SELECT * EXCLUDE (__bulldozer_rank) FROM (SELECT *, row_number() OVER "
        f"(PARTITION BY {k} ORDER BY {order} DESC NULLS LAST) AS __bulldozer_rank FROM ({_nested(sql)})) "
        f"WHERE __bulldozer_rank = 1"
    )


def check_ties(source: SqlSource, base_sql: str, keys: list[str], order_by: str, order: str) -> None:
    """keep_latest needs one latest row per key: refuse keys whose rows tie on ``order_by``
    (their greatest ``order``, ``_order_value``, shared by several rows)."""
    k = ", ".join(quote(c) for c in keys)
    sql = (
        f"SELECT {k} FROM (SELECT {k}, {order} AS __o, max({order}) OVER (PARTITION BY {k}) AS __m "
        f"FROM ({_nested(base_sql)})) WHERE __o IS NOT DISTINCT FROM __m GROUP BY {k} HAVING count(*) > 1 LIMIT 3"
    )
    ties = [row for batch in QueryReader(source, sql=sql) for row in batch.to_pylist()]
    if ties:
        shown = ", ".join(str(row) for row in ties)
        raise DuplicateKeyError(
            f"duplicate_keys keep_latest: rows with the same key tie on {order_by!r} (the latest is ambiguous), "
            f"e.g. {shown}"
        )


# ----------------------------------------------------------------- output schema


def _signature(t: pa.DataType, uuid_as_text: bool = False) -> str:
    if isinstance(t, pa.UuidType) and uuid_as_text:
        return "string"
    if isinstance(t, pa.BaseExtensionType):
        return _signature(t.storage_type)
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{_signature(f.type, uuid_as_text)}" for f in t) + ">"
    if pa.types.is_map(t):
        return f"map<{_signature(t.key_type, uuid_as_text)},{_signature(t.item_type, uuid_as_text)}>"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"list<{_signature(t.value_type, uuid_as_text)}>"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary"
    if pa.types.is_timestamp(t):
        return f"timestamp[{t.unit}{', tz' if t.tz else ''}]"
    return str(t)


def derived_field_id(path: str) -> int:
    """The field number of a computed column (or a field nested in one), from its path:
    stable across runs and column order."""
    return 1_000_000 + zlib.crc32(path.encode()) % 500_000_000


def _derived_type(name: str, t: pa.DataType) -> Any:
    """The Iceberg type of a computed column; fields nested in it are numbered from their
    paths (``name.field``, ``name.element``, ``name.key``, ``name.value``)."""
    from pyiceberg import types as it

    if pa.types.is_boolean(t):
        return it.BooleanType()
    if pa.types.is_uint64(t):  # stored as a long, a value past 2^63 - 1 became a negative one
        raise SchemaError(
            f"the column {name!r} is an unsigned 64-bit integer (DuckDB's hash() returns one), which a long "
            "cannot hold past 9223372036854775807: cast it in the query, to BIGINT where every value fits "
            "(a larger one then fails the run) or to DECIMAL(20, 0), which holds them all"
        )
    if pa.types.is_integer(t):
        return it.IntegerType() if t.bit_width <= 32 and pa.types.is_signed_integer(t) else it.LongType()
    if pa.types.is_float32(t):
        return it.FloatType()
    if pa.types.is_floating(t):
        return it.DoubleType()
    if pa.types.is_decimal(t):
        return it.DecimalType(t.precision, t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return it.StringType()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return it.BinaryType()
    if pa.types.is_date(t):
        return it.DateType()
    if pa.types.is_time(t):
        return it.TimeType()
    if pa.types.is_timestamp(t):
        return it.TimestamptzType() if t.tz else it.TimestampType()
    if pa.types.is_struct(t):
        return it.StructType(
            *[
                it.NestedField(
                    derived_field_id(f"{name}.{f.name}"),
                    f.name,
                    _derived_type(f"{name}.{f.name}", f.type),
                    required=not f.nullable,
                )
                for f in t
            ]
        )
    if pa.types.is_map(t):
        return it.MapType(
            derived_field_id(f"{name}.key"),
            _derived_type(f"{name}.key", t.key_type),
            derived_field_id(f"{name}.value"),
            _derived_type(f"{name}.value", t.item_type),
            value_required=not t.item_field.nullable,
        )
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return it.ListType(
            derived_field_id(f"{name}.element"),
            _derived_type(f"{name}.element", t.value_type),
            element_required=not t.value_field.nullable,
        )
    raise SchemaError(f"the column {name!r} has type {t}, which Bulldozer cannot store{_cast_hint(t)}")


#: DuckDB types whose Arrow form is not their value, and the cast that keeps it
_LOSSY_TYPES = {
    "TIME WITH TIME ZONE": "a TIME WITH TIME ZONE, whose offset Arrow drops (12:00+05:00 arrives as 12:00): "
    "cast it in the query, to a TIME (its wall-clock time) or with a date to a TIMESTAMPTZ",
    "BIT": "a BIT string, which Arrow carries as DuckDB's internal bytes: cast it in the query, "
    "e.g. to VARCHAR ('101')",
}


def _refuse_lossy(relation: Any) -> None:
    """A query's column (or a field nested in one) whose DuckDB type Arrow does not carry
    as its value, refused saying which cast to write; DuckDB's own types are read here,
    since the Arrow ones no longer tell (a TIMETZ is a plain time64 there)."""
    for name, duck_type in zip(relation.columns, relation.types, strict=True):
        text = str(duck_type)
        for lossy, why in _LOSSY_TYPES.items():
            if re.search(rf"(^|[\s(,]){lossy}($|[\s),\[])", text):
                raise SchemaError(f"the column {name!r} is {why}" + (f" (its type: {text})" if text != lossy else ""))


def _cast_hint(t: pa.DataType) -> str:
    """How to write a query's column of type ``t`` as one Bulldozer stores, where one cast does."""
    if pa.types.is_dictionary(t):
        return " (an ENUM: cast it to its values' type in the query, e.g. CAST(col AS VARCHAR))"
    if pa.types.is_fixed_size_list(t):
        return " (an ARRAY of fixed size: cast it to a list in the query, e.g. CAST(col AS FLOAT[]))"
    if pa.types.is_interval(t) or pa.types.is_duration(t):
        return " (an INTERVAL: store a number in the query, e.g. epoch(col) for its seconds)"
    if pa.types.is_null(t):
        return " (a bare NULL has no type: give it one in the query, e.g. CAST(NULL AS VARCHAR))"
    return ""


def _ids(nf: Any) -> list[int]:
    from pyiceberg.types import ListType, MapType, StructType

    out = [nf.field_id]
    t = nf.field_type
    if isinstance(t, StructType):
        for child in t.fields:
            out += _ids(child)
    elif isinstance(t, ListType):
        out += _ids(t.element_field)
    elif isinstance(t, MapType):
        out += _ids(t.key_field) + _ids(t.value_field)
    return out


def output_schema(arrow_schema: pa.Schema, sources: list[Any], uuid_as_text: bool = False) -> Any:
    """The Iceberg schema of a query's output (see the module docstring for the numbers).
    ``uuid_as_text``: a source's uuid column arrives as its text (Spark reads Iceberg's
    uuid as a string) and keeps its uuid field; the encoder parses the text."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField

    known: dict[str, Any] = {}
    for schema in sources:
        for nf in schema.fields:
            known.setdefault(nf.name, nf)
    fields = []
    owner: dict[int, str] = {}
    for f in arrow_schema:
        src = known.get(f.name)
        if src is not None and _signature(schema_to_pyarrow(src.field_type), uuid_as_text) == _signature(f.type):
            # required where the table requires it and the output cannot hold a null (a
            # DataFrame read from the table keeps that; a query's output is always nullable)
            nf = NestedField(src.field_id, f.name, src.field_type, required=src.required and not f.nullable)
        else:
            nf = NestedField(derived_field_id(f.name), f.name, _derived_type(f.name, f.type), required=False)
        for fid in _ids(nf):
            if fid in owner:
                raise SchemaError(
                    f"the query's columns {owner[fid]!r} and {f.name!r} would share field number {fid}; "
                    "rename one of them in the query"
                )
            owner[fid] = f.name
        fields.append(nf)
    return Schema(*fields)


def build_sql_source(loaded: LoadedSpec, catalog: Any, schema_of: Any) -> SqlSource:
    """The SqlSource of a spec whose source is a query, or a table with keep_latest.
    ``schema_of(table, snapshot_id)`` gives a table's schema at a snapshot. A query the spec
    cannot have (``check_query``) or DuckDB cannot bind, and a column the spec names that the
    source lacks (``table_check.require_columns``), are refused at the spec's line."""
    try:
        return _sql_source(loaded, catalog, schema_of)
    except SpecError as exc:
        raise loaded.located(exc) from None


def _sql_source(loaded: LoadedSpec, catalog: Any, schema_of: Any) -> SqlSource:
    from bulldozer.schema.table_check import require_columns
    from bulldozer.warehouse.catalog import load_table, read_snapshot

    spec = loaded.spec
    dm = spec.data_movement
    references = table_references(dm.source.query) if dm.source.query else {dm.source.table or "": 1}
    names = sorted(references)
    tables = {}
    for name in names:
        table = load_table(catalog, name)
        tables[name] = (table, read_snapshot(table, name, dm.snapshot_id, dm.ref).snapshot_id)
    if dm.source.query:
        base = dm.source.query
        filters: dict[str, str | None] = {}
    else:
        table_name = names[0]
        namespace, name = table_name.split(".")
        base = f"SELECT * FROM {quote(namespace)}.{quote(name)}"
        filters = {table_name: dm.filter}
    twice = frozenset(name for name, count in references.items() if count > 1)
    source = SqlSource(base, tables, filters=filters, read_more_than_once=twice)
    if dm.source.query:
        source.max_output_bytes = load_settings().query_output
        con = _connect(source, empty=True)
        try:
            try:
                relation = con.sql(f"SELECT * FROM ({_nested(base)}) LIMIT 0")
                arrow_schema = relation.to_arrow_table().schema
            except Exception as exc:  # DuckDB's binder / catalog errors
                raise SpecError(
                    [SpecIssue("spec", "data_movement.source.query", f"the query cannot run: {first_line(exc)}")]
                ) from None
            _refuse_lossy(relation)
        finally:
            con.close()
        source.schema = output_schema(arrow_schema, [schema_of(t, s) for t, s in tables.values()])
    else:
        table, snap = tables[names[0]]
        source.schema = schema_of(table, snap)
    # before the ties are looked for: that query names the key and order_by columns
    require_columns(loaded, source.schema, "query" if dm.source.query else "table")
    if dm.duplicate_keys.policy == "keep_latest":
        assert dm.duplicate_keys.order_by is not None
        order = _order_value(source.schema, dm.duplicate_keys.order_by)
        check_ties(source, base, list(dm.key_columns), dm.duplicate_keys.order_by, order)
        source.sql = _keep_latest(base, list(dm.key_columns), order)
    return source


def schema_at(table: Any, snapshot_id: int) -> Any:
    """``table``'s Iceberg schema as of ``snapshot_id``."""
    snapshot = table.snapshot_by_id(snapshot_id)
    if snapshot is None:
        raise CatalogError(f"table has no snapshot {snapshot_id}")
    if snapshot.schema_id is not None:
        for schema in table.metadata.schemas:
            if schema.schema_id == snapshot.schema_id:
                return schema
    return table.schema()


def source_label(spec: JobSpec) -> str:
    """The source's name in the generated schema's comments (``lake.<table>`` or ``query``):
    part of the stored descriptor, so every place that builds one must use this."""
    table = spec.data_movement.source.table
    return f"lake.{table}" if table else "query"


def source_schema(loaded: LoadedSpec, catalog: Any) -> tuple[Any, str]:
    """The Iceberg schema the job's protobuf schema is derived from, and the source's name in
    the generated file: the table's at the snapshot the spec pins, else the table's current
    schema (what its next snapshot carries), or a query's result schema (planned over empty
    tables: no row is read). A column the spec names that it lacks is refused at the spec's
    line (``table_check.require_columns``)."""
    from bulldozer.schema.table_check import require_columns
    from bulldozer.warehouse.catalog import load_table

    spec = loaded.spec
    dm = spec.data_movement
    if dm.source.query is not None or dm.duplicate_keys.policy == "keep_latest":
        return build_sql_source(loaded, catalog, schema_at).schema, source_label(spec)
    assert dm.source.table is not None
    table = load_table(catalog, dm.source.table)
    schema = schema_at(table, dm.snapshot_id) if dm.snapshot_id else table.schema()
    require_columns(loaded, schema, "table")
    return schema, source_label(spec)
