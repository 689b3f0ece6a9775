"""Which files a run reads for a table: only those that live where the table lives.

A table's metadata is its owner's text, and it may list any path as a data or delete file
(``add_files``, a migrated Hive table, or a manifest written by hand): read as listed, a
table would make Bulldozer read, with the operator's file access and cloud credentials,
another table's files, or any Parquet file this machine can reach, and move its rows into
the store. So a run reads a data or delete file only under the table's location, or under
a root the operator lists (``BULLDOZER_DATA_FILE_ROOTS``: comma-separated URI prefixes, for
tables whose files live elsewhere by design, e.g. ``write.data.path``; ``*`` for anywhere).
Where a table lives, its location, is the catalog's to govern (a REST catalog's allowed
locations, or the credentials it vends for that location); what files it lists is not.

Paths are compared by scheme, host and normalized path (``..`` taken out, a ``/`` boundary:
``/t`` does not hold ``/t2``), ``s3a:``/``s3n:`` as ``s3:`` and ``file:`` as a plain path.
Every engine's splits (``load.engines.local.scan_tasks``), a delta's changed files
(``load.delta``) and a query's tables (``load.source``) pass through ``checked_tasks``.

A file that cannot be read is one line naming it: a metadata file (``reading_metadata``:
pyiceberg raises whatever its parsers meet), a data file (``unreadable_file``).

A data file is read only if it is the one the snapshot committed (``committed_file``): its
manifest entry records its rows and its bytes, and a Parquet file's footer says its rows.
Iceberg's files are immutable, so a file that says otherwise was written again in place
(a writer's retry reusing a name, a hand-made "fix", a restore of another copy): read as it
is, a version would lose or gain rows and still verify, since the store's count and digest
would match what was read, and engines answer ``count(*)`` from the manifests' counts.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from bulldozer.errors import BulldozerError, CatalogError, LoadError, SourceDataError, UnreadableFilesError
from bulldozer.redaction import shown_url, visible

__all__ = [
    "READ_FORMATS",
    "REWRITE_AS_PARQUET",
    "REWRITE_EQUALITY_DELETES",
    "checked_tasks",
    "committed_file",
    "is_local",
    "lies_under",
    "opened_size",
    "outside",
    "outside_error",
    "reading_metadata",
    "snapshot_files",
    "task_files",
    "unreadable",
    "unreadable_file",
    "unreadable_metadata",
    "verify_file",
    "verify_files",
    "verify_task_files",
]

_SCHEMES = {"s3a": "s3", "s3n": "s3", "": "file"}


def _parts(uri: str) -> tuple[str, str, str]:
    """(scheme, host, normalized path) of a file URI or a plain path. A plain path is read
    whole, as pyiceberg's reader opens it (``PyArrowFileIO.parse_location``): split as a
    URI, ``/t#x/a.parquet`` was checked as ``/t``, a table's location, while the reader
    opened a file beside it (its open then found it outside: ``warehouse.file_io``)."""
    parts = urlsplit(uri)
    if not parts.scheme:
        return "file", "", posixpath.normpath("/" + uri.lstrip("/"))
    scheme = _SCHEMES.get(parts.scheme.lower(), parts.scheme.lower())
    host = "" if scheme == "file" and parts.netloc in ("", "localhost") else parts.netloc
    path = posixpath.normpath("/" + parts.path.lstrip("/"))
    return scheme, host, path


def _under(path: tuple[str, str, str], root: tuple[str, str, str]) -> bool:
    """Whether the parsed ``path`` is ``root`` or lies below it (both from ``_parts``)."""
    return path[:2] == root[:2] and (path[2] == root[2] or path[2].startswith(root[2].rstrip("/") + "/"))


def is_local(uri: str) -> bool:
    """Whether a file URI or path names a file of this machine's file system."""
    scheme, host, _ = _parts(uri)
    return scheme == "file" and not host


def lies_under(real: str, places: Iterable[tuple[str, str, str]]) -> bool:
    """Whether the local path ``real`` (links resolved) lies under one of ``places`` (``_allowed``)."""
    return any(_under(("file", "", real), place) for place in places)


class _RealPaths:
    """Local paths with their symbolic links resolved, as the file system opens them: a
    link under a table's location may point anywhere. A file's folder is resolved once per
    check (a table's files share a few), the file itself only when it is a link."""

    def __init__(self) -> None:
        self._folders: dict[str, str] = {}

    def __call__(self, parsed: tuple[str, str, str]) -> tuple[str, str, str]:
        scheme, host, path = parsed
        if scheme != "file" or host:
            return parsed
        folder, name = posixpath.split(path)
        real_folder = self._folders.get(folder)
        if real_folder is None:
            real_folder = self._folders[folder] = os.path.realpath(folder)
        real = posixpath.join(real_folder, name)
        return scheme, host, os.path.realpath(real) if os.path.islink(real) else real


def outside(location: str, paths: Iterable[str], roots: list[str]) -> str | None:
    """The first of ``paths`` under neither the table's ``location`` nor one of ``roots``
    (None: all are; ``*`` in ``roots``: anywhere). Local paths are compared as the file
    system resolves them (``_RealPaths``): a table's owner can place a symbolic link in its
    folder to a file the operator's access reaches and theirs does not."""
    if "*" in roots:
        return None
    real = _RealPaths()
    allowed = _allowed(location, roots, real)  # parsed once, not once per path
    for path in paths:
        parsed = real(_parts(path))
        if not any(_under(parsed, root) for root in allowed):
            return path
    return None


def _allowed(location: str, roots: list[str], real: _RealPaths) -> list[tuple[str, str, str]]:
    """Where a table's files may lie: its ``location`` and the operator's ``roots``, as the
    file system resolves them."""
    return [real(_parts(root)) for root in (location, *roots)]


@contextmanager
def reading_metadata(what: str) -> Iterator[None]:
    """Metadata files of ``what`` (a table: its metadata JSON, manifest lists, manifests)
    that cannot be read — damaged, truncated, gone — as one CatalogError naming it.
    pyiceberg raises whatever its parsers met (UnicodeDecodeError, EOFError, SystemError
    from its compiled Avro decoder, pydantic's ValidationError, OSError): a command printed
    a traceback."""
    try:
        yield
    except BulldozerError:
        raise
    except Exception as exc:  # pyiceberg raises many unrelated types here
        raise unreadable_metadata(what, exc) from exc


def unreadable_metadata(what: str, exc: BaseException) -> CatalogError:
    """The one line of ``reading_metadata``. Of pydantic's errors (a metadata file that is not
    a table's JSON), what is wrong and where, not the ``input_value`` pydantic quotes: that
    is the file's own text, its first and last 25 characters, and the file a catalog names
    may be any file this machine can read (a registered table's metadata location)."""
    from pydantic import ValidationError

    found: BaseException | None = exc
    while found is not None and not isinstance(found, ValidationError):
        found = found.__cause__  # pyiceberg raises its own ValidationError from pydantic's
    if isinstance(found, ValidationError):
        problems = found.errors(include_url=False, include_input=False, include_context=False)
        said = "; ".join(
            f"{'.'.join(str(part) for part in problem['loc'])}: {problem['msg']}" if problem["loc"] else problem["msg"]
            for problem in problems[:3]
        )
        said = visible(" ".join(said.split()))
    else:
        said = visible(" ".join(str(exc).split()))
    return CatalogError(f"cannot read the metadata of {what}: {type(exc).__name__}: {said}")


def checked_tasks(scan: Any, manifests: list[Any] | None = None, spark_reads: bool = True) -> list[Any]:
    """The file-scan tasks of the scan (of the live data files of ``manifests`` alone, where
    given), reading its manifests (``reading_metadata``), as a list, or a CatalogError naming
    the first data or delete file that lives outside the table and the operator's roots.
    pyiceberg plans the tasks of a snapshot without delete files (its REST catalog's server,
    maybe); one with delete files is planned with them here (``warehouse.equality_deletes``:
    pyiceberg's planner raises on equality deletes; the manifest list says which manifests
    hold deletes, so a table written by Flink is not planned twice). An
    UnreadableFilesError for what pyiceberg's reader cannot read (Avro data files) or
    Bulldozer cannot apply exactly (some equality deletes), which says to run the Spark
    engine if it can read the table (``spark_reads``: not for a query, which it does not
    run)."""
    from pyiceberg.manifest import ManifestContent

    from bulldozer.warehouse.equality_deletes import Unappliable, plan_files

    location = scan.table_metadata.location
    with reading_metadata(f"the table at {shown_url(location)}"):
        if manifests is None:
            snapshot = scan.snapshot()
            every = snapshot.manifests(scan.io) if snapshot is not None else []
            manifests = every if any(m.content == ManifestContent.DELETES for m in every) else None
        try:
            listed = list(scan.plan_files()) if manifests is None else plan_files(scan, manifests, READ_FORMATS)
        except Unappliable as exc:
            raise _equality_deletes_error(scan, str(exc), spark_reads) from None
    _inside(location, (f.file_path for f in task_files(listed)), scan.io)
    other = next((t.file for t in listed if t.file.file_format.name not in READ_FORMATS), None)
    if other is not None:
        raise _format_error(scan, other, spark_reads)
    return listed


def snapshot_files(scan: Any) -> list[Any]:
    """Every live data and delete file of the scan's snapshot, from its manifests (no task
    planned, no delete applied, no filter: all of them), or a CatalogError naming the first
    one outside the table and the operator's roots: the files a reader of the engine's own
    (Iceberg's Spark reader) reads for a snapshot the local reader cannot read (Avro data files)
    or apply exactly (some equality deletes)."""
    location = scan.table_metadata.location
    with reading_metadata(f"the table at {shown_url(location)}"):
        files = list(_live_files(scan))
    _inside(location, (f.file_path for f in files), scan.io)
    return files


def _live_files(scan: Any) -> Iterator[Any]:
    """The live files the scan's snapshot's manifests list."""
    snapshot = scan.snapshot()
    for manifest in snapshot.manifests(scan.io) if snapshot is not None else []:
        yield from (entry.data_file for entry in manifest.fetch_manifest_entry(scan.io, discard_deleted=True))


#: how a table's equality deletes are rewritten away (applied to its data files, then dropped)
REWRITE_EQUALITY_DELETES = (
    "CALL <catalog>.system.rewrite_data_files(table => '<table>', options => "
    "map('delete-file-threshold', '1', 'remove-dangling-deletes', 'true'))"
)


def _equality_deletes_error(scan: Any, what: str, spark_reads: bool) -> UnreadableFilesError:
    why = f"has {what} at snapshot {_snapshot_id(scan)}"
    return _unreadable_files(
        scan,
        why,
        "cannot apply it exactly, and rows the table deleted would be loaded",
        "applies it",
        REWRITE_EQUALITY_DELETES,
        spark_reads,
    )


def _unreadable_files(
    scan: Any, why: str, cannot: str, spark_does: str, remedy: str, spark_reads: bool
) -> UnreadableFilesError:
    """The one line of a table whose files pyiceberg's reader ``cannot`` (read or apply):
    run the Spark engine (``spark_reads``: not for a query) or rewrite them (``remedy``)."""
    if spark_reads:
        what = f"run it with --engine spark (Iceberg's own reader {spark_does}), or have them rewritten first"
    else:
        what = "a query's tables are read with it on every engine: have them rewritten first"
    error = UnreadableFilesError(
        f"the table at {shown_url(scan.table_metadata.location)} {why}: the local engine's reader (pyiceberg) "
        f"{cannot}; {what} (Spark: {remedy})"
    )
    error.why, error.remedy = why, remedy
    return error


def _snapshot_id(scan: Any) -> str:
    snapshot = scan.snapshot()
    return str(snapshot.snapshot_id) if snapshot is not None else "?"


#: the data file formats pyiceberg's reader reads (``FileFormat`` names)
READ_FORMATS = frozenset({"PARQUET", "ORC"})
#: how a table's data files are rewritten as Parquet
REWRITE_AS_PARQUET = (
    "ALTER TABLE <catalog>.<table> SET TBLPROPERTIES ('write.format.default' = 'parquet'), then CALL "
    "<catalog>.system.rewrite_data_files(table => '<table>', options => map('rewrite-all', 'true'))"
)


def _format_error(scan: Any, file: Any, spark_reads: bool) -> UnreadableFilesError:
    kind = file.file_format.name.title()  # Avro
    why = f"has {kind} data files at snapshot {_snapshot_id(scan)} ({shown_url(file.file_path)})"
    return _unreadable_files(
        scan, why, "reads Parquet and ORC files only", "reads them", REWRITE_AS_PARQUET, spark_reads
    )


def _inside(location: str, paths: Iterable[str], io: Any) -> None:
    """A CatalogError naming the first of ``paths`` outside the table's ``location`` and the
    operator's roots (``BULLDOZER_DATA_FILE_ROOTS``); else ``paths`` registered with the
    table's FileIO (``io``), which checks each one again as it opens it
    (``warehouse.file_io``: a file swapped for a symbolic link after this check)."""
    from bulldozer.settings import load_settings
    from bulldozer.warehouse.file_io import CheckedFileIO

    roots = load_settings().data_file_roots_listed()
    listed = list(paths)
    stray = outside(location, listed, roots)
    if stray is not None:
        listed_as, real = _parts(stray), _RealPaths()(_parts(stray))
        if real != listed_as:
            stray = f"{stray} (a symbolic link to {real[2]})"
        raise outside_error(location, stray)
    if isinstance(io, CheckedFileIO) and "*" not in roots:
        io.hold_inside(location, _allowed(location, roots, _RealPaths()), listed)


def outside_error(location: str, stray: str) -> CatalogError:
    """The one line of a table listing a file (``stray``, as it is to be shown) outside it."""
    return CatalogError(
        f"the table at {shown_url(location)} lists a file outside it, {shown_url(stray)}: a run reads only "
        "the files under a table's location (a table's metadata could otherwise have it read any file this "
        "machine can); the operator can allow another place in BULLDOZER_DATA_FILE_ROOTS"
    )


def unreadable_file(path: str, exc: BaseException) -> LoadError:
    """The error of a data file that could not be read (``exc``, pyarrow's or the file
    system's), naming the file: of a table's thousands of files, the one to look at."""
    return unreadable(f"the data file {shown_url(path)}", exc)


def committed_file(file: Any, rows: int, size: int | None) -> None:
    """Refuse a data or delete ``file`` of a snapshot (a SourceDataError naming it) when its
    ``rows`` (its footer's count) or its ``size`` in bytes (None: not known without asking
    the file system again) are not what the snapshot's manifest recorded for it."""
    from pyiceberg.manifest import DataFileContent

    said = ""
    if rows != file.record_count:
        said = f"holds {rows:,} rows where the table's snapshot committed {file.record_count:,}"
    elif size is not None and file.file_size_in_bytes and size != file.file_size_in_bytes:
        said = f"is {size:,} bytes where the table's snapshot committed {file.file_size_in_bytes:,}"
    if said:
        kind = "data" if file.content == DataFileContent.DATA else "delete"
        raise SourceDataError(
            f"the {kind} file {shown_url(file.file_path)} {said}: it is not the file the snapshot wrote (written "
            "again in place?), and a version read from it would not be the table's; nothing is loaded from it"
        )


def opened_size(stream: Any) -> int | None:
    """The size of an open file of a FileIO, when the stream knows it (pyarrow's files do)."""
    size = getattr(stream, "size", None)
    try:
        found = size() if callable(size) else size
    except (OSError, ValueError):
        return None
    return found if isinstance(found, int) else None


def verify_file(io: Any, file: Any) -> None:
    """``committed_file`` for a data or delete file read by another reader (pyiceberg's own,
    DuckDB's or Spark's): its footer is read here (a Parquet file's; another format's size
    alone)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.manifest import FileFormat

    try:
        source = io.new_input(file.file_path)
        if file.file_format != FileFormat.PARQUET:
            committed_file(file, file.record_count, len(source))
            return
        with source.open() as stream:
            committed_file(file, pq.ParquetFile(stream).metadata.num_rows, opened_size(stream))
    except (OSError, pa.ArrowException) as exc:
        raise unreadable_file(file.file_path, exc) from exc


def verify_task_files(io: Any, tasks: list[Any]) -> None:
    """``verify_file`` for the data files of ``tasks`` and their delete files (each once: one
    may apply to many data files), before another reader reads them: local files one after
    the other (the 100 footers of a 10 M-row table: 8 ms; 22 ms on threads), others up to 8
    at a time (an object store answers each after a round trip)."""
    verify_files(io, task_files(tasks))


def task_files(tasks: list[Any]) -> list[Any]:
    """The data files of ``tasks`` and their delete files (positional and equality)."""
    from bulldozer.warehouse.equality_deletes import equality_files

    return [f for t in tasks for f in (t.file, *t.delete_files, *equality_files(t))]


def verify_files(io: Any, listed: list[Any]) -> None:
    """``verify_file`` for each of the data and delete files ``listed`` (each once), as
    ``verify_task_files`` says."""
    from concurrent.futures import ThreadPoolExecutor

    files = {f.file_path: f for f in listed}
    if len(files) < 2 or all(_parts(path)[0] == "file" for path in files):
        for file in files.values():
            verify_file(io, file)
        return
    with ThreadPoolExecutor(min(8, len(files)), thread_name_prefix="data-file-check") as pool:
        for _ in pool.map(lambda file: verify_file(io, file), files.values()):
            pass


def unreadable(what: str, exc: BaseException) -> LoadError:
    """The error of ``what`` (data files) that could not be read (``exc``, pyarrow's or the
    file system's), in one line. Its content refused (pyarrow's ``ArrowInvalid``: a value a
    cast cannot take, a schema the file cannot give) fails the same way on every retry, so
    it is a SourceDataError; a file system's error (the file gone, the store unreachable,
    and what pyarrow reports as I/O: a truncated or damaged file) a LoadError a scheduler
    retries."""
    import pyarrow as pa

    said = visible(" ".join(str(exc).split()) or type(exc).__name__)
    message = f"cannot read {what}: {said}"
    if isinstance(exc, FileNotFoundError):
        message += " (the file is gone: was the snapshot expired and its files deleted?)"
    if isinstance(exc, pa.ArrowInvalid | pa.ArrowNotImplementedError | pa.ArrowTypeError):
        return SourceDataError(message)
    return LoadError(message)
