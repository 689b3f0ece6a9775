"""KV DAL benchmark, side by side in one run (embedded engine, LMDB):

* write records/s through the DAL (client → gRPC on loopback → engine) vs the same
  records written straight into the engine;
* batch get of 100 keys: throughput and p50 / p99 latency through the DAL vs direct,
  one call at a time and pipelined (8 in flight, ``KvClient.batch_get_many``); the same
  requests from a Go client (``native/kvd/cmd/kvd-batchget``), to tell the server's cost
  from the Python client's; and the rate of an empty gRPC call (a health check) on the
  Python server: the per-call cost of the gRPC stack alone;
* alias flip latency for a small and a large namespace;
* each DAL measure twice, once per data plane: ``native`` (bulldozer-kvd, Go, in front
  of the DAL) and ``python`` (the DAL alone), two DAL processes over the one store;
* with ``--engines redis,cassandra``: one row per distributed engine, write records/s
  through a DAL in front of it vs the same records written directly with the engine's
  own Python client in its fastest bulk mode (Redis: pipelined MSET; Cassandra: the
  faster of concurrent prepared inserts and concurrent unlogged batches). The servers
  are started by scripts/services/*.sh (and stopped afterwards).

    .venv/bin/python -m bench.kv [--records 2000000] [--repeat 3] [--quick]
                                 [--engines redis,cassandra] [--engine-records 200000]

Keys are 16 bytes, values 100 bytes. Prints a markdown table of medians.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from bench.common import scratch_dir
from bench.services import dal_server, engine_server, fresh_store_name, serve_args
from bulldozer.codec.digest import digest_arrays
from bulldozer.kv import KvClient, create_engine
from bulldozer.kv.types import NamespaceRecord
from bulldozer.names import new_version_name

BATCH = 20_000


def make_records(n: int) -> tuple[pa.Array, pa.Array, list[list[tuple[bytes, bytes]]]]:
    rng = np.random.default_rng(3)
    keys_np = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    keys_np[:, :8] = np.arange(n, dtype=">u8").view(np.uint8).reshape(n, 8)  # unique
    values_np = rng.integers(0, 256, size=(n, 100), dtype=np.uint8)
    key_list = [bytes(r) for r in keys_np]
    value_list = [bytes(r) for r in values_np]
    keys = pa.array(key_list, pa.large_binary())
    values = pa.array(value_list, pa.large_binary())
    batches = [list(zip(key_list[i : i + BATCH], value_list[i : i + BATCH], strict=True)) for i in range(0, n, BATCH)]
    return keys, values, batches


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def write_through_dal(client: KvClient, name: str, keys: pa.Array, values: pa.Array) -> None:
    """Create ``name`` and stream the columns into it, 4 batches in flight."""
    client.create_namespace(name, "dal")
    with client.writer(name, batch_records=BATCH, in_flight=4) as writer:
        writer.add_arrays(keys, values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gets", type=int, default=2_000, help="batch gets per measurement")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--engines", default="", help="also measure these engines: redis,cassandra")
    parser.add_argument("--engine-records", type=int, default=200_000, help="records per distributed-engine round")
    parser.add_argument("--skip-embedded", action="store_true", help="only the --engines rows")
    args = parser.parse_args()
    engine_rows = []
    for kind in [e for e in args.engines.split(",") if e]:
        m = 20_000 if args.quick else args.engine_records
        engine_rows.append((kind, m, *bench_engine(kind, m, 1 if args.quick else args.repeat)))
    if engine_rows:
        print(f"\nKV DAL over distributed engines, 16 B keys + 100 B values, median of {args.repeat}\n")
        print("| engine | records | through the DAL /s | direct client /s | direct mode | DAL / direct | target |")
        print("|---|---:|---:|---:|---|---:|---|")
        for kind, m, dal_rate, direct_rate, mode in engine_rows:
            print(
                f"| {kind} | {m:,} | {dal_rate:,.0f} | {direct_rate:,.0f} | {mode} | {dal_rate / direct_rate:.2f} | ≥ 0.8 |"
            )
    if args.skip_embedded:
        return
    n, repeat, gets = (20_000, 1, 100) if args.quick else (args.records, args.repeat, args.gets)
    big = 20_000 if args.quick else 1_000_000

    keys, values, batches = make_records(n)
    store = str(scratch_dir("bulldozer-bench-kv-") / "store")
    # The DALs run as their own processes (as in production), one per data plane over the
    # one store; the direct engine is opened here on the same store, which LMDB allows.
    embedded = serve_args("embedded", 0, store)
    with (
        dal_server([*embedded, "--data-plane", "native"]) as native,
        dal_server([*embedded, "--data-plane", "python"]) as python,
    ):
        measure_embedded(
            {"native": native.endpoint, "python": python.endpoint}, store, keys, values, batches, repeat, gets, big
        )


PLANES = ("native", "python")


def measure_embedded(
    endpoints: dict[str, str],
    store: str,
    keys: pa.Array,
    values: pa.Array,
    batches: list[list[tuple[bytes, bytes]]],
    repeat: int,
    gets: int,
    big: int,
) -> None:
    n = len(keys)
    clients = {plane: KvClient(endpoint, timeout=120) for plane, endpoint in endpoints.items()}
    engine = create_engine({"type": "embedded", "path": store, "map_size": 64 * 1024**3})

    direct_times: list[float] = []
    dal_times: dict[str, list[float]] = {plane: [] for plane in PLANES}
    last_ns = ""
    columns = [([k for k, _ in b], [v for _, v in b]) for b in batches]
    for r in range(repeat):
        # direct: the engine's own bulk put, same batches
        name = new_version_name("direct")
        engine.create_namespace(NamespaceRecord(name=name, alias="direct"))
        direct_times.append(timed(lambda name=name: [engine.write_batch(name, ks, vs) for ks, vs in columns]))
        for plane in PLANES:  # through each DAL
            name = new_version_name("dal")
            dal_times[plane].append(timed(lambda name=name, c=clients[plane]: write_through_dal(c, name, keys, values)))
            last_ns = name if plane == "native" else last_ns
        rates = ", ".join(f"{plane} DAL {n / dal_times[plane][-1]:,.0f}/s" for plane in PLANES)
        print(f"  write round {r + 1}: direct {n / direct_times[-1]:,.0f}/s, {rates}", flush=True)

    # batch get of 100 random keys from the loaded version
    expected = digest_arrays(keys, values)
    sealed = clients["native"].seal(last_ns, expected.count, expected.value)
    clients["native"].compare_and_set_alias("dal", None, sealed.name)
    rnd = random.Random(5)
    key_list = keys.to_pylist()
    samples = [[key_list[rnd.randrange(n)] for _ in range(100)] for _ in range(gets)]

    def latencies(fn: Callable[[list[bytes]], Any]) -> list[float]:
        out = []
        for sample in samples:
            started = time.perf_counter()
            fn(sample)
            out.append(time.perf_counter() - started)
        return out

    def pipelined(client: KvClient) -> float:
        found = 0
        started = time.perf_counter()
        for _, got in client.batch_get_many(samples, alias="dal", in_flight=8):
            found += sum(v is not None for v in got)
        elapsed = time.perf_counter() - started
        assert found == 100 * gets, "every sampled key is in the version"
        return gets / elapsed

    direct_lat = latencies(lambda ks: engine.get_many(sealed.name, ks))
    dal_lat = {p: latencies(lambda ks, c=clients[p]: c.batch_get(ks, alias="dal")) for p in PLANES}
    piped = {p: pipelined(clients[p]) for p in PLANES}
    floor_lat = latencies(lambda ks: empty_call(endpoints["python"]))
    go = {p: go_client(endpoints[p], "dal", samples, store) for p in PLANES}

    # flip latency: small vs large namespace
    def flip_latency(client: KvClient, size: int) -> float:
        times = []
        for _ in range(max(3, repeat)):
            current = client.get_alias("flip").namespace if _has_alias(client, "flip") else None
            name = new_version_name("flip")
            client.create_namespace(name, "flip")
            with client.writer(name) as writer:
                writer.add_arrays(keys.slice(0, size), values.slice(0, size))
            expected = digest_arrays(keys.slice(0, size), values.slice(0, size))
            client.seal(name, expected.count, expected.value)
            times.append(timed(lambda name=name, current=current: client.compare_and_set_alias("flip", current, name)))
        return statistics.median(times)

    flips = {p: (flip_latency(clients[p], 1_000), flip_latency(clients[p], min(big, n))) for p in PLANES}

    direct_rate = n / statistics.median(direct_times)
    q = lambda xs, p: float(np.percentile(np.array(xs) * 1000, p))  # noqa: E731
    get_direct = gets / sum(direct_lat)
    write = {p: n / statistics.median(dal_times[p]) for p in PLANES}
    get = {p: gets / sum(dal_lat[p]) for p in PLANES}
    print(f"\nKV DAL, embedded engine (LMDB), {n:,} records of 16 B keys + 100 B values, median of {repeat}")
    print("DAL columns: the native data plane (bulldozer-kvd in front of the DAL) and the Python one (the DAL alone)\n")
    print("| measure | DAL, native | DAL, python | direct engine | native / direct | python / direct | target |")
    print("|---|---:|---:|---:|---:|---:|---|")

    def row(label: str, values: dict[str, float], direct: float | None, fmt: str, target: str = "") -> None:
        cells = [format(values[p], fmt) for p in PLANES]
        ratios = [f"{values[p] / direct:.2f}" if direct else "" for p in PLANES]
        shown = format(direct, fmt) if direct is not None else ""
        print(f"| {label} | {' | '.join(cells)} | {shown} | {' | '.join(ratios)} | {target} |")

    row("write records/s", write, direct_rate, ",.0f", "≥ 0.5")
    row("batch get (100 keys) /s, one at a time", get, get_direct, ",.0f", "≥ 0.5")
    row("batch get (100 keys) /s, 8 in flight", piped, get_direct, ",.0f", "≥ 0.5")
    row("batch get p50 ms", {p: q(dal_lat[p], 50) for p in PLANES}, None, ".2f")
    print(f"| (direct batch get p50 / p99 ms) | | | {q(direct_lat, 50):.2f} / {q(direct_lat, 99):.2f} | | | |")
    row("batch get p99 ms", {p: q(dal_lat[p], 99) for p in PLANES}, None, ".2f", "< 5 ms")
    if all(go.values()):
        row("batch get /s from a Go client, one at a time", {p: go[p]["rate"] for p in PLANES}, get_direct, ",.0f")
        row(
            "batch get /s from a Go client, 8 in flight",
            {p: go[p]["rate_concurrent"] for p in PLANES},
            get_direct,
            ",.0f",
        )
        row("Go client batch get p50 ms", {p: go[p]["p50_ms"] for p in PLANES}, None, ".2f")
        row("Go client batch get p99 ms", {p: go[p]["p99_ms"] for p in PLANES}, None, ".2f", "< 5 ms")
    floor = gets / sum(floor_lat)
    print(
        f"| an empty gRPC call (health check) /s on the Python server | | {floor:,.0f} | | | "
        f"{floor / get_direct:.2f} | |"
    )
    print(f"| empty gRPC call p50 ms | | {q(floor_lat, 50):.2f} | | | | |")
    row("alias flip ms, 1,000-record version", {p: flips[p][0] * 1000 for p in PLANES}, None, ".2f")
    row(f"alias flip ms, {min(big, n):,}-record version", {p: flips[p][1] * 1000 for p in PLANES}, None, ".2f")
    ratio = " | ".join(f"{flips[p][1] / flips[p][0]:.2f}" for p in PLANES)
    print(f"| alias flip, big / small | {ratio} | | | | independent of size |")
    for client in clients.values():
        client.close()


def go_client(endpoint: str, alias: str, samples: list[list[bytes]], store: str) -> dict[str, float]:
    """The same batch gets from a Go client (native/kvd/cmd/kvd-batchget, built by
    scripts/build_native.sh): how fast the server answers when the client costs little.
    Empty when the tool is not built."""
    import json
    import subprocess
    from pathlib import Path

    from bench.common import REPO

    tool = REPO / "native" / "bin" / "kvd-batchget"
    if not tool.exists():
        return {}
    keys_file = Path(store).parent / "batchget-keys.bin"
    keys_file.write_bytes(b"".join(b"".join(sample) for sample in samples))
    size = len(samples[0][0])
    args = [str(tool), f"-target={endpoint}", f"-alias={alias}", f"-keys={keys_file}", f"-key-size={size}"]
    out = subprocess.run([*args, f"-batch={len(samples[0])}", "-in-flight=8"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"kvd-batchget failed: {out.stderr}")
    result: dict[str, float] = json.loads(out.stdout)
    return result


_health: dict[str, Any] = {}


def empty_call(endpoint: str) -> None:
    """One gRPC health check on ``endpoint``: the cost of a call that does no work, on the
    same gRPC stack (a channel of its own, opened once)."""
    if endpoint not in _health:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(endpoint))
        _health[endpoint] = (stub, health_pb2.HealthCheckRequest())
    stub, request = _health[endpoint]
    stub.Check(request, timeout=10)


def bench_engine(kind: str, n: int, repeat: int) -> tuple[float, float, str]:
    """(DAL records/s, direct records/s, direct mode) for one distributed engine, median of ``repeat``."""

    keys, values, batches = make_records(n)
    store = fresh_store_name()
    with (
        engine_server(kind) as port,
        dal_server(serve_args(kind, port, store)) as dal,
        direct_writers(kind, port) as direct,
    ):
        client = KvClient(dal.endpoint, timeout=300)
        direct_times: dict[str, list[float]] = {}
        dal_times = []
        for r in range(repeat):
            for mode, write in direct.items():
                direct_times.setdefault(mode, []).append(timed(lambda write=write, r=r: write(f"d{r}", batches)))
            name = new_version_name("dal")
            dal_times.append(timed(lambda name=name: write_through_dal(client, name, keys, values)))
            client.mark_failed(name, "benchmark")
            client.drop(name)
            rates = ", ".join(f"{m} {n / t[-1]:,.0f}/s" for m, t in direct_times.items())
            print(f"  {kind} round {r + 1}: DAL {n / dal_times[-1]:,.0f}/s, direct {rates}", flush=True)
        client.close()
    best_mode = min(direct_times, key=lambda m: statistics.median(direct_times[m]))
    return n / statistics.median(dal_times), n / statistics.median(direct_times[best_mode]), best_mode


@contextlib.contextmanager
def direct_writers(kind: str, port: int) -> Iterator[dict[str, Callable[[str, list[list[tuple[bytes, bytes]]]], None]]]:
    """The engine's own Python client writing the batches into a fresh key space, per mode;
    its connections closed at the end (a Cassandra session left open kept trying to reconnect
    to the stopped server, and said so, until the benchmark's process ended)."""
    if kind == "redis":
        import redis

        r = redis.Redis(port=port)

        def mset(tag: str, batches: list[list[tuple[bytes, bytes]]]) -> None:
            prefix = f"direct:{tag}:".encode()
            pipe = r.pipeline(transaction=False)
            for i, batch in enumerate(batches):
                pipe.mset({prefix + k: v for k, v in batch})
                if i % 4 == 3:
                    pipe.execute()
            pipe.execute()

        try:
            yield {"pipelined MSET": mset}
        finally:
            r.close()
        return

    from cassandra.cluster import Cluster
    from cassandra.concurrent import execute_concurrent, execute_concurrent_with_args
    from cassandra.query import BatchStatement, BatchType

    from bulldozer.kv.backends.cassandra import SegmentSafeConnection

    # the engine's connection: the driver's own loses a segment header split by a read
    cluster = Cluster(["127.0.0.1"], port=port, protocol_version=5, connection_class=SegmentSafeConnection)
    session = cluster.connect()
    session.execute(
        "CREATE KEYSPACE IF NOT EXISTS direct WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}"
    )

    def table(tag: str) -> Any:
        session.execute(f"CREATE TABLE IF NOT EXISTS direct.{tag} (k blob PRIMARY KEY, v blob)")
        return session.prepare(f"INSERT INTO direct.{tag} (k, v) VALUES (?, ?)")

    def inserts(tag: str, batches: list[list[tuple[bytes, bytes]]]) -> None:
        insert = table(tag + "_i")
        for batch in batches:
            execute_concurrent_with_args(session, insert, batch, concurrency=128, raise_on_first_error=True)

    def unlogged(tag: str, batches: list[list[tuple[bytes, bytes]]]) -> None:
        insert = table(tag + "_b")
        for batch in batches:
            statements = []
            for i in range(0, len(batch), 64):
                b = BatchStatement(batch_type=BatchType.UNLOGGED)
                for row in batch[i : i + 64]:
                    b.add(insert, row)
                statements.append((b, ()))
            execute_concurrent(session, statements, concurrency=128, raise_on_first_error=True)

    try:
        yield {"concurrent inserts": inserts, "unlogged batches": unlogged}
    finally:
        cluster.shutdown()


def _has_alias(client: KvClient, alias: str) -> bool:
    from bulldozer.errors import AliasNotFoundError

    try:
        client.get_alias(alias)
        return True
    except AliasNotFoundError:
        return False


if __name__ == "__main__":
    main()
