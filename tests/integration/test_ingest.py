"""The embedded engine's staged writes and their ingest, on both data planes: the Go plane
stages a batch as byte for byte the run the Python engine would (the layout written once in
proto/bulldozer/kv/v1/shared.yaml), and a DAL process SIGKILLed at any moment of an ingest
leaves the version LOADING with either every run still staged or every record ingested —
never part of them at this size (the Go ingest commits every 64 MiB; native/kvd/lmdb's
ingest_test.go checks a chunked ingest) — after which a seal (what a resumed run does)
verifies it."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from bulldozer.codec.digest import digest_pairs
from bulldozer.kv import KvClient, create_engine
from bulldozer.kv.backends.embedded import EmbeddedEngine, run_records, sorted_run
from bulldozer.kv.types import State
from bulldozer.names import new_version_name
from tests.integration.test_seal_crash import Dal

pytestmark = pytest.mark.integration


def _staged(store: Path, name: str) -> tuple[list[bytes], int]:
    """The namespace's staged runs and how many records its data holds, read from the store."""
    engine = create_engine({"type": "embedded", "path": str(store)})
    assert isinstance(engine, EmbeddedEngine)
    try:
        data = engine._db(name)  # a handle is opened outside the transaction that uses it
        with engine.env.begin() as txn:
            prefix = name.encode() + b"\x00"
            runs = [bytes(v) for k, v in txn.cursor(db=engine._stage) if k.startswith(prefix)]
            return runs, txn.stat(data)["entries"]
    finally:
        engine.close()


@pytest.mark.parametrize("plane", ["python", "native"])
def test_a_staged_run_is_the_same_bytes_on_both_planes(plane: str, tmp_path: Path) -> None:
    keys = [b"k%05d" % i for i in random.Random(3).sample(range(5000), 2000)]
    keys += [keys[7], keys[100]]  # repeated: the last value wins
    values = [b"v%d" % i for i in range(len(keys))]
    dal = Dal(["--path", str(tmp_path / "store"), "--data-plane", plane])
    try:
        with KvClient(dal.endpoint) as client:
            name = new_version_name("staged")
            client.create_namespace(name, "staged")
            client.put(name, list(zip(keys, values, strict=True)))
    finally:
        dal.stop()
    runs, stored = _staged(tmp_path / "store", name)
    expected, repeated = sorted_run(keys, values)
    assert repeated and stored == 0 and runs == [expected]
    records = list(run_records(expected))
    assert [k for k, _ in records] == sorted(set(keys)) and dict(records)[keys[7]] == values[-2]


@pytest.mark.parametrize("plane", ["python", "native"])
def test_an_ingest_killed_at_any_moment_is_all_or_nothing(plane: str, tmp_path: Path) -> None:
    data = [(b"key-%08d" % i, b"value-%d" % i * 3) for i in random.Random(5).sample(range(10**7), 120_000)]
    expected = digest_pairs(sorted(data))
    store = tmp_path / "store"
    dal = Dal(["--path", str(store), "--data-plane", plane])
    outcomes = set()
    try:
        for delay in (0.0, 0.02, 0.05, 0.1, 0.2, 0.5, 5.0):
            name = new_version_name("crash")
            with KvClient(dal.endpoint, timeout=60) as client:
                client.create_namespace(name, "crash")
                for i in range(0, len(data), 10_000):
                    client.put(name, data[i : i + 10_000])
            ingest = threading.Thread(target=_ingest_quietly, args=(dal.endpoint, name))
            ingest.start()
            time.sleep(delay)
            dal.kill()
            ingest.join(60)
            runs, stored = _staged(store, name)
            assert (len(runs), stored) in ((12, 0), (0, len(data))), f"after {delay} s: {len(runs)} runs, {stored}"
            outcomes.add(stored)
            dal.start()
            with KvClient(dal.endpoint, timeout=60) as client:
                assert client.describe(name).state == State.LOADING
                sealed = client.seal(name, expected.count, expected.value)
                assert (sealed.state, sealed.verified, sealed.record_count) == (State.SEALED, True, len(data))
                assert client.get(data[0][0], namespace=name) == data[0][1]
    finally:
        dal.stop()
    assert outcomes == {0, len(data)}  # the first kill came before the ingest, the last after it


def _ingest_quietly(endpoint: str, name: str) -> None:
    try:
        with KvClient(endpoint, timeout=60) as client:
            client.ingest(name)
    except Exception:  # the DAL was killed under it
        pass


@pytest.mark.parametrize("plane", ["python", "native"])
def test_a_full_store_refuses_the_ingest_and_keeps_every_other_version(plane: str, tmp_path: Path) -> None:
    """The runs fit in the store, but not the runs and the merged data together (they live
    side by side until the ingest commits): the ingest is refused with one clear error, the
    new version stays LOADING (and can be failed and dropped, which frees its runs), and the
    alias and the live version are untouched."""
    from bulldozer.errors import ResourceExhaustedError

    dal = Dal(["--path", str(tmp_path / "store"), "--data-plane", plane, "--map-size-gib", str(12 / 1024)])
    try:
        with KvClient(dal.endpoint, timeout=60) as client:
            live_data = [(b"live-%04d" % i, b"x" * 100) for i in range(500)]
            live = new_version_name("full")
            client.create_namespace(live, "full")
            client.put(live, live_data)
            expected = digest_pairs(live_data)
            client.seal(live, expected.count, expected.value)
            client.compare_and_set_alias("full", None, live)
            big = [(b"big-%06d" % i, b"y" * 400) for i in range(16_000)]  # ≈ 6.6 MiB: staged once, it fits
            name = new_version_name("full")
            client.create_namespace(name, "full")
            for i in range(0, len(big), 2_000):
                client.put(name, big[i : i + 2_000])
            with pytest.raises(ResourceExhaustedError, match="is full"):
                client.ingest(name)
            assert client.describe(name).state == State.LOADING
            expected = digest_pairs(big)
            with pytest.raises(ResourceExhaustedError, match="is full"):
                client.seal(name, expected.count, expected.value)
            client.mark_failed(name, "the store is full")
            client.drop(name)
            assert client.get_alias("full").namespace == live
            assert client.get(b"live-0007", alias="full") == b"x" * 100
            again = new_version_name("full")  # the space of the dropped runs is free again
            client.create_namespace(again, "full")
            client.put(again, live_data)
            expected = digest_pairs(live_data)
            assert client.seal(again, expected.count, expected.value).verified
    finally:
        dal.stop()
