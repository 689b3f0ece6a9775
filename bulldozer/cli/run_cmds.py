"""``bulldozer run``, ``bulldozer get`` and ``bulldozer runs``: the main job and reading it back."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bulldozer.cli import process
from bulldozer.cli.common import (
    HOME_HELP,
    Endpoint,
    Home,
    Json,
    Token,
    console,
    fail,
    handle_errors,
    line,
    ok,
    open_client,
    open_version,
    os_error,
    print_json,
    report,
    say_error,
    say_store,
    visible,
    with_store,
)
from bulldozer.cli.output import Column, Format, Output, emit, fmt_time, output_format
from bulldozer.cli.progress import reporting
from bulldozer.errors import BulldozerError, InvalidArgumentError, RetentionError

if TYPE_CHECKING:
    from bulldozer.kv.client import KvClient
    from bulldozer.spec.loader import LoadedSpec
    from bulldozer.versioning.run_state import RunRecord


class EngineChoice(StrEnum):
    local = "local"
    spark = "spark"


@handle_errors
def run(
    spec: Annotated[Path, typer.Argument(help="Job spec (YAML).", show_default=False)],
    engine: Annotated[EngineChoice, typer.Option(help="Load engine.")] = EngineChoice.local,
    endpoint: Annotated[
        str | None, typer.Option(help="Override the spec's endpoint: embedded or HOST:PORT.", show_default=False)
    ] = None,
    resume: Annotated[
        str | None, typer.Option(help="Continue the LOADING version a killed run left behind.", show_default=False)
    ] = None,
    home: Annotated[str | None, typer.Option(help=HOME_HELP, show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run record as JSON.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    master: Annotated[
        str | None,
        typer.Option(
            help="Spark master for --engine spark (default local[*]; e.g. spark://host:7077).", show_default=False
        ),
    ] = None,
    stage: Annotated[
        str | None,
        typer.Option(
            help="Run one stage only (validate, schema, load, verify, flip, retention), for schedulers; "
            "each is safe to retry.",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        str | None,
        typer.Option(help="--stage verify/flip/retention: the version the load stage made.", show_default=False),
    ] = None,
    run_key: Annotated[
        str | None,
        typer.Option(
            help="--stage: the scheduler's id of this run; a retried load resumes the version it started, and "
            "later stages find that version by it.",
            show_default=False,
        ),
    ] = None,
    allow_breaking: Annotated[
        bool,
        typer.Option(
            "--allow-breaking",
            help="Make a schema change that breaks readers deliberately: the version starts a new schema "
            "generation, readers built for the old one refuse it (schema mismatch) instead of misreading, and "
            "the alias history records the change.",
        ),
    ] = False,
    take_over: Annotated[
        bool,
        typer.Option(
            "--take-over",
            help="Hand the spec's alias to this job when another job's version is live there (refused "
            "otherwise): from then on it serves this job, and the alias history records the hand-over.",
        ),
    ] = False,
) -> None:
    """Load the spec's table into a brand-new version, verify it, and flip the alias to it.

    One version per run: the source is read at one Iceberg snapshot; the schema is checked
    against the live version first; the version is verified (duplicates, count and digest
    against what the DAL stored, quality gates) before the alias moves. On any failure the
    version is marked FAILED and the alias stays where it was; the exit code is non-zero.
    """
    from bulldozer.kv.connect import connect_for_spec, store_not_made
    from bulldozer.spec.loader import load_spec

    failures: list[RunRecord] = []
    store = ""
    # a resumed run and the later stages act on the version an earlier one made: they make no store
    makes = resume is None and stage in (None, "validate", "schema", "load")
    try:
        loaded = load_spec(spec)
        if makes and store_not_made(loaded, home, endpoint):
            # a home with neither a store nor the catalog (a mistyped --home): said before either is made
            from bulldozer.warehouse.catalog import require_catalog_made

            require_catalog_made(loaded.spec.data_movement.catalog, home)
        if engine is EngineChoice.local:
            process.without_pandas()
        limit = _time_limit(loaded, stage)
        with connect_for_spec(loaded, home, endpoint, create=makes) as client, limit:  # the run's end disarms it
            store = client.store
            # An embedded DAL starts now, on the other core, while this process imports the
            # load engine and reads the catalog; the first call to it waits until it is up.
            record = _run(
                client,
                loaded,
                engine,
                master,
                home,
                resume,
                as_json,
                quiet,
                stage,
                version,
                run_key,
                failures,
                allow_breaking,
                take_over,
            )
    except (BulldozerError, KeyboardInterrupt) as exc:  # KeyboardInterrupt: Ctrl-C, SIGTERM or SIGHUP, the time limit
        if as_json:  # the run record as far as it got, instead of the generic failure object
            failure = _failure_json(failures[-1] if failures else None, exc, stage, version or resume or "")
            print_json({**failure, "store": store} if store else failure)
            if isinstance(exc, BulldozerError):
                raise report(exc) from None
        raise
    if record is None:
        return
    try:
        _say_outcome(record, store, client, as_json, quiet)
        sys.stdout.flush()
    except OSError as exc:  # the run is done, and its exit code says how: only its output is lost
        process.to_null(1)  # what stdout still holds goes nowhere, not to the exit
        retention = f"; retention failed (older versions were kept): {record.retention_error}"
        say_error(
            line(
                ("warning:", "yellow"),
                f" {record.alias} → {record.version} is live, but this command could not write its output "
                f"({os_error(exc)}){retention if record.retention_error else ''}",
            )
        )
        raise typer.Exit(RetentionError.exit_code if record.retention_error else 0) from None


def _time_limit(loaded: LoadedSpec, stage: str | None) -> process.TimeLimit:
    """The run's (or with ``--stage``, the stage's) time limit, which stops it once passed."""
    from bulldozer.spec.models import format_duration
    from bulldozer.spec.policy import time_limit

    limit = time_limit(loaded)
    if limit is None:
        return process.TimeLimit(None, "")
    duration, where = limit
    what = f"the {stage} stage" if stage else "the run"
    return process.TimeLimit(
        duration.total_seconds(), f"{what} took longer than its time limit, {format_duration(duration)} ({where})"
    )


def _say_outcome(record: RunRecord, store: str, client: Any, as_json: bool, quiet: bool) -> None:
    """What a finished run prints: its record (``--json``) or its lines, and the exit code a
    failed retention gives."""
    if as_json:
        print_json({**json.loads(record.to_json()), "store": store})
        if record.retention_error:
            raise typer.Exit(RetentionError.exit_code)
        return
    if not quiet:
        say_store(client)
    if record.outcome == "pinned":
        console.print(
            line(
                ("!", "yellow"),
                f" {record.version} was built and verified but not made live: {record.error}; "
                f"`bulldozer rollback {record.alias} --to {record.version}` makes it live now, "
                f"`bulldozer unpin {record.alias}` lets the next run flip",
            )
        )
        return
    seconds = sum(record.timings.values())
    if record.mode == "delta":
        d = record.delta
        ok(
            f"{record.alias} → {record.version}: {record.rows:,} rows from snapshot {record.snapshot_id} "
            f"in {seconds:.1f} s, a delta from {d['base']}: {d['rows_read']:,} rows read from "
            f"{d['files_removed'] + d['files_added'] + d.get('files_reread', 0)} changed files"
            + (f" and {by_key:,} records by key" if (by_key := d.get("deleted_by_key", 0)) else "")
            + f"; {d['added']:,} keys added, {d['changed']:,} changed, {d['deleted']:,} deleted"
        )
    else:
        rate = record.rows / record.timings.get("load", seconds) if record.timings.get("load") else 0
        ok(
            f"{record.alias} → {record.version}: {record.rows:,} rows from snapshot {record.snapshot_id} "
            f"in {seconds:.1f} s ({rate:,.0f} rows/s load)"
        )
        if record.full_reason:
            console.print(visible(f"  a full run: {record.full_reason}"))
    if record.taken_over_from:
        console.print(visible(f"  the alias now serves this job, taken over from the job {record.taken_over_from}"))
    if record.shadow_read:
        from bulldozer.load.shadow_read import ShadowReadReport

        console.print(visible(f"  shadow read: {ShadowReadReport.from_dict(record.shadow_read).summary()}"))
    if record.breaking_changes:
        console.print(
            line(
                "  ",
                ("breaking schema change", "yellow"),
                f": generation {record.schema_generation} (readers built for the previous one refuse it; regenerate "
                f"them): {'; '.join(record.breaking_changes)}",
            )
        )
    if record.retention_dropped:
        console.print(visible(f"  retention dropped: {', '.join(record.retention_dropped)}"))
    if record.retention_error:
        raise fail(
            f"{record.version} is live, but retention failed (older versions were kept): {record.retention_error}",
            RetentionError.exit_code,
        )


def _failure_json(
    record: RunRecord | None, exc: BulldozerError | KeyboardInterrupt, stage: str | None, version: str
) -> dict[str, Any]:
    """What ``run --json`` prints when the run fails or is stopped: the run record as far as
    it got (or what is known before one existed), with the failed stage, the version, the
    reason and the exit code."""
    from bulldozer.errors import SpecError

    data: dict[str, Any] = json.loads(record.to_json()) if record is not None else {"outcome": "failed"}
    before = "validate" if isinstance(exc, SpecError) else "connect"
    data["stage"] = (record.failed_stage if record is not None else "") or stage or before
    data["version"] = (record.version if record is not None else "") or version
    reason, code = (str(exc), exc.exit_code) if isinstance(exc, BulldozerError) else process.interruption(exc)
    data["reason"] = reason
    data["error_type"] = type(exc).__name__
    data["exit_code"] = code
    return data


def _run(
    client: KvClient,
    loaded: LoadedSpec,
    engine: EngineChoice,
    master: str | None,
    home: str | None,
    resume: str | None,
    as_json: bool,
    quiet: bool,
    stage: str | None,
    version: str | None,
    run_key: str | None,
    failures: list[RunRecord],
    allow_breaking: bool = False,
    take_over: bool = False,
) -> RunRecord | None:
    """The run (or one stage of it, whose outcome it prints itself: then None) with a progress bar."""
    from bulldozer.load.engines import create_load_engine
    from bulldozer.load.runner import run_job

    if master and engine is not EngineChoice.spark:
        raise InvalidArgumentError("--master applies to --engine spark only")
    if stage is None and (given := [f for f, v in (("--version", version), ("--run-key", run_key)) if v]):
        raise InvalidArgumentError(f"{' and '.join(given)} appl{'y' if len(given) > 1 else 'ies'} to --stage only")
    if stage is not None and resume:
        raise InvalidArgumentError("--resume applies to a whole run; a retried --stage load resumes by its --run-key")
    if stage in ("validate", "schema") and version:
        raise InvalidArgumentError(f"--version applies to the load, verify, flip and retention stages, not {stage}")
    for stages, options in (
        (("load",), (("--engine spark", engine is EngineChoice.spark), ("--master", master))),
        (("schema", "load"), (("--allow-breaking", allow_breaking), ("--take-over", take_over))),
    ):
        if stage is not None and stage not in stages and (given := [f for f, v in options if v]):
            raise InvalidArgumentError(
                f"{' and '.join(given)} appl{'y' if len(given) > 1 else 'ies'} to the {' and '.join(stages)} "
                f"stage{'s' if len(stages) > 1 else ''} (or a whole run), not {stage}"
            )
    load_engine = create_load_engine(engine.value, **({"master": master} if master else {}))
    if process.owned():
        process.use_load_memory_pool()
    with reporting("load", "rows", quiet=quiet or as_json) as progress:

        def on_stage(stage: str) -> None:
            if stage == "load":
                # Everything imported and built so far lives to the end of the run: keep the
                # collector from walking it again at every full collection during the load.
                process.started()
            progress.stage(stage)

        on_progress = progress.update

        try:
            if stage is not None:
                from bulldozer.load.runner import STAGES, run_stage

                if stage in STAGES:  # another is refused by run_stage, in one line
                    on_stage(stage)
                record = run_stage(
                    stage,
                    loaded,
                    client,
                    version=version,
                    run_key=run_key or "",
                    engine=load_engine,
                    home=home,
                    progress=on_progress,
                    allow_breaking=allow_breaking,
                    take_over=take_over,
                )
                if as_json:
                    print_json(with_store(client, json.loads(record.to_json())))
                else:
                    ok(f"{stage}: {record.version or record.alias}")
                return None
            return run_job(
                loaded,
                client,
                engine=load_engine,
                home=home,
                resume=resume,
                on_stage=on_stage,
                progress=on_progress,
                on_failure=failures.append,
                allow_breaking=allow_breaking,
                take_over=take_over,
            )
        except BulldozerError:
            raise
        except Exception as exc:  # an unexpected failure: one line, the version is already FAILED
            # a library's message may span lines (a YAML parser's does), and quote a traceback
            # (DuckDB's of a Python stream it read): one line, up to the traceback
            said = visible(" ".join(str(exc).partition("Traceback (most recent call last)")[0].split()))
            raise BulldozerError(f"run failed: {type(exc).__name__}: {said} (the alias was not moved)") from None
        finally:
            process.run_ended()


@handle_errors
def get(
    target: Annotated[str, typer.Argument(help="ALIAS or ALIAS@VERSION.", show_default=False)],
    key: Annotated[
        str, typer.Option(help='The key as JSON, e.g. \'{"user_id": 1, "item_id": 8}\'.', show_default=False)
    ],
    endpoint: Endpoint = None,
    home: Home = None,
    token: Token = None,
) -> None:
    """Read one value and print it as JSON, decoded with the version's own stored schema.

    Dates, times and timestamps are ISO-8601, uuids text, int64 numbers (see README); the
    key is written the same way."""
    from bulldozer.schema.decode import ReadableJson, parse_key

    try:
        key_data = parse_key(key)
    except InvalidArgumentError as exc:
        raise fail(f"--key: {exc}", 2) from None
    with open_client(endpoint, home, token=token) as client:  # the value alone on stdout; the store on stderr
        alias, name, info, key_cls, value_cls = open_version(client, target)
        readable = ReadableJson(info.value_descriptor_set)
        try:
            key_bytes = readable.key_bytes(key_cls, key_data)
        except InvalidArgumentError as exc:
            raise fail(f"--key: {exc}", 2) from None
        value = client.get(key_bytes, alias=f"{alias}@{name}")
        if value is None:
            raise fail(f"no value for that key in {name}", 4)
    print_json(readable.decode(value_cls, value))


@handle_errors
def runs(
    alias: Annotated[str, typer.Argument(help="The alias whose runs to list.", show_default=False)],
    endpoint: Endpoint = None,
    home: Home = None,
    as_json: Json = False,
    output: Output = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Only the newest N runs (default: all).", show_default=False)
    ] = None,
) -> None:
    """List the runs of an alias, newest first, with their outcome, rows and timings.

    The runs refused before they loaded (an invalid spec or a breaking schema) are listed
    too, with the reason."""
    from dataclasses import asdict

    from bulldozer.versioning.run_state import run_record_of

    fmt = output_format(output, as_json)
    with open_client(endpoint, home, fmt is Format.json) as client:
        namespaces = client.list_namespaces(alias)
        now = client.now()  # the DAL's: a run not heard from for a while is told stopped on it
    rows: list[dict[str, Any]] = []
    for ns in list(reversed(namespaces))[:limit]:
        run = run_record_of(ns, now)
        rows.append({"version": ns.name, "state": ns.state.value, **(asdict(run) if run else {})})
    columns = [
        Column.version("version", "version"),
        Column("state", lambda r: r["state"]),
        Column("outcome", lambda r: r.get("outcome", "?")),
        Column("rows", lambda r: r.get("rows", 0), lambda v: f"{v:,}", "right"),
        Column("seconds", lambda r: sum(r.get("timings", {}).values()), lambda v: f"{v:.1f}", "right"),
        Column("started (UTC)", lambda r: r.get("started", ""), fmt_time, wide_only=True),
        Column("snapshot", lambda r: r.get("snapshot_id", ""), wide_only=True),
        Column("mode", lambda r: r.get("mode", "full"), wide_only=True),
        Column("shadow read", _shadow_summary, wide_only=True),
        Column("error", lambda r: r.get("error", ""), max_width=30),
    ]
    emit(rows, columns, fmt, f"runs of {alias}", with_store(client, rows))


def _shadow_summary(run: dict[str, Any]) -> str:
    """The shadow read's fractions, e.g. ``-0.2% +1.0% ~3.1% of 1,000``, or nothing."""
    shadow = run.get("shadow_read") or {}
    if not shadow:
        return ""
    return (
        f"-{shadow['missing_fraction']:.1%} +{shadow['added_fraction']:.1%} "
        f"~{shadow['changed_fraction']:.1%} of {shadow['sampled']:,}"
    )


@handle_errors
def plan(
    spec: Annotated[Path, typer.Argument(help="Job spec (YAML).", show_default=False)],
    endpoint: Annotated[
        str | None, typer.Option(help="Override the spec's endpoint: embedded or HOST:PORT.", show_default=False)
    ] = None,
    home: Annotated[str | None, typer.Option(help=HOME_HELP, show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    engine: Annotated[
        EngineChoice, typer.Option(help="The engine to estimate (from its own earlier runs).")
    ] = EngineChoice.local,
) -> None:
    """Dry run: what a run would move, how long it would take and what it would change.

    The rows and bytes a run would move, its estimated time (from the rate an earlier run on
    the same engine measured), the schema diff against the live version, and which versions
    retention would retire. Writes nothing. Exit 2 if the alias serves another job (a run
    needs --take-over), 3 if the schema change would break readers.
    """
    from bulldozer.kv.connect import connect_for_spec
    from bulldozer.load.plan import plan_run
    from bulldozer.spec.loader import load_spec

    loaded = load_spec(spec)
    with connect_for_spec(loaded, home, endpoint, create=False) as client:
        result = plan_run(loaded, client, home, engine.value)
    if not as_json:
        say_store(client)
    if as_json:
        print_json(with_store(client, result.as_dict()))
    else:
        console.print(
            line(
                (result.job, "bold"),
                f": {result.rows:,} rows ({result.bytes / 1024**2:,.1f} MiB in {result.files} files) "
                f"from {result.table} @ "
                + (
                    f"{loaded.spec.data_movement.ref} (snapshot {result.snapshot_id})"
                    if loaded.spec.data_movement.ref
                    else f"snapshot {result.snapshot_id}"
                ),
            )
        )
        if result.mode == "delta":
            by_key = f" and up to {result.delta_keys:,} keys' records by key" if result.delta_keys else ""
            console.print(
                f"  a delta from the live version: {result.delta_rows:,} rows in {result.delta_files} changed files"
                + by_key
            )
        elif result.full_reason:
            console.print(visible(f"  a full run: {result.full_reason}"))
        console.print(f"  estimated load on {result.engine}: {result.estimated_seconds:,.1f} s ({result.rate_source})")
        live = f"{result.live_version} ({result.live_rows:,} rows)" if result.live_version else "none yet"
        console.print(f"  live version: {live}")
        if result.other_job:
            console.print(
                line(
                    "  ",
                    ("refused", "red"),
                    f": the alias serves the job {result.other_job}, not this one "
                    "(`bulldozer run --take-over` hands it over)",
                )
            )
        if result.schema_differences:
            for d in result.schema_differences:
                colour = "red" if d["verdict"] == "refused" else "green"
                said = f" {d['path']}: {d['change']} ({d['detail']})"
                console.print(line("  schema: ", (d["verdict"], colour), said))
        else:
            console.print("  schema: no change" if result.live_version else "  schema: first version")
        if result.retention_drops_now:
            console.print(f"  retention would drop now: {', '.join(result.retention_drops_now)}")
        if result.retention_drops_after_grace:
            console.print(
                f"  retention would drop after the grace period: {', '.join(result.retention_drops_after_grace)}"
            )
    if result.other_job:
        raise typer.Exit(2)
    if result.schema_breaking:
        raise typer.Exit(3)
