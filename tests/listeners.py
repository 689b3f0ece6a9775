"""A loopback listener for the tests of what a client makes of what answers it (a Spark
master URL's probe, a DAL endpoint's connection errors)."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress


@contextmanager
def loopback_listener(
    answer: bytes | None = None,
    *,
    tls: ssl.SSLContext | None = None,
    hold: bool = False,
    received: list[bytes] | None = None,
) -> Iterator[str]:
    """A listener on 127.0.0.1 (its ``host:port``), one connection at a time: it reads what
    the client sends first (kept in ``received``) and answers ``answer`` — with ``tls``, as a
    TLS server, after the handshake. With ``hold`` each connection stays open until the
    listener closes (unanswered, with no ``answer``: as a Spark master holds a probe);
    without, it is closed after."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop, held = threading.Event(), []

    def exchange(connection: socket.socket) -> None:
        got = connection.recv(512)
        if received is not None:
            received.append(got)
        if answer is not None:
            connection.sendall(answer)

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            connection.settimeout(2.0)
            with suppress(OSError):
                if tls is not None:
                    with tls.wrap_socket(connection, server_side=True) as wrapped:
                        exchange(wrapped)
                else:
                    exchange(connection)
            if hold:
                held.append(connection)
            else:
                connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        listener.close()
        for connection in held:
            connection.close()
