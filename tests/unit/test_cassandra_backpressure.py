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
    assert throttle.acquire(1.0)
    throttle.release(True)
    assert throttle.limit == 64 and throttle.pushed_back == 1
    assert throttle.acquire(1.0)
    throttle.release(True)  # the same burst: one cut
    assert throttle.limit == 64
    for _ in range(64 * 10):
        assert throttle.acquire(1.0)
        throttle.release(False)
    assert 64 < throttle.limit <= 128
    for _ in range(100_000):
        assert throttle.acquire(1.0)
        throttle.release(False)
    assert throttle.limit == 128 and throttle.inflight == 0


class _BusyNode:
    """A session whose node answers ConnectionBusy beyond ``capacity`` writes in flight and
    completes the others a moment later, on another thread (as the driver does)."""

    def __init__(self, capacity: int) -> None:
        import threading

        self.capacity = capacity
        self.inflight = 0
        self.stored: list[object] = []
        self.busy = 0
        self._lock = threading.Lock()

    def execute_async(self, batch: object) -> _Answer:
        with self._lock:
            refused = self.inflight >= self.capacity
            if refused:
                self.busy += 1
            else:
                self.inflight += 1
        return _Answer(self, batch, refused)


class _Answer:
    def __init__(self, node: _BusyNode, batch: object, refused: bool) -> None:
        self.node, self.batch, self.refused = node, batch, refused

    def add_callbacks(
        self, callback: object, errback: object, callback_args: tuple = (), errback_args: tuple = ()
    ) -> None:  # type: ignore[type-arg]
        import threading

        def answer() -> None:
            if self.refused:
                errback(NoHostAvailable("busy", {"h": ConnectionBusy("busy")}), *errback_args)  # type: ignore[operator]
                return
            with self.node._lock:
                self.node.inflight -= 1
                self.node.stored.append(self.batch)
            callback([], *callback_args)  # type: ignore[operator]

        threading.Timer(0.005, answer).start()


def test_writes_to_a_node_that_pushes_back_all_land_once_and_the_limit_comes_down() -> None:
    from bulldozer.kv.backends.cassandra import CassandraEngine
    from bulldozer.kv.backends.config import CassandraConfig

    engine = object.__new__(CassandraEngine)
    engine.config = CassandraConfig(concurrency=256, timeout_seconds=5)
    engine.where = "fake"
    engine._throttle = _Throttle(256)
    node = _BusyNode(capacity=4)
    engine.session = node  # type: ignore[assignment]
    batches = [f"batch-{i}" for i in range(500)]
    engine._write(batches)
    assert sorted(node.stored) == sorted(batches)  # every batch landed exactly once
    assert node.busy > 0 and engine._throttle.pushed_back == node.busy
    assert engine._throttle.limit < 256 and engine._throttle.inflight == 0


class _SilentNode(_BusyNode):
    """A node whose driver never answers a write past its first ``answered`` (a callback the
    driver lost as a connection died, as cassandra-python-driver's PYTHON-1044 did)."""

    def __init__(self, answered: int) -> None:
        super().__init__(capacity=10**6)
        self.answered = answered

    def execute_async(self, batch: object) -> _Answer:
        answer = super().execute_async(batch)
        if self.answered <= 0:
            answer.add_callbacks = lambda *args, **kwargs: None  # type: ignore[method-assign]
        self.answered -= 1
        return answer


@pytest.mark.parametrize("concurrency", [1, 64])
def test_a_write_the_driver_never_answers_fails_the_put_in_time(concurrency: int) -> None:
    """The put waited on its round's answers without a limit: one lost callback held the run
    (and a DAL's worker) for ever. It fails once no write answered for 3 x timeout_seconds;
    with one write in flight, it is the wait for a free slot that gives up."""
    import time

    from bulldozer.errors import BackendUnavailableError
    from bulldozer.kv.backends.cassandra import CassandraEngine
    from bulldozer.kv.backends.config import CassandraConfig

    engine = object.__new__(CassandraEngine)
    engine.config = CassandraConfig(concurrency=concurrency, timeout_seconds=0.5)
    engine.where = "fake"
    engine._throttle = _Throttle(concurrency)
    engine.session = _SilentNode(answered=3)  # type: ignore[assignment]
    started = time.monotonic()
    with pytest.raises(
        BackendUnavailableError, match=r"^Cassandra at fake answered none of the \d+ writes in flight for 2 s"
    ):
        engine._write([f"batch-{i}" for i in range(10)])
    assert time.monotonic() - started < 10
