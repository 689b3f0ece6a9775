"""Equality deletes, planned and applied here: pyiceberg does neither.

Flink's upserts, and other change-data writers, delete a row by the values of some of its
columns (its *equality fields*, most often the table's key) in an equality delete file, and
write the row's new value in a data file of the same commit. pyiceberg's planner raises on
such a snapshot, so the local engine, the Spark engine's own splits and a query refused the
table; only Iceberg's Java reader (the Spark engine by key) read it. Here, as the Iceberg
spec says ("Scan Planning") and Iceberg's Java reader does:

- an equality delete file applies to a data file whose data sequence number is strictly
  lower than its own (so an upsert's new row, written in the same commit, is kept) and which
  is in its partition (the same spec and values), or to every data file where the delete
  file's spec is unpartitioned (a global delete);
- a row is deleted when its values of the delete file's equality fields equal those of one
  of the file's rows, a null equal to a null.

``plan_files`` plans a scan's tasks (data files and their positional deletes as pyiceberg
plans them); a task with equality deletes too is an ``EqualityDeletesTask``, holding them
grouped by equality fields (``EqualityGroup``). A reader reads such a task with the
columns of its equality fields too (``Applied.projection``) and drops each batch's deleted
rows (``Applied.kept``). What cannot be applied exactly is refused in one line naming Iceberg's
Java reader, which can (``Unappliable``): an equality field the scan's schema does not have
(a dropped column, which the spec still applies by its id), one inside a struct, list or
map, a floating-point one (Java compares NaN and -0.0 otherwise than Arrow), a delete file
in a format pyiceberg's reader does not read (Avro).
"""

from __future__ import annotations

import functools
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from bulldozer._kernels import ImageSet

__all__ = [
    "Applied",
    "DeletedKeys",
    "EqualityDeletesCache",
    "EqualityDeletesTask",
    "EqualityGroup",
    "Unappliable",
    "deleted_rows",
    "equality_files",
    "may_match",
    "plan_files",
]


class Unappliable(Exception):
    """An equality delete file this reader cannot apply exactly: why, as the end of a sentence
    starting "the table at <location> has ..."."""


@dataclass(frozen=True)
class EqualityGroup:
    """Equality delete files of the same equality fields (top-level fields of the scan's
    schema, in field-id order) that apply to one data file."""

    fields: tuple[Any, ...]
    files: tuple[Any, ...]

    @property
    def key(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """What identifies the group's deleted keys (its files are immutable)."""
        return tuple(f.field_id for f in self.fields), tuple(sorted(f.file_path for f in self.files))


class EqualityDeletesTask:
    """A file-scan task whose data file has equality deletes (``groups``) as well as the
    positional ones pyiceberg's reader applies (``delete_files``): pyiceberg's
    ``FileScanTask`` with them, read as one (its attributes)."""

    def __init__(self, task: Any, groups: tuple[EqualityGroup, ...]) -> None:
        self.file, self.delete_files, self.residual = task.file, task.delete_files, task.residual
        self.groups = groups


def equality_files(task: Any) -> list[Any]:
    """The equality delete files that apply to ``task``'s data file (none for a plain task)."""
    groups = task.groups if isinstance(task, EqualityDeletesTask) else ()
    return [f for group in groups for f in group.files]


def plan_files(scan: Any, manifests: list[Any], read_formats: Iterable[str]) -> list[Any]:
    """The scan's file-scan tasks of the live data files of ``manifests``, each with the
    positional and equality deletes that apply to it; Unappliable for an equality delete
    file that cannot be applied exactly (``read_formats``: the delete file formats read)."""
    from pyiceberg.manifest import INITIAL_SEQUENCE_NUMBER, DataFileContent
    from pyiceberg.table import ManifestGroupPlanner

    from bulldozer.redaction import shown_url

    sequence: dict[str, int] = {}  # a data file's data sequence number, by path
    equality: list[tuple[int, Any]] = []

    def keep(entry: Any) -> bool:
        """pyiceberg's planner plans the data files and positional deletes; this keeps the
        data files' sequence numbers and takes the equality delete files aside."""
        file, number = entry.data_file, entry.sequence_number or INITIAL_SEQUENCE_NUMBER
        if file.content == DataFileContent.EQUALITY_DELETES:
            equality.append((number, file))
            return False
        if file.content == DataFileContent.DATA:
            sequence[file.file_path] = number
        return True

    planner = ManifestGroupPlanner(scan.table_metadata, scan.io, scan.row_filter, scan.case_sensitive, scan.options)
    tasks = list(planner.plan_files(manifests, keep))
    if not equality:
        return tasks
    schema = _scan_schema(scan)
    formats = set(read_formats)
    specs = scan.table_metadata.specs()
    scoped: dict[Any, list[tuple[int, tuple[Any, ...], Any]]] = {}
    for number, file in equality:
        fields = _equality_fields(schema, file, formats)
        spec = specs.get(file.spec_id)
        if spec is None:
            raise Unappliable(
                f"an equality delete file of partition spec {file.spec_id}, which the table does not have "
                f"({shown_url(file.file_path)})"
            )
        where = None if spec.is_unpartitioned() else (file.spec_id, file.partition)
        scoped.setdefault(where, []).append((number, fields, file))
    ranges: dict[tuple[str, tuple[Any, ...]], tuple[_Range, ...]] = {}  # by file path and fields

    def range_of(file: Any, fields: tuple[Any, ...]) -> tuple[_Range, ...]:
        key = (file.file_path, fields)
        found = ranges.get(key)
        if found is None:
            found = ranges[key] = _ranges(file, fields)
        return found

    planned: list[Any] = []
    for task in tasks:
        number = sequence[task.file.file_path]
        applying = [
            (fields, file)
            for where in (None, (task.file.spec_id, task.file.partition))
            for deletes_at, fields, file in scoped.get(where, ())
            if deletes_at > number and _overlap(range_of(task.file, fields), range_of(file, fields))
        ]
        if not applying:
            planned.append(task)
            continue
        by_fields: dict[tuple[Any, ...], list[Any]] = {}
        for fields, file in applying:
            by_fields.setdefault(fields, []).append(file)
        groups = tuple(EqualityGroup(fields, tuple(files)) for fields, files in sorted(by_fields.items(), key=_ids))
        planned.append(EqualityDeletesTask(task, groups))
    return planned


def may_match(data: Any, deletes: Any, fields: tuple[Any, ...]) -> bool:
    """Whether an equality delete file may delete a row of a data file, by their metadata:
    not when, for one of its fields, the two files' value ranges (lower and upper bounds,
    which describe the non-null values) do not overlap and not both may hold a null (a null
    equals a null). As Iceberg's Java reader decides (``DeleteFileIndex``): a data file none
    of whose rows a delete can match is read without it (and a delta does not read it again
    when such a delete is added). Bounds of other types, or missing ones, decide nothing."""
    return _overlap(_ranges(data, fields), _ranges(deletes, fields))


#: one field's range in a file: its lowest and highest non-null value, and whether the file
#: may hold a null of it; None where its bounds say nothing (missing, damaged, unordered type)
_Range = tuple[Any, Any, bool] | None


def _ranges(file: Any, fields: tuple[Any, ...]) -> tuple[_Range, ...]:
    """Each field's range in ``file``, from its metadata (decoded once: the planner compares a
    delete file's with every data file's in its scope)."""
    from pyiceberg.conversions import from_bytes

    ordered = _ordered_types()
    lower, upper = file.lower_bounds or {}, file.upper_bounds or {}
    found: list[_Range] = []
    for field in fields:
        fid, kind = field.field_id, field.field_type
        low, high = lower.get(fid), upper.get(fid)
        if type(kind) not in ordered or low is None or high is None:
            found.append(None)
            continue
        try:
            found.append((from_bytes(kind, low), from_bytes(kind, high), _may_hold_null(file, fid)))
        except (ValueError, struct.error):  # a damaged bound (UnicodeDecodeError is a ValueError)
            found.append(None)
    return tuple(found)


def _overlap(data: tuple[_Range, ...], deletes: tuple[_Range, ...]) -> bool:
    """``may_match`` of two files' ranges (``_ranges``) of the same fields."""
    for ours, theirs in zip(data, deletes, strict=True):
        if ours is None or theirs is None or (ours[2] and theirs[2]):
            continue
        if ours[1] < theirs[0] or theirs[1] < ours[0]:
            return False
    return True


@functools.cache
def _ordered_types() -> tuple[type[Any], ...]:
    """The types whose values Python orders as Iceberg does (strings by code point, binaries
    by unsigned bytes; not UUIDs, which Java compares as signed halves)."""
    from pyiceberg.types import (
        BinaryType,
        DateType,
        IntegerType,
        LongType,
        StringType,
        TimestampNanoType,
        TimestampType,
        TimestamptzNanoType,
        TimestamptzType,
        TimeType,
    )

    timestamps = (TimestampType, TimestamptzType, TimestampNanoType, TimestamptzNanoType)
    return (IntegerType, LongType, DateType, TimeType, StringType, BinaryType, *timestamps)


def _may_hold_null(file: Any, field_id: int) -> bool:
    """Whether a file's metadata leaves it possible that a field is null in one of its rows."""
    counts = file.null_value_counts
    return counts is None or counts.get(field_id) is None or counts[field_id] > 0


def _ids(item: tuple[tuple[Any, ...], list[Any]]) -> tuple[int, ...]:
    return tuple(f.field_id for f in item[0])


def _scan_schema(scan: Any) -> Any:
    """The schema the scan reads its rows in (its snapshot's, as pyiceberg's projection takes)."""
    metadata = scan.table_metadata
    snapshot = scan.snapshot()
    if snapshot is not None and snapshot.schema_id is not None:
        found = {s.schema_id: s for s in metadata.schemas}.get(snapshot.schema_id)
        if found is not None:
            return found
    return metadata.schema()


def _equality_fields(schema: Any, file: Any, formats: set[str]) -> tuple[Any, ...]:
    """The top-level fields of ``schema`` an equality delete file deletes by, or Unappliable."""
    from pyiceberg.types import DoubleType, FloatType

    from bulldozer.redaction import shown_url

    shown = shown_url(file.file_path)
    if file.file_format.name not in formats:
        raise Unappliable(f"an equality delete file in {file.file_format.name.title()} ({shown})")
    ids = sorted(set(file.equality_ids or ()))
    if not ids:
        raise Unappliable(f"an equality delete file that names no equality field ({shown})")
    top = {f.field_id: f for f in schema.fields}
    fields = []
    for field_id in ids:
        field = top.get(field_id)
        if field is None:
            try:
                schema.find_field(field_id)
            except ValueError:
                raise Unappliable(
                    f"an equality delete file deleting by field id {field_id}, a column the table's schema no "
                    f"longer has ({shown})"
                ) from None
            raise Unappliable(
                f"an equality delete file deleting by field id {field_id}, a field inside another ({shown})"
            )
        if isinstance(field.field_type, FloatType | DoubleType):
            raise Unappliable(f"an equality delete file deleting by the floating-point column '{field.name}' ({shown})")
        fields.append(field)
    return tuple(fields)


def _plain(array: Any) -> Any:
    """An array compared by its values: an extension type's storage (UUID), a dictionary's
    values, one chunk."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return array


def _fixed_width(kind: pa.DataType) -> bool:
    """Whether ``kind``'s values compare as the integers they are stored as."""
    t = pa.types
    return bool(t.is_integer(kind) or t.is_date(kind) or t.is_time(kind) or t.is_timestamp(kind) or t.is_duration(kind))


def _bytes_like(kind: pa.DataType) -> bool:
    t = pa.types
    return bool(t.is_string(kind) or t.is_large_string(kind) or t.is_binary(kind) or t.is_large_binary(kind))


def _images(column: Any) -> Any:
    """An int64 standing for each value of ``column`` (a null's is any): an integer-like
    value itself (exact), the XXH64 of a string's or a binary's bytes (to be confirmed:
    distinct values may share one), or None for another type."""
    from bulldozer.codec.digest import key_hashes

    kind = column.type
    if _fixed_width(kind):
        if not pa.types.is_integer(kind):
            column = column.view(pa.int64() if kind.bit_width == 64 else pa.int32())
        return column.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
    if pa.types.is_fixed_size_binary(kind):
        column = column.cast(pa.binary())
    if _bytes_like(column.type):
        return key_hashes(column).view("int64")
    return None


def _index_in(column: Any, values: Any) -> Any:
    """Each of ``column``'s position in the Arrow array of distinct ``values``, or -1 (a null
    too), with Arrow's ``index_in``, which hashes ``values`` again at each call: for the
    types without images (``_images``), and strings of which two share a hash."""
    import pyarrow.compute as pc

    numbers = pc.index_in(column, value_set=values)
    return numbers.cast(pa.int64()).fill_null(-1).to_numpy(zero_copy_only=False, writable=True)


def _found(images: ImageSet, wanted: Any) -> Any:
    """Each of ``wanted``'s (int64 images) position among ``images``' values, or -1."""
    import numpy as np

    wanted = np.ascontiguousarray(wanted, dtype=np.int64)
    out = np.empty(len(wanted), dtype=np.int64)
    images.find(wanted, out)
    return out


class _Numbering:
    """A column's values numbered by the deleted distinct ones (0, 1, ...; a null after
    them, where a deleted row has one), -1 for a value none of them equals.

    The distinct values' images (``_images``) are put in a compiled hash set built once
    (``ImageSet``), so a batch's values are found by their images without hashing the
    deleted ones again; a string found by its hash is confirmed equal. A type without
    images, or strings of which two share a hash, are looked up with Arrow's ``index_in``."""

    def __init__(self, column: Any) -> None:
        import numpy as np
        import pyarrow.compute as pc

        self.kind = column.type
        present = pc.drop_null(column)
        self.exact = _fixed_width(self.kind)
        self.images: ImageSet | None = None  # the distinct values' images, in the order of ``values``
        if self.exact:
            images = np.unique(_images(present))
            self.values = pa.array(images)
            self.images = ImageSet(images)
        else:
            self.values = pc.unique(present)
            images = _images(self.values)
            if images is not None and len(np.unique(images)) == len(images):  # no two share a hash
                self.images = ImageSet(np.ascontiguousarray(images, dtype=np.int64))
        self.null = len(self.values) if column.null_count else -1
        self.size = len(self.values) + (1 if column.null_count else 0)

    def __call__(self, column: Any) -> Any:
        import numpy as np
        import pyarrow.compute as pc

        if column.type != self.kind:  # a batch may say string where the deletes' reading said large_string
            column = column.cast(self.kind)
        if self.images is None:
            numbers = _index_in(column, self.values)
        else:
            numbers = _found(self.images, _images(column))
            if not self.exact:  # a hash found: the value itself must be the one
                hit = np.flatnonzero(numbers >= 0)
                same = pc.equal(column.take(pa.array(hit)), self.values.take(pa.array(numbers[hit])))
                numbers[hit[~same.fill_null(False).to_numpy(zero_copy_only=False)]] = -1
        if column.null_count:
            numbers[column.is_null().to_numpy(zero_copy_only=False)] = self.null
        return numbers


class DeletedKeys:
    """The deleted key tuples of an ``EqualityGroup``'s files, as a lookup of a batch's rows.

    Each column's values are numbered by the deleted distinct ones (``_Numbering``; a null
    is a value: it equals a null), and a tuple's numbers are folded column by column into
    one number, renumbered densely at each step (the position among the deleted tuples'
    distinct folded numbers, found in a compiled set) so it stays small; a batch's row is
    deleted when every column's value is numbered and the folded number is one of the
    deleted tuples'. (A hash join does not take a null as equal to a null.)"""

    def __init__(self, names: list[str], deleted: pa.Table) -> None:
        import numpy as np

        self.names = names
        self._numbering: list[_Numbering] = []
        self._folded: list[ImageSet] = []  # per column after the first: the distinct folded numbers
        code = None
        for name in names:
            column = _plain(deleted.column(name))
            numbering = _Numbering(column)
            self._numbering.append(numbering)
            numbers = numbering(column)
            if code is None:
                code = numbers
            else:
                tuples = code * numbering.size + numbers
                folded = np.unique(tuples)
                self._folded.append(ImageSet(folded))
                code = np.searchsorted(folded, tuples)

    def deleted(self, batch: pa.RecordBatch) -> pa.Array:
        """Whether each row of ``batch`` (which has the group's columns) is deleted."""
        code = None
        for i, name in enumerate(self.names):
            numbering = self._numbering[i]
            numbers = numbering(_plain(batch.column(name)))
            if code is None:
                code = numbers
            else:
                folded = code * numbering.size + numbers
                folded[(code < 0) | (numbers < 0)] = -1  # no deleted tuple folds to a negative number
                code = _found(self._folded[i - 1], folded)
        return pa.array(code >= 0) if code is not None else pa.array([], pa.bool_())


class EqualityDeletesCache:
    """The deleted keys of the few groups read last (``KEPT``): tasks sorted by path follow
    each other in a partition, and a global delete applies to all of them, so a group's
    files are read once, not once a task. Pickled empty: a Spark task reads its own."""

    KEPT = 4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[Any, DeletedKeys] = OrderedDict()

    def get(self, key: Any) -> DeletedKeys | None:
        with self._lock:
            found = self._kept.get(key)
            if found is not None:
                self._kept.move_to_end(key)
            return found

    def put(self, key: Any, keys: DeletedKeys) -> None:
        with self._lock:
            self._kept[key] = keys
            while len(self._kept) > self.KEPT:
                self._kept.popitem(last=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"empty": True}  # (a state, not a false value: __setstate__ is then called)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]


def deleted_rows(
    metadata: Any, io: Any, fields: tuple[Any, ...], files: Iterable[Any], case_sensitive: bool = True
) -> pa.Table:
    """The rows of equality delete ``files`` deleting by ``fields`` (the table's top-level
    fields, as ``plan_files`` groups them): each file checked as the snapshot committed it,
    read by pyiceberg's reader (by field id; Parquet or ORC), in the table's Arrow types."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.schema import Schema
    from pyiceberg.table import FileScanTask

    from bulldozer.warehouse.files import verify_files

    listed = list(files)
    verify_files(io, listed)
    scan = ArrowScan(metadata, io, Schema(*fields), AlwaysTrue(), case_sensitive)
    return scan.to_table([FileScanTask(file) for file in listed])


class Applied:
    """How a reader applies a task's equality deletes: it reads ``projection`` (the scan's,
    with the equality fields it lacks appended) and passes each batch through ``kept``."""

    def __init__(
        self,
        metadata: Any,
        io: Any,
        projection: Any,
        case_sensitive: bool,
        task: Any,
        cache: EqualityDeletesCache | None = None,
    ) -> None:
        from pyiceberg.schema import Schema

        self.groups: tuple[EqualityGroup, ...] = task.groups if isinstance(task, EqualityDeletesTask) else ()
        have = {f.field_id for f in projection.fields}
        extra: dict[int, Any] = {}
        for group in self.groups:
            extra.update((f.field_id, f) for f in group.fields if f.field_id not in have)
        self.names = [f.name for f in projection.fields]
        self.widened = bool(extra)
        self.projection = (
            Schema(*projection.fields, *extra.values(), schema_id=projection.schema_id) if extra else projection
        )
        self._metadata, self._io, self._case_sensitive = metadata, io, case_sensitive
        self._cache = cache if cache is not None else EqualityDeletesCache()
        self._keys: list[DeletedKeys] | None = None

    def __bool__(self) -> bool:
        return bool(self.groups)

    def _deleted_keys(self) -> list[DeletedKeys]:
        if self._keys is None:
            self._keys = [self._read(group) for group in self.groups]
        return self._keys

    def _read(self, group: EqualityGroup) -> DeletedKeys:
        """The group's deleted keys (``deleted_rows``), or the cache's."""
        found = self._cache.get(group.key)
        if found is not None:
            return found
        deleted = deleted_rows(self._metadata, self._io, group.fields, group.files, self._case_sensitive)
        keys = DeletedKeys([f.name for f in group.fields], deleted)
        self._cache.put(group.key, keys)
        return keys

    def kept(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` without its deleted rows, in the scan's projection."""
        import pyarrow.compute as pc

        deleted = None
        for keys in self._deleted_keys():
            hit = keys.deleted(batch)
            deleted = hit if deleted is None else pc.or_(deleted, hit)
        if deleted is not None and pc.any(deleted).as_py():
            batch = batch.filter(pc.invert(deleted))
        return batch.select(self.names) if self.widened else batch
