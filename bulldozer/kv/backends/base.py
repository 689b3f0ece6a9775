"""The storage-engine ABC behind the KV DAL, and the records engines keep.

An engine stores namespaces (metadata + data), aliases and the alias history. It owns
the atomicity the lifecycle needs:

* ``put`` refuses unless the namespace is LOADING, *atomically with the write* (so a seal
  can never race a late write);
* ``transition`` changes a namespace's state only from an expected state;
* ``flip_alias`` is the compare-and-set: in one atomic step it checks the alias still
  points at ``expected``, points it at the new version, marks the new version ACTIVE and
  the old one RETIRED, and appends the change to the history. Several DAL processes can
  therefore front one store.

Lifecycle *rules* (which transitions are legal, size limits, name checks) live in the
server's servicer, which is the only caller; engines enforce only what must be atomic.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, ClassVar

from bulldozer.kv.digest import Digest

__all__ = [
    "READABLE",
    "AliasChange",
    "AliasRecord",
    "NamespaceRecord",
    "State",
    "StorageEngine",
    "chunked",
    "utcnow",
]


def utcnow() -> datetime:
    return datetime.now(UTC)


def chunked(pairs: Iterable[tuple[bytes, bytes]], size: int) -> Iterator[list[tuple[bytes, bytes]]]:
    """Lists of up to ``size`` pairs (what ``iterate`` yields)."""
    buf: list[tuple[bytes, bytes]] = []
    for pair in pairs:
        buf.append(pair)
        if len(buf) >= size:
            yield buf
            buf = []
    if buf:
        yield buf


class State(enum.StrEnum):
    LOADING = "LOADING"
    #: Frozen (no write lands any more) and being measured by the seal. Nothing reads it or
    #: points an alias at it; a seal interrupted here (a crash) is finished by sealing again.
    SEALING = "SEALING"
    #: Measured, and the measurement matched what the loader expected (``verified``).
    SEALED = "SEALED"
    ACTIVE = "ACTIVE"
    RETIRED = "RETIRED"
    DROPPED = "DROPPED"
    FAILED = "FAILED"


#: States whose data may be read.
READABLE = frozenset({State.SEALED, State.ACTIVE, State.RETIRED})


@dataclass(frozen=True)
class NamespaceRecord:
    name: str
    alias: str
    state: State = State.LOADING
    created: datetime = field(default_factory=utcnow)
    state_changed: datetime = field(default_factory=utcnow)
    sealed: datetime | None = None
    job_name: str = ""
    snapshot_id: int = 0
    value_descriptor_set: bytes = b""
    key_message: str = ""
    value_message: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    record_count: int = 0
    bytes: int = 0
    digest: int = 0
    failure_reason: str = ""
    #: The seal measured ``record_count`` and ``digest`` and they equalled what the loader
    #: expected. Only a verified version may become the target of an alias.
    verified: bool = False

    def with_state(self, state: State, **changes: Any) -> NamespaceRecord:
        return replace(self, state=state, state_changed=utcnow(), **changes)

    def to_json(self) -> dict[str, Any]:
        import base64

        return {
            "name": self.name,
            "alias": self.alias,
            "state": self.state.value,
            "created": self.created.isoformat(),
            "state_changed": self.state_changed.isoformat(),
            "sealed": self.sealed.isoformat() if self.sealed else None,
            "job_name": self.job_name,
            "snapshot_id": self.snapshot_id,
            "value_descriptor_set": base64.b64encode(self.value_descriptor_set).decode(),
            "key_message": self.key_message,
            "value_message": self.value_message,
            "labels": dict(self.labels),
            "record_count": self.record_count,
            "bytes": self.bytes,
            "digest": self.digest,
            "failure_reason": self.failure_reason,
            "verified": self.verified,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NamespaceRecord:
        import base64

        return cls(
            name=data["name"],
            alias=data["alias"],
            state=State(data["state"]),
            created=datetime.fromisoformat(data["created"]),
            state_changed=datetime.fromisoformat(data["state_changed"]),
            sealed=datetime.fromisoformat(data["sealed"]) if data.get("sealed") else None,
            job_name=data.get("job_name", ""),
            snapshot_id=int(data.get("snapshot_id", 0)),
            value_descriptor_set=base64.b64decode(data.get("value_descriptor_set", "")),
            key_message=data.get("key_message", ""),
            value_message=data.get("value_message", ""),
            labels=dict(data.get("labels", {})),
            record_count=int(data.get("record_count", 0)),
            bytes=int(data.get("bytes", 0)),
            digest=int(data.get("digest", 0)),
            failure_reason=data.get("failure_reason", ""),
            verified=bool(data.get("verified", False)),
        )


@dataclass(frozen=True)
class AliasRecord:
    alias: str
    namespace: str
    updated: datetime
    generation: int
    pinned: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "alias": self.alias,
            "namespace": self.namespace,
            "updated": self.updated.isoformat(),
            "generation": self.generation,
            "pinned": self.pinned,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AliasRecord:
        return cls(
            data["alias"],
            data["namespace"],
            datetime.fromisoformat(data["updated"]),
            int(data["generation"]),
            bool(data.get("pinned", False)),
        )


@dataclass(frozen=True)
class AliasChange:
    alias: str
    time: datetime
    principal: str
    reason: str
    from_namespace: str
    to_namespace: str
    generation: int

    def to_json(self) -> dict[str, Any]:
        return {
            "alias": self.alias,
            "time": self.time.isoformat(),
            "principal": self.principal,
            "reason": self.reason,
            "from_namespace": self.from_namespace,
            "to_namespace": self.to_namespace,
            "generation": self.generation,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AliasChange:
        return cls(
            data["alias"],
            datetime.fromisoformat(data["time"]),
            data["principal"],
            data["reason"],
            data["from_namespace"],
            data["to_namespace"],
            int(data["generation"]),
        )


class StorageEngine(ABC):
    """One storage engine. Implementations are thread-safe."""

    #: Registry name.
    name: ClassVar[str]
    #: Largest key the engine can store.
    max_key_bytes: ClassVar[int] = 4096
    #: Largest value the engine can store.
    max_value_bytes: ClassVar[int] = 64 * 1024 * 1024
    #: True when ``scan`` returns keys in byte order; otherwise in another stable order
    #: (hash buckets, tokens) that is still resumable after any key it returned.
    key_ordered_scan: ClassVar[bool] = True

    # -- namespaces -------------------------------------------------------------

    @abstractmethod
    def create_namespace(self, record: NamespaceRecord) -> None:
        """Store a new LOADING namespace. Raises NamespaceExistsError if the name is taken
        (also by a dropped namespace: names are never reused)."""

    @abstractmethod
    def get_namespace(self, name: str) -> NamespaceRecord | None:
        """The namespace's record (DROPPED ones included), or None."""

    @abstractmethod
    def list_namespaces(self, alias: str | None = None) -> list[NamespaceRecord]:
        """Every namespace (of ``alias``), oldest first."""

    @abstractmethod
    def transition(self, name: str, expected: frozenset[State], record: NamespaceRecord) -> NamespaceRecord:
        """Replace the record if the stored state is in ``expected``; else raise
        NamespaceStateError (NamespaceNotFoundError if there is none). Atomic."""

    @abstractmethod
    def drop_data(self, name: str) -> None:
        """Delete the namespace's data (cheaply: a table / sub-database at a time)."""

    # -- data -------------------------------------------------------------------

    @abstractmethod
    def put(self, name: str, records: Sequence[tuple[bytes, bytes]]) -> None:
        """Idempotent puts by key, refused (NamespaceStateError) unless the namespace is
        LOADING at the moment of the write."""

    def put_columns(self, name: str, keys: list[bytes], values: list[bytes]) -> None:
        """The same as ``put`` for records given as two equal-length lists (what a columnar
        batch splits into); engines override it to skip building pairs. A key given twice
        keeps the later value."""
        self.put(name, list(zip(keys, values, strict=True)))

    def put_counted(self, name: str, keys: list[bytes], values: list[bytes], digest: Digest) -> None:
        """``put_columns``, told the batch's digest. An engine that can keep a running
        digest of the namespace in the same atomic write (and knows when a key was written
        twice, which makes a running sum wrong) adds it there, so the seal need not scan
        everything back. The default just puts."""
        self.put_columns(name, keys, values)

    def stored_digest(self, name: str) -> Digest | None:
        """The exact digest of what the namespace stores, when the engine kept one (see
        ``put_counted``); None means unknown, and the DAL measures it by a full scan."""
        return None

    @abstractmethod
    def get_many(self, name: str, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values for ``keys`` (None when absent), all from one consistent view."""

    @abstractmethod
    def scan(self, name: str, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` pairs in the engine's scan order (key order when
        ``key_ordered_scan``), starting after ``after``, a key the scan returned."""

    def iterate(self, name: str, chunk: int = 50_000) -> Iterator[list[tuple[bytes, bytes]]]:
        """Every pair, in chunks (used for the seal digest)."""
        after: bytes | None = None
        while True:
            page = self.scan(name, after, chunk)
            if not page:
                return
            yield page
            after = page[-1][0]

    # -- aliases ----------------------------------------------------------------

    @abstractmethod
    def get_alias(self, alias: str) -> AliasRecord | None: ...

    @abstractmethod
    def list_aliases(self) -> list[AliasRecord]: ...

    @abstractmethod
    def flip_alias(
        self, alias: str, expected: str | None, target: str, principal: str, reason: str, respect_pin: bool = False
    ) -> AliasRecord:
        """The compare-and-set, atomically with the state changes and the history entry.

        Raises AliasConflictError if the alias does not point at ``expected`` (None: not
        set), NamespaceStateError if ``target`` is not SEALED or RETIRED,
        NamespaceNotFoundError if it does not exist, and AliasPinnedError if the alias is
        pinned and ``respect_pin``. The pin survives a flip.
        """

    @abstractmethod
    def set_pin(self, alias: str, pinned: bool, principal: str, reason: str) -> AliasRecord:
        """Pin or unpin the alias where it points, with a history entry (atomic).
        AliasNotFoundError if the alias points nowhere yet."""

    @abstractmethod
    def alias_history(self, alias: str, limit: int = 100) -> list[AliasChange]:
        """Changes to ``alias``, newest first."""

    def auth_required(self) -> bool:
        """True when this store was once served with authentication (see ``require_auth``)."""
        return False

    def require_auth(self) -> None:  # noqa: B027 - optional hook
        """Record in the store that it is served with authentication, so a later server
        without it refuses to start unless told to on purpose. Engines whose store a
        Bulldozer server owns alone (embedded) implement it."""

    def flush(self) -> None:  # noqa: B027 - optional hook
        """Make everything written so far durable."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources. Only once no request thread uses the engine any more."""
