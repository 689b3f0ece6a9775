"""``cassandra``: Apache Cassandra (``bulldozer[cassandra]``, the DataStax Python driver).

Layout in one keyspace that Bulldozer owns (created if missing, refused if it holds
tables Bulldozer did not create):

* ``meta``: every namespace record, alias record and alias history entry, as rows of
  one partition (clustering ``(kind, id)``). Each metadata change is one conditional
  batch on that partition — a lightweight transaction — so creating a namespace is
  ``IF NOT EXISTS``, a state change is ``IF body = <what was read>``, and an alias flip
  checks the alias row and both namespaces' rows, then writes them and the history entry,
  atomically. Any number of DAL processes can front one cluster.
* ``inflight``: the write fence: a batch registers a row (with a TTL, so a crashed
  writer cannot block forever), then reads the namespace's state linearizably (serial
  consistency); a seal or drop first commits its state change by LWT, then waits until
  the namespace has no inflight row. A batch therefore lands before the seal's digest or
  is refused.
* one table per version, ``t_<hash of the validated name>`` (``k blob PRIMARY KEY, v blob``):
  dropping a version is one ``DROP TABLE``, never millions of deletes. Writes are
  unlogged batches grouped by replica and bounded in bytes, executed concurrently.
  Scans run in token order (``token(k) > token(after)``), which is stable and resumable
  after any key, but not the keys' byte order.

Every CQL identifier is built from a validated name (the keyspace from the config's
pattern, a table from a hash), never from raw spec text.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from cassandra import ConsistencyLevel, DriverException, InvalidRequest
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    DefaultConnection,
    ExecutionProfile,
    NoHostAvailable,
    Session,
)
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.connection import ConnectionBusy, ConnectionException
from cassandra.policies import DCAwareRoundRobinPolicy, ExponentialReconnectionPolicy, TokenAwarePolicy
from cassandra.protocol import OverloadedErrorMessage
from cassandra.query import BatchStatement, BatchType, PreparedStatement

from bulldozer.codec.digest import Digest
from bulldozer.errors import (
    BackendUnavailableError,
    ForeignDataError,
    InvalidArgumentError,
    KvError,
    NamespaceExistsError,
    NamespaceNotFoundError,
    ResourceExhaustedError,
)
from bulldozer.kv.backends._lifecycle import (
    PendingReleases,
    check_readable,
    check_writable,
    flip_optimistically,
    pin_optimistically,
    transition_optimistically,
)
from bulldozer.kv.backends.base import StorageEngine, chunked, select_namespaces
from bulldozer.kv.backends.config import CassandraConfig
from bulldozer.kv.types import AliasChange, AliasRecord, NamespaceRecord, State

__all__ = ["CassandraEngine", "SegmentSafeConnection", "table_name"]

_FORMAT = 1
_SCOPE = "bulldozer"
_T = TypeVar("_T")
#: Unlogged batches stay under Cassandra's default batch_size_fail_threshold (50 KiB).
_BATCH_BYTES = 40 * 1024
_BATCH_ROWS = 64


#: what a node says when it could not write to its disk (a flush, a compaction or its commit
#: log): Cassandra's FSWriteError names the file; the JVM's own text for ENOSPC
_DISK_WRITE = re.compile(r"FSWriteError in [^\s\"'>]+|No space left on device")


def driver_failure(where: str, exc: BaseException) -> KvError:
    """The error a failed driver call stands for, as one line that says what happened.

    - A node that could not write to its disk: ResourceExhaustedError. On a full disk a
      node fails the flushes, compactions and schema changes a request needs, and reports
      ``FSWriteError in FILE`` (it keeps running; its disk_failure_policy may stop it).
    - No node answers: the driver had none to try, or each it tried closed or refused its
      connection. A node whose commit log cannot grow on a full disk dies (SIGBUS from its
      memory-mapped segment) in the middle of the requests it was serving.
    - Anything else: the driver's own words, each node's reason once (not the driver's
      nested tuple of host objects)."""
    causes = list(exc.errors.items()) if isinstance(exc, NoHostAvailable) else [(None, exc)]
    disk = _DISK_WRITE.search(" ".join(str(cause) for _, cause in causes))
    if disk:
        return ResourceExhaustedError(
            f"Cassandra at {where} could not write to its disk ({disk.group(0)}): the node's disk is full or "
            "failing: make room there (or drop old versions: bulldozer gc), and restart the node if it stopped"
        )
    # each node's reason, on one line (a server's message may hold line breaks)
    said = " ".join("; ".join((f"{h.endpoint}: " if h else "") + _cause(c) for h, c in causes).split())
    if all(isinstance(cause, OSError | ConnectionException) for _, cause in causes):
        return BackendUnavailableError(
            f"no Cassandra node at {where} answers{f' ({said})' if said else ''}: each went down or closed its "
            "connections (a node stops, or dies, when its disk fills up, among other causes): see the node's log"
        )
    return BackendUnavailableError(f"Cassandra at {where} failed a request: {said}")


def _cause(exc: BaseException) -> str:
    """One node's reason: a server error's own message, without the driver's wrapping."""
    summary, message = getattr(exc, "summary", None), getattr(exc, "message", None)
    if summary and message:
        return f"{summary}: {message}"
    return str(exc) or type(exc).__name__


def overloaded(exc: BaseException) -> bool:
    """Cassandra pushing back — the coordinator is overloaded or every connection is busy —
    so the request was not applied and may be sent again after a pause."""
    if isinstance(exc, NoHostAvailable):
        errors = list(getattr(exc, "errors", {}).values())
        return bool(errors) and all(overloaded(e) for e in errors)
    return isinstance(exc, ConnectionBusy | OverloadedErrorMessage)


class _Throttle:
    """Writes in flight over every put of one engine, limited additive-increase /
    multiplicative-decrease: a refusal for overload halves the limit (once per burst), each
    success adds about one per round of writes, up to the configured concurrency."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = float(ceiling)
        self.limit = float(ceiling)
        self.inflight = 0
        #: writes refused by backpressure so far (each was sent again)
        self.pushed_back = 0
        self._cond = threading.Condition()
        self._cut_at = 0.0

    def acquire(self, patience: float) -> bool:
        """A slot for one more write; False when none came free for ``patience`` seconds."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.inflight < max(1, int(self.limit)), timeout=patience):
                return False
            self.inflight += 1
            return True

    def release(self, pushed_back: bool) -> None:
        with self._cond:
            self.inflight -= 1
            now = time.monotonic()
            if pushed_back:
                self.pushed_back += 1
                if now - self._cut_at > 0.05:
                    self.limit = max(1.0, self.limit / 2)
                    self._cut_at = now
            else:
                self.limit = min(self.ceiling, self.limit + 1 / self.limit)
            self._cond.notify_all()


class _Round:
    """The answers to one round of writes: which were pushed back (to send again) and which
    failed otherwise; ``done`` is set once every write of the round answered or was skipped."""

    def __init__(self, count: int, throttle: _Throttle) -> None:
        self.throttle = throttle
        self.retry: list[Any] = []
        self.failures: list[BaseException] = []
        self.done = threading.Event()
        #: when a write of the round last answered (or the round began)
        self.answered_at = time.monotonic()
        self._left = count
        self._lock = threading.Lock()
        if count == 0:
            self.done.set()

    def succeeded(self, _rows: Any, batch: Any) -> None:
        self.settle(batch, None)

    def failed(self, exc: BaseException, batch: Any) -> None:
        self.settle(batch, exc)

    def settle(self, batch: Any, exc: BaseException | None) -> None:
        pushed_back = exc is not None and overloaded(exc)
        self.throttle.release(pushed_back)
        with self._lock:
            if pushed_back:
                self.retry.append(batch)
            elif exc is not None:
                self.failures.append(exc)
        self.skip(1)

    def skip(self, count: int) -> None:
        with self._lock:
            self.answered_at = time.monotonic()
            self._left -= count
            if self._left == 0:
                self.done.set()


class _Backoff:
    """Exponential pauses with jitter while a store pushes back; gives up once no progress
    was made for ``patience`` seconds."""

    def __init__(self, patience: float) -> None:
        self.patience = patience
        self.pause = 0.02
        self.last_progress = time.monotonic()

    def progress(self) -> None:
        self.last_progress = time.monotonic()
        self.pause = 0.02

    def wait(self) -> bool:
        """Pause before the next attempt; False when patience has run out."""
        if time.monotonic() - self.last_progress > self.patience:
            return False
        time.sleep(self.pause * (0.5 + random.random()))
        self.pause = min(self.pause * 2, 1.0)
        return True


class SegmentSafeConnection(DefaultConnection):  # type: ignore[misc]
    """The driver's connection, except that it keeps the start of a segment header that a
    socket read ended in.

    From protocol v5 on, a server's frames come in checksummed segments, each opening with a
    6-byte header (8 compressed). When a read ends less than a whole header into the next
    segment, the driver (3.30, and its source today) leaves its buffer's position at the end
    and then keeps only what follows the position: those bytes are lost, the next header is
    read out of step, and the connection dies with "CRC mismatch on header", failing every
    request on it. The TCP stream only has to split there: busy writes made it happen (a CI
    run's backpressure test lost all 8 of its puts). Rewinding first makes the driver take
    the short buffer for what it is, the part of a header to complete on the next read.
    tests/unit/test_cassandra_wire.py proves it on every split of a stream."""

    def _process_segment_buffer(self) -> None:
        buffer = self._io_buffer.io_buffer
        if buffer.tell() < self._segment_codec.header_length_with_crc:
            buffer.seek(0)
        super()._process_segment_buffer()


def table_name(namespace: str) -> str:
    """The data table of a (validated) namespace name: 26 characters of [a-z0-9_]."""
    return "t_" + hashlib.blake2b(namespace.encode(), digest_size=12).hexdigest()


def _consistency(name: str) -> int:
    try:
        return int(ConsistencyLevel.name_to_value[name.upper()])
    except KeyError:
        known = ", ".join(sorted(ConsistencyLevel.name_to_value))
        raise InvalidArgumentError(f"unknown Cassandra consistency level {name!r}; known: {known}") from None


class CassandraEngine(StorageEngine):
    name = "cassandra"
    key_ordered_scan = False
    max_key_bytes = 65535  # a partition key is at most 64 KiB
    #: Larger values risk Cassandra's mutation size limit (half a commit-log segment) and
    #: stall compaction; they are refused.
    max_value_bytes = 4 * 1024 * 1024

    def __init__(self, config: CassandraConfig) -> None:
        self.config = config
        endpoints = config.endpoints()
        self.where = ", ".join(f"{e}:{config.port}" if isinstance(e, str) else f"{e[0]}:{e[1]}" for e in endpoints)
        self.ks = config.keyspace
        self._write_cl = _consistency(config.write_consistency)
        self._read_cl = _consistency(config.read_consistency)
        self._serial_cl = _consistency(config.serial_consistency)
        policy = TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=config.local_dc))
        profile = ExecutionProfile(
            load_balancing_policy=policy,
            consistency_level=self._read_cl,
            serial_consistency_level=self._serial_cl,
            request_timeout=config.timeout_seconds,
        )
        auth = (
            PlainTextAuthProvider(config.username, config.password.get_secret_value() if config.password else "")
            if config.username
            else None
        )
        self.cluster = Cluster(
            endpoints,
            port=config.port,
            execution_profiles={EXEC_PROFILE_DEFAULT: profile},
            auth_provider=auth,
            connect_timeout=config.connect_timeout_seconds,
            control_connection_timeout=config.connect_timeout_seconds,
            reconnection_policy=ExponentialReconnectionPolicy(
                base_delay=min(1.0, config.reconnect_max_seconds), max_delay=config.reconnect_max_seconds
            ),
            protocol_version=config.protocol_version,
            connection_class=SegmentSafeConnection,
        )
        try:
            self.session: Session = self.cluster.connect()
        except (NoHostAvailable, DriverException, OSError) as exc:
            self.cluster.shutdown()
            raise BackendUnavailableError(f"cannot reach Cassandra at {self.where}: {exc}") from exc
        self._tables: dict[str, dict[str, PreparedStatement]] = {}
        self._leases = PendingReleases()
        self._throttle = _Throttle(config.concurrency)
        try:
            self._call(self._claim_keyspace)
            self._prepare_meta()
        except BaseException:
            self.cluster.shutdown()
            raise

    # -- plumbing ---------------------------------------------------------------

    def _call(self, fn: Callable[[], _T]) -> _T:
        """``fn``, retried while Cassandra pushes back (overloaded, connections busy: the
        request was not applied) until no attempt has succeeded for ``_patience``; every
        other driver error is BackendUnavailableError."""
        backoff = _Backoff(self._patience())
        while True:
            try:
                return fn()
            except KvError:
                raise
            except (NoHostAvailable, DriverException, OSError) as exc:
                if overloaded(exc) and backoff.wait():
                    continue
                raise driver_failure(self.where, exc) from exc

    def _patience(self) -> float:
        """How long backpressure may go on without any progress before a request fails."""
        return self.config.timeout_seconds * 3

    def _write(self, batches: list[Any]) -> None:
        """Execute the batches with at most the throttle's limit of writes in flight over
        every put of this engine; a batch refused by backpressure is sent again after a
        backoff (writes are idempotent), and the limit halves, growing back as writes succeed."""
        backoff = _Backoff(self._patience())
        pending = batches
        while pending:
            outcome = _Round(len(pending), self._throttle)
            for batch in pending:
                if outcome.failures:
                    outcome.skip(1)
                    continue
                if not self._throttle.acquire(self._patience()):
                    raise self._unanswered()
                future = self.session.execute_async(batch)
                future.add_callbacks(
                    callback=outcome.succeeded, callback_args=(batch,), errback=outcome.failed, errback_args=(batch,)
                )
            # The driver answers every write, if only with its request timeout; a write it never
            # answered (a callback lost as a connection died) fails the put, not hangs it.
            while not outcome.done.wait(1.0):
                if time.monotonic() - outcome.answered_at > self._patience():
                    raise self._unanswered()
            if outcome.failures:
                raise outcome.failures[0]
            if len(outcome.retry) < len(pending):
                backoff.progress()
            if outcome.retry and not backoff.wait():
                raise BackendUnavailableError(
                    f"Cassandra at {self.where} kept refusing writes as overloaded for {self._patience():.0f} s "
                    f"with {self._throttle.limit:.0f} in flight"
                )
            pending = outcome.retry

    def _unanswered(self) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"Cassandra at {self.where} answered none of the {self._throttle.inflight} writes in flight for "
            f"{self._patience():.0f} s (3 x timeout_seconds)"
        )

    def _claim_keyspace(self) -> None:
        tables = {
            row.table_name
            for row in self.session.execute(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (self.ks,)
            )
        }
        if tables:
            marker = None
            if "meta" in tables:
                rows = list(
                    self.session.execute(
                        f"SELECT body FROM {self.ks}.meta WHERE scope = %s AND kind = 'marker' AND id = ''",
                        (_SCOPE,),
                    )
                )
                marker = json.loads(rows[0].body) if rows else None
            if marker is None:
                sample = ", ".join(sorted(tables)[:5])
                raise ForeignDataError(
                    f"Cassandra at {self.where}: keyspace {self.ks!r} already holds tables Bulldozer did not create "
                    f"({sample}); choose another keyspace in the engine configuration"
                )
            if marker.get("format") != _FORMAT:
                raise ForeignDataError(
                    f"Cassandra at {self.where}: keyspace {self.ks!r} holds a Bulldozer store of format "
                    f"{marker.get('format')}, this is format {_FORMAT}"
                )
            return
        replication = json.dumps(self.config.replication).replace('"', "'")
        self.session.execute(f"CREATE KEYSPACE IF NOT EXISTS {self.ks} WITH replication = {replication}")
        self.session.execute(
            f"CREATE TABLE IF NOT EXISTS {self.ks}.meta (scope text, kind text, id text, body text, state text, "
            "PRIMARY KEY (scope, kind, id))"
        )
        self.session.execute(
            f"CREATE TABLE IF NOT EXISTS {self.ks}.inflight (namespace text, lease text, "
            "PRIMARY KEY (namespace, lease))"
        )
        self.session.execute(
            f"INSERT INTO {self.ks}.meta (scope, kind, id, body) VALUES (%s, 'marker', '', %s) IF NOT EXISTS",
            (_SCOPE, json.dumps({"format": _FORMAT})),
        )

    def _prepare_meta(self) -> None:
        ks = self.ks
        p = self.session.prepare
        self._ins_if_absent = p(
            f"INSERT INTO {ks}.meta (scope, kind, id, body, state) VALUES ('{_SCOPE}', ?, ?, ?, ?) IF NOT EXISTS"
        )
        self._upd_if_body = p(
            f"UPDATE {ks}.meta SET body = ?, state = ? WHERE scope = '{_SCOPE}' AND kind = ? AND id = ? IF body = ?"
        )
        self._ins = p(f"INSERT INTO {ks}.meta (scope, kind, id, body, state) VALUES ('{_SCOPE}', ?, ?, ?, ?)")
        self._sel = p(f"SELECT body FROM {ks}.meta WHERE scope = '{_SCOPE}' AND kind = ? AND id = ?")
        self._sel_kind = p(f"SELECT body FROM {ks}.meta WHERE scope = '{_SCOPE}' AND kind = ?")
        self._sel_state = p(f"SELECT state FROM {ks}.meta WHERE scope = '{_SCOPE}' AND kind = 'ns' AND id = ?")
        self._sel_state.consistency_level = self._serial_cl  # linearizable: orders the write fence
        self._sel_history = p(
            f"SELECT body FROM {ks}.meta WHERE scope = '{_SCOPE}' AND kind = 'history' AND id >= ? AND id < ? "
            "ORDER BY kind DESC, id DESC LIMIT ?"
        )
        self._enter = p(f"INSERT INTO {ks}.inflight (namespace, lease) VALUES (?, ?) USING TTL ?")
        self._enter.consistency_level = self._write_cl
        self._leave = p(f"DELETE FROM {ks}.inflight WHERE namespace = ? AND lease = ?")
        self._leave.consistency_level = self._write_cl
        self._live = p(f"SELECT lease FROM {ks}.inflight WHERE namespace = ? LIMIT 1")
        self._live.consistency_level = self._write_cl

    def _statements(self, name: str) -> dict[str, PreparedStatement]:
        stmts = self._tables.get(name)
        if stmts is None:
            table = f"{self.ks}.{table_name(name)}"
            try:
                stmts = {
                    "put": self.session.prepare(f"INSERT INTO {table} (k, v) VALUES (?, ?)"),
                    "get": self.session.prepare(f"SELECT v FROM {table} WHERE k = ?"),
                    "first": self.session.prepare(f"SELECT k, v FROM {table} LIMIT ?"),
                    "after": self.session.prepare(f"SELECT k, v FROM {table} WHERE token(k) > token(?) LIMIT ?"),
                    "all": self.session.prepare(f"SELECT k, v FROM {table}"),
                    "delete": self.session.prepare(f"DELETE FROM {table} WHERE k = ?"),
                }
            except InvalidRequest as exc:
                raise NamespaceNotFoundError(f"namespace {name!r} has no data table ({exc})") from exc
            stmts["put"].consistency_level = self._write_cl
            stmts["delete"].consistency_level = self._write_cl
            self._tables[name] = stmts
        return stmts

    def _row(self, kind: str, id_: str) -> str | None:
        rows = list(self.session.execute(self._sel, (kind, id_)))
        return rows[0].body if rows else None

    def _raw_ns(self, name: str) -> str | None:
        return self._row("ns", name)

    def _raw_alias(self, alias: str) -> str | None:
        return self._row("alias", alias)

    def _cas(self, statements: list[tuple[PreparedStatement, tuple[Any, ...]]]) -> bool:
        """Apply statements on the meta partition as one conditional batch."""
        batch = BatchStatement(batch_type=BatchType.LOGGED, serial_consistency_level=self._serial_cl)
        for stmt, params in statements:
            batch.add(stmt, params)
        batch.consistency_level = self._write_cl
        return bool(self.session.execute(batch).was_applied)

    def _guard(self, kind: str, id_: str, raw: str | None, body: str, state: str | None = None) -> Any:
        """A statement writing ``body`` iff the row still holds ``raw`` (None: is absent)."""
        if raw is None:
            return (self._ins_if_absent, (kind, id_, body, state))
        return (self._upd_if_body, (body, state, kind, id_, raw))

    @staticmethod
    def _ns_json(record: NamespaceRecord) -> str:
        return json.dumps(record.to_json(), separators=(",", ":"))

    def _wait_for_writers(self, name: str) -> None:
        self._leases.retry()  # leases this process could not release during an outage
        deadline = time.monotonic() + self.config.write_lease_seconds + 5
        delay = 0.002
        while list(self.session.execute(self._live, (name,))) and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    # -- namespaces -------------------------------------------------------------

    def create_namespace(self, record: NamespaceRecord) -> None:
        def run() -> None:
            if not self._cas([self._guard("ns", record.name, None, self._ns_json(record), record.state.value)]):
                raise NamespaceExistsError(f"namespace {record.name!r} already exists")
            self.session.execute(
                f"CREATE TABLE IF NOT EXISTS {self.ks}.{table_name(record.name)} (k blob PRIMARY KEY, v blob) "
                "WITH compaction = {'class': 'UnifiedCompactionStrategy'} AND gc_grace_seconds = 3600"
            )

        self._call(run)

    def get_namespace(self, name: str) -> NamespaceRecord | None:
        raw = self._call(lambda: self._row("ns", name))
        return NamespaceRecord.from_json(json.loads(raw)) if raw is not None else None

    def list_namespaces(
        self, alias: str | None = None, states: frozenset[State] | None = None
    ) -> list[NamespaceRecord]:
        rows = self._call(lambda: list(self.session.execute(self._sel_kind, ("ns",))))
        return select_namespaces((NamespaceRecord.from_json(json.loads(r.body)) for r in rows), alias, states)

    def transition(
        self, name: str, expected: frozenset[State], record: NamespaceRecord, based_on: NamespaceRecord | None = None
    ) -> NamespaceRecord:
        def run() -> NamespaceRecord:
            body = self._ns_json(record)
            transition_optimistically(
                name,
                expected,
                record,
                self._raw_ns,
                lambda raw: self._cas([self._guard("ns", name, raw, body, record.state.value)]),
                based_on,
            )
            if record.state != State.LOADING:
                self._wait_for_writers(name)
            return record

        return self._call(run)

    def drop_data(self, name: str) -> None:
        def run() -> None:
            self._wait_for_writers(name)
            self._tables.pop(name, None)
            self.session.execute(f"DROP TABLE IF EXISTS {self.ks}.{table_name(name)}")

        self._call(run)

    # -- data -------------------------------------------------------------------

    def _batches(self, insert: PreparedStatement, records: Iterable[tuple[bytes, bytes]]) -> list[Any]:
        """Unlogged batches of rows that share a replica, under the batch size limit."""
        by_replica: dict[Any, list[tuple[bytes, bytes]]] = {}
        metadata = self.cluster.metadata
        single = len(metadata.all_hosts()) <= 1
        for key, value in records:
            host = None if single else next(iter(metadata.get_replicas(self.ks, key)), None)
            by_replica.setdefault(host, []).append((key, value))
        batches: list[Any] = []
        for rows in by_replica.values():
            batch, size = None, 0
            for key, value in rows:
                row_size = len(key) + len(value)
                if batch is None or len(batch) >= _BATCH_ROWS or size + row_size > _BATCH_BYTES:
                    batch = BatchStatement(batch_type=BatchType.UNLOGGED, consistency_level=self._write_cl)
                    batches.append(batch)
                    size = 0
                batch.add(insert, (key, value))
                size += row_size
        return batches

    @contextlib.contextmanager
    def _fenced(self, name: str) -> Iterator[None]:
        """Inside the namespace's write fence, refused unless it is LOADING (see the module's
        docstring): every write (puts, deletes) runs in one."""
        token = uuid.uuid4().hex
        try:  # released even if entering timed out: the entry may still have happened
            self.session.execute(self._enter, (name, token, int(self.config.write_lease_seconds)))
            rows = list(self.session.execute(self._sel_state, (name,)))
            state = rows[0].state if rows else None
            if state != State.LOADING.value:
                check_writable(name, NamespaceRecord(name=name, alias="", state=State(state)) if state else None)
            yield
        finally:
            self._leases.release(lambda: self.session.execute(self._leave, (name, token)))

    def write_batch(self, name: str, keys: list[bytes], values: list[bytes], digest: Digest | None = None) -> None:
        def run() -> None:
            stmts = self._statements(name)
            with self._fenced(name):
                # a key given twice keeps its later value: Cassandra would settle two writes of
                # one key with the same timestamp by the greater value, and the batches run concurrently
                latest = dict(zip(keys, values, strict=True))
                self._write(self._batches(stmts["put"], latest.items()))

        self._call(run)

    def delete_batch(self, name: str, keys: Sequence[bytes]) -> int:
        """Inside the write fence, as a write: the keys found are deleted, concurrently."""

        def run() -> int:
            stmts = self._statements(name)
            with self._fenced(name):
                unique = list(dict.fromkeys(keys))
                found = execute_concurrent_with_args(
                    self.session, stmts["get"], [(k,) for k in unique], concurrency=self.config.concurrency
                )
                present = []
                for key, (ok, result) in zip(unique, found, strict=True):
                    if not ok:
                        raise result
                    if list(result):
                        present.append(key)
                done = execute_concurrent_with_args(
                    self.session, stmts["delete"], [(k,) for k in present], concurrency=self.config.concurrency
                )
                for ok, result in done:
                    if not ok:
                        raise result
                return len(present)

        return self._call(run)

    def _readable(self, name: str) -> None:
        raw = self._row("ns", name)
        check_readable(name, NamespaceRecord.from_json(json.loads(raw)) if raw else None)

    def get_many(self, name: str, keys: Sequence[bytes]) -> list[bytes | None]:
        def run() -> list[bytes | None]:
            self._readable(name)
            get = self._statements(name)["get"]
            out: list[bytes | None] = []
            results = execute_concurrent_with_args(
                self.session, get, [(k,) for k in keys], concurrency=self.config.concurrency
            )
            for ok, result in results:
                if not ok:
                    raise result
                rows = list(result)
                out.append(rows[0].v if rows else None)
            return out

        return self._call(run)

    def scan(self, name: str, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        def run() -> list[tuple[bytes, bytes]]:
            raw = self._row("ns", name)
            record = NamespaceRecord.from_json(json.loads(raw)) if raw else None
            if record is None or record.state == State.DROPPED:
                check_readable(name, record)
            stmts = self._statements(name)
            if after is None:
                rows = self.session.execute(stmts["first"], (limit,))
            else:
                rows = self.session.execute(stmts["after"], (after, limit))
            return [(r.k, r.v) for r in rows]

        return self._call(run)

    def iterate(self, name: str, chunk: int = 50_000) -> Iterator[list[tuple[bytes, bytes]]]:
        stmt = self._statements(name)["all"]
        stmt.fetch_size = 5000
        rows = self._call(lambda: self.session.execute(stmt))
        yield from chunked(((r.k, r.v) for r in rows), chunk)  # the driver fetches pages as they are reached

    # -- aliases ----------------------------------------------------------------

    def get_alias(self, alias: str) -> AliasRecord | None:
        raw = self._call(lambda: self._row("alias", alias))
        return AliasRecord.from_json(json.loads(raw)) if raw is not None else None

    def list_aliases(self) -> list[AliasRecord]:
        rows = self._call(lambda: list(self.session.execute(self._sel_kind, ("alias",))))
        return sorted((AliasRecord.from_json(json.loads(r.body)) for r in rows), key=lambda a: a.alias)

    def _history_row(self, change: AliasChange) -> tuple[PreparedStatement, tuple[Any, ...]]:
        id_ = f"{change.alias}\x00{change.generation:020d}"
        return (self._ins, ("history", id_, json.dumps(change.to_json()), None))

    def flip_alias(
        self, alias: str, expected: str | None, target: str, principal: str, reason: str, respect_pin: bool = False
    ) -> AliasRecord:
        def apply(
            raw_alias: str | None,
            raws: dict[str, str | None],
            record: AliasRecord,
            changed: list[NamespaceRecord],
            change: AliasChange,
        ) -> bool:
            statements = [self._guard("alias", alias, raw_alias, json.dumps(record.to_json()))]
            statements += [
                self._guard("ns", ns.name, raws[ns.name], self._ns_json(ns), ns.state.value) for ns in changed
            ]
            statements.append(self._history_row(change))
            return self._cas(statements)

        return self._call(
            lambda: flip_optimistically(
                alias, expected, target, principal, reason, respect_pin, self._raw_alias, self._raw_ns, apply
            )
        )

    def set_pin(self, alias: str, pinned: bool, principal: str, reason: str) -> AliasRecord:
        def apply(raw: str | None, record: AliasRecord, change: AliasChange) -> bool:
            return self._cas(
                [self._guard("alias", alias, raw, json.dumps(record.to_json())), self._history_row(change)]
            )

        return self._call(lambda: pin_optimistically(alias, pinned, principal, reason, self._raw_alias, apply))

    def alias_history(self, alias: str, limit: int = 100) -> list[AliasChange]:
        rows = self._call(
            lambda: list(self.session.execute(self._sel_history, (alias + "\x00", alias + "\x01", limit)))
        )
        return [AliasChange.from_json(json.loads(r.body)) for r in rows]

    def close(self) -> None:
        self.cluster.shutdown()
