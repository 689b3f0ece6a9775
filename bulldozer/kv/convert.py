"""Records ↔ API messages."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from google.protobuf.timestamp_pb2 import Timestamp

from bulldozer.errors import InvalidArgumentError
from bulldozer.kv.types import AliasChange, AliasRecord, BaseCopy, NamespaceRecord, State, StoreInfo
from bulldozer.kv.v1 import kv_pb2, shared

__all__ = [
    "ERROR_DOMAIN",
    "PRINCIPAL_KEY",
    "alias_change",
    "alias_info",
    "namespace_info",
    "state_name",
    "state_numbers",
    "states_of",
    "timestamp",
]

#: The domain of the ``google.rpc.ErrorInfo`` a failed call carries in its standard status
#: details (``grpc-status-details-bin``); its ``reason`` names the exception class the
#: server raised, so the client raises the very same one (a rule the Go data plane shares).
ERROR_DOMAIN = shared.ERRORS_DOMAIN
#: Metadata a client may send to name who acts (kept in the alias history when no
#: authentication overrides it).
PRINCIPAL_KEY = "bulldozer-principal"


def columnar(pairs: Sequence[tuple[bytes, bytes]]) -> kv_pb2.ColumnarRecords:
    """Pairs laid out column-wise (a columnar scan page)."""
    return kv_pb2.ColumnarRecords(
        keys=b"".join(k for k, _ in pairs),
        key_lengths=[len(k) for k, _ in pairs],
        values=b"".join(v for _, v in pairs),
        value_lengths=[len(v) for _, v in pairs],
    )


def timestamp(when: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(when)
    return ts


def namespace_info(r: NamespaceRecord) -> kv_pb2.NamespaceInfo:
    info = kv_pb2.NamespaceInfo(
        name=r.name,
        state=kv_pb2.NamespaceState.Value(r.state.value),
        alias=r.alias,
        record_count=r.record_count,
        bytes=r.bytes,
        digest=r.digest,
        job_name=r.job_name,
        snapshot_id=r.snapshot_id,
        value_descriptor_set=r.value_descriptor_set,
        key_message=r.key_message,
        value_message=r.value_message,
        labels=r.labels,
        failure_reason=r.failure_reason,
        verified=r.verified,
        schema_generation=r.schema_generation,
        base=r.base,
        alias_generation=r.alias_generation,
    )
    info.created.CopyFrom(timestamp(r.created))
    info.state_changed.CopyFrom(timestamp(r.state_changed))
    if r.sealed is not None:
        info.sealed.CopyFrom(timestamp(r.sealed))
    return info


def store_info(info: StoreInfo) -> kv_pb2.StoreInfo:
    return kv_pb2.StoreInfo(
        engine=info.engine,
        base_copy=kv_pb2.BaseCopy.Value(info.base_copy.value),
        max_key_bytes=info.max_key_bytes,
        max_value_bytes=info.max_value_bytes,
    )


def store_info_from(info: kv_pb2.StoreInfo) -> StoreInfo | None:
    """A ``StoreInfo``; None when the DAL names no base copy this client knows (none, or a
    kind newer than this client): the caller then cannot weigh it."""
    try:
        return StoreInfo(
            info.engine, BaseCopy(kv_pb2.BaseCopy.Name(info.base_copy)), info.max_key_bytes, info.max_value_bytes
        )
    except ValueError:
        return None


def state_name(state: int) -> str:
    return kv_pb2.NamespaceState.Name(state)  # type: ignore[arg-type]


def states_of(states: Iterable[int]) -> frozenset[State] | None:
    """A request's namespace states (None when it names none: any state). A state this
    server does not know is refused."""
    chosen: set[State] = set()
    unknown: set[int] = set()
    for number in states:
        try:
            chosen.add(State(state_name(number)))
        except ValueError:
            unknown.add(number)
    if unknown:  # named once each, five at most: a request may repeat one thousands of times
        shown = sorted(unknown)
        raise InvalidArgumentError(
            f"unknown namespace state{'s' if len(shown) > 1 else ''} {', '.join(map(str, shown[:5]))}"
            + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")
        )
    return frozenset(chosen) or None


def state_numbers(states: Iterable[State]) -> list[kv_pb2.NamespaceState.ValueType]:
    """``states`` as the request's enum numbers."""
    return [kv_pb2.NamespaceState.Value(s.value) for s in states]


def record_from_info(info: kv_pb2.NamespaceInfo) -> NamespaceRecord:
    from datetime import UTC

    def dt(ts: Timestamp) -> datetime:
        return ts.ToDatetime(tzinfo=UTC)

    return NamespaceRecord(
        name=info.name,
        alias=info.alias,
        state=State(state_name(info.state)),
        created=dt(info.created),
        state_changed=dt(info.state_changed),
        sealed=dt(info.sealed) if info.HasField("sealed") else None,
        job_name=info.job_name,
        snapshot_id=info.snapshot_id,
        value_descriptor_set=info.value_descriptor_set,
        key_message=info.key_message,
        value_message=info.value_message,
        labels=dict(info.labels),
        record_count=info.record_count,
        bytes=info.bytes,
        digest=info.digest,
        failure_reason=info.failure_reason,
        verified=info.verified,
        schema_generation=info.schema_generation or 1,
        base=info.base,
        alias_generation=info.alias_generation,
    )


def alias_info(r: AliasRecord) -> kv_pb2.AliasInfo:
    info = kv_pb2.AliasInfo(alias=r.alias, namespace=r.namespace, generation=r.generation, pinned=r.pinned)
    info.updated.CopyFrom(timestamp(r.updated))
    return info


def alias_change(c: AliasChange) -> kv_pb2.AliasChange:
    msg = kv_pb2.AliasChange(
        principal=c.principal,
        reason=c.reason,
        from_namespace=c.from_namespace,
        to_namespace=c.to_namespace,
        generation=c.generation,
    )
    msg.time.CopyFrom(timestamp(c.time))
    return msg
