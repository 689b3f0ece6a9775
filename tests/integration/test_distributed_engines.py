"""Redis and Cassandra as the DAL's engine, end to end and under faults: real servers
started by scripts/services/*.sh, real ``bulldozer serve`` processes in front of them.

(The contract suite in test_kv_contract.py also runs on both engines.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bulldozer.codec.digest import digest_pairs
from bulldozer.errors import BackendUnavailableError, ForeignDataError, ResourceExhaustedError
from bulldozer.kv import KvClient, KvDal, Limits, create_engine
from bulldozer.kv.backends.base import StorageEngine
from bulldozer.kv.types import State
from bulldozer.load.runner import run_job
from bulldozer.names import new_version_name
from bulldozer.warehouse.sample import create_sample_warehouse
from tests.integration import services
from tests.integration.test_faults import REPEATS, Tally
from tests.integration.test_kv_server import _free_port, _start, race_to_flip, stop_servers
from tests.integration.test_run import KEY, _cli, spec

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "bulldozer.cli.main"]
ENGINES = ["redis", "redis-cluster", "cassandra"]


def serve_args(engine: str, name: str) -> list[str]:
    """``bulldozer serve`` flags for one store called ``name`` on the test servers."""
    if engine == "cassandra":
        host, port = services.cassandra_endpoint()
        return ["--engine", "cassandra", "--contact-point", host, "--cql-port", str(port), "--keyspace", name]
    url = services.redis_cluster_url() if engine == "redis-cluster" else services.redis_url()
    return ["--engine", "redis", "--url", url, "--prefix", name, *(["--cluster"] if engine == "redis-cluster" else [])]


def engine_for(engine: str, name: str, **options: object) -> StorageEngine:
    if engine == "cassandra":
        host, port = services.cassandra_endpoint()
        config: dict[str, object] = {"type": "cassandra", "contact_points": [host], "port": port, "keyspace": name}
    else:
        url = services.redis_cluster_url() if engine == "redis-cluster" else services.redis_url()
        config = {"type": "redis", "url": url, "prefix": name, "cluster": engine == "redis-cluster"}
    return create_engine({**config, **options})


def unique() -> str:
    return f"it_{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=ENGINES)
def engine_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_two_dal_processes_on_one_cluster_race_to_flip(engine_name: str) -> None:
    store = unique()
    ports = [_free_port(), _free_port()]
    procs = [_start(None, p, *serve_args(engine_name, store)) for p in ports]
    try:
        a, b = (KvClient(f"127.0.0.1:{p}", principal=f"server{i}") for i, p in enumerate(ports))
        race_to_flip(a, b, rounds=4)
        a.close()
        b.close()
    finally:
        stop_servers(procs)


@pytest.mark.parametrize("engine", ["redis", "cassandra"])
def test_bulldozer_run_end_to_end(engine: str, tmp_path: Path) -> None:
    """The unchanged template spec, pointed at a DAL in front of the engine by its endpoint only."""
    home = tmp_path / "h"
    create_sample_warehouse(home, rows=3_000)
    port = _free_port()
    server = _start(None, port, *serve_args(engine, unique()))
    try:
        endpoint = {"BULLDOZER_ENDPOINT": f"127.0.0.1:{port}"}
        result = _cli(["run", "templates/move_data_to_kv_dal.yaml", "--json"], home, endpoint)
        assert result.returncode == 0, result.stderr
        record = json.loads(result.stdout)
        assert record["outcome"] == "succeeded" and record["rows"] == 3_000
        got = _cli(["get", "user_item_scores", "--key", json.dumps(KEY), "--endpoint", f"127.0.0.1:{port}"], home)
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout)["profile"]["tier"] in {"free", "basic", "premium"}
        with KvClient(f"127.0.0.1:{port}") as client:
            info = client.describe(record["version"])
            assert info.state == State.ACTIVE and info.record_count == 3_000
            assert client.get_alias("user_item_scores").namespace == record["version"]
    finally:
        stop_servers([server])


@pytest.mark.parametrize("engine", ["redis", "redis-cluster", "cassandra"])
def test_unreachable_engine_is_one_clear_line(engine: str, tmp_path: Path) -> None:
    """(A Redis Cluster client's own errors are not redis-py RedisErrors: ``--cluster`` with
    no node there ended ``serve`` with redis-py's traceback.)"""
    args = (
        ["--engine", "redis", "--url", f"redis://127.0.0.1:{_free_port()}/0"]
        if engine.startswith("redis")
        else ["--engine", "cassandra", "--cql-port", str(_free_port())]
    )
    args += ["--cluster"] if engine == "redis-cluster" else []
    result = _cli(["serve", *args, "--port", "0"], tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: cannot reach") and "127.0.0.1:" in line, result.stderr
    with pytest.raises(BackendUnavailableError, match="cannot reach"):
        if engine.startswith("redis"):
            url = f"redis://127.0.0.1:{_free_port()}/0"
            create_engine({"type": "redis", "url": url, "timeout_seconds": 2, "cluster": engine == "redis-cluster"})
        else:
            create_engine({"type": "cassandra", "port": _free_port(), "connect_timeout_seconds": 2})


def test_a_standalone_redis_served_as_a_cluster_is_one_line(tmp_path: Path) -> None:
    """``--cluster`` pointed at a Redis that is not in cluster mode: one line saying so (it
    was redis-py's traceback)."""
    result = _cli(["serve", *serve_args("redis", unique()), "--cluster", "--port", "0"], tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: cannot reach Redis at redis://127.0.0.1:") and line.endswith(
        "(cluster): Redis Cluster cannot be connected. Please provide at least one reachable node: Cluster mode is "
        "not enabled on this node"
    ), line


def test_a_redis_url_redis_py_cannot_take_is_one_line(tmp_path: Path) -> None:
    """A Redis URL of another scheme or an impossible port ended ``serve`` with redis-py's
    traceback, and a database named by anything but a number was taken as database 0
    without a word: each is refused in one line, which never quotes the URL (a password
    may be in it)."""
    refused = {
        "http://alice:s3cret@127.0.0.1:1/0": "Redis URL must specify one of the following schemes",
        "redis://alice:s3cret@127.0.0.1:99999/0": "Port out of range 0-65535",
        "redis://alice:s3cret@127.0.0.1:1/users": "its path names the database by number (/0, /1, ...), not 'users'",
    }
    for url, said in refused.items():
        result = _cli(["serve", "--engine", "redis", "--url", url, "--port", "0"], tmp_path)
        assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("error: invalid redis engine configuration: url: not a Redis URL: "), line
        assert said in line, line
        assert "s3cret" not in result.stderr + result.stdout


def test_a_cassandra_password_without_its_user_is_refused() -> None:
    """The driver sends credentials as a pair: a password without a username was left unused
    without a word (the DAL connected without credentials)."""
    from bulldozer.errors import InvalidArgumentError
    from bulldozer.kv.backends import engine_config

    with pytest.raises(InvalidArgumentError, match="password without username") as refused:
        engine_config({"type": "cassandra", "password": "s3cret"})
    assert "s3cret" not in str(refused.value)
    assert engine_config({"type": "cassandra", "username": "bulldozer", "password": "s3cret"}).username == "bulldozer"


def test_a_redis_pool_size_given_for_a_cluster_is_refused() -> None:
    """``max_connections`` sizes a standalone client's pool: given with ``cluster: true`` it
    was left unused without a word."""
    from bulldozer.errors import InvalidArgumentError
    from bulldozer.kv.backends import engine_config

    with pytest.raises(InvalidArgumentError, match="max_connections sizes a standalone Redis client's pool"):
        engine_config({"type": "redis", "cluster": True, "max_connections": 8})
    assert engine_config({"type": "redis", "cluster": True}).cluster
    assert engine_config({"type": "redis", "max_connections": 8}).max_connections == 8


def test_a_redis_prefix_holding_foreign_keys_is_refused() -> None:
    import redis

    prefix = unique()
    r = redis.Redis.from_url(services.redis_url())
    r.set(f"{prefix}:user:1", b"not ours")
    with pytest.raises(ForeignDataError, match=f"prefix '{prefix}' already holds keys"):
        engine_for("redis", prefix)
    assert r.get(f"{prefix}:user:1") == b"not ours"  # untouched
    engine_for("redis", unique()).close()  # a fresh prefix is fine ...
    ours = unique()
    engine_for("redis", ours).close()
    engine_for("redis", ours).close()  # ... and so is reopening our own


def test_a_cassandra_keyspace_holding_foreign_tables_is_refused() -> None:
    from cassandra.cluster import Cluster

    host, port = services.cassandra_endpoint()
    keyspace = unique()
    cluster = Cluster([host], port=port, protocol_version=5)
    try:
        session = cluster.connect()
        session.execute(
            f"CREATE KEYSPACE {keyspace} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
        )
        session.execute(f"CREATE TABLE {keyspace}.users (id int PRIMARY KEY, name text)")
        session.execute(f"INSERT INTO {keyspace}.users (id, name) VALUES (1, 'not ours')")
        with pytest.raises(ForeignDataError, match=f"keyspace '{keyspace}' already holds tables.*users"):
            engine_for("cassandra", keyspace)
        assert next(iter(session.execute(f"SELECT name FROM {keyspace}.users"))).name == "not ours"
        assert {
            r.table_name
            for r in session.execute(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (keyspace,)
            )
        } == {"users"}
        ours = unique()
        engine_for("cassandra", ours).close()
        engine_for("cassandra", ours).close()  # reopening our own keyspace is fine
    finally:
        cluster.shutdown()


def test_values_over_the_engine_limit_are_refused_and_large_ones_kept_whole(engine_name: str) -> None:
    engine = engine_for(engine_name, unique())
    dal = KvDal(engine, Limits(max_value_bytes=1024**3, max_message_bytes=1024**3))
    try:
        assert dal.limits.max_value_bytes == engine.max_value_bytes
        name = new_version_name("big")
        dal.create_namespace(name, "big")
        with pytest.raises(ResourceExhaustedError, match="over the limit"):
            dal.put(name, [(b"too-big", b"x" * (engine.max_value_bytes + 1))])
        large = os.urandom(3 * 1024 * 1024)
        dal.put(name, [(b"large", large), (b"small", b"s")])
        sealed = dal.seal(name, 2, digest_pairs([(b"large", large), (b"small", b"s")]).value)
        assert sealed.record_count == 2
        assert dal.batch_get([b"large", b"small"], namespace=name)[1] == [large, b"s"]
    finally:
        engine.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A Redis of this test's own, so stopping it disturbs nothing else."""
    folder, port = str(tmp_path / "redis"), services.free_ports(1)
    subprocess.run(["bash", str(services.SCRIPTS / "redis.sh"), "start", folder, str(port)], check=True)
    yield folder, port
    subprocess.run(["bash", str(services.SCRIPTS / "redis.sh"), "stop", folder], check=False)


def storage_stopped_mid_load(tmp_path: Path, engine_yaml: str, pid: int, label: str) -> None:
    """SIGSTOP the storage server mid-load, REPEATS times, under a DAL configured by
    ``engine_yaml``: the run fails cleanly, the alias stays, no sealed version misses a
    record, and a resume or rerun then finishes."""
    home = tmp_path / "h"
    create_sample_warehouse(home, rows=30_000, chunk_rows=10_000)
    config = tmp_path / "engine.yaml"
    config.write_text(engine_yaml)
    port = _free_port()
    server = _start(None, port, "--engine-config", str(config))
    try:
        with KvClient(f"127.0.0.1:{port}", timeout=30) as client:
            _stop_and_recover(client, home, pid, label)
    finally:
        stop_servers([server])


def _stop_and_recover(client: KvClient, home: Path, pid: int, label: str) -> None:
    loaded = spec()
    tally = Tally(run_job(loaded, client, home=str(home)).version)
    for i in range(REPEATS):

        def stop(done: int, total: int, at: int = 8_000 + 6_000 * i) -> None:
            if done >= at:
                os.kill(pid, signal.SIGSTOP)

        try:
            with pytest.raises(BackendUnavailableError):
                run_job(loaded, client, home=str(home), progress=stop)
        finally:
            os.kill(pid, signal.SIGCONT)
        client.wait_ready(timeout=30)
        tally.after_fault(client, home)
    tally.report(label, REPEATS)


def test_redis_stopped_mid_load(own_redis: tuple[str, int], tmp_path: Path) -> None:
    folder, redis_port = own_redis
    redis_pid = int(Path(folder, str(redis_port), "redis.pid").read_text())
    engine_yaml = f"type: redis\nurl: redis://127.0.0.1:{redis_port}/0\ntimeout_seconds: 2\n"
    storage_stopped_mid_load(tmp_path, engine_yaml, redis_pid, "Redis server stopped (SIGSTOP) mid-load")


@pytest.mark.parametrize("engine", ["redis", "redis-cluster"])
def test_a_redis_command_that_timed_out_is_not_sent_again(engine: str) -> None:
    """A command whose answer did not come in time can still run: the stalled server reads it
    once it resumes. A copy sent again on a new connection would then run twice, and a write
    fence's lease entered twice can come back after its release (a seal then waits it out).
    The request fails instead, and its caller retries the whole request. Here the server
    holding the fence is stopped (SIGSTOP) while a batch enters it, for longer than the
    client's timeout, and resumes while a resent copy would still be waiting for its answer:
    the fence's script ran once."""
    import threading
    from urllib.parse import urlsplit

    import redis as redis_py

    from bulldozer.kv.types import NamespaceRecord

    eng: Any = engine_for(engine, unique(), timeout_seconds=1.0)
    try:
        name = new_version_name("stall")
        eng.create_namespace(NamespaceRecord(name=name, alias="stall"))
        eng.write_batch(name, [b"a"], [b"1"])  # the fence's scripts are loaded now
        if engine == "redis-cluster":
            node = eng.r.get_node_from_key(eng._k_namespaces)
            host, port = node.host, int(node.port)
        else:
            url = urlsplit(eng.config.url)
            host, port = str(url.hostname), int(url.port or 6379)
        pid = services.redis_pid(engine, port)
        if pid is None:
            pytest.skip("the test's Redis is an external server; this test stops the one it started")
        raw = redis_py.Redis(host=host, port=port)

        def scripts_run() -> int:
            return int(raw.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

        before = scripts_run()
        os.kill(pid, signal.SIGSTOP)
        resume = threading.Timer(1.6, os.kill, (pid, signal.SIGCONT))
        resume.start()
        try:
            with pytest.raises(BackendUnavailableError, match="not reachable"):
                eng.write_batch(name, [b"b"], [b"2"])
        finally:
            resume.join()
            os.kill(pid, signal.SIGCONT)
        assert raw.ping()  # (after what the resumed server had been sent)
        assert scripts_run() - before == 1
    finally:
        eng.close()


@pytest.mark.parametrize("engine", ["redis", "redis-cluster"])
def test_a_base_bucket_restored_twice_still_copies_the_base(engine: str) -> None:
    """A delta's base is copied bucket by bucket with DUMP and RESTORE. A RESTORE that ran
    but whose answer was lost is sent once more by redis-py's cluster pipeline (the commands
    of a node that timed out): the bucket is already there. The copy made it again; it failed
    with BUSYKEY, and the new version with it."""
    from bulldozer.kv.types import NamespaceRecord

    eng: Any = engine_for(engine, unique())
    dal = KvDal(eng)
    try:
        pairs = [(b"key-%05d" % i, b"value %d" % i) for i in range(3_000)]
        base = new_version_name("copied")
        dal.create_namespace(base, "copied")
        dal.put(base, pairs)
        dal.seal(base, len(pairs), digest_pairs(pairs).value)
        target = new_version_name("copied")
        eng.create_namespace(NamespaceRecord(name=target, alias="copied", base=base))
        first, again = eng._k_bucket(base, 0), eng._k_bucket(target, 0)
        eng.r.restore(again, 0, eng.r.dump(first))  # the first copy of a RESTORE sent twice
        eng.copy_records(base, target)
        assert eng.stored_digest(target) == digest_pairs(pairs)
        assert sorted(kv for chunk in eng.iterate(target) for kv in chunk) == pairs
    finally:
        eng.close()


@pytest.mark.parametrize("engine", ["redis", "redis-cluster"])
@pytest.mark.parametrize("transport", ["grpc", "native"])
def test_a_refused_pipelined_write_says_the_reply_and_no_record(engine: str, transport: str, tmp_path: Path) -> None:
    """Redis refusing a pipelined command (here: the bucket a batch writes holds a string
    Bulldozer did not write): redis-py put the refused command, keys and values included,
    before the server's reply, and that text was the request's error, for the run's
    terminal and the DAL's log. The error is the reply alone, on one line, from either
    data plane."""
    from bulldozer.kv.backends._buckets import bucket_of
    from tests.integration.kv_fixtures import Harness

    kv = Harness(engine, transport, tmp_path)
    try:
        alias = kv.alias()
        name = kv.version(alias)
        kv.client.create_namespace(name, alias)
        key = b"customer-4711"
        engine_: Any = kv.engine
        engine_.r.set(engine_._k_bucket(name, bucket_of(key, engine_.buckets)), b"not a hash")
        with pytest.raises(BackendUnavailableError) as refused:
            kv.client.put(name, [(key, b"card 4111-1111-1111-1111")])
        said = str(refused.value)
        assert said.endswith("refused a command: WRONGTYPE Operation against a key holding the wrong kind of value")
        assert "4111" not in said and "customer" not in said and "\n" not in said
    finally:
        kv.close()


def test_cassandra_stopped_mid_load(tmp_path: Path) -> None:
    pid = services.cassandra_pid()
    if pid is None:
        pytest.skip("BULLDOZER_TEST_CASSANDRA names an external server; this test stops the one it started")
    host, cql_port = services.cassandra_endpoint()
    engine_yaml = (
        f"type: cassandra\ncontact_points: [{host}]\nport: {cql_port}\nkeyspace: {unique()}\ntimeout_seconds: 3\n"
    )
    storage_stopped_mid_load(tmp_path, engine_yaml, pid, "Cassandra server stopped (SIGSTOP) mid-load")


def test_cassandra_backpressure_slows_the_writes_and_never_fails_them() -> None:
    """Far more writes in flight than one node takes (here it answers ConnectionBusy at some
    of these loads, not at all of them): the engine backs off, lowers its limit, sends the
    refused batches again, and stores every record exactly once."""
    import threading

    engine = engine_for("cassandra", unique(), concurrency=4096)
    dal = KvDal(engine)
    try:
        name = new_version_name("busy")
        dal.create_namespace(name, "busy")
        data = [(b"key-%08d" % i, b"v" * 200) for i in range(160_000)]
        errors: list[BaseException] = []

        def put(chunk: list[tuple[bytes, bytes]]) -> None:
            try:
                dal.put(name, chunk)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=put, args=(data[i : i + 20_000],)) for i in range(0, len(data), 20_000)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []  # whether or not the node pushed back this time (a fake node always does:
        # tests/unit/test_cassandra_backpressure.py); before the throttle, when it did, the puts failed
        print(f"\nRESULT | cassandra backpressure | pushed back {engine._throttle.pushed_back} times |")  # type: ignore[attr-defined]
        expected = digest_pairs(data)
        sealed = dal.seal(name, expected.count, expected.value)
        assert (sealed.state, sealed.record_count) == (State.SEALED, len(data))
    finally:
        engine.close()


def test_cassandra_contact_points_take_host_and_port(tmp_path: Path) -> None:
    host, port = services.cassandra_endpoint()
    server = _start(
        None, _free_port(), "--engine", "cassandra", "--contact-point", f"{host}:{port}", "--keyspace", unique()
    )
    stop_servers([server])
    bad = subprocess.run(
        [*CLI, "serve", "--engine", "cassandra", "--contact-point", "c1:99999", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1].startswith("error: ") and "c1:99999" in bad.stderr, bad.stderr
