"""Two DALs over one store (Redis and Cassandra take any number; the memory engine stands
in for the others in one process): a version's labels written through both at once are all
kept — a run's split ledger and its heartbeat may reach different DALs behind one address —
and so is a label written through one while the other changes the version's state."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bulldozer.codec.digest import digest_pairs
from bulldozer.kv import KvDal, create_engine
from bulldozer.kv.backends import StorageEngine
from bulldozer.kv.types import NamespaceRecord, State
from bulldozer.names import new_version_name
from tests.integration import services

pytestmark = pytest.mark.integration


def _memory(tmp: Path) -> Callable[[], StorageEngine]:
    engine = create_engine({"type": "memory"})
    return lambda: engine  # one store, each DAL its own rules


def _embedded(tmp: Path) -> Callable[[], StorageEngine]:
    engine = create_engine({"type": "embedded", "path": str(tmp / "store"), "map_size": 1024**3})
    return lambda: engine  # one process opens an LMDB store once


def _redis(tmp: Path) -> Callable[[], StorageEngine]:
    config = {"type": "redis", "url": services.redis_url(), "prefix": f"bt_{uuid.uuid4().hex[:12]}", "buckets": 4}
    return lambda: create_engine(config)


def _cassandra(tmp: Path) -> Callable[[], StorageEngine]:
    host, port = services.cassandra_endpoint()
    keyspace = f"bt_{uuid.uuid4().hex[:12]}"
    config: dict[str, Any] = {
        "type": "cassandra",
        "contact_points": [host],
        "port": port,
        "keyspace": keyspace,
        "timeout_seconds": 60,
    }
    return lambda: create_engine(config)


STORES = pytest.mark.parametrize(
    "store", [_memory, _embedded, _redis, _cassandra], ids=["memory", "embedded", "redis", "cassandra"]
)


@STORES
def test_labels_written_through_two_dals_at_once_are_all_kept(
    store: Callable[[Path], Callable[[], StorageEngine]], tmp_path: Path
) -> None:
    same_store = store(tmp_path)
    dals = [KvDal(same_store()), KvDal(same_store())]
    name = new_version_name("scores")
    dals[0].create_namespace(name, "scores")
    writes = 25

    def write(which: int) -> None:
        for i in range(writes):
            dals[which].set_labels(name, {f"bulldozer.test{which}_{i}": str(i)})

    writers = [threading.Thread(target=write, args=(which,)) for which in (0, 1)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    labels = dals[1].describe(name).labels
    assert sorted(labels) == sorted(f"bulldozer.test{w}_{i}" for w in (0, 1) for i in range(writes))
    for engine in {id(dal.engine): dal.engine for dal in dals}.values():
        engine.close()


class _Interleaved:
    """The store as one DAL sees it, while the other DAL writes a label of the same version
    just before each of this one's record writes (once per state written)."""

    def __init__(self, engine: StorageEngine, other: KvDal) -> None:
        self.engine, self.other = engine, other
        self.written: list[str] = []

    def transition(
        self,
        name: str,
        expected: frozenset[State],
        record: NamespaceRecord,
        based_on: NamespaceRecord | None = None,
    ) -> NamespaceRecord:
        label = f"bulldozer.test_before_{record.state.value.lower()}"
        if label not in self.written:
            self.written.append(label)
            self.other.set_labels(name, {label: "1"})
        return self.engine.transition(name, expected, record, based_on=based_on)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.engine, attr)


@STORES
def test_a_label_written_while_another_dal_changes_the_state_is_kept(
    store: Callable[[Path], Callable[[], StorageEngine]], tmp_path: Path
) -> None:
    """The seal (LOADING → SEALING → SEALED), a refused seal (→ FAILED), mark_failed and drop:
    each state write keeps the label the other DAL wrote after it was read."""
    same_store = store(tmp_path)
    other = KvDal(same_store())
    interleaved = _Interleaved(same_store(), other)
    dal = KvDal(interleaved)  # type: ignore[arg-type]
    data = [(b"k%d" % i, b"v%d" % i) for i in range(10)]
    want = digest_pairs(data)

    def version(tag: str) -> str:
        name = new_version_name(tag)
        dal.create_namespace(name, tag)
        dal.put(name, data)
        interleaved.written.clear()
        return name

    sealed = version("sealed")
    assert dal.seal(sealed, want.count, want.value).state == State.SEALED
    refused = version("refused")
    with pytest.raises(Exception, match="verification failed"):
        dal.seal(refused, want.count + 1, want.value)
    failed = version("failed")
    dal.mark_failed(failed, "a test")
    dropped = version("dropped")
    dal.drop(dropped)
    expect = {
        sealed: (State.SEALED, ["sealing", "sealed"]),
        refused: (State.FAILED, ["sealing", "failed"]),
        failed: (State.FAILED, ["failed"]),
        dropped: (State.DROPPED, ["dropped"]),
    }
    for name, (state, before) in expect.items():
        record = other.describe(name)
        assert record.state == state
        assert sorted(k for k in record.labels if k.startswith("bulldozer.test_")) == sorted(
            f"bulldozer.test_before_{s}" for s in before
        ), name
    for engine in {id(e): e for e in (other.engine, interleaved.engine)}.values():
        engine.close()
