"""What a client says of a DAL it cannot reach (``bulldozer.kv._transports``): gRPC's error
of the first connection attempt, read from an UNAVAILABLE call's details, and the failures
no wait can mend; ``bulldozer.sockets.speaks_tls`` against real listeners."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest

from bulldozer.kv._transports import _attempt_error, _lost_cause
from bulldozer.sockets import speaks_tls
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
