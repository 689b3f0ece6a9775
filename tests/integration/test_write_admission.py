"""A DAL takes at most ``serve --max-writes-in-flight`` writes at once, on either data plane:
one more is refused as busy (``DalBusyError``), and a client's writer sends it again after
a pause until the DAL takes it. A DAL held every batch it was sent in memory until its
turn: 32 concurrent 32 MiB batches took the Go plane to 822 MiB and the Python plane to
3.1 GiB, and more would have taken the DAL, and the reads it serves, down."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from bulldozer.errors import DalBusyError
from bulldozer.kv import KvClient
from bulldozer.kv._transports import translate
from bulldozer.kv.v1 import kv_pb2, kv_pb2_grpc
from bulldozer.names import new_version_name
from tests.integration.kv_fixtures import seal_as_loaded
from tests.integration.test_kv_server import _free_port, _start, stop_servers

pytestmark = pytest.mark.integration
LIMIT = 2


def _request(namespace: str, keys: list[bytes], value: bytes) -> kv_pb2.PutBatchRequest:
    return kv_pb2.PutBatchRequest(namespace=namespace, records=[kv_pb2.KeyValue(key=k, value=value) for k in keys])


class _HeldStream:
    """A PutStream that has sent one batch and stays open until ``close``: a write in flight."""

    def __init__(self, channel: grpc.Channel, namespace: str, name: bytes) -> None:
        self._more: queue.Queue[kv_pb2.PutBatchRequest | None] = queue.Queue()
        self._more.put(_request(namespace, [name], b"held"))
        self.call = kv_pb2_grpc.KvDataStub(channel).PutStream.future(self._requests(), timeout=60)

    def _requests(self) -> Iterator[kv_pb2.PutBatchRequest]:
        while (request := self._more.get()) is not None:
            yield request

    def close(self) -> kv_pb2.PutStreamResponse:
        self._more.put(None)
        return self.call.result()


@pytest.fixture(params=["python", "native"])
def dal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = _free_port()
    proc = _start(tmp_path / "kv", port, "--data-plane", request.param, "--max-writes-in-flight", str(LIMIT))
    yield f"127.0.0.1:{port}", proc
    stop_servers([proc])


def _busy(put: grpc.Future) -> DalBusyError:  # type: ignore[type-arg]
    with pytest.raises(grpc.RpcError) as refused:
        put.result()
    error = translate(refused.value)
    assert isinstance(error, DalBusyError), error
    return error


def _all_taken(channel: grpc.Channel, version: str) -> tuple[list[_HeldStream], list[tuple[bytes, bytes]], Any]:
    """``LIMIT`` streams holding the DAL's slots, the records stored meanwhile, and the first
    write refused once they do (a probe; until they reach the DAL, probes are taken)."""
    held = [_HeldStream(channel, version, b"held%d" % i) for i in range(LIMIT)]
    stored = [(b"held%d" % i, b"held") for i in range(LIMIT)]
    deadline = time.monotonic() + 30
    while True:
        for i, stream in enumerate(held):
            if stream.call.done():  # it arrived while a probe held a slot: refused, so again
                _busy(stream.call)
                held[i] = _HeldStream(channel, version, b"held%d" % i)
        key = b"probe%d" % len(stored)
        put = kv_pb2_grpc.KvDataStub(channel).PutBatch.future(_request(version, [key], b"v"), timeout=30)
        try:
            put.result()
        except grpc.RpcError:
            return held, stored, put
        stored.append((key, b"v"))
        assert time.monotonic() < deadline, "the DAL took a write past its limit"
        time.sleep(0.05)


def test_a_write_past_the_limit_is_refused_as_busy_and_the_writer_sends_it_again(
    dal: tuple[str, subprocess.Popen[bytes]],
) -> None:
    endpoint, _ = dal
    with KvClient(endpoint) as client, grpc.insecure_channel(endpoint) as channel:
        version = new_version_name("admitted")
        client.create_namespace(version, "admitted")
        held, stored, put = _all_taken(channel, version)
        error = _busy(put)
        assert str(error) == (
            f"the DAL is busy: it takes {LIMIT} writes at once (serve --max-writes-in-flight); "
            "send this one again after a pause"
        )
        # a call that is no write is served meanwhile
        assert client.describe(version).state.value == "LOADING"
        # the loader's writer sends its batches again until the DAL takes them
        written: list[int] = []
        writer = threading.Thread(target=lambda: written.append(_write(client, version)))
        writer.start()
        time.sleep(1.0)
        assert writer.is_alive()  # refused so far, and still trying
        for stream in held:
            assert stream.close().records == 1
        writer.join(timeout=60)
        assert written == [1_000]
        stored += [(b"w%06d" % i, b"value") for i in range(1_000)]
        sealed = seal_as_loaded(client, version, stored)  # every batch stored once: count and digest
        assert sealed.record_count == len(stored) and sealed.verified


def test_a_stream_refused_as_busy_is_sent_again_from_its_first_batch(
    dal: tuple[str, subprocess.Popen[bytes]],
) -> None:
    """``put_stream`` past the limit: refused as busy, the stream is sent again, its first
    batches (which gRPC took from the caller's generator before the refusal came) included,
    until the DAL takes it; every record is stored once. It failed with the busy error,
    which its caller could not act on: the generator cannot be read twice."""
    endpoint, _ = dal
    with KvClient(endpoint) as client, grpc.insecure_channel(endpoint) as channel:
        version = new_version_name("streamed")
        client.create_namespace(version, "streamed")
        held, stored, put = _all_taken(channel, version)
        _busy(put)
        records = [(b"s%06d" % i, b"streamed") for i in range(1_000)]
        taken: list[int] = []

        def batches() -> Iterator[list[tuple[bytes, bytes]]]:
            for at in range(0, len(records), 250):
                taken.append(at)
                yield records[at : at + 250]

        streamed: list[Any] = []
        writer = threading.Thread(target=lambda: streamed.append(client.put_stream(version, batches())))
        writer.start()
        time.sleep(1.0)
        assert writer.is_alive() and taken  # refused so far, still trying, and gRPC took batches
        for stream in held:
            assert stream.close().records == 1
        writer.join(timeout=60)
        [stats] = streamed
        assert (stats.batches, stats.records) == (4, 1_000)
        assert taken == [0, 250, 500, 750]  # the caller's generator was read once
        sealed = seal_as_loaded(client, version, stored + records)  # every record stored once
        assert sealed.record_count == len(stored) + len(records) and sealed.verified


def _write(client: KvClient, version: str) -> int:
    with client.writer(version, batch_records=100, batch_bytes=1 << 20, in_flight=4) as writer:
        for i in range(1_000):
            writer.add(b"w%06d" % i, b"value")
    return writer.stats.records


@pytest.mark.parametrize("plane", ["python", "native"])
def test_a_batch_past_the_limit_is_refused_before_it_is_read(plane: str, tmp_path: Path) -> None:
    """With its writes all taken, a DAL refuses 48 MiB batches as they arrive: the process
    that serves them does not grow by one batch. gRPC read each whole before any handler
    ran: the Python plane grew by 194 MiB refusing four after reading them."""
    port = _free_port()
    proc = _start(tmp_path / "kv", port, "--data-plane", plane, "--max-writes-in-flight", str(LIMIT))
    try:
        kvd = _kvd_pid(proc.pid) if plane == "native" else proc.pid
        endpoint = f"127.0.0.1:{port}"
        with KvClient(endpoint) as client:
            version = new_version_name("flood")
            client.create_namespace(version, "flood")
        big = _request(version, [b"%02d" % j for j in range(48)], b"x" * (1024 * 1024))
        options = [("grpc.max_send_message_length", 1 << 30)]
        with grpc.insecure_channel(endpoint) as channel, grpc.insecure_channel(endpoint, options=options) as other:
            held, _, _ = _all_taken(channel, version)
            anon = _Peak(kvd)
            for _ in range(4):
                _busy(kv_pb2_grpc.KvDataStub(other).PutBatch.future(big, timeout=60))
            grown_mib = anon.stop() / 1024
            for stream in held:
                stream.close()
        assert grown_mib < 24, f"the {plane} data plane grew by {grown_mib:.0f} MiB refusing 48 MiB batches"
    finally:
        stop_servers([proc])


class _Peak:
    """How much a process's anonymous memory grows above where it was, polled until ``stop``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.base = self.peak = self._now()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _now(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
        raise AssertionError("no RssAnon")

    def _poll(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, self._now())
            time.sleep(0.002)

    def stop(self) -> int:
        """The growth in KiB."""
        self._done.set()
        self._thread.join()
        return max(0, self.peak - self.base)


def _kvd_pid(serve_pid: int) -> int:
    """The pid of the ``bulldozer-kvd`` the ``serve`` process ``serve_pid`` started."""
    children = Path(f"/proc/{serve_pid}/task/{serve_pid}/children").read_text().split()
    for child in children:
        if "bulldozer-kvd" in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"):
            return int(child)
    raise AssertionError(f"no bulldozer-kvd among {children}")
