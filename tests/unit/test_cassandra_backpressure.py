"""What the Cassandra engine takes for backpressure (send again later) and how its limit on
writes in flight moves."""

from __future__ import annotations

import pytest

pytest.importorskip("cassandra", reason="the cassandra extra is part of the test install")

from cassandra import OperationTimedOut, WriteTimeout
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionBusy
from cassandra.protocol import OverloadedErrorMessage

from bulldozer.kv.backends.cassandra import _Throttle, overloaded


def test_busy_connections_and_overloaded_coordinators_are_backpressure() -> None:
    assert overloaded(ConnectionBusy("connection is overloaded"))
    assert overloaded(OverloadedErrorMessage(0x1001, "overloaded", {}))
    assert overloaded(NoHostAvailable("all busy", {"h1": ConnectionBusy("b"), "h2": ConnectionBusy("b")}))


def test_other_failures_are_not() -> None:
    assert not overloaded(OperationTimedOut("no answer"))  # a stopped or lost node: fail, do not wait
    assert not overloaded(WriteTimeout("timeout", write_type=0))
    assert not overloaded(NoHostAvailable("mixed", {"h1": ConnectionBusy("b"), "h2": OperationTimedOut("t")}))
    assert not overloaded(NoHostAvailable("none", {}))
    assert not overloaded(ValueError("x"))


def test_the_limit_halves_on_pushback_and_grows_back_on_success() -> None:
    throttle = _Throttle(128)
    throttle.acquire()
    throttle.release(True)
    assert throttle.limit == 64 and throttle.pushed_back == 1
    throttle.acquire()
    throttle.release(True)  # the same burst: one cut
    assert throttle.limit == 64
    for _ in range(64 * 10):
        throttle.acquire()
        throttle.release(False)
    assert 64 < throttle.limit <= 128
    for _ in range(100_000):
        throttle.acquire()
        throttle.release(False)
    assert throttle.limit == 128 and throttle.inflight == 0
