"""The checks and record changes of the lifecycle, shared by every engine: run inside one
transaction (memory, embedded) or as an optimistic compare-and-set (redis, cassandra)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

from bulldozer.errors import (
    AliasConflictError,
    AliasNotFoundError,
    AliasPinnedError,
    NamespaceNotFoundError,
    NamespaceStateError,
)
from bulldozer.kv.backends.base import RecordChanged
from bulldozer.kv.types import AliasChange, AliasRecord, NamespaceRecord, State, utcnow

FLIPPABLE = frozenset({State.SEALED, State.RETIRED})


def plan_flip(
    alias: str,
    current: AliasRecord | None,
    expected: str | None,
    target: NamespaceRecord | None,
    target_name: str,
    previous: NamespaceRecord | None,
    principal: str,
    reason: str,
    respect_pin: bool = False,
) -> tuple[AliasRecord, list[NamespaceRecord], AliasChange | None]:
    """What a flip writes: the new alias record, the changed namespaces, the history entry
    (None when the alias already points at the target: a retried flip is a no-op)."""
    actual = current.namespace if current else None
    if current is not None and actual == target_name:
        return current, [], None  # already there: a retried flip changes nothing
    if current is not None and current.pinned and respect_pin:
        raise AliasPinnedError(f"alias {alias!r} is pinned at {actual}: only a rollback moves it until it is unpinned")
    if (expected or None) != actual:
        raise AliasConflictError(
            f"alias {alias!r} points at {actual or 'nothing'}, not {expected or 'nothing'}; "
            "another run or an operator moved it first — look again and retry"
        )
    if target is None or target.state == State.DROPPED:
        raise NamespaceNotFoundError(f"namespace {target_name!r} does not exist")
    if target.alias != alias:
        raise NamespaceStateError(f"namespace {target_name!r} belongs to alias {target.alias!r}, not {alias!r}")
    if target.state not in FLIPPABLE:
        raise NamespaceStateError(
            f"namespace {target_name!r} is {target.state.value}; an alias may only point at a "
            "SEALED (or previously active, RETIRED) version"
        )
    if not target.verified:
        raise NamespaceStateError(
            f"namespace {target_name!r} has no recorded verification (its seal did not measure a count and digest "
            "that matched what its loader sent); an alias may only point at a verified version — reload it"
        )
    now = utcnow()
    generation = (current.generation if current else 0) + 1
    changed = [replace(target, state=State.ACTIVE, state_changed=now, alias_generation=generation)]
    if previous is not None and previous.name != target_name and previous.state == State.ACTIVE:
        changed.append(replace(previous, state=State.RETIRED, state_changed=now, alias_generation=generation))
    record = AliasRecord(alias, target_name, now, generation, current.pinned if current else False)
    change = AliasChange(alias, now, principal, reason, actual or "", target_name, generation)
    return record, changed, change


def plan_pin(
    alias: str, current: AliasRecord | None, pinned: bool, principal: str, reason: str
) -> tuple[AliasRecord, AliasChange | None]:
    """What pinning writes (no history entry when nothing changes)."""
    if current is None:
        raise AliasNotFoundError(f"alias {alias!r} does not point at any version yet; there is nothing to pin")
    if current.pinned == pinned:
        return current, None
    now = utcnow()
    generation = current.generation + 1
    record = replace(current, pinned=pinned, updated=now, generation=generation)
    verb = "pinned" if pinned else "unpinned"
    note = f"{verb}: {reason}" if reason else verb
    return record, AliasChange(alias, now, principal, note, current.namespace, current.namespace, generation)


def check_transition(
    name: str, record: NamespaceRecord | None, expected: frozenset[State], based_on: NamespaceRecord | None = None
) -> NamespaceRecord:
    """The stored ``record`` may be replaced: it exists, its state is in ``expected`` and,
    with ``based_on``, it is still that record (``StorageEngine.transition``)."""
    if record is None:
        raise NamespaceNotFoundError(f"namespace {name!r} does not exist")
    if record.state not in expected:
        wanted = " or ".join(sorted(s.value for s in expected))
        raise NamespaceStateError(f"namespace {name!r} is {record.state.value}, not {wanted}")
    if based_on is not None and record != based_on:
        raise RecordChanged(name)
    return record


def check_writable(name: str, record: NamespaceRecord | None) -> None:
    if record is None or record.state == State.DROPPED:
        raise NamespaceNotFoundError(f"namespace {name!r} does not exist")
    if record.state != State.LOADING:
        raise NamespaceStateError(f"namespace {name!r} is {record.state.value}; writes are only accepted while LOADING")


def check_readable(name: str, record: NamespaceRecord | None) -> None:
    from bulldozer.kv.types import READABLE

    if record is None or record.state == State.DROPPED:
        raise NamespaceNotFoundError(f"namespace {name!r} does not exist")
    if record.state not in READABLE:
        raise NamespaceStateError(
            f"namespace {name!r} is {record.state.value}; reads are served from SEALED, ACTIVE and RETIRED versions"
        )


# -- optimistic compare-and-set, for engines whose atomic primitive is "write these
# -- rows iff they still hold what was read" (a Redis script, a Cassandra LWT batch)

#: apply(raw alias record read, {namespace: raw record read}, new alias, changed namespaces, history entry)
ApplyFlip = Callable[[str | None, dict[str, str | None], AliasRecord, list[NamespaceRecord], AliasChange], bool]


def _ns(raw: str | None) -> NamespaceRecord | None:
    return NamespaceRecord.from_json(json.loads(raw)) if raw else None


def _alias(raw: str | None) -> AliasRecord | None:
    return AliasRecord.from_json(json.loads(raw)) if raw else None


def transition_optimistically(
    name: str,
    expected: frozenset[State],
    record: NamespaceRecord,
    read_ns: Callable[[str], str | None],
    apply: Callable[[str | None], bool],
    based_on: NamespaceRecord | None = None,
) -> None:
    """Check the stored state (and, with ``based_on``, the whole record) and write
    ``record`` iff the row still holds what was read; read again when it changed in between."""
    while True:
        raw = read_ns(name)
        check_transition(name, _ns(raw), expected, based_on)
        if apply(raw):
            return


def flip_optimistically(
    alias: str,
    expected: str | None,
    target: str,
    principal: str,
    reason: str,
    respect_pin: bool,
    read_alias: Callable[[str], str | None],
    read_ns: Callable[[str], str | None],
    apply: ApplyFlip,
) -> AliasRecord:
    """plan_flip over freshly read rows, applied iff none of them changed meanwhile; on a
    lost race read again (plan_flip then raises AliasConflictError if the alias moved)."""
    while True:
        raw_alias = read_alias(alias)
        current = _alias(raw_alias)
        raws = {target: read_ns(target)}
        if current is not None and current.namespace != target:
            raws[current.namespace] = read_ns(current.namespace)
        record, changed, change = plan_flip(
            alias,
            current,
            expected,
            _ns(raws[target]),
            target,
            _ns(raws[current.namespace]) if current else None,
            principal,
            reason,
            respect_pin,
        )
        if change is None or apply(raw_alias, raws, record, changed, change):
            return record


def pin_optimistically(
    alias: str,
    pinned: bool,
    principal: str,
    reason: str,
    read_alias: Callable[[str], str | None],
    apply: Callable[[str | None, AliasRecord, AliasChange], bool],
) -> AliasRecord:
    raw = read_alias(alias)
    record, change = plan_pin(alias, _alias(raw), pinned, principal, reason)
    if change is not None and not apply(raw, record, change):
        raise AliasConflictError(f"alias {alias!r} changed while it was being pinned; look again and retry")
    return record


class PendingReleases:
    """Write-fence leases whose release failed because the store was unreachable. They are
    released again before this process next waits on a fence, so a seal after an outage
    does not sit out the whole lease; a lease of a process that died expires on its own."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._pending: list[Callable[[], object]] = []

    def release(self, fn: Callable[[], object]) -> None:
        """Call ``fn``; if it fails, keep it for ``retry`` (never raises)."""
        try:
            fn()
        except Exception:
            with self._lock:
                self._pending.append(fn)

    def retry(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for fn in pending:
            self.release(fn)
