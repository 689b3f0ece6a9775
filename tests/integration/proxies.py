"""A TCP proxy on loopback for tests: it forwards each connection to a server on another
port, can stop forwarding (a network stall) and resume, and can serve its side over TLS
(a server behind an HTTPS front)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time


class Proxy:
    """Forwards connections on ``port`` to 127.0.0.1:``upstream``; with ``tls``, a server
    context, each connection's TLS handshake first (one refused is counted in
    ``handshakes_refused`` and closed). Clearing ``flowing`` holds the bytes in flight."""

    def __init__(self, upstream: int, tls: ssl.SSLContext | None = None) -> None:
        self.upstream, self.tls = upstream, tls
        self.flowing = threading.Event()
        self.flowing.set()
        self.handshakes_refused = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(downstream,), daemon=True).start()

    def _connect(self, downstream: socket.socket) -> None:
        if self.tls is not None:
            try:
                downstream = self.tls.wrap_socket(downstream, server_side=True)
            except (OSError, ssl.SSLError):
                self.handshakes_refused += 1
                downstream.close()
                return
        upstream = socket.create_connection(("127.0.0.1", self.upstream))
        for a, b in ((downstream, upstream), (upstream, downstream)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                while not self.flowing.is_set():
                    time.sleep(0.01)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.close()

    def close(self) -> None:
        self.closed = True
        self.listener.close()
