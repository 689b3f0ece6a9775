"""What a client says of a DAL it cannot reach (``bulldozer.kv._transports``): gRPC's error
of the first connection attempt, read from an UNAVAILABLE call's details, and the failures
no wait can mend; ``bulldozer.sockets.speaks_tls`` and ``client_refusal`` against real
listeners."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest

from bulldozer.kv._transports import _attempt_error, _lost_cause
from bulldozer.sockets import client_refusal, speaks_tls
from tests.listeners import loopback_listener


@pytest.mark.parametrize(
    ("details", "error"),
    [
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote "
            "host: Connection refused",
            "Failed to connect to remote host: Connection refused",
        ),
        (
            "failed to connect to all addresses; last error: UNAVAILABLE: ipv6:[::1]:7110: Socket closed",
            "Socket closed",
        ),
        ("Socket closed", "Socket closed"),  # not of gRPC's form: as it is
    ],
)
def test_the_attempt_s_error_is_read_from_the_details(details: str, error: str) -> None:
    assert _attempt_error(details) == error


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (
            "Failed parsing HTTP/2 (Expected SETTINGS frame as the first frame, got frame type 79)",
            "answered in another protocol than gRPC's (HTTP/2): Failed parsing HTTP/2 (Expected SETTINGS frame as the "
            "first frame, got frame type 79); is that the DAL's port, and not a web server's?",
        ),
        (
            "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
            "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate: OK",
            "refused the TLS handshake: CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate; its "
            "certificate is not signed by a CA the client trusts (BULLDOZER_TLS_CA)",
        ),
        (
            "Ssl handshake failed: SSL_ERROR_SSL: error:1000042e:SSL routines:OPENSSL_internal:"
            "TLSV1_ALERT_PROTOCOL_VERSION",
            "refused the TLS handshake: TLSV1_ALERT_PROTOCOL_VERSION",
        ),
        ("Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SYSCALL", None),  # the connection failed: waited
        ("Failed to connect to remote host: Connection refused", None),  # a DAL starting: waited for
        ("Socket closed", None),
        ("", None),
    ],
)
def test_only_what_no_wait_mends_is_a_lost_cause(error: str, said: str | None) -> None:
    assert _lost_cause(error) == said


def test_speaks_tls(tmp_path: Path) -> None:
    from tests.integration.test_security import make_pki

    pki = make_pki(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "server.pem", pki / "server.key")
    with loopback_listener(tls=context) as tls:
        assert speaks_tls(tls)
    context.verify_mode = ssl.CERT_REQUIRED  # wants a client certificate the probe does not have
    context.load_verify_locations(pki / "ca.pem")
    with loopback_listener(tls=context) as mutual:
        assert speaks_tls(mutual)
    with loopback_listener(b"HTTP/1.1 400 Bad Request\r\n\r\n") as web:
        assert not speaks_tls(web)
    with loopback_listener() as closing:
        assert not speaks_tls(closing)
    gone = socket.create_server(("127.0.0.1", 0))
    port = gone.getsockname()[1]
    gone.close()
    assert not speaks_tls(f"127.0.0.1:{port}")
    assert not speaks_tls("not an address")


def test_client_refusal(tmp_path: Path) -> None:
    """A TLS server that requires a client certificate it trusts: its alert for a client
    without one, or with one of another CA, is named; one that takes the client (it answers,
    as gRPC's sends its HTTP/2 settings) is no refusal; one that closes without a word after
    the handshake (gRPC's under TLS 1.3) is "closed"; no verdict where none can be had."""
    from tests.integration.test_security import make_pki

    pki = make_pki(tmp_path)
    ca = (pki / "ca.pem").read_bytes()
    loader = (pki / "loader.pem").read_bytes(), (pki / "loader.key").read_bytes()
    rogue = (pki / "rogue-loader.pem").read_bytes(), (pki / "rogue-loader.key").read_bytes()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "server.pem", pki / "server.key")
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(pki / "ca.pem")
    settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an HTTP/2 server's first frame
    received: list[bytes] = []
    with loopback_listener(settings, tls=context, received=received) as mutual:
        # the alert, or (1 time in 30 here) the close that came with it: the server reset the
        # connection with the client's first bytes unread, which can drop the alert unread too
        assert client_refusal(mutual, ca, None, None) in ("TLSV13_ALERT_CERTIFICATE_REQUIRED", "closed")
        assert client_refusal(mutual, ca, *rogue) in ("TLSV1_ALERT_UNKNOWN_CA", "closed")
        assert client_refusal(mutual, ca, *loader) is None
        assert received[-1].startswith(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # as an HTTP/2 client starts
        # a server certificate the given CA did not sign: no verdict (the probe went no further)
        assert client_refusal(mutual, (pki / "rogue-ca.pem").read_bytes(), *loader) is None
    with loopback_listener(tls=context) as silent:  # takes the handshake, then closes without a word
        assert client_refusal(silent, ca, *loader) == "closed"
    with loopback_listener(b"HTTP/1.1 400 Bad Request\r\n\r\n") as web:
        assert client_refusal(web, ca, *loader) is None
    gone = socket.create_server(("127.0.0.1", 0))
    port = gone.getsockname()[1]
    gone.close()
    assert client_refusal(f"127.0.0.1:{port}", ca, *loader) is None
    assert client_refusal("not an address", ca, None, None) is None
    assert client_refusal(mutual, b"not PEM", *loader) is None
