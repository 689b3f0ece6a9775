"""Two DALs over one store (Redis and Cassandra take any number; the memory engine stands
in for the others in one process): a version's labels written through both at once are all
kept — a run's split ledger and its heartbeat may reach different DALs behind one address."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bulldozer.kv import KvDal, create_engine
from bulldozer.kv.backends import StorageEngine
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


@pytest.mark.parametrize(
    "store", [_memory, _embedded, _redis, _cassandra], ids=["memory", "embedded", "redis", "cassandra"]
)
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
