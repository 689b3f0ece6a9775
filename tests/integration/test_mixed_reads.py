"""The mixed-read checker: readers hammer an alias with batch gets while a driver flips
and rolls it back 100 times; every response is checked.

Every value carries the id of the version that stores it, so the checker verifies, for
each response: all values come from one version, the version the response names (no
mixed reads); that version was sealed and made live at some point (a LOADING version
that sits beside them is never seen); and, per reader, the versions seen only move
forward along the alias's history (history-linearizable reads). Runs against the
embedded engine, Redis and Cassandra, each behind a real gRPC server."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bulldozer.kv import KvClient
from bulldozer.kv.server import create_server
from bulldozer.names import new_version_name
from tests.integration.kv_fixtures import ENGINE_FACTORIES, seal_as_loaded
from tests.integration.test_faults import result

pytestmark = pytest.mark.integration
KEYS = [b"key%04d" % i for i in range(300)]
FLIPS = 100


@dataclass
class ReaderLog:
    responses: int = 0
    mixed: int = 0
    missing: int = 0
    unsealed: int = 0
    seen: list[str] = field(default_factory=list)  # namespaces in the order read (repeats collapsed)


def linearizable(seen: list[str], history: list[str]) -> bool:
    """Can ``seen`` be read off ``history`` (the alias's targets, oldest first) left to right?"""
    position = 0
    for name in seen:
        while position < len(history) and history[position] != name:
            position += 1
        if position == len(history):
            return False
    return True


@pytest.mark.parametrize("engine_name", ["embedded", "redis", "cassandra"])
def test_no_mixed_or_unsealed_reads_across_100_flips_and_rollbacks(engine_name: str, tmp_path: Path) -> None:
    engine = ENGINE_FACTORIES[engine_name](tmp_path)
    server, port = create_server("127.0.0.1:0", engine)
    admin = KvClient(f"127.0.0.1:{port}", principal="driver")
    alias = "mixed"
    try:
        versions = []
        for _ in range(4):
            name = new_version_name(alias)
            admin.create_namespace(name, alias)
            admin.put(name, [(k, name.encode() + b"|" + k) for k in KEYS])
            seal_as_loaded(admin, name, [(k, name.encode() + b"|" + k) for k in KEYS])
            versions.append(name)
        loading = new_version_name(alias)  # written but never sealed: must never be read
        admin.create_namespace(loading, alias)
        admin.put(loading, [(k, loading.encode() + b"|" + k) for k in KEYS])
        admin.compare_and_set_alias(alias, None, versions[0], reason="start")

        stop = threading.Event()
        logs = [ReaderLog() for _ in range(3)]

        def reader(log: ReaderLog, seed: int) -> None:
            rnd = random.Random(seed)
            with KvClient(f"127.0.0.1:{port}", principal=f"reader{seed}") as client:
                while not stop.is_set():
                    keys = rnd.sample(KEYS, 40)
                    served, values = client.batch_get(keys, alias=alias)
                    log.responses += 1
                    if any(v is None for v in values):
                        log.missing += 1
                        continue
                    origins = {v.split(b"|", 1)[0].decode() for v in values if v is not None}
                    if origins != {served} or any(
                        v is not None and v.split(b"|", 1)[1] != k for k, v in zip(keys, values, strict=True)
                    ):
                        log.mixed += 1
                    if served not in versions:
                        log.unsealed += 1
                    if not log.seen or log.seen[-1] != served:
                        log.seen.append(served)

        threads = [threading.Thread(target=reader, args=(log, i)) for i, log in enumerate(logs)]
        for t in threads:
            t.start()
        rnd = random.Random(7)
        current, previous = versions[0], None
        flips = 0
        while flips < FLIPS:
            rollback = previous is not None and rnd.random() < 0.3
            target = previous if rollback else rnd.choice([v for v in versions if v != current])
            assert target is not None
            admin.compare_and_set_alias(alias, current, target, reason="rollback" if rollback else "flip")
            previous, current = current, target
            flips += 1
            time.sleep(0.002)
        stop.set()
        for t in threads:
            t.join(timeout=60)

        history = admin.alias_history(alias, limit=1000)
        targets = [c.to_namespace for c in reversed(history)]
        assert len(targets) == FLIPS + 1 and targets[-1] == current
        for log in logs:
            assert log.responses > 20
            assert (log.mixed, log.missing, log.unsealed) == (0, 0, 0)
            assert loading not in log.seen
            assert linearizable(log.seen, targets), log.seen
        assert sum(len(log.seen) for log in logs) > 3  # the readers did see the alias move
        result(
            f"mixed-read checker, {engine_name}: {FLIPS} flips/rollbacks, "
            f"{sum(log.responses for log in logs)} batch gets by {len(logs)} readers",
            1,
            0,  # asserted above: every read was linearizable against the alias history
            sum(log.missing for log in logs),
            0,
            mixed=str(sum(log.mixed + log.unsealed for log in logs)),
        )
    finally:
        admin.close()
        server.stop(1)


def test_the_linearizability_check_can_fail() -> None:
    history = ["a", "b", "a", "c"]
    assert linearizable(["a", "b", "c"], history) and linearizable(["b", "a"], history)
    assert not linearizable(["c", "b"], history) and not linearizable(["d"], history)


def test_generated_python_client_never_mixes_versions(tmp_path: Path) -> None:
    """The same checker through the generated Python client (typed messages, no namespace in
    its answers): each batch get must equal, key by key, what one single version stores."""
    import importlib
    import sys

    from bulldozer.codegen.python import generate_python_client
    from bulldozer.kv import create_engine
    from bulldozer.load.runner import run_job
    from bulldozer.schema.job import build_job_schema
    from bulldozer.warehouse.sample import create_sample_warehouse, overwrite_sample
    from tests.integration.test_run import spec, table

    home = tmp_path / "h"
    create_sample_warehouse(home, rows=1_000)
    engine = create_engine({"type": "embedded", "path": str(tmp_path / "kv"), "map_size": 1024**3})
    server, port = create_server("127.0.0.1:0", engine)
    admin = KvClient(f"127.0.0.1:{port}", principal="driver")
    sys.path.insert(0, str(tmp_path / "pkg" / "src"))
    try:
        loaded = spec()
        versions = []
        for variant in range(3):
            if variant:
                overwrite_sample(table(home), rows=1_000, variant=variant)
            versions.append(run_job(loaded, admin, home=str(home)).version)
        generate_python_client(loaded.spec, build_job_schema(loaded.spec, table(home).schema()), tmp_path / "pkg")
        importlib.invalidate_caches()  # a module made while this process runs (the path finders cache folders)
        generated = importlib.import_module("bulldozer_client_user_item_scores")
        raw_keys = [k for k, _ in admin.scan(namespace=versions[0], limit=60)]
        keys = [generated.KeyMessage.FromString(k) for k in raw_keys]
        expected = {
            v: [
                None if b is None else generated.ValueMessage.FromString(b)
                for b in admin.batch_get(raw_keys, namespace=v)[1]
            ]
            for v in versions
        }
        assert expected[versions[0]] != expected[versions[1]] != expected[versions[2]]

        stop = threading.Event()
        counts = {"responses": 0, "mixed": 0}

        def reader(seed: int) -> None:
            rnd = random.Random(seed)
            with generated.Reader(f"127.0.0.1:{port}") as client:
                while not stop.is_set():
                    picks = rnd.sample(range(len(keys)), 20)
                    values = client.batch_get([keys[i] for i in picks])
                    counts["responses"] += 1
                    if not any(all(values[j] == expected[v][i] for j, i in enumerate(picks)) for v in versions):
                        counts["mixed"] += 1

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        rnd = random.Random(3)
        current = admin.get_alias("user_item_scores").namespace
        for _ in range(FLIPS):
            target = rnd.choice([v for v in versions if v != current])
            admin.compare_and_set_alias("user_item_scores", current, target, reason="checker")
            current = target
            time.sleep(0.002)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert counts["responses"] > 20 and counts["mixed"] == 0
        result(
            f"mixed-read checker, generated Python client: {FLIPS} flips, {counts['responses']} batch gets",
            1,
            0,
            0,
            0,
            mixed=str(counts["mixed"]),
        )
    finally:
        sys.path.remove(str(tmp_path / "pkg" / "src"))
        sys.modules.pop("bulldozer_client_user_item_scores", None)
        admin.close()
        server.stop(1)
