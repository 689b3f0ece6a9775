"""The KV DAL server as a process: limits, health, reflection, metrics, shutdown, and
several server processes on one embedded store."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from bulldozer.errors import AliasConflictError, BackendUnavailableError, ResourceExhaustedError
from bulldozer.kv import KvClient, Limits, create_engine
from bulldozer.kv.server import SERVICE_NAMES, create_server
from bulldozer.kv.server.metrics import Metrics
from bulldozer.kv.v1 import kv_pb2, kv_pb2_grpc
from bulldozer.names import new_version_name
from tests.integration.kv_fixtures import seal_as_loaded

pytestmark = pytest.mark.integration


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[object, int, Metrics]]:
    metrics = Metrics()
    engine = create_engine({"type": "embedded", "path": str(tmp_path / "s"), "map_size": 1024**3})
    running, port = create_server("127.0.0.1:0", engine, limits=Limits(max_message_bytes=1024 * 1024), metrics=metrics)
    yield running, port, metrics
    running.stop(1)


def test_batch_over_the_message_limit_is_resource_exhausted(
    server: tuple[object, int, Metrics],
) -> None:
    _, port, _ = server
    with KvClient(f"127.0.0.1:{port}") as client:
        name = new_version_name("big")
        client.create_namespace(name, "big")
        with pytest.raises(ResourceExhaustedError):
            client.put(name, [(b"k%d" % i, b"v" * 100_000) for i in range(20)])  # ~2 MB > 1 MiB
        assert client.describe(name).record_count == 0


def test_health_and_reflection(server: tuple[object, int, Metrics]) -> None:
    _, port, _ = server
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", *SERVICE_NAMES):
        assert (
            health.Check(health_pb2.HealthCheckRequest(service=service)).status
            == health_pb2.HealthCheckResponse.SERVING
        )
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    listed = {s.name for r in responses for s in r.list_services_response.service}
    assert set(SERVICE_NAMES) <= listed and "grpc.health.v1.Health" in listed
    channel.close()


def test_a_dal_a_command_hosts_for_itself_serves_health_without_reflection(tmp_path: Path) -> None:
    """The DAL a ``bulldozer run`` hosts on its private socket answers health checks (the
    command waits for them) and the KV services, but serves no reflection: no one else can
    reach it, and registering reflection cost the command's start ≈ 10 ms."""
    from bulldozer.kv.connect import host_embedded_dal

    with host_embedded_dal(tmp_path) as dal:
        dal.wait()
        channel = grpc.insecure_channel(dal.address)
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
        with KvClient(dal.address) as client:
            assert client.list_aliases() == []
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        channel.close()


def test_a_hosted_dal_takes_its_commands_namespace_and_alias_calls_in_process(tmp_path: Path) -> None:
    """A command's client of the DAL it hosts (``KvClient.hosted``) calls the DAL's namespace
    and alias services in process, and only its data calls go to kvd: with the DAL's own
    gRPC server stopped (kvd can relay nothing), a version is still created, written, sealed
    and made live, and read back through kvd. The alias's history names the client's
    principal, as over gRPC."""
    from bulldozer.kv.client import _default_principal
    from bulldozer.kv.connect import connect, host_embedded_dal
    from bulldozer.kv.server.app import NativeServer

    with connect("embedded", tmp_path) as via_connect:
        assert type(via_connect.transport).__name__ == "HostedTransport"
        assert via_connect.list_aliases() == []
    with host_embedded_dal(tmp_path) as dal:
        client = KvClient.hosted(dal.address, dal.reference)
        dal.wait()
        assert isinstance(dal.running, NativeServer)  # kvd in front: the data calls' way
        dal.running.server.stop(0).wait()  # what kvd would relay now fails
        with KvClient(dal.address, timeout=5) as relayed, pytest.raises(BackendUnavailableError):
            relayed.list_aliases()
        name = new_version_name("hosted")
        client.create_namespace(name, "hosted")
        data = [(b"k%d" % i, b"v%d" % i) for i in range(100)]
        client.put(name, data)
        seal_as_loaded(client, name, data)
        client.compare_and_set_alias("hosted", None, name)
        assert client.batch_get([b"k7", b"nope"], alias="hosted") == (name, [b"v7", None])
        (change,) = client.alias_history("hosted")
        assert change.principal == f"{_default_principal()} (unauthenticated)"
        client.close()


def test_a_hosted_dals_call_in_process_is_waited_for_as_a_grpc_call_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A namespace call made in process runs on a thread of its own and is waited for as a
    gRPC call: an interruption ends the wait, not the call, which the DAL finishes whole; a
    call not answered within the client's timeout (the store's writer held elsewhere) raises
    BackendUnavailableError instead of waiting for ever; an error that is not the DAL's own
    is answered as the server answers it: INTERNAL, one line."""
    from bulldozer.errors import KvError
    from bulldozer.kv.connect import host_embedded_dal
    from bulldozer.kv.server.rules import KvDal

    change = KvDal._change
    release = threading.Event()

    def held(self: KvDal, *args: object, **kwargs: object) -> object:
        release.wait(10)  # as when another process holds the store's one writer
        return change(self, *args, **kwargs)  # type: ignore[arg-type]

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    with host_embedded_dal(tmp_path) as dal, KvClient.hosted(dal.address, dal.reference, timeout=2) as client:
        name = new_version_name("waited")
        client.create_namespace(name, "waited")
        monkeypatch.setattr(KvDal, "_change", held)
        previous = signal.signal(signal.SIGUSR1, interrupt)
        try:
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()
            with pytest.raises(KeyboardInterrupt):
                client.set_labels(name, {"seen": "yes"})
        finally:
            signal.signal(signal.SIGUSR1, previous)
        assert "seen" not in client.describe(name).labels  # still waiting for the writer
        release.set()  # the call the interruption left goes on, and ends whole
        for _ in range(100):
            if client.describe(name).labels.get("seen") == "yes":
                break
            threading.Event().wait(0.05)
        assert client.describe(name).labels["seen"] == "yes"

        release.clear()
        with pytest.raises(BackendUnavailableError, match=r"SetLabels did not finish within 2 s"):
            client.set_labels(name, {"late": "yes"})
        release.set()

        def broken(self: KvDal, name: str) -> object:
            raise ValueError("a bug")

        monkeypatch.setattr(KvDal, "describe", broken)
        with pytest.raises(KvError, match=r"^internal error \(ValueError\); see the DAL's log$"):
            client.describe(name)


def test_metrics_count_requests_and_records(server: tuple[object, int, Metrics]) -> None:
    _, port, metrics = server
    with KvClient(f"127.0.0.1:{port}") as client:
        name = new_version_name("met")
        client.create_namespace(name, "met")
        client.put(name, [(b"a", b"1"), (b"b", b"22")])
        with pytest.raises(Exception):  # noqa: B017
            client.seal("met__v20000101000000_000000", 0, 0)
    metrics_port = metrics.serve(0)
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    assert f'bulldozer_kv_records_written_total{{namespace="{name}"}} 2.0' in text
    assert 'bulldozer_kv_requests_total{code="OK",method="PutBatch"} 1.0' in text
    assert 'bulldozer_kv_requests_total{code="NOT_FOUND",method="SealNamespace"} 1.0' in text
    assert "bulldozer_kv_request_seconds_bucket" in text


def test_unreachable_server_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    with (
        KvClient(f"127.0.0.1:{port}", timeout=2) as client,
        pytest.raises(BackendUnavailableError, match="not reachable"),
    ):
        client.describe("x__v20000101000000_000000")


def test_a_dal_on_loopback_is_reached_directly_whatever_the_http_proxy(
    server: tuple[object, int, Metrics], monkeypatch: pytest.MonkeyPatch
) -> None:
    """gRPC sends every channel through the HTTP proxy ``http_proxy`` (or ``https_proxy``,
    ``grpc_proxy``) names, set on many workers for their way out: a DAL on 127.0.0.1 or
    localhost was then asked of the proxy, which reaches its own loopback, and every command
    said the DAL "did not answer". Loopback's channels go direct; a DAL elsewhere that does
    not answer is said to have been asked through the proxy, its password not shown."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # the proxy: nothing listens there
    _, port, _ = server
    for variable in ("http_proxy", "https_proxy", "grpc_proxy"):
        monkeypatch.setenv(variable, f"http://bob:s3cret@127.0.0.1:{dead}")
        for host in ("127.0.0.1", "localhost"):
            with KvClient(f"{host}:{port}", timeout=5) as client:
                client.wait_ready(5)
                assert client.list_namespaces() == []
        elsewhere = KvClient(f"192.0.2.1:{port}", timeout=1)  # TEST-NET-1: never this machine
        with elsewhere, pytest.raises(BackendUnavailableError) as away:
            elsewhere.wait_ready(1)
        said = str(away.value)
        assert f"through the HTTP proxy http://bob:***@127.0.0.1:{dead} that {variable} names" in said, said
        assert "s3cret" not in said
        monkeypatch.delenv(variable)


def test_an_endpoint_where_a_web_server_listens_is_one_line_at_once() -> None:
    """``--endpoint`` naming a web server (HTTP/1, a proxy's port, a console's): gRPC's
    connection attempts fail as it answers, and the client waited 15 s to say the DAL "did
    not answer". It says now what answered, at once; an endpoint where nothing listens is
    still waited for (a DAL starting), then named with the first attempt's error."""
    import http.server
    import time

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{web.server_address[1]}"
    try:
        with KvClient(target) as client, pytest.raises(BackendUnavailableError) as refused:
            started = time.monotonic()
            client.wait_ready(10)
        assert time.monotonic() - started < 5
    finally:
        web.shutdown()
        web.server_close()
    said = str(refused.value)
    assert said.startswith(
        f"the KV DAL at {target} answered in another protocol than gRPC's (HTTP/2): Failed parsing HTTP/2"
    ), said
    assert said.endswith("; is that the DAL's port, and not a web server's?"), said
    nobody = f"127.0.0.1:{_free_port()}"
    with KvClient(nobody) as client, pytest.raises(BackendUnavailableError) as unanswered:
        started = time.monotonic()
        client.wait_ready(2)
    assert time.monotonic() - started >= 1.5
    assert str(unanswered.value) == (
        f"the KV DAL at {nobody} did not answer within 2 s (the first connection attempt: Failed to connect to "
        "remote host: Connection refused)"
    )


# ------------------------------------------------------------- real processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(path: Path | None, port: int, *serve_args: str, within: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """A ``bulldozer serve`` process on ``port``: over the embedded store at ``path``, or
    over the engine ``serve_args`` name (``--engine redis --url ...``); ``within``: a
    command that runs it (``exec "$@"``), e.g. in a namespace of its own."""
    where = ["--path", str(path)] if path is not None else []
    serve = [sys.executable, "-m", "bulldozer.cli.main", "serve", *where, *serve_args]
    proc = subprocess.Popen(
        [*within, *serve, "--port", str(port), "--grace", "5"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    with KvClient(f"127.0.0.1:{port}") as client:
        try:
            client.wait_ready(timeout=60)
        except Exception:
            proc.kill()
            raise AssertionError((proc.stderr.read() if proc.stderr else b"").decode()) from None
    return proc


def race_to_flip(a: KvClient, b: KvClient, alias: str = "race", rounds: int = 5) -> None:
    """Two clients of two DAL processes on one store race to flip one alias: exactly one
    wins each round, and both servers then serve the winner."""
    base = new_version_name(alias)
    a.create_namespace(base, alias)
    a.put(base, [(b"k", b"base")])
    seal_as_loaded(a, base, [(b"k", b"base")])
    b.compare_and_set_alias(alias, None, base)  # written through one process ...
    assert a.get(b"k", alias=alias) == b"base"  # ... seen through the other
    for round_ in range(rounds):
        current = a.get_alias(alias).namespace
        x, y = new_version_name(alias), new_version_name(alias)
        for client, name in ((a, x), (b, y)):
            client.create_namespace(name, alias)
            client.put(name, [(b"k", name.encode())])
            seal_as_loaded(client, name, [(b"k", name.encode())])
        results: dict[str, str] = {}
        barrier = threading.Barrier(2)

        def flip(
            client: KvClient,
            name: str,
            barrier: threading.Barrier = barrier,
            current: str = current,
            results: dict[str, str] = results,
            round_: int = round_,
        ) -> None:
            barrier.wait()
            try:
                client.compare_and_set_alias(alias, current, name, reason=f"round {round_}")
                results[name] = "won"
            except AliasConflictError:
                results[name] = "lost"

        threads = [threading.Thread(target=flip, args=args) for args in ((a, x), (b, y))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [n for n, r in results.items() if r == "won"]
        assert len(winners) == 1, results
        assert a.get(b"k", alias=alias) == b.get(b"k", alias=alias) == winners[0].encode()
        active = [n.name for n in a.list_namespaces(alias) if n.state.value == "ACTIVE"]
        assert active == winners
    assert len(a.alias_history(alias)) == 1 + rounds  # the first flip and one per round


def stop_servers(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each server and wait for its clean exit: within its ``--grace`` for in-flight
    requests and at most 15 s more for its store, as serve promises. The wait allows that,
    then 15 s for the process to exit on a loaded machine (at 20 s, a server with a grace of
    5 s that used all of it failed a CI run's teardown)."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=40) == 0
        assert b"Traceback" not in (proc.stderr.read() if proc.stderr else b"")


def test_two_server_processes_on_one_store_race_to_flip(tmp_path: Path) -> None:
    store = tmp_path / "shared"
    ports = [_free_port(), _free_port()]
    procs = [_start(store, p) for p in ports]
    try:
        a, b = (KvClient(f"127.0.0.1:{p}", principal=f"server{i}") for i, p in enumerate(ports))
        race_to_flip(a, b)
        a.close()
        b.close()
    finally:
        stop_servers(procs)


def test_sigterm_lets_in_flight_batches_finish(tmp_path: Path) -> None:
    port = _free_port()
    proc = _start(tmp_path / "s", port)
    with KvClient(f"127.0.0.1:{port}") as client:
        name = new_version_name("graceful")
        client.create_namespace(name, "graceful")
        writer = client.writer(name, batch_records=500, in_flight=8)
        writer.add_many((b"k%07d" % i, b"v" * 100) for i in range(20_000))
        proc.send_signal(signal.SIGTERM)
        try:
            stats = writer.close()
            assert stats.records == 20_000  # everything sent before the signal was acknowledged
        except BackendUnavailableError:
            pass  # batches sent after shutdown began are refused, never half-applied
        assert proc.wait(timeout=20) == 0
    # the store is consistent afterwards
    engine = create_engine({"type": "embedded", "path": str(tmp_path / "s")})
    record = engine.get_namespace(name)
    assert record is not None and record.state.value == "LOADING"
    stored = sum(len(chunk) for chunk in engine.iterate(name))
    assert stored % 500 == 0 or stored == 20_000  # whole batches only
    engine.close()


def test_a_dal_too_old_to_describe_its_store_answers_none() -> None:
    """A DAL of an earlier release does not serve DescribeStore (UNIMPLEMENTED): the client
    says it does not know, so a run in mode auto goes on as those releases did."""
    from concurrent import futures

    old = grpc.server(futures.ThreadPoolExecutor(1))  # serves nothing: every call is UNIMPLEMENTED
    port = old.add_insecure_port("127.0.0.1:0")
    old.start()
    try:
        with KvClient(f"127.0.0.1:{port}", timeout=5) as client:
            assert client.describe_store() is None
    finally:
        old.stop(None)


def test_a_unix_socket_path_too_long_is_one_line(tmp_path: Path) -> None:
    """``serve --unix-socket`` with a path the kernel cannot bind (over 107 bytes) says so in
    one line at once: it used to let the native plane fail, fall back, print gRPC's own log
    line and then a message about binding."""
    deep = tmp_path / ("s" * 60) / ("t" * 40)
    deep.mkdir(parents=True)
    too_long = deep / "dal.sock"
    done = subprocess.run(
        [sys.executable, "-m", "bulldozer.cli.main", "serve", "--path", str(tmp_path / "kv"),
         "--unix-socket", str(too_long)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: --unix-socket ") and "holds at most 107 bytes" in lines[0], lines
    assert not (tmp_path / "kv").exists() and not too_long.exists()


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    """``serve --port`` on a port another process listens on says so in one line at once: it
    printed five (the native plane's JSON log and its error, the fallback to the Python plane,
    gRPC's own log line, then the error)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "bulldozer.cli.main", "serve", "--path", str(tmp_path / "kv"), "--port", str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr == f"error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    assert not (tmp_path / "kv").exists()


def _serve_refused(*args: str) -> subprocess.CompletedProcess[str]:
    """``bulldozer serve ARGS --port 0``, expected to refuse its arguments and exit."""
    return subprocess.run(
        [sys.executable, "-m", "bulldozer.cli.main", "serve", *args, "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_serve_configuration_file_that_does_not_parse_is_one_located_line(tmp_path: Path) -> None:
    """``--engine-config`` and ``--auth-config`` files that are not YAML: one line each,
    ``FILE:LINE:COLUMN: ... PROBLEM (CONTEXT)`` as a spec's, where the parser's own text was
    printed with its line breaks escaped (and a ``"<unicode string>"`` for the file)."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("type: memory\nprefix: [\n")
    for flag, what in (("--engine-config", "engine"), ("--auth-config", "auth")):
        done = _serve_refused(flag, str(broken))
        assert done.returncode == 1, done.stderr
        assert done.stderr == (
            f"error: {broken}:3:1: cannot read the {what} configuration: "
            "expected the node content, but found '<stream end>' (while parsing a flow node)\n"
        )


def test_a_key_given_twice_in_a_serve_configuration_file_is_refused(tmp_path: Path) -> None:
    """A principal listed twice in ``--auth-config`` lost its first permissions, and an
    engine configuration's repeated key its first value, without a word: YAML keeps the
    last. Each is refused at its second place now."""
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        "principals:\n"
        "  loader: {token_sha256: " + "a" * 64 + ", permissions: {'*': [read, write]}}\n"
        "  loader: {token_sha256: " + "b" * 64 + ", permissions: {'*': [read]}}\n"
    )
    engine = tmp_path / "engine.yaml"
    engine.write_text("type: memory\ntype: redis\n")
    for flag, path, what, where, key in (
        ("--auth-config", auth, "auth", "3:3", "loader"),
        ("--engine-config", engine, "engine", "2:1", "type"),
    ):
        done = _serve_refused(flag, str(path))
        assert done.returncode == 1, done.stderr
        assert done.stderr == (
            f"error: {path}:{where}: cannot read the {what} configuration: the key {key!r} is given twice "
            "(while reading a mapping)\n"
        )


def test_an_auth_configuration_of_no_principal_is_refused(tmp_path: Path) -> None:
    """``principals: {}`` served a DAL that authenticated no one: every request was refused
    as unauthenticated, and nothing said why at its start."""
    empty = tmp_path / "auth.yaml"
    empty.write_text("principals: {}\n")
    done = _serve_refused("--auth-config", str(empty))
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        f"error: {empty}: invalid auth configuration: principals: Dictionary should have at least 1 item after "
        "validation, not 0\n"
    )


def test_serve_s_numbers_out_of_range_are_usage_errors(tmp_path: Path) -> None:
    """``--metrics-port 99999`` ended with an OverflowError's traceback from http.server, and
    ``--grace -5`` was taken; both are refused as --port 70000 is (exit 2, no traceback)."""
    for args in (("--metrics-port", "99999"), ("--grace", "-5")):
        done = _serve_refused("--path", str(tmp_path / "kv"), *args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (args, done.stderr)
        assert f"Invalid value for '{args[0]}'" in done.stderr, done.stderr
        assert not (tmp_path / "kv").exists()


def test_a_serve_flag_is_applied_or_refused(tmp_path: Path) -> None:
    """The embedded engine's flags given for another engine were ignored without a word
    (``--engine memory --map-size-gib 2``), ``--engine`` lost to ``--engine-config``'s type,
    and ``--path`` / ``--map-size-gib`` lost to the file's values, though flags override it.
    Each is now refused in one line, or applied."""
    (tmp_path / "memory.yaml").write_text("type: memory\n")
    refused = {
        ("--engine", "memory", "--writemap"): "error: --writemap: the embedded engine's, not the memory engine's",
        ("--engine", "memory", "--map-size-gib", "2"): "error: --map-size-gib: the embedded engine's, not the memory",
        ("--engine", "redis", "--path", str(tmp_path / "x")): "error: --path: the embedded engine's, not the redis",
        ("--engine-config", str(tmp_path / "memory.yaml"), "--engine", "redis"): (
            "error: --engine redis and --engine-config's type memory disagree"
        ),
    }
    for args, said in refused.items():
        done = subprocess.run(
            [sys.executable, "-m", "bulldozer.cli.main", "serve", *args, "--port", "0"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 1 and done.stderr.startswith(said) and done.stderr.count("\n") == 1, done.stderr
    config = tmp_path / "embedded.yaml"
    config.write_text(f"type: embedded\npath: {tmp_path / 'from_the_file'}\nmap_size: 1073741824\n")
    server = _start(None, _free_port(), "--engine-config", str(config), "--path", str(tmp_path / "from_the_flag"))
    server.terminate()
    server.wait(timeout=30)
    assert (tmp_path / "from_the_flag").is_dir() and not (tmp_path / "from_the_file").exists()


@pytest.mark.parametrize("plane", ["python", "native"])
def test_a_dal_takes_as_many_connections_as_its_hard_open_files_limit_allows(plane: str, tmp_path: Path) -> None:
    """Started with a soft limit of 64 open files and a higher hard one (systemd starts
    services at a soft 1,024), the Python data plane stopped accepting connections at the
    soft limit, gRPC saying "File descriptor limit reached. Retrying." every second, and
    its clients waited. A ``bulldozer`` process now raises its soft limit to its hard one,
    as Go's runtime does for the native plane."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard >= 1024, "the test needs a hard limit of 1,024 at least"
    port = _free_port()
    low = ["bash", "-c", 'ulimit -Sn 64 && exec "$@"', "low"]
    proc = _start(tmp_path / "store", port, "--data-plane", plane, within=low)
    channels: list[grpc.Channel] = []
    try:
        for _ in range(200):  # each its own connection: channels to one address share one otherwise
            channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
            channels.append(channel)
            stub = kv_pb2_grpc.KvNamespacesStub(channel)
            stub.DescribeStore(kv_pb2.DescribeStoreRequest(), timeout=10)
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        line = next(li for li in limits.splitlines() if li.startswith("Max open files")).split()
        assert line[3] == line[4], line  # serve's own process: soft raised to hard
    finally:
        for channel in channels:
            channel.close()
        stop_servers([proc])


@pytest.mark.parametrize("plane", ["python", "native"])
def test_a_dal_whose_terminal_hangs_up_stops_gracefully(plane: str, tmp_path: Path) -> None:
    """SIGHUP (the terminal ``serve`` was started in closed) ended the Python DAL on the spot
    and its native data plane with it, without finishing the requests in flight or flushing
    the store; both now stop as on SIGTERM."""
    proc = _start(tmp_path / "store", _free_port(), "--data-plane", plane)
    kvd = [
        int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    ]
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=30) == 0
    said = (proc.stderr.read() if proc.stderr else b"").decode()
    assert "Traceback" not in said and "KV DAL stopped" in said, said
    if plane == "native":
        assert kvd and '"msg":"stopped"' in said, said  # the data plane stopped, not killed


#: ``serve`` over a memory store in a process of its own; ``{engine}`` is a class body's
#: extra lines, ``{port_file}`` where the port is written
_SERVE = """
import logging, os, signal, sys, threading
from bulldozer.kv.backends.memory import MemoryEngine
from bulldozer.kv.server import serve
logging.basicConfig(level=logging.INFO, format="%(message)s")
class Engine(MemoryEngine):
{engine}
code = serve("127.0.0.1:0", Engine(), grace=1, stop_within=2, port_file={port_file!r})
logging.shutdown()
os._exit(code)
"""


def _serve_memory(tmp_path: Path, engine: str) -> tuple[subprocess.Popen[str], Path]:
    port_file = tmp_path / "port"
    script = _SERVE.format(engine=engine, port_file=str(port_file))
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    return proc, port_file


def _stopped_once_serving(tmp_path: Path, engine: str, within: float) -> tuple[int, str]:
    """A memory DAL (``engine``: lines of its engine class's body) sent SIGTERM once it
    answers: its exit code, which it must give ``within`` seconds, and what it said."""
    proc, port_file = _serve_memory(tmp_path, engine)
    try:
        with KvClient(f"127.0.0.1:{_wait_for(port_file)}") as client:
            client.wait_ready(timeout=30)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=within)
    finally:
        proc.kill()
    return code, proc.stderr.read() if proc.stderr else ""


def test_a_store_that_hangs_does_not_keep_a_stopping_dal_alive(tmp_path: Path) -> None:
    """A store whose flush never returns (a driver waiting on a node that went away): the
    DAL exits after the grace period and ``stop_within`` more, with one line, not never."""
    code, stderr = _stopped_once_serving(tmp_path, "    def flush(self):\n        threading.Event().wait()\n", 30)
    assert code == 1 and "Traceback" not in stderr
    assert "the memory store did not finish within 2 s after the grace period" in stderr, stderr


def test_a_signal_another_thread_takes_still_stops_the_dal(tmp_path: Path) -> None:
    """The kernel may hand a process's SIGTERM to any thread not blocking it (one of gRPC's),
    and Python runs its handler only in the main thread, once that thread runs again: one
    waiting without a timeout never did (a fresh-clone CI run saw a DAL ignore SIGTERM for
    30 s). Here the main thread blocks SIGTERM before the server starts, so only a thread
    started before can take it."""
    engine = (
        "    threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
    )
    code, stderr = _stopped_once_serving(tmp_path, engine, 15)
    assert code == 0 and "KV DAL stopped" in stderr, stderr


def test_a_signal_while_the_dal_starts_stops_it_gracefully(tmp_path: Path) -> None:
    """SIGTERM as the server is being built (an orchestrator stopping a DAL it just started):
    a graceful stop, exit 0, not the signal's default death."""
    proc, _ = _serve_memory(
        tmp_path,
        "    @property\n    def max_key_bytes(self):\n        os.kill(os.getpid(), signal.SIGTERM)\n        return 4096\n",
    )
    try:
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    stderr = proc.stderr.read() if proc.stderr else ""
    assert "KV DAL stopped" in stderr and "Traceback" not in stderr, stderr


def _wait_for(port_file: Path, timeout: float = 30) -> int:
    import time

    deadline = time.monotonic() + timeout
    while not port_file.exists():
        assert time.monotonic() < deadline, "the DAL did not start"
        time.sleep(0.05)
    return int(port_file.read_text())
