"""Bulldozer side by side with Feast, the raw engines and its own engines, in one run.

Entry point: ``bench/run [--quick] [--repeat N] [--only SECTIONS] ...`` (``--help`` lists
the sizes). Builds each table once, runs every measurement ``--repeat`` times, prints one
markdown table of medians and, under it, the machine's load before the run and during each
section (``bench.machine_load``), and writes every sample, the load, the sizes and the
versions used as JSON under ``bench/results/``.

Sections:

1. ``feast``   Feast ``materialize`` (file offline store → SQLite / Redis online store, in
   Feast's own virtual environment) vs ``bulldozer run`` of the same rows (Iceberg → DAL →
   embedded / Redis): rows/s and peak RSS.
2. ``reads``   Feast ``get_online_features`` of 100 entity keys vs Bulldozer ``batch_get``
   of 100 keys through the DAL, values decoded: calls/s, p50, p99.
3. ``limits``  ``bulldozer run`` end to end vs the raw engine's own bulk write of the same
   pre-encoded records: embedded (LMDB), Redis (pipelined MSET), Cassandra (concurrent
   unlogged batches).
4. ``engines`` the local engine vs Spark ``local[2]`` and vs a loopback standalone cluster
   (one worker, 2 cores, executors running ``bulldozer spark package``'s environment) on
   the nested sample table, rounds interleaved; Spark on that table in one data file, its
   default (one task reads the file in place) against its read by key over both cores; and
   the local engine's time and memory as the table grows.
5. ``flip``    alias flip and rollback latency for a small and a large version.
6. ``delta``   a delta run (``data_movement.mode: delta``) after a snapshot changing 1 % of
   the rows (one file of 100 rewritten with 40 % of its rows updated and 30 % deleted, 30 %
   of a file appended) against a full run of the same snapshot, on every engine; the two
   versions' digests must be equal. On the embedded engine also through a warm loader, and
   a daily job's steady state: more deltas in a row once the chain of layers is at its
   depth limit, where each delta merges layers as they stack, and warm deltas in a row
   until the chain compacts flat once (its whole cycle, the compacting delta included).
7. ``admission`` the DAL's memory while many writers load at once.
8. ``upserts`` a table Flink's upserts wrote (equality deletes by key): the local engine
   applying them against the same rows without deletes, and against the Spark engine
   reading it through Iceberg's reader; the versions' digests must be equal. Then delta
   runs as its upserts go on, against full runs of the same snapshots.

No speed is asserted here; the ``target`` column only says how a ratio compares with the
goal in issue #11.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import feast_env, feature_table
from bench.common import (
    REPO,
    CliRun,
    encoded_batches,
    grew_after_settling,
    measured_growth,
    percentile_ms,
    raw_lmdb_sorted_append,
    raw_write,
    run_cli,
    settle,
    steady_spec,
)
from bench.feast_env import WORKER, feast_python, feast_version
from bench.machine_load import LoadSampler, describe
from bench.services import Dal, dal_server, engine_server, fresh_store_name, serve_args

SECTIONS = ("feast", "reads", "limits", "engines", "flip", "delta", "admission", "upserts")
SAMPLE_SPEC = REPO / "templates" / "move_data_to_kv_dal.yaml"


@dataclass
class Row:
    section: str
    measure: str
    bulldozer: str
    compared_with: str = ""
    ratio: str = ""
    target: str = ""
    met: bool | None = None


@dataclass(kw_only=True)  # by name only: a field added between two others shifts no argument
class Sizes:
    feast_rows: int
    read_calls: int
    limit_rows: int
    spark_rows: int
    scale_rows: list[int]
    flip_sizes: list[int]
    repeat: int
    #: the delta section's table on the embedded engine, and on Redis and Cassandra
    delta_rows: int = 10_000_000
    delta_remote_rows: int = 1_000_000
    #: the delta tables' data files, one append each (a quick run's 10: building the 100
    #: commits of a full run's took 9.2 s a table at its 20,000 rows, 0.4 s for 10)
    delta_files: int = 100
    #: one-shot deltas in a row after the measured ones, embedded: a daily job's steady state,
    #: its chain at the depth limit (each delta merges layers as they stack)
    delta_steady: int = 6
    #: warm embedded deltas in a row at most, run until the chain compacts flat once: a
    #: daily job's cost over a whole cycle of its chain (the compacting delta included)
    delta_cycle: int = 80
    #: the engines section's standalone-cluster rounds (a full run's; --quick skips them)
    spark_cluster: bool = True
    #: the engines section's table in one data file, Spark reading it in place against by key
    #: (0: not measured; --quick skips it)
    spark_one_file_rows: int = 1_600_000
    #: one Redis and one Cassandra for the whole run (a quick run's), not one per section
    shared_servers: bool = False
    #: the admission section: writers at once, batches in flight each, the batches' size
    admission_writers: int = 8
    admission_in_flight: int = 8
    admission_batch_mib: int = 16
    #: the upserts section's table, before its upserts, and its data files
    upsert_rows: int = 2_000_000
    upsert_files: int = 20


@dataclass
class Context:
    sizes: Sizes
    root: Path
    rows: list[Row] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    #: the servers shared by the run's sections, stopped when it ends
    servers: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _shared: dict[str, int] = field(default_factory=dict)

    def say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    @contextlib.contextmanager
    def engine(self, kind: str) -> Iterator[int]:
        """The port of a ``redis`` or ``cassandra`` server for one section (``embedded``: 0,
        no server). A full run starts one per section, so no section's figures see another's
        data, memory or compactions; a quick run, which checks that every section runs, starts
        each once (Cassandra takes 7-10 s to start here)."""
        if kind == "embedded":
            yield 0
        elif not self.sizes.shared_servers:
            with engine_server(kind) as port:
                yield port
        else:
            if kind not in self._shared:
                self._shared[kind] = self.servers.enter_context(engine_server(kind))
            yield self._shared[kind]


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def mean(xs: list[float]) -> float:
    return statistics.fmean(xs)


def mib(kib: float) -> str:
    return f"{kib / 1024:,.0f} MiB"


def verdict(ratio: float, target: float, higher_is_better: bool = True) -> bool:
    return ratio >= target if higher_is_better else ratio <= target


def read_back(entry: dict[str, Any], runs: str, full_runs: str | None = None) -> str:
    """A row's pages read back from the disk: the median major faults of its runs (the
    command's, and its embedded DAL's), and of the full runs a delta row is set against, when
    measured: pages of the files a run maps (its modules' and libraries', the embedded
    store's) that the kernel had evicted from memory, each read again while the run waits."""
    if runs not in entry:
        return ""
    text = f"; pages read back from the disk (major faults), median {med(entry[runs]):,.0f}"
    return text + (f", full runs {med(entry[full_runs]):,.0f}" if full_runs in entry else "")


# ---------------------------------------------------------------- Bulldozer runs


def bulldozer_run(home: Path, spec: Path, dal: Dal | None = None, warm: bool = False) -> tuple[float, int, CliRun]:
    """One ``bulldozer run``: (rows/s command start → alias flipped, peak RSS runner + DAL, run);
    ``warm``: handed over to the home's warm loader (its peak RSS is then the caller's only)."""
    env = {"BULLDOZER_ENDPOINT": dal.endpoint} if dal else {"BULLDOZER_ENDPOINT": "embedded"}
    run = run_cli(["run", str(spec), "--json", "-q"], home, env, entry=warm)
    rows = int(run.output["rows"])
    dal_rss = dal.peak_rss_kib() if dal else run.child_rss_kib
    return rows / run.seconds, run.rss_kib + dal_rss, run


class WarmLoader:
    """A running ``bulldozer loader`` for a home."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def processes(self) -> list[int]:
        """The loader and its descendants (its embedded DAL) now."""
        from bench.measured_cli import descendants

        return [self.pid, *descendants(self.pid)]

    def rss_kib(self) -> int:
        """Resident memory of the loader and its descendants now: their proportional set
        sizes (``Pss``), so the pages the loader shares with the child it forked ahead
        (bulldozer.cli.loader.server's spare) count once, not once per process."""
        total = 0
        for pid in self.processes():
            with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps_rollup") as rollup:
                total += next((int(line.split()[1]) for line in rollup if line.startswith("Pss:")), 0)
        return total

    def major_faults(self) -> int:
        """Major page faults of the loader and its descendants so far (those of the children
        they waited for included): a run's are the difference across it."""
        from bench.measured_cli import major_faults

        return sum(major_faults(pid) for pid in self.processes())

    def run(self, args: list[str], home: Path) -> CliRun:
        """``bulldozer ARGS`` handed over to this loader (``run_cli`` with ``entry``), its
        major faults the command's and the loader's with its DAL's during it."""
        before = self.major_faults()
        run = run_cli(args, home, entry=True)
        return replace(run, major_faults=run.major_faults + self.major_faults() - before)


@contextlib.contextmanager
def warm_loader(home: Path) -> Iterator[WarmLoader]:
    """``bulldozer loader start`` for ``home``, stopped after."""
    cli = [sys.executable, "-m", "bulldozer.cli.main", "loader"]
    env = {**os.environ, "BULLDOZER_HOME": str(home)}
    subprocess.run([*cli, "start"], env=env, check=True, capture_output=True, cwd=REPO)
    try:
        from bulldozer.cli.loader.client import status

        answer = status(home)
        assert answer is not None, "the loader did not start"
        yield WarmLoader(int(answer["pid"]))
    finally:
        subprocess.run([*cli, "stop"], env=env, check=True, capture_output=True, cwd=REPO)


@contextlib.contextmanager
def engine_dal(kind: str, port: int, store: str) -> Iterator[Dal | None]:
    """A DAL in front of ``kind`` (``embedded`` needs none: the run starts its own)."""
    if kind == "embedded":
        yield None
        return
    with dal_server(serve_args(kind, port, store)) as dal:
        yield dal


# ---------------------------------------------------------------- 1 + 2: Feast


def feast_worker(python: Path, mode: str, *args: str) -> dict[str, Any]:
    """Run the Feast worker; its JSON plus ``wall_seconds`` (process start to exit)."""
    started = time.perf_counter()
    proc = subprocess.run(
        [str(python), str(WORKER), mode, *args], capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"}
    )
    if proc.returncode != 0:
        raise SystemExit(f"feast {mode} failed:\n{proc.stderr[-3000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_seconds": time.perf_counter() - started}


def feast_sections(ctx: Context, do_loads: bool, do_reads: bool) -> None:
    import redis

    s = ctx.sizes
    python = feast_python()
    ctx.raw["versions"]["feast"] = feast_version(python)
    home = ctx.root / "feast-home"
    parquet = ctx.root / "user_features.parquet"
    ctx.say(
        f"feast: building the feature table ({s.feast_rows:,} rows, Iceberg + Parquet), feast {ctx.raw['versions']['feast']}"
    )
    feature_table.build(home, s.feast_rows, parquet)
    spec = feature_table.write_spec(ctx.root / "user_features.yaml")
    with ctx.engine("redis") as redis_port:
        r = redis.Redis(port=redis_port)
        feast_redis = f"127.0.0.1:{redis_port}"
        store_prefix = fresh_store_name()
        loads: dict[str, dict[str, Any]] = {}
        repos = {store: ctx.root / f"feast-{store}" for store in ("sqlite", "redis")}

        def materialize(store: str, rep: int) -> dict[str, Any]:
            if store == "redis":  # a fresh repo each round, the keys flushed: Redis keeps no file
                repos["redis"] = ctx.root / f"feast-redis-{rep}"
                r.flushdb()  # Feast overwrites keys by entity: start each round empty
            return feast_worker(
                python, "materialize", "--repo", str(repos[store]), "--parquet", str(parquet), "--store", store,
                "--redis", feast_redis,
            )  # fmt: skip

        # Both tools first write into fresh files once, unmeasured by the rounds (reported on
        # a row of its own), so the rounds time the steady state of a daily job, each file at
        # its size (bench.common.settle): Feast's SQLite file holds the rows it replaces, as
        # Bulldozer's store holds the pages its dropped versions freed. (Measured apart, 3
        # rounds each, alternating: Feast → SQLite into its reused repo 12,042 rows/s, into a
        # fresh one 10,062; → Redis 12,609 reused, 12,983 fresh, so Redis's repos stay fresh.)
        got = materialize("sqlite", 0)
        loads.setdefault("feast-sqlite", {})["first_rows_per_s"] = got["rows"] / got["wall_seconds"]
        settled = settle(lambda: bulldozer_run(home, spec)[2], home)
        loads.setdefault("bulldozer-embedded", {})["settle"] = settled
        loads["bulldozer-embedded"]["first_rows_per_s"] = s.feast_rows / settled[0]["seconds"]
        ctx.say(
            f"  first runs into fresh stores: Feast → sqlite {loads['feast-sqlite']['first_rows_per_s']:,.0f} rows/s, "
            f"bulldozer → embedded {loads['bulldozer-embedded']['first_rows_per_s']:,.0f} rows/s; "
            f"the embedded store settled after {len(settled)} runs"
        )
        # Feast's and Bulldozer's rounds alternate, so a slow spell of the machine hits both
        for rep in range(s.repeat):
            for store, kind in (("sqlite", "embedded"), ("redis", "redis")):
                got = materialize(store, rep)
                rate = got["rows"] / got["wall_seconds"]
                entry = loads.setdefault(f"feast-{store}", {})
                entry.setdefault("rows_per_s", []).append(rate)
                entry.setdefault("work_rows_per_s", []).append(got["rows"] / got["seconds"])
                entry.setdefault("peak_rss_kib", []).append(got["peak_rss_kib"])
                ctx.say(
                    f"  feast materialize → {store}, round {rep + 1}: {rate:,.0f} rows/s, {mib(got['peak_rss_kib'])}"
                )
                grew = 0
                with engine_dal(kind, redis_port, store_prefix) as dal:
                    (rate, rss, run), grown = measured_growth(lambda: bulldozer_run(home, spec, dal), home)
                    grew += grown
                    with warm_loader(home) as loader:
                        (warm_rate, _, _), grown = measured_growth(
                            lambda: bulldozer_run(home, spec, dal, warm=True), home
                        )
                        grew += grown
                        loader_kib = loader.rss_kib()
                ours = loads.setdefault(f"bulldozer-{kind}", {})
                if kind == "embedded":
                    ours.setdefault("store_grew_bytes", []).append(grew)
                ours.setdefault("rows_per_s", []).append(rate)
                ours.setdefault("major_faults", []).append(run.major_faults)
                ours.setdefault("peak_rss_kib", []).append(rss)
                ours.setdefault("load_stage_rows_per_s", []).append(run.output["rows"] / run.output["timings"]["load"])
                ours.setdefault("work_rows_per_s", []).append(run.output["rows"] / sum(run.output["timings"].values()))
                ours.setdefault("warm_rows_per_s", []).append(warm_rate)
                ours.setdefault("loader_rss_kib", []).append(loader_kib)
                ctx.say(
                    f"  bulldozer run → {kind}, round {rep + 1}: {rate:,.0f} rows/s, {mib(rss)}; "
                    f"through the warm loader {warm_rate:,.0f} rows/s"
                )
        ctx.raw["feast_loads"] = loads
        if do_loads:
            for feast_store, kind in (("sqlite", "embedded"), ("redis", "redis")):
                b, f = loads[f"bulldozer-{kind}"], loads[f"feast-{feast_store}"]
                ratio = med(b["rows_per_s"]) / med(f["rows_per_s"])
                where = "Redis" if kind == "redis" else "embedded / SQLite"
                settled_text = ""
                if kind == "embedded":
                    settled_text = (
                        f"; both stores written once before the rounds, the embedded store's file "
                        f"grown to its size in {len(b['settle'])} runs"
                        + grew_after_settling(b["settle"], sum(b["store_grew_bytes"]))
                    )
                ctx.rows.append(
                    Row(
                        "1 vs Feast",
                        f"rows/s → {where}, whole command (process start to exit){settled_text}"
                        + read_back(b, "major_faults"),
                        f"{med(b['rows_per_s']):,.0f}",
                        f"Feast materialize → {feast_store}: {med(f['rows_per_s']):,.0f}",
                        f"{ratio:.1f}×",
                        "≥ 50×",
                        verdict(ratio, 50),
                    )
                )
                if kind == "embedded":
                    first = b["first_rows_per_s"] / f["first_rows_per_s"]
                    ctx.rows.append(
                        Row(
                            "1 vs Feast",
                            f"rows/s → {where}, whole command, the first run into a fresh store (once)",
                            f"{b['first_rows_per_s']:,.0f}",
                            f"Feast's first materialize into a new repo: {f['first_rows_per_s']:,.0f}",
                            f"{first:.1f}×",
                        )
                    )
                warm = med(b["warm_rows_per_s"]) / med(f["rows_per_s"])
                ctx.rows.append(
                    Row(
                        "1 vs Feast",
                        f"rows/s → {where}, whole command handed to a running warm loader (`bulldozer loader "
                        f"start`; loader + its DAL resident: {mib(med(b['loader_rss_kib']))})",
                        f"{med(b['warm_rows_per_s']):,.0f}",
                        f"Feast materialize → {feast_store}: {med(f['rows_per_s']):,.0f}",
                        f"{warm:.1f}×",
                        "≥ 50×",
                        verdict(warm, 50),
                    )
                )
                work = med(b["work_rows_per_s"]) / med(f["work_rows_per_s"])
                ctx.rows.append(
                    Row(
                        "1 vs Feast",
                        f"rows/s → {where}, the work only (Bulldozer: all run stages; Feast: materialize())",
                        f"{med(b['work_rows_per_s']):,.0f}",
                        f"Feast: {med(f['work_rows_per_s']):,.0f}",
                        f"{work:.1f}×",
                        "≥ 50×",
                        verdict(work, 50),
                    )
                )
                rss_ratio = med(b["peak_rss_kib"]) / med(f["peak_rss_kib"])
                ctx.rows.append(
                    Row(
                        "1 vs Feast",
                        f"peak RSS, → {kind} (Bulldozer: runner + DAL)",
                        mib(med(b["peak_rss_kib"])),
                        f"Feast → {feast_store}: {mib(med(f['peak_rss_kib']))}",
                        f"{rss_ratio:.2f}",
                        "≤ 0.10",
                        verdict(rss_ratio, 0.10, higher_is_better=False),
                    )
                )
        if do_reads:
            reads_section(ctx, python, parquet, repos, feast_redis, home, redis_port, store_prefix)


def bulldozer_reads(dal: Dal, alias: str, max_id: int, calls: int, warmup: int = 20) -> tuple[list[float], int]:
    """Latencies of ``batch_get`` of 100 random keys through ``dal``, values decoded with the
    version's own message classes (what a consumer's client does)."""
    from bulldozer.kv import KvClient
    from bulldozer.schema.compile import load_message_classes

    rng = random.Random(7)
    with KvClient(dal.endpoint, timeout=30) as client:
        version = client.describe(client.get_alias(alias).namespace)
        key_cls, value_cls = load_message_classes(
            version.value_descriptor_set, version.key_message, version.value_message
        )
        latencies, found = [], 0
        for i in range(calls + warmup):
            keys = [key_cls(user_id=rng.randrange(max_id)).SerializeToString() for _ in range(100)]
            started = time.perf_counter()
            _, values = client.batch_get(keys, alias=alias)
            decoded = [value_cls.FromString(v) for v in values if v is not None]
            elapsed = time.perf_counter() - started
            if i >= warmup:
                latencies.append(elapsed)
                found += len(decoded)
    return latencies, found


def reads_section(
    ctx: Context,
    python: Path,
    parquet: Path,
    repos: dict[str, Path],
    feast_redis: str,
    home: Path,
    redis_port: int,
    store_prefix: str,
) -> None:
    s = ctx.sizes
    reads: dict[str, dict[str, Any]] = {}
    for store in ("sqlite", "redis"):
        ctx.say(f"reads: feast get_online_features ← {store}")
        got = feast_worker(
            python, "read", "--repo", str(repos[store]), "--parquet", str(parquet), "--store", store,
            "--redis", feast_redis, "--keys", "100", "--calls", str(s.read_calls), "--max-id", str(s.feast_rows),
        )  # fmt: skip
        reads[f"feast-{store}"] = {"latencies": got["latencies"], "found": got["found"]}
    for kind in ("embedded", "redis"):
        ctx.say(f"reads: bulldozer batch_get ← {kind}")
        store = str(home / "kv") if kind == "embedded" else store_prefix
        with dal_server(serve_args(kind, redis_port, store)) as dal:
            latencies, found = bulldozer_reads(dal, "user_features", s.feast_rows, s.read_calls)
        reads[f"bulldozer-{kind}"] = {"latencies": latencies, "found": found}
    ctx.raw["reads"] = reads
    for feast_store, kind in (("sqlite", "embedded"), ("redis", "redis")):
        b, f = reads[f"bulldozer-{kind}"]["latencies"], reads[f"feast-{feast_store}"]["latencies"]
        where = "embedded / SQLite" if kind == "embedded" else "Redis"
        ctx.rows.append(
            Row(
                "2 reads",
                f"100-key lookups/s ← {where}",
                f"{len(b) / sum(b):,.0f}",
                f"Feast: {len(f) / sum(f):,.0f}",
                f"{(len(b) / sum(b)) / (len(f) / sum(f)):.1f}×",
            )
        )
        for p in (50, 99):
            ctx.rows.append(
                Row(
                    "2 reads",
                    f"p{p} ms ← {where}",
                    f"{percentile_ms(b, p):.2f}",
                    f"Feast: {percentile_ms(f, p):.2f}",
                    f"{percentile_ms(b, p) / percentile_ms(f, p):.2f}",
                    "below Feast's" if p == 99 else "",
                    percentile_ms(b, p) < percentile_ms(f, p) if p == 99 else None,
                )
            )


# ---------------------------------------------------------------- 3: against the limits


def limits_section(ctx: Context) -> None:
    s = ctx.sizes
    home = ctx.root / "limits-home"
    ctx.say(f"limits: building the feature table ({s.limit_rows:,} rows)")
    feature_table.build(home, s.limit_rows, ctx.root / "limits.parquet")
    spec = feature_table.write_spec(ctx.root / "limits.yaml")
    batches = encoded_batches(home, spec)
    limits: dict[str, dict[str, list[float]]] = {}
    for kind in ("embedded", "redis", "cassandra"):
        with ctx.engine(kind) as port:
            store = fresh_store_name()
            for rep in range(s.repeat):
                entry = limits.setdefault(kind, {})
                raw_rate = s.limit_rows / raw_write(kind, port, batches, f"r{rep}_{store}")
                if kind == "embedded":
                    sorted_rate = s.limit_rows / raw_lmdb_sorted_append(batches)
                    entry.setdefault("raw_sorted_append_rows_per_s", []).append(sorted_rate)
                with engine_dal(kind, port, store) as dal:
                    rate, _, run = bulldozer_run(home, spec, dal)
                entry.setdefault("raw_rows_per_s", []).append(raw_rate)
                entry.setdefault("end_to_end_rows_per_s", []).append(rate)
                entry.setdefault("load_stage_rows_per_s", []).append(run.output["rows"] / run.output["timings"]["load"])
                ctx.say(f"  {kind} round {rep + 1}: raw {raw_rate:,.0f}/s, bulldozer run {rate:,.0f}/s")
        e = limits[kind]
        ratio = med(e["end_to_end_rows_per_s"]) / med(e["raw_rows_per_s"])
        raw_mode = {
            "embedded": "LMDB puts in the job's batches",
            "redis": "pipelined MSET",
            "cassandra": "unlogged batches",
        }[kind]
        ctx.rows.append(
            Row(
                "3 limits",
                f"{kind}: end-to-end rows/s, flat table {s.limit_rows:,} rows (load stage {med(e['load_stage_rows_per_s']):,.0f})",
                f"{med(e['end_to_end_rows_per_s']):,.0f}",
                f"raw {raw_mode}: {med(e['raw_rows_per_s']):,.0f}",
                f"{ratio:.2f}",
                "≥ 0.5",
                verdict(ratio, 0.5),
            )
        )
        if kind == "embedded":
            ceiling = med(e["end_to_end_rows_per_s"]) / med(e["raw_sorted_append_rows_per_s"])
            ctx.rows.append(
                Row(
                    "3 limits",
                    "embedded: the same run against LMDB's fastest write (no target: the engine's ceiling)",
                    f"{med(e['end_to_end_rows_per_s']):,.0f}",
                    f"raw LMDB sorted (sort counted) + appended in one transaction: "
                    f"{med(e['raw_sorted_append_rows_per_s']):,.0f}",
                    f"{ceiling:.2f}",
                )
            )
    del batches
    ctx.raw["limits"] = limits
    nested_limits(ctx)
    cold_start(ctx)


def nested_limits(ctx: Context) -> None:
    """The nested sample table (repeated messages, maps, decimals): end to end against raw
    LMDB puts of the same records."""
    from bulldozer.warehouse.sample import create_sample_warehouse

    s = ctx.sizes
    home = ctx.root / "limits-nested-home"
    ctx.say(f"limits: building the nested sample table ({s.spark_rows:,} rows)")
    create_sample_warehouse(home, rows=s.spark_rows)
    batches = encoded_batches(home, SAMPLE_SPEC)
    nested: dict[str, list[float]] = {}
    for rep in range(s.repeat):
        raw = s.spark_rows / raw_write("embedded", 0, batches, "")
        rate, _, run = bulldozer_run(home, SAMPLE_SPEC)
        nested.setdefault("raw_rows_per_s", []).append(raw)
        nested.setdefault("end_to_end_rows_per_s", []).append(rate)
        nested.setdefault("load_stage_rows_per_s", []).append(s.spark_rows / run.output["timings"]["load"])
        ctx.say(f"  nested round {rep + 1}: raw {raw:,.0f}/s, bulldozer run {rate:,.0f}/s")
    ratio = med(nested["end_to_end_rows_per_s"]) / med(nested["raw_rows_per_s"])
    ctx.rows.append(
        Row(
            "3 limits",
            f"embedded: end-to-end rows/s, nested sample table {s.spark_rows:,} rows "
            f"(load stage {med(nested['load_stage_rows_per_s']):,.0f})",
            f"{med(nested['end_to_end_rows_per_s']):,.0f}",
            f"raw LMDB puts in the job's batches: {med(nested['raw_rows_per_s']):,.0f}",
            f"{ratio:.2f}",
            "≥ 0.5",
            verdict(ratio, 0.5),
        )
    )
    ctx.raw["limits_nested"] = nested


def cold_start(ctx: Context) -> None:
    """A first run on a fresh machine against the warm run after it: a new store (the
    bytecode as the install compiled it: pip and scripts/bootstrap.sh compile it), and the
    worst case, an empty bytecode cache (every module compiled from source by the run)."""
    from bulldozer.warehouse.sample import create_sample_warehouse

    s = ctx.sizes
    rows = 2_000 if s.repeat == 1 and s.limit_rows < 100_000 else 100_000
    first, empty, warm = [], [], []
    for rep in range(s.repeat):
        home = ctx.root / f"cold-{rep}"
        create_sample_warehouse(home, rows=rows)
        run = ["run", str(SAMPLE_SPEC), "--json", "-q"]
        first.append(run_cli(run, home, {"BULLDOZER_ENDPOINT": "embedded"}).seconds)
        # an empty bytecode cache that the run fills (PYTHONDONTWRITEBYTECODE, set on these
        # machines, would make every run compile every module)
        cache = {"PYTHONPYCACHEPREFIX": str(ctx.root / f"cold-pycache-{rep}"), "PYTHONDONTWRITEBYTECODE": ""}
        empty.append(run_cli(run, home, {"BULLDOZER_ENDPOINT": "embedded", **cache}).seconds)
        warm.append(run_cli(run, home, {"BULLDOZER_ENDPOINT": "embedded", **cache}).seconds)
        ctx.say(
            f"  cold start round {rep + 1}: first run {first[-1]:.2f} s, with an empty bytecode cache "
            f"{empty[-1]:.2f} s, warm run {warm[-1]:.2f} s"
        )
    for label, cold in (
        ("first run on a fresh machine (new store, bytecode as installed)", first),
        ("first run with an empty bytecode cache (every module compiled by the run)", empty),
    ):
        ratio = med(cold) / med(warm)
        ctx.rows.append(
            Row(
                "3 limits",
                f"{label} vs a warm run, {rows:,} nested rows, s",
                f"{med(cold):.2f} vs {med(warm):.2f}",
                "",
                f"{ratio:.2f}",
                "≤ 2",
                verdict(ratio, 2, higher_is_better=False),
            )
        )
    ctx.raw["cold_start"] = {"rows": rows, "first_seconds": first, "empty_cache_seconds": empty, "warm_seconds": warm}


# ---------------------------------------------------------------- 4: engines and scaling


def engines_section(ctx: Context) -> None:
    from bulldozer.warehouse.sample import create_sample_warehouse

    s = ctx.sizes
    engines: dict[str, Any] = {}
    home = ctx.root / "engines-home"
    ctx.say(f"engines: building the nested sample table ({s.spark_rows:,} rows)")
    create_sample_warehouse(home, rows=s.spark_rows)
    # every engine writes into a store at its size, as a daily job's does (bench.common.
    # steady_spec; the README's section 4 says what the file's growth cost a Spark run)
    spec = steady_spec(SAMPLE_SPEC, ctx.root / "engines.yaml")
    engines["settle"] = settle(lambda: bulldozer_run(home, spec)[2], home)
    ctx.say(f"  the store settled after {len(engines['settle'])} local runs")
    try:
        import pyspark

        ctx.raw["versions"]["pyspark"] = pyspark.__version__
    except ImportError:
        pyspark = None
        ctx.say("  pyspark is not installed (bulldozer[spark]): no Spark rows")
    with contextlib.ExitStack() as stack:
        # the Spark rounds: local[2] in the command's own JVM, and a standalone cluster on
        # loopback (scripts/services/spark.sh: one worker, 2 cores) whose executors run the
        # environment `bulldozer spark package` built
        spark_runs: dict[str, tuple[list[str], dict[str, str]]] = {}
        if pyspark is not None:
            spark_runs["spark_local"] = (["--master", "local[2]"], {})
        if pyspark is not None and s.spark_cluster:
            port = stack.enter_context(engine_server("spark"))
            archive = ctx.root / "bulldozer-spark-env.zip"
            # deflated, as packed by default: each application's executors copy the zip, and
            # the node unpacks it once (side by side on warm nodes: 13.0 s against 14.8 s stored)
            run_cli(["spark", "package", "--json", "-o", str(archive)], home)
            spark_runs["spark_cluster"] = (
                ["--master", f"spark://127.0.0.1:{port}"],
                {"BULLDOZER_SPARK_ARCHIVE": str(archive)},
            )
            # the rounds time a node in its steady state, as a daily job's cluster is: the new
            # cluster's first application runs before them, timed apart (its node unpacks the
            # environment and pyspark, and makes the executors' class-data archive once the
            # application ended: bulldozer.load.engines.spark.executor_archive)
            flags, env = spark_runs["spark_cluster"]
            cold = run_cli(["run", str(spec), "--engine", "spark", *flags, "--json", "-q"], home, env)
            engines["spark_cluster_first_s"] = cold.seconds
            engines["spark_cluster_node_s"] = node_builds_done()
            ctx.say(
                f"  spark_cluster, the new cluster's first application: {cold.seconds:.1f} s; its node's builds "
                f"done {engines['spark_cluster_node_s']:.1f} s after it"
            )
        grew = 0
        for rep in range(s.repeat):  # interleaved: each round runs every engine once
            local, grown = measured_growth(lambda: bulldozer_run(home, spec), home)
            grew += grown
            engines.setdefault("local_rows_per_s", []).append(local[0])
            engines.setdefault("local_peak_rss_kib", []).append(local[2].rss_kib)
            engines.setdefault("local_load_stage_rows_per_s", []).append(
                s.spark_rows / local[2].output["timings"]["load"]
            )
            ctx.say(f"  local round {rep + 1}: {local[0]:,.0f} rows/s")
            for name, (flags, env) in spark_runs.items():
                command = ["run", str(spec), "--engine", "spark", *flags, "--json", "-q"]
                run, grown = measured_growth(functools.partial(run_cli, command, home, env), home)
                grew += grown
                engines.setdefault(f"{name}_rows_per_s", []).append(s.spark_rows / run.seconds)
                engines.setdefault(f"{name}_load_stage_rows_per_s", []).append(
                    s.spark_rows / run.output["timings"]["load"]
                )
                engines.setdefault(f"{name}_write_rows_per_s", []).append(  # the load stage without Spark's start
                    s.spark_rows / (run.output["timings"]["load"] - run.output["engine_start"])
                )
                engines.setdefault(f"{name}_peak_rss_kib", []).append(run.rss_kib + run.child_rss_kib)
                ctx.say(f"  {name} round {rep + 1}: {s.spark_rows / run.seconds:,.0f} rows/s")
        engines["store_grew_bytes"] = grew
    local_rate = med(engines["local_rows_per_s"])
    at_size = (
        "; every engine writes into a store at its size (the template's spec dropping each version as it "
        f"retires: grown in {len(engines['settle'])} local runs before the rounds"
        + grew_after_settling(engines["settle"], engines["store_grew_bytes"])
        + ")"
    )
    local_load = med(engines["local_load_stage_rows_per_s"])
    for name, label in (("spark_local", "Spark local[2]"), ("spark_cluster", "Spark standalone, 1 worker × 2 cores")):
        if f"{name}_rows_per_s" not in engines:
            continue
        rate, load = med(engines[f"{name}_rows_per_s"]), med(engines[f"{name}_load_stage_rows_per_s"])
        write = med(engines[f"{name}_write_rows_per_s"])
        ctx.rows.append(
            Row(
                "4 engines",
                f"load stage rows/s without Spark's start-up (the run record's engine_start taken out), nested "
                f"sample {s.spark_rows:,} rows: local vs {label}",
                f"{label} {write:,.0f}",
                f"local {local_load:,.0f}",
                f"{local_load / write:.2f}× slower",
                "≤ 1.5×",
                verdict(local_load / write, 1.5, higher_is_better=False),
            )
        )
        ctx.rows.append(
            Row(
                "4 engines",
                f"load stage rows/s with Spark's start-up inside it, nested sample {s.spark_rows:,} rows: "
                f"local vs {label}",
                f"{label} {load:,.0f}",
                f"local {local_load:,.0f}",
                f"{local_load / load:.2f}× slower",
            )
        )
        after_first = ""
        if name == "spark_cluster":
            after_first = (
                f"; the rounds after the new cluster's first application (its cold node: "
                f"{engines['spark_cluster_first_s']:.1f} s)"
            )
        ctx.rows.append(
            Row(
                "4 engines",
                f"whole command rows/s (JVM start-up included), nested sample {s.spark_rows:,} rows: local vs {label}"
                + at_size
                + after_first,
                f"{label} {rate:,.0f}, {mib(med(engines[f'{name}_peak_rss_kib']))} (driver + JVM)",
                f"local {local_rate:,.0f}, {mib(med(engines['local_peak_rss_kib']))}",
                f"{local_rate / rate:.2f}× slower",
                "≤ 2×",
                verdict(local_rate / rate, 2.0, higher_is_better=False),
            )
        )
    if pyspark is not None and s.spark_one_file_rows:
        spark_one_file(ctx, engines)
    scaling: dict[str, Any] = {}
    for n in s.scale_rows:
        ctx.say(f"engines: scaling, {n:,} rows")
        home = ctx.root / f"scale-{n}"  # its own store: the row-count gate compares with the live version
        create_sample_warehouse(home, rows=n)
        repeat = s.repeat if n <= 1_000_000 else 1
        for _ in range(repeat):
            rate, _, run = bulldozer_run(home, SAMPLE_SPEC)
            entry = scaling.setdefault(str(n), {})
            entry.setdefault("seconds", []).append(run.seconds)
            entry.setdefault("rows_per_s", []).append(rate)
            entry.setdefault("runner_peak_rss_kib", []).append(run.rss_kib)
            entry.setdefault("dal_peak_rss_kib", []).append(run.child_rss_kib)
            entry.setdefault("dal_peak_anon_kib", []).append(run.child_anon_kib)
            entry.setdefault("runner_peak_anon_kib", []).append(run.anon_kib)
        e = scaling[str(n)]
        anon = med(e["runner_peak_anon_kib"]) + med(e["dal_peak_anon_kib"])
        ctx.rows.append(
            Row(
                "4 engines",
                f"local, {n:,} nested rows: seconds · rows/s · runner anonymous · its peak RSS · DAL anonymous · "
                "DAL RSS with the store's mapped pages",
                f"{med(e['seconds']):,.1f} s · {med(e['rows_per_s']):,.0f} · {mib(med(e['runner_peak_anon_kib']))} "
                f"· {mib(med(e['runner_peak_rss_kib']))} · {mib(med(e['dal_peak_anon_kib']))} "
                f"· {mib(med(e['dal_peak_rss_kib']))}",
                f"{repeat} run(s)",
                f"{anon / 1024**2:.2f} GiB",
                "runner + DAL anonymous < 1 GiB",
                anon < 1024**2,
            )
        )
    engines["scaling"] = scaling
    ctx.raw["engines"] = engines


def node_builds_done(most: float = 180.0) -> float:
    """Wait until no executor node builds its class-data archive any more (``executor_archive.
    BUILD``, started by an executor's Python daemon, dumping once its JVM exited), ``most``
    seconds at most; the seconds waited."""
    from bulldozer.load.engines.spark.executor_archive import BUILD

    started = time.monotonic()
    while time.monotonic() - started < most:
        building = False
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            building = building or BUILD.encode() in args
        if not building:
            break
        time.sleep(0.5)
    return time.monotonic() - started


def spark_one_file(ctx: Context, engines: dict[str, Any]) -> None:
    """Spark ``local[2]`` on the nested sample table in one data file: the default (fewer
    files than cores: one task reads the file in place, ``spark.in_place_is_faster``) against
    Spark's read by key over both cores (``write.partitions: 2``), rounds interleaved."""
    from bulldozer.warehouse.sample import create_sample_warehouse

    s = ctx.sizes
    rows = s.spark_one_file_rows
    home = ctx.root / "one-file-home"
    ctx.say(f"engines: the nested sample table in one file ({rows:,} rows)")
    table = create_sample_warehouse(home, rows=rows, chunk_rows=rows)
    size = int(table.current_snapshot().summary.get("total-files-size", "0"))
    by_key = ctx.root / "by-key.yaml"
    by_key.write_text(
        SAMPLE_SPEC.read_text().replace("    in_flight_batches: 4 ", "    partitions: 2\n    in_flight_batches: 4 ")
    )
    one: dict[str, list[float]] = {}
    for rep in range(s.repeat):
        for name, spec in (("in_place", SAMPLE_SPEC), ("by_key", by_key)):
            run = run_cli(["run", str(spec), "--engine", "spark", "--master", "local[2]", "--json", "-q"], home)
            one.setdefault(f"{name}_s", []).append(run.seconds)
            one.setdefault(f"{name}_digest", []).append(run.output["digest"])
            ctx.say(f"  one file, {name.replace('_', ' ')}, round {rep + 1}: {run.seconds:.1f} s")
    engines["one_file"] = one
    in_place, keyed = med(one["in_place_s"]), med(one["by_key_s"])
    same = len(set(one["in_place_digest"] + one["by_key_digest"])) == 1
    ctx.rows.append(
        Row(
            "4 engines",
            f"Spark local[2], the nested sample in one file ({rows:,} rows, {size / 1024**2:,.0f} MiB), whole command s: "
            f"the default (one task reads the file in place) vs by key over both cores (write.partitions: 2); "
            f"digests equal: {same}",
            f"in place {in_place:.1f}",
            f"by key {keyed:.1f}",
            f"{keyed / in_place:.2f}× slower by key",
            "> 1×",
            keyed > in_place and same,
        )
    )


# ---------------------------------------------------------------- 5: flip and rollback


def flip_section(ctx: Context) -> None:
    from bench.kv import make_records
    from bulldozer.codec.digest import digest_arrays
    from bulldozer.kv import KvClient
    from bulldozer.names import new_version_name
    from bulldozer.versioning.rollback import rollback

    s = ctx.sizes
    flips: dict[str, Any] = {}
    rounds = 20 if s.repeat > 1 else 5
    store = serve_args("embedded", 0, str(ctx.root / "flip-store"))
    with dal_server(store) as dal, KvClient(dal.endpoint, timeout=300) as client:
        for size in s.flip_sizes:
            ctx.say(f"flip: two versions of {size:,} records")
            keys, values, _ = make_records(size)
            alias = f"flip_{size}"
            names = []
            for _ in range(2):
                name = new_version_name(alias)
                client.create_namespace(name, alias)
                with client.writer(name, batch_records=2000, in_flight=4) as writer:
                    writer.add_arrays(keys, values)
                expected = digest_arrays(keys, values)
                client.seal(name, expected.count, expected.value)
                names.append(name)
            client.compare_and_set_alias(alias, None, names[0])
            flip_t, back_t = [], []
            for _ in range(rounds):
                started = time.perf_counter()
                client.compare_and_set_alias(alias, names[0], names[1], reason="bench flip")
                flip_t.append(time.perf_counter() - started)
                started = time.perf_counter()
                rollback(client, alias, reason="bench rollback")
                back_t.append(time.perf_counter() - started)
            cli = []
            for _ in range(min(3, s.repeat)):
                current = client.get_alias(alias).namespace
                target = names[1] if current == names[0] else names[0]
                args = ["rollback", alias, "--to", target, "--yes", "--json", "--endpoint", dal.endpoint]
                cli.append(run_cli(args, ctx.root).seconds)
            flips[str(size)] = {"flip": flip_t, "rollback": back_t, "rollback_command": cli}
    ctx.raw["flip"] = flips
    small, big = (flips[str(n)] for n in (min(s.flip_sizes), max(s.flip_sizes)))
    for what, label in (("flip", "alias flip (compare-and-set)"), ("rollback", "rollback (find previous + CAS)")):
        a, b = med(small[what]) * 1000, med(big[what]) * 1000
        ctx.rows.append(
            Row(
                "5 flip",
                f"{label} ms, {min(s.flip_sizes):,} vs {max(s.flip_sizes):,}-record version (p99 {percentile_ms(big[what], 99):.2f})",
                f"{a:.2f} vs {b:.2f}",
                "",
                f"{b / a:.2f} (big / small)",
                "independent of size",
            )
        )
    ctx.rows.append(
        Row(
            "5 flip",
            f"`bulldozer rollback --yes` command, s (process start included), {max(s.flip_sizes):,}-record version",
            f"{med(big['rollback_command']):.2f}",
        )
    )


# ---------------------------------------------------------------- 6: delta versions


def settled_note(entry: dict[str, Any]) -> str:
    """What the delta section's full-run cell says of the embedded store's file: settled to
    its size before the rounds (``bench.common.settle``), and how much it still grew."""
    if "settle" not in entry:
        return ""
    grown = grew_after_settling(entry["settle"], sum(entry["full_store_grew_bytes"]))
    return f" (the store's file grown to its size by {len(entry['settle'])} full runs before the rounds{grown})"


def delta_section(ctx: Context) -> None:
    s = ctx.sizes
    deltas: dict[str, Any] = {}
    for kind, rows in (("embedded", s.delta_rows), ("redis", s.delta_remote_rows), ("cassandra", s.delta_remote_rows)):
        home = ctx.root / f"delta-{kind}"
        ctx.say(f"delta: {kind}, a {rows:,}-row table in {s.delta_files} files")
        feature_table.build_files(home, rows, s.delta_files)
        delta_spec = feature_table.write_spec(ctx.root / f"delta-{kind}.yaml", "features_delta", "delta")
        full_spec = feature_table.write_spec(ctx.root / f"full-{kind}.yaml", "features_full", "full")
        entry: dict[str, Any] = deltas.setdefault(kind, {"rows": rows})
        with (
            ctx.engine(kind) as port,
            engine_dal(kind, port, fresh_store_name()) as dal,
        ):
            env = {"BULLDOZER_ENDPOINT": dal.endpoint if dal else "embedded"}
            first = run_cli(["run", str(delta_spec), "--json", "-q"], home, env)
            entry.setdefault("first_full_s", []).append(first.seconds)
            run_full = functools.partial(run_cli, ["run", str(full_spec), "--json", "-q"], home, env)
            if kind == "embedded":  # the full runs measured write into pages the store's file holds
                entry["settle"] = settle(run_full, home)
            for rep in range(s.repeat):
                changed = feature_table.change_one_file(home, rows, s.delta_files, rep, seed=rep)
                delta = run_cli(["run", str(delta_spec), "--json", "-q"], home, env)
                full, grew = measured_growth(run_full, home)
                entry.setdefault("full_store_grew_bytes", []).append(grew)
                entry.setdefault("delta_major_faults", []).append(delta.major_faults)
                entry.setdefault("full_major_faults", []).append(full.major_faults)
                d, f = delta.output, full.output
                if d["mode"] != "delta":
                    raise RuntimeError(f"the delta run wrote a full version: {d['full_reason']}")
                same = (d["rows"], d["digest"]) == (f["rows"], f["digest"])
                entry.setdefault("changed", []).append(changed)
                entry.setdefault("delta_s", []).append(delta.seconds)
                entry.setdefault("full_s", []).append(full.seconds)
                entry.setdefault("delta_timings", []).append(d["timings"])
                entry.setdefault("digests_equal", []).append(same)
                ctx.say(
                    f"  {kind} round {rep + 1}: delta {delta.seconds:.1f} s "
                    f"(create {d['timings'].get('create', 0):.1f}, load {d['timings'].get('load', 0):.1f}, "
                    f"verify {d['timings'].get('verify', 0):.1f}), full {full.seconds:.1f} s, digests equal: {same}"
                )
            # the floor: a delta with nothing to write (start-up, the snapshots' plan, create, seal, flip)
            entry["unchanged_delta_s"] = [
                run_cli(["run", str(delta_spec), "--json", "-q"], home, env).seconds for _ in range(s.repeat)
            ]
        if kind == "embedded":  # through a warm loader: no process start-up, imports or DAL start
            with warm_loader(home) as loader:
                for rep in range(s.repeat):
                    feature_table.change_one_file(home, rows, s.delta_files, s.repeat + rep, seed=s.repeat + rep)
                    delta = loader.run(["run", str(delta_spec), "--json", "-q"], home)
                    full = loader.run(["run", str(full_spec), "--json", "-q"], home)
                    entry.setdefault("warm_delta_s", []).append(delta.seconds)
                    entry.setdefault("warm_delta_timings", []).append(delta.output["timings"])
                    entry.setdefault("warm_full_s", []).append(full.seconds)
                    entry.setdefault("warm_delta_major_faults", []).append(delta.major_faults)
                    entry.setdefault("warm_full_major_faults", []).append(full.major_faults)
                    ctx.say(f"  {kind} warm round {rep + 1}: delta {delta.seconds:.2f} s, full {full.seconds:.2f} s")
            # a daily job's steady state: the chain has reached its depth limit, so each delta
            # merges layers into its version as they stack (its create stage)
            for step in range(s.delta_steady):
                which = 2 * s.repeat + step
                feature_table.change_one_file(home, rows, s.delta_files, which % s.delta_files, seed=which)
                delta = run_cli(["run", str(delta_spec), "--json", "-q"], home)
                entry.setdefault("steady_s", []).append(delta.seconds)
                entry.setdefault("steady_major_faults", []).append(delta.major_faults)
                entry.setdefault("steady_create_s", []).append(delta.output["timings"].get("create", 0.0))
                ctx.say(
                    f"  {kind} steady delta {step + 1}: {delta.seconds:.2f} s "
                    f"(create {entry['steady_create_s'][-1]:.2f})"
                )
            entry.update(read_back_layers(home, "features_delta", s.repeat))
            ctx.say(
                f"  {kind} verify of the layered version: {med(entry['verify_s']):.2f} s "
                f"(the raw walk {med(entry['raw_walk_s']):.2f} s)"
            )
            # a whole cycle of the chain: warm deltas until one compacts it flat (the DAL logs it)
            with warm_loader(home) as loader:
                for step in range(s.delta_cycle):
                    which = 2 * s.repeat + s.delta_steady + step
                    feature_table.change_one_file(home, rows, s.delta_files, which % s.delta_files, seed=which)
                    before = compactions(home)
                    delta = loader.run(["run", str(delta_spec), "--json", "-q"], home)
                    entry.setdefault("cycle_s", []).append(delta.seconds)
                    entry.setdefault("cycle_timings", []).append(delta.output["timings"])
                    entry.setdefault("cycle_major_faults", []).append(delta.major_faults)
                    if compactions(home) > before:
                        entry["compacted_at"] = step + 1
                        ctx.say(f"  {kind} cycle delta {step + 1}: {delta.seconds:.2f} s, the chain compacted flat")
                        break
            ctx.say(f"  {kind} cycle: {len(entry['cycle_s'])} warm deltas, mean {mean(entry['cycle_s']):.2f} s")
        ratio = med(entry["delta_s"]) / med(entry["full_s"])
        changed_rows = sum(entry["changed"][0].values())
        create = med([t.get("create", 0.0) for t in entry["delta_timings"]])
        ctx.rows.append(
            Row(
                "6 delta",
                f"{kind}: delta run s after a snapshot changing {changed_rows:,} of {rows:,} rows "
                f"(its create stage, the base copied or layered: {create:.1f} s); digests equal: {all(entry['digests_equal'])}"
                + (read_back(entry, "delta_major_faults", "full_major_faults") if kind == "embedded" else ""),
                f"{med(entry['delta_s']):.1f}",
                f"full run of the same snapshot: {med(entry['full_s']):.1f} s{settled_note(entry)}",
                f"{ratio:.3f}",
                "≤ 0.05" if kind == "embedded" else "",
                verdict(ratio, 0.05, higher_is_better=False) and all(entry["digests_equal"])
                if kind == "embedded"
                else None,
            )
        )
        ctx.rows.append(
            Row(
                "6 delta",
                f"{kind}: a delta run with nothing to write, s (the floor: start-up, plan, create, seal, flip)",
                f"{med(entry['unchanged_delta_s']):.2f}",
            )
        )
        if entry.get("steady_s"):
            steady, creates = entry["steady_s"], entry["steady_create_s"]
            ctx.rows.append(
                Row(
                    "6 delta",
                    f"{kind}: {len(steady)} more one-shot deltas in a row, the chain at its depth limit (layers "
                    f"merged as they stack: create median {med(creates):.2f} s, max {max(creates):.2f} s), "
                    f"median s (max {max(steady):.2f}){read_back(entry, 'steady_major_faults')}",
                    f"{med(steady):.2f}",
                    f"full run of a snapshot: {med(entry['full_s']):.1f} s",
                    f"{med(steady) / med(entry['full_s']):.3f}",
                )
            )
        if entry.get("verify_s"):
            verify, raw = med(entry["verify_s"]), med(entry["raw_walk_s"])
            ctx.rows.append(
                Row(
                    "6 delta",
                    f"{kind}: `bulldozer namespace verify` of the live layered version (the chain at its depth "
                    f"limit: {entry['verify_records']:,} records read back through the DAL's Scan and measured; "
                    f"the read alone {med(entry['verify_read_s']):.2f} s), whole command, s; ratio: the raw "
                    "walk's time over it",
                    f"{verify:.2f}",
                    f"the raw engine's walk through the same layers (bulldozer-kvd --measure, what a seal runs): "
                    f"{raw:.2f} s",
                    f"{raw / verify:.2f}",
                    "≥ 0.5",
                    verdict(raw / verify, 0.5),
                )
            )
        if entry.get("cycle_s"):
            cycle, at = entry["cycle_s"], entry.get("compacted_at")
            ctx.rows.append(
                Row(
                    "6 delta",
                    f"{kind}: warm deltas in a row until the chain compacts flat: "
                    + (
                        f"{at} deltas, the compacting one {cycle[-1]:.2f} s"
                        if at
                        else f"no compaction within {len(cycle)} deltas"
                    )
                    + f" (median {med(cycle):.2f} s), mean s per delta over the run"
                    + read_back(entry, "cycle_major_faults"),
                    f"{mean(cycle):.2f}",
                    f"full run, warm: {med(entry['warm_full_s']):.2f} s",
                    f"{mean(cycle) / med(entry['warm_full_s']):.3f}",
                )
            )
        if "warm_delta_s" in entry:
            warm = med(entry["warm_delta_s"]) / med(entry["warm_full_s"])
            ctx.rows.append(
                Row(
                    "6 delta",
                    f"{kind}: the same through a warm `bulldozer loader` (no process start-up), s"
                    + read_back(entry, "warm_delta_major_faults", "warm_full_major_faults"),
                    f"{med(entry['warm_delta_s']):.2f}",
                    f"full run, warm: {med(entry['warm_full_s']):.2f} s",
                    f"{warm:.3f}",
                    "≤ 0.05",
                    verdict(warm, 0.05, higher_is_better=False),
                )
            )
    ctx.raw["delta"] = deltas


# ---------------------------------------------------------------- 8: change-data tables


#: the keys the upserts section's one upsert commit changes
UPSERT_FRACTION = 0.01


def upserts_section(ctx: Context) -> None:
    """A table written as Flink's upserts write one (an equality delete file by key and a
    data file of new values, ``feature_table.upsert``): the local engine applying the
    equality deletes, against the same rows in a table without deletes, and against the
    Spark engine reading the table through Iceberg's reader by key (the only engine that
    read such a table before Bulldozer applied equality deletes itself). Rounds
    interleaved; the three versions' digests must be equal."""
    s = ctx.sizes
    rows, files = s.upsert_rows, s.upsert_files
    upserted, plain = ctx.root / "upserts", ctx.root / "upserts-plain"
    ctx.say(f"upserts: a {rows:,}-row table in {files} files, then {UPSERT_FRACTION:.0%} of its keys upserted")
    feature_table.build_files(upserted, rows, files)
    after, changed = feature_table.upsert(upserted, rows, UPSERT_FRACTION, seed=7)
    feature_table.build_files(plain, after.num_rows, files, data=after)
    spec = feature_table.write_spec(ctx.root / "upserts.yaml", "upserts")
    by_key = feature_table.write_spec(ctx.root / "upserts-by-key.yaml", "upserts", partitions=2 * (files + 1))
    entry: dict[str, Any] = {"rows": after.num_rows, **changed}
    runs = (
        ("local_upserts", upserted, spec, []),
        ("local_plain", plain, spec, []),
        ("spark_icebergs_reader", upserted, by_key, ["--engine", "spark", "--master", "local[2]"]),
    )
    for rep in range(s.repeat):  # interleaved: each round runs each once, in turn first (after a JVM's exit,
        digests = set()  # the run that follows measured 0.5 s slower)
        for name, home, job, flags in runs[rep % len(runs) :] + runs[: rep % len(runs)]:
            run = run_cli(["run", str(job), *flags, "--json", "-q"], home, {"BULLDOZER_ENDPOINT": "embedded"})
            if int(run.output["rows"]) != after.num_rows:
                raise RuntimeError(f"{name} loaded {run.output['rows']} rows of {after.num_rows}")
            entry.setdefault(f"{name}_s", []).append(run.seconds)
            entry.setdefault(f"{name}_load_s", []).append(run.output["timings"]["load"])
            digests.add(run.output["digest"])
            ctx.say(f"  {name} round {rep + 1}: {run.seconds:.2f} s")
        entry.setdefault("digests_equal", []).append(len(digests) == 1)
    equal = all(entry["digests_equal"])
    ctx.rows.append(
        Row(
            "8 upserts",
            f"whole command s, {after.num_rows:,} flat rows after {changed['deleted'] + changed['upserted']:,} keys "
            f"upserted (equality deletes): local engine applying them vs the same rows without deletes; digests "
            f"equal: {equal}",
            f"{med(entry['local_upserts_s']):.2f} (load {med(entry['local_upserts_load_s']):.2f})",
            f"no deletes: {med(entry['local_plain_s']):.2f} (load {med(entry['local_plain_load_s']):.2f})",
            f"{med(entry['local_upserts_s']) / med(entry['local_plain_s']):.2f}×",
        )
    )
    ctx.rows.append(
        Row(
            "8 upserts",
            "whole command s, the same upserted table: local engine vs the Spark engine through Iceberg's reader by "
            "key (local[2], JVM start-up included)",
            f"{med(entry['local_upserts_s']):.2f}",
            f"Spark by key: {med(entry['spark_icebergs_reader_s']):.2f}",
            f"{med(entry['spark_icebergs_reader_s']) / med(entry['local_upserts_s']):.2f}× faster",
        )
    )
    # delta versions of the table as its upserts go on: each round another upsert commit, then
    # a delta run from the version before it and a full run of the same snapshot
    env = {"BULLDOZER_ENDPOINT": "embedded"}
    delta_spec = feature_table.write_spec(ctx.root / "upserts-delta.yaml", "upserts_delta", "delta")
    run_cli(["run", str(delta_spec), "--json", "-q"], upserted, env)  # the first version: full
    for rep in range(s.repeat):
        _, more = feature_table.upsert(upserted, rows, UPSERT_FRACTION, seed=100 + rep)
        delta = run_cli(["run", str(delta_spec), "--json", "-q"], upserted, env)
        full = run_cli(["run", str(spec), "--json", "-q"], upserted, env)
        d, f = delta.output, full.output
        if d["mode"] != "delta":
            raise RuntimeError(f"the delta run wrote a full version: {d['full_reason']}")
        entry.setdefault("delta_s", []).append(delta.seconds)
        entry.setdefault("delta_full_s", []).append(full.seconds)
        entry.setdefault("delta_summary", []).append(d["delta"])
        entry.setdefault("delta_digests_equal", []).append((d["rows"], d["digest"]) == (f["rows"], f["digest"]))
        ctx.say(
            f"  delta round {rep + 1}: {more['deleted'] + more['upserted']:,} keys upserted; delta {delta.seconds:.2f} s "
            f"({d['delta']['rows_read']:,} rows read, {d['delta']['deleted_by_key']:,} records by key), "
            f"full {full.seconds:.2f} s"
        )
    summary = entry["delta_summary"][-1]
    ctx.rows.append(
        Row(
            "8 upserts",
            f"delta run s after another upsert of {UPSERT_FRACTION:.0%} of the keys (equality deletes by key on "
            f"every file): delta vs a full run of the same snapshot; {summary['rows_read']:,} rows read, "
            f"{summary['deleted_by_key']:,} base records by key, {summary['files_reread']} files read again; "
            f"digests equal: {all(entry['delta_digests_equal'])}",
            f"{med(entry['delta_s']):.2f}",
            f"full: {med(entry['delta_full_s']):.2f}",
            f"{med(entry['delta_s']) / med(entry['delta_full_s']):.3f}",
        )
    )
    ctx.raw["upserts"] = entry


def read_back_layers(home: Path, alias: str, repeat: int) -> dict[str, Any]:
    """``bulldozer namespace verify ALIAS`` (the whole command) and the raw engine's walk of
    the same version through its layers (``EmbeddedEngine.measure``: bulldozer-kvd
    --measure, in a process of its own), alternating, ``repeat`` times each."""
    from bulldozer.kv.backends import create_engine
    from bulldozer.kv.backends.embedded import EmbeddedEngine
    from bulldozer.kv.connect import embedded_store_path
    from bulldozer.kv.server.native import kvd_binary

    out: dict[str, Any] = {"verify_s": [], "verify_read_s": [], "raw_walk_s": []}
    for _ in range(repeat):
        verify = run_cli(["namespace", "verify", alias, "--json"], home)  # exits 1 unless intact
        out["verify_s"].append(verify.seconds)
        out["verify_read_s"].append(verify.output["seconds"])  # its read alone, start-up aside
        out["verify_records"] = verify.output["records"]
        engine = create_engine({"type": "embedded", "path": str(embedded_store_path(home))})
        try:
            kvd = kvd_binary()
            if kvd is None or not isinstance(engine, EmbeddedEngine):
                raise RuntimeError("the raw walk needs bulldozer-kvd (scripts/build_native.sh)")
            engine.use_kvd(kvd)
            started = time.perf_counter()
            measured = engine.measure(verify.output["namespace"])
            out["raw_walk_s"].append(time.perf_counter() - started)
        finally:
            engine.close()
        if measured.count != verify.output["records"]:
            raise RuntimeError(f"the raw walk read {measured.count:,} records, verify {verify.output['records']:,}")
    return out


def compactions(home: Path) -> int:
    """How many times the embedded store under ``home`` compacted a chain flat, from its DAL
    logs (EmbeddedEngine.copy_records logs each)."""
    return sum(log.read_text().count(": compacted flat (") for log in (home / "logs").glob("dal-*.log"))


# ---------------------------------------------------------------- output


def render(rows: list[Row]) -> str:
    out = ["| section | measure | Bulldozer | compared with | ratio | target |", "|---|---|---:|---|---:|---|"]
    for r in rows:
        mark = "" if r.met is None else (" ✓" if r.met else " ✗")
        out.append(f"| {r.section} | {r.measure} | {r.bulldozer} | {r.compared_with} | {r.ratio} | {r.target}{mark} |")
    return "\n".join(out)


def machine() -> dict[str, Any]:
    mem = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in line), "0")
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(int(mem) / 1024**2, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        # the build (scripts/bootstrap.sh chooses it; Feast's venv is made with the same one)
        "python_executable": feast_env.base_python(),
    }


def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"bulldozer": version("bulldozer")}
    with contextlib.suppress(Exception):
        got = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False)
        out["redis-server"] = got.stdout.split()[2].removeprefix("v=")
    out["cassandra"] = "5.0.9"
    return out


def sizes_from(args: argparse.Namespace) -> Sizes:
    """The sizes of a run: ``--quick``'s tiny ones, else the flags' (every field by name: a
    field added to ``Sizes`` between two others once shifted the delta flags into the wrong
    fields, and full runs measured a table of 6 files with 80 steady deltas)."""
    if args.quick:
        return Sizes(
            feast_rows=2_000,
            read_calls=20,
            limit_rows=5_000,
            spark_rows=5_000,
            scale_rows=[2_000, 5_000],
            flip_sizes=[1_000, 5_000],
            repeat=1,
            delta_rows=20_000,
            delta_remote_rows=10_000,
            delta_steady=2,
            delta_cycle=2,
            delta_files=10,
            spark_cluster=False,
            spark_one_file_rows=0,
            shared_servers=True,
            admission_writers=2,
            admission_in_flight=4,
            admission_batch_mib=1,
            upsert_rows=5_000,
            upsert_files=2,
        )
    return Sizes(
        feast_rows=args.feast_rows,
        read_calls=args.read_calls,
        limit_rows=args.limit_rows,
        spark_rows=args.spark_rows,
        scale_rows=[int(x) for x in args.scale.split(",")],
        flip_sizes=[int(x) for x in args.flip_sizes.split(",")],
        repeat=args.repeat,
        delta_rows=args.delta_rows,
        delta_remote_rows=args.delta_remote_rows,
        delta_steady=args.delta_steady,
        delta_cycle=args.delta_cycle,
        upsert_rows=args.upsert_rows,
    )


# ---------------------------------------------------------------- 7: writes in flight


ADMISSION_BATCHES = 12  # per writer


def admission_section(ctx: Context) -> None:
    """The DAL's memory while many writers load at once, with and without its bound on
    writes in flight (``serve --max-writes-in-flight``), on each data plane."""
    import threading

    from bench.measured_cli import descendants, status_kib
    from bulldozer.kv import KvClient
    from bulldozer.kv.v1 import shared
    from bulldozer.names import new_version_name

    s = ctx.sizes
    unbounded = s.admission_writers * s.admission_in_flight  # as many as are ever sent at once
    per_batch = s.admission_batch_mib * 1024 * 1024 // 4096
    value = b"v" * 4096
    results: dict[str, dict[str, dict[str, list[float]]]] = {}

    def write(endpoint: str, w: int) -> None:
        with KvClient(endpoint, timeout=300) as client:
            version = new_version_name(f"w{w}")
            client.create_namespace(version, f"w{w}")
            with client.writer(
                version, batch_records=per_batch, batch_bytes=1 << 30, in_flight=s.admission_in_flight
            ) as writer:
                for i in range(per_batch * ADMISSION_BATCHES):
                    writer.add(b"%08d" % i, value)

    for rep in range(s.repeat):
        for plane in ("native", "python"):
            for limit in (unbounded, shared.LIMITS_MAX_WRITES_IN_FLIGHT):
                store = ctx.root / f"admission-{plane}-{limit}-{rep}"
                serve = [*serve_args("embedded", 0, str(store)), "--data-plane", plane]
                with dal_server([*serve, "--max-writes-in-flight", str(limit)]) as dal:
                    kvd = [k for k in descendants(dal.process.pid) if b"bulldozer-kvd" in _cmdline(k)]
                    pid = kvd[0] if plane == "native" and kvd else dal.process.pid
                    peak, done = [0], threading.Event()

                    def poll(pid: int = pid, peak: list[int] = peak, done: threading.Event = done) -> None:
                        while not done.is_set():
                            peak[0] = max(peak[0], status_kib(pid, "RssAnon"))
                            time.sleep(0.005)

                    poller = threading.Thread(target=poll, daemon=True)
                    poller.start()
                    started = time.perf_counter()
                    writers = [
                        threading.Thread(target=write, args=(dal.endpoint, w)) for w in range(s.admission_writers)
                    ]
                    for thread in writers:
                        thread.start()
                    for thread in writers:
                        thread.join()
                    seconds = time.perf_counter() - started
                    done.set()
                    poller.join()
                entry = results.setdefault(plane, {}).setdefault(str(limit), {"peak_kib": [], "seconds": []})
                entry["peak_kib"].append(peak[0])
                entry["seconds"].append(seconds)
                shutil.rmtree(store, ignore_errors=True)
                ctx.say(f"admission: {plane} plane, {limit} writes in flight: {mib(peak[0])} at most, {seconds:.1f} s")
    ctx.raw["admission"] = results
    load = (
        f"{s.admission_writers} writers × {s.admission_in_flight} batches of {s.admission_batch_mib} MiB in flight, "
        f"{s.admission_writers * ADMISSION_BATCHES * s.admission_batch_mib} MiB"
    )
    for plane in ("native", "python"):
        bounded, free = results[plane][str(shared.LIMITS_MAX_WRITES_IN_FLIGHT)], results[plane][str(unbounded)]
        ctx.rows.append(
            Row(
                "7 admission",
                f"DAL's peak anonymous memory, {plane} plane, {load} (its default "
                f"{shared.LIMITS_MAX_WRITES_IN_FLIGHT} writes in flight; s {med(bounded['seconds']):.1f} vs "
                f"{med(free['seconds']):.1f})",
                mib(med(bounded["peak_kib"])),
                f"all {unbounded} taken: {mib(med(free['peak_kib']))}",
                f"{med(bounded['peak_kib']) / max(1.0, med(free['peak_kib'])):.2f}",
            )
        )


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def argument_parser() -> argparse.ArgumentParser:
    """``bench/run``'s flags."""
    parser = argparse.ArgumentParser(
        prog="bench/run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="every benchmark at tiny sizes, one round (what CI runs)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per measurement; the table shows medians")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"sections to run, of {','.join(SECTIONS)}")
    parser.add_argument("--feast-rows", type=int, default=500_000, help="rows of the table Feast and Bulldozer load")
    parser.add_argument("--read-calls", type=int, default=1_000, help="100-key lookups per reader")
    parser.add_argument("--limit-rows", type=int, default=1_000_000, help="rows for the raw-engine comparison")
    parser.add_argument("--spark-rows", type=int, default=2_000_000, help="rows for local vs Spark")
    parser.add_argument("--scale", default="100000,1000000,10000000", help="table sizes for the scaling rows")
    parser.add_argument("--flip-sizes", default="1000,1000000", help="version sizes for flip latency")
    parser.add_argument("--delta-rows", type=int, default=10_000_000, help="rows of the delta table, embedded")
    parser.add_argument(
        "--delta-remote-rows", type=int, default=1_000_000, help="rows of the delta table on Redis and Cassandra"
    )
    parser.add_argument(
        "--delta-steady", type=int, default=6, help="one-shot embedded deltas in a row after the measured ones"
    )
    parser.add_argument(
        "--delta-cycle", type=int, default=80, help="warm embedded deltas at most, until the chain compacts flat once"
    )
    parser.add_argument("--upsert-rows", type=int, default=2_000_000, help="rows of the upserts section's table")
    parser.add_argument("--results-dir", type=Path, default=REPO / "bench" / "results")
    return parser


def installed_bytecode() -> None:
    """Measure the code as an installation runs it: every module's bytecode up to date (pip
    compiles a package as it installs it, ``scripts/bootstrap.sh`` a checkout). A module
    changed since was otherwise compiled from its source by every measured process, as
    ``PYTHONDONTWRITEBYTECODE`` (set on these machines) keeps them from writing it: with 12
    such modules, a one-shot 500 k-row run took 852 ms against 825 (medians of 6). The
    cold-start rows measure an empty cache on purpose, in a cache of their own
    (``PYTHONPYCACHEPREFIX``)."""
    import compileall

    compileall.compile_dir(REPO / "bulldozer", quiet=2)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args = parser.parse_args(argv)
    only = [x for x in args.only.split(",") if x]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s) {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    sizes = sizes_from(args)
    installed_bytecode()
    # SIGTERM unwinds like Ctrl-C, so the servers started for the run are stopped
    signal.signal(signal.SIGTERM, _interrupt)
    load = LoadSampler()
    load.measure_background()  # what else keeps the machine busy, before anything starts
    started = datetime.now(UTC)
    with (
        tempfile.TemporaryDirectory(prefix="bulldozer-bench-") as tmp,
        contextlib.ExitStack() as servers,
        load,
    ):
        ctx = Context(sizes, Path(tmp), servers=servers)
        ctx.raw["versions"] = versions()
        steps: list[tuple[str, Callable[[], None]]] = []
        if "feast" in only or "reads" in only:
            steps.append(("feast", lambda: feast_sections(ctx, "feast" in only, "reads" in only)))
        if "limits" in only:
            steps.append(("limits", lambda: limits_section(ctx)))
        if "engines" in only:
            steps.append(("engines", lambda: engines_section(ctx)))
        if "flip" in only:
            steps.append(("flip", lambda: flip_section(ctx)))
        if "delta" in only:
            steps.append(("delta", lambda: delta_section(ctx)))
        if "admission" in only:
            steps.append(("admission", lambda: admission_section(ctx)))
        if "upserts" in only:
            steps.append(("upserts", lambda: upserts_section(ctx)))
        for name, step in steps:
            with load.section(name):
                step()
    seconds = (datetime.now(UTC) - started).total_seconds()
    table = render(ctx.rows)
    heading = (
        f"Bulldozer side by side — {started:%Y-%m-%d %H:%M} UTC, {machine()['cpus']} cores, "
        f"{'quick' if args.quick else 'full'} run, medians of {sizes.repeat} round(s), {seconds / 60:.1f} min"
    )
    machine_load = load.summary()
    print(f"\n{heading}\n\n{table}\n\n{describe(machine_load)}\n")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"{'quick-' if args.quick else ''}{started:%Y%m%dT%H%M%SZ}.json"
    out.write_text(
        json.dumps(
            {
                "started": started.isoformat(),
                "seconds": seconds,
                "quick": args.quick,
                "sections": only,
                "sizes": asdict(sizes),
                "machine": machine(),
                "load": machine_load,
                "versions": ctx.raw.pop("versions"),
                "rows": [asdict(r) for r in ctx.rows],
                "samples": ctx.raw,
                "table": table,
            },
            indent=1,
        )
    )
    print(f"raw results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
