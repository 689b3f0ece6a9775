"""Entry point of the ``bulldozer`` command."""

from __future__ import annotations

from typing import Annotated

from bulldozer.cli import process

process.before_imports()  # before anything imports numpy

import typer  # noqa: E402  (after the process tuning above)

from bulldozer._version import __version__  # noqa: E402
from bulldozer.cli import (  # noqa: E402
    loader_cmds,
    ops_cmds,
    proto_cmd,
    run_cmds,
    schedule_cmds,
    serve_cmd,
    spark_cmds,
    spec_cmds,
    ui_cmd,
    warehouse_cmds,
)

app = typer.Typer(
    name="bulldozer",
    help="Move warehouse (Iceberg) tables into an online key-value store as versioned "
    "namespaces, verified, then atomically switched to with an alias.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"bulldozer {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
    profile: Annotated[
        str | None,
        typer.Option(
            help="The named profile (endpoint, TLS files, token source, home) of the profiles file to use "
            "(default: $BULLDOZER_PROFILE, else the file's current one).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Bulldozer: batch data movement from Iceberg to a KV DAL."""
    from bulldozer.settings import select_profile

    select_profile(profile)
    if ctx.invoked_subcommand != "run":
        process.collect_again()  # a run does once it is set up


app.command("validate")(spec_cmds.validate)
app.command("init")(spec_cmds.init)
app.command("proto")(proto_cmd.proto)
app.command("client")(proto_cmd.client)
app.command("run")(run_cmds.run)
app.command("get")(run_cmds.get)
app.command("runs")(run_cmds.runs)
app.command("plan")(run_cmds.plan)
app.command("serve")(serve_cmd.serve)
app.command("submit")(schedule_cmds.submit)
app.command("jobs")(schedule_cmds.jobs)
app.command("namespaces")(ops_cmds.namespaces)
app.add_typer(ops_cmds.namespace_app, name="namespace")
app.add_typer(ops_cmds.alias_app, name="alias")
app.command("rollback")(ops_cmds.rollback)
app.command("pin")(ops_cmds.pin)
app.command("unpin")(ops_cmds.unpin)
app.command("gc")(ops_cmds.gc)
app.command("scan")(ops_cmds.scan)
app.command("ui")(ui_cmd.ui)
app.add_typer(warehouse_cmds.app, name="warehouse")
app.add_typer(loader_cmds.app, name="loader")
app.add_typer(spark_cmds.app, name="spark")


def main() -> None:
    process.claim()
    try:
        app()
    finally:
        process.exiting()


if __name__ == "__main__":
    main()
