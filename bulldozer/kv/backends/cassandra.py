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

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from cassandra import ConsistencyLevel, DriverException, InvalidRequest
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable, Session
from cassandra.concurrent import execute_concurrent, execute_concurrent_with_args
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import BatchStatement, BatchType, PreparedStatement

from bulldozer.errors import (
    BackendUnavailableError,
    ForeignDataError,
    InvalidArgumentError,
    KvError,
    NamespaceExistsError,
    NamespaceNotFoundError,
)
from bulldozer.kv.backends._lifecycle import (
    PendingReleases,
    check_readable,
    check_writable,
    flip_optimistically,
    pin_optimistically,
    transition_optimistically,
)
from bulldozer.kv.backends.base import (
    AliasChange,
    AliasRecord,
    NamespaceRecord,
    State,
    StorageEngine,
    chunked,
)
from bulldozer.kv.backends.config import CassandraConfig

__all__ = ["CassandraEngine", "table_name"]

_FORMAT = 1
_SCOPE = "bulldozer"
_T = TypeVar("_T")
#: Unlogged batches stay under Cassandra's default batch_size_fail_threshold (50 KiB).
_BATCH_BYTES = 40 * 1024
_BATCH_ROWS = 64


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
        self.where = ", ".join(f"{h}:{config.port}" for h in config.contact_points)
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
            config.contact_points,
            port=config.port,
            execution_profiles={EXEC_PROFILE_DEFAULT: profile},
            auth_provider=auth,
            connect_timeout=config.connect_timeout_seconds,
            control_connection_timeout=config.connect_timeout_seconds,
            protocol_version=config.protocol_version,
        )
        try:
            self.session: Session = self.cluster.connect()
        except (NoHostAvailable, DriverException, OSError) as exc:
            self.cluster.shutdown()
            raise BackendUnavailableError(f"cannot reach Cassandra at {self.where}: {exc}") from exc
        self._tables: dict[str, dict[str, PreparedStatement]] = {}
        self._leases = PendingReleases()
        try:
            self._call(self._claim_keyspace)
            self._prepare_meta()
        except BaseException:
            self.cluster.shutdown()
            raise

    # -- plumbing ---------------------------------------------------------------

    def _call(self, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except KvError:
            raise
        except (NoHostAvailable, DriverException, OSError) as exc:
            raise BackendUnavailableError(f"Cassandra at {self.where} failed a request: {exc}") from exc

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
                }
            except InvalidRequest as exc:
                raise NamespaceNotFoundError(f"namespace {name!r} has no data table ({exc})") from exc
            stmts["put"].consistency_level = self._write_cl
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

    def list_namespaces(self, alias: str | None = None) -> list[NamespaceRecord]:
        rows = self._call(lambda: list(self.session.execute(self._sel_kind, ("ns",))))
        records = [NamespaceRecord.from_json(json.loads(r.body)) for r in rows]
        if alias is not None:
            records = [r for r in records if r.alias == alias]
        return sorted(records, key=lambda r: (r.created, r.name))

    def transition(self, name: str, expected: frozenset[State], record: NamespaceRecord) -> NamespaceRecord:
        def run() -> NamespaceRecord:
            body = self._ns_json(record)
            transition_optimistically(
                name,
                expected,
                record,
                self._raw_ns,
                lambda raw: self._cas([self._guard("ns", name, raw, body, record.state.value)]),
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

    def _batches(self, insert: PreparedStatement, records: Sequence[tuple[bytes, bytes]]) -> list[Any]:
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

    def put(self, name: str, records: Sequence[tuple[bytes, bytes]]) -> None:
        def run() -> None:
            stmts = self._statements(name)
            token = uuid.uuid4().hex
            try:  # released even if entering timed out: the entry may still have happened
                self.session.execute(self._enter, (name, token, int(self.config.write_lease_seconds)))
                rows = list(self.session.execute(self._sel_state, (name,)))
                state = rows[0].state if rows else None
                if state != State.LOADING.value:
                    check_writable(name, NamespaceRecord(name=name, alias="", state=State(state)) if state else None)
                results = execute_concurrent(
                    self.session,
                    [(b, ()) for b in self._batches(stmts["put"], records)],
                    concurrency=self.config.concurrency,
                    raise_on_first_error=True,
                )
                del results
            finally:
                self._leases.release(lambda: self.session.execute(self._leave, (name, token)))

        self._call(run)

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
