"""Engines, servers and clients for the KV DAL contract suite.

A new engine joins the suite by adding one entry to ENGINE_FACTORIES."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bulldozer.codec.digest import digest_pairs
from bulldozer.kv import KvClient, KvDal, Limits, create_engine
from bulldozer.kv.backends import StorageEngine
from bulldozer.kv.server import create_server
from bulldozer.names import new_version_name
from tests.integration import services

TEST_LIMITS = Limits(max_value_bytes=256 * 1024, max_message_bytes=4 * 1024 * 1024, max_key_bytes=4096)


def _memory(tmp: Path) -> StorageEngine:
    return create_engine({"type": "memory"})


def _embedded(tmp: Path) -> StorageEngine:
    return create_engine({"type": "embedded", "path": str(tmp / "store"), "map_size": 1024**3})


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def _redis(tmp: Path) -> StorageEngine:
    return create_engine({"type": "redis", "url": services.redis_url(), "prefix": _unique("bt"), "buckets": 16})


def _redis_cluster(tmp: Path) -> StorageEngine:
    url = services.redis_cluster_url()
    return create_engine({"type": "redis", "url": url, "cluster": True, "prefix": _unique("bt"), "buckets": 16})


def _cassandra(tmp: Path) -> StorageEngine:
    host, port = services.cassandra_endpoint()
    return create_engine(
        {"type": "cassandra", "contact_points": [host], "port": port, "keyspace": _unique("bt"), "timeout_seconds": 60}
    )


ENGINE_FACTORIES: dict[str, Callable[[Path], StorageEngine]] = {
    "memory": _memory,
    "embedded": _embedded,
    "redis": _redis,
    "redis-cluster": _redis_cluster,
    "cassandra": _cassandra,
}
#: (engine, transport) pairs the suite runs over.
CASES = [
    ("memory", "grpc"),
    ("embedded", "grpc"),
    ("embedded", "native"),  # bulldozer-kvd in front of the DAL (bulldozer.kv.server.native)
    ("memory", "in-process"),
    ("redis", "grpc"),
    ("redis", "native"),  # bulldozer-kvd writing and reading Redis itself
    ("redis-cluster", "grpc"),
    ("redis-cluster", "native"),
    ("cassandra", "grpc"),
]
_counter = itertools.count()


class Harness:
    """One engine behind a real server, and a client of it."""

    def __init__(self, engine_name: str, transport: str, tmp: Path) -> None:
        self.engine_name = engine_name
        self.engine = ENGINE_FACTORIES[engine_name](tmp)
        if transport in ("grpc", "native"):
            plane = "native" if transport == "native" else "python"
            self.server, self.port = create_server("127.0.0.1:0", self.engine, limits=TEST_LIMITS, data_plane=plane)
            self.client = KvClient(f"127.0.0.1:{self.port}", timeout=30, principal="tester")
            self.client.wait_ready()
        else:
            self.server, self.port = None, 0  # type: ignore[assignment]
            self.client = KvClient.in_process(KvDal(self.engine, TEST_LIMITS), principal="tester")

    def alias(self) -> str:
        return f"a{next(_counter)}_{uuid.uuid4().hex[:8]}"

    def version(self, alias: str) -> str:
        return new_version_name(alias)

    def loaded(self, alias: str, pairs: list[tuple[bytes, bytes]], seal: bool = True, generation: int = 1) -> str:
        name = self.version(alias)
        self.client.create_namespace(name, alias, job_name="tests", schema_generation=generation)
        if pairs:
            self.client.put(name, pairs)
        if seal:
            seal_as_loaded(self.client, name, pairs)
        return name

    def close(self) -> None:
        self.client.close()
        if self.server is not None:
            self.server.stop(1)
        else:
            self.engine.close()


@pytest.fixture(params=CASES, ids=[f"{e}-{t}" for e, t in CASES], scope="module")
def kv(request: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    engine_name, transport = request.param
    harness = Harness(engine_name, transport, tmp_path_factory.mktemp(f"kv-{engine_name}"))
    yield harness
    harness.close()


def seal_as_loaded(client: KvClient, name: str, data: list[tuple[bytes, bytes]]) -> Any:
    """Seal ``name`` expecting exactly ``data`` (distinct keys), as a loader that sent it would."""
    expected = digest_pairs(data)
    return client.seal(name, expected.count, expected.value)


def sealed_version(client: KvClient, alias: str, job: Any, data: list[tuple[bytes, bytes]]) -> str:
    """A new version of ``alias`` with the schema of ``job`` (a JobSchema) holding exactly
    ``data``, sealed as a loader would: as a run of another tool or release may have left one."""
    from bulldozer.names import new_version_name

    name = new_version_name(alias)
    client.create_namespace(
        name,
        alias,
        value_descriptor_set=job.descriptor_set,
        key_message=job.key_full_name,
        value_message=job.value_full_name,
    )
    client.put(name, data)
    seal_as_loaded(client, name, data)
    return name


def only_refusals(client: KvClient, alias: str | None = None) -> list[Any]:
    """The namespaces of ``alias``, checked to be what refused runs leave and nothing else:
    FAILED versions holding no data (kept so `bulldozer runs` shows the reason)."""
    from bulldozer.kv.types import State

    records = client.list_namespaces(alias)
    assert all(r.state is State.FAILED and r.record_count == 0 and r.bytes == 0 for r in records), records
    return records


def pairs(n: int, prefix: bytes = b"k", value: bytes = b"v") -> list[tuple[bytes, bytes]]:
    return [(prefix + b"%06d" % i, value + b"%d" % i) for i in range(n)]


@pytest.fixture
def dal(tmp_path: Path) -> Iterator[KvClient]:
    """A client of a real DAL server (embedded engine) for one test."""
    engine = create_engine({"type": "embedded", "path": str(tmp_path / "kv"), "map_size": 1024**3})
    server, port = create_server("127.0.0.1:0", engine)
    client = KvClient(f"127.0.0.1:{port}")
    yield client
    client.close()
    server.stop(1)
