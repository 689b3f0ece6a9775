"""How the Cassandra engine's connection reads protocol v5's checksummed segments: every
frame the server sent arrives, wherever the socket's reads split the stream
(``SegmentSafeConnection``). The driver's own connection (3.30) fails each of these: it
loses a header split in its first bytes and dies with "CRC mismatch on header", as a CI
run's busy writes showed."""

from __future__ import annotations

import io
import random
from typing import Any

import pytest

pytest.importorskip("cassandra", reason="the cassandra extra is part of the test install")

from cassandra.connection import Connection
from cassandra.segment import Segment, SegmentCodec

from bulldozer.kv.backends.cassandra import SegmentSafeConnection

_RESULT = 0x08


def _frame(stream: int, body: bytes) -> bytes:
    """A v5 response frame: version, flags, stream, opcode, body length, body."""
    return bytes([0x85, 0]) + stream.to_bytes(2, "big") + bytes([_RESULT]) + len(body).to_bytes(4, "big") + body


def _stream(frames: list[list[bytes]]) -> bytes:
    """Segments as a server writes them: each inner list is one self-contained segment of
    whole frames; a frame longer than a segment's payload is cut over several."""
    codec, wire = SegmentCodec(), io.BytesIO()
    for group in frames:
        codec.encode(wire, b"".join(group))
    return wire.getvalue()


def _read(base: Any, reads: list[bytes]) -> tuple[list[tuple[int, bytes]], object]:
    """Feed the reads to a connection of ``base``'s reading code, without a socket, as its
    reactor would; the frames it delivered, and why it died if it did."""

    class Unplugged(base):  # type: ignore[misc]
        def close(self) -> None:
            self.is_closed = True

    conn = Unplugged.__new__(Unplugged)
    Connection.__init__(conn, "127.0.0.1", protocol_version=5)
    conn._enable_checksumming()
    got: list[tuple[int, bytes]] = []
    conn.process_msg = lambda header, body: got.append((header.stream, body))
    for chunk in reads:
        conn._iobuf.write(chunk)
        conn.process_io_buffer()
        if conn.is_defunct:
            break
    return got, conn.last_error


def _frames_of(groups: list[list[bytes]]) -> list[tuple[int, bytes]]:
    return [(int.from_bytes(f[2:4], "big"), f[9:]) for group in groups for f in group]


SMALL = [
    [_frame(1, b"")],
    [_frame(2, b"a" * 5), _frame(3, b"b" * 40)],  # two frames in one segment
    [_frame(4, b"c" * 300)],
    [_frame(5, b"")],
]


def test_every_split_of_a_stream_in_two_reads_delivers_every_frame() -> None:
    data, want = _stream(SMALL), _frames_of(SMALL)
    for cut in range(1, len(data)):
        got, error = _read(SegmentSafeConnection, [data[:cut], data[cut:]])
        assert (got, error) == (want, None), f"split at byte {cut}"


def test_a_stream_read_a_byte_at_a_time_delivers_every_frame() -> None:
    data = _stream(SMALL)
    assert _read(SegmentSafeConnection, [data[i : i + 1] for i in range(len(data))]) == (_frames_of(SMALL), None)


def _segment_starts(data: bytes) -> list[int]:
    """Where each (uncompressed) segment begins: a 3-byte header whose low 17 bits are the
    payload's length, its 3-byte CRC, the payload, its 4-byte CRC."""
    starts, at = [], 0
    while at < len(data):
        starts.append(at)
        at += 6 + (int.from_bytes(data[at : at + 3], "little") & Segment.MAX_PAYLOAD_LENGTH) + 4
    return starts


def test_a_frame_longer_than_a_segment_arrives_whole_through_random_reads() -> None:
    big = random.Random(7).randbytes(Segment.MAX_PAYLOAD_LENGTH + 5000)
    groups = [[_frame(1, b"x")], [_frame(2, big)], [_frame(3, b"y" * 3)]]
    data, want = _stream(groups), _frames_of(groups)
    starts = _segment_starts(data)
    assert len(starts) == 4  # the big frame spans two segments
    rng = random.Random(11)
    for _ in range(20):
        # random reads, and one ending inside each segment's header
        inside = [start + rng.randrange(1, 6) for start in starts]
        cuts = sorted({*rng.sample(range(1, len(data)), 40), *inside})
        reads = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        assert _read(SegmentSafeConnection, reads) == (want, None), cuts
