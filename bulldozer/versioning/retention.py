"""Retention: keep the ACTIVE version, the newest ``keep_versions`` RETIRED ones (so a
rollback is instant), and drop the rest once they have been retired longer than the grace
period. Versions left LOADING, SEALING or FAILED (or SEALED and never flipped) longer than
the grace period are dropped too — counted from the last heartbeat of the run making one,
and never while that run is alive (``run_state.being_made``), whatever the grace period:
a day-long load is not an abandoned one."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from bulldozer.kv.client import KvClient
from bulldozer.kv.types import DROPPING_LABEL, HELD, NamespaceRecord, State, utcnow
from bulldozer.spec.models import Retention
from bulldozer.versioning.run_state import being_made, last_sign_of_life, run_record_of

__all__ = ["RetentionPlan", "alias_retention", "apply_retention", "finish_drops", "plan_retention", "retention_of"]


@dataclass
class RetentionPlan:
    keep: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    #: retired versions beyond keep_versions, still inside their grace period
    waiting: list[str] = field(default_factory=list)


def retention_of(retention: Retention) -> dict[str, int]:
    """A spec's retention as its runs record it (``RunRecord.retention``)."""
    return {"keep_versions": retention.keep_versions, "grace_seconds": int(retention.grace_period.total_seconds())}


def alias_retention(records: list[NamespaceRecord]) -> Retention | None:
    """The retention the job serving an alias asked for: its ACTIVE version's run recorded
    it; None for an alias with no live version, or one loaded before runs recorded it."""
    for r in records:
        if r.state == State.ACTIVE and (run := run_record_of(r)) is not None and run.retention:
            return Retention(
                keep_versions=run.retention["keep_versions"],
                grace_period=timedelta(seconds=run.retention["grace_seconds"]),
            )
    return None


def plan_retention(
    records: list[NamespaceRecord],
    keep_versions: int,
    grace_period: timedelta,
    now: datetime | None = None,
    protect: frozenset[str] = frozenset(),
) -> RetentionPlan:
    """What retention would do to one alias's versions (``protect``: names never dropped,
    e.g. the version a run is loading right now) at ``now``: the DAL's time
    (``KvClient.now``), on which its records' state changes and runs' heartbeats are told."""
    now = now or utcnow()
    plan = RetentionPlan()
    retired = sorted((r for r in records if r.state == State.RETIRED), key=lambda r: r.retired_order, reverse=True)
    for r in records:
        if r.state == State.ACTIVE or r.name in protect or being_made(r, now):
            plan.keep.append(r.name)
        elif r.state in (State.LOADING, State.SEALING, State.FAILED, State.SEALED):
            # abandoned loads and seals, failed runs and versions that lost their flip
            (plan.drop if now - last_sign_of_life(r) > grace_period else plan.keep).append(r.name)
    for i, r in enumerate(retired):
        if r.name in protect:
            continue
        if i < keep_versions:
            plan.keep.append(r.name)
        elif now - r.state_changed > grace_period:
            plan.drop.append(r.name)
        else:
            plan.waiting.append(r.name)
    return plan


def apply_retention(
    client: KvClient, alias: str, keep_versions: int, grace_period: timedelta, protect: frozenset[str] = frozenset()
) -> RetentionPlan:
    held = client.list_namespaces(alias, states=HELD)  # a dropped version has nothing left to drop
    plan = plan_retention(held, keep_versions, grace_period, client.now(), protect)
    for name in plan.drop:
        client.drop(name)
    return plan


def finish_drops(client: KvClient, dry_run: bool = False) -> list[str]:
    """The versions whose drop a DAL left half done (DROPPED, their data still being
    deleted: ``DROPPING_LABEL``), dropped again to delete it (not with ``dry_run``)."""
    unfinished = [
        n.name for n in client.list_namespaces(states=frozenset({State.DROPPED})) if DROPPING_LABEL in n.labels
    ]
    if not dry_run:
        for name in unfinished:
            client.drop(name)
    return unfinished
