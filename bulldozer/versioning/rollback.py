"""Rollback: point an alias back at an earlier, still readable version — one atomic
compare-and-set, recorded in the alias history with principal and reason."""

from __future__ import annotations

from bulldozer.errors import NamespaceNotFoundError, NamespaceStateError
from bulldozer.kv.client import KvClient
from bulldozer.kv.types import AliasRecord, NamespaceRecord, State

__all__ = ["generation_change", "previous_version", "rollback"]


def previous_version(client: KvClient, alias: str, current: str) -> NamespaceRecord:
    """The version that was live before ``current``: the one retired last (by the flips'
    order, not the clock: ``NamespaceRecord.retired_order``)."""
    retired = [n for n in client.list_namespaces(alias, states=[State.RETIRED]) if n.name != current]
    if not retired:
        raise NamespaceNotFoundError(
            f"alias {alias!r} has no previous version to roll back to (no RETIRED version is left)"
        )
    return max(retired, key=lambda n: n.retired_order)


def rollback(
    client: KvClient, alias: str, to: str | None = None, reason: str = "", expected: str | None = None
) -> tuple[str, AliasRecord]:
    """Point ``alias`` at ``to`` (default: the previous version). ``expected`` is the
    version the operator saw live; if the alias moved since, the rollback is refused. Both
    name a version of ``alias`` by its full name or its short id."""
    current = client.describe_target(f"{alias}@{expected}").name if expected else client.get_alias(alias).namespace
    target = client.describe_target(f"{alias}@{to}") if to else previous_version(client, alias, current)
    if target.alias != alias:
        raise NamespaceStateError(f"{target.name} is a version of {target.alias!r}, not of {alias!r}")
    if target.state not in (State.RETIRED, State.SEALED, State.ACTIVE):
        raise NamespaceStateError(
            f"cannot roll back to {target.name}: it is {target.state.value}; only a sealed version that is "
            "still kept (SEALED or RETIRED) can become live again"
        )
    record = client.compare_and_set_alias(alias, current, target.name, reason=reason or f"rollback to {target.name}")
    return current, record


def generation_change(current: NamespaceRecord, target: NamespaceRecord) -> str:
    """What a rollback from ``current`` to ``target`` does to the alias's readers when it
    crosses a breaking schema change (the two have other schema generations), or "": the
    generated clients built for ``current``'s generation refuse ``target``'s until they are
    built for it again (or read a version pinned)."""
    if current.schema_generation == target.schema_generation:
        return ""
    return (
        f"schema generation {current.schema_generation} → {target.schema_generation}: the readers built for "
        f"generation {current.schema_generation} refuse the alias's reads until they are generated again "
        f"(bulldozer client --schema-generation {target.schema_generation})"
    )
