"""``bulldozer warehouse ...``: the embedded sample warehouse."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from bulldozer.cli.common import handle_errors, ok, print_json

app = typer.Typer(
    help="The embedded Iceberg warehouse (SQLite catalog 'lake' + local folder).",
    no_args_is_help=True,
)


@app.command("sample")
@handle_errors
def sample(
    rows: Annotated[int, typer.Option(min=0, help="Rows in the sample table.")] = 100_000,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 7,
    variant: Annotated[int, typer.Option(min=0, help="Shift the values (not the keys) for a visibly new version.")] = 0,
    home: Annotated[
        str | None,
        typer.Option(
            help="Embedded state folder (default $BULLDOZER_HOME or ./.bulldozer).",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary.")] = False,
) -> None:
    """Create (or replace) the sample table sample.user_item_scores in the embedded catalog.

    Its columns cover every type Bulldozer maps: a composite long/int/string key, boolean,
    float, double, decimal, date, timestamp(tz), binary, uuid, nullable columns, a struct of
    struct, a list of struct, a map of string to struct and a map of string to map.
    """
    from bulldozer.warehouse.catalog import bulldozer_home, embedded_catalog_properties
    from bulldozer.warehouse.sample import SAMPLE_TABLE, create_sample_warehouse

    started = time.perf_counter()
    table = create_sample_warehouse(home, rows=rows, seed=seed, variant=variant)
    snapshot = table.current_snapshot()
    summary = {
        "table": f"lake.{SAMPLE_TABLE}",
        "rows": rows,
        "snapshot_id": snapshot.snapshot_id if snapshot else None,
        "home": str(bulldozer_home(home)),
        "catalog": embedded_catalog_properties(home),
        "seconds": round(time.perf_counter() - started, 2),
    }
    if as_json:
        print_json(summary)
    else:
        ok(
            f"lake.{SAMPLE_TABLE}: {rows:,} rows, snapshot {summary['snapshot_id']} "
            f"in {summary['home']} ({summary['seconds']} s)"
        )
