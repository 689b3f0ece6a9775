"""The records of the KV DAL, shared by its engines, server and client: the namespace
lifecycle's states, namespace and alias records, and alias history entries."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from bulldozer.kv.v1 import shared

__all__ = [
    "DROPPING_LABEL",
    "READABLE",
    "AliasChange",
    "AliasRecord",
    "BaseCopy",
    "NamespaceRecord",
    "State",
    "StoreInfo",
    "utcnow",
]


def utcnow() -> datetime:
    return datetime.now(UTC)


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


class BaseCopy(enum.StrEnum):
    """How an engine gives a new version its base's records (a delta version's start)."""

    #: nothing is copied: the version reads through to its base
    LAYERED = "BASE_COPY_LAYERED"
    #: the store copies the base itself, without a round trip per record
    IN_STORE = "BASE_COPY_IN_STORE"
    #: each record is read back and written again: about what loading them costs
    RECORDS = "BASE_COPY_RECORDS"


@dataclass(frozen=True)
class StoreInfo:
    """What the store behind a DAL is and does (``DescribeStore``)."""

    engine: str
    base_copy: BaseCopy
    #: the largest key and value a batch put takes, in bytes (0: the DAL did not say)
    max_key_bytes: int = 0
    max_value_bytes: int = 0


#: States whose data may be read (a rule shared with the Go data plane: proto/bulldozer/kv/v1/shared.yaml).
READABLE = frozenset(State(name) for name in shared.STATES_READABLE)
#: The one state a version takes writes in.
WRITABLE = State(shared.STATES_WRITABLE)
#: Every state but DROPPED: the versions a store still holds (its history of dropped ones
#: grows with every run; what acts on versions lists these).
HELD = frozenset(State) - {State.DROPPED}
#: A DROPPED version's label while its data is still being deleted: a DAL stopped between
#: the two steps leaves it, and dropping the version again (``bulldozer gc`` does) finishes
#: the deletion. Labels named ``kv.*`` are the DAL's own; a client cannot set them.
DROPPING_LABEL = "kv.dropping"


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
    #: 1 for an alias's first schema, one more at each deliberate breaking change
    schema_generation: int = 1
    #: the version this one started as a copy of (a delta version's base), if any
    base: str = ""
    #: the alias's generation at the flip that last made this version ACTIVE or RETIRED (0:
    #: never flipped, or flipped by a release that did not record it): the flips' order,
    #: which no clock moves (``retired_order``)
    alias_generation: int = 0

    @property
    def retired_order(self) -> tuple[int, datetime]:
        """Sorts an alias's RETIRED versions by when they were retired: by the generation of
        the flip that retired them, not by ``state_changed``, which comes from the clock of
        the DAL that flipped (stepped back by NTP or a restored VM, or another host's); by
        time among versions retired before records held the generation."""
        return (self.alias_generation, self.state_changed)

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
            "schema_generation": self.schema_generation,
            "base": self.base,
            "alias_generation": self.alias_generation,
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
            schema_generation=int(data.get("schema_generation", 1)) or 1,
            base=data.get("base", ""),
            alias_generation=int(data.get("alias_generation", 0)),
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
