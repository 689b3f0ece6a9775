"""``memory``: an in-process engine for tests. Passes the same contract suite."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence

from bulldozer.codec.digest import Digest
from bulldozer.errors import NamespaceExistsError
from bulldozer.kv.backends._lifecycle import (
    check_readable,
    check_transition,
    check_writable,
    plan_flip,
    plan_pin,
)
from bulldozer.kv.backends.base import StorageEngine, select_namespaces
from bulldozer.kv.backends.config import MemoryConfig
from bulldozer.kv.types import AliasChange, AliasRecord, BaseCopy, NamespaceRecord, State


class MemoryEngine(StorageEngine):
    name = "memory"
    base_copy = BaseCopy.IN_STORE

    def __init__(self, config: MemoryConfig | None = None) -> None:
        self._lock = threading.RLock()
        self._namespaces: dict[str, NamespaceRecord] = {}
        self._data: dict[str, dict[bytes, bytes]] = {}
        self._sorted: dict[str, list[bytes]] = {}
        self._aliases: dict[str, AliasRecord] = {}
        self._history: dict[str, list[AliasChange]] = {}

    def create_namespace(self, record: NamespaceRecord) -> None:
        with self._lock:
            if record.name in self._namespaces:
                raise NamespaceExistsError(f"namespace {record.name!r} already exists")
            self._namespaces[record.name] = record
            self._data[record.name] = {}

    def get_namespace(self, name: str) -> NamespaceRecord | None:
        with self._lock:
            return self._namespaces.get(name)

    def list_namespaces(
        self, alias: str | None = None, states: frozenset[State] | None = None
    ) -> list[NamespaceRecord]:
        with self._lock:
            records = list(self._namespaces.values())
        return select_namespaces(records, alias, states)

    def transition(
        self, name: str, expected: frozenset[State], record: NamespaceRecord, based_on: NamespaceRecord | None = None
    ) -> NamespaceRecord:
        with self._lock:
            check_transition(name, self._namespaces.get(name), expected, based_on)
            self._namespaces[name] = record
            return record

    def drop_data(self, name: str) -> None:
        with self._lock:
            self._data.pop(name, None)
            self._sorted.pop(name, None)

    def write_batch(self, name: str, keys: list[bytes], values: list[bytes], digest: Digest | None = None) -> None:
        with self._lock:
            check_writable(name, self._namespaces.get(name))
            self._data[name].update(zip(keys, values, strict=True))
            self._sorted.pop(name, None)

    def copy_records(self, source: str, target: str) -> None:
        with self._lock:
            check_writable(target, self._namespaces.get(target))
            self._data[target].update(self._data[source])
            self._sorted.pop(target, None)

    def delete_batch(self, name: str, keys: Sequence[bytes]) -> int:
        with self._lock:
            check_writable(name, self._namespaces.get(name))
            data = self._data[name]
            deleted = sum(data.pop(k, None) is not None for k in keys)
            self._sorted.pop(name, None)
            return deleted

    def get_many(self, name: str, keys: Sequence[bytes]) -> list[bytes | None]:
        with self._lock:
            check_readable(name, self._namespaces.get(name))
            data = self._data[name]
            return [data.get(k) for k in keys]

    def scan(self, name: str, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        with self._lock:
            record = self._namespaces.get(name)
            if record is None or record.state == State.DROPPED:
                check_readable(name, record)
            data = self._data[name]
            keys = self._sorted.get(name)
            if keys is None:
                keys = self._sorted[name] = sorted(data)
            start = 0 if after is None else bisect.bisect_right(keys, after)
            return [(k, data[k]) for k in keys[start : start + limit]]

    def get_alias(self, alias: str) -> AliasRecord | None:
        with self._lock:
            return self._aliases.get(alias)

    def list_aliases(self) -> list[AliasRecord]:
        with self._lock:
            return sorted(self._aliases.values(), key=lambda a: a.alias)

    def flip_alias(
        self, alias: str, expected: str | None, target: str, principal: str, reason: str, respect_pin: bool = False
    ) -> AliasRecord:
        with self._lock:
            current = self._aliases.get(alias)
            previous = self._namespaces.get(current.namespace) if current else None
            record, changed, change = plan_flip(
                alias,
                current,
                expected,
                self._namespaces.get(target),
                target,
                previous,
                principal,
                reason,
                respect_pin,
            )
            for ns in changed:
                self._namespaces[ns.name] = ns
            self._aliases[alias] = record
            if change is not None:
                self._history.setdefault(alias, []).append(change)
            return record

    def set_pin(self, alias: str, pinned: bool, principal: str, reason: str) -> AliasRecord:
        with self._lock:
            record, change = plan_pin(alias, self._aliases.get(alias), pinned, principal, reason)
            self._aliases[alias] = record
            if change is not None:
                self._history.setdefault(alias, []).append(change)
            return record

    def alias_history(self, alias: str, limit: int = 100) -> list[AliasChange]:
        with self._lock:
            return list(reversed(self._history.get(alias, [])))[:limit]
