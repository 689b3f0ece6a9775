"""The native data plane (bulldozer-kvd in front of the DAL, bulldozer.kv.server.native).

The contract suite runs over it as the ``embedded-native`` case (every rule and every error
answer); these tests check what is particular to it: that it really serves the hot calls
itself, that its writes and the Python engine's compose into one digest, how the plane is
chosen, and that `bulldozer serve` stops when the front dies.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from bulldozer.codec.digest import digest_pairs
from bulldozer.errors import (
    BackendUnavailableError,
    InvalidArgumentError,
    NamespaceNotFoundError,
    NamespaceStateError,
    VerificationError,
)
from bulldozer.kv import KvClient, create_engine
from bulldozer.kv.backends import StorageEngine
from bulldozer.kv.server import NativeServer, create_server
from bulldozer.kv.server.native import DataPlane, choose_data_plane, kvd_binary
from bulldozer.kv.types import State
from bulldozer.kv.v1 import shared
from tests.integration import services
from tests.integration.kv_fixtures import ENGINE_FACTORIES

pytestmark = pytest.mark.integration


def _embedded(tmp_path: Path):  # type: ignore[no-untyped-def]
    return create_engine({"type": "embedded", "path": str(tmp_path / "kv"), "map_size": 1024**3})


@pytest.fixture(params=["embedded", "redis"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> StorageEngine:
    """Each engine the front serves itself (a new store, or a new Redis prefix)."""
    return ENGINE_FACTORIES[request.param](tmp_path)


def _pairs(n: int, start: int = 0, value: bytes = b"value-") -> list[tuple[bytes, bytes]]:
    return [(b"key-%08d" % i, value + b"%d" % i * 3) for i in range(start, start + n)]


@contextlib.contextmanager
def _both_planes(engine: StorageEngine) -> Iterator[tuple[KvClient, KvClient]]:
    """Clients of the front (bulldozer-kvd) and of the Python DAL, both serving ``engine``."""
    native, native_port = create_server("127.0.0.1:0", engine, data_plane="native")
    python, python_port = create_server("127.0.0.1:0", engine, data_plane="python")
    fast, slow = KvClient(f"127.0.0.1:{native_port}"), KvClient(f"127.0.0.1:{python_port}")
    try:
        fast.wait_ready()
        slow.wait_ready()
        yield fast, slow
    finally:
        fast.close()
        slow.close()
        native.stop(5, close_engine=False)
        python.stop(5)


def _totals(stderr: str) -> dict[str, dict[str, int]]:
    for line in stderr.splitlines():
        if '"data plane totals"' in line:
            record: dict[str, dict[str, int]] = json.loads(line)
            return record
    raise AssertionError(f"bulldozer-kvd logged no totals; its output:\n{stderr[-3000:]}")


def test_the_front_serves_puts_and_reads_itself(engine: StorageEngine, capfd: pytest.CaptureFixture[str]) -> None:
    server, port = create_server("127.0.0.1:0", engine, data_plane="native")
    assert isinstance(server, NativeServer)
    client = KvClient(f"127.0.0.1:{port}")
    try:
        client.wait_ready()
        client.create_namespace("feat__v1", "feat")
        records = _pairs(500)
        client.put("feat__v1", records)  # record form
        columnar = _pairs(20_000, start=500)
        with client.writer("feat__v1", batch_records=7_000) as writer:  # columnar form, 3 batches
            writer.add_arrays(pa.array([k for k, _ in columnar], pa.binary()), pa.array([v for _, v in columnar]))
        expected = digest_pairs(records + columnar)
        sealed = client.seal("feat__v1", expected_records=expected.count, expected_digest=expected.value)
        assert (sealed.record_count, sealed.digest, sealed.bytes) == (expected.count, expected.value, expected.bytes)
        client.compare_and_set_alias("feat", "", "feat__v1", reason="test")
        keys = [b"key-00000000", b"key-00020499", b"missing"]
        want = [records[0][1], columnar[-1][1], None]
        assert client.batch_get(keys, alias="feat") == ("feat__v1", want)
        assert client.batch_get(keys, alias="feat@feat__v1") == ("feat__v1", want)
        assert client.batch_get(keys, namespace="feat__v1") == ("feat__v1", want)
        assert client.get(b"key-00000007", alias="feat") == records[7][1]
        assert client.get(b"missing", alias="feat") is None
        with pytest.raises(NamespaceStateError, match="writes are only accepted while LOADING"):
            client.put("feat__v1", [(b"k", b"v")])  # off the fast path: the DAL's own answer
    finally:
        client.close()
        server.stop(5)
    totals = _totals(capfd.readouterr().err)
    if engine.name == "embedded":
        assert totals["served"] == {"PutBatch": 4, "Ingest": 1, "BatchGet": 3, "Get": 2}
        assert totals["forwarded"] == {"PutBatch": 1}
    else:  # Redis writes in place: nothing to ingest, the reference DAL answers (0, 0)
        assert totals["served"] == {"PutBatch": 4, "BatchGet": 3, "Get": 2}
        assert totals["forwarded"] == {"PutBatch": 1, "Ingest": 1}
    assert totals["records_written"] == {"feat__v1": expected.count}


def test_writes_through_either_plane_make_one_digest(engine: StorageEngine) -> None:
    """Batches stored by bulldozer-kvd and by the Python engine over one store, a retried
    batch and a key written twice with another value: the seal's digest is of what is
    stored, whoever stored it."""
    with _both_planes(engine) as (fast, slow):
        fast.create_namespace("mix__v1", "mix")
        first, second = _pairs(3_000), _pairs(3_000, start=3_000)
        fast.put("mix__v1", first)
        slow.put("mix__v1", second)
        assert fast.describe("mix__v1").record_count == 0  # counted at the seal
        expected = digest_pairs(first + second)
        assert slow.seal("mix__v1", expected_records=6_000, expected_digest=expected.value).digest == expected.value
        # both planes put every key where the other looks for it (for Redis: in one bucket)
        keys = [first[0][0], first[-1][0], second[0][0], second[-1][0]]
        want = [first[0][1], first[-1][1], second[0][1], second[-1][1]]
        assert (
            fast.batch_get(keys, namespace="mix__v1") == slow.batch_get(keys, namespace="mix__v1") == ("mix__v1", want)
        )

        fast.create_namespace("mix__v2", "mix")
        fast.put("mix__v2", first)
        fast.put("mix__v2", first)  # a retried batch: the running digest turns inexact, the seal scans
        changed = [(first[0][0], b"other")]
        slow.put("mix__v2", changed)
        expected = digest_pairs(changed + first[1:])
        sealed = fast.seal("mix__v2", expected_records=len(first), expected_digest=expected.value)
        assert sealed.digest == expected.value


def test_layered_deletes_and_ingests_through_either_plane_make_one_digest(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A delta's writes on the embedded engine — deletes of keys its own data holds, its base
    holds, its own tombstones already hide, no layer holds, repeated in a request; puts of
    new keys and of keys deleted first — served by the front itself, give the same running
    digest (exact: the seal scans nothing) and the same contents as the Python engine's;
    a put that hides a base's pair it did not delete makes it inexact on both planes. The
    front samples a layered version itself, as the DAL does."""
    engine = _embedded(tmp_path)
    with _both_planes(engine) as (fast, slow):
        base = _pairs(1_000)
        fast.create_namespace("lay__v1", "lay")
        fast.put("lay__v1", base)
        whole = digest_pairs(base)
        fast.seal("lay__v1", whole.count, whole.value)
        results = {}
        for client, name in ((fast, "lay__v2"), (slow, "lay__v3")):
            client.create_namespace(name, "lay", base="lay__v1")
            client.put(name, _pairs(10, start=5_000))  # new keys: the version's own data
            client.ingest(name)
            deleted = client.delete(name, [b"key-%08d" % i for i in range(0, 100)] + [b"key-00005000", b"nope"])
            again = client.delete(name, [b"key-00000001", b"key-00000001", b"key-00005001", b"key-00005001"])
            client.put(name, _pairs(50, start=20, value=b"new-"))  # deleted first: exact
            client.ingest(name)
            contents = {bytes(k): bytes(v) for chunk in engine.iterate(name) for k, v in chunk}
            results[name] = (deleted, again, engine.stored_digest(name), contents)
        assert results["lay__v2"][:2] == results["lay__v3"][:2] == (101, 1)
        kept = dict(base[100:]) | dict(_pairs(50, start=20, value=b"new-")) | dict(_pairs(8, start=5_002))
        want = digest_pairs(sorted(kept.items()))
        for _, _, running, contents in results.values():
            assert running is not None
            assert (running.count, running.value, running.bytes) == (want.count, want.value, want.bytes)
            assert contents == kept
        for client, name in ((fast, "lay__v2"), (slow, "lay__v3")):
            assert client.seal(name, want.count, want.value).verified
        # a shadow read's sample, read through the layers by the front: what the DAL chooses
        for name in ("lay__v1", "lay__v2"):
            chosen = fast.sample(200, seed=3, namespace=name)
            assert chosen == slow.sample(200, seed=3, namespace=name) and len(chosen[1]) == 200
        # a put over a base's pair, not deleted first: the running digest cannot be exact
        for client, name in ((fast, "lay__v4"), (slow, "lay__v5")):
            client.create_namespace(name, "lay", base="lay__v1")
            client.put(name, [(b"key-00000500", b"shadow")])
            client.ingest(name)
            assert engine.stored_digest(name) is None
            shadowed = digest_pairs(sorted((dict(base) | {b"key-00000500": b"shadow"}).items()))
            assert client.seal(name, shadowed.count, shadowed.value).verified
    totals = _totals(capfd.readouterr().err)
    assert totals["served"]["Delete"] == 2 and "Delete" not in totals.get("forwarded", {})
    assert totals["served"]["Ingest"] >= 4 and "Ingest" not in totals.get("forwarded", {})
    assert totals["served"]["Sample"] == 2 and "Sample" not in totals.get("forwarded", {})


def test_the_front_scans_through_layers_page_for_page_as_the_dal_does(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The front serves a scan itself, through a version's layers (a base, a delta over it,
    a delta over that: new keys, updates, deletes of the base's keys and of a layer's own):
    every page — its version, its records, its token — is the one the DAL sends, whatever
    the page size (none, over the limit of a page) and the limit, and a token from either
    resumes on either. A scan the front cannot serve (a version not readable, unknown, or
    dropped under a token) gets the DAL's own error."""
    engine = _embedded(tmp_path)
    with _both_planes(engine) as (fast, slow):

        def pages(client: KvClient, **kwargs: Any) -> list[tuple[str, list[tuple[bytes, bytes]], bytes]]:
            return [
                (p.namespace, [(r.key, r.value) for r in p.records], p.next_page_token)
                for p in client.scan_pages(**kwargs)
            ]

        def seal(name: str, contents: dict[bytes, bytes]) -> None:
            want = digest_pairs(sorted(contents.items()))
            assert fast.seal(name, want.count, want.value).verified

        scans = 0
        v1 = dict(_pairs(3_000))
        fast.create_namespace("deep__v1", "deep")
        fast.put("deep__v1", sorted(v1.items()))
        seal("deep__v1", v1)
        fast.create_namespace("deep__v2", "deep", base="deep__v1")
        fast.put("deep__v2", _pairs(100, start=5_000))
        fast.ingest("deep__v2")
        gone = [b"key-%08d" % i for i in range(0, 3_000, 7)]
        fast.delete("deep__v2", gone)
        v2 = {k: v for k, v in (v1 | dict(_pairs(100, start=5_000))).items() if k not in set(gone)}
        seal("deep__v2", v2)
        fast.create_namespace("deep__v3", "deep", base="deep__v2")
        fast.delete("deep__v3", [b"key-%08d" % i for i in (*range(5_000, 5_010), *range(1_000, 1_050))])
        fast.put("deep__v3", _pairs(100, start=300, value=b"new-"))
        fast.ingest("deep__v3")
        v3 = {k: v for k, v in v2.items() if not (b"key-00005000" <= k < b"key-00005010")}
        v3 = {k: v for k, v in v3.items() if not (b"key-00001000" <= k < b"key-00001050")} | dict(
            _pairs(100, start=300, value=b"new-")
        )
        seal("deep__v3", v3)
        fast.compare_and_set_alias("deep", None, "deep__v3")
        targets = [{"namespace": "deep__v1"}, {"namespace": "deep__v2"}, {"namespace": "deep__v3"}, {"alias": "deep"}]
        for target, contents in zip(targets, (v1, v2, v3, v3), strict=True):
            for page_size, limit in ((1, 13), (7, 0), (999, 0), (0, 0), (20_000, 0), (999, 2_500), (1_000, 40)):
                got = pages(fast, page_size=page_size, limit=limit, **target)
                assert got == pages(slow, page_size=page_size, limit=limit, **target), (target, page_size, limit)
                scans += 1
                records = [pair for _, page, _ in got for pair in page]
                assert records == sorted(contents.items())[: limit or None]
            # a token from either plane resumes on either, on the version it named
            token = pages(slow, page_size=500, **target)[0][2]
            rest = pages(fast, page_size=500, page_token=token, **target)
            assert rest == pages(slow, page_size=500, page_token=token, **target)
            scans += 1
            assert [pair for _, page, _ in rest for pair in page] == sorted(contents.items())[500:]
        # what only the DAL answers: the same error from either plane
        fast.create_namespace("deep__v4", "deep", base="deep__v3")
        solo = dict(_pairs(50))
        fast.create_namespace("solo__v1", "solo")
        fast.put("solo__v1", sorted(solo.items()))
        seal("solo__v1", solo)
        token = pages(fast, namespace="solo__v1", page_size=10)[0][2]
        scans += 1
        fast.drop("solo__v1")
        refused: list[tuple[dict[str, Any], type[Exception]]] = [
            ({"namespace": "deep__v4"}, NamespaceStateError),  # LOADING
            ({"namespace": "deep__v9"}, NamespaceNotFoundError),
            ({"namespace": "solo__v1", "page_token": token}, NamespaceStateError),  # dropped
        ]
        for request, error in refused:
            messages = []
            for client in (fast, slow):
                with pytest.raises(error) as raised:
                    pages(client, **request)
                messages.append(str(raised.value))
            assert messages[0] == messages[1]
    totals = _totals(capfd.readouterr().err)
    assert totals["served"]["Scan"] == scans and totals["forwarded"]["Scan"] == 3


def test_reads_and_writes_through_filtered_layers_match_the_python_engine(tmp_path: Path) -> None:
    """Through a chain of sealed layers, the front looks keys up through each layer's key
    filter (built on a request of enough keys, stored, and dropped with the layer's data;
    the bottom's by the first ingest of a version made on it, never by a read or a delete): its reads,
    deletes and ingests give what the Python engine's, which has no filters, gives — keys
    in the top layer, in a middle one, in the bottom, deleted by a newer layer, and in
    none."""
    engine = _embedded(tmp_path)
    with _both_planes(engine) as (fast, slow):
        keys = [b"key-%08d" % i for i in range(8_000)]

        def seal(name: str) -> None:
            fast.ingest(name)
            contents = sorted((bytes(k), bytes(v)) for chunk in engine.iterate(name) for k, v in chunk)
            want = digest_pairs(contents)
            assert fast.seal(name, want.count, want.value).verified

        def filtered() -> set[str]:
            filters = engine.env.open_db(shared.STORE_META_FILTERS.encode())
            with engine.env.begin() as txn:
                return {bytes(k).decode() for k, _ in txn.cursor(db=filters)}

        fast.create_namespace("fil__v1", "fil")
        fast.put("fil__v1", _pairs(3_000))
        seal("fil__v1")
        assert fast.batch_get(keys, namespace="fil__v1") == slow.batch_get(keys, namespace="fil__v1")
        assert filtered() == set()  # a read builds no filter of the version it reads
        previous = "fil__v1"
        for n, (dropped, added) in enumerate(
            [(range(0, 500), range(5_000, 6_000)), (range(1_000, 1_400), range(6_000, 6_500))]
        ):
            name = f"fil__v{n + 2}"
            fast.create_namespace(name, "fil", base=previous)
            fast.delete(name, [keys[i] for i in dropped])
            if n == 0:  # a delete neither consults nor builds the bottom's filter: the ingest does
                assert filtered() == set()
            fast.put(name, _pairs(len(added), start=added.start, value=b"layer-%d-" % n))
            fast.put(name, _pairs(100, start=2_000 + 100 * n, value=b"changed-"))  # not deleted first: inexact
            seal(name)
            previous = name
        # reads of the top, a middle and the bottom layer's keys, deleted ones and absent ones
        assert fast.batch_get(keys, namespace="fil__v3") == slow.batch_get(keys, namespace="fil__v3")
        # the bottom's built by the first delta's ingest, the others by the later writes and the read
        assert filtered() == {"fil__v1", "fil__v2", "fil__v3"}
        assert fast.batch_get(keys, namespace="fil__v1") == slow.batch_get(keys, namespace="fil__v1")
        results = {}
        for client, name in ((fast, "fil__v4"), (slow, "fil__v5")):
            client.create_namespace(name, "fil", base="fil__v3")
            deleted = client.delete(name, keys[::7])  # 1,143 keys in every layer and in none
            client.put(name, _pairs(400, start=7_000, value=b"new-"))  # in no layer below: exact
            client.ingest(name)
            contents = {bytes(k): bytes(v) for chunk in engine.iterate(name) for k, v in chunk}
            results[name] = (deleted, engine.stored_digest(name), contents)
        (fast_deleted, fast_digest, fast_contents), (slow_deleted, slow_digest, slow_contents) = results.values()
        assert fast_deleted == slow_deleted and fast_contents == slow_contents
        assert fast_digest is not None and fast_digest == slow_digest
        want = digest_pairs(sorted(fast_contents.items()))
        assert (fast_digest.count, fast_digest.value) == (want.count, want.value)
        # a layer's filter goes with its data: when nothing reads through the layer any more
        for name in ("fil__v4", "fil__v5", "fil__v3"):
            fast.drop(name)
        assert filtered() == {"fil__v1", "fil__v2"}
        fast.drop("fil__v2")
        assert filtered() == {"fil__v1"}
        fast.drop("fil__v1")
        assert filtered() == set()


def test_choosing_the_data_plane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    embedded = _embedded(tmp_path)
    memory = create_engine({"type": "memory"})
    assert kvd_binary() is not None, "scripts/build_native.sh builds it; bootstrap.sh runs that"
    assert choose_data_plane("auto", embedded, secured=False) == DataPlane.native
    assert choose_data_plane("auto", memory, secured=False) == DataPlane.python
    assert choose_data_plane("auto", embedded, secured=True) == DataPlane.python
    assert choose_data_plane("python", embedded, secured=False) == DataPlane.python
    with pytest.raises(InvalidArgumentError, match="embedded and redis engines only, not memory"):
        choose_data_plane("native", memory, secured=False)
    with pytest.raises(InvalidArgumentError, match="TLS or authentication"):
        choose_data_plane("native", embedded, secured=True)
    # the operator's binary is not one: auto falls back saying so (a warning), native refuses
    monkeypatch.setenv("BULLDOZER_KVD", str(tmp_path / "missing"))
    caplog.clear()  # the calls above log at INFO where an earlier test left the logger at INFO
    with caplog.at_level(logging.INFO, logger="bulldozer.kv.server"):
        assert choose_data_plane("auto", embedded, secured=False) == DataPlane.python
    said = f"BULLDOZER_KVD names {tmp_path / 'missing'}, which is not an executable file"
    assert [(r.levelname, said in r.getMessage()) for r in caplog.records] == [("WARNING", True)]
    with pytest.raises(InvalidArgumentError, match=f"not available: {re.escape(said)}"):
        choose_data_plane("native", embedded, secured=False)
    embedded.close()


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def test_serve_stops_when_the_front_dies(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bulldozer.cli.main", "serve", "--path", str(tmp_path / "kv"),
             "--port", "0", "--port-file", str(port_file), "--data-plane", "native"],
            stdout=out, stderr=out, env={**os.environ, "BULLDOZER_HOME": str(tmp_path)},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        with KvClient(f"127.0.0.1:{port_file.read_text()}") as client:
            client.wait_ready()
            client.create_namespace("d__v1", "d")
            client.put("d__v1", _pairs(10))
        (front,) = _children(proc.pid)
        os.kill(front, signal.SIGKILL)
        assert proc.wait(timeout=30) == 1
        assert "bulldozer-kvd exited" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_auto_falls_back_to_python_when_the_front_cannot_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "bulldozer-kvd"
    broken.write_text("#!/bin/sh\necho 'cannot start' >&2\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.setenv("BULLDOZER_KVD", str(broken))
    engine = _embedded(tmp_path)
    with pytest.raises(BackendUnavailableError, match="exited with code 3"):
        create_server("127.0.0.1:0", engine, data_plane="native")
    server, port = create_server("127.0.0.1:0", engine, data_plane="auto")
    try:
        assert not isinstance(server, NativeServer)
        with KvClient(f"127.0.0.1:{port}") as client:
            client.wait_ready()
            client.create_namespace("fb__v1", "fb")
            assert client.put("fb__v1", _pairs(3)) == (3, sum(len(k) + len(v) for k, v in _pairs(3)))
    finally:
        server.stop(5)


def test_writes_racing_a_seal_are_either_counted_or_refused(engine: StorageEngine) -> None:
    """bulldozer-kvd checks LOADING inside its write transaction (LMDB) or as it enters the
    version's write fence (Redis), and the Python DAL seals in its own transaction, waiting
    for the fence to empty: a batch is stored and counted, or refused."""
    server, port = create_server("127.0.0.1:0", engine, data_plane="native")
    client = KvClient(f"127.0.0.1:{port}")
    acked: list[tuple[bytes, bytes]] = []
    refused: list[Exception] = []
    started = threading.Event()

    def write() -> None:
        for i in range(10_000):
            batch = _pairs(500, start=i * 500)
            try:
                client.put("race__v1", batch)
            except NamespaceStateError as exc:
                refused.append(exc)
                return
            acked.extend(batch)
            started.set()

    try:
        client.wait_ready()
        client.create_namespace("race__v1", "race")
        writer = threading.Thread(target=write)
        writer.start()
        assert started.wait(30)
        time.sleep(0.2)
        with pytest.raises(VerificationError):  # sealed with no expectation it could meet ...
            client.seal("race__v1", 0, 0)
        writer.join(60)
        assert refused, "the writer went on after the seal"
        measured = client.describe("race__v1")  # ... but measured: exactly what was acknowledged
        assert measured.state == State.FAILED
        assert measured.record_count == len(acked) > 0
        assert measured.digest == digest_pairs(acked).value
    finally:
        client.close()
        server.stop(5)


def test_a_dropped_version_is_gone_for_the_front_too(engine: StorageEngine) -> None:
    server, port = create_server("127.0.0.1:0", engine, data_plane="native")
    try:
        with KvClient(f"127.0.0.1:{port}") as client:
            client.wait_ready()
            client.create_namespace("gone__v1", "gone")
            client.put("gone__v1", _pairs(100))  # the front opens the version's database
            client.seal("gone__v1", 100, digest_pairs(_pairs(100)).value)
            assert client.batch_get([b"key-00000001"], namespace="gone__v1")[1][0] is not None
            client.drop("gone__v1")
            with pytest.raises(NamespaceNotFoundError):
                client.batch_get([b"key-00000001"], namespace="gone__v1")
            with pytest.raises(NamespaceNotFoundError):
                client.put("gone__v1", _pairs(1))
    finally:
        server.stop(5)


def test_the_redis_password_is_not_in_the_fronts_arguments_or_environment(tmp_path: Path) -> None:
    """bulldozer-kvd gets the Redis configuration on its standard input: another user of
    the machine (ps, /proc) sees neither the URL's password in its arguments nor in its
    environment, and the front still writes and reads with it."""
    import redis

    url = services.redis_url()
    user, secret = f"kvd_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin = redis.Redis.from_url(url)
    admin.acl_setuser(user, enabled=True, passwords=[f"+{secret}"], keys=["*"], channels=["*"], commands=["+@all"])
    try:
        host_port = url.split("://", 1)[1]
        engine = create_engine(
            {"type": "redis", "url": f"redis://{user}:{secret}@{host_port}", "prefix": f"pw_{uuid.uuid4().hex[:8]}"}
        )
        server, port = create_server("127.0.0.1:0", engine, data_plane="native")
        try:
            assert isinstance(server, NativeServer)
            pid = server.front.proc.pid
            for part in ("cmdline", "environ"):
                assert secret.encode() not in Path(f"/proc/{pid}/{part}").read_bytes()
            with KvClient(f"127.0.0.1:{port}") as client:
                client.wait_ready()
                client.create_namespace("pw__v1", "pw")
                client.put("pw__v1", _pairs(10))
                client.seal("pw__v1", 10, digest_pairs(_pairs(10)).value)
                assert client.batch_get([b"key-00000003"], namespace="pw__v1")[1] == [_pairs(10)[3][1]]
        finally:
            server.stop(5)
    finally:
        admin.acl_deluser(user)
        admin.close()


def test_calls_the_front_serves_are_counted_on_the_dals_metrics(engine: StorageEngine) -> None:
    """One /metrics counts every call: those bulldozer-kvd serves itself (reads, puts) and
    those the Python DAL serves (namespaces, a forwarded put), with the same names, labels
    and buckets, added up."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    from bulldozer.kv.server.metrics import Metrics

    metrics = Metrics()
    server, port = create_server("127.0.0.1:0", engine, data_plane="native", metrics=metrics)
    metrics_port = metrics.serve(0)
    try:
        with KvClient(f"127.0.0.1:{port}") as client:
            client.wait_ready()
            client.create_namespace("m__v1", "m")
            client.put("m__v1", _pairs(100))  # served by the front
            with pytest.raises(NamespaceNotFoundError):  # forwarded: the Python DAL refuses it
                client.put("m__v2", _pairs(1))
            client.seal("m__v1", 100, digest_pairs(_pairs(100)).value)
            for _ in range(3):
                client.batch_get([b"key-00000001", b"nope"], namespace="m__v1")
            for _ in range(2):
                client.get(b"key-00000002", namespace="m__v1")
    finally:
        text = urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        server.stop(5)
    assert (
        text.count("# TYPE bulldozer_kv_requests_total counter") + text.count("# TYPE bulldozer_kv_requests counter")
        == 1
    )
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def count(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    assert count("bulldozer_kv_requests_total", method="BatchGet", code="OK") == 3
    assert count("bulldozer_kv_requests_total", method="Get", code="OK") == 2
    assert count("bulldozer_kv_requests_total", method="PutBatch", code="OK") == 1
    assert count("bulldozer_kv_requests_total", method="PutBatch", code="NOT_FOUND") == 1
    assert count("bulldozer_kv_requests_total", method="CreateNamespace", code="OK") == 1
    assert count("bulldozer_kv_request_seconds_count", method="BatchGet") == 3
    assert count("bulldozer_kv_request_seconds_bucket", method="BatchGet", le="+Inf") == 3
    assert count("bulldozer_kv_records_written_total", namespace="m__v1") == 100


@pytest.mark.parametrize(
    ("which", "plane"),
    [("redis", "native"), ("redis", "python"), ("redis-cluster", "native"), ("redis-cluster", "python")],
)
def test_a_bulk_write_makes_new_redis_buckets_hash_tables_and_the_seal_removes_the_marker(
    which: str, plane: str, tmp_path: Path
) -> None:
    """A batch putting at least ``hashtable_pairs`` pairs into a bucket sets the marker first
    (shared.yaml): the bucket is a hash table at once, not a listpack that each insert scans;
    a smaller write leaves a new bucket to Redis (a listpack). The marker, which no record
    can be (empty keys are refused), is in no scan and gone once sealed, and the running
    digest stays exact. Sealed, a bucket that stayed small is a listpack again."""
    from bulldozer.kv.backends._buckets import bucket_of

    engine: Any = ENGINE_FACTORIES[which](tmp_path)
    server, port = create_server("127.0.0.1:0", engine, data_plane=plane)
    assert isinstance(server, NativeServer) == (plane == "native")
    field = shared.REDIS_HASHTABLE_FIELD.encode()
    try:
        with KvClient(f"127.0.0.1:{port}") as client:
            client.wait_ready()
            for name, n in (("ht__v1", 2_000), ("ht__v2", 150)):  # 16 buckets: ~125 and ~9 pairs each
                client.create_namespace(name, "ht")
                records = _pairs(n)
                with client.writer(name, batch_records=n) as writer:
                    writer.add_arrays(pa.array([k for k, _ in records], pa.binary()), pa.array([v for _, v in records]))
                per_bucket: dict[int, int] = {}
                for key, _ in records:
                    per_bucket[bucket_of(key, engine.buckets)] = per_bucket.get(bucket_of(key, engine.buckets), 0) + 1
                assert max(per_bucket.values()) < 512  # Redis alone would keep each one a listpack
                for bucket, count in per_bucket.items():
                    key = engine._k_bucket(name, bucket)
                    bulk = count >= shared.REDIS_HASHTABLE_PAIRS
                    assert engine.r.object("encoding", key) == (b"hashtable" if bulk else b"listpack"), (bucket, count)
                    assert bool(engine.r.hexists(key, field)) == bulk
                assert engine.stored_digest(name) == digest_pairs(records)  # exact: the marker is not counted
                # scans of the LOADING version show its records alone
                assert sorted(engine.scan(name, None, 10 * n)) == sorted(records)
                assert sorted(pair for chunk in engine.iterate(name) for pair in chunk) == sorted(records)
                expected = digest_pairs(records)
                sealed = client.seal(name, expected_records=expected.count, expected_digest=expected.value)
                assert (sealed.record_count, sealed.digest) == (n, expected.value)
                assert not any(engine.r.hexists(engine._k_bucket(name, b), field) for b in range(engine.buckets))
                assert sorted(pair for chunk in engine.iterate(name) for pair in chunk) == sorted(records)
                # sealed, the small buckets are Redis's compact listpacks again
                for bucket in per_bucket:
                    assert engine.r.object("encoding", engine._k_bucket(name, bucket)) == b"listpack"
            # a version whose buckets outgrow a listpack keeps its hash tables
            big = _pairs(10_000)  # ~625 a bucket
            client.create_namespace("ht__v4", "ht")
            with client.writer("ht__v4", batch_records=10_000) as writer:
                writer.add_arrays(pa.array([k for k, _ in big], pa.binary()), pa.array([v for _, v in big]))
            client.seal("ht__v4", expected_records=10_000, expected_digest=digest_pairs(big).value)
            for bucket in range(engine.buckets):
                assert engine.r.object("encoding", engine._k_bucket("ht__v4", bucket)) == b"hashtable"
            assert client.batch_get([big[0][0], big[-1][0]], namespace="ht__v4")[1] == [big[0][1], big[-1][1]]
            # a seal interrupted once the version was frozen (SEALING) removes the marker when finished
            client.create_namespace("ht__v3", "ht")
            client.put("ht__v3", _pairs(2_000))
            assert any(engine.r.hexists(engine._k_bucket("ht__v3", b), field) for b in range(engine.buckets))
            frozen = engine.get_namespace("ht__v3")
            engine.transition("ht__v3", frozenset({State.LOADING}), frozen.with_state(State.SEALING))
            expected = digest_pairs(_pairs(2_000))
            assert client.seal("ht__v3", expected_records=2_000, expected_digest=expected.value).verified
            assert not any(engine.r.hexists(engine._k_bucket("ht__v3", b), field) for b in range(engine.buckets))
    finally:
        server.stop(5)
