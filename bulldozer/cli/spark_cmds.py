"""``bulldozer spark ...``: what a Spark cluster needs to run Bulldozer's code."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bulldozer.cli.common import console, handle_errors, ok, print_json

app = typer.Typer(help="Spark: the executors' environment.", no_args_is_help=True)


@app.command("package")
@handle_errors
def package(
    output: Annotated[
        Path,
        typer.Option("--output", "-o", help="The archive to write (a zip)."),
    ] = Path("bulldozer-spark-env.zip"),
    compress: Annotated[
        bool, typer.Option(help="Deflate the archive (smaller to ship; --no-compress packs faster).")
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary.")] = False,
) -> None:
    """Pack Bulldozer and its runtime dependencies, as installed here, for Spark executors.

    The archive is a Python environment the executors run their workers from.

    Ship it with every Spark run by setting BULLDOZER_SPARK_ARCHIVE to the file: each
    worker node unpacks it once into its user's cache (~/.cache/bulldozer/spark-env) and
    the executors run their Python workers from it. The executors need the same Python
    (version and path) as this machine's base interpreter.
    """
    from bulldozer.load.engines.spark.package import ARCHIVE_DIR, build_archive

    packed = build_archive(output, compress=compress)
    archive_bytes = packed.path.stat().st_size
    summary = {
        "archive": str(packed.path.resolve()),
        "distributions": packed.distributions,
        "files": packed.files,
        "bytes": packed.bytes,
        "archive_bytes": archive_bytes,
        "seconds": round(packed.seconds, 2),
        "spark.archives": f"{packed.path.resolve().as_uri()}#{ARCHIVE_DIR}",
    }
    if as_json:
        print_json(summary)
        return
    ok(
        f"{summary['archive']}: {len(packed.distributions)} distributions, {packed.files:,} files "
        f"({packed.bytes / 1e6:,.0f} MB unpacked, {archive_bytes / 1e6:,.0f} MB packed) "
        f"in {summary['seconds']} s"
    )
    console.print(f"  ship it with every Spark run: export BULLDOZER_SPARK_ARCHIVE={summary['archive']}")
