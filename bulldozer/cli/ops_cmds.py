"""Operator commands: see what is live, undo a bad version, clean up."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bulldozer.cli.common import (
    Endpoint,
    Home,
    Json,
    confirm,
    console,
    err_console,
    fail,
    handle_errors,
    line,
    ok,
    open_client,
    open_version,
    print_json,
    with_store,
)
from bulldozer.cli.output import Column, Format, Output, emit, fmt_time, output_format
from bulldozer.cli.progress import reporting

if TYPE_CHECKING:
    from bulldozer.kv import KvClient
    from bulldozer.kv.types import NamespaceRecord


namespace_app = typer.Typer(help="One version namespace: describe, verify or drop it.", no_args_is_help=True)
alias_app = typer.Typer(help="Aliases: where one points, and every change to it.", no_args_is_help=True)


def _ns_json(n: NamespaceRecord) -> dict[str, Any]:
    data = n.to_json()
    data.pop("value_descriptor_set")
    data["digest"] = f"{n.digest:#018x}"
    return data


@handle_errors
def namespaces(
    alias: Annotated[str | None, typer.Argument(help="Only this alias's versions.", show_default=False)] = None,
    endpoint: Endpoint = None,
    home: Home = None,
    as_json: Json = False,
    output: Output = None,
) -> None:
    """List version namespaces (newest last) with their state, size and times."""
    fmt = output_format(output, as_json)
    with open_client(endpoint, home, fmt is Format.json) as client:
        records = client.list_namespaces(alias)
    rows = [{**_ns_json(n), "created_at": n.created, "changed_at": n.state_changed} for n in records]
    columns = [
        Column.version("version", "name"),
        Column("alias", lambda r: r["alias"], max_width=24),
        Column("state", lambda r: r["state"]),
        Column("records", lambda r: r["record_count"], lambda v: f"{v:,}", "right"),
        Column("MiB", lambda r: r["bytes"] / 1024**2, lambda v: f"{v:,.1f}", "right"),
        Column("created (UTC)", lambda r: r["created_at"], fmt_time),
        Column("state changed (UTC)", lambda r: r["changed_at"], fmt_time, wide_only=True),
        Column("digest", lambda r: r["digest"], wide_only=True),
    ]
    title = f"versions of {alias}" if alias else "namespaces"
    emit(rows, columns, fmt, title, with_store(client, [_ns_json(n) for n in records]))


def _named(client: KvClient, ref: str, alias_ok: bool = False) -> NamespaceRecord:
    """The namespace ``ref`` names: its full name, ``ALIAS@VERSION``, or the short id the
    tables show (``e10890``, as ``names.pick_version`` reads it among every namespace);
    with ``alias_ok``, an alias's name for its live version."""
    from bulldozer.errors import AliasNotFoundError, InvalidArgumentError, InvalidNameError, NamespaceNotFoundError
    from bulldozer.names import VERSION_REF_PATTERN, pick_version

    if "@" in ref:
        return client.describe_target(ref)
    try:
        return client.describe(ref)
    except (NamespaceNotFoundError, InvalidNameError):
        if re.fullmatch(VERSION_REF_PATTERN, ref) is None:
            raise
        if alias_ok:
            try:
                return client.describe_target(ref)
            except (AliasNotFoundError, NamespaceNotFoundError, InvalidNameError, InvalidArgumentError):
                pass  # not an alias with a live version
        return client.describe(pick_version(ref, [n.name for n in client.list_namespaces()], "the store"))


@namespace_app.command("describe")
@handle_errors
def namespace_describe(
    name: Annotated[
        str,
        typer.Argument(
            help="The namespace: its name, its short id (as tables show it), ALIAS@VERSION, or an alias for its "
            "live version.",
            show_default=False,
        ),
    ],
    endpoint: Endpoint = None,
    home: Home = None,
) -> None:
    """Everything the DAL knows about one namespace (as JSON)."""
    with open_client(endpoint, home, as_json=True) as client:
        print_json(with_store(client, _ns_json(_named(client, name, alias_ok=True))))


@namespace_app.command("drop")
@handle_errors
def namespace_drop(
    name: Annotated[
        str,
        typer.Argument(help="The namespace: its name, its short id, or ALIAS@VERSION.", show_default=False),
    ],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
    endpoint: Endpoint = None,
    home: Home = None,
    as_json: Json = False,
) -> None:
    """Drop a namespace's data (refused for the ACTIVE version of an alias)."""
    with open_client(endpoint, home, as_json) as client:
        named = _named(client, name)
        name = named.name
        if not yes and not as_json:
            from bulldozer.kv.types import State
            from bulldozer.versioning.run_state import being_made_by

            busy = ""
            if (maker := being_made_by(named, client.now())) is not None:
                busy = f" ({named.state.value}: a run is making it now, {maker}; that run fails)"
            elif named.state in (State.LOADING, State.SEALING):
                busy = f" ({named.state.value}: no run has been heard from making it)"
            confirm(f"drop {name}{busy} and all its data?")
        dropped = client.drop(name)
    if as_json:
        print_json(with_store(client, _ns_json(dropped)))
        return
    ok(f"{dropped.name} is {dropped.state.value}")


@namespace_app.command("verify")
@handle_errors
def namespace_verify(
    name: Annotated[
        str | None,
        typer.Argument(
            help="The version: its name, its short id, ALIAS@VERSION, or an alias for its live version.",
            show_default=False,
        ),
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="Every alias's live version, one after the other.")] = False,
    endpoint: Endpoint = None,
    home: Home = None,
    as_json: Json = False,
) -> None:
    """Read a sealed version back and check it against what its seal measured.

    Every record is read and measured as the seal did: a store that lost, gained or altered
    any since (a failover, a damaged disk, another tool writing there) exits 1, saying
    what differs. Nothing is changed."""
    from bulldozer.versioning.audit import audit_version

    if (name is None) == (not every):
        raise fail("give a version (or an alias), or --all for every alias's live version")
    with open_client(endpoint, home, as_json) as client:
        if name is not None:
            targets = [_named(client, name, alias_ok=True)]
        else:
            targets = [client.describe(a.namespace) for a in sorted(client.list_aliases(), key=lambda a: a.alias)]
        if not targets and not as_json:
            ok("no alias points at a version: nothing to verify")
        audits = []
        for target in targets:
            with reporting(f"verify {target.name}", "records", quiet=as_json) as progress:
                audit = audit_version(client, target, progress.update)
            audits.append(audit)
            if not as_json and audit.intact:
                ok(
                    f"{audit.version.name} ({audit.version.state.value}): {audit.records:,} "
                    f"record{'' if audit.records == 1 else 's'}, digest "
                    f"{audit.digest:#018x}, as its seal measured ({audit.seconds:.1f} s)"
                )
        if as_json:
            reports = [audit.to_json() for audit in audits]
            print_json(with_store(client, reports if every else reports[0]))
        damaged = [audit for audit in audits if not audit.intact]
        for audit in damaged[:-1]:
            err_console.print(line(("error:", "bold red"), " ", audit.finding()))
        if damaged:  # the last one line, and the exit; without the store's line
            raise fail(damaged[-1].finding())


@alias_app.command("show")
@handle_errors
def alias_show(
    alias: Annotated[str, typer.Argument(help="The alias.", show_default=False)],
    endpoint: Endpoint = None,
    home: Home = None,
    as_json: Json = False,
) -> None:
    """Where the alias points, and that version's size and run."""
    with open_client(endpoint, home, as_json) as client:
        record = client.get_alias(alias)
        live = client.describe(record.namespace)
    data = with_store(client, {**record.to_json(), "version": _ns_json(live)})
    if as_json:
        print_json(data)
        return
    console.print(
        line(
            (alias, "bold"),
            f" → {record.namespace} (change #{record.generation}, {record.updated:%Y-%m-%d %H:%M:%S} UTC): "
            f"{live.record_count:,} records, {live.state.value}" + (" — PINNED" if record.pinned else ""),
        )
    )


@alias_app.command("history")
@handle_errors
def alias_history(
    alias: Annotated[str, typer.Argument(help="The alias.", show_default=False)],
    limit: Annotated[int, typer.Option(min=1, help="Newest changes to show.")] = 50,
    endpoint: Endpoint = None,
    home: Home = None,
    as_json: Json = False,
    output: Output = None,
) -> None:
    """Every change of the alias (flips and rollbacks), newest first, with who and why."""
    fmt = output_format(output, as_json)
    with open_client(endpoint, home, fmt is Format.json) as client:
        changes = client.alias_history(alias, limit)
    rows = [{**c.to_json(), "at": c.time} for c in changes]
    columns = [
        Column("#", lambda r: r["generation"], justify="right"),
        Column("time (UTC)", lambda r: r["at"], fmt_time),
        Column.version("from", "from_namespace"),
        Column.version("to", "to_namespace"),
        Column("principal", lambda r: r["principal"], max_width=16),
        Column("reason", lambda r: r["reason"], max_width=26),
    ]
    emit(rows, columns, fmt, f"history of {alias}", with_store(client, [c.to_json() for c in changes]))


@handle_errors
def rollback(
    alias: Annotated[str, typer.Argument(help="The alias to roll back.", show_default=False)],
    to: Annotated[str | None, typer.Option(help="The version to point at (default: the previous one).")] = None,
    reason: Annotated[str, typer.Option(help="Why (kept in the alias history).")] = "",
    expect: Annotated[
        str | None,
        typer.Option(help="Refuse unless the alias still points here (the version you looked at).", show_default=False),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
    endpoint: Endpoint = None,
    home: Home = None,
    as_json: Json = False,
) -> None:
    """Point an alias back at an earlier version, atomically (a compare-and-set).

    Refused when the target was dropped, failed or never sealed, or when the alias moved
    since you looked (--expect). Every rollback is kept in the alias history.
    """
    from bulldozer.versioning.rollback import generation_change, previous_version
    from bulldozer.versioning.rollback import rollback as do_rollback

    with open_client(endpoint, home, as_json) as client:
        if expect:
            live = client.describe_target(f"{alias}@{expect}")
        else:
            live = client.describe(client.get_alias(alias).namespace)
        current = live.name
        target = client.describe_target(f"{alias}@{to}") if to else previous_version(client, alias, current)
        crossing = generation_change(live, target)
        if not yes and not as_json:
            confirm(f"point {alias} from {current} back to {target.name}{f' ({crossing})' if crossing else ''}?")
        before, record = do_rollback(client, alias, target.name, reason, expected=current)
    if as_json:
        data = {"alias": alias, "from": before, "to": record.namespace, "generation": record.generation}
        print_json(with_store(client, {**data, "schema_generation": target.schema_generation}))
    else:
        ok(f"{alias}: {before} → {record.namespace}")
        if crossing:
            err_console.print(line(("warning:", "yellow"), f" {crossing}"))


@handle_errors
def gc(
    keep: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="RETIRED versions kept per alias, for rollback (default: what the alias's job asked for, its "
            "retention.keep_versions, else 2).",
            show_default=False,
        ),
    ] = None,
    grace: Annotated[
        str | None,
        typer.Option(
            help="Drop only what changed state longer ago than this (default: the alias's job's "
            "retention.grace_period, else 24h).",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only show what would be dropped.")] = False,
    endpoint: Endpoint = None,
    home: Home = None,
    as_json: Json = False,
) -> None:
    """Apply retention to every alias.

    Drops RETIRED versions beyond --keep, and versions left LOADING, FAILED or never flipped
    (SEALED), once they are older than --grace; never one whose run still beats (a run
    writes a heartbeat on its version every 30 s). Each alias keeps what its job's spec
    asks for (retention, recorded by its live version's run) unless --keep / --grace say
    otherwise. Finishes the drops a stopped DAL left half done (their data still stored)."""
    from pydantic_core import PydanticCustomError

    from bulldozer.kv.types import HELD
    from bulldozer.spec.models import Retention, parse_duration
    from bulldozer.versioning.retention import alias_retention, finish_drops, plan_retention

    try:
        grace_period: timedelta | None = parse_duration(grace) if grace is not None else None
    except PydanticCustomError as exc:
        raise fail(f"--grace: {exc}", 2) from None
    dropped: dict[str, list[str]] = {}
    with open_client(endpoint, home, as_json) as client:
        by_alias: dict[str, list[NamespaceRecord]] = {}
        for n in client.list_namespaces(states=HELD):  # as a run's retention: dropped ones have nothing left
            by_alias.setdefault(n.alias, []).append(n)
        now = client.now()  # the DAL's: the clock the versions' ages are told on
        for alias, records in sorted(by_alias.items()):
            own = alias_retention(records) or Retention()  # the job's, else the spec's defaults
            plan = plan_retention(
                records,
                own.keep_versions if keep is None else keep,
                own.grace_period if grace_period is None else grace_period,
                now,
            )
            if plan.drop:
                dropped[alias] = plan.drop
                if not dry_run:
                    for name in plan.drop:
                        client.drop(name)
        finished = finish_drops(client, dry_run)
    if as_json:
        print_json(with_store(client, {"dry_run": dry_run, "dropped": dropped, "finished_drops": finished}))
        return
    if not dropped and not finished:
        ok("nothing to drop")
    for alias, names in dropped.items():
        verb = "would drop" if dry_run else "dropped"
        console.print(f"{alias}: {verb} {', '.join(names)}")
    for name in finished:
        verb = "would finish" if dry_run else "finished"
        console.print(f"{verb} dropping {name} (a DAL stopped while it deleted its data)")


@handle_errors
def scan(
    target: Annotated[str, typer.Argument(help="ALIAS or ALIAS@VERSION.", show_default=False)],
    limit: Annotated[int, typer.Option(min=1, help="Records to print.")] = 10,
    endpoint: Endpoint = None,
    home: Home = None,
) -> None:
    """Print records in key order as JSON lines, decoded with the version's stored schema.

    Each line is {"key": ..., "value": ...}, both written as `bulldozer get` prints them."""
    from bulldozer.errors import UnreadableRecordError
    from bulldozer.schema.decode import ReadableJson

    with open_client(endpoint, home) as client:
        alias, name, info, key_cls, value_cls = open_version(client, target)
        readable = ReadableJson(info.value_descriptor_set)
        for key, value in client.scan(alias=f"{alias}@{name}", limit=limit):
            line = {"key": readable.decode(key_cls, key)}
            try:
                line["value"] = readable.decode(value_cls, value)
            except UnreadableRecordError as exc:
                raise UnreadableRecordError(f"the value of key {json.dumps(line['key'])} in {name}: {exc}") from None
            typer.echo(json.dumps(line))


def _set_pin(alias: str, pinned: bool, reason: str, endpoint: str | None, home: str | None, as_json: bool) -> None:
    with open_client(endpoint, home, as_json) as client:
        record = client.set_pin(alias, pinned, reason)
    if as_json:
        print_json(with_store(client, record.to_json()))
        return
    state = "pinned" if record.pinned else "not pinned"
    ok(f"{alias} → {record.namespace} is {state}")


@handle_errors
def pin(
    alias: Annotated[str, typer.Argument(help="The alias to hold where it is.", show_default=False)],
    reason: Annotated[str, typer.Option(help="Why (kept in the alias history).")] = "",
    endpoint: Endpoint = None,
    home: Home = None,
    as_json: Json = False,
) -> None:
    """Hold the alias on its current version; rollbacks still work.

    Runs keep building and verifying versions but do not flip (they end with outcome
    "pinned")."""
    _set_pin(alias, True, reason, endpoint, home, as_json)


@handle_errors
def unpin(
    alias: Annotated[str, typer.Argument(help="The alias to release.", show_default=False)],
    reason: Annotated[str, typer.Option(help="Why (kept in the alias history).")] = "",
    endpoint: Endpoint = None,
    home: Home = None,
    as_json: Json = False,
) -> None:
    """Release a pinned alias: the next run flips it again."""
    _set_pin(alias, False, reason, endpoint, home, as_json)
