"""The standalone master check's probe (``session._check_master``, ``_MasterProbe``): what
listens at a master URL, asked while the driver starts. A web server (the master's web UI
or REST server named instead of its own port) is known at once from the first part of a
frame of Spark's RPC protocol; a service that answers nothing to the whole frame, which a
Spark master answers at once, is known in ``_SILENT_SECONDS``; anything else is left for
Spark to judge."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from bulldozer.load.engines.spark import session
from bulldozer.load.engines.spark.session import _authenticates, _check_master, _web_answer
from tests.listeners import loopback_listener


@contextmanager
def _listening(answer: bytes | None) -> Iterator[str]:
    """A loopback service (its host:port) that answers ``answer`` to what a connection
    sends, or holds it unanswered (None), as a Spark master holds the probe."""
    received: list[bytes] = []
    with loopback_listener(answer, hold=True, received=received) as node:
        yield node
    assert received == [session._FRAME[:-1]], "the probe's first part is the frame but its last byte, nothing else"


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/html\r\n\r\n", "HTTP/1.1 400 Bad Request"),
        (b"<!DOCTYPE HTML>\n<html lang='en'>", "<!DOCTYPE HTML>"),  # a server taking it for HTTP/0.9
        (b"-ERR unknown command\r\n", None),  # no web server: Spark judges it (a minute)
        (b"\x15\x03\x03\x00\x02\x02\x16", None),  # a TLS alert: an RPC port with TLS may be a master's
        (None, None),  # silence: what a Spark master answers
    ],
)
def test_the_probe_names_a_web_server_and_leaves_anything_else_to_spark(answer: bytes | None, said: str | None) -> None:
    with _listening(answer) as node:
        probe = _check_master(f"spark://{node}")
        assert probe is not None and probe.node == node
        probe._thread.join(5)  # the driver's start would take this long
        assert probe.web_server() == said


def test_the_first_node_that_takes_a_connection_is_probed() -> None:
    with _listening(b"HTTP/1.0 404 Not Found\r\n\r\n") as node:
        closed = socket.create_server(("127.0.0.1", 0))
        gone = f"127.0.0.1:{closed.getsockname()[1]}"
        closed.close()
        probe = _check_master(f"spark://{gone},{node}")
        assert probe is not None and probe.node == node
        probe._thread.join(5)
        assert probe.web_server() == "HTTP/1.0 404 Not Found"
    assert _check_master("local[2]") is None


def test_a_silent_master_costs_the_driver_no_wait_past_the_probe_s_half_second() -> None:
    """The driver's JVM takes longer to start than ``_PROBE_SECONDS``: a silent master is
    not waited for past it (the probe's own read runs on for 2 s, on its thread)."""
    import time

    with _listening(None) as node:
        probe = _check_master(f"spark://{node}")
        assert probe is not None
        started = time.monotonic()
        assert probe.web_server() is None
        assert time.monotonic() - started < session._PROBE_SECONDS + 0.3


def test_a_web_server_answering_pythons_way_is_named() -> None:
    """http.server's handler answers the probe as an HTTP/0.9 request: the error page alone."""
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        probe = _check_master(f"spark://127.0.0.1:{web.server_address[1]}")
        assert probe is not None
        probe._thread.join(5)
        assert probe.web_server() == "<!DOCTYPE HTML>"
    finally:
        web.shutdown()
        web.server_close()


@pytest.mark.parametrize(
    ("answer", "said"),
    [(b"  HTTP/2 400\n", "HTTP/2 400"), (b"<html><body>", "<html><body>"), (b"", None), (b"SSH-2.0-OpenSSH\r\n", None)],
)
def test_web_answer(answer: bytes, said: str | None) -> None:
    assert _web_answer(answer) == said


def test_the_probe_s_frame_is_a_stream_request_holding_a_blank_line() -> None:
    """What a master parses (network-common's MessageEncoder): the frame's length counting
    its own 8 bytes, the type StreamRequest (6), the stream id's length and the id; the id
    holds the blank line a web server answers, before the last byte held back."""
    frame = session._FRAME
    assert int.from_bytes(frame[:8], "big") == len(frame) and frame[8] == 6
    assert int.from_bytes(frame[9:13], "big") == len(frame) - 13 and frame[13:].startswith(b"/files/")
    assert b"\r\n\r\n" in frame[:-1]


@pytest.mark.parametrize(
    ("answer", "hold", "silent"),
    [
        (None, True, True),  # takes the connection and says nothing: not a master
        (b"\x00\x00\x00\x00\x00\x00\x00\x10\x08...", True, False),  # a StreamFailure, as a master answers
        (None, False, False),  # closes it: something answered, left to Spark
    ],
)
def test_a_service_that_answers_nothing_to_the_whole_frame_is_silent(
    answer: bytes | None, hold: bool, silent: bool
) -> None:
    received: list[bytes] = []
    with loopback_listener(answer, hold=hold, received=received) as node:
        probe = _check_master(f"spark://{node}")
        assert probe is not None
        assert probe.web_server() is None
        assert probe.silent(seconds=0.5) is silent
    assert received == [session._FRAME[:-1], session._FRAME], "the whole frame, on a connection of its own"


def test_a_node_gone_before_the_whole_frame_is_not_called_silent() -> None:
    with _listening(None) as node:
        probe = _check_master(f"spark://{node}")
    assert probe is not None and probe.silent(seconds=0.5) is False  # refused: Spark says so in its words


class _Jvm:
    def __init__(self, properties: dict[str, str]) -> None:
        self.java = self
        self.lang = self
        self.System = self
        self._properties = properties

    def getProperty(self, key: str) -> str | None:  # Java's name
        return self._properties.get(key)


class _Gateway:
    def __init__(self, properties: dict[str, str]) -> None:
        self.jvm = _Jvm(properties)


@pytest.mark.parametrize(
    ("conf", "properties", "authenticates"),
    [
        ({}, {}, False),
        ({"spark.authenticate": "true"}, {}, True),  # the run's Spark properties
        ({}, {"spark.authenticate": " TRUE "}, True),  # the operator's Spark defaults, in the driver JVM
        ({}, {"spark.authenticate": "false"}, False),
        ({}, {"spark.authenticate": "yes"}, True),  # anything but false: the probe holds back
    ],
)
def test_a_master_requiring_authentication_is_not_sent_the_whole_frame(
    conf: dict[str, str], properties: dict[str, str], authenticates: bool
) -> None:
    """A master with ``spark.authenticate`` logs a stream request from a peer that has not
    authenticated as an error with its stack trace: ``_start_context`` asks ``silent`` only
    when the driver does not authenticate."""
    assert _authenticates(conf, _Gateway(properties)) is authenticates
