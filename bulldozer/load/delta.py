"""Delta versions: the live version plus what changed in the table since its snapshot.

A full run writes every row of the table. For a table that changes by a few percent a day,
a delta run writes only the change, and is verified as exactly as a full run, because a
version's digest is a sum of per-record hashes:

1. **Prove the delta equivalent** (``plan_delta``), else write a full version and say why
   (mode ``auto`` also writes a full one where the store copies the base record by record:
   a delta there costs about what a full run does):
   the base (the live version) was loaded by a run of the same spec text, from another
   snapshot of the same table (same table UUID), with the same table schema and the same
   generated schema; that snapshot has not expired; its files the delta reads are there as
   it committed them, and their deletes can be applied exactly. A table's rows are unique
   by key (a full run refuses duplicates), so a key is in exactly one live row of a snapshot.
2. **Diff the snapshots at the file level** from Iceberg's metadata: the data files of the
   new snapshot that the base snapshot lacks (*added*) and the reverse (*removed*), found
   in the manifests one snapshot lists and the other does not (a manifest both list keeps
   the same files live in both: manifests are immutable); and, where the snapshots' delete
   files differ (merge-on-read: Spark's row-level DELETE, UPDATE and MERGE, Flink's
   upserts), the data files both keep whose deletes changed, on both sides. Each file is
   read with the deletes that apply to it in its snapshot (as a full run reads it), so its
   rows on one side are what that snapshot holds of it. Only their rows are read and
   encoded: the removed side's rows are the records of the base that may change, the added
   side's what they become. Where the only change of the files both keep is equality
   deletes by the job's key (a change-data writer's upserts) that apply to each of them or
   by its bounds cannot, those files are not read: what they lose is the base version's
   records of the deleted keys, looked up by key. Per key: in removed and not
   added — deleted; in added and not removed — new (it must not be in the base: that would
   be a duplicate key in the new snapshot); in both — changed if the value differs, else
   untouched (a file rewritten by compaction yields no change).
3. **Build the version** (``apply_delta``) as a new namespace created from the base (the DAL
   copies it; the base stays intact and live, so a rollback stays instant), delete every
   deleted, changed and new key, then put the changed and new records. Deleting first makes
   the run idempotent (a retried or resumed delta applies the same changes again to the same
   result) and keeps engines' running digests exact (each put lands on an absent key).
4. **Verify** like a full run: the expected count and digest are the base's minus the
   removed rows' plus the added rows' (``Digest`` sums are order-free and subtract), and
   the seal's measurement of the whole new version must equal them. Null counts for the
   quality gates are derived the same way from the base's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from bulldozer.codec.digest import Digest, digest_arrays
from bulldozer.errors import CatalogError, DuplicateKeyError, LoadError, UnreadableFilesError
from bulldozer.kv.client import KvClient
from bulldozer.kv.types import READABLE, BaseCopy, NamespaceRecord, StoreInfo
from bulldozer.load.encoder.encode import RowEncoder
from bulldozer.load.engines.base import LoadResult, SplitResult
from bulldozer.load.engines.local import SplitReader, Throttle, source_scan
from bulldozer.names import short_version
from bulldozer.schema.job import JobSchema
from bulldozer.spec.models import JobSpec, WriteTuning
from bulldozer.versioning.run_state import Loaded, loaded_of, run_record_of
from bulldozer.warehouse.files import checked_tasks, reading_metadata, task_files, verify_task_files

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = ["AUTO_MAX_CHANGE", "DeltaChanges", "DeltaPlan", "apply_delta", "plan_delta"]

log = logging.getLogger("bulldozer.run")
_T = TypeVar("_T")

#: mode auto writes a full version when the changed files hold more than this fraction of
#: the rows of the two snapshots' files (reading them is then most of a full run's work)
AUTO_MAX_CHANGE = 0.5


@dataclass
class DeltaPlan:
    """A delta proven equivalent to a full run: what to read."""

    base: NamespaceRecord
    base_loaded: Loaded
    base_snapshot: int
    snapshot: int
    #: file-scan tasks of the base snapshot's files that the new snapshot no longer has
    removed: list[Any]
    #: file-scan tasks of the new snapshot's files that the base snapshot did not have
    added: list[Any]
    removed_scan: Any
    added_scan: Any
    #: files both snapshots keep whose deletes changed (in ``removed`` and ``added`` both)
    reread: int = 0
    #: equality delete files by the job's key, new since the base snapshot, that account for
    #: every file both snapshots keep: their keys' base records are what those files lose
    by_key: list[Any] = field(default_factory=list)
    #: the table's fields the job's key is made of (empty: a key field is not a column)
    key_fields: tuple[Any, ...] = ()

    @property
    def rows_to_read(self) -> int:
        return sum(t.file.record_count for t in self.removed + self.added)


@dataclass
class DeltaChanges:
    """What a delta wrote and the totals the seal must find."""

    expected: Digest
    null_counts: dict[str, int]
    summary: dict[str, Any] = field(default_factory=dict)
    #: the keys the version got that the base version did not hold (an Arrow array)
    fresh: Any = None

    def load_result(self) -> LoadResult:
        """The load stage's result, as a full load reports it (one split)."""
        split = SplitResult("delta", self.expected.count, self.expected, dict(self.null_counts))
        return LoadResult(splits={"delta": split})


def _manifests(table: Any, snapshot: Any) -> dict[str, Any]:
    """The snapshot's manifests by path."""
    return {m.manifest_path: m for m in snapshot.manifests(table.io)}


def _live_rows(table: Any, manifests: dict[str, Any]) -> int:
    """The rows of the data files these manifests keep live (from the manifest list's
    counts; a manifest without them is opened)."""
    from pyiceberg.manifest import ManifestContent

    total = 0
    for m in manifests.values():
        if m.content != ManifestContent.DATA:
            continue
        if m.added_rows_count is not None and m.existing_rows_count is not None:
            total += m.added_rows_count + m.existing_rows_count
        else:
            total += sum(e.data_file.record_count for e in m.fetch_manifest_entry(table.io, discard_deleted=True))
    return total


def _tasks(scan: Any, manifests: list[Any]) -> dict[str, Any]:
    """The scan's file-scan tasks of the live data files of ``manifests`` alone, by path,
    with the deletes of ``manifests`` that apply to them."""
    return {t.file.file_path: t for t in checked_tasks(scan, manifests)}


def _delete_manifests(manifests: dict[str, Any]) -> set[str]:
    """The paths of the delete manifests of a snapshot's ``manifests``."""
    from pyiceberg.manifest import ManifestContent

    return {path for path, m in manifests.items() if m.content == ManifestContent.DELETES}


def _to_plan(mine: dict[str, Any], other: dict[str, Any], changed_deletes: bool) -> list[Any]:
    """The manifests of a snapshot (``mine``) a delta plans: its data manifests the other
    snapshot does not list (every one where the snapshots' deletes differ), and its delete
    manifests."""
    from pyiceberg.manifest import ManifestContent

    return [
        m for path, m in mine.items() if m.content == ManifestContent.DELETES or changed_deletes or path not in other
    ]


def _deletes_of(task: Any) -> dict[str, Any]:
    """The delete files (positional and equality) that apply to a task's data file, by path."""
    return {f.file_path: f for f in task_files([task])[1:]}


def _key_fields(schema: Any, job: JobSchema) -> tuple[Any, ...]:
    """The table's top-level fields the job's key is made of, or none where one is not."""
    top = {f.field_id: f for f in schema.fields}
    found = tuple(top.get(f.iceberg_id) for f in job.proto.key.fields)
    if any(f is None or f.name != k.column for f, k in zip(found, job.proto.key.fields, strict=True)):
        return ()
    return found


def _changed_deletes(
    gone: dict[str, Any], came: dict[str, Any], key_fields: tuple[Any, ...]
) -> tuple[list[str], list[Any]]:
    """Of the data files both snapshots keep (``gone`` and ``came`` both plan them), those
    whose deletes changed and are read again on both sides, and the equality delete files
    whose changes are taken by key instead.

    A file with the same deletes in both snapshots holds the same rows in both. One that
    gained only equality deletes by the job's key (a change-data writer's upserts), each
    new since the base snapshot and *accounting for every file both keep* — it applies to
    the file, or by their bounds no row of the file can have one of its keys (it lies in
    another partition, or another key range) — holds in the new snapshot its rows in the
    base one but those of the deleted keys: those rows are the base version's records of
    the keys, and the files are not read (``_Rows.add_base_records``). Any other change of
    deletes (positional ones, by other columns, a delete file rewritten or gone) is read
    again. Bounds are trusted as the planner trusts them (``may_match``)."""
    from pyiceberg.manifest import DataFileContent

    from bulldozer.warehouse.equality_deletes import may_match

    key_ids = frozenset(f.field_id for f in key_fields)
    shared = sorted(gone.keys() & came.keys())
    was = {p: _deletes_of(gone[p]) for p in shared}
    now = {p: _deletes_of(came[p]) for p in shared}
    new = {path: file for p in shared for path, file in now[p].items() if path not in was[p]}
    by_key = {
        path: file
        for path, file in new.items()
        if key_ids
        and file.content == DataFileContent.EQUALITY_DELETES
        and frozenset(file.equality_ids or ()) == key_ids
        and all(path in now[p] or not may_match(came[p].file, file, key_fields) for p in shared)
    }
    reread = [
        p
        for p in shared
        if was[p].keys() != now[p].keys() and not (was[p].keys() <= now[p].keys() <= was[p].keys() | by_key.keys())
    ]
    return reread, [by_key[path] for path in sorted(by_key)]


#: how a fallback names the files read on both sides
_READ_TWICE = " ({} of whose files both snapshots keep, read twice: their deletes changed)"


def plan_delta(
    spec: JobSpec,
    spec_sha256: str,
    table: Any,
    table_uuid: str,
    snapshot_id: int,
    job: JobSchema,
    base: NamespaceRecord | None,
    columns: list[str],
    store: StoreInfo | None = None,
) -> DeltaPlan | str:
    """The delta from ``base`` to ``snapshot_id``, or the reason a full run is needed.
    ``store``: the DAL's (mode auto writes a full version where a delta cannot be cheaper)."""
    if base is None:
        return "there is no live version to build on"
    if spec.data_movement.mode == "auto" and store is not None and store.base_copy == BaseCopy.RECORDS:
        return (
            f"the store ({store.engine}) copies a base version record by record, which costs about "
            "what a full run does (mode auto; mode delta writes a delta all the same)"
        )
    short = short_version(base.name)
    if base.state not in READABLE or not base.verified:
        return f"the base version {short} is {base.state.value}, not a verified readable version"
    run, loaded = run_record_of(base), loaded_of(base)
    if run is None or loaded is None:
        return f"the live version {short} records no run of this job (was it loaded by another tool?)"
    if run.spec_sha256 != spec_sha256:
        return f"the spec changed since the live version {short} was loaded"
    if run.table_uuid != table_uuid:
        if not run.table_uuid:
            return f"the live version {short} does not record its table's UUID (loaded before delta runs existed)"
        return f"table {spec.data_movement.source.table} was replaced (its UUID changed) since {short} was loaded"
    base_snapshot = run.snapshot_id
    old = table.snapshot_by_id(base_snapshot)
    if old is None:
        return f"snapshot {base_snapshot}, which the live version {short} was loaded from, has expired"
    new = table.snapshot_by_id(snapshot_id)
    if old.schema_id != new.schema_id:
        return f"the table's schema changed between snapshot {base_snapshot} and {snapshot_id}"
    if (job.descriptor_set, job.key_full_name, job.value_full_name) != (
        base.value_descriptor_set,
        base.key_message,
        base.value_message,
    ):
        return f"the generated schema differs from the live version {short}'s"
    # Manifests are immutable: one both snapshots list keeps the same files live in both, so
    # only the data manifests one snapshot lists and the other does not are opened (a day's
    # append is one new manifest, where planning both snapshots opened all of them). Delete
    # manifests are read whole: a delete file applies to data files of any manifest, and
    # where they differ between the snapshots, the files both keep are planned too, to find
    # those whose deletes changed.
    try:
        with reading_metadata(f"table {spec.data_movement.source.table}"):
            before, after = _manifests(table, old), _manifests(table, new)
            removed_scan = source_scan(table, spec, base_snapshot, columns)
            added_scan = source_scan(table, spec, snapshot_id, columns)
            changed_deletes = _delete_manifests(before) != _delete_manifests(after)
            gone = _tasks(removed_scan, _to_plan(before, after, changed_deletes))
            came = _tasks(added_scan, _to_plan(after, before, changed_deletes))
            total = _live_rows(table, before) + _live_rows(table, after) if spec.data_movement.mode == "auto" else 0
    except (CatalogError, UnreadableFilesError) as exc:  # a full run needs none of the base snapshot's files
        return f"the two snapshots cannot be compared: {exc}"  # (or reads them with another reader)
    key_fields = _key_fields(table.metadata.schema_by_id(new.schema_id) or table.schema(), job)
    reread, by_key = _changed_deletes(gone, came, key_fields)
    again = set(reread)  # looked up for each of the snapshots' files
    plan = DeltaPlan(
        base=base,
        base_loaded=loaded,
        base_snapshot=base_snapshot,
        snapshot=snapshot_id,
        removed=[t for path, t in sorted(gone.items()) if path not in came or path in again],
        added=[t for path, t in sorted(came.items()) if path not in gone or path in again],
        removed_scan=removed_scan,
        added_scan=added_scan,
        reread=len(reread),
        by_key=by_key,
        key_fields=key_fields,
    )
    if total and plan.rows_to_read > AUTO_MAX_CHANGE * total:  # mode auto only counts them
        return (
            f"the changed files hold {plan.rows_to_read:,} of the two snapshots' {total:,} rows"
            f"{_READ_TWICE.format(len(reread)) if reread else ''}; a full run reads less (mode auto)"
        )
    # The base snapshot's files the delta reads are what the base version holds: one gone
    # (deleted as an orphan while its snapshot was kept) or written again in place leaves
    # the delta unprovable, where a full run reads none of them. (The new snapshot's files
    # a full run reads too: their errors are the run's.)
    try:
        verify_task_files(table.io, plan.removed)
    except LoadError as exc:
        return f"a file of the base snapshot {base_snapshot} is not as it was committed ({exc})"
    return plan


class _Rows:
    """The encoded records of some data files (Arrow arrays, in file order), with their null counts."""

    def __init__(self) -> None:
        self.keys: list[Any] = []
        self.values: list[Any] = []
        self.null_counts: dict[str, int] = {}
        self.rows = 0
        #: keys looked up in the base version (``add_base_records``), and the records it had
        self.looked_up = self.from_base = 0

    def read(self, table: Any, scan: Any, tasks: list[Any], encoder: RowEncoder) -> _Rows:
        reader = SplitReader.of(table, scan)  # one: a delete file read once for every file it applies to
        for task in tasks:
            for batch in reader.batches(task):
                if not batch.num_rows:
                    continue
                encoded = encoder.encode(batch)
                self.keys.append(encoded.keys)
                self.values.append(encoded.values)
                self.rows += batch.num_rows
                for name in batch.schema.names:
                    nulls = batch.column(name).null_count
                    if nulls:
                        self.null_counts[name] = self.null_counts.get(name, 0) + nulls
        return self

    def add_base_records(self, plan: DeltaPlan, table: Any, job: JobSchema, client: KvClient) -> None:
        """The base version's records of the keys ``plan.by_key`` deletes that these rows
        (the removed side's files) do not hold, with their null counts: the rows the files
        both snapshots keep lose to those deletes (``_changed_deletes``). A key the base
        lacks was no row of the base snapshot's (or one its filter left out); a null key
        none. Keys are asked in byte order (``_lookups``)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from bulldozer import _kernels
        from bulldozer.codec.buffers import binary_view
        from bulldozer.warehouse.equality_deletes import deleted_rows

        rows = deleted_rows(table.metadata, table.io, plan.key_fields, plan.by_key)
        keys = pc.unique(RowEncoder(job.proto, checked=False).encode_keys(rows.drop_null()))
        if self.keys:
            keys = keys.filter(pc.invert(pc.is_in(keys, value_set=_one_array(self.keys))))
        keys = keys.take(pc.sort_indices(keys))
        answers = [pa.array(answer, pa.large_binary()) for _, answer in _lookups(client, plan.base.name, keys)]
        values = pa.concat_arrays(answers) if answers else pa.array([], pa.large_binary())
        held = values.is_valid()
        found_k, found_v = keys.filter(held), values.filter(held)
        self.looked_up, self.from_base = len(keys), len(found_k)
        if not len(found_k):
            return
        self.keys.append(found_k)
        self.values.append(found_v)
        present = [f for f in job.proto.value.fields if f.has_presence]
        if present:  # in compiled code: 100 k records' null counts took 0.2 s as protobuf messages
            absent = _kernels.absent_fields(*binary_view(found_v), [f.number for f in present])
            for f, count in zip(present, absent, strict=True):
                if count:
                    self.null_counts[f.column] = self.null_counts.get(f.column, 0) + count


def _one_array(chunks: list[Any]) -> Any:
    """The encoder's arrays of a side (its keys, or its values) as one Arrow array."""
    import pyarrow as pa

    return pa.chunked_array(chunks, pa.large_binary()).combine_chunks()


@dataclass
class _Diff:
    """What changed from the removed files' records (``old``) to the added files' (``new``),
    by key, in compiled code (``bulldozer._kernels.diff_pairs``: both sides sorted by key and
    merged): the keys only ``old`` holds, the keys both hold with another value, those only
    ``new`` holds, and the first two together (what the version deletes first), each an Arrow
    array in key order. With 1 % of 10 M rows changed, this step
    (the sides' arrays combined, the diff, the new keys as a list) took 0.04–0.06 s, where
    Python dicts of both sides took 0.075–0.09 s (six runs each); since the kernel sorts the
    keys by their first eight bytes as numbers, and the two sides on two cores, 0.025–0.03 s.
    The kernel alone, on a file of 100 k rows rewritten as the benchmark's (30 % deleted,
    40 % changed, 30 % appended; 90-byte values): 18.3–19.9 ms, then 12.3–13.5 ms since its
    merge reads the sorted sides' prefixes instead of the keys and compares values in file
    order (``KeyOrder``, ``same_values``)."""

    deleted: Any
    changed: Any
    fresh: Any
    doomed: Any
    #: indices into ``new`` of the changed and the fresh records: what the version gets
    puts: Any
    unchanged: int

    @classmethod
    def of(cls, job: JobSchema, old_k: Any, old_v: Any, new_k: Any, new_v: Any) -> _Diff:
        import pyarrow as pa

        from bulldozer import _kernels
        from bulldozer.codec.buffers import binary_view

        deleted, changed, fresh, doomed, unchanged, old_repeats, new_repeats = _kernels.diff_pairs(
            *binary_view(old_k), *binary_view(old_v), *binary_view(new_k), *binary_view(new_v)
        )
        for side, repeats in ((new_k, new_repeats), (old_k, old_repeats)):
            if repeats:
                raise _duplicates(job, side.take(_positions(repeats)).to_pylist())
        changed_at, fresh_at = _positions(changed), _positions(fresh)
        return cls(
            deleted=old_k.take(_positions(deleted)),
            changed=new_k.take(changed_at),
            fresh=new_k.take(fresh_at),
            doomed=old_k.take(_positions(doomed)),
            puts=pa.concat_arrays([changed_at, fresh_at]),
            unchanged=unchanged,
        )


def _positions(buf: bytes) -> Any:
    """The kernel's positions (uint64s laid end to end) as an Arrow array. Not a numpy
    array: pyarrow converting one imports numpy.ma first (13 ms of a one-shot delta)."""
    import pyarrow as pa

    return pa.Array.from_buffers(pa.uint64(), len(buf) // 8, [None, pa.py_buffer(buf)])


def base_duplicates(
    job: JobSchema, client: KvClient, plan: DeltaPlan, table: Any, fresh: Any = None
) -> DuplicateKeyError | None:
    """After a delta version's seal found other totals than expected: the duplicate keys
    that explain it, if any. A new key the base holds sits in a file both snapshots share:
    its put hid the base's pair, so the seal measured one record fewer than expected.
    ``fresh``: the new keys the load stage found (an Arrow array); without them (a verify
    stage run on its own) they are read from the changed files again.

    The keys are looked up only here, when the seal failed: the seal catches every such key
    without them (the store's running digest stops being exact when a put hides a pair it
    did not delete, and the seal then measures the version whole). Looked up alongside every
    delete, they slowed it (30 k new keys of a warm 10 M-row delta, delete medians of 12 side
    by side: 0.148 → 0.134 s on a chain of a few layers, 0.232 → 0.137 s on one that had
    taken hundreds of deltas)."""
    if fresh is None:
        fresh = _Read.of(plan, table, job, client).diff.fresh
    if not len(fresh):
        return None
    found = _in_base(client, plan.base.name, fresh)
    return _duplicates(job, found) if found else None


def _in_base(client: KvClient, base: str, fresh: Any) -> list[bytes]:
    """Up to three of the new keys (an Arrow array) ``base`` holds."""
    found: list[bytes] = []
    for keys, values in _lookups(client, base, fresh):
        found += [k for k, v in zip(keys.to_pylist(), values, strict=True) if v is not None][: 3 - len(found)]
        if len(found) >= 3:
            break
    return found


def _lookups(client: KvClient, base: str, keys: Any) -> Iterator[tuple[Any, list[bytes | None]]]:
    """What ``base`` holds of ``keys`` (an Arrow array): each slice of 10 k keys with its
    values (None where it has none), four requests on the wire at a time (a caller stopping
    early cancels the others); the keys become Python bytes a slice at a time."""
    step = 10_000
    starts = range(0, len(keys), step)
    answers = client.batch_get_many((keys.slice(at, step).to_pylist() for at in starts), namespace=base, in_flight=4)
    for at, (_, values) in zip(starts, answers, strict=True):
        yield keys.slice(at, step), values


def _duplicates(job: JobSchema, keys: list[bytes]) -> DuplicateKeyError:
    from bulldozer.load.runner import duplicate_key_error
    from bulldozer.schema.decode import ReadableJson

    key_cls, _ = job.classes
    readable = ReadableJson(job.descriptor_set)
    return duplicate_key_error([readable(key_cls.FromString(k)) for k in keys])


@dataclass
class _Read:
    """The changed files' records, each side as one array of keys and one of values, and
    what changed between them."""

    old: _Rows
    new: _Rows
    old_k: Any
    old_v: Any
    new_k: Any
    new_v: Any
    diff: _Diff

    @classmethod
    def of(
        cls, plan: DeltaPlan, table: Any, job: JobSchema, client: KvClient, limits: StoreInfo | None = None
    ) -> _Read:
        """The removed and the added files read side by side (decoding and encoding release
        the GIL), then diffed. Measured against reading one side after the other and
        hashing Python lists: 0.2 → 0.12 s (10 M rows, 1 % changed). The removed side gets
        the base's records of the keys ``plan.by_key`` deletes too (``_Rows.add_base_records``)."""
        # the removed rows are the base's records, encoded as it stored them (checked or not)
        base_rows = RowEncoder(job.proto, checked=False)
        reading = _in_background("delta-read", _Rows().read, table, plan.removed_scan, plan.removed, base_rows)
        new = _Rows().read(table, plan.added_scan, plan.added, RowEncoder(job.proto, limits=limits))
        old = reading.result()
        if plan.by_key:
            old.add_base_records(plan, table, job, client)
        old_k, new_k = _one_array(old.keys), _one_array(new.keys)
        old_v, new_v = _one_array(old.values), _one_array(new.values)
        return cls(old, new, old_k, old_v, new_k, new_v, _Diff.of(job, old_k, old_v, new_k, new_v))


def read_ahead(plan: DeltaPlan, table: Any, job: JobSchema, client: KvClient) -> Future[_Read]:
    """The changed files read and diffed (``_Read.of``) on a thread of their own, started as
    soon as the run has its plan: the reading then overlaps the create stage's calls to the
    store (the version made on its base, its labels), where the load stage began it only
    after them (measured: ``JobRun.create``). The load stage raises what the read raised."""
    return _in_background("delta-read-ahead", lambda: _Read.of(plan, table, job, client, client.describe_store()))


def _in_background(name: str, work: Callable[..., _T], *args: Any) -> Future[_T]:
    """``work(*args)`` on a daemon thread called ``name``: its result, or what it raised, in
    the future. A daemon, so that a process that ends meanwhile (a run that failed before
    its load, or was interrupted) does not wait for the read to finish, as it waited for a
    ``ThreadPoolExecutor``'s thread."""
    import threading
    from concurrent.futures import Future

    future: Future[_T] = Future()

    def run() -> None:
        future.set_running_or_notify_cancel()
        try:
            future.set_result(work(*args))
        except BaseException as exc:  # for the caller to raise
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def put_batch_records(puts: int, write: WriteTuning) -> int:
    """Records per batch for a delta's ``puts``: known at once, they go as
    ``in_flight_batches`` batches at least (of at most ``batch_size`` records), which the
    store takes on all its cores, where one batch is staged on one. A warm 10 M-row delta's
    70 k puts as four batches instead of one: load stage 0.206 -> 0.173 s (medians of 8
    alternating in one loader, full runs between)."""
    return min(write.batch_size, max(1, -(-puts // write.in_flight_batches)))


def apply_delta(
    plan: DeltaPlan,
    spec: JobSpec,
    table: Any,
    job: JobSchema,
    client: KvClient,
    version: str,
    progress: Callable[[int, int], None] = lambda done, total: None,
    resumed: bool = False,
    reading: Future[_Read] | None = None,
) -> DeltaChanges:
    """Read the changed files, apply the changes to ``version`` (created from ``plan.base``)
    and return the totals the seal must find. ``resumed``: an earlier attempt may have
    written some of them already (its new keys are deleted first too). ``reading``: those
    files' read begun already (``read_ahead``).

    The store is asked about keys in byte order: its B-trees are then searched page after
    page, not at random (on a 10 M-row version through a chain of layers, medians of 4 side
    by side on one base: 70 k deletes 0.34 → 0.16 s, 30 k new keys' lookups 0.16 → 0.08 s)."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.compute as pc

    progress(0, plan.rows_to_read)
    read = reading.result() if reading is not None else _Read.of(plan, table, job, client, client.describe_store())
    old, new, diff = read.old, read.new, read.diff
    old_k, old_v, new_k, new_v = read.old_k, read.old_v, read.new_k, read.new_v
    progress(old.rows + new.rows, plan.rows_to_read)
    # a new key the base holds is a duplicate the seal catches (base_duplicates names it), so
    # only a resumed attempt can have written a new key already
    doomed = diff.doomed
    if resumed:
        doomed = pa.concat_arrays([doomed, diff.fresh])
        doomed = doomed.take(pc.sort_indices(doomed))
    base = plan.base

    def prepared() -> tuple[Any, Any, Digest]:
        """The records to put, and the totals the seal must find."""
        expected = Digest(base.record_count, base.digest, base.bytes)
        expected.add(digest_arrays(old_k, old_v).negated())
        expected.add(digest_arrays(new_k, new_v))
        return new_k.take(diff.puts), new_v.take(diff.puts), expected

    # The store's deletes keep it busy while this process waits: the records to put and the
    # totals to expect are made meanwhile, on another thread (both release the GIL). Side by
    # side on a warm 10 M-row delta: from the deletes' answer to the puts' 0.016-0.019 s
    # before, 0.013-0.017 s after, and the digests' 0.003 s off that path.
    write: WriteTuning = spec.key_value_dal.write
    # records_per_second bounds the store's writes, deletes included: at that rate, in slices
    # of a batch (without one, all at once)
    throttle = Throttle(write.records_per_second)
    step = write.batch_size if write.records_per_second else 1 << 62
    with ThreadPoolExecutor(1, thread_name_prefix="delta-prepare") as pool:
        preparing = pool.submit(prepared)
        for at in range(0, len(doomed), step):  # first: each put then lands on an absent key
            client.delete(version, doomed.slice(at, step).to_pylist())
            throttle.wait(min(step, len(doomed) - at))
        put_keys, put_values, expected = preparing.result()
    with client.writer(
        version,
        batch_records=put_batch_records(len(put_keys), write),
        batch_bytes=write.max_batch_bytes,
        in_flight=write.in_flight_batches,
    ) as writer:
        for at in range(0, len(put_keys), step):
            writer.add_arrays(put_keys.slice(at, step), put_values.slice(at, step))
            throttle.wait(min(step, len(put_keys) - at))
    progress(plan.rows_to_read, plan.rows_to_read)

    null_counts = dict(plan.base_loaded.null_counts)
    for column, n in old.null_counts.items():
        null_counts[column] = null_counts.get(column, 0) - n
    for column, n in new.null_counts.items():
        null_counts[column] = null_counts.get(column, 0) + n
    summary = {
        "base": base.name,
        "base_snapshot": plan.base_snapshot,
        "files_removed": len(plan.removed) - plan.reread,
        "files_added": len(plan.added) - plan.reread,
        "files_reread": plan.reread,
        "rows_read": old.rows + new.rows,
        "keys_looked_up": old.looked_up,
        "deleted_by_key": old.from_base,
        "deleted": len(diff.deleted),
        "changed": len(diff.changed),
        "added": len(diff.fresh),
        "unchanged": diff.unchanged,
    }
    log.info(
        "delta from %s: %d files removed, %d added, %d whose deletes changed; %d keys deleted, %d changed, %d added",
        short_version(base.name),
        len(plan.removed) - plan.reread,
        len(plan.added) - plan.reread,
        plan.reread,
        len(diff.deleted),
        len(diff.changed),
        len(diff.fresh),
    )
    return DeltaChanges(expected, {c: n for c, n in null_counts.items() if n}, summary, diff.fresh)
