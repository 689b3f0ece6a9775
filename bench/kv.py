"""KV DAL benchmark, side by side in one run (embedded engine, LMDB):

* write records/s through the DAL (client → gRPC on loopback → engine) vs the same
  records written straight into the engine;
* batch get of 100 keys: throughput and p50 / p99 latency through the DAL vs direct, and
  the rate of an empty gRPC call (a health check) on the same server: the per-call cost
  of the gRPC stack alone, which bounds any call's rate;
* alias flip latency for a small and a large namespace;
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
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from bench.common import scratch_dir
from bench.services import dal_server, engine_server, fresh_store_name, serve_args
from bulldozer.kv import KvClient, create_engine
from bulldozer.kv.backends.base import NamespaceRecord
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
    # The DAL runs as its own process (as in production); the direct engine is opened
    # here on the same store, which LMDB allows.
    with dal_server(serve_args("embedded", 0, store)) as dal:
        measure_embedded(dal.endpoint, store, keys, values, batches, n, repeat, gets, big)


def measure_embedded(
    endpoint: str,
    store: str,
    keys: pa.Array,
    values: pa.Array,
    batches: list[list[tuple[bytes, bytes]]],
    n: int,
    repeat: int,
    gets: int,
    big: int,
) -> None:
    client = KvClient(endpoint, timeout=120)
    engine = create_engine({"type": "embedded", "path": store, "map_size": 64 * 1024**3})

    direct_times, dal_times = [], []
    last_dal_ns = ""
    for r in range(repeat):
        # direct: the engine's own bulk put, same batches
        name = new_version_name("direct")
        engine.create_namespace(NamespaceRecord(name=name, alias="direct"))
        direct_times.append(timed(lambda name=name: [engine.put(name, b) for b in batches]))
        # through the DAL
        name = new_version_name("dal")
        dal_times.append(timed(lambda name=name: write_through_dal(client, name, keys, values)))
        last_dal_ns = name
        print(
            f"  write round {r + 1}: direct {n / direct_times[-1]:,.0f}/s, DAL {n / dal_times[-1]:,.0f}/s",
            flush=True,
        )

    # batch get of 100 random keys from the loaded version
    sealed = client.seal(last_dal_ns)
    client.compare_and_set_alias("dal", None, sealed.name)
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

    direct_lat = latencies(lambda ks: engine.get_many(sealed.name, ks))
    dal_lat = latencies(lambda ks: client.batch_get(ks, alias="dal"))
    floor_lat = latencies(lambda ks: empty_call(endpoint))

    # flip latency: small vs large namespace
    def flip_latency(size: int) -> float:
        times = []
        for _ in range(max(3, repeat)):
            current = client.get_alias("flip").namespace if _has_alias(client, "flip") else None
            name = new_version_name("flip")
            client.create_namespace(name, "flip")
            with client.writer(name) as writer:
                writer.add_arrays(keys.slice(0, size), values.slice(0, size))
            client.seal(name)
            times.append(timed(lambda name=name, current=current: client.compare_and_set_alias("flip", current, name)))
        return statistics.median(times)

    flip_small = flip_latency(1_000)
    flip_big = flip_latency(min(big, n))

    direct_rate = n / statistics.median(direct_times)
    dal_rate = n / statistics.median(dal_times)
    q = lambda xs, p: float(np.percentile(np.array(xs) * 1000, p))  # noqa: E731
    get_direct = gets / sum(direct_lat)
    get_dal = gets / sum(dal_lat)
    print(f"\nKV DAL, embedded engine (LMDB), {n:,} records of 16 B keys + 100 B values, median of {repeat}\n")
    print("| measure | through the DAL | direct engine | DAL / direct | target |")
    print("|---|---:|---:|---:|---|")
    print(f"| write records/s | {dal_rate:,.0f} | {direct_rate:,.0f} | {dal_rate / direct_rate:.2f} | ≥ 0.5 |")
    print(f"| batch get (100 keys) /s | {get_dal:,.0f} | {get_direct:,.0f} | {get_dal / get_direct:.2f} | ≥ 0.5 |")
    print(f"| batch get p50 ms | {q(dal_lat, 50):.2f} | {q(direct_lat, 50):.2f} | | |")
    print(f"| batch get p99 ms | {q(dal_lat, 99):.2f} | {q(direct_lat, 99):.2f} | | < 5 ms |")
    print(
        f"| an empty gRPC call (health check) /s, the floor of any call here | {gets / sum(floor_lat):,.0f} | | "
        f"{(gets / sum(floor_lat)) / get_direct:.2f} | |"
    )
    print(f"| empty gRPC call p50 ms | {q(floor_lat, 50):.2f} | | | |")
    print(f"| alias flip ms, 1,000-record version | {flip_small * 1000:.2f} | | | |")
    print(
        f"| alias flip ms, {min(big, n):,}-record version | {flip_big * 1000:.2f} | | {flip_big / flip_small:.2f} (big / small) | independent of size |"
    )
    client.close()


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
    with engine_server(kind) as port, dal_server(serve_args(kind, port, store)) as dal:
        client = KvClient(dal.endpoint, timeout=300)
        direct = _direct_writer(kind, port)
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


def _direct_writer(kind: str, port: int) -> dict[str, Callable[[str, list[list[tuple[bytes, bytes]]]], None]]:
    """The engine's own Python client writing the batches into a fresh key space, per mode."""
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

        return {"pipelined MSET": mset}

    from cassandra.cluster import Cluster
    from cassandra.concurrent import execute_concurrent, execute_concurrent_with_args
    from cassandra.query import BatchStatement, BatchType

    session = Cluster(["127.0.0.1"], port=port, protocol_version=5).connect()
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

    return {"concurrent inserts": inserts, "unlogged batches": unlogged}


def _has_alias(client: KvClient, alias: str) -> bool:
    from bulldozer.errors import AliasNotFoundError

    try:
        client.get_alias(alias)
        return True
    except AliasNotFoundError:
        return False


if __name__ == "__main__":
    main()
