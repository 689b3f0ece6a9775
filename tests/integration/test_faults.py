"""Fault injection: each scenario repeats ``BULLDOZER_FAULT_REPEATS`` times (2 by default;
more in a slow run) and then checks what Bulldozer promises: the alias points at the old
or the new version and never anything else, no sealed version misses a record, and a rerun
or resume finishes the job. Each scenario prints a ``RESULT`` line for the results table:

    BULLDOZER_FAULT_REPEATS=10 .venv/bin/pytest -s -q tests/integration/test_faults.py | grep RESULT
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from bulldozer.errors import BulldozerError
from bulldozer.kv import KvClient
from bulldozer.kv.types import State
from bulldozer.load.runner import run_job
from bulldozer.names import new_version_name
from bulldozer.warehouse.sample import create_sample_warehouse
from tests.conftest import REPO
from tests.integration import services
from tests.integration.proxies import Proxy
from tests.integration.test_kv_server import _free_port, _start, stop_servers
from tests.integration.test_run import _cli, spec

pytestmark = pytest.mark.integration
REPEATS = int(os.environ.get("BULLDOZER_FAULT_REPEATS", "2"))
ROWS = 30_000
ALIAS = "user_item_scores"
#: a process of the embedded store at ``argv[1]`` inside a read transaction until it is killed
READER = """
import sys, time, lmdb
env = lmdb.open(sys.argv[1], readonly=True, max_dbs=64)
txn = env.begin()
print("reading", flush=True)
time.sleep(600)
"""


def audit(client: KvClient, allowed: set[str]) -> tuple[bool, int]:
    """(alias is one of ``allowed``, records missing from sealed versions)."""
    alias_ok = client.get_alias(ALIAS).namespace in allowed
    lost = 0
    for info in client.list_namespaces(ALIAS):
        if info.state in (State.SEALED, State.ACTIVE, State.RETIRED):
            stored = sum(1 for _ in client.scan(namespace=info.name, page_size=5_000))
            lost += max(0, ROWS - info.record_count) + max(0, info.record_count - stored)
    return alias_ok, lost


def finish(client: KvClient, home: Path) -> str:
    """Resume a version left LOADING, else run again; returns the version now live."""
    stuck = [n.name for n in client.list_namespaces(ALIAS) if n.state == State.LOADING]
    record = run_job(spec(), client, home=str(home), resume=stuck[-1] if stuck else None)
    assert record.rows == ROWS
    return record.version


class Tally:
    """Counts, over the repetitions of one scenario, what the promises rule out."""

    def __init__(self, live: str) -> None:
        self.live = live
        self.wrong = self.lost = self.unfinished = 0

    def after_fault(self, client: KvClient, home: Path) -> None:
        """Audit (the alias never moved, nothing sealed is short), then resume or rerun."""
        ok, missing = audit(client, {self.live})
        self.wrong, self.lost = self.wrong + (not ok), self.lost + missing
        try:
            self.live = finish(client, home)
        except BulldozerError:
            self.unfinished += 1
        self.wrong += client.get_alias(ALIAS).namespace != self.live

    def report(self, scenario: str, runs: int) -> None:
        result(scenario, runs, self.wrong, self.lost, self.unfinished)
        assert (self.wrong, self.lost, self.unfinished) == (0, 0, 0)


def result(scenario: str, runs: int, alias_wrong: int, lost: int, unfinished: int, mixed: str = "n/a") -> None:
    """One row: scenario | repetitions | alias wrong | records lost | mixed reads | unfinished."""
    print(f"\nRESULT | {scenario} | {runs} | {alias_wrong} | {lost} | {mixed} | {unfinished} |")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    create_sample_warehouse(tmp_path / "h", rows=ROWS, chunk_rows=10_000)
    return tmp_path / "h"


@pytest.fixture
def dal_process(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    store, port = tmp_path / "store", _free_port()
    server = _start(store, port)
    yield store, port
    if server.poll() is None:
        stop_servers([server])


@pytest.mark.parametrize("where", ["load", "verify", "flip"])
def test_runner_killed_at_random_points(where: str, home: Path, dal_process: tuple[Path, int]) -> None:
    _, port = dal_process
    endpoint = f"127.0.0.1:{port}"
    rnd = random.Random(11)
    with KvClient(endpoint) as client:
        tally = Tally(run_job(spec(), client, home=str(home)).version)
        for _ in range(REPEATS):
            fault = f"kill-after-rows:{rnd.randrange(1_000, ROWS)}" if where == "load" else f"kill-at:{where}"
            killed = _cli(
                ["run", "templates/move_data_to_kv_dal.yaml", "-q", "--endpoint", endpoint], home, fault=fault
            )
            assert killed.returncode == -9, killed.stderr
            tally.after_fault(client, home)  # killed before its flip: still the old version
    tally.report(f"runner SIGKILLed during {where}", REPEATS)


def test_dal_killed_mid_stream(home: Path, tmp_path: Path) -> None:
    store, port = tmp_path / "store", _free_port()
    server = _start(store, port)
    try:
        with KvClient(f"127.0.0.1:{port}", timeout=10) as client:
            tally = Tally(run_job(spec(), client, home=str(home)).version)
        for i in range(REPEATS):
            with KvClient(f"127.0.0.1:{port}", timeout=10) as client:

                def kill(done: int, total: int, at: int = 5_000 + 7_000 * i, proc: Any = server) -> None:
                    if done >= at and proc.poll() is None:
                        proc.kill()
                        proc.wait()

                with pytest.raises(BulldozerError):
                    run_job(spec(), client, home=str(home), progress=kill)
            server = _start(store, port)
            with KvClient(f"127.0.0.1:{port}") as client:
                tally.after_fault(client, home)
    finally:
        stop_servers([server])
    tally.report("DAL server SIGKILLed mid-stream", REPEATS)


def test_a_reader_killed_mid_read_does_not_keep_the_store_from_reusing_pages(tmp_path: Path) -> None:
    """Another process of the embedded store (a ``bulldozer-kvd`` measuring a version when its
    time ran out, a second DAL on the store) is SIGKILLed inside a read transaction. Its slot
    stayed in LMDB's reader table while the DAL kept the store open, so no page freed since
    was reused: each load after it grew the file by the version's size, though every older
    version was dropped (here 6 loads of 8 MB grew it 89 MB), until the map was full. The
    engine now clears such slots (LMDB's reader check) when it creates a version."""
    from tests.integration.kv_fixtures import seal_as_loaded

    store, port = tmp_path / "store", _free_port()
    server = _start(store, port)
    data_file = store / "data.mdb"
    pairs = [(b"k%07d" % i, os.urandom(400)) for i in range(20_000)]  # 8 MB a version

    def load_and_flip(client: KvClient, live: str | None) -> str:
        name = new_version_name("reuse")
        client.create_namespace(name, "reuse")
        for i in range(0, len(pairs), 5_000):
            client.put(name, pairs[i : i + 5_000])
        seal_as_loaded(client, name, pairs)
        client.compare_and_set_alias("reuse", live, name)
        if live is not None:
            client.drop(live)
        return name

    try:
        with KvClient(f"127.0.0.1:{port}", timeout=60) as client:
            live = load_and_flip(client, load_and_flip(client, None))
            before = data_file.stat().st_size
            reader = subprocess.Popen(
                [sys.executable, "-c", READER, str(store)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            assert reader.stdout is not None and reader.stdout.readline() == "reading\n", reader.stderr
            reader.kill()
            reader.wait()
            for _ in range(6):
                live = load_and_flip(client, live)
            grown = data_file.stat().st_size - before
            assert grown < 2 * 8_000_000, f"the store grew {grown / 1e6:.0f} MB for versions that were all dropped"
            assert client.get(pairs[7][0], alias="reuse") == pairs[7][1]
    finally:
        server.terminate()
        said = server.communicate(timeout=30)[1].decode()
    assert server.returncode == 0 and "Traceback" not in said, said
    assert "cleared 1 reader slot(s) of processes that ended while reading it" in said, said


def test_the_embedded_default_runs_under_an_address_space_limit(tmp_path: Path) -> None:
    """A process whose address space is limited (``ulimit -v``, as batch schedulers and
    shared hosts set it) could not open the embedded store at all: LMDB maps the store's
    whole map size, 64 GiB, when it opens it, and every run failed with "Cannot allocate
    memory". The default map is now fitted to a quarter of the limit, and a map given too
    large for it is refused in one line naming the limit."""
    home = tmp_path / "h"
    create_sample_warehouse(home, rows=2_000)
    limited = ["bash", "-c", 'ulimit -v 4194304 && exec "$@"', "limited"]  # 4 GiB
    env = {**os.environ, "BULLDOZER_HOME": str(home)}
    bulldozer = [sys.executable, "-m", "bulldozer.cli.main"]
    done = subprocess.run(
        [*limited, *bulldozer, "run", "templates/move_data_to_kv_dal.yaml", "--json"],
        capture_output=True, text=True, timeout=300, env=env, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == 2_000
    refused = subprocess.run(
        [*limited, *bulldozer, "serve", "--path", str(home / "kv"), "--port", "0", "--map-size-gib", "64"],
        capture_output=True, text=True, timeout=120, env=env, cwd=REPO,
    )  # fmt: skip
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"error: cannot open the embedded store at {home / 'kv'}: its map (64.0 GiB, or the size its data already "
        "takes if larger) does not fit in this process's address-space limit (4.0 GiB: ulimit -v); raise the limit, "
        "or serve the store with a smaller --map-size-gib"
    ], refused.stderr


@pytest.mark.parametrize("plane", ["python", "native"])
def test_a_machine_crash_at_any_instant_leaves_the_live_version_whole(plane: str, tmp_path: Path) -> None:
    """A machine that crashes (power lost, a kernel panic, a VM reset) loses what the page
    cache held, and the kernel writes cached pages back in any order. Every write a DAL makes
    to the embedded store is recorded (tests/write_recorder.c) while versions are loaded,
    flipped and dropped; stores a crash could leave at random instants are rebuilt from the
    record (tests/crash_images.py) and opened: each must open, and its alias point at an
    ACTIVE version whose records measure as its seal did, the version of the last flip the
    DAL had answered or a later one. With MDB_NOSYNC, 18 of 120 such stores did not open."""
    from tests.crash_images import crash_problems, mark
    from tests.integration.kv_fixtures import seal_as_loaded

    rng = random.Random(2026)
    digests: set[int] = set()
    flipped: list[str] = []
    with _recorded_dal(tmp_path, plane) as (client, log):

        def load_and_flip(live: str | None) -> str:
            name = new_version_name("crash")
            pairs = [(b"k%06d" % rng.randrange(1_000_000), rng.randbytes(60)) for _ in range(6_000)]
            pairs = list(dict(pairs).items())
            client.create_namespace(name, "crash")
            for i in range(0, len(pairs), 500):
                client.put(name, pairs[i : i + 500])
            digests.add(seal_as_loaded(client, name, pairs).digest)
            client.compare_and_set_alias("crash", live, name)
            mark(log, name)  # answered: a crash from here on keeps it (or a later flip)
            flipped.append(name)
            if live is not None:
                client.drop(live)
            return name

        live = None
        for _ in range(4):
            live = load_and_flip(live)
    bad, images = crash_problems(tmp_path, log, flipped, digests, rng)
    assert not bad, f"{len(bad)} of {images} crash images: " + "; ".join(bad[:8])


@pytest.mark.parametrize("plane", ["python", "native"])
def test_a_machine_crash_during_full_and_delta_runs_leaves_the_live_version_whole(plane: str, tmp_path: Path) -> None:
    """The same, through real runs: a full run, then delta runs after appends, updates,
    deletes, a compaction and an overwrite of the table, past the chain's depth limit (so
    layers are merged, by ``bulldozer-kvd`` processes of their own on the native plane)."""
    from tests.crash_images import crash_problems, mark
    from tests.integration.test_delta import change, job, make_table

    home, rng = tmp_path / "home", random.Random(29)
    table = make_table(home, per_file=500)
    digests: set[int] = set()
    flipped: list[str] = []
    next_id = [10_000]
    with _recorded_dal(tmp_path, plane) as (client, log):
        for n in range(12):
            if n:
                change(table, rng, ("update", "delete", "append", "compact", "overwrite")[n % 5], next_id)
            done = run_job(job("items", "delta"), client, home=str(home))  # the first: full, there is no base
            assert done.outcome == "succeeded" and done.mode == ("delta" if n else "full"), (n, done.full_reason)
            mark(log, done.version)
            flipped.append(done.version)
            digests.add(client.describe(done.version).digest)
    bad, images = crash_problems(tmp_path, log, flipped, digests, rng, alias="items")
    assert not bad, f"{len(bad)} of {images} crash images: " + "; ".join(bad[:8])


@contextlib.contextmanager
def _recorded_dal(tmp_path: Path, plane: str) -> Iterator[tuple[KvClient, Path]]:
    """A client of a DAL serving a new embedded store on ``plane``, every write to whose file
    is recorded (tests/crash_images.py), and the record's path; the DAL is stopped after."""
    from tests.crash_images import build_recorder, recorded

    store, port, log = tmp_path / "store", _free_port(), tmp_path / "writes.log"
    env = recorded(build_recorder(tmp_path), log, store / "data.mdb")
    server = _start(store, port, "--data-plane", plane, within=["env", *(f"{k}={v}" for k, v in env.items())])
    try:
        with KvClient(f"127.0.0.1:{port}", timeout=60) as client:
            yield client, log
    finally:
        stop_servers([server])


def test_a_damaged_embedded_store_is_one_line_and_nothing_is_written_to_it(tmp_path: Path) -> None:
    """A store whose file is not what LMDB wrote (a failing disk, a copy taken while it was
    written, a crash of a machine under a store an older release opened without syncs): a
    damaged catalogue of databases made the DAL create its metadata databases anew inside
    the damaged tree and a run write into it, then fail with "internal error (BadDbiError)"
    or "(BadTxnError)";
    a damaged version's page was an internal error too. Both are now one line naming the
    store as damaged (StoreDamagedError, DATA_LOSS), and the file is left as it was."""
    import struct

    import lmdb

    from bulldozer.kv.backends.embedded import _data_db

    home = tmp_path / "h"
    create_sample_warehouse(home, rows=2_000)
    done = _cli(["run", "templates/move_data_to_kv_dal.yaml", "--json"], home)
    assert done.returncode == 0, done.stderr
    version = json.loads(done.stdout)["version"]
    data = home / "kv" / "data.mdb"

    def damage(page: int) -> bytes:
        with data.open("r+b") as out:
            out.seek(page * 4096)
            out.write(random.Random(page).randbytes(4096))
        return data.read_bytes()

    env = lmdb.open(str(home / "kv"), readonly=True, lock=False, max_dbs=64)
    with env.begin() as txn:
        entry = txn.get(_data_db(version))
        assert entry is not None
        version_root = struct.unpack_from("<Q", entry, 40)[0]  # its MDB_db's md_root
    env.close()
    # of each meta page (pages 0 and 1: a 16-byte header, 24 bytes of fields, the free-page
    # database's MDB_db) the main database's root (its MDB_db's md_root), last page and txnid;
    # the newer one's root is the catalogue of databases
    metas = [struct.unpack_from("<QQQ", data.read_bytes(), page * 4096 + 16 + 24 + 48 + 40) for page in (0, 1)]
    catalogue_root = max(metas, key=lambda meta: meta[2])[0]
    damaged = f"the embedded store at {home / 'kv'} is damaged ("
    damage(version_root)
    said = _cli(["namespace", "verify", "--all"], home)
    assert said.returncode == 1 and len(said.stderr.strip().splitlines()) == 1, said.stderr
    assert damaged in said.stderr and "restore it from a backup" in said.stderr, said.stderr
    before = damage(catalogue_root)
    said = _cli(["run", "templates/move_data_to_kv_dal.yaml", "-q"], home)
    assert said.returncode == 1 and len(said.stderr.strip().splitlines()) == 1, said.stderr
    assert damaged in said.stderr and "did not start" in said.stderr, said.stderr
    assert data.read_bytes() == before  # nothing written into it


def test_embedded_store_full(home: Path, tmp_path: Path) -> None:
    """The embedded engine's map fills up mid-load: a clear failure, the alias stays, and a
    DAL restarted with a larger map finishes the job."""
    calibration, port = tmp_path / "calibration", _free_port()
    server = _start(calibration, port)
    with KvClient(f"127.0.0.1:{port}") as client:
        run_job(spec(), client, home=str(home))
    stop_servers([server])
    one_version = (calibration / "data.mdb").stat().st_size  # what one version takes, churn included
    tally = Tally("")
    for i in range(REPEATS):
        store, port = tmp_path / f"store{i}", _free_port()
        tight = _start(store, port, "--map-size-gib", f"{1.5 * one_version / 1024**3:.6f}")
        with KvClient(f"127.0.0.1:{port}") as client:
            tally.live = run_job(spec(), client, home=str(home)).version  # the first version fits ...
            with pytest.raises(BulldozerError, match="full"):
                run_job(spec(), client, home=str(home))  # ... a second one does not
        stop_servers([tight])
        port = _free_port()
        roomy = _start(store, port)  # restarted with room to grow
        with KvClient(f"127.0.0.1:{port}") as client:
            tally.after_fault(client, home)
        stop_servers([roomy])
    tally.report("embedded store full mid-load", REPEATS)


def _own_tmpfs(store: Path, size: str) -> list[str]:
    """A command running its arguments (``exec "$@"``) with ``store`` a tmpfs of ``size`` of
    their own: mounted in a mount namespace (``unshare``, as root or in a user namespace of
    the caller's), so only they see it (others at /proc/PID/root/...)."""
    store.mkdir(parents=True)
    mount = 'mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"'
    return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", mount, "sh", size, str(store)]


def _fill(folder: Path, leave: int) -> Path:
    """A file taking all of ``folder``'s disk but ``leave`` bytes."""
    filler = folder / "filler"
    fs = os.statvfs(folder)
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, fs.f_bavail * fs.f_frsize - leave)
    return filler


@pytest.mark.parametrize("plane", ["python", "native"])
def test_embedded_disk_full(plane: str, home: Path, tmp_path: Path) -> None:
    """The disk holding the embedded store fills up (its map has room): the run fails with
    one line saying so, the alias and the live version are untouched, and once there is
    room again the job finishes, on the same DAL and store."""
    tally = Tally("")
    for i in range(REPEATS):
        store, port = tmp_path / f"disk{i}", _free_port()
        server = _start(store, port, "--data-plane", plane, within=_own_tmpfs(store, "128m"))
        seen = Path(f"/proc/{server.pid}/root") / store.relative_to("/")  # the tmpfs, as the DAL sees it
        with KvClient(f"127.0.0.1:{port}") as client:
            tally.live = run_job(spec(), client, home=str(home)).version
            filler = _fill(seen, leave=256 << 10)
            with pytest.raises(BulldozerError) as failed:
                run_job(spec(), client, home=str(home))
            said = str(failed.value)
            assert "the disk holding the embedded store" in said and "is full" in said, said
            assert "\n" not in said and "Traceback" not in said
            filler.unlink()  # room again: the rerun (or resume) finishes
            tally.after_fault(client, home)
        stop_servers([server])
    tally.report(f"embedded store's disk full mid-load ({plane} data plane)", REPEATS)


def test_no_store_is_made_on_a_full_disk(tmp_path: Path) -> None:
    """A new store on a disk without room for its first files: the DAL says so in one line
    and exits 1 (LMDB writes its lock file through a map, and a page the disk cannot hold
    would kill the process with SIGBUS, saying nothing)."""
    store = tmp_path / "store"
    serve = [sys.executable, "-m", "bulldozer.cli.main", "serve", "--path", str(store), "--port", "0"]
    done = subprocess.run([*_own_tmpfs(store, "16k"), *serve], capture_output=True, text=True, timeout=120)
    said = done.stderr.strip().splitlines()
    assert done.returncode == 1, done
    assert len(said) == 1 and "is full" in said[0] and "a new store needs" in said[0], done.stderr


def test_redis_out_of_memory(home: Path) -> None:
    """Redis reaches its maxmemory mid-load (noeviction: it refuses writes, the record of the
    run's own failure too): the command fails with one line saying so, the alias and the
    live version are untouched, and once Redis has room the job finishes."""
    redis_port = services.own_redis()  # its memory limit is set here
    r = redis.Redis(port=redis_port)
    port = _free_port()
    server = _start(None, port, "--engine", "redis", "--url", f"redis://127.0.0.1:{redis_port}/0", "--prefix", "oom")
    endpoint = {"BULLDOZER_ENDPOINT": f"127.0.0.1:{port}"}
    tally = Tally("")
    with KvClient(f"127.0.0.1:{port}") as client:
        for _ in range(REPEATS):
            tally.live = run_job(spec(), client, home=str(home)).version
            r.config_set("maxmemory-policy", "noeviction")
            used = int(cast(dict[str, Any], r.info("memory"))["used_memory"])
            r.config_set("maxmemory", str(used + (256 << 10)))
            failed = _cli(["run", "templates/move_data_to_kv_dal.yaml", "-q"], home, endpoint)
            said = failed.stderr.strip().splitlines()
            assert failed.returncode == 1, failed.stderr
            assert len(said) == 1 and "is out of memory" in said[0] and "maxmemory" in said[0], failed.stderr
            r.config_set("maxmemory", "0")  # room again: the rerun (or resume) finishes
            tally.after_fault(client, home)
    stop_servers([server])
    tally.report("Redis out of memory mid-load", REPEATS)


def test_a_redis_that_evicts_keys_is_refused(home: Path) -> None:
    """A Redis whose maxmemory-policy evicts any key (``allkeys-*``) would drop a live
    version's records when it fills up, and a seal reads the running digest, not the data:
    the DAL refuses to serve it in one line, and a seal refuses it when the policy was set
    after the DAL started (the alias stays). ``volatile-*`` evicts only keys with a TTL, which
    a version's records have not: it is served."""
    redis_port = services.own_redis()
    r = redis.Redis(port=redis_port)
    url = f"redis://127.0.0.1:{redis_port}/0"
    r.config_set("maxmemory-policy", "allkeys-lru")
    serve = [sys.executable, "-m", "bulldozer.cli.main", "serve", "--engine", "redis", "--url", url, "--port", "0"]
    refused = subprocess.run([*serve, "--prefix", "evict"], capture_output=True, text=True, timeout=120)
    said = refused.stderr.strip().splitlines()
    assert refused.returncode == 1 and len(said) == 1, refused.stderr
    assert said[0].startswith(f"error: Redis at {url} evicts keys when it is full (maxmemory-policy allkeys-lru)")
    assert r.keys("*evict*") == []  # refused before the prefix was claimed
    r.config_set("maxmemory-policy", "volatile-lru")
    port = _free_port()
    server = _start(None, port, "--engine", "redis", "--url", url, "--prefix", "evict")
    try:
        with KvClient(f"127.0.0.1:{port}") as client:
            live = run_job(spec(), client, home=str(home)).version
            r.config_set("maxmemory-policy", "allkeys-lfu")
            with pytest.raises(BulldozerError, match=r"maxmemory-policy allkeys-lfu"):
                run_job(spec(), client, home=str(home))
            assert client.get_alias(ALIAS).namespace == live
            r.config_set("maxmemory-policy", "noeviction")
            assert run_job(spec(), client, home=str(home)).version != live
    finally:
        stop_servers([server])


@contextlib.contextmanager
def _disk_of_its_own(folder: Path, size: str) -> Iterator[tuple[list[str], Path]]:
    """A tmpfs of ``size`` at ``folder`` in a mount namespace of its own (``_own_tmpfs``),
    held by a sleeping process; yields the command prefix that runs a command inside it
    (``nsenter``), so a server started there, stopped and started again, keeps its disk,
    and the folder as seen from here."""
    holder = subprocess.Popen([*_own_tmpfs(folder, size), "sleep", "infinity"])
    seen = Path(f"/proc/{holder.pid}/root") / folder.relative_to("/")
    deadline = time.monotonic() + 30
    while (fs := os.statvfs(seen)).f_blocks * fs.f_frsize != _bytes(size):
        assert holder.poll() is None and time.monotonic() < deadline, "the tmpfs was not mounted"
        time.sleep(0.05)
    try:
        yield ["nsenter", f"--target={holder.pid}", "--user", "--mount", "--preserve-credentials"], seen
    finally:
        holder.kill()
        holder.wait()


def _bytes(size: str) -> int:
    return int(size[:-1]) << {"k": 10, "m": 20, "g": 30}[size[-1]]


def _until_reached(client: KvClient, seconds: float = 180) -> None:
    """Wait until the DAL reaches its store again (the driver reconnects to a restarted node
    on its own schedule)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            client.list_namespaces(ALIAS)
            return
        except BulldozerError:
            assert time.monotonic() < deadline, "the DAL did not reach its store again"
            time.sleep(1)


def test_cassandra_disk_full(home: Path, tmp_path: Path) -> None:
    """The disk holding a Cassandra node's data and commit log fills up: the run fails with
    one line saying what the node did — it could not write to its disk (a flush or schema
    change: FSWriteError), or it died (its memory-mapped commit log segment could not grow:
    SIGBUS) and no node answers — the alias and the live version are untouched, and once
    there is room (and the node runs again) the job finishes."""
    disk = tmp_path / "cassandra"
    script = [str(services.SCRIPTS / "cassandra.sh")]
    cql = services.free_ports(2)
    with _disk_of_its_own(disk, "512m") as (inside, seen):
        subprocess.run([*inside, "bash", *script, "start", str(disk), str(cql)], check=True, timeout=300)
        port = _free_port()
        server = _start(None, port, "--engine", "cassandra", "--cql-port", str(cql), "--keyspace", "disk_full")
        endpoint = {"BULLDOZER_ENDPOINT": f"127.0.0.1:{port}"}
        tally, repeats = Tally(""), max(1, REPEATS // 2)  # half the scenarios' repeats: each may restart the node
        try:
            with KvClient(f"127.0.0.1:{port}") as client:
                for _ in range(repeats):
                    tally.live = run_job(spec(), client, home=str(home)).version
                    filler = _fill(seen, leave=256 << 10)
                    failed = _cli(["run", "templates/move_data_to_kv_dal.yaml", "-q"], home, endpoint)
                    said = failed.stderr.strip().splitlines()
                    assert failed.returncode == 1, failed.stderr
                    assert len(said) == 1, failed.stderr
                    assert "could not write to its disk (FSWriteError in" in said[0] or (
                        "no Cassandra node at" in said[0] and "answers" in said[0]
                    ), said[0]
                    filler.unlink()  # room again
                    if _java_pid(disk) is None:  # it died: start it again, on the same disk
                        subprocess.run([*inside, "bash", *script, "start", str(disk), str(cql)], check=True)
                    _until_reached(client)
                    tally.after_fault(client, home)
        finally:
            stop_servers([server])
            subprocess.run([*inside, "bash", *script, "stop", str(disk)], check=False, timeout=120)
    tally.report("Cassandra's disk full at a run", repeats)


def _java_pid(folder: Path) -> int | None:
    """The pid of the Cassandra node whose data is in ``folder`` (None when it is not running)."""
    found = subprocess.run(["pgrep", "-f", f"cassandra.config=file://{folder}/"], capture_output=True, text=True)
    pids = [int(p) for p in found.stdout.split()]
    return pids[0] if pids else None


def test_network_stall(home: Path, dal_process: tuple[Path, int]) -> None:
    _, port = dal_process
    with KvClient(f"127.0.0.1:{port}") as direct:
        tally = Tally(run_job(spec(), direct, home=str(home)).version)
        for i in range(REPEATS):
            proxy = Proxy(port)
            try:
                with KvClient(f"127.0.0.1:{proxy.port}", timeout=3) as client:

                    def stall(done: int, total: int, at: int = 4_000 + 9_000 * i, link: Any = proxy) -> None:
                        if done >= at:
                            link.flowing.clear()

                    with pytest.raises(BulldozerError):
                        run_job(spec(), client, home=str(home), progress=stall)
            finally:
                proxy.flowing.set()
                proxy.close()
            tally.after_fault(direct, home)
    tally.report("network stall mid-load (proxy stops forwarding)", REPEATS)
