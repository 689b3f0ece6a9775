"""A DAL process killed (SIGKILL, the whole process group: the Python DAL and, with the
native data plane, bulldozer-kvd) while it seals a version: after a restart the version is
SEALING, never SEALED unmeasured; every way of pointing the alias at it is refused with one
clear line; sealing again (what a resumed run does) verifies it, and then it can go live.

Covered: the embedded engine under both data planes (with a key written twice, so the
running digest is inexact and the seal scans everything back), Redis and Cassandra (whose
seals always scan)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bulldozer.codec.digest import Digest, digest_pairs
from bulldozer.errors import BulldozerError, NamespaceStateError
from bulldozer.kv import KvClient
from bulldozer.kv.types import State
from bulldozer.load.runner import run_job
from bulldozer.names import new_version_name
from bulldozer.versioning.rollback import rollback
from bulldozer.warehouse.sample import create_sample_warehouse
from tests.conftest import REPO
from tests.integration import services
from tests.integration.kv_fixtures import seal_as_loaded
from tests.integration.test_kv_server import _free_port
from tests.integration.test_run import spec

pytestmark = pytest.mark.integration
CLI_RUN = [sys.executable, "-m", "bulldozer.cli.main", "run", "templates/move_data_to_kv_dal.yaml", "--json"]


class Dal:
    """``bulldozer serve`` in a process group of its own, restartable on the same store."""

    def __init__(self, args: list[str]) -> None:
        self.args, self.port = args, _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bulldozer.cli.main", "serve", *self.args, "--port", str(self.port), "--grace", "2"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        with KvClient(self.endpoint) as client:
            try:
                client.wait_ready(timeout=60)
            except Exception:
                self.kill()
                raise

    def kill(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def _serve_args(case: str, tmp_path: Path) -> list[str]:
    if case.startswith("embedded"):
        plane = case.removeprefix("embedded-")
        return ["--path", str(tmp_path / "store"), "--data-plane", plane]
    config = tmp_path / "engine.yaml"
    if case == "redis":
        config.write_text(f"type: redis\nurl: {services.redis_url()}\nprefix: sc_{uuid.uuid4().hex[:10]}\n")
    else:
        host, port = services.cassandra_endpoint()
        config.write_text(
            f"type: cassandra\ncontact_points: [{host}]\nport: {port}\nkeyspace: sc_{uuid.uuid4().hex[:10]}\n"
            "timeout_seconds: 60\n"
        )
    return ["--engine-config", str(config)]


@pytest.fixture(params=["embedded-python", "embedded-native", "redis", "cassandra"])
def dal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Dal]:
    server = Dal(_serve_args(request.param, tmp_path))
    yield server
    server.stop()


def kill_while(dal: Dal, name: str, state: State, start: threading.Thread, timeout: float = 120) -> bool:
    """Start ``start`` (unless it runs already); SIGKILL the DAL as soon as ``name`` is seen
    in ``state``. False if the namespace went past that state before it was seen (the caller
    tries a larger one)."""
    with KvClient(dal.endpoint, timeout=5) as watcher:
        if start.ident is None:
            start.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                seen = watcher.describe(name).state
            except BulldozerError:
                seen = None
            if seen == state:
                dal.kill()
                start.join(60)
                return True
            if seen not in (None, State.LOADING, state):
                start.join(60)
                return False
            time.sleep(0.002)
    raise AssertionError(f"{name} never reached {state.value}")


def _rollback_cli(dal: Dal, alias: str, to: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "bulldozer.cli.main",
            "rollback",
            alias,
            "--to",
            to,
            "--yes",
            "--endpoint",
            dal.endpoint,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "BULLDOZER_HOME": str(tmp_path / "cli-home")},
        cwd=REPO,
    )


def test_a_dal_killed_during_the_seal_never_shows_an_unverified_sealed_version(dal: Dal, tmp_path: Path) -> None:
    alias = f"crash_{uuid.uuid4().hex[:8]}"
    with KvClient(dal.endpoint, timeout=120) as client:
        live = new_version_name(alias)
        client.create_namespace(live, alias)
        client.put(live, [(b"k", b"live")])
        seal_as_loaded(client, live, [(b"k", b"live")])
        client.compare_and_set_alias(alias, None, live)

    rows = 40_000
    for _attempt in range(4):
        data = [(b"key-%08d" % i, b"value-%08d-" % i + b"x" * 40) for i in range(rows)]
        name = new_version_name(alias)
        with KvClient(dal.endpoint, timeout=120) as client:
            client.create_namespace(name, alias)
            with client.writer(name, batch_records=5_000) as writer:
                writer.add_many(data[:5_000])  # written twice: the embedded running digest is inexact
                writer.add_many(data)
        expected = digest_pairs(data)
        outcome: list[object] = []

        def seal(name: str = name, outcome: list[object] = outcome, expected: Digest = expected) -> None:
            with KvClient(dal.endpoint, timeout=120) as sealer:
                try:
                    outcome.append(sealer.seal(name, expected.count, expected.value))
                except BulldozerError as exc:
                    outcome.append(exc)

        if kill_while(dal, name, State.SEALING, threading.Thread(target=seal)):
            dal.start()
            with KvClient(dal.endpoint, timeout=120) as client:
                if client.describe(name).state == State.SEALING:
                    break
            # the seal was committed between being seen measuring and the kill (a busy machine)
        rows *= 3  # the seal finished before it was caught measuring: a longer one
    else:
        raise AssertionError("never caught a seal in progress")
    assert outcome and isinstance(outcome[0], BulldozerError), outcome  # the seal's caller saw it fail

    with KvClient(dal.endpoint, timeout=120) as client:
        info = client.describe(name)
        assert (info.state, info.verified) == (State.SEALING, False)  # never SEALED with 0 / 0
        with pytest.raises(NamespaceStateError, match="SEALING"):
            client.compare_and_set_alias(alias, live, name, reason="raw compare-and-set")
        with pytest.raises(NamespaceStateError, match="SEALING"):
            rollback(client, alias, name)
        client.set_pin(alias, True, "hold it")
        with pytest.raises(NamespaceStateError, match="SEALING"):
            rollback(client, alias, name, reason="while pinned")
        client.set_pin(alias, False, "release")
        refused = _rollback_cli(dal, alias, name, tmp_path)
        assert refused.returncode != 0 and "SEALING" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        with pytest.raises(NamespaceStateError):
            client.batch_get([b"key-00000001"], namespace=name)
        assert client.get_alias(alias).namespace == live

        sealed = client.seal(name, expected.count, expected.value)  # the resumed seal measures it
        assert (sealed.state, sealed.verified, sealed.record_count, sealed.digest) == (
            State.SEALED,
            True,
            expected.count,
            expected.value,
        )
        client.compare_and_set_alias(alias, live, name)
        assert client.get(b"key-00000001", alias=alias) == data[1][1]


def test_a_run_whose_dal_died_at_the_seal_is_resumed_verified_and_flipped(tmp_path: Path) -> None:
    """The runner's side: a real run on Redis, the DAL killed while the version is SEALING;
    ``bulldozer run --resume`` then seals, verifies and flips it. The version's running
    digest is forgotten as it is created, so its seal scans (long enough to be seen)."""
    import redis
    import yaml

    home = tmp_path / "h"
    create_sample_warehouse(home, rows=60_000, chunk_rows=20_000)
    server = Dal(_serve_args("redis", tmp_path))
    try:
        loaded = spec()
        with KvClient(server.endpoint, timeout=60) as client:
            first = run_job(loaded, client, home=str(home)).version
        ended: list[subprocess.CompletedProcess[str]] = []

        def run() -> None:  # a run in a process of its own, as a scheduler's or a shell's
            ended.append(
                subprocess.run(
                    [*CLI_RUN, "--endpoint", server.endpoint, "-q"],
                    capture_output=True,
                    text=True,
                    timeout=300,
                    env={**os.environ, "BULLDOZER_HOME": str(home)},
                    cwd=REPO,
                )
            )

        with KvClient(server.endpoint, timeout=10) as watcher:
            thread = threading.Thread(target=run)
            thread.start()
            name = ""
            while not name:
                loading = [n.name for n in watcher.list_namespaces("user_item_scores") if n.name != first]
                name = loading[0] if loading else ""
                time.sleep(0.01)
        config = yaml.safe_load((tmp_path / "engine.yaml").read_text())
        redis.Redis.from_url(config["url"]).delete(f"{{{config['prefix']}}}:digest:{name}")
        assert kill_while(server, name, State.SEALING, thread), "the seal finished before it was seen measuring"
        thread.join(timeout=300)
        assert ended and ended[0].returncode == 1, ended
        assert "not reachable" in ended[0].stderr.strip().splitlines()[-1], ended[0].stderr

        server.start()
        with KvClient(server.endpoint, timeout=60) as client:
            assert client.describe(name).state == State.SEALING
            assert client.get_alias("user_item_scores").namespace == first
        resumed = subprocess.run(
            [*CLI_RUN, "--endpoint", server.endpoint, "--resume", name],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "BULLDOZER_HOME": str(home)},
            cwd=REPO,
        )
        assert resumed.returncode == 0, resumed.stderr
        record = json.loads(resumed.stdout)
        assert (record["outcome"], record["version"], record["rows"], record["resumed"]) == (
            "succeeded",
            name,
            60_000,
            True,
        )
        with KvClient(server.endpoint, timeout=60) as client:
            info = client.describe(name)
            assert (info.state, info.verified, info.record_count) == (State.ACTIVE, True, 60_000)
            assert client.get_alias("user_item_scores").namespace == name
    finally:
        server.stop()
