"""The KV DAL's rules, over any storage engine.

Every request passes through here after the transport layers: names are validated,
sizes checked against the limits, aliases resolved once per request, and each lifecycle
rule enforced (writes only while LOADING, seal = freeze (SEALING) then measure then SEALED
and verified, aliases only onto verified SEALED or RETIRED versions of themselves, ACTIVE
versions cannot be dropped).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bulldozer.codec.descriptors import message_descriptors
from bulldozer.codec.digest import digest_columns, digest_lists
from bulldozer.errors import (
    BulldozerError,
    InvalidArgumentError,
    InvalidNameError,
    NamespaceExistsError,
    NamespaceNotFoundError,
    NamespaceStateError,
    ResourceExhaustedError,
    SchemaMismatchError,
    VerificationError,
)
from bulldozer.kv.backends.base import RecordChanged, StorageEngine
from bulldozer.kv.types import (
    DROPPING_LABEL,
    READABLE,
    AliasChange,
    AliasRecord,
    NamespaceRecord,
    State,
    StoreInfo,
    utcnow,
)
from bulldozer.kv.v1 import shared
from bulldozer.names import (
    NAMESPACE_PATTERN,
    describe_value,
    is_identifier,
    pick_version,
    validate_alias,
    validate_namespace,
)

__all__ = ["KvDal", "Limits"]

_ANY_LIVE = frozenset(State) - {State.DROPPED}
_MAX_LABELS = 64
_MAX_LABEL_NAME = 128
_MAX_MESSAGE_NAME = 512
_MESSAGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
#: What a DROPPED record keeps of its labels (history: the run record, the stage), each at most.
_DROPPED_LABEL_BYTES = 16 * 1024
_DEFAULT_PAGE, _MAX_PAGE = 100, 1000
#: locks striping the namespaces' records (``KvDal._changing``)
_RECORD_LOCKS = 64
#: label writes tried while other DALs change the record in between (``KvDal.set_labels``)
_RECORD_RETRIES = 100


@dataclass(frozen=True)
class Limits:
    """Request limits of one DAL (the engine may lower the key limit)."""

    # the defaults are rules shared with the Go data plane (proto/bulldozer/kv/v1/shared.yaml)
    max_key_bytes: int = shared.LIMITS_MAX_KEY_BYTES
    max_value_bytes: int = shared.LIMITS_MAX_VALUE_BYTES
    max_batch_records: int = shared.LIMITS_MAX_BATCH_RECORDS
    max_message_bytes: int = shared.LIMITS_MAX_MESSAGE_BYTES
    max_batch_get_keys: int = shared.LIMITS_MAX_BATCH_GET_KEYS
    #: write calls (PutBatch, PutStream) taken at once; one more is refused as busy
    #: (``DalBusyError``) and the client's batch writer sends it again after a pause
    max_writes_in_flight: int = shared.LIMITS_MAX_WRITES_IN_FLIGHT
    max_scan_page: int = shared.LIMITS_MAX_SCAN_PAGE
    #: Stored metadata of one namespace, each bounded so that any record fits a response and
    #: a page of ListNamespaces always holds at least one (both are at most a quarter of
    #: ``max_message_bytes``): the schema's descriptor set, and all labels together.
    max_descriptor_bytes: int = 4 * 1024 * 1024
    max_labels_bytes: int = 4 * 1024 * 1024


class KvDal:
    """The DAL over one engine. Thread-safe when the engine is."""

    def __init__(self, engine: StorageEngine, limits: Limits | None = None) -> None:
        self.engine = engine
        base = limits or Limits()
        quarter = base.max_message_bytes // 4
        self.limits = replace(
            base,
            max_key_bytes=min(base.max_key_bytes, engine.max_key_bytes),
            max_value_bytes=min(base.max_value_bytes, engine.max_value_bytes),
            max_descriptor_bytes=min(base.max_descriptor_bytes, quarter),
            max_labels_bytes=min(base.max_labels_bytes, quarter),
        )
        self._record_locks = [threading.Lock() for _ in range(_RECORD_LOCKS)]

    @contextlib.contextmanager
    def _changing(self, name: str) -> Iterator[None]:
        """Held while a namespace's record is read, changed and written back (``_change``):
        two label writes of one LOADING version at once (a run's split ledger and its
        heartbeat) would otherwise each write back what it read, and the second lose the
        first's labels. One DAL's requests are serialized here; the store checks that the
        record is still the one read, as another DAL may share it."""
        with self._record_locks[hash(name) % _RECORD_LOCKS]:
            yield

    def _change(
        self, name: str, allowed: frozenset[State], change: Callable[[NamespaceRecord], NamespaceRecord | None]
    ) -> NamespaceRecord:
        """Every change of a namespace's record (its state, its labels, its measurement) as one
        compare-and-set: the record is read, ``change``d, and written back iff its state is
        one ``allowed`` and the store still holds the record read (``based_on``); when another
        DAL changed it in between, it is read and changed again, so what that DAL wrote
        stays. ``change`` returns the record to write, or None when there is nothing to write
        (the record read is the answer), and raises when the change is refused."""
        with self._changing(name):
            for _ in range(_RECORD_RETRIES):
                record = self.describe(name)
                changed = change(record)
                if changed is None:
                    return record
                try:
                    return self.engine.transition(name, allowed, changed, based_on=record)
                except RecordChanged:
                    continue
        raise NamespaceStateError(
            f"namespace {name!r} changed under each of {_RECORD_RETRIES} writes in a row; try again"
        )

    # -- namespaces -------------------------------------------------------------

    def create_namespace(
        self,
        name: str,
        alias: str,
        job_name: str = "",
        snapshot_id: int = 0,
        value_descriptor_set: bytes = b"",
        key_message: str = "",
        value_message: str = "",
        labels: dict[str, str] | None = None,
        schema_generation: int = 1,
        base: str = "",
    ) -> NamespaceRecord:
        validate_namespace(name)
        validate_alias(alias)
        if not name.startswith(alias + "__"):
            raise InvalidNameError(f"namespace {name!r} must start with its alias {alias!r} followed by '__'")
        if job_name:
            validate_alias(job_name, "job name")
        if len(value_descriptor_set) > self.limits.max_descriptor_bytes:
            raise ResourceExhaustedError(
                f"the value descriptor set is {len(value_descriptor_set)} bytes; the limit is "
                f"{self.limits.max_descriptor_bytes}"
            )
        for what, message in (("key message", key_message), ("value message", value_message)):
            if message and (len(message) > _MAX_MESSAGE_NAME or not _MESSAGE_NAME.fullmatch(message)):
                raise InvalidArgumentError(f"{what} {describe_value(message)} is not a protobuf message name")
        if value_descriptor_set or key_message or value_message:
            # what every reader of the version loads (``get``, ``scan``, the console, the next
            # run's schema check): one that does not load made each of them fail
            try:
                message_descriptors(value_descriptor_set, *(m for m in (key_message, value_message) if m))
            except ValueError as exc:
                raise InvalidArgumentError(f"the version's value descriptor set cannot be read: {exc}") from None
        self._check_given_labels(labels or {})
        self._check_labels(labels or {})
        if base:
            self._check_base(base, alias)
        now = utcnow()
        record = NamespaceRecord(
            name=name,
            alias=alias,
            created=now,
            state_changed=now,
            job_name=job_name,
            snapshot_id=snapshot_id,
            value_descriptor_set=value_descriptor_set,
            key_message=key_message,
            value_message=value_message,
            labels=dict(labels or {}),
            schema_generation=max(1, schema_generation),
            base=base,
        )
        try:
            self.engine.create_namespace(record)
        except NamespaceExistsError:
            self._refused_again(record)
            raise
        except Exception as exc:
            # an engine that stores the record before the version's storage (Cassandra: its
            # table, a schema change a node with a full disk cannot flush) leaves it FAILED
            # with the reason, not an empty LOADING version nobody is loading
            self._failed_to_make(name, "making its storage", exc)
            raise
        if base:
            try:
                self.engine.copy_records(base, name)
            except Exception as exc:
                self._failed_to_make(name, f"copying the base {base}", exc)
                raise
        return record

    def _refused_again(self, record: NamespaceRecord) -> None:
        """A create refused because the name is taken: when it is this very request, made by an
        earlier attempt whose storage failed (a client retries a create the store answered
        UNAVAILABLE), say why that attempt failed rather than that the name is taken."""
        existing = None
        with contextlib.suppress(BulldozerError):
            existing = self.engine.get_namespace(record.name)
        if existing is None or existing.state != State.FAILED:
            return
        made = replace(existing, state=record.state, failure_reason="", created=record.created)
        if replace(made, state_changed=record.state_changed) == record:  # the same request: its failure
            raise NamespaceStateError(f"namespace {record.name!r} could not be created: {existing.failure_reason}")

    def _failed_to_make(self, name: str, step: str, exc: Exception) -> None:
        """Mark the namespace being created FAILED because ``step`` failed, when it was stored
        and the store still takes the change (a store that refused the step may refuse it too)."""
        reason = str(exc) if isinstance(exc, BulldozerError) else f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(BulldozerError):
            if self.engine.get_namespace(name) is not None:
                self.mark_failed(name, f"{step} failed: {reason}")

    def _check_base(self, base: str, alias: str) -> None:
        """A base must be a verified, readable version of the same alias."""
        record = self.describe(base)
        if record.alias != alias:
            raise InvalidArgumentError(f"the base {base!r} is a version of {record.alias!r}, not {alias!r}")
        if record.state not in READABLE or not record.verified:
            raise NamespaceStateError(
                f"the base {base!r} is {record.state.value}{'' if record.verified else ' and not verified'}; "
                "a version starts from a verified SEALED, ACTIVE or RETIRED one"
            )

    def store_info(self) -> StoreInfo:
        """The engine behind this DAL, how it copies a base (a caller choosing between a delta
        and a full version weighs it) and the largest record it takes (a writer checks)."""
        return StoreInfo(
            self.engine.name, self.engine.base_copy, self.limits.max_key_bytes, self.limits.max_value_bytes
        )

    def describe(self, name: str) -> NamespaceRecord:
        validate_namespace(name)
        record = self.engine.get_namespace(name)
        if record is None:
            raise NamespaceNotFoundError(f"namespace {name!r} does not exist")
        return record

    def list_namespaces(
        self, alias: str | None = None, states: frozenset[State] | None = None
    ) -> list[NamespaceRecord]:
        if alias:
            validate_alias(alias)
        return self.engine.list_namespaces(alias or None, states or None)

    def list_namespaces_page(
        self, alias: str | None, page_size: int = 0, page_token: str = "", states: frozenset[State] | None = None
    ) -> tuple[list[NamespaceRecord], str]:
        """Up to ``page_size`` namespaces (default 100, at most 1000) after ``page_token``,
        oldest first, and the token of the next page ("" after the last); with ``states``,
        only those in one of them."""
        size = min(page_size or _DEFAULT_PAGE, _MAX_PAGE)
        records = self.list_namespaces(alias, states)
        if page_token:
            after = self._page_key(page_token)
            records = [r for r in records if (r.created, r.name) > after]
        page = records[:size]
        return page, (self.page_token(page[-1]) if len(records) > size else "")

    @staticmethod
    def page_token(record: NamespaceRecord) -> str:
        """The token of the page that follows ``record``."""
        return f"{record.created.isoformat()}|{record.name}"

    @staticmethod
    def _page_key(token: str) -> tuple[Any, str]:
        from datetime import datetime

        created, sep, name = token.partition("|")
        try:
            if not sep:
                raise ValueError(token)
            return datetime.fromisoformat(created), validate_namespace(name)
        except (ValueError, InvalidNameError):
            raise InvalidArgumentError("the page token is not one this server gave out") from None

    def seal(self, name: str, expected_records: int | None, expected_digest: int | None) -> NamespaceRecord:
        """Freeze the namespace (SEALING: no write lands after this, nothing reads it or
        points at it), measure what it stores, and only then record it SEALED with the
        measurement and ``verified`` — or FAILED when the measurement differs from the
        expectation. A crash leaves it LOADING or SEALING, never SEALED unmeasured; sealing
        a SEALING namespace again finishes the interrupted seal. Sealing a SEALED one with
        the expectation it was verified against returns it unchanged (a retried seal)."""
        if expected_records is None or expected_digest is None:
            raise InvalidArgumentError(
                "a seal needs the expected record count and digest: a version becomes SEALED only when what "
                "it stores was measured and matched what its loader sent"
            )

        def begin(record: NamespaceRecord) -> NamespaceRecord | None:
            """The namespace frozen for its seal (SEALING); nothing to write when SEALING
            already, or SEALED by a seal of the same expectation."""
            if record.state == State.SEALED and record.verified:
                if (record.record_count, record.digest) == (expected_records, expected_digest):
                    return None
                raise VerificationError(
                    f"namespace {name!r} is already SEALED with {record.record_count} records and digest "
                    f"{record.digest:#018x}, not the {expected_records} records and digest "
                    f"{expected_digest:#018x} expected"
                )
            if record.state not in (State.LOADING, State.SEALING):
                raise NamespaceStateError(
                    f"namespace {name!r} is {record.state.value}; only a LOADING namespace (or one whose seal was "
                    "interrupted, SEALING) can be sealed"
                )
            return record.with_state(State.SEALING) if record.state == State.LOADING else None

        record = self._change(name, frozenset({State.LOADING}), begin)
        if record.state == State.SEALED:
            return record  # a retried seal
        self.engine.ingest(name)  # whatever is still staged becomes part of what is measured
        digest = self.engine.stored_digest(name) or self.engine.measure(name)
        problems = []
        if expected_records != digest.count:
            problems.append(f"{digest.count} records stored, {expected_records} expected")
        if expected_digest != digest.value:
            problems.append(f"digest {digest.value:#018x} stored, {expected_digest:#018x} expected")
        reason = "verification failed at seal: " + "; ".join(problems)

        def measured(record: NamespaceRecord) -> NamespaceRecord:
            """The record as measured (the labels written while it was measured stay)."""
            done = replace(record, record_count=digest.count, bytes=digest.bytes, digest=digest.value)
            if problems:
                return done.with_state(State.FAILED, failure_reason=reason)
            return done.with_state(State.SEALED, sealed=utcnow(), verified=True)

        sealed = self._change(name, frozenset({State.SEALING}), measured)
        if problems:
            raise VerificationError(f"namespace {name!r}: {reason}")
        return sealed

    def ingest(self, name: str) -> tuple[int, int]:
        """Make what the namespace's writes staged part of its data (``StorageEngine.ingest``):
        while it is LOADING, or SEALING (a seal ingests too); a no-op for a sealed version,
        so a retried call after the seal succeeds. Returns (runs, records) merged."""
        record = self.describe(name)
        if record.state in (State.LOADING, State.SEALING):
            return self.engine.ingest(name)
        if record.state in (State.SEALED, State.ACTIVE, State.RETIRED):
            return 0, 0
        raise NamespaceStateError(
            f"namespace {name!r} is {record.state.value}; only a LOADING or SEALING version has writes to ingest"
        )

    def mark_failed(self, name: str, reason: str) -> NamespaceRecord:
        allowed = frozenset({State.LOADING, State.SEALING, State.SEALED})

        def failed(record: NamespaceRecord) -> NamespaceRecord | None:
            if record.state == State.FAILED:
                return None
            if record.state not in allowed:
                raise NamespaceStateError(
                    f"namespace {name!r} is {record.state.value}; only LOADING, SEALING or SEALED versions can be "
                    "marked FAILED"
                )
            return record.with_state(State.FAILED, failure_reason=reason[:2000])

        return self._change(name, allowed, failed)

    def drop(self, name: str) -> NamespaceRecord:
        """Mark the namespace DROPPED (``DROPPING_LABEL`` on), delete its data, then take the
        label off. Dropping a DROPPED namespace that still has the label finishes the
        deletion a stopped DAL left half done (its data would otherwise stay for ever)."""

        def dropping(record: NamespaceRecord) -> NamespaceRecord | None:
            if record.state == State.DROPPED:
                return None  # dropped already: finished, or its data still to delete
            if record.state == State.ACTIVE:
                raise NamespaceStateError(
                    f"namespace {name!r} is ACTIVE (alias {record.alias!r} points at it); "
                    "point the alias elsewhere before dropping it"
                )
            # what history needs stays (names, states, times, counts, digest, the run's small
            # labels); the schema and large labels go with the data
            kept = {k: v for k, v in record.labels.items() if len(k) + len(v) <= _DROPPED_LABEL_BYTES}
            return record.with_state(State.DROPPED, value_descriptor_set=b"", labels={**kept, DROPPING_LABEL: "1"})

        def dropped(record: NamespaceRecord) -> NamespaceRecord | None:
            if DROPPING_LABEL not in record.labels:
                return None  # another DAL on the store finished it first
            return replace(record, labels={k: v for k, v in record.labels.items() if k != DROPPING_LABEL})

        record = self._change(name, _ANY_LIVE - {State.ACTIVE}, dropping)
        if DROPPING_LABEL not in record.labels:
            return record
        self.engine.drop_data(name)
        return self._change(name, frozenset({State.DROPPED}), dropped)

    def set_labels(self, name: str, labels: dict[str, str]) -> NamespaceRecord:
        """Merge ``labels`` into the namespace's (an empty value removes one): read, merged
        and written back as one change, here (``_changing``) and on the store, where another
        DAL may write the same record (``based_on``: read again and merged again then)."""
        self._check_given_labels(labels)

        def merged(record: NamespaceRecord) -> NamespaceRecord:
            if record.state == State.DROPPED:
                raise NamespaceNotFoundError(f"namespace {name!r} was dropped")
            merged = {**record.labels, **labels}
            merged = {k: v for k, v in merged.items() if v != ""}
            self._check_labels(merged)
            return replace(record, labels=merged)

        return self._change(name, _ANY_LIVE, merged)

    # -- data -------------------------------------------------------------------

    def put(self, name: str, records: Sequence[tuple[bytes, bytes]]) -> tuple[int, int]:
        validate_namespace(name)
        if len(records) > self.limits.max_batch_records:
            raise ResourceExhaustedError(
                f"a batch holds {len(records)} records; the limit is {self.limits.max_batch_records}"
            )
        total = 0
        max_key, max_value = self.limits.max_key_bytes, self.limits.max_value_bytes
        for key, value in records:
            if not key:
                raise InvalidArgumentError("an empty key is not allowed")
            if len(key) > max_key:
                raise ResourceExhaustedError(f"a key of {len(key)} bytes is over the limit of {max_key}")
            if len(value) > max_value:
                raise ResourceExhaustedError(f"a value of {len(value)} bytes is over the limit of {max_value}")
            total += len(key) + len(value)
        if records:
            keys = [k for k, _ in records]
            values = [v for _, v in records]
            self.engine.write_batch(name, keys, values, digest_lists(keys, values))
        return len(records), total

    def put_columnar(
        self,
        name: str,
        keys: bytes,
        key_lengths: Sequence[int],
        values: bytes,
        value_lengths: Sequence[int],
    ) -> tuple[int, int]:
        """A batch in columnar form: the limits are checked on the length arrays at once."""
        import numpy as np

        validate_namespace(name)
        klen = np.asarray(key_lengths, dtype=np.int64)
        vlen = np.asarray(value_lengths, dtype=np.int64)
        if len(klen) != len(vlen):
            raise InvalidArgumentError("columnar batch: key and value counts differ")
        if int(klen.sum()) != len(keys) or int(vlen.sum()) != len(values):
            raise InvalidArgumentError("columnar batch: lengths do not add up to the data")
        n = len(klen)
        if n > self.limits.max_batch_records:
            raise ResourceExhaustedError(f"a batch holds {n} records; the limit is {self.limits.max_batch_records}")
        if n == 0:
            return 0, 0
        if int(klen.min()) == 0:
            raise InvalidArgumentError("an empty key is not allowed")
        if int(klen.min()) < 0 or int(vlen.min()) < 0:
            raise InvalidArgumentError("columnar batch: a length is negative")
        if int(klen.max()) > self.limits.max_key_bytes:
            raise ResourceExhaustedError(
                f"a key of {int(klen.max())} bytes is over the limit of {self.limits.max_key_bytes}"
            )
        if int(vlen.max()) > self.limits.max_value_bytes:
            raise ResourceExhaustedError(
                f"a value of {int(vlen.max())} bytes is over the limit of {self.limits.max_value_bytes}"
            )
        digest = digest_columns(keys, klen, values, vlen)
        self.engine.write_batch(name, _split(keys, klen), _split(values, vlen), digest)
        return n, len(keys) + len(values)

    def resolve(self, namespace: str = "", alias: str = "", schema_generation: int = 0) -> str:
        """The namespace a read addresses: a namespace, an alias, or ``alias@namespace``;
        with ``schema_generation``, refused (SchemaMismatchError) for a version of another."""
        name = self._resolve(namespace, alias)
        if schema_generation:
            record = self.engine.get_namespace(name)
            if record is not None and record.schema_generation != schema_generation:
                raise SchemaMismatchError(
                    f"{name} has schema generation {record.schema_generation} (a deliberate breaking change of "
                    f"{record.alias}); this reader was built for generation {schema_generation} and would misread "
                    "it: regenerate it (bulldozer client)"
                )
        return name

    def _resolve(self, namespace: str, alias: str) -> str:
        if namespace and alias:
            raise InvalidArgumentError("name a namespace or an alias, not both")
        if namespace:
            return validate_namespace(namespace)
        if not alias:
            raise InvalidArgumentError("a read must name a namespace or an alias")
        alias_name, _, pinned = alias.partition("@")
        validate_alias(alias_name)
        if pinned:
            record = self.engine.get_namespace(pinned) if is_identifier(pinned, NAMESPACE_PATTERN) else None
            if record is not None and record.alias == alias_name:
                return pinned
            # a short id: the unique suffix of one of the alias's versions
            return pick_version(
                pinned, [n.name for n in self.engine.list_namespaces(alias_name)], f"alias {alias_name!r}"
            )
        current = self.engine.get_alias(alias_name)
        if current is None:
            from bulldozer.errors import AliasNotFoundError

            raise AliasNotFoundError(f"alias {alias_name!r} does not point at any version yet")
        return current.namespace

    def _check_keys(self, keys: Sequence[bytes]) -> None:
        if len(keys) > self.limits.max_batch_get_keys:
            raise ResourceExhaustedError(
                f"a batch get asks for {len(keys)} keys; the limit is {self.limits.max_batch_get_keys}"
            )
        for key in keys:
            if not key:
                raise InvalidArgumentError("an empty key is not allowed")
            if len(key) > self.limits.max_key_bytes:
                raise InvalidArgumentError(
                    f"a key of {len(key)} bytes is over the limit of {self.limits.max_key_bytes}"
                )

    def batch_get(
        self, keys: Sequence[bytes], namespace: str = "", alias: str = "", schema_generation: int = 0
    ) -> tuple[str, list[bytes | None]]:
        self._check_keys(keys)
        name = self.resolve(namespace, alias, schema_generation)
        return name, self.engine.get_many(name, keys)

    def scan(
        self,
        namespace: str = "",
        alias: str = "",
        after: bytes | None = None,
        limit: int = 1000,
        schema_generation: int = 0,
    ) -> tuple[str, list[tuple[bytes, bytes]]]:
        name = self._readable(namespace, alias, schema_generation)
        return name, self.engine.scan(name, after, min(max(limit, 1), self.limits.max_scan_page))

    def _readable(self, namespace: str, alias: str, schema_generation: int) -> str:
        """The namespace a read addresses (``resolve``), refused unless it is readable."""
        name = self.resolve(namespace, alias, schema_generation)
        record = self.describe(name)
        if record.state not in READABLE:
            raise NamespaceStateError(
                f"namespace {name!r} is {record.state.value}; reads are served from SEALED, ACTIVE and RETIRED versions"
            )
        return name

    def delete(self, namespace: str, keys: Sequence[bytes]) -> int:
        """Delete keys from a LOADING namespace (``StorageEngine.delete_batch``)."""
        validate_namespace(namespace)
        if len(keys) > self.limits.max_batch_get_keys:
            raise ResourceExhaustedError(
                f"a delete names {len(keys):,} keys; the limit is {self.limits.max_batch_get_keys:,}"
            )
        self._check_keys(keys)
        return self.engine.delete_batch(namespace, keys)

    def sample(
        self, count: int, seed: int, namespace: str = "", alias: str = "", schema_generation: int = 0
    ) -> tuple[str, list[tuple[bytes, bytes]], int]:
        """A seeded sample of a readable version's pairs (``StorageEngine.sample``)."""
        if not 1 <= count <= self.limits.max_batch_get_keys:
            raise InvalidArgumentError(f"a sample holds 1 to {self.limits.max_batch_get_keys:,} records, not {count:,}")
        name = self._readable(namespace, alias, schema_generation)
        records, scanned = self.engine.sample(name, count, seed)
        return name, records, scanned

    # -- aliases ----------------------------------------------------------------

    def get_alias(self, alias: str) -> AliasRecord:
        validate_alias(alias)
        record = self.engine.get_alias(alias)
        if record is None:
            from bulldozer.errors import AliasNotFoundError

            raise AliasNotFoundError(f"alias {alias!r} does not point at any version yet")
        return record

    def list_aliases(self) -> list[AliasRecord]:
        return self.engine.list_aliases()

    def compare_and_set_alias(
        self, alias: str, expected: str, target: str, principal: str, reason: str, respect_pin: bool = False
    ) -> AliasRecord:
        validate_alias(alias)
        validate_namespace(target)
        if expected:
            validate_namespace(expected, "expected namespace")
        if len(reason) > 2000:
            raise InvalidArgumentError("the reason is longer than 2000 characters")
        return self.engine.flip_alias(alias, expected or None, target, principal, reason, respect_pin)

    def set_pin(self, alias: str, pinned: bool, principal: str, reason: str) -> AliasRecord:
        validate_alias(alias)
        if len(reason) > 2000:
            raise InvalidArgumentError("the reason is longer than 2000 characters")
        return self.engine.set_pin(alias, pinned, principal, reason)

    def alias_history(self, alias: str, limit: int = 100) -> list[AliasChange]:
        validate_alias(alias)
        return self.engine.alias_history(alias, max(1, min(limit or 100, 10_000)))

    @staticmethod
    def _check_given_labels(labels: dict[str, str]) -> None:
        """Labels a client gives: not the DAL's own (``kv.*``, e.g. ``DROPPING_LABEL``)."""
        for key in labels:
            if key.startswith("kv."):
                raise InvalidArgumentError(f"label name {describe_value(key)} is reserved: kv.* labels are the DAL's")

    def _check_labels(self, labels: dict[str, str]) -> None:
        if len(labels) > _MAX_LABELS:
            raise InvalidArgumentError(f"at most {_MAX_LABELS} labels")
        total = 0
        for key, value in labels.items():
            if (
                not key
                or len(key) > _MAX_LABEL_NAME
                or not key.replace(".", "").replace("-", "").replace("_", "").isalnum()
            ):
                raise InvalidArgumentError(f"label name {describe_value(key)} is not valid")
            total += len(key.encode()) + len(value.encode())
        if total > self.limits.max_labels_bytes:
            raise ResourceExhaustedError(
                f"the labels would hold {total} bytes; the limit for one namespace is {self.limits.max_labels_bytes}"
            )


def _split(blob: bytes, lengths: Any) -> list[bytes]:
    """Cut ``blob`` into items of ``lengths`` bytes, in C (Arrow), not a Python slice per item."""
    import numpy as np
    import pyarrow as pa

    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    array = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(blob)]
    )
    items: list[bytes] = array.to_pylist()
    return items
