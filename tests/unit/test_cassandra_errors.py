"""What a failed Cassandra driver call says (``driver_failure``): one line naming what the
node did, from the driver's exceptions as a node out of disk space makes them (seen on a
real node: tests/integration/test_faults.py::test_cassandra_disk_full)."""

from __future__ import annotations

import pytest

pytest.importorskip("cassandra", reason="the cassandra extra is part of the test install")

from cassandra import OperationTimedOut
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionShutdown
from cassandra.protocol import ServerError

from bulldozer.errors import BackendUnavailableError, ResourceExhaustedError
from bulldozer.kv.backends.cassandra import driver_failure

WHERE = "127.0.0.1:9042"


class Host:
    endpoint = "127.0.0.1:9042"


def test_a_node_that_cannot_write_to_its_disk_is_out_of_room() -> None:
    # a schema change (a version's table) on a full disk: the node's flush fails
    server = ServerError(0, "java.lang.RuntimeException: FSWriteError in /var/lib/cassandra/data/t/nb-8-Data.db", {})
    failure = driver_failure(
        WHERE, NoHostAvailable("Unable to complete the operation against any hosts", {Host(): server})
    )
    assert isinstance(failure, ResourceExhaustedError)
    assert str(failure) == (
        "Cassandra at 127.0.0.1:9042 could not write to its disk (FSWriteError in "
        "/var/lib/cassandra/data/t/nb-8-Data.db): the node's disk is full or failing: make room there (or drop "
        "old versions: bulldozer gc), and restart the node if it stopped"
    )
    enospc = ServerError(0, "java.io.IOException: No space left on device", {})
    assert isinstance(driver_failure(WHERE, enospc), ResourceExhaustedError)


@pytest.mark.parametrize(
    "exc",
    [
        NoHostAvailable("Unable to complete the operation against any hosts", {}),  # every node marked down
        NoHostAvailable("x", {Host(): ConnectionResetError(104, "Connection reset by peer")}),  # died mid-request
        NoHostAvailable("x", {Host(): ConnectionShutdown("Connection to 127.0.0.1:9042 was closed")}),
        ConnectionShutdown("Connection to 127.0.0.1:9042 was closed"),
    ],
)
def test_no_node_answering_says_so(exc: BaseException) -> None:
    failure = driver_failure(WHERE, exc)
    assert isinstance(failure, BackendUnavailableError)
    assert str(failure).startswith("no Cassandra node at 127.0.0.1:9042 answers")
    assert "see the node's log" in str(failure)
    assert "<Host" not in str(failure) and "{" not in str(failure)  # not the driver's nested tuple


def test_other_failures_give_each_nodes_reason_on_one_line() -> None:
    server = ServerError(0, "java.lang.IllegalStateException: boom\n\tat org.apache.Foo.bar(Foo.java:1)", {})
    failure = driver_failure(WHERE, NoHostAvailable("x", {Host(): server}))
    assert str(failure) == (
        "Cassandra at 127.0.0.1:9042 failed a request: 127.0.0.1:9042: Server error: "
        "java.lang.IllegalStateException: boom at org.apache.Foo.bar(Foo.java:1)"
    )
    assert str(driver_failure(WHERE, OperationTimedOut("no answer"))).startswith(
        "Cassandra at 127.0.0.1:9042 failed a request: "
    )
