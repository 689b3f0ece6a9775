"""``embedded``: the default engine, LMDB on local disk.

Layout: one LMDB environment (a directory) holding the metadata databases
(``meta.namespaces``, ``meta.aliases``, ``meta.history``) and one sub-database per
namespace. Dropping a namespace drops its sub-database, which frees its pages and
rewrites nothing else. Every lifecycle change runs in one LMDB write transaction, which
LMDB serializes across processes, so several DAL processes can serve one store safely;
the alias compare-and-set is atomic in the engine itself.

A LOADING version's writes are staged, not put in place: each batch becomes one sorted run
in ``meta.stage`` (one put of a few MiB, whatever the key order), and ``ingest`` — called
by the seal, or earlier by the loader through the DAL's ``Ingest`` — merges the runs in key
order into the version's fresh sub-database with LMDB's append mode, in one transaction
(the Go data plane's ingest commits every 64 MiB and deletes the runs in its last).
Measured on 1 M flat records in the job's batches: puts in place 5.7 s; sorted and
appended 0.21 s (issue #25). The layout of a run is shared with the Go data plane
(proto/bulldozer/kv/v1/shared.yaml), which stages and ingests the same way.

A version created from a base (a delta version) reads through to it rather than copying it:
``meta.layers`` maps its name to its base's, its own database holds only what it wrote, and
its deleted keys are in a tombstone database (``del.<name>``). A read takes the newest
layer holding the key unless a newer layer's tombstones hold it. Its running digest starts
from the base's measured one and stays exact: a delete subtracts the pair it hides, and a
put that would shadow a base's pair it did not delete first marks it inexact. Chains are at
most ``MAX_LAYERS`` deep: a version made from a deeper one reads through to a base further
down, with what the layers above it changed merged into its own data and tombstones (size
tiers, as an LSM tree compacts: a cost of those changes, not of the whole version). Once the
layers above the chain's bottom hold ``COMPACT_BOTTOM_AT`` times as many entries as the
bottom's flat records, the merge takes the bottom in too (a major compaction): the version
comes out flat, with no tombstones, and the next chain starts from it. A base's data
outlives its drop while a version reads through to it (the last dependent's drop frees
it). The Go data plane reads through layers, ingests a layered version's runs and
deletes its keys by the same rules (native/kvd/lmdb: kvd_ingest, kvd_delete_*), skipping
the layers whose key filter rules a key out (``meta.filters``: kvd builds a sealed layer's
filter and alone reads it; this engine deletes it with the layer's data).

Every commit flushes its pages to the disk (fdatasync) before it writes its meta page, and
that meta page is flushed by the next commit or sync (LMDB's ``MDB_NOMETASYNC``): a machine
crash (power lost, a kernel panic) can undo the last commit, never damage the store.
Every metadata change — create, seal, flip, drop — is also synced before it is answered.
The store was opened ``MDB_NOSYNC`` before: the kernel writes cached pages back in any
order, so a machine crash during a load could leave a meta page on the disk pointing at
pages that were not, or pages of the last durable tree overwritten by later commits, and
the whole store — every alias's live version — did not open (18 of 120 images a crash can
leave, rebuilt from a record of the DAL's writes: test_faults.py's machine-crash test).
Syncing each commit cost nothing measurable: a 5 M-row run 3.31 s before, 3.29 s after.

A write the store's disk has no room for aborts its transaction (the store stays as it
was) and fails with one line naming the disk's free space (``_disk_full``; the Go data
plane hands such a write to this engine, which says it); a new store is not created on a
disk without room for its first files (``_room_to_create``). A store whose file is not what
LMDB wrote is refused in one line (``_damaged``: StoreDamagedError), before anything is
written to it (``_check_catalogue``).

A process killed inside a read transaction (a ``bulldozer-kvd`` measuring a version when its
time ran out, a second DAL on the store) leaves its slot in LMDB's reader table, and LMDB
reuses no page freed after that reader's snapshot while the slot stands, which is until the
store's last process closes it. Every version dropped since then stayed in the file, and the
store grew by each load until the map was full. The engine clears such slots when it opens
the store and when it creates a version (``_clear_stale_readers``, LMDB's
``mdb_reader_check``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import struct
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import lmdb

from bulldozer.codec.digest import Digest
from bulldozer.errors import (
    BackendUnavailableError,
    InvalidArgumentError,
    KvError,
    NamespaceExistsError,
    NamespaceNotFoundError,
    ResourceExhaustedError,
    StoreDamagedError,
)
from bulldozer.kv.backends._lifecycle import (
    check_readable,
    check_transition,
    check_writable,
    plan_flip,
    plan_pin,
)
from bulldozer.kv.backends.base import StorageEngine, chunked, select_namespaces
from bulldozer.kv.backends.config import EmbeddedConfig, address_space_limit, default_map_size
from bulldozer.kv.privacy import make_private, owner_refusal
from bulldozer.kv.types import AliasChange, AliasRecord, BaseCopy, NamespaceRecord, State
from bulldozer.kv.v1 import shared
from bulldozer.redaction import first_line

#: a write cut short (EIO) with less free space than this on the store's disk failed for
#: want of it (``EmbeddedEngine._disk_full``): more than a commit writes at once (an
#: ingest commits every 64 MiB, a batch is at most 16 MiB by default)
DISK_FULL_BELOW = 256 << 20
#: LMDB's errors for a store file that is not what LMDB wrote: a page of the wrong type or
#: missing (MDB_CORRUPTED, MDB_PAGE_NOTFOUND), not an LMDB file or not one of its format
#: (MDB_INVALID, MDB_VERSION_MISMATCH), a fatal error met before (MDB_PANIC); and a spoiled
#: transaction (MDB_BAD_TXN): this engine lets no error pass inside one, so only a failure
#: LMDB met without reporting it spoils it (a cursor opened on a damaged root page)
_DAMAGED = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.InvalidError,
    lmdb.VersionMismatchError,
    lmdb.PanicError,
    lmdb.BadTxnError,
)
#: the free space a new store needs on its disk to be created (``_room_to_create``): its lock
#: file (512 readers' slots) and first pages, with room to spare
NEW_STORE_NEEDS = 1 << 20

# The store's layout is shared with the Go data plane: proto/bulldozer/kv/v1/shared.yaml.
_META_NS = shared.STORE_META_NAMESPACES.encode()
_META_ALIAS = shared.STORE_META_ALIASES.encode()
_META_HISTORY = shared.STORE_META_HISTORY.encode()
_META_STATES = shared.STORE_META_STATES.encode()  # name -> state only: the hot-path check reads a few bytes
_META_DIGESTS = shared.STORE_META_DIGESTS.encode()  # name -> running (count, digest, bytes, exact) of what is stored
_DATA_PREFIX = shared.STORE_DATA_PREFIX.encode()
_DIGEST = struct.Struct(shared.STORE_DIGEST_RECORD)
_META_STAGE = shared.STORE_META_STAGE.encode()  # name NUL run number -> a sorted run
_RUN = struct.Struct(shared.STORE_STAGE_RUN_HEADER)
_RECORD = struct.Struct(shared.STORE_STAGE_RECORD_HEADER)
_RUN_NUMBER = struct.Struct(">Q")
_META_LAYERS = shared.STORE_META_LAYERS.encode()  # name -> the base it reads through to
_META_FILTERS = shared.STORE_META_FILTERS.encode()  # name -> its key filter (the Go data plane builds and reads them)
_TOMBSTONE_PREFIX = shared.STORE_TOMBSTONE_PREFIX.encode()
_TOMBSTONE = shared.STORE_TOMBSTONE.encode()
#: in meta.layers, this byte then a name: the namespace was dropped, but versions read through it
_ZOMBIE = b"\x00"
#: A version's merge takes in its chain's bottom (its flat records) once the layers above
#: hold this many times as many entries (pairs and tombstones) as the bottom: see
#: ``EmbeddedEngine.copy_records``. Measured on a 10 M-row table, warm deltas each changing
#: 1 % (bench's delta section): the layers above grow by about 0.01 of the bottom a delta; a
#: delta took 0.47 s with them at 0.07–0.13 of it, 0.55 s at 0.45–0.52, 1.4–1.8 s at 1.2 and
#: 2.3 s at 1.85, where the bottom was never merged. The compaction at 0.5 (49 deltas in)
#: took 3.3 s, its merge 2.5 s, and the next delta 1.8 s (the new bottom's key filter built).
COMPACT_BOTTOM_AT = 0.5


def _dumps(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


#: A file in the store folder: the store was served with authentication.
_AUTH_MARKER = "AUTH_REQUIRED"


def _data_db(name: str) -> bytes:
    return _DATA_PREFIX + name.encode()


def _tomb_db(name: str) -> bytes:
    return _TOMBSTONE_PREFIX + name.encode()


def _stage_prefix(name: str) -> bytes:
    return name.encode() + b"\x00"


def sorted_run(keys: Sequence[bytes], values: Sequence[bytes]) -> tuple[bytes, bool]:
    """A batch as one staged run (keys ascending, a repeated key keeping its last value),
    and whether a key repeated."""
    order = sorted(range(len(keys)), key=keys.__getitem__)  # stable: equal keys stay in batch order
    kept: list[int] = []
    repeated = False
    for i in order:
        if kept and keys[kept[-1]] == keys[i]:
            kept[-1] = i
            repeated = True
        else:
            kept.append(i)
    parts = [_RUN.pack(len(kept))]
    for i in kept:
        key, value = keys[i], values[i]
        parts += (_RECORD.pack(len(key), len(value)), key, value)
    return b"".join(parts), repeated


def run_records(run: Any) -> Iterator[tuple[bytes, Any]]:
    """The (key, value) records of a staged run, in key order."""
    (n,) = _RUN.unpack_from(run, 0)
    pos = _RUN.size
    for _ in range(n):
        klen, vlen = _RECORD.unpack_from(run, pos)
        pos += _RECORD.size
        key = bytes(run[pos : pos + klen])
        pos += klen
        yield key, run[pos : pos + vlen]
        pos += vlen


def _size(size: int) -> str:
    from pydantic import ByteSize

    return ByteSize(size).human_readable(separator=" ")


class EmbeddedEngine(StorageEngine):
    name = "embedded"
    base_copy = BaseCopy.LAYERED
    max_key_bytes = shared.LIMITS_EMBEDDED_MAX_KEY_BYTES  # LMDB's compiled-in limit

    def __init__(self, config: EmbeddedConfig) -> None:
        self.config = config
        self.path = Path(config.path)
        if self.path.exists() and not self.path.is_dir():  # mkdir said only "File exists"
            raise BackendUnavailableError(f"cannot open the embedded store at {self.path}: it is a file, not a folder")
        if (refused := owner_refusal(self.path)) is not None:  # its chmod said "Operation not permitted"
            raise BackendUnavailableError(refused)
        try:
            make_private(self.path)
            self._room_to_create()
            self.env = lmdb.open(
                str(self.path),
                mode=0o600,
                map_size=config.map_size,
                max_dbs=config.max_dbs,
                subdir=True,
                sync=True,  # every commit's pages on the disk before its meta page is written
                metasync=False,  # that meta page by the next commit's flush or sync (``_durable``)
                readahead=False,
                writemap=config.writemap,
                max_readers=512,
            )
        except (lmdb.Error, OSError) as exc:
            if isinstance(exc, lmdb.Error) and (damaged := self._damaged(exc)) is not None:
                raise damaged from exc
            if (limit := address_space_limit()) is not None and os.strerror(errno.ENOMEM) in str(exc):
                raise ResourceExhaustedError(
                    f"cannot open the embedded store at {self.path}: its map ({_size(config.map_size)}, or the size "
                    f"its data already takes if larger) does not fit in this process's address-space limit "
                    f"({_size(limit)}: ulimit -v); raise the limit, or serve the store with a smaller --map-size-gib"
                ) from exc
            raise BackendUnavailableError(f"cannot open the embedded store at {self.path}: {exc}") from exc
        try:
            self._check_catalogue()
        except StoreDamagedError:
            self.env.close()
            raise
        self._lock = threading.Lock()
        self._dbs: dict[str, Any] = {}
        self._meta = self.env.open_db(_META_NS)
        self._aliases = self.env.open_db(_META_ALIAS)
        self._history = self.env.open_db(_META_HISTORY)
        self._states = self.env.open_db(_META_STATES)
        self._digests = self.env.open_db(_META_DIGESTS)
        self._stage = self.env.open_db(_META_STAGE)
        self._layers = self.env.open_db(_META_LAYERS)
        self._filters = self.env.open_db(_META_FILTERS)
        self._tombs: dict[str, Any] = {}
        self._kvd_binary: Path | None = None
        self._clear_stale_readers()

    def _check_catalogue(self) -> None:
        """Read the store's catalogue of databases (LMDB's main database: a line for each
        version and metadata database) before anything is written: in a damaged store,
        opening the metadata databases created them anew in the damaged tree, and a run then
        wrote into it (StoreDamagedError instead)."""
        with self._read() as txn:
            for _ in txn.cursor():
                pass

    def use_kvd(self, kvd: Path) -> None:
        """Let ``bulldozer-kvd`` (the native data plane fronting this engine) do the engine's
        long jobs, each in a process of its own: merge layers for ``copy_records``
        (kvd_merge_layers: the same rule as ``_overlay``, compiled) and ``measure`` a version
        through its layers. Measured on a 10 M-row table's chain, creating a version that
        merges three layers (420 k pairs and tombstones), alternating, medians of 4: 1.27 s
        merged here, 0.15 s there (a 2.3 M-entry merge took 3.4 s here)."""
        self._kvd_binary = kvd

    # -- plumbing ---------------------------------------------------------------

    def _clear_stale_readers(self) -> int:
        """Free the reader slots of processes that ended inside a read transaction (see the
        module's docstring); how many there were."""
        cleared = int(self.env.reader_check())
        if cleared:
            import logging

            logging.getLogger("bulldozer.kv.server").warning(
                "the embedded store at %s: cleared %d reader slot(s) of processes that ended while reading it "
                "(the pages freed since they began were not reused)",
                self.path,
                cleared,
            )
        return cleared

    def _room_to_create(self) -> None:
        """Refuse to create a store on a disk without room for its first files: LMDB maps
        its lock file and writes it through the map, and a page the disk cannot hold then
        kills the process (SIGBUS) instead of failing a call. An existing store has them."""
        if all((self.path / f).exists() for f in ("data.mdb", "lock.mdb")):
            return
        free, _ = self._disk_space()
        if free < NEW_STORE_NEEDS:
            raise ResourceExhaustedError(
                f"the disk holding the embedded store at {self.path} is full "
                f"({free / 2**10:,.0f} KiB free): a new store needs {NEW_STORE_NEEDS / 2**20:,.0f} MiB there to start"
            )

    def _disk_space(self) -> tuple[int, int]:
        """Bytes free (to this user) and in all on the disk holding the store."""
        fs = os.statvfs(self.path)
        return fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize

    def _auth_marker(self) -> Path:
        return self.path / _AUTH_MARKER

    def auth_required(self) -> bool:
        return self._auth_marker().exists()

    def require_auth(self) -> None:
        marker = self._auth_marker()
        if not marker.exists():
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.write(fd, b"this store is served with --auth-config; see bulldozer serve --help\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            # on the disk before anything is written under authentication: a machine crash
            # that lost it would let the next serve without --auth-config serve what follows
            folder = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)

    def _db(self, name: str) -> Any:
        """The namespace's sub-database handle. Must be called outside any transaction:
        opening a handle runs a transaction of its own (and LMDB locks are not reentrant)."""
        db = self._dbs.get(name)
        if db is None:
            with self._lock:
                db = self._dbs.get(name)
                if db is None:
                    try:
                        db = self._dbs[name] = self._open_handle(_data_db(name))
                    except lmdb.NotFoundError:
                        raise NamespaceNotFoundError(f"namespace {name!r} does not exist") from None
        return db

    def _tomb(self, name: str) -> Any:
        """The handle of a layered namespace's tombstone database (outside any transaction)."""
        db = self._tombs.get(name)
        if db is None:
            with self._lock:
                db = self._tombs.get(name)
                if db is None:
                    db = self._tombs[name] = self._open_handle(_tomb_db(name))
        return db

    def _open_handle(self, key: bytes) -> Any:
        """An existing sub-database's handle, opened in a write transaction of ours. Not in
        the one ``open_db`` begins when given none: py-lmdb waits for LMDB's writer lock there
        holding the GIL, so a thread inside a write transaction (a put, a delete) that needed
        the GIL back, and this one, waited on each other for ever; ``begin`` waits without it.
        (A handle opened in a read-only transaction is gone when that transaction ends.)"""
        with self._write() as txn:
            return self.env.open_db(key, txn=txn, create=False)

    def _chain(self, name: str) -> list[str]:
        """The namespace and the bases it reads through to, newest first (fixed once set)."""
        chain = [name]
        with self._read() as txn:
            while (base := txn.get(chain[-1].encode(), db=self._layers)) is not None:
                chain.append(bytes(base).decode())
        return chain

    def _layer_dbs(self, chain: list[str]) -> tuple[list[Any], list[Any]]:
        """Data handles of every layer, tombstone handles of every layer but the last."""
        return [self._db(n) for n in chain], [self._tomb(n) for n in chain[:-1]]

    @staticmethod
    def _lookup_many(txn: Any, data: list[Any], tombs: list[Any], keys: Sequence[bytes]) -> dict[bytes, Any]:
        """The visible value of each key that has one through the layers (newest first; a
        layer's tombstones hide older layers' pairs), a layer at a time with LMDB's batched gets."""
        found: dict[bytes, Any] = {}
        pending = list(keys)
        for i, db in enumerate(data):
            hits = dict(txn.cursor(db=db).getmulti(pending))
            found.update(hits)
            pending = [k for k in pending if k not in hits]
            if not pending or i == len(tombs):
                break
            dead = {k for k, _ in txn.cursor(db=tombs[i]).getmulti(pending)}
            pending = [k for k in pending if k not in dead]
        return found

    @staticmethod
    def _after(txn: Any, db: Any, after: bytes | None) -> Iterator[tuple[Any, Any]]:
        """The pairs of ``db`` in key order, after ``after`` (from its first with None)."""
        cursor = txn.cursor(db=db)
        found = cursor.set_range(after) if after is not None else cursor.first()
        if found and after is not None and cursor.key() == after:
            found = cursor.next()
        if found:
            yield from cursor.iternext()

    @classmethod
    def _merged(cls, txn: Any, data: list[Any], tombs: list[Any], after: bytes | None) -> Iterator[tuple[bytes, Any]]:
        """Every visible pair through the layers, in key order, after ``after`` (one layer:
        its cursor alone, with nothing to merge): the pairs of the layers' overlay, whose
        tombstones are merged in as streams. Each pair of a lower layer was looked up in
        every tombstone database above it before: scanning a 10.45 M-record version through
        6 layers in pages of 10,000 took 35.4-48.4 s, now 14.3-16.4 s (alternating, same
        records); ``bulldozer namespace verify`` of the next version, 7 layers deep, took 85.6 s,
        now 48.8 s."""
        if len(data) == 1:
            yield from cls._after(txn, data[0], after)
            return
        for key, value in cls._overlay(txn, data, tombs, after):
            if value is not None:
                yield key, value

    @contextlib.contextmanager
    def _write(self, buffers: bool = False) -> Iterator[Any]:
        """A write transaction (``buffers``: its reads return memoryviews into the map); a
        commit the disk has no room for, or a damaged store, says so (``_explained``)."""
        with self._explained():
            begun = self.env.begin(write=True, buffers=True) if buffers else self.env.begin(write=True)
            with begun as txn:
                yield txn

    @contextlib.contextmanager
    def _read(self) -> Iterator[Any]:
        """A read transaction; a damaged store says so (``_explained``)."""
        with self._explained(), self.env.begin() as txn:
            yield txn

    def _durable(self) -> None:
        with self._explained():
            self.env.sync(True)

    @contextlib.contextmanager
    def _explained(self) -> Iterator[None]:
        """An LMDB error the store's disk or a damaged file caused, raised as what it means
        (``_disk_full``, ``_damaged``); any other as it is."""
        try:
            yield
        except lmdb.Error as exc:
            said = self._disk_full(exc) or self._damaged(exc)
            if said is None:
                raise
            raise said from exc

    def _damaged(self, exc: lmdb.Error) -> StoreDamagedError | None:
        """The error of a store whose file LMDB finds is not what it wrote (``_DAMAGED``)."""
        if not isinstance(exc, _DAMAGED):
            return None
        return StoreDamagedError(
            f"the embedded store at {self.path} is damaged ({first_line(exc)}): its file is not what LMDB wrote "
            "(a failing disk, a copy taken while it was written, another program's write), and nothing more is "
            "written to it; restore it from a backup, or move it aside and run the jobs again"
        )

    def _disk_full(self, exc: lmdb.Error) -> KvError | None:
        """What a failed write to the store's file means, when the disk holding it is the
        cause: LMDB reports a write refused for want of space as ``ENOSPC``, and one cut
        short by it as ``EIO`` ("short write, filesystem full?" in LMDB's source). With
        little space left there (``DISK_FULL_BELOW``) that is a full disk, and the caller gets
        a ResourceExhaustedError naming the store and the free space; an ``EIO`` with room
        to spare is a failing disk (BackendUnavailableError). Other LMDB errors: None. The
        transaction was aborted either way: the store holds what it held before it."""
        if not isinstance(exc, lmdb.DiskError) and (
            type(exc) is not lmdb.Error or os.strerror(errno.EIO) not in str(exc)
        ):
            return None
        try:
            free, total = self._disk_space()
        except OSError:
            return None
        if isinstance(exc, lmdb.DiskError) or free < DISK_FULL_BELOW:
            return ResourceExhaustedError(
                f"the disk holding the embedded store at {self.path} is full ({free / 2**20:,.0f} MiB free of "
                f"{total / 2**20:,.0f} MiB): make room there, or drop old versions (bulldozer gc)"
            )
        return BackendUnavailableError(f"the embedded store at {self.path} could not be written: {exc}")

    def _ns(self, txn: Any, name: str) -> NamespaceRecord | None:
        raw = txn.get(name.encode(), db=self._meta)
        return NamespaceRecord.from_json(json.loads(raw)) if raw is not None else None

    def _put_ns(self, txn: Any, record: NamespaceRecord) -> None:
        txn.put(record.name.encode(), _dumps(record.to_json()), db=self._meta)
        txn.put(record.name.encode(), record.state.value.encode(), db=self._states)

    def _state(self, txn: Any, name: str) -> NamespaceRecord | None:
        """A stand-in record carrying only the state (enough for the lifecycle checks)."""
        raw = txn.get(name.encode(), db=self._states)
        return NamespaceRecord(name=name, alias="", state=State(bytes(raw).decode())) if raw is not None else None

    def _map_full(self, exc: Exception) -> ResourceExhaustedError:
        limit = address_space_limit()
        fitted = (
            f" (its map, {_size(self.config.map_size)}, is a quarter of this process's address-space limit, "
            f"{_size(limit)}: ulimit -v)"
            if limit is not None and self.config.map_size == default_map_size()
            else ""
        )
        return ResourceExhaustedError(
            f"the embedded store at {self.path} is full ({exc}){fitted}; restart the DAL with a larger "
            "--map-size-gib or drop old versions"
        )

    # -- namespaces -------------------------------------------------------------

    def create_namespace(self, record: NamespaceRecord) -> None:
        self._clear_stale_readers()  # before this version's load: the pages of the dropped ones are reused
        try:
            with self._write() as txn:
                if txn.get(record.name.encode(), db=self._meta) is not None:
                    raise NamespaceExistsError(f"namespace {record.name!r} already exists")
                self._put_ns(txn, record)
                txn.put(record.name.encode(), _DIGEST.pack(0, 0, 0, 1), db=self._digests)
                txn.delete(record.name.encode(), db=self._filters)  # a filter is only ever its own layer's
                db = self.env.open_db(_data_db(record.name), txn=txn, create=True)
        except lmdb.MapFullError as exc:
            raise self._map_full(exc) from exc
        except lmdb.DbsFullError as exc:
            raise ResourceExhaustedError(f"too many namespaces open in this process ({exc})") from exc
        with self._lock:
            self._dbs[record.name] = db
        self._durable()

    def get_namespace(self, name: str) -> NamespaceRecord | None:
        with self._read() as txn:
            return self._ns(txn, name)

    def list_namespaces(
        self, alias: str | None = None, states: frozenset[State] | None = None
    ) -> list[NamespaceRecord]:
        """With ``states``, only the records whose state (a few bytes in ``meta.states``)
        is one of them are read and parsed: a store's history of DROPPED versions grows
        with every run, the live versions do not. Measured on a store of 255 records, 4 of
        them held (warm 10 M-row deltas, in process): retention's listing 33–37 → 2–3 ms,
        its stage 36–41 → 4–5 ms, where it had read every record on each of three pages."""
        with self._read() as txn:
            if states is None:
                raws = [v for _, v in txn.cursor(db=self._meta)]
            else:
                wanted = {s.value.encode() for s in states}
                names = [bytes(k) for k, v in txn.cursor(db=self._states) if bytes(v) in wanted]
                raws = [raw for name in names if (raw := txn.get(name, db=self._meta)) is not None]
            records = [NamespaceRecord.from_json(json.loads(v)) for v in raws]
        return select_namespaces(records, alias, states)

    def transition(
        self, name: str, expected: frozenset[State], record: NamespaceRecord, based_on: NamespaceRecord | None = None
    ) -> NamespaceRecord:
        if record.state == State.SEALING:
            self._durable()  # every loaded record is on disk before the seal measures it
        with self._write() as txn:
            check_transition(name, self._ns(txn, name), expected, based_on)
            self._put_ns(txn, record)
        self._durable()
        return record

    def drop_data(self, name: str) -> None:
        """Delete the namespace's data, unless a version reads through to it: then it is
        kept (marked) until the last such version's data is dropped, which drops it too."""
        freed: str | None = name
        while freed is not None:
            freed = self._drop_layer(freed)
        self._durable()

    def _drop_layer(self, name: str) -> str | None:
        """Drop one namespace's data now if no layer depends on it; returns its base when
        that was kept only for it and can go now too."""
        key = name.encode()
        with self._lock:
            db = self._dbs.pop(name, None)
            tomb = self._tombs.pop(name, None)
        with self._write() as txn:
            layered = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=self._layers) if not k.startswith(_ZOMBIE)]
            if any(v == key for _, v in layered):
                txn.put(_ZOMBIE + key, b"", db=self._layers)  # a version reads through it: kept for now
                return None
            if db is None:
                with contextlib.suppress(lmdb.NotFoundError):
                    db = self.env.open_db(_data_db(name), txn=txn, create=False)
            if db is not None:
                txn.drop(db, delete=True)
            txn.delete(key, db=self._filters)  # the layer's key filter goes with its data
            base = txn.get(key, db=self._layers)
            if base is not None:
                if tomb is None:
                    with contextlib.suppress(lmdb.NotFoundError):
                        tomb = self.env.open_db(_tomb_db(name), txn=txn, create=False)
                if tomb is not None:
                    txn.drop(tomb, delete=True)
                txn.delete(key, db=self._layers)
            txn.delete(_ZOMBIE + key, db=self._layers)
            txn.delete(key, db=self._digests)
            self._delete_runs(txn, _stage_prefix(name))
            if base is None:
                return None
            base_key = bytes(base)
            still = any(v == base_key for k, v in layered if k != key)
            waiting = txn.get(_ZOMBIE + base_key, db=self._layers) is not None
            return base_key.decode() if waiting and not still else None

    # -- data -------------------------------------------------------------------

    def write_batch(self, name: str, keys: list[bytes], values: list[bytes], digest: Digest | None = None) -> None:
        """Stage the batch as one sorted run (see the module's docstring), in one
        transaction that checks the version is LOADING. With the batch's ``digest``, the
        namespace's running digest grows by it in the same transaction; a key repeated in
        the batch marks it inexact (the seal then scans), as ``ingest`` does for a key
        repeated across runs."""
        if any(not k or len(k) > self.max_key_bytes for k in keys):
            raise InvalidArgumentError(f"a key is empty or larger than {self.max_key_bytes} bytes")
        run, repeated = sorted_run(keys, values)
        prefix = _stage_prefix(name)
        try:
            with self._write() as txn:
                check_writable(name, self._state(txn, name))
                number = self._next_run(txn.cursor(db=self._stage), prefix)
                txn.put(prefix + _RUN_NUMBER.pack(number), run, db=self._stage)
                self._add_digest(txn, name, None if repeated else digest)
        except lmdb.MapFullError as exc:
            raise self._map_full(exc) from exc

    @staticmethod
    def _next_run(cursor: Any, prefix: bytes) -> int:
        """The number the namespace's next staged run gets: one after its last."""
        found = cursor.prev() if cursor.set_range(prefix + b"\xff" * _RUN_NUMBER.size) else cursor.last()
        if found:
            key = cursor.key()
            if len(key) == len(prefix) + _RUN_NUMBER.size and key.startswith(prefix):
                return int(_RUN_NUMBER.unpack_from(key, len(prefix))[0]) + 1
        return 0

    def _delete_runs(self, txn: Any, prefix: bytes) -> None:
        cursor = txn.cursor(db=self._stage)
        found = cursor.set_range(prefix)
        while found and bytes(cursor.key()[: len(prefix)]) == prefix:
            found = cursor.delete()

    def ingest(self, name: str) -> tuple[int, int]:
        """Merge the namespace's staged runs into its data in key order, in one
        transaction (a crash leaves them staged, to be ingested again), the newest run
        winning a repeated key; appended (MDB_APPEND) when the data is empty, else put
        without overwriting and overwritten where a key was there (the running digest is
        then inexact). The reference for the Go data plane's kvd_ingest."""
        import heapq
        from operator import itemgetter

        data, tombs = self._layer_dbs(self._chain(name))
        db = data[0]
        prefix = _stage_prefix(name)
        try:
            with self._write(buffers=True) as txn:
                record = self._state(txn, name)
                if record is None or record.state == State.DROPPED:
                    raise NamespaceNotFoundError(f"namespace {name!r} does not exist")
                runs = []
                cursor = txn.cursor(db=self._stage)
                found = cursor.set_range(prefix)
                while found and bytes(cursor.key()[: len(prefix)]) == prefix:
                    runs.append(cursor.value())  # a view into the map, valid for the transaction
                    found = cursor.next()
                if not runs:
                    return 0, 0
                empty = txn.stat(db)["entries"] == 0
                out = txn.cursor(db=db)
                repeated = False
                records = 0

                written: list[bytes] = []  # a layered version's, checked against its bases below

                def write(key: bytes, value: Any) -> None:
                    nonlocal repeated
                    if len(data) > 1:
                        written.append(key)
                    if empty:
                        out.put(key, value, append=True)
                    elif not out.put(key, value, overwrite=False):
                        out.put(key, value)
                        repeated = True

                last_key: bytes | None = None
                last_value: Any = None
                # heapq.merge keeps the order of the runs among equal keys: the newest comes last
                for key, value in heapq.merge(*(run_records(r) for r in runs), key=itemgetter(0)):
                    records += 1
                    if key == last_key:
                        repeated = True
                    elif last_key is not None:
                        write(last_key, last_value)
                    last_key, last_value = key, value
                if last_key is not None:
                    write(last_key, last_value)
                if written:
                    deleted_first = {k for k, _ in txn.cursor(db=tombs[0]).getmulti(written)}
                    if self._lookup_many(txn, data[1:], tombs[1:], [k for k in written if k not in deleted_first]):
                        repeated = True  # a put hides a base's pair the running digest still counts
                self._delete_runs(txn, prefix)
                if repeated:
                    self._add_digest(txn, name, None)
                return len(runs), records
        except lmdb.MapFullError as exc:
            raise self._map_full(exc) from exc

    def _has_staged(self, name: str) -> bool:
        prefix = _stage_prefix(name)
        with self._read() as txn:
            cursor = txn.cursor(db=self._stage)
            return bool(cursor.set_range(prefix) and cursor.key().startswith(prefix))

    def copy_records(self, source: str, target: str) -> None:
        """Make ``target`` read through to ``source`` (a layer: nothing is copied), or, when
        ``source`` already reads through ``MAX_LAYERS`` bases, through to a base further
        down, with what the layers above that base changed merged into ``target``'s own
        data and tombstones (LMDB's append mode, one transaction). Which base: the nearest
        that keeps the chain ``MAX_LAYERS`` deep, then further down past every layer no
        larger than what is merged so far (size tiers, as an LSM tree compacts: each merge
        costs about what the layers it merges hold, and a large layer is merged only once as
        much has stacked on it); past the bottom's flat records too, once the layers above
        it hold ``COMPACT_BOTTOM_AT`` times its entries: ``target`` is then flat (every
        visible pair, no tombstones, no base), and so the bottom of the chains made from it.
        Either way ``target``'s running digest starts from what ``source``'s seal measured."""
        base = self.get_namespace(source)  # its measured count and digest never change once sealed
        if base is None:
            raise NamespaceNotFoundError(f"namespace {source!r} does not exist")
        chain = self._chain(source)
        bottom = len(chain) - 1
        data, tombs = self._layer_dbs(chain) if bottom >= shared.STORE_MAX_LAYERS else ([], [])
        dst = self._db(target)
        try:
            with self._write(buffers=True) as txn:
                check_writable(target, self._state(txn, target))
                check_readable(source, self._state(txn, source))  # not being dropped meanwhile
                if txn.stat(dst)["entries"] or txn.get(target.encode(), db=self._layers) is not None:
                    raise InvalidArgumentError(f"namespace {target!r} already holds records; a base is copied first")
                merged = 0  # layers merged: target reads through chain[merged], or is flat past the bottom
                above = flat_below = 0
                if data:
                    sizes = [txn.stat(data[i])["entries"] + txn.stat(tombs[i])["entries"] for i in range(bottom)]
                    merged = bottom + 1 - shared.STORE_MAX_LAYERS
                    while merged < bottom and sizes[merged] <= sum(sizes[:merged]):
                        merged += 1
                    above, flat_below = sum(sizes), txn.stat(data[bottom])["entries"]
                    if above >= COMPACT_BOTTOM_AT * flat_below:
                        merged = bottom + 1
                tomb = None
                if merged <= bottom:
                    tomb = self.env.open_db(_tomb_db(target), txn=txn, create=True)
                    txn.put(target.encode(), chain[merged].encode(), db=self._layers)
                if merged and self._kvd_binary is None:
                    self._merge(txn, dst, tomb, data[:merged], tombs[:merged])
                txn.put(target.encode(), _DIGEST.pack(base.record_count, base.digest, base.bytes, 1), db=self._digests)
            if merged and self._kvd_binary is not None:
                # the version is made and LOADING, its layers not merged yet: the caller gets
                # the version only once they are (a crash in between leaves one that no run
                # resumes: versioning.run_state.base_copied)
                self._merge_natively(target, chain[:merged], dst, tomb, data[:merged], tombs[:merged])
        except lmdb.MapFullError as exc:
            raise self._map_full(exc) from exc
        except lmdb.DbsFullError as exc:
            raise ResourceExhaustedError(f"too many namespaces open in this process ({exc})") from exc
        if merged > bottom:
            import logging

            logging.getLogger("bulldozer.kv.server").info(
                "%s: compacted flat (%d entries in %d layers over a bottom of %d records)",
                target,
                above,
                bottom,
                flat_below,
            )

    def _merge(self, txn: Any, dst: Any, tomb: Any | None, data: list[Any], tombs: list[Any]) -> None:
        """Write into a version's own data and tombstones what ``data``/``tombs`` (layers,
        newest first) change over the layer below them, appended in key order. With no
        ``tomb`` the last layer is the chain's bottom (``tombs`` one shorter), with nothing
        below it: the version gets every visible pair and a deleted key is not written."""
        puts = txn.cursor(db=dst)
        dels = None if tomb is None else txn.cursor(db=tomb)
        for key, value in self._overlay(txn, data, tombs):
            if value is not None:
                puts.put(key, value, append=True)
            elif dels is not None:
                dels.put(key, _TOMBSTONE, append=True)

    def _merge_natively(
        self, target: str, layers: list[str], dst: Any, tomb: Any | None, data: list[Any], tombs: list[Any]
    ) -> None:
        """``_merge`` by ``bulldozer-kvd`` (one write transaction there); should it fail, here."""
        import logging

        _, failure = self._kvd(f"--merge-into={target}", f"--merge-layers={','.join(layers)}")
        if not failure:
            return
        logging.getLogger("bulldozer.kv.server").warning(
            "layers of %s merged here: bulldozer-kvd could not (%s)", target, failure
        )
        with self._write(buffers=True) as txn:  # its transaction wrote nothing, or all
            check_writable(target, self._state(txn, target))
            if txn.stat(dst)["entries"] or (tomb is not None and txn.stat(tomb)["entries"]):
                raise InvalidArgumentError(f"namespace {target!r}: its layers were merged meanwhile")
            self._merge(txn, dst, tomb, data, tombs)

    def _kvd(self, *arguments: str) -> tuple[str, str]:
        """Run ``bulldozer-kvd`` on this store, in a process of its own, for one job
        (``arguments``): its output, and why it failed ("" when it did not). It ends with this
        process (a merge then commits nothing)."""
        import subprocess

        assert self._kvd_binary is not None
        command = [str(self._kvd_binary), *self.config.kvd_arguments(), f"--parent-pid={os.getpid()}", *arguments]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=3600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return "", str(exc)
        return done.stdout, (done.stderr.strip() or f"exit code {done.returncode}") if done.returncode else ""

    def measure(self, name: str) -> Digest:
        """By ``bulldozer-kvd`` when it fronts the engine (a compiled walk through the layers in
        one read transaction: on a 10 M-row version, 1.6 s flat and 7.4 s through five layers,
        against 17 s and 101 s here); should it fail, here."""
        import logging

        if self._kvd_binary is not None:
            out, failure = self._kvd(f"--measure={name}")
            if not failure:
                try:
                    got = json.loads(out)
                    return Digest(int(got["count"]), int(got["digest"]), int(got["bytes"]))
                except (ValueError, KeyError, TypeError) as exc:
                    failure = f"unreadable output {out[:200]!r} ({exc})"
            logging.getLogger("bulldozer.kv.server").warning(
                "%s measured here: bulldozer-kvd could not (%s)", name, failure
            )
        return super().measure(name)

    @classmethod
    def _overlay(
        cls, txn: Any, data: list[Any], tombs: list[Any], after: bytes | None = None
    ) -> Iterator[tuple[bytes, Any]]:
        """What layers (newest first) change over the version below the last of them: for
        every key one of them holds or deletes, in key order (after ``after``), the value the
        newest such layer holds, or None where it deletes the key (a layer's own pair wins
        over its tombstone, as reads take it)."""
        import heapq
        from itertools import groupby
        from operator import itemgetter

        def entries(db: Any, layer: int, kind: int) -> Iterator[tuple[bytes, int, int, Any]]:
            for key, value in cls._after(txn, db, after):
                yield bytes(key), layer, kind, value

        streams = [entries(db, i, 0) for i, db in enumerate(data)]
        streams += [entries(db, i, 1) for i, db in enumerate(tombs)]
        for key, group in groupby(heapq.merge(*streams, key=itemgetter(0, 1, 2)), key=itemgetter(0)):
            _, _, kind, value = next(group)
            yield key, (value if kind == 0 else None)

    def delete_batch(self, name: str, keys: Sequence[bytes]) -> int:
        """Ingest what is staged (a staged put must not outlive a later delete), then delete
        in one transaction that checks the version is LOADING, subtracting the deleted pairs
        from the running digest; in a layered version, a key a base holds gets a tombstone."""
        from bulldozer.codec.digest import digest_lists

        chain = self._chain(name)
        data, tombs = self._layer_dbs(chain)
        if self._has_staged(name):
            self.ingest(name)
        try:
            with self._write() as txn:
                check_writable(name, self._state(txn, name))
                keys = sorted({bytes(k) for k in keys})  # once each, in key order (page locality)
                own = dict(txn.cursor(db=data[0]).getmulti(keys))
                for key in own:
                    txn.delete(key, db=data[0])
                visible = dict(own)
                if len(data) > 1:
                    below = self._lookup_many(txn, data[1:], tombs[1:], keys)
                    dead = {k for k, _ in txn.cursor(db=tombs[0]).getmulti([k for k in below if k not in own])}
                    visible.update((k, v) for k, v in below.items() if k not in own and k not in dead)
                    txn.cursor(db=tombs[0]).putmulti([(k, _TOMBSTONE) for k in below])
                gone_keys = list(visible)
                gone_values = [bytes(v) for v in visible.values()]
                if gone_keys:
                    self._add_digest(txn, name, digest_lists(gone_keys, gone_values).negated())
                return len(gone_keys)
        except lmdb.MapFullError as exc:
            raise self._map_full(exc) from exc

    def _add_digest(self, txn: Any, name: str, digest: Digest | None) -> None:
        raw = txn.get(name.encode(), db=self._digests)
        if raw is None:
            return  # created before running digests were kept: the seal scans
        count, value, nbytes, exact = _DIGEST.unpack(raw)
        if not exact:
            return
        if digest is None:
            txn.put(name.encode(), _DIGEST.pack(count, value, nbytes, 0), db=self._digests)
            return
        total = Digest(count, value, nbytes)
        total.add(digest)
        txn.put(name.encode(), _DIGEST.pack(total.count, total.value, total.bytes, 1), db=self._digests)

    def stored_digest(self, name: str) -> Digest | None:
        """The running digest, once nothing is staged (a key repeated across staged runs is
        only found when they are ingested)."""
        prefix = _stage_prefix(name)
        with self._read() as txn:
            cursor = txn.cursor(db=self._stage)
            if cursor.set_range(prefix) and cursor.key().startswith(prefix):
                return None
            raw = txn.get(name.encode(), db=self._digests)
        if raw is None:
            return None
        count, value, nbytes, exact = _DIGEST.unpack(raw)
        return Digest(count, value, nbytes) if exact else None

    def get_many(self, name: str, keys: Sequence[bytes]) -> list[bytes | None]:
        chain = self._chain(name)
        data, tombs = self._layer_dbs(chain)
        with self._read() as txn:
            check_readable(name, self._state(txn, name))
            if len(data) == 1:
                return [txn.get(k, db=data[0]) for k in keys]
            found = self._lookup_many(txn, data, tombs, keys)
            return [found.get(k) for k in keys]

    def scan(self, name: str, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        chain = self._chain(name)
        data, tombs = self._layer_dbs(chain)
        with self._read() as txn:
            record = self._state(txn, name)
            if record is None or record.state == State.DROPPED:
                check_readable(name, record)
            out: list[tuple[bytes, bytes]] = []
            for pair in self._merged(txn, data, tombs, after):
                out.append(pair)
                if len(out) >= limit:
                    break
            return out

    def iterate(self, name: str, chunk: int = 50_000) -> Iterator[list[tuple[bytes, bytes]]]:
        data, tombs = self._layer_dbs(self._chain(name))
        with self._read() as txn:
            yield from chunked(self._merged(txn, data, tombs, None), chunk)

    # -- aliases ----------------------------------------------------------------

    def get_alias(self, alias: str) -> AliasRecord | None:
        with self._read() as txn:
            raw = txn.get(alias.encode(), db=self._aliases)
        return AliasRecord.from_json(json.loads(raw)) if raw is not None else None

    def list_aliases(self) -> list[AliasRecord]:
        with self._read() as txn:
            return [AliasRecord.from_json(json.loads(v)) for _, v in txn.cursor(db=self._aliases)]

    def flip_alias(
        self, alias: str, expected: str | None, target: str, principal: str, reason: str, respect_pin: bool = False
    ) -> AliasRecord:
        with self._write() as txn:
            raw = txn.get(alias.encode(), db=self._aliases)
            current = AliasRecord.from_json(json.loads(raw)) if raw is not None else None
            previous = self._ns(txn, current.namespace) if current else None
            record, changed, change = plan_flip(
                alias, current, expected, self._ns(txn, target), target, previous, principal, reason, respect_pin
            )
            if change is None:
                return record
            for ns in changed:
                self._put_ns(txn, ns)
            self._put_alias(txn, record, change)
        self._durable()
        return record

    def _put_alias(self, txn: Any, record: AliasRecord, change: AliasChange) -> None:
        txn.put(record.alias.encode(), _dumps(record.to_json()), db=self._aliases)
        key = record.alias.encode() + b"\x00" + struct.pack(">Q", change.generation)
        txn.put(key, _dumps(change.to_json()), db=self._history)

    def set_pin(self, alias: str, pinned: bool, principal: str, reason: str) -> AliasRecord:
        with self._write() as txn:
            raw = txn.get(alias.encode(), db=self._aliases)
            current = AliasRecord.from_json(json.loads(raw)) if raw is not None else None
            record, change = plan_pin(alias, current, pinned, principal, reason)
            if change is not None:
                self._put_alias(txn, record, change)
        self._durable()
        return record

    def alias_history(self, alias: str, limit: int = 100) -> list[AliasChange]:
        prefix = alias.encode() + b"\x00"
        out = []
        with self._read() as txn:
            cursor = txn.cursor(db=self._history)
            found = cursor.set_range(prefix)
            while found and cursor.key().startswith(prefix):
                out.append(AliasChange.from_json(json.loads(cursor.value())))
                found = cursor.next()
        return list(reversed(out))[:limit]

    def flush(self) -> None:
        self.env.sync(True)

    def close(self) -> None:
        self.env.close()
