"""Real Redis and Cassandra servers and a Spark standalone cluster for the tests, started by the project's own scripts
(``scripts/services/*.sh``) on free loopback ports the first time a test needs one, and
stopped (their data folders removed) when the session ends.

To reuse a server that is already running (quicker while iterating), set
``BULLDOZER_TEST_REDIS_URL``, ``BULLDOZER_TEST_REDIS_CLUSTER_URL`` or
``BULLDOZER_TEST_CASSANDRA`` (``host:port``) or ``BULLDOZER_TEST_SPARK_MASTER``
(``spark://host:port``)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "services"

_lock = threading.Lock()
_started: dict[str, str] = {}
_folders: dict[str, str] = {}
_stops: list[list[str]] = []


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int, spread: int = 0) -> int:
    """A base port such that base..base+count-1 (and each +spread, for cluster buses) are free."""
    for _ in range(200):
        base = random.randint(20000, 40000)
        ports = [base + i for i in range(count)]
        if spread:
            ports += [p + spread for p in ports]
        if all(_free(p) for p in ports):
            return base
    raise RuntimeError("no free loopback ports")


def _start(kind: str, script: str, command: str, count: int, spread: int = 0) -> tuple[str, int]:
    folder = tempfile.mkdtemp(prefix=f"bulldozer-{kind}-")
    port = free_ports(count, spread)
    subprocess.run(["bash", str(SCRIPTS / script), command, folder, str(port)], check=True)
    _stops.append(["bash", str(SCRIPTS / script), "stop", folder])
    return folder, port


def redis_url() -> str:
    with _lock:
        if "redis" not in _started:
            url = os.environ.get("BULLDOZER_TEST_REDIS_URL")
            if not url:
                _, port = _start("redis", "redis.sh", "start", 1)
                url = f"redis://127.0.0.1:{port}/0"
            _started["redis"] = url
        return _started["redis"]


def redis_cluster_url() -> str:
    with _lock:
        if "redis-cluster" not in _started:
            url = os.environ.get("BULLDOZER_TEST_REDIS_CLUSTER_URL")
            if not url:
                _, port = _start("redis-cluster", "redis.sh", "start-cluster", 3, spread=10000)
                url = f"redis://127.0.0.1:{port}/0"
            _started["redis-cluster"] = url
        return _started["redis-cluster"]


def cassandra_endpoint() -> tuple[str, int]:
    with _lock:
        if "cassandra" not in _started:
            given = os.environ.get("BULLDOZER_TEST_CASSANDRA")
            if not given:
                folder, port = _start("cassandra", "cassandra.sh", "start", 2)
                _folders["cassandra"] = folder
                given = f"127.0.0.1:{port}"
            _started["cassandra"] = given
        host, _, port_text = _started["cassandra"].rpartition(":")
        return host, int(port_text)


def cassandra_pid() -> int | None:
    """The process id of the Cassandra the session started (None for an external one)."""
    cassandra_endpoint()
    folder = _folders.get("cassandra")
    return int(Path(folder, "cassandra.pid").read_text()) if folder else None


def spark_master() -> str:
    """A standalone master with one 2-core worker (``scripts/services/spark.sh``)."""
    with _lock:
        if "spark" not in _started:
            url = os.environ.get("BULLDOZER_TEST_SPARK_MASTER")
            if not url:
                _, port = _start("spark", "spark.sh", "start", 3)
                url = f"spark://127.0.0.1:{port}"
            _started["spark"] = url
        return _started["spark"]


def stop_all() -> None:
    with _lock:
        for command in reversed(_stops):
            subprocess.run(command, check=False)
        _stops.clear()
        _started.clear()
        _folders.clear()
