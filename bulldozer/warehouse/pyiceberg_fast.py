"""The one place Bulldozer goes past pyiceberg's public API, each for a measured speed gain.

Everything else reads Iceberg through pyiceberg's public API (catalogs, ``Table.scan``,
``plan_files``, ``ArrowScan.to_record_batches``). The paths here are shortcuts; each one
falls back to the public API at run time when the pieces it needs are missing, and
``tests/unit/test_pyiceberg_fast.py`` fails loudly (naming the piece) as soon as an
installed pyiceberg no longer has them, so a pyiceberg upgrade is a decision, not a
silent slowdown. They are written against ``PYICEBERG`` (pyproject.toml pins the same range).

1. ``parquet_batches``: a Parquet task read by the Parquet file's own batch reader, a
   batch of bounded bytes at a time, with pyiceberg's private helpers for the Iceberg side
   (field-id projection, name mapping, partition values of missing columns, positional
   deletes, the row filter, the cast to the requested schema). pyiceberg's reader goes
   through Arrow's dataset scanner, which decodes a whole row group before the first
   batch (a 1 M-row group kept the encoder and the DAL idle for 0.3-0.45 s at a load's
   start) and takes no batch size (131,072 rows whatever a row holds).
   A local file's columns are read a piece at a time (``read_options``), not its whole row
   group's at once.
2. ``streaming_reader``: any other task (ORC) through pyiceberg's own (private) per-task
   streaming reader, batches as they are decoded; the public ``to_record_batches`` collects
   a whole file's batches into a list first (memory of a whole file).
3. ``embedded_metadata_location``: the embedded catalog's current metadata file of a
   table, read from its SQLite file directly, as ``SqlCatalog.load_table`` looks it up;
   opening the ``SqlCatalog`` costs 0.2 s of SQLAlchemy imports, a tenth of a small load.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from bulldozer.warehouse.files import committed_file, opened_size

__all__ = [
    "PRIVATE_ARROW_SCAN_ATTRIBUTES",
    "PRIVATE_MODULE_FUNCTIONS",
    "PYICEBERG",
    "dictionary_entries",
    "embedded_metadata_location",
    "parquet_batches",
    "read_options",
    "rows_per_batch",
    "streaming_reader",
]

#: The pyiceberg releases these shortcuts are written against (as pinned in pyproject.toml).
PYICEBERG = ">=0.12,<0.13"
#: Private functions of ``pyiceberg.io.pyarrow`` used here.
PRIVATE_MODULE_FUNCTIONS = (
    "_get_column_projection_values",
    "_to_requested_schema",
    "_read_all_delete_files",
    "_combine_positional_deletes",
)
#: Private members of ``pyiceberg.io.pyarrow.ArrowScan`` used here.
PRIVATE_ARROW_SCAN_ATTRIBUTES = (
    "_bound_row_filter",
    "_case_sensitive",
    "_table_metadata",
    "_projected_schema",
    "_io",
    "_projected_field_ids",
    "_record_batches_from_scan_tasks_and_deletes",
)


def streaming_reader(arrow_scan: Any) -> Callable[[Any], Iterator[pa.RecordBatch]] | None:
    """pyiceberg's reader of one task, yielding batches as Arrow decodes each row group, or
    None when this pyiceberg lacks the (private) pieces it is made of."""
    from pyiceberg.io import pyarrow as iceberg_arrow

    stream = getattr(arrow_scan, "_record_batches_from_scan_tasks_and_deletes", None)
    read_deletes = getattr(iceberg_arrow, "_read_all_delete_files", None)
    if stream is None or read_deletes is None:
        return None
    return lambda task: stream([task], read_deletes(arrow_scan._io, [task]))


def parquet_batches(arrow_scan: Any, task: Any, batch_rows: int, batch_bytes: int) -> Iterator[pa.RecordBatch] | None:
    """A Parquet task's batches from the file's own batch reader, at most ``batch_rows``
    rows and, by the file's own sizes, about ``batch_bytes`` at a time (``rows_per_batch``),
    or None when pyiceberg's reader must read the task: a format other than Parquet, a
    scan's row limit, or a pyiceberg without the (private) helpers this is made of. The
    Iceberg side is pyiceberg's own, as its reader does it: file columns are matched to the
    table's by field id (or the table's name mapping), columns a file lacks come from its
    partition or as nulls, positional deletes (delete files, deletion vectors) drop their
    rows, the row filter is translated to the file's columns and applied to each batch, and
    every batch is cast to the requested schema. pyiceberg's reader takes no batch size: a
    filtered or merge-on-read table of wide rows was read 131,072 rows a batch, with Arrow's
    read-ahead of 16 batches (a batch of 1,000 rows of 100 KB: 100 MB, where this reads 16 MiB
    batches). Row groups the filter rules out by their statistics are skipped, as there."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.expressions.visitors import bind, translate_column_names
    from pyiceberg.io import pyarrow as iceberg_arrow
    from pyiceberg.manifest import FileFormat
    from pyiceberg.schema import prune_columns

    from bulldozer.warehouse.files import verify_files

    names = (
        "pyarrow_to_schema",
        "_get_column_projection_values",
        "_to_requested_schema",
        "expression_to_pyarrow",
        "_read_all_delete_files",
        "_combine_positional_deletes",
    )
    helpers: list[Any] = [getattr(iceberg_arrow, name, None) for name in names]
    scan_state: list[Any] = [
        getattr(arrow_scan, a, None)
        for a in ("_bound_row_filter", "_table_metadata", "_projected_schema", "_io", "_case_sensitive")
    ]
    if (
        None in helpers
        or None in scan_state
        or not hasattr(type(arrow_scan), "_projected_field_ids")
        or getattr(arrow_scan, "_limit", None) is not None
        or task.file.file_format != FileFormat.PARQUET
    ):
        return None
    file_to_schema, missing_field_values, to_requested_schema, to_arrow_filter, read_deletes, kept_rows = helpers
    row_filter, metadata, projected, io, case_sensitive = scan_state
    downcast = getattr(arrow_scan, "_downcast_ns_timestamp_to_us", None)
    if downcast is None:
        downcast = metadata.format_version <= 2  # pyiceberg's own default

    def batches() -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        deleted = None
        if task.delete_files:
            verify_files(io, list(task.delete_files))  # the snapshot's delete files, as committed
            deleted = read_deletes(io, [task]).get(task.file.file_path)
        with io.new_input(task.file.file_path).open() as fin:
            parquet = pq.ParquetFile(fin, **read_options(task.file.file_path))
            committed_file(task.file, parquet.metadata.num_rows, opened_size(fin))  # the snapshot's file
            file_schema = file_to_schema(
                parquet.schema_arrow,
                metadata.name_mapping(),
                downcast_ns_timestamp_to_us=downcast,
                format_version=metadata.format_version,
            )
            partition_spec = metadata.specs().get(task.file.spec_id)
            missing = missing_field_values(
                task.file, projected, metadata.schema(), partition_spec, file_schema.field_ids
            )
            keep = None
            if row_filter != AlwaysTrue():
                translated = translate_column_names(row_filter, file_schema, case_sensitive, missing)
                keep = to_arrow_filter(bind(file_schema, translated, case_sensitive=case_sensitive), file_schema)
            read = prune_columns(file_schema, arrow_scan._projected_field_ids, select_full_types=False)
            columns = [column.name for column in read.columns]
            rows = rows_per_batch(
                parquet.metadata, columns, batch_rows, batch_bytes, dictionary_entries(fin, parquet.metadata, columns)
            )
            for first, batch in _row_group_batches(parquet, fin, keep, rows, columns):
                if deleted:
                    batch = batch.take(kept_rows(deleted, first, first + batch.num_rows))
                if keep is not None and batch.num_rows:
                    batch = batch.filter(keep)
                if batch.num_rows:
                    yield to_requested_schema(
                        projected,
                        read,
                        batch,
                        downcast_ns_timestamp_to_us=downcast,
                        projected_missing_fields=missing,
                        allow_timestamp_tz_mismatch=True,
                    )

    return batches()


#: Bytes a local Parquet file's reader reads of each column at a time (``read_options``).
LOCAL_READ_BYTES = 1 << 20


def read_options(location: str) -> dict[str, Any]:
    """How the Parquet reader reads the file at ``location``. An object store's file has its
    row group's column chunks fetched at once, in a few large ranged reads (``pre_buffer``):
    a read there costs a round trip. A local file has each column read in ``LOCAL_READ_BYTES``
    pieces as its pages are decoded, so the reader does not hold the row group's compressed
    bytes at once: on the benchmark's 10 M nested rows (10 files of one 1 M-row group, 72 MiB
    compressed each), into a fresh store as its scaling row runs, the runner's peak anonymous
    memory 709 → 636 MiB, the load stage 19.4 → 18.3 s (medians of 3, alternating)."""
    from urllib.parse import urlparse

    if urlparse(location).scheme in ("", "file"):
        return {"pre_buffer": False, "buffer_size": LOCAL_READ_BYTES}
    return {"pre_buffer": True}


def _row_group_batches(
    parquet: Any, fin: Any, keep: Any, rows: int, columns: list[str]
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(the batch's first row in the file, the batch) of the row groups whose statistics
    may hold rows ``keep`` (a filter on the file's columns) keeps, as Arrow's dataset
    scanner chooses them for pyiceberg's reader (``ParquetFileFragment.subset``); all of
    them without a filter, or a file of one row group."""
    groups = parquet.metadata.num_row_groups
    if keep is None or groups < 2:
        first = 0
        for batch in parquet.iter_batches(batch_size=rows, columns=columns, use_threads=False):
            yield first, batch
            first += batch.num_rows
        return
    import pyarrow.dataset as ds

    fragment = ds.ParquetFileFormat().make_fragment(fin)
    wanted = [group.id for group in fragment.subset(filter=keep, schema=fragment.physical_schema).row_groups]
    starts = [0]
    for i in range(groups):
        starts.append(starts[-1] + parquet.metadata.row_group(i).num_rows)
    for group in wanted:
        first = starts[group]
        for batch in parquet.iter_batches(batch_size=rows, row_groups=[group], columns=columns, use_threads=False):
            yield first, batch
            first += batch.num_rows


def rows_per_batch(
    metadata: Any, columns: list[str], most: int, batch_bytes: int, longest: list[dict[str, int]] | None = None
) -> int:
    """Rows per batch of a Parquet file (its ``FileMetaData``) read for ``columns``: ``most``,
    or fewer where its widest row group holds more than ``batch_bytes`` (uncompressed, those
    columns) in that many rows. Batches were ``most`` rows whatever a row held: a table of
    200 KB values took 9.2 GiB of anonymous memory to load 20 k rows a file (a 4 GiB batch,
    then its records), and one of 1 MB values (a store takes 32 MiB) would take 64 GiB a
    batch. A dictionary-encoded column's chunk holds each distinct value once, so its size
    says nothing of the rows': where ``longest`` (``dictionary_entries``, per row group) knows
    its longest entry, a row of that column counts as at least that long."""
    wanted = set(columns)
    every = any("." in name for name in wanted)  # a leaf's path would not say its column: count all
    widest = 0.0
    for i in range(metadata.num_row_groups):
        group = metadata.row_group(i)
        if group.num_rows:
            entries = longest[i] if longest else {}
            size = 0
            for j in range(group.num_columns):
                chunk = group.column(j)
                if every or chunk.path_in_schema.split(".")[0] in wanted:
                    size += max(chunk.total_uncompressed_size, entries.get(chunk.path_in_schema, 0) * group.num_rows)
            widest = max(widest, size / group.num_rows)
    return max(1, min(most, int(batch_bytes // widest))) if widest else most


def dictionary_entries(fin: Any, metadata: Any, columns: list[str]) -> list[dict[str, int]]:
    """Per row group of a Parquet file open as ``fin``: the longest entry of the dictionary of
    each of ``columns`` that is a flat string or binary column with a dictionary page in it.

    Its chunk's sizes hold each distinct value once: a 66 KB file whose 3,000 rows repeat one
    1 MiB string says 1 MB uncompressed and decoded to 3 GB (4.1 GiB of memory, 41 s), and
    ``rows_per_batch``, going by that 1 MB, read it 3,000 rows a batch. The
    dictionary is read as the file's reader reads it: one row of the group, the column read
    as a dictionary. It costs 4 ms a row group for a full 1 MB dictionary (26 k entries of
    40 bytes; reading the group's 250 k rows of three columns took 33 ms), 0.14 ms for one
    of 50 entries, nothing for other columns. Nested columns are counted by their sizes,
    as before."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    wanted = {field.name for field in metadata.schema.to_arrow_schema() if field.name in columns and _text(field.type)}
    groups: list[set[str]] = []
    for i in range(metadata.num_row_groups):
        group = metadata.row_group(i)
        groups.append(
            {
                chunk.path_in_schema
                for chunk in (group.column(j) for j in range(group.num_columns))
                if chunk.path_in_schema in wanted and chunk.physical_type == "BYTE_ARRAY" and chunk.has_dictionary_page
            }
            if group.num_rows
            else set()
        )
    names = sorted(set().union(*groups))
    if not names:
        return [{} for _ in groups]
    # the pages read one by one (a dictionary and a data page a column: 3 reads), not the chunks
    reader = pq.ParquetFile(fin, metadata=metadata, read_dictionary=names, pre_buffer=False, buffer_size=1 << 18)
    longest: list[dict[str, int]] = []
    for i, probed in enumerate(groups):
        entries: dict[str, int] = {}
        if probed:
            first = next(reader.iter_batches(batch_size=1, row_groups=[i], columns=sorted(probed), use_threads=False))
            for name in probed:
                column = first.column(name)
                if pa.types.is_dictionary(column.type) and len(column.dictionary):
                    entries[name] = int(pc.max(pc.binary_length(column.dictionary)).as_py())
        longest.append(entries)
    return longest


def _text(t: pa.DataType) -> bool:
    """A string or binary type (or a dictionary of one): what ``dictionary_entries`` probes;
    other types stored as byte arrays (a decimal, say) are left to their sizes."""
    if pa.types.is_dictionary(t):
        return _text(t.value_type)
    kinds = pa.types
    strings = (kinds.is_string, kinds.is_large_string, kinds.is_string_view)
    binaries = (kinds.is_binary, kinds.is_large_binary, kinds.is_binary_view)
    return any(check(t) for check in (*strings, *binaries))


def embedded_metadata_location(catalog_name: str, home: Path, identifier: str) -> str | None:
    """The current metadata file of ``identifier`` in the embedded catalog under ``home``,
    read straight from its SQLite file (read-only), as pyiceberg's ``SqlCatalog.load_table``
    looks it up (same catalog name, namespace and table name; views excluded); None when it
    cannot say."""
    namespace, _, name = identifier.rpartition(".")
    db = home / "catalog.db"
    if not namespace or not db.is_file():
        return None
    try:
        connection = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return None
    try:
        columns = {row[1] for row in connection.execute("PRAGMA table_info(iceberg_tables)")}
        query = (
            "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = ? AND table_namespace = ? "
            "AND table_name = ?"
        )
        if "iceberg_type" in columns:
            query += " AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)"
        row = connection.execute(query, (catalog_name, namespace, name)).fetchone()
    except sqlite3.Error:
        return None
    finally:
        connection.close()
    return row[0] if row and row[0] else None
