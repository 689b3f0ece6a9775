"""What the console shows, read through the KV DAL client and the run records: plain dicts
for the templates (and the same data the CLI's ``--json`` prints)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from bulldozer.kv.client import KvClient
from bulldozer.kv.types import NamespaceRecord, State, utcnow
from bulldozer.names import short_version
from bulldozer.versioning.run_state import run_record_of

__all__ = ["age", "alias_page", "aliases_page", "size", "version_page"]


def age(when: datetime | None, now: datetime | None = None) -> str:
    """``3 d``, ``5 h``, ``12 min``, ``40 s`` since ``when``."""
    if when is None:
        return "-"
    seconds = max(0.0, ((now or utcnow()) - when).total_seconds())
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return f"{seconds / length:.0f} {unit}"
    return f"{seconds:.0f} s"


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} TiB"  # pragma: no cover


def _version_row(n: NamespaceRecord, now: datetime) -> dict[str, Any]:
    """A version's row at ``now``, the DAL's time (``KvClient.now``): what its ages are told on."""
    run = run_record_of(n, now)
    return {
        "name": n.name,
        "short": short_version(n.name),
        "state": n.state.value,
        "created": n.created,
        "age": age(n.created, now),
        "snapshot_id": n.snapshot_id,
        "records": n.record_count,
        "size": size(n.bytes),
        "digest": f"{n.digest:#018x}",
        "verified": n.verified,
        "failure": n.failure_reason or (run.error if run else ""),
        "outcome": run.outcome if run else "",
        "gates": run.gates if run else [],
        "rollback_target": n.state in (State.RETIRED, State.SEALED),
    }


def aliases_page(client: KvClient) -> list[dict[str, Any]]:
    """Every alias with its live version, the version's age, records and size."""
    versions = {n.name: n for n in client.list_namespaces()}
    now, rows = client.now(), []
    for a in sorted(client.list_aliases(), key=lambda a: a.alias):
        live = versions.get(a.namespace)
        rows.append(
            {
                "alias": a.alias,
                "version": a.namespace,
                "short": short_version(a.namespace),
                "changed": age(a.updated, now),
                "records": live.record_count if live else 0,
                "size": size(live.bytes) if live else "-",
                "pinned": a.pinned,
                "generation": a.generation,
            }
        )
    return rows


def alias_page(client: KvClient, alias: str) -> dict[str, Any]:
    """An alias: where it points, its versions (newest first) and its history."""
    record, now = client.get_alias(alias), client.now()
    versions = [_version_row(n, now) for n in reversed(client.list_namespaces(alias))]
    history = [
        {**c.to_json(), "age": age(c.time, now),
         "from_short": short_version(c.from_namespace) if c.from_namespace else "-",
         "to_short": short_version(c.to_namespace)}
        for c in client.alias_history(alias, 50)
    ]  # fmt: skip
    return {
        "alias": alias,
        "live": record.namespace,
        "live_short": short_version(record.namespace),
        "pinned": record.pinned,
        "generation": record.generation,
        "versions": versions,
        "history": history,
    }


def version_page(client: KvClient, alias: str, ref: str) -> tuple[NamespaceRecord, dict[str, Any]]:
    """One version (its full name or short id): its record, run stages and gate values, and
    the ``.proto`` it was written with."""
    from bulldozer.schema.render import render_descriptor

    n, now = client.describe_target(f"{alias}@{ref}"), client.now()
    run = run_record_of(n, now)
    data = _version_row(n, now)
    data.update(
        alias=alias,
        state_changed=n.state_changed,
        sealed=n.sealed,
        job=n.job_name,
        run=asdict(run) if run else None,
        stages=list((run.timings if run else {}).items()),
        proto=render_descriptor(n.value_descriptor_set, n.key_message) if n.value_descriptor_set else "",
    )
    return n, data
