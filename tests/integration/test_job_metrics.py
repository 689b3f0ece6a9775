"""The DAL's /metrics shows, per alias, what an on-call engineer alerts on (freshness, size,
the latest run's outcome, stage durations and gates), read from its own metadata."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.request import urlopen

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bulldozer.kv import KvClient, create_engine
from bulldozer.kv.server import create_server
from bulldozer.kv.server.metrics import Metrics
from bulldozer.warehouse.sample import create_sample_warehouse
from tests.conftest import REPO
from tests.integration.test_run import _cli

pytestmark = pytest.mark.integration


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_freshness_and_last_run_gauges(tmp_path: Path) -> None:
    home = tmp_path / "home"
    create_sample_warehouse(home, rows=2_000)
    engine = create_engine({"type": "embedded", "path": str(tmp_path / "kv"), "map_size": 1024**3})
    metrics = Metrics()
    metrics.watch_jobs(engine)
    server, port = create_server("127.0.0.1:0", engine, metrics=metrics)
    metrics_port = metrics.serve(0)
    env = {"BULLDOZER_ENDPOINT": f"127.0.0.1:{port}"}
    try:
        assert not [k for k in _scrape(metrics_port) if k[0].startswith("bulldozer_alias_")]  # no alias yet
        done = _cli(["run", "templates/move_data_to_kv_dal.yaml", "-q"], home, env)
        assert done.returncode == 0, done.stderr
        time.sleep(0.2)
        got = _scrape(metrics_port)
        alias = (("alias", "user_item_scores"),)
        assert 0 <= got[("bulldozer_alias_version_age_seconds", alias)] < 60
        assert got[("bulldozer_alias_records", alias)] == 2_000
        assert got[("bulldozer_alias_bytes", alias)] > 0
        assert got[("bulldozer_alias_pinned", alias)] == 0
        assert got[("bulldozer_job_last_run_success", alias)] == 1
        assert got[("bulldozer_job_last_run_rows", alias)] == 2_000
        assert abs(got[("bulldozer_job_last_run_timestamp_seconds", alias)] - time.time()) < 120
        assert got[("bulldozer_job_stage_seconds", (("alias", "user_item_scores"), ("stage", "load")))] > 0
        assert got[("bulldozer_job_gate_passed", (("alias", "user_item_scores"), ("gate", "min_rows")))] == 1

        refused = tmp_path / "refused.yaml"
        template = (REPO / "templates" / "move_data_to_kv_dal.yaml").read_text()
        refused.write_text(template.replace("min_rows: 1000", "min_rows: 1000000"))
        failed = _cli(["run", str(refused), "-q"], home, env)
        assert failed.returncode == 1
        got = _scrape(metrics_port)
        assert got[("bulldozer_job_last_run_success", alias)] == 0  # the latest run failed ...
        assert got[("bulldozer_job_gate_passed", (("alias", "user_item_scores"), ("gate", "min_rows")))] == 0
        assert got[("bulldozer_alias_records", alias)] == 2_000  # ... and the live version is the old one
    finally:
        server.stop(5)


class _Served:
    output = ""


@contextlib.contextmanager
def _serve(tmp_path: Path, *args: str) -> Iterator[tuple[KvClient, _Served]]:
    """``bulldozer serve`` of an embedded store with ``args``, a client of it once it is
    ready, and (after the block) what it printed until it was stopped."""
    port_file, served = tmp_path / "port", _Served()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bulldozer.cli.main", "serve", "--path", str(tmp_path / "kv"), "--port", "0",
         "--port-file", str(port_file), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "BULLDOZER_HOME": str(tmp_path)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the DAL did not start"
            time.sleep(0.05)
        with KvClient(f"127.0.0.1:{port_file.read_text()}") as client:
            client.wait_ready()
            yield client, served
    finally:
        proc.terminate()
        served.output, _ = proc.communicate(timeout=60)


def test_a_metrics_port_in_use_is_one_line_and_the_dal_serves_on(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with _serve(tmp_path, "--metrics-port", str(busy.getsockname()[1])) as (client, served):
            client.create_namespace("served__v1", "served")
    lines = [line for line in served.output.splitlines() if "metrics: cannot serve on 127.0.0.1 port" in line]
    assert len(lines) == 1 and "Traceback" not in served.output, served.output


def test_metrics_on_loopback_answer_loopback_names_only() -> None:
    """A web page that points its own name at 127.0.0.1 (DNS rebinding) reaches the port,
    but its requests name its own host: refused. Loopback's names are answered."""
    from urllib.error import HTTPError
    from urllib.request import Request

    port = Metrics().serve(0)
    for name in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}"):
        request = Request(f"http://127.0.0.1:{port}/metrics", headers={"Host": name})
        assert urlopen(request, timeout=10).status == 200, name
    for name in (f"rebound.example:{port}", "rebound.example", f"127.0.0.1.rebound.example:{port}"):
        with pytest.raises(HTTPError) as refused:
            urlopen(Request(f"http://127.0.0.1:{port}/metrics", headers={"Host": name}), timeout=10)
        assert refused.value.code == 403, name
    # listening on every address, the operator exposed it: any name is answered
    everywhere = Metrics().serve(0, "0.0.0.0")
    request = Request(f"http://127.0.0.1:{everywhere}/metrics", headers={"Host": "dal-3.example:9100"})
    assert urlopen(request, timeout=10).status == 200


def test_serve_metrics_listen_where_metrics_host_says(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.2", 0))
        metrics_port = probe.getsockname()[1]
    with _serve(tmp_path, "--metrics-port", str(metrics_port), "--metrics-host", "127.0.0.2") as (_, served):
        text = urlopen(f"http://127.0.0.2:{metrics_port}/metrics", timeout=10).read().decode()
        assert "bulldozer_kv_requests_total" in text
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", metrics_port), timeout=5):
            pass
    assert f"metrics on http://127.0.0.2:{metrics_port}/metrics" in served.output, served.output
