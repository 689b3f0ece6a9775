"""``bulldozer ui``: the web console, served by one command."""

from __future__ import annotations

import signal
from typing import Annotated

import typer

from bulldozer.cli.common import Endpoint, Home, Token, err_console, fail, handle_errors, line, open_client


@handle_errors
def ui(
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free one).")] = 8765,
    endpoint: Endpoint = None,
    home: Home = None,
    token: Token = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            help="A host name browsers reach the console by (repeatable; '*.example.com' matches a domain). "
            "Default: loopback's names, the address listened on, and this machine's names when it listens on all.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve the web console: aliases, versions, runs, key lookups, rollback and pin.

    It reads and acts through the DAL like every other command (same profile, endpoint,
    TLS and token; the DAL's ACLs apply). Whoever reaches the page acts with that token:
    keep it on loopback, or put it behind your own access control. A request naming another
    host (``Host``) is refused, so a web page cannot reach the console by pointing its own
    name at this machine (DNS rebinding).
    """
    import socket

    import uvicorn

    from bulldozer.console import create_app
    from bulldozer.sockets import LOOPBACK_HOSTS, is_loopback

    hosts = [*LOOPBACK_HOSTS, f"[{host}]" if ":" in host else host, *(allowed_host or [])]
    if host in ("0.0.0.0", "::", ""):  # every address: the machine's own names too
        hosts += [socket.gethostname(), socket.getfqdn()]
    if not is_loopback(host):
        err_console.print(
            line(("!", "yellow"), f" the console listens on {host}: anyone who reaches it acts with this token")
        )
        err_console.print(f"console: answers requests for {', '.join(dict.fromkeys(hosts))}")
    # it serves on while runs make versions: it acts on the store they make, not an empty one
    with open_client(endpoint, home, create=True, token=token) as client:
        client.list_aliases()  # a DAL that refuses the token or does not answer fails here, in one line
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise fail(f"cannot listen on {host}:{port}: {exc.strerror}", 2) from None
        bound = sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        err_console.print(f"console: http://{shown}:{bound}/  (Ctrl-C stops it)")
        app = create_app(client, [h.lower() for h in dict.fromkeys(hosts)])
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        hung_up: list[int] = []

        def on_hangup(signum: int, _frame: object) -> None:  # uvicorn stops gracefully on SIGTERM / SIGINT only
            hung_up.append(signum)
            server.should_exit = True

        previous = signal.signal(signal.SIGHUP, on_hangup)
        try:
            server.run(sockets=[sock])
        finally:
            signal.signal(signal.SIGHUP, previous)
        if hung_up:  # stopped gracefully; now ended as any command whose terminal hung up
            signal.raise_signal(signal.SIGHUP)
