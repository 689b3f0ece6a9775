"""``bulldozer submit`` and ``bulldozer jobs``: the specs folder the scheduler reads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bulldozer.cli.common import HOME_HELP, console, handle_errors, print_json

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
) -> None:
    """Validate a spec (against its catalog too) and place it in the specs folder, where the
    Airflow DAG loader (dags/bulldozer_dags.py) turns it into a scheduled DAG.

    The file is written under a temporary name and renamed into place, so the scheduler
    never reads half a spec. Submitting a spec again replaces it; a second job with the
    same name from another file is refused.
    """
    from bulldozer.schedule.jobs import submit as place

    target = place(spec, home=home, folder=specs_dir, check_catalog=not no_catalog)
    if as_json:
        print_json({"submitted": str(target)})
    else:
        console.print(f"[green]✓[/] submitted {spec} as {target}")


@handle_errors
def jobs(
    specs_dir: Annotated[Path | None, typer.Option(help=SPECS_HELP, show_default=False)] = None,
    home: Annotated[str | None, typer.Option(help=HOME_HELP, show_default=False)] = None,
    offline: Annotated[bool, typer.Option("--offline", help="Do not ask the DAL for versions and runs.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
) -> None:
    """List submitted jobs: alias, schedule, current version and the last run's outcome."""
    from rich.table import Table

    from bulldozer.schedule.jobs import list_jobs, specs_folder

    folder = specs_dir or specs_folder(home)
    found = list_jobs(folder, home=home, with_state=not offline)
    if as_json:
        print_json([j.as_dict() for j in found])
        return
    if not found:
        console.print(f"no jobs submitted in {folder}")
        return
    table = Table("job", "alias", "schedule", "current version", "last run", "store", box=None)
    for job in found:
        last = job.last_run or {}
        outcome = f"{last.get('outcome', '')} {last.get('finished') or last.get('started', '')}".strip()
        if job.error:
            outcome = f"[red]{job.error}[/]"
        table.add_row(
            job.name, job.alias, job.schedule or "-", job.current_version or "-", outcome or "-", job.store or "-"
        )
    console.print(table)
