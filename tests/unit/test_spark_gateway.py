"""Spark's gateway JVM is started so that a process with busy gRPC channels survives it
(bulldozer.load.engines.spark.session.gateway_popen_kwargs), and its connection file is
made where a killed run leaves nothing behind (``session._temporary_files_in``)."""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bulldozer.load.engines.spark.session import gateway_popen_kwargs


def _ignore_sigint() -> None:  # what pyspark runs between fork and exec
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture
def busy_channel() -> Iterator[None]:
    """A gRPC server and a channel calling it without a pause from another thread, as a
    run's DAL client is while its Spark driver starts."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = threading.Event()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        def call() -> None:
            while not stop.is_set():
                stub.Check(health_pb2.HealthCheckRequest())

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        stub.Check(health_pb2.HealthCheckRequest())
        yield
        stop.set()
        caller.join(timeout=10)
    server.stop(None)


def test_pyspark_starts_the_gateway_without_a_function_between_fork_and_exec(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyspark's own ``launch_gateway`` (the version installed) is given the arguments and
    runs spark-submit with them, its ``preexec_fn`` left out, in a process group of its own."""
    from pyspark import SparkConf, java_gateway

    started: dict[str, Any] = {}

    class Started(Exception):
        pass

    def popen(command: list[str], **kwargs: Any) -> None:
        started.update(kwargs, command=command)
        raise Started

    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setattr(java_gateway, "Popen", popen)
    with pytest.raises(Started):
        java_gateway.launch_gateway(SparkConf(loadDefaults=False), popen_kwargs=gateway_popen_kwargs(cwd="/"))  # type: ignore[no-untyped-call]
    assert started["command"][0].endswith("spark-submit")
    assert "preexec_fn" not in started
    assert started["process_group"] == 0
    assert started["cwd"] == "/" and started["stdin"] == subprocess.PIPE  # pyspark's own still set


@pytest.mark.usefixtures("busy_channel")
def test_a_process_with_a_busy_grpc_channel_starts_children_that_live() -> None:
    """With ``preexec_fn``, 13–15 of 500 children died here before exec (SIGABRT in gRPC's
    fork handler, grpc/grpc#43055); without it, none may."""
    died = []
    for _ in range(300):
        kwargs = gateway_popen_kwargs(stderr=subprocess.PIPE)
        kwargs["preexec_fn"] = _ignore_sigint  # as launch_gateway does
        child = subprocess.Popen(["true"], **kwargs)
        _, err = child.communicate(timeout=30)
        if child.returncode != 0:
            died.append((child.returncode, err.decode(errors="replace").strip()))
    assert died == []


def test_the_gateway_writes_its_port_and_secret_in_the_drivers_scratch_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyspark's ``launch_gateway`` has the JVM write its port and secret into a folder it
    makes in the temporary directory, removed once read: a run killed while the JVM started
    left it in /tmp. It is made in the driver's scratch folder (removed at exit, or by the
    next Bulldozer process), and the temporary directory is Python's own again after."""
    import tempfile

    from pyspark import SparkConf, java_gateway

    from bulldozer.load.engines.spark import session

    started: dict[str, Any] = {}

    class Started(Exception):
        pass

    def popen(command: list[str], **kwargs: Any) -> None:
        started.update(kwargs["env"])
        raise Started

    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setattr(java_gateway, "Popen", popen)
    before = tempfile.tempdir
    with pytest.raises(Started):
        session._launch(SparkConf(loadDefaults=False))
    info = Path(started["_PYSPARK_DRIVER_CONN_INFO_PATH"])
    assert info.parent.parent == session._driver_folder(), info
    assert tempfile.tempdir == before
