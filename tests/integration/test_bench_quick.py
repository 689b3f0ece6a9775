"""``bench/run --quick``: every benchmark section at tiny sizes, so the benchmarks never rot.

No speed is asserted: the test checks that each section ran for real (Feast loaded and
served the rows, Bulldozer's lookups found them, every engine wrote) and that the table
and the JSON results agree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.spark]


def test_bench_run_quick_runs_every_section(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "bench" / "run"), "--quick", "--results-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1500,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [result_file] = list(tmp_path.glob("quick-*.json"))
    result = json.loads(result_file.read_text())
    assert result["quick"] is True
    assert result["versions"]["feast"].startswith("0.67")
    sections = {row["section"] for row in result["rows"]}
    assert sections == {
        "1 vs Feast",
        "2 reads",
        "3 limits",
        "4 engines",
        "5 flip",
        "6 delta",
        "7 admission",
        "8 upserts",
    }
    samples = result["samples"]
    rows = result["sizes"]["feast_rows"]
    for who in ("feast-sqlite", "feast-redis", "bulldozer-embedded", "bulldozer-redis"):
        assert all(r > 0 for r in samples["feast_loads"][who]["rows_per_s"]), who
        # every lookup found all 100 keys: both tools really loaded every row
        assert samples["reads"][who]["found"] == 100 * len(samples["reads"][who]["latencies"]), who
    # both tools wrote into fresh stores once before the rounds, reported on a row of its own;
    # the first run made the embedded store's file, the next ones grew it to its size
    embedded = samples["feast_loads"]["bulldozer-embedded"]
    assert embedded["settle"][0]["grew_bytes"] > 0 and embedded["first_rows_per_s"] > 0
    assert samples["feast_loads"]["feast-sqlite"]["first_rows_per_s"] > 0
    assert len(embedded["store_grew_bytes"]) == len(embedded["rows_per_s"])
    assert "the first run into a fresh store" in result["table"]
    assert samples["delta"]["embedded"]["settle"]
    for engine in ("embedded", "redis", "cassandra"):
        assert samples["limits"][engine]["raw_rows_per_s"][0] > 0
        assert samples["limits"][engine]["end_to_end_rows_per_s"][0] > 0
    assert samples["engines"]["spark_local_rows_per_s"][0] > 0  # (the cluster rounds are a full run's)
    assert set(samples["flip"]) == {str(n) for n in result["sizes"]["flip_sizes"]}
    for engine in ("embedded", "redis", "cassandra"):  # every delta version equalled the full one
        delta = samples["delta"][engine]
        assert delta["digests_equal"] and all(delta["digests_equal"]), engine
        assert all(c["updated"] and c["deleted"] and c["appended"] for c in delta["changed"]), engine
    # each measured run's pages read back from the disk were counted, and the rows say so
    delta = samples["delta"]["embedded"]
    for runs, n in (("delta", "delta_s"), ("full", "full_s"), ("warm_delta", "warm_delta_s"), ("cycle", "cycle_s")):
        assert len(delta[f"{runs}_major_faults"]) == len(delta[n]) > 0, runs
        assert all(isinstance(faults, int) and faults >= 0 for faults in delta[f"{runs}_major_faults"]), runs
    assert len(embedded["major_faults"]) == len(embedded["rows_per_s"])
    assert result["table"].count("pages read back from the disk (major faults)") == 6
    for plane in ("native", "python"):  # each plane's DAL took the writers' load, and its memory was seen
        assert all(kib > 0 for entry in samples["admission"][plane].values() for kib in entry["peak_kib"]), plane
    upserts = samples["upserts"]  # every engine loaded the upserted rows, the same version
    assert upserts["deleted"] and upserts["upserted"] and all(upserts["digests_equal"])
    # and its delta versions equalled the full ones, the files both snapshots keep not read
    assert upserts["delta_digests_equal"] and all(upserts["delta_digests_equal"])
    assert all(d["deleted_by_key"] and not d["files_reread"] for d in upserts["delta_summary"])
    # the printed table is the one in the results file, the machine's load under it
    assert result["table"] in proc.stdout
    load = result["load"]
    assert set(load["sections"]) == {"feast", "limits", "engines", "flip", "delta", "admission", "upserts"}
    assert all(0 < s["cpu_busy"] <= 1 for s in load["sections"].values())
    assert 0 <= load["background"]["cpu_busy"] <= 1
    assert "Machine load (" in proc.stdout.split(result["table"])[1]
    assert rows == 2_000


@pytest.mark.parametrize(
    "args",
    [["bench.encode", "--quick"], ["bench.kv", "--quick"], ["bench.load", "--quick", "--no-spark"]],
    ids=["encode", "kv", "load"],
)
def test_each_single_purpose_benchmark_runs_at_tiny_sizes(args: list[str]) -> None:
    """The older benchmarks the README lists beside ``bench/run`` (``bench.load``'s Spark run
    is left to the engines section above): ``bench.kv`` had stopped running when the engines'
    bulk put was renamed, and nothing ran it to say so."""
    proc = subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=600, cwd=REPO, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "|---" in proc.stdout and "Traceback" not in proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
