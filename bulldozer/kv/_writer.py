"""``BatchWriter``: a client's writes in batches by count and bytes, with a bounded number
of batches in flight, over any transport (``KvClient.writer`` makes one)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from bulldozer.errors import DalBusyError
from bulldozer.kv._transports import translate

if TYPE_CHECKING:
    from bulldozer.kv.client import KvClient

__all__ = [
    "BUSY_PATIENCE_SECONDS",
    "REPLAY_BYTES",
    "BatchWriter",
    "ReplayableStream",
    "WriteStats",
    "sent_again_while_busy",
]

T = TypeVar("T")


@dataclass
class WriteStats:
    batches: int = 0
    records: int = 0
    bytes: int = 0


class BatchWriter:
    """Batches records by count and bytes, with a bounded number of batches in flight.

    Use as a context manager; leaving it flushes and waits for every acknowledgement
    (raising the first error). ``stats`` holds what the DAL acknowledged.
    """

    def __init__(self, client: KvClient, namespace: str, batch_records: int, batch_bytes: int, in_flight: int) -> None:
        self.client = client
        self.namespace = namespace
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.in_flight = max(1, in_flight)
        self.stats = WriteStats()
        self._pending: deque[_Sent] = deque()
        self._keys: list[bytes] = []
        self._values: list[bytes] = []
        self._size = 0

    def __enter__(self) -> BatchWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        elif isinstance(exc_type, type) and issubclass(exc_type, KeyboardInterrupt):
            self.cancel()  # stopped (Ctrl-C, SIGTERM, its time limit): nothing waits for acknowledgements
        else:
            self._drain(raise_errors=False)

    def cancel(self) -> None:
        """Cancel the batches in flight instead of waiting for them (those the DAL took
        stay taken): whoever waits for one (``sent_so_far``'s function) gets its failure."""
        while self._pending:
            self._pending.popleft().cancel()

    def add(self, key: bytes, value: bytes) -> None:
        self._keys.append(key)
        self._values.append(value)
        self._size += len(key) + len(value)
        if len(self._keys) >= self.batch_records or self._size >= self.batch_bytes:
            self.flush()

    def add_many(self, pairs: Iterable[tuple[bytes, bytes]]) -> None:
        for key, value in pairs:
            self.add(key, value)

    def add_arrays(self, keys: Any, values: Any) -> None:
        """Add the pairs held in two Arrow binary arrays (the encoder's output), sending
        their buffers column-wise without a Python object per record."""
        import numpy as np
        import pyarrow as pa

        from bulldozer.kv.columnar import batch_bounds, put_batch_request

        self.flush()
        keys = keys.cast(pa.large_binary()) if keys.type != pa.large_binary() else keys
        values = values.cast(pa.large_binary()) if values.type != pa.large_binary() else values
        n = len(keys)
        koff = np.frombuffer(keys.buffers()[1], dtype=np.int64)[keys.offset : keys.offset + n + 1]
        voff = np.frombuffer(values.buffers()[1], dtype=np.int64)[values.offset : values.offset + n + 1]
        kdata = keys.buffers()[2]
        vdata = values.buffers()[2]
        kbuf = memoryview(kdata) if kdata is not None else memoryview(b"")
        vbuf = memoryview(vdata) if vdata is not None else memoryview(b"")
        for start, end in batch_bounds(np.diff(koff) + np.diff(voff), self.batch_records, self.batch_bytes):
            payload = put_batch_request(
                self.namespace,
                kbuf[koff[start] : koff[end]],
                np.diff(koff[start : end + 1]),
                vbuf[voff[start] : voff[end]],
                np.diff(voff[start : end + 1]),
            )
            self._send(payload)

    def flush(self) -> None:
        if not self._keys:
            return
        from bulldozer.kv.columnar import put_batch_request  # numpy: imported on first use

        payload = put_batch_request(
            self.namespace,
            b"".join(self._keys),
            [len(k) for k in self._keys],
            b"".join(self._values),
            [len(v) for v in self._values],
        )
        self._keys, self._values, self._size = [], [], 0
        self._send(payload)

    def _send(self, payload: bytes) -> None:
        """Send one serialized PutBatchRequest, once fewer than ``in_flight`` are unanswered."""
        while len(self._pending) >= self.in_flight:
            self._wait_one()
        transport, timeout = self.client.transport, self.client.timeout
        self._pending.append(_Sent(lambda: transport.put_batch_future(payload, timeout)))

    def sent_so_far(self) -> Callable[[], None]:
        """Send what is buffered; return a function that blocks (in any thread) until every
        batch sent up to now is acknowledged, raising the first failure. Unlike ``sync``, the
        writer goes on sending meanwhile (a caller records progress without a pause)."""
        self.flush()
        futures = list(self._pending)

        def wait() -> None:
            for sent in futures:
                sent.acknowledgement()

        return wait

    def _wait_one(self) -> None:
        response = self._pending.popleft().acknowledgement()
        self.stats.batches += 1
        self.stats.records += response.records
        self.stats.bytes += response.bytes

    def _drain(self, raise_errors: bool = True) -> None:
        first: BaseException | None = None
        while self._pending:
            try:
                self._wait_one()
            except BaseException as exc:
                first = first or exc
        if first is not None and raise_errors:
            raise first

    def sync(self) -> WriteStats:
        """Send what is buffered and wait until every batch is acknowledged."""
        self.flush()
        self._drain()
        return self.stats

    def close(self) -> WriteStats:
        return self.sync()


#: How long a batch is sent again while the DAL answers that it is busy (``DalBusyError``:
#: it takes as many writes at once as it takes) before the write fails. It is sent again at
#: once (the writer waits for its batches in order: by a refused batch's turn, the ones
#: before it are acknowledged and their slots free; a first pause made one writer with 64
#: batches in flight 5x slower), then after pauses doubling from 50 ms to 2 s, with jitter,
#: so the writers of many loads do not come back at once.
BUSY_PATIENCE_SECONDS = 600.0


def sent_again_while_busy(send: Callable[[], T], again: Callable[[], bool] = lambda: True) -> T:
    """``send()`` (a write the DAL refused as busy: ``DalBusyError``) again after pauses
    until the DAL takes it, for ``BUSY_PATIENCE_SECONDS``, while ``again()`` says it can be
    sent again; tenacity is imported only for a refusal (5 ms of a run's start otherwise)."""
    import tenacity

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(lambda exc: isinstance(exc, DalBusyError) and again()),
        wait=tenacity.wait_exponential(multiplier=0.05, max=2.0) + tenacity.wait_random(0, 0.05),
        stop=tenacity.stop_after_delay(BUSY_PATIENCE_SECONDS),
        reraise=True,
    )
    return retrying(send)


#: How many bytes of a ``put_stream``'s first batches are kept to send them again should the
#: DAL refuse the stream as busy (``ReplayableStream``); the first batch is always kept.
REPLAY_BYTES = 64 * 1024 * 1024


class ReplayableStream:
    """The requests of one client-streaming write (``KvClient.put_stream``), each made once
    from the caller's iterable, and the first ones kept (``REPLAY_BYTES``) so the stream can
    be sent again from its start when the DAL refuses it as busy. Both data planes refuse a
    write as it arrives, before they read any of it, but gRPC takes requests from the
    iterator meanwhile, and the caller's iterable cannot be read twice: such a stream
    failed with the DAL's "send this one again after a pause", which its caller could not
    do. Sending a batch again is safe whenever it happens (puts are idempotent), in the
    order the batches came: a key's later value still wins."""

    def __init__(self, items: Iterable[T], request: Callable[[T], Any], keep_bytes: int = REPLAY_BYTES) -> None:
        self._items = iter(items)
        self._request = request
        self._kept: list[Any] = []
        self._kept_bytes = 0
        self._keep_bytes = keep_bytes
        self._lock = threading.Lock()
        #: whether every request taken so far is kept (the stream can be sent again)
        self.replayable = True

    def requests(self) -> Iterator[Any]:
        """One sending of the stream: the kept requests, then new ones. An earlier sending's
        thread (gRPC's, still taking one as its call ended) adds what it took to the kept
        ones, which this one then sends: none is lost between the two."""
        at = 0
        while True:
            with self._lock:
                if at < len(self._kept):
                    request = self._kept[at]
                else:
                    item = next(self._items, _END)
                    if item is _END:
                        return
                    request = self._request(item)
                    if self.replayable:
                        self._kept_bytes += request.ByteSize()
                        if self._kept and self._kept_bytes > self._keep_bytes:
                            self.replayable = False
                            self._kept = []
                        else:
                            self._kept.append(request)
            at += 1
            yield request


_END: Any = object()


class _Sent:
    """One batch sent: its acknowledgement, for which it is sent again while the DAL is
    busy. Waited for by the writer, or by ``sent_so_far``'s function in another thread."""

    def __init__(self, send: Callable[[], Any]) -> None:
        self._send: Callable[[], Any] | None = send
        self._future: Any = send()
        self._response: Any = None
        self._lock = threading.Lock()

    def cancel(self) -> None:
        future = self._future
        if future is not None:
            future.cancel()

    def done(self) -> bool:
        """Acknowledged (and the batch let go)."""
        return self._send is None

    def acknowledgement(self) -> Any:
        """The batch's response, or its failure as the exception tree's error."""
        with self._lock:
            send = self._send
            if send is None:  # acknowledged: the batch is let go
                return self._response
            try:
                self._response = _acknowledgement(self._future)
            except DalBusyError:  # refused before it was stored
                self._response = sent_again_while_busy(lambda: _acknowledgement(send()))
            self._send = self._future = None
            return self._response


def _acknowledgement(future: Any) -> Any:
    """A sent batch's response, or its failure as the exception tree's error."""
    try:
        return future.result()
    except grpc.RpcError as err:
        raise translate(err) from None
