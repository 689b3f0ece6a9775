"""``bulldozer serve``: run a KV DAL server."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from bulldozer.cli.common import handle_errors
from bulldozer.errors import InvalidArgumentError
from bulldozer.kv.server.native import DataPlane
from bulldozer.kv.v1 import shared
from bulldozer.redaction import yaml_problem, yaml_where
from bulldozer.sockets import SOCKET_PATH_MAX, fits, is_loopback, tcp_refusal


class EngineName(StrEnum):
    embedded = "embedded"
    memory = "memory"
    redis = "redis"
    cassandra = "cassandra"


class LogFormat(StrEnum):
    text = "text"
    json = "json"


@handle_errors
def serve(
    engine: Annotated[
        EngineName | None,
        typer.Option(help="Storage engine (default: --engine-config's type, else embedded)."),
    ] = None,
    path: Annotated[
        Path | None,
        typer.Option(help="Store directory for the embedded engine (default $BULLDOZER_HOME/kv)."),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="gRPC port (0 picks a free one).")] = 7110,
    map_size_gib: Annotated[
        float | None,
        typer.Option(
            "--map-size-gib",
            min=0.001,
            help="Largest size of the embedded store (default 64, or a quarter of the address-space limit: ulimit -v).",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Serve Prometheus metrics on this port.")
    ] = None,
    metrics_host: Annotated[
        str,
        typer.Option(
            help="Address the metrics listen on (loopback by default, where a request naming another host is "
            "refused); e.g. 0.0.0.0 for a Prometheus on another machine."
        ),
    ] = "127.0.0.1",
    log_format: Annotated[LogFormat, typer.Option(help="Log lines as text or JSON.")] = LogFormat.text,
    grace: Annotated[float, typer.Option(min=0, help="Seconds in-flight requests get to finish on SIGTERM.")] = 30.0,
    max_writes_in_flight: Annotated[
        int,
        typer.Option(
            min=1,
            help="Write calls taken at once; one more is refused as busy before its batch is read, and the loader "
            "sends it again after a pause: a DAL's memory for writes stays bounded (README: the KV DAL).",
        ),
    ] = shared.LIMITS_MAX_WRITES_IN_FLIGHT,
    writemap: Annotated[
        bool,
        typer.Option(
            "--writemap",
            help="Embedded engine: write pages in place (~1.8x faster random-key loads, measured when commits "
            "were not flushed); not covered by the machine-crash test. Off by default.",
        ),
    ] = False,
    port_file: Annotated[
        Path | None, typer.Option(help="Write the bound port here once listening (for --port 0).", show_default=False)
    ] = None,
    parent_pid: Annotated[
        int | None,
        typer.Option(help="Stop gracefully when this process (the one that started the DAL) exits.", hidden=True),
    ] = None,
    unix_socket: Annotated[
        Path | None,
        typer.Option(
            help="Listen on this Unix socket instead of --host/--port (same machine only).", show_default=False
        ),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(help="Redis: redis://host:port/db of the server (any node in cluster mode).", show_default=False),
    ] = None,
    cluster: Annotated[bool, typer.Option("--cluster", help="Redis: talk Redis Cluster.")] = False,
    prefix: Annotated[
        str | None, typer.Option(help="Redis: key prefix Bulldozer owns (default bulldozer).", show_default=False)
    ] = None,
    contact_point: Annotated[
        list[str] | None,
        typer.Option(help="Cassandra: a seed host (repeat for several; default 127.0.0.1).", show_default=False),
    ] = None,
    cql_port: Annotated[
        int | None, typer.Option(help="Cassandra: native protocol port (default 9042).", show_default=False)
    ] = None,
    keyspace: Annotated[
        str | None, typer.Option(help="Cassandra: keyspace Bulldozer owns (default bulldozer).", show_default=False)
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(help="Serve TLS with this certificate (PEM).", show_default=False)
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option(help="The certificate's private key (PEM).", show_default=False)
    ] = None,
    tls_client_ca: Annotated[
        Path | None,
        typer.Option(help="Require client certificates signed by this CA (mutual TLS).", show_default=False),
    ] = None,
    auth_config: Annotated[
        Path | None,
        typer.Option(
            help="Principals (bearer-token hashes or certificate names) and their per-alias permissions "
            "(read, write, flip, admin); every call is then authenticated. See bulldozer/kv/server/auth.py.",
            show_default=False,
        ),
    ] = None,
    allow_unauthenticated: Annotated[
        bool,
        typer.Option(
            "--allow-unauthenticated",
            help="Serve without authentication on purpose: on a --host other than loopback (refused otherwise: "
            "every machine that reaches it could read, drop and flip), or a store that was served with "
            "--auth-config (it remembers that, so a secured store is not opened to everyone by a forgotten flag).",
        ),
    ] = False,
    data_plane: Annotated[
        DataPlane | None,
        typer.Option(
            show_default=False,
            help="[default: $BULLDOZER_DATA_PLANE, else auto] "
            "Who answers batch puts, gets and batch gets: 'native' = bulldozer-kvd (Go, built by "
            "scripts/build_native.sh) reading and writing the embedded store itself, in front of this DAL, which "
            "keeps every other call; 'python' = this DAL alone; 'auto' = native for the embedded engine without "
            "TLS or auth when the binary is built.",
        ),
    ] = None,
    engine_config: Annotated[
        Path | None,
        typer.Option(
            help="YAML or JSON file with the engine's settings (type: redis|cassandra|embedded plus any of "
            "its options, e.g. consistency levels, credentials, timeouts); flags above override it.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve the KV DAL over gRPC until SIGTERM / Ctrl-C (then stop gracefully).

    Health checking (grpc.health.v1) and reflection are on, so grpcurl works against it.
    Several processes may serve one store: LMDB serializes their writes (embedded), the
    alias compare-and-set is a Lua script (Redis) or a lightweight transaction (Cassandra).

    \b
    Examples:
      bulldozer serve                       # the store in $BULLDOZER_HOME/kv
      bulldozer serve --engine redis --url redis://cache-1:6379/0 --cluster
      bulldozer serve --engine cassandra --contact-point c1 \\
          --contact-point c2 --keyspace features
      bulldozer serve --engine-config cassandra.yaml  # consistency, credentials
    """
    from bulldozer.kv.backends import create_engine
    from bulldozer.kv.server import serve as run
    from bulldozer.logs import configure_logging
    from bulldozer.settings import load_settings
    from bulldozer.warehouse.catalog import bulldozer_home

    configure_logging("info", log_format.value)
    config: dict[str, object] = (
        _read_engine_config(engine_config) if engine_config else {"type": (engine or EngineName.embedded).value}
    )
    kind = config["type"]
    if engine is not None and engine.value != kind:
        raise InvalidArgumentError(f"--engine {engine.value} and --engine-config's type {kind} disagree: give one")
    embedded_only = {"--path": path, "--map-size-gib": map_size_gib, "--writemap": writemap or None}
    if kind == "embedded":  # a flag overrides the file, as for every engine's flags
        config["path"] = str(path) if path is not None else config.get("path", str(bulldozer_home() / "kv"))
        if map_size_gib is not None:
            config["map_size"] = int(map_size_gib * 1024**3)
        if writemap:
            config["writemap"] = True
    elif given := [flag for flag, value in embedded_only.items() if value is not None]:
        raise InvalidArgumentError(f"{', '.join(given)}: the embedded engine's, not the {kind} engine's")
    flags = {
        "url": url,
        "cluster": cluster or None,
        "prefix": prefix,
        "contact_points": contact_point or None,
        "port": cql_port,
        "keyspace": keyspace,
    }
    config.update({k: v for k, v in flags.items() if v is not None})
    from bulldozer.kv.server.auth import load_auth_config, server_credentials

    if (tls_cert is None) != (tls_key is None):
        raise InvalidArgumentError("--tls-cert and --tls-key go together")
    if tls_client_ca is not None and tls_cert is None:
        raise InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key")
    if unix_socket is not None and not fits(unix_socket):
        raise InvalidArgumentError(
            f"--unix-socket {unix_socket}: a Unix socket's path holds at most {SOCKET_PATH_MAX} bytes, this one "
            f"{len(os.fsencode(unix_socket))}; give a shorter one"
        )
    if unix_socket is None and port and (refused := tcp_refusal(host, port)):
        raise InvalidArgumentError(refused)
    if unix_socket is None and not is_loopback(host) and not (auth_config or tls_client_ca or allow_unauthenticated):
        raise InvalidArgumentError(
            f"--host {host} serves the store to every machine that reaches this one, and without --auth-config "
            "(or --tls-client-ca) any of them could read it, drop its versions and move its aliases: give "
            "--auth-config, or --allow-unauthenticated to serve it so on purpose (behind a firewall, say)"
        )
    credentials = server_credentials(tls_cert, tls_key, tls_client_ca) if tls_cert and tls_key else None
    auth = load_auth_config(auth_config) if auth_config else None
    from bulldozer.kv.server.rules import Limits

    code = run(
        f"unix:{unix_socket}" if unix_socket is not None else f"{host}:{port}",
        create_engine(config),
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        grace=grace,
        port_file=port_file,
        parent_pid=parent_pid,
        credentials=credentials,
        auth=auth,
        data_plane=(data_plane or DataPlane(load_settings().data_plane)).value,
        allow_unauthenticated=allow_unauthenticated,
        limits=Limits(max_writes_in_flight=max_writes_in_flight),
    )
    # Exit now: request threads that outlived the grace period must not hold the process
    # (everything is flushed; the store is consistent at every committed transaction).
    import logging
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _read_engine_config(path: Path) -> dict[str, object]:
    import yaml

    from bulldozer.config_files import load_yaml

    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise InvalidArgumentError(
            f"{yaml_where(path, exc)}: cannot read the engine configuration: {yaml_problem(exc)}"
        ) from None
    except OSError as exc:
        raise InvalidArgumentError(f"{path}: cannot read the engine configuration: {exc}") from exc
    if not isinstance(data, dict) or "type" not in data:
        raise InvalidArgumentError(f"{path}: the engine configuration must be a mapping with a 'type'")
    return dict(data)
