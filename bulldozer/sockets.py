"""Where a server may listen: how long a Unix socket's path may be, how to reach one whose
path is longer, and whether a TCP address is free.

The kernel takes a socket's path in ``sun_path``: 108 bytes on Linux (104 on macOS), the
closing NUL included. A path deep in a scheduler's or a container's work folder does not
fit: a ``$TMPDIR`` of ~70 characters kept the embedded DAL from listening, a home of ~95 the
warm loader. Sockets another process dials by path (the DAL's: gRPC and ``bulldozer-kvd``
take an address, not a descriptor) go to a folder where the path fits
(``bulldozer.scratch.socket_root``); a socket this process binds or connects itself is
reached through a descriptor of its folder (``at_unix_path``).

Light at import (os and sys only): the warm loader's caller imports it on its way.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

__all__ = [
    "LOOPBACK_HOSTS",
    "SOCKET_PATH_MAX",
    "at_unix_path",
    "certificate_names",
    "client_refusal",
    "fits",
    "host_of",
    "host_port",
    "is_loopback",
    "speaks_tls",
    "tcp_refusal",
]

#: loopback's names, as an address to listen on or a request's ``Host`` gives them
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")

#: the longest path bind() and connect() take for a Unix socket: ``sun_path`` but its NUL
SOCKET_PATH_MAX = 107 if sys.platform.startswith("linux") else 103


def is_loopback(host: str) -> bool:
    """Is ``host`` (an address to listen on, or a ``Host`` header's name) this machine's
    loopback, reachable from this machine only?"""
    import ipaddress

    host = host.strip().lower()
    if host == "localhost":
        return True
    try:  # an address, not a name that starts like one ("127.0.0.1.example.com")
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


def host_of(header: str) -> str:
    """The name a ``Host`` header gives (``name[:port]``, ``[v6][:port]``), lower-cased,
    without its port; an IPv6 address keeps its brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def fits(path: str | Path) -> bool:
    """Can a Unix socket have the path ``path``?"""
    return len(os.fsencode(path)) <= SOCKET_PATH_MAX


def at_unix_path(path: str | Path, call: Callable[[str], None]) -> None:
    """``call`` (a socket's ``bind`` or ``connect``) with the Unix socket ``path``: the path
    itself when it fits, else through a descriptor of its folder held open for the call
    (``/proc/self/fd/N/NAME``, which the kernel resolves to the folder: Linux)."""
    name = os.fspath(path)
    if fits(name):
        call(name)
        return
    folder = os.open(os.path.dirname(name) or ".", os.O_PATH | os.O_DIRECTORY)
    try:
        call(f"/proc/self/fd/{folder}/{os.path.basename(name)}")
    finally:
        os.close(folder)


def tcp_refusal(host: str, port: int) -> str | None:
    """Why a server could not listen on ``host:port`` now (the port is in use, the host is
    not this machine's), or None when it could. Asked before a server starts, a port in use
    is one line, where each of the servers that try it (``bulldozer-kvd``, then gRPC) logged
    its own failure. Bound as gRPC binds (``SO_REUSEADDR``), so a port in TIME_WAIT is free."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        return f"cannot listen on {host}:{port}: {exc.strerror}"
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None


def host_port(address: str) -> tuple[str, int] | None:
    """``host:port`` or ``[v6]:port`` as ``socket.create_connection`` takes it; None when it is
    not of that form."""
    host, _, port = address.rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def _alert(exc: OSError) -> str | None:
    """The TLS alert a server sent, as OpenSSL names it (``TLSV1_ALERT_UNKNOWN_CA``), if the
    failure ``exc`` is one; None for any other."""
    reason = getattr(exc, "reason", None) or ""
    return reason if "ALERT" in reason else None


def speaks_tls(address: str, timeout: float = 2.0) -> bool:
    """Does what listens at ``address`` (``host:port``, ``[v6]:port``) answer a TLS client
    hello as a TLS server does: a server hello (the handshake completes; no certificate is
    checked, nothing is sent after it), or an alert of its own (one that wants a client
    certificate)? False for any other answer, none, or no connection."""
    import socket
    import ssl

    if (reached := host_port(address)) is None:
        return False
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])  # as a gRPC client asks: a server may refuse a hello without it
    try:
        with (
            socket.create_connection(reached, timeout=timeout) as raw,
            context.wrap_socket(raw, do_handshake_on_connect=False) as tls,
        ):
            tls.do_handshake()
    except ssl.SSLError as exc:
        return _alert(exc) is not None  # the server's own alert: a TLS server
    except OSError:
        return False
    return True


#: how an HTTP/2 client starts a connection: its preface, then its (empty) SETTINGS frame
_H2_START = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def certificate_names(
    address: str, ca: bytes | None, cert: bytes | None, key: bytes | None, timeout: float = 2.0
) -> list[str] | None:
    """The names (DNS names and IP addresses of its subject alternative names, else its
    common name) of the certificate the TLS server at ``address`` presents, checked against
    ``ca`` (else the system's CAs) but not against a host name, the client showing ``cert``
    and ``key`` (PEM) if given; None when it cannot be read (no connection, a handshake that
    failed, a chain not trusted)."""
    import socket
    import ssl

    if (reached := host_port(address)) is None:
        return None
    context = _client_context(ca, cert, key)
    if context is None:
        return None
    try:
        with (
            socket.create_connection(reached, timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=reached[0]) as tls,
        ):
            seen: dict[str, Any] = dict(tls.getpeercert() or {})  # ssl's decoded certificate
    except (ssl.SSLError, OSError):
        return None
    names = [str(value) for kind, value in seen.get("subjectAltName", ()) if kind in ("DNS", "IP Address")]
    common = [str(value) for part in seen.get("subject", ()) for kind, value in part if kind == "commonName"]
    return names or common or None


def _client_context(ca: bytes | None, cert: bytes | None, key: bytes | None) -> ssl.SSLContext | None:
    """A TLS client's context as a gRPC client makes one (HTTP/2 asked, the server's
    certificate checked against ``ca``, else the system's CAs; no host name checked: gRPC's
    handshake, which came first, did that), showing ``cert`` and ``key`` (PEM, read from
    memory: ``memfd_create``, not written to a file) if given; None when they do not load."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.set_alpn_protocols(["h2"])
    try:
        if ca:
            context.load_verify_locations(cadata=ca.decode("ascii"))
        else:
            context.load_default_certs()
        if cert and key:
            files: list[int] = []
            try:
                for data in (cert, key):  # one at a time: each is closed below, should the next fail
                    files.append(_in_memory(data))
                context.load_cert_chain(*(f"/proc/self/fd/{fd}" for fd in files))
            finally:
                for fd in files:
                    os.close(fd)
    except (ssl.SSLError, OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    return context


def client_refusal(
    address: str, ca: bytes | None, cert: bytes | None, key: bytes | None, timeout: float = 2.0
) -> str | None:
    """Does the TLS server at ``address`` (``host:port``) refuse a client that shows ``cert``
    and ``key`` (PEM; None: no certificate)? The handshake is made as a gRPC client makes it
    (HTTP/2 asked, the server's certificate checked against ``ca``, else the system's CAs),
    then an HTTP/2 connection is started (``_client_context``). A server that requires a client certificate it
    trusts refuses one without with an alert (its name is returned: TLS 1.2's handshake, or
    some servers under TLS 1.3) or, as gRPC's does under TLS 1.3, by closing the connection
    without a word after the handshake ("closed"). None: it answered (it took the client),
    or no verdict (no connection, a handshake that failed on the server's certificate, no
    answer within ``timeout``)."""
    import socket
    import ssl

    if (reached := host_port(address)) is None:
        return None
    context = _client_context(ca, cert, key)
    if context is None:
        return None
    try:
        raw = socket.create_connection(reached, timeout=timeout)
    except OSError:
        return None
    with raw:
        try:
            tls = context.wrap_socket(raw, server_hostname=reached[0])
        except ssl.SSLError as exc:  # the handshake failed: refused with an alert, or no verdict
            return _alert(exc)
        except OSError:
            return None
        with tls:  # the handshake is done: any close now is the server's answer to this client
            try:
                tls.sendall(_H2_START)
                answer = tls.recv(1)
            except ssl.SSLError as exc:
                if (alert := _alert(exc)) is not None:
                    return alert
                return "closed" if isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError) else None
            except (ConnectionResetError, BrokenPipeError):  # closed with the client's bytes unread
                return "closed"
            except OSError:  # no answer in time
                return None
    return None if answer else "closed"


def _in_memory(data: bytes) -> int:
    """A descriptor of an anonymous file in memory that holds ``data`` (the caller closes it)."""
    fd = os.memfd_create("bulldozer-tls")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        raise
    return fd
