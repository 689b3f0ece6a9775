"""``bulldozer serve``: run a KV DAL server."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from bulldozer.cli.common import handle_errors


class EngineName(StrEnum):
    embedded = "embedded"
    memory = "memory"


class LogFormat(StrEnum):
    text = "text"
    json = "json"


@handle_errors
def serve(
    engine: Annotated[EngineName, typer.Option(help="Storage engine.")] = EngineName.embedded,
    path: Annotated[
        Path | None,
        typer.Option(help="Store directory for the embedded engine (default $BULLDOZER_HOME/kv)."),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="gRPC port (0 picks a free one).")] = 7110,
    map_size_gib: Annotated[
        float, typer.Option("--map-size-gib", min=0.001, help="Largest size of the embedded store.")
    ] = 64.0,
    metrics_port: Annotated[int | None, typer.Option(help="Serve Prometheus metrics on this port.")] = None,
    log_format: Annotated[LogFormat, typer.Option(help="Log lines as text or JSON.")] = LogFormat.text,
    grace: Annotated[float, typer.Option(help="Seconds in-flight requests get to finish on SIGTERM.")] = 30.0,
    writemap: Annotated[
        bool,
        typer.Option(
            "--writemap",
            help="Embedded engine: write pages in place (~1.8x faster random-key loads); an OS crash between "
            "syncs can then corrupt the store. Off by default.",
        ),
    ] = False,
    port_file: Annotated[
        Path | None, typer.Option(help="Write the bound port here once listening (for --port 0).", show_default=False)
    ] = None,
) -> None:
    """Serve the KV DAL over gRPC until SIGTERM / Ctrl-C (then stop gracefully).

    Health checking (grpc.health.v1) and reflection are on, so grpcurl works against it.
    Several processes may serve one embedded store: LMDB serializes their writes and the
    alias compare-and-set is atomic in the store.
    """
    from bulldozer.kv.backends import create_engine
    from bulldozer.kv.server import serve as run
    from bulldozer.logs import configure_logging
    from bulldozer.warehouse.catalog import bulldozer_home

    configure_logging("info", log_format.value)
    if engine is EngineName.embedded:
        store = path or bulldozer_home() / "kv"
        config = {"type": "embedded", "path": str(store), "map_size": int(map_size_gib * 1024**3), "writemap": writemap}
    else:
        config = {"type": "memory"}
    code = run(f"{host}:{port}", create_engine(config), metrics_port=metrics_port, grace=grace, port_file=port_file)
    # Exit now: request threads that outlived the grace period must not hold the process
    # (everything is flushed; the store is consistent at every committed transaction).
    import logging
    import os
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
