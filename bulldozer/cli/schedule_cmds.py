"""``bulldozer submit`` and ``bulldozer jobs``: the specs folder the scheduler reads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from bulldozer.cli.common import HOME_HELP, console, handle_errors, ok, print_json
from bulldozer.cli.output import Column, Format, Output, emit, output_format

SPECS_HELP = "Specs folder (default $BULLDOZER_SPECS_DIR, else $BULLDOZER_HOME/specs)."


@handle_errors
def submit(
    spec: Annotated[Path, typer.Argument(help="Job spec (YAML).", show_default=False)],
    specs_dir: Annotated[Path | None, typer.Option(help=SPECS_HELP, show_default=False)] = None,
    home: Annotated[str | None, typer.Option(help=HOME_HELP, show_default=False)] = None,
    no_catalog: Annotated[
        bool, typer.Option("--no-catalog", help="Skip the check against the Iceberg catalog.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    take_over: Annotated[
        bool,
        typer.Option(
            "--take-over",
            help="Replace a submitted job of the same name whose owner is another (refused otherwise).",
        ),
    ] = False,
) -> None:
    """Validate a spec against its catalog and place it where the scheduler picks it up.

    That is the specs folder, where the Airflow DAG loader (dags/bulldozer_dags.py) turns
    it into a scheduled DAG.

    The file is written under a temporary name and renamed into place, so the scheduler
    never reads half a spec. Submitting a spec again replaces it; replacing a job another
    owner submitted needs --take-over, and a second job with the same name, or the same
    alias, from another file is refused.
    """
    from bulldozer.schedule.jobs import submit as place

    target = place(spec, home=home, folder=specs_dir, check_catalog=not no_catalog, take_over=take_over)
    if as_json:
        print_json({"submitted": str(target)})
    else:
        ok(f"submitted {spec} as {target}")


@handle_errors
def jobs(
    specs_dir: Annotated[Path | None, typer.Option(help=SPECS_HELP, show_default=False)] = None,
    home: Annotated[str | None, typer.Option(help=HOME_HELP, show_default=False)] = None,
    offline: Annotated[bool, typer.Option("--offline", help="Do not ask the DAL for versions and runs.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
    output: Output = None,
) -> None:
    """List submitted jobs: alias, schedule, current version and the last run's outcome."""
    from bulldozer.schedule.jobs import list_jobs, specs_folder

    fmt = output_format(output, as_json)
    folder = specs_dir or specs_folder(home)
    found = [j.as_dict() for j in list_jobs(folder, home=home, with_state=not offline)]
    if not found and fmt is Format.table:
        console.print(f"no jobs submitted in {folder}")
        return

    def last_run(job: dict[str, Any]) -> str:
        if job.get("error"):
            return f"invalid: {job['error']}"
        last = job.get("last_run") or {}
        return f"{last.get('outcome', '')} {last.get('finished') or last.get('started', '')}".strip() or "-"

    columns = [
        Column("job", lambda j: j["name"], max_width=24),
        Column("alias", lambda j: j["alias"], max_width=24, wide_only=True),
        Column("schedule", _schedule_text, max_width=30),
        Column.version("version", "current_version"),
        Column("last run", last_run, max_width=30),
        Column("store", lambda j: j["store"] or "-", wide_only=True),
        Column("file", lambda j: j["file"], wide_only=True),
    ]
    emit(found, columns, fmt, f"jobs in {folder}", found)


def _schedule_text(job: dict[str, Any]) -> str:
    """A job's schedule with its time zone where it is not UTC ("0 6 * * * Europe/Berlin")."""
    if not job["schedule"]:
        return "-"
    return job["schedule"] if job.get("timezone", "UTC") == "UTC" else f"{job['schedule']} {job['timezone']}"
