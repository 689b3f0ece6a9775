"""Helpers the benchmarks share: running a ``bulldozer`` command with its peak RSS, and the
records a job would write, pre-encoded, for the raw-engine baselines."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")


@dataclass
class CliRun:
    output: dict[str, Any]  # the command's --json output
    seconds: float  # wall time, process start to exit
    rss_kib: int  # peak RSS (VmHWM) of the command's process
    child_rss_kib: int  # peak RSS of its descendants together (the embedded DAL and its bulldozer-kvd, or Spark's JVM)
    child_anon_kib: int = 0  # peak anonymous (private) resident memory of its descendants together
    anon_kib: int = 0  # peak anonymous resident memory of the command's process (polled)
    major_faults: int = 0  # of the command's process and its DAL (pages read back from the disk)


def scratch_dir(prefix: str) -> Path:
    """A fresh temporary folder, removed when the benchmark exits (stores of several GiB
    each: left behind, a few benchmark runs fill the disk)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, True)
    return path


def run_cli(args: list[str], home: Path, env: dict[str, str] | None = None, entry: bool = False) -> CliRun:
    """Run ``bulldozer ARGS`` in its own process with ``BULLDOZER_HOME=home``, polling its
    descendants' memory from here (not from inside the command, where it would cost it time).
    ``entry``: the installed ``bulldozer`` command, as users start it (the native launcher
    where the install built it: native/launcher), which hands a run over to the home's warm
    loader when one runs (its memory is then the loader's, not polled here, and its own peak
    RSS is not reported: 0); its major faults are what the kernel counted for it (``wait4``;
    its ``ru_maxrss`` would be this process's, see bench.measured_cli)."""
    from bench.measured_cli import peak_of_descendants

    command = (
        [str(Path(sys.executable).parent / "bulldozer")] if entry else [sys.executable, "-m", "bench.measured_cli"]
    )
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [*command, *args],
            stdout=out,
            stderr=err,
            text=True,
            env={**os.environ, "BULLDOZER_HOME": str(home), **(env or {})},
            cwd=REPO,
        )
        done = threading.Event()
        with ThreadPoolExecutor(1, thread_name_prefix="rss-poll") as pool:
            peaks = pool.submit(peak_of_descendants, proc.pid, done)
            _, status, usage = os.wait4(proc.pid, 0)
            seconds = time.perf_counter() - started
            proc.returncode = returncode = os.waitstatus_to_exitcode(status)
            done.set()
        kids, kids_anon, anon = peaks.result()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if returncode != 0:
        raise SystemExit(f"bulldozer {' '.join(args)} failed:\n{stderr[-3000:]}")
    if entry:
        return CliRun(json.loads(stdout), seconds, 0, kids, kids_anon, anon, usage.ru_majflt)
    lines = stderr.splitlines()

    def reported(name: str) -> int:  # the last line ``NAME <n>`` bench.measured_cli wrote at exit
        return int([line for line in lines if line.startswith(f"{name} ")][-1].split()[1])

    return CliRun(json.loads(stdout), seconds, reported("RSS"), kids, kids_anon, anon, reported("FAULTS"))


def store_bytes(home: Path) -> int:
    """The size of the embedded store's file under ``home`` (0 before its first run)."""
    from bulldozer.kv.connect import embedded_store_path

    try:
        return (embedded_store_path(home) / "data.mdb").stat().st_size
    except FileNotFoundError:
        return 0


def settle(run: Callable[[], CliRun], home: Path, most: int = 4) -> list[dict[str, float]]:
    """Run ``run`` (a run into ``home``'s embedded store) until the store's file no longer
    grows (by more than 1 %), at most ``most`` times, before the runs a benchmark measures:
    each run's seconds, the bytes the file grew by and its size after.

    A store reuses the pages its dropped versions freed, so a daily job writes into pages
    its file already holds; until the file has room for a live version, the new one and its
    staged runs, each run grows it, and a block a disk writes for the first time can cost
    far more than one it writes again (on this machine's virtual disk, dd wrote 110 MB/s to
    new blocks and 2.8 GB/s over written ones: the verify stage of a 10 M-row full run took
    3.6-4.5 s while the file grew, 1.0-1.3 s after). A benchmark that measured the first
    rounds would time the file's growth, not the steady state, and a different share of it
    in each run. The first run here is the first into a fresh store when the store was new:
    callers report it on its own."""
    runs: list[dict[str, float]] = []
    for _ in range(most):
        done, grew = measured_growth(run, home)
        after = store_bytes(home)
        runs.append({"seconds": done.seconds, "grew_bytes": grew, "bytes": after})
        if grew <= (after - grew) // 100:  # the run records' few pages aside, it wrote into pages the file held
            break
    return runs


def steady_spec(source: Path, path: Path) -> Path:
    """``source``'s job spec written to ``path`` with a retention that drops each version
    the moment it retires (``keep_versions: 1``, ``grace_period: 0s``): a daily job's store
    past its first day, when yesterday's retired version leaves as today's is written, so
    ``settle`` can bring the store to its size. Under the template's own retention (two
    versions kept, retired ones for 24 h) every run of a benchmark keeps its version, and
    the store's file grows by a version a run for as long as the benchmark lasts."""
    import yaml

    spec = yaml.safe_load(source.read_text())
    spec["key_value_dal"]["retention"] = {"keep_versions": 1, "grace_period": "0s"}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def grew_after_settling(settled: list[dict[str, float]], grew: int) -> str:
    """A note for a benchmark row when the store's file grew by more than 1 % of its settled
    size during the measured runs (``grew`` bytes), else ''."""
    if grew <= settled[-1]["bytes"] // 100:
        return ""
    return f"; it grew {grew / 2**20:,.0f} MiB more in the measured runs"


def measured_growth(run: Callable[[], T], home: Path) -> tuple[T, int]:
    """``run()`` and the bytes the embedded store's file under ``home`` grew by meanwhile."""
    before = store_bytes(home)
    done = run()
    return done, store_bytes(home) - before


def _job_encoder(home: Path, spec_path: Path) -> tuple[Any, Any, tuple[str, ...]]:
    """The job's table, its encoder and the columns it reads."""
    from bulldozer.load.encoder.encode import RowEncoder
    from bulldozer.schema.job import build_job_schema
    from bulldozer.spec import load_spec
    from bulldozer.warehouse.catalog import open_catalog

    spec = load_spec(spec_path, env={}).spec
    source = spec.data_movement.source.table
    assert source is not None, "a table source"
    table = open_catalog(spec.data_movement.catalog, home).load_table(source)
    job = build_job_schema(spec, table.schema(), python=False)
    columns = tuple(f.column for f in [*job.proto.key.fields, *job.proto.value.fields])
    return table, RowEncoder(job.proto), columns


def encoded_batches(home: Path, spec_path: Path) -> list[list[tuple[bytes, bytes]]]:
    """The (key, value) records the job in ``spec_path`` writes, encoded by the job's own
    encoder from the same table, in the order and the batches the local engine sends them:
    its splits in its order, read by its own reader, cut into batches where the client's
    writer cuts them (the spec's ``batch_size`` and ``max_batch_bytes``). What a raw engine
    write gets: the same records in the same transactions (the order matters to LMDB, and
    the keys' protobuf bytes are not in the numbers' order)."""
    import pyarrow.compute as pc

    from bulldozer.kv.columnar import batch_bounds
    from bulldozer.load.engines.local import scan_tasks, task_batches
    from bulldozer.spec import load_spec

    write = load_spec(spec_path, env={}).spec.key_value_dal.write
    table, encoder, columns = _job_encoder(home, spec_path)
    scan = table.scan(selected_fields=columns)
    batches = []
    for task in scan_tasks(scan):
        for arrow in task_batches(table, scan, task):  # the local engine's own reader
            enc = encoder.encode(arrow)
            keys, values = enc.keys.to_pylist(), enc.values.to_pylist()
            sizes = pc.binary_length(enc.keys).to_numpy() + pc.binary_length(enc.values).to_numpy()
            batches += [
                list(zip(keys[a:b], values[a:b], strict=True))
                for a, b in batch_bounds(sizes, write.batch_size, write.max_batch_bytes)
            ]
    return batches


@contextlib.contextmanager
def _fresh_lmdb() -> Iterator[tuple[Any, Any]]:
    """An LMDB environment in a new folder, opened as the embedded engine opens its store,
    and one database in it; removed afterwards."""
    import lmdb

    folder = tempfile.mkdtemp(prefix="bulldozer-bench-raw-")
    env = lmdb.open(folder, map_size=64 * 1024**3, max_dbs=4, subdir=True, sync=True, metasync=False, readahead=False)
    try:
        yield env, env.open_db(b"raw")
    finally:
        env.close()
        shutil.rmtree(folder, ignore_errors=True)


def raw_lmdb_puts(batches: list[list[tuple[bytes, bytes]]]) -> float:
    """Seconds for LMDB to put the records in place, in the job's batches, one write
    transaction each (py-lmdb's putmulti through a cursor), then sync: what a plain bulk
    load into LMDB does, and what the embedded engine did before it staged sorted runs."""
    columns = [([k for k, _ in b], [v for _, v in b]) for b in batches]  # split before the clock starts
    with _fresh_lmdb() as (env, db):
        started = time.perf_counter()
        for keys, values in columns:
            with env.begin(write=True) as txn:
                txn.cursor(db=db).putmulti(zip(keys, values, strict=True))
        env.sync(True)
        return time.perf_counter() - started


def raw_lmdb_sorted_append(batches: list[list[tuple[bytes, bytes]]]) -> float:
    """Seconds for LMDB's fastest write of the records: sorted by key (Arrow's sort, counted)
    and appended (MDB_APPEND) in one write transaction into a fresh database, then synced."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = pa.array([k for b in batches for k, _ in b], pa.binary())
    values = pa.array([v for b in batches for _, v in b], pa.binary())
    with _fresh_lmdb() as (env, db):
        started = time.perf_counter()
        order = pc.sort_indices(keys)
        pairs = zip(keys.take(order).to_pylist(), values.take(order).to_pylist(), strict=True)
        with env.begin(write=True) as txn:
            txn.cursor(db=db).putmulti(pairs, append=True)
        env.sync(True)
        return time.perf_counter() - started


def raw_write(kind: str, port: int, batches: list[list[tuple[bytes, bytes]]], tag: str) -> float:
    """Seconds for the engine's own client to bulk-write ``batches``: LMDB's puts in the job's
    batches (``raw_lmdb_puts``; ``raw_lmdb_sorted_append`` is its sorted ceiling), Redis'
    and Cassandra's fastest mode."""
    if kind == "embedded":
        return raw_lmdb_puts(batches)
    from bench.kv import direct_writers

    with direct_writers(kind, port) as writers:
        if kind == "cassandra":  # concurrent single inserts ran 8-10x slower in every bench.kv run
            writers = {"unlogged batches": writers["unlogged batches"]}
        times = {}
        for mode, write in writers.items():
            started = time.perf_counter()
            write(tag, batches)
            times[mode] = time.perf_counter() - started
    return min(times.values())


def percentile_ms(seconds: list[float], p: float) -> float:
    import numpy as np

    return float(np.percentile(np.array(seconds) * 1000, p))
