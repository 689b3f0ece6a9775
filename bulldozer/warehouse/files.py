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
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from bulldozer.errors import CatalogError, LoadError, SourceDataError
from bulldozer.redaction import shown_url, visible

__all__ = ["checked_tasks", "outside", "unreadable", "unreadable_file"]

_SCHEMES = {"s3a": "s3", "s3n": "s3", "": "file"}


def _parts(uri: str) -> tuple[str, str, str]:
    """(scheme, host, normalized path) of a file URI or a plain path."""
    parts = urlsplit(uri)
    scheme = _SCHEMES.get(parts.scheme.lower(), parts.scheme.lower())
    host = "" if scheme == "file" and parts.netloc in ("", "localhost") else parts.netloc
    path = posixpath.normpath("/" + parts.path.lstrip("/"))
    return scheme, host, path


def _under(path: tuple[str, str, str], root: tuple[str, str, str]) -> bool:
    """Whether the parsed ``path`` is ``root`` or lies below it (both from ``_parts``)."""
    return path[:2] == root[:2] and (path[2] == root[2] or path[2].startswith(root[2].rstrip("/") + "/"))


def outside(location: str, paths: Iterable[str], roots: list[str]) -> str | None:
    """The first of ``paths`` under neither the table's ``location`` nor one of ``roots``
    (None: all are; ``*`` in ``roots``: anywhere)."""
    if "*" in roots:
        return None
    allowed = [_parts(root) for root in (location, *roots)]  # parsed once, not once per path
    for path in paths:
        parsed = _parts(path)
        if not any(_under(parsed, root) for root in allowed):
            return path
    return None


def checked_tasks(scan: Any, tasks: Iterable[Any]) -> list[Any]:
    """``tasks`` (pyiceberg file-scan tasks of ``scan``) as a list, or a CatalogError naming
    the first data or delete file that lives outside the table and the operator's roots."""
    from bulldozer.settings import load_settings

    listed = list(tasks)
    location = scan.table_metadata.location
    paths = (f.file_path for t in listed for f in (t.file, *t.delete_files))
    stray = outside(location, paths, load_settings().data_file_roots_listed())
    if stray is not None:
        raise CatalogError(
            f"the table at {shown_url(location)} lists a file outside it, {shown_url(stray)}: a run reads only "
            "the files under a table's location (a table's metadata could otherwise have it read any file this "
            "machine can); the operator can allow another place in BULLDOZER_DATA_FILE_ROOTS"
        )
    return listed


def unreadable_file(path: str, exc: BaseException) -> LoadError:
    """The error of a data file that could not be read (``exc``, pyarrow's or the file
    system's), naming the file: of a table's thousands of files, the one to look at."""
    return unreadable(f"the data file {shown_url(path)}", exc)


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
