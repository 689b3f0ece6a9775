"""Real Redis and Cassandra servers, a Spark standalone cluster, a lakehouse (an S3 store
and Iceberg's REST catalog), PostgreSQL and MariaDB servers (an operator's SQL catalog) and
a Hive Metastore (an operator's Hive catalog) for the tests, started by the project's own scripts
(``scripts/services/*.sh``) on free loopback ports the first time a test needs one, and
stopped (their data folders removed) when the session ends.

To reuse a server that is already running (quicker while iterating), set
``BULLDOZER_TEST_REDIS_URL``, ``BULLDOZER_TEST_REDIS_CLUSTER_URL`` or
``BULLDOZER_TEST_CASSANDRA`` (``host:port``), ``BULLDOZER_TEST_SPARK_MASTER``
(``spark://host:port``), ``BULLDOZER_TEST_LAKEHOUSE`` (the S3 port) or
``BULLDOZER_TEST_POSTGRES`` or ``BULLDOZER_TEST_MYSQL`` (a SQLAlchemy URL with its user and
password) or ``BULLDOZER_TEST_HIVE`` (``thrift://host:port``)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable
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


def _shared(kind: str, variable: str, start: Callable[[], str]) -> str:
    """The address of the session's ``kind`` server: ``variable``'s, else one ``start``
    runs the first time it is asked for."""
    with _lock:
        if kind not in _started:
            _started[kind] = os.environ.get(variable) or start()
        return _started[kind]


def _started_at(kind: str, script: str, command: str, count: int, address: str, spread: int = 0) -> Callable[[], str]:
    """Start ``kind`` with ``script command``; its address is ``address`` with ``{port}``."""

    def start() -> str:
        folder, port = _start(kind, script, command, count, spread)
        _folders[kind] = folder
        return address.format(port=port)

    return start


def redis_url() -> str:
    return _shared(
        "redis", "BULLDOZER_TEST_REDIS_URL", _started_at("redis", "redis.sh", "start", 1, "redis://127.0.0.1:{port}/0")
    )


def redis_pid(kind: str, port: int) -> int | None:
    """The process id of the session's ``kind`` Redis (``redis`` or ``redis-cluster``) serving
    ``port``; None for an external one."""
    folder = _folders.get(kind)
    return int(Path(folder, str(port), "redis.pid").read_text()) if folder else None


def own_redis() -> int:
    """The port of a Redis server of the caller's alone (not the session's shared one),
    stopped when the session ends: for a test that changes the server's settings."""
    return _start("redis-own", "redis.sh", "start", 1)[1]


def redis_cluster_url() -> str:
    start = _started_at("redis-cluster", "redis.sh", "start-cluster", 3, "redis://127.0.0.1:{port}/0", spread=10000)
    return _shared("redis-cluster", "BULLDOZER_TEST_REDIS_CLUSTER_URL", start)


def cassandra_endpoint() -> tuple[str, int]:
    start = _started_at("cassandra", "cassandra.sh", "start", 2, "127.0.0.1:{port}")
    host, _, port_text = _shared("cassandra", "BULLDOZER_TEST_CASSANDRA", start).rpartition(":")
    return host, int(port_text)


def cassandra_pid() -> int | None:
    """The process id of the Cassandra the session started (None for an external one)."""
    cassandra_endpoint()
    folder = _folders.get("cassandra")
    return int(Path(folder, "cassandra.pid").read_text()) if folder else None


def spark_master() -> str:
    """A standalone master with one 2-core worker (``scripts/services/spark.sh``)."""
    start = _started_at("spark", "spark.sh", "start", 3, "spark://127.0.0.1:{port}")
    return _shared("spark", "BULLDOZER_TEST_SPARK_MASTER", start)


def lakehouse() -> int:
    """The port of the session's S3-compatible store; Iceberg's REST catalog server, keeping
    its tables in it, listens on the next (``scripts/services/lakehouse.sh``)."""
    start = _started_at("lakehouse", "lakehouse.sh", "start", 2, "{port}")
    return int(_shared("lakehouse", "BULLDOZER_TEST_LAKEHOUSE", start))


def _database_url(kind: str, dialect: str, variable: str) -> str:
    """The SQLAlchemy URL (``dialect``; user, password and database) of the session's ``kind``
    server (``scripts/services/KIND.sh``), or ``variable``'s."""

    def start() -> str:
        folder, port = _start(kind, f"{kind}.sh", "start", 1)
        password = Path(folder, "password").read_text().strip()
        return f"{dialect}://bulldozer:{password}@127.0.0.1:{port}/catalog"

    return _shared(kind, variable, start)


def postgres_url() -> str:
    """The session's PostgreSQL server (``scripts/services/postgres.sh``), through psycopg2."""
    return _database_url("postgres", "postgresql+psycopg2", "BULLDOZER_TEST_POSTGRES")


def mysql_url() -> str:
    """The session's MySQL-protocol server (MariaDB, ``scripts/services/mysql.sh``), through PyMySQL."""
    return _database_url("mysql", "mysql+pymysql", "BULLDOZER_TEST_MYSQL")


def hive_uri() -> str:
    """The session's Hive Metastore (``scripts/services/hive.sh``: Hive 2.3's, from the
    pyspark wheel's jars), as a Hive catalog's ``uri``."""
    return _shared(
        "hive", "BULLDOZER_TEST_HIVE", _started_at("hive", "hive.sh", "start", 1, "thrift://127.0.0.1:{port}")
    )


def stop_all() -> None:
    """Stop every server the session started, side by side: each stop waits for its server
    to end (Cassandra's ≈ 6 s, the Spark master's and worker's ≈ 4 s), and one after another
    they held each worker's end 18 s (Cassandra, Spark, Redis, the lakehouse, Hive, PostgreSQL),
    against 7 s side by side. None needs another to stop: their data folders go with them."""
    with _lock:
        stopping = [subprocess.Popen(command) for command in reversed(_stops)]
        for process in stopping:
            process.wait()
        _stops.clear()
        _started.clear()
        _folders.clear()


def chromedriver() -> str:
    """The path of ChromeDriver (Debian's chromium + chromium-driver, installed by
    ``scripts/services/chromium.sh`` the first time a test needs it)."""
    with _lock:
        if "chromedriver" not in _started:
            out = subprocess.run(["bash", str(SCRIPTS / "chromium.sh"), "install"], check=True, capture_output=True)
            _started["chromedriver"] = out.stdout.decode().strip().splitlines()[-1]
        return _started["chromedriver"]
