"""OpenLineage events of runs (bulldozer.lineage), against the client's file transport; a
transport that is down never fails a run; without configuration nothing is emitted."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from bulldozer.warehouse.sample import create_sample_warehouse
from tests.conftest import REPO
from tests.integration.test_run import _cli

pytestmark = pytest.mark.integration
TEMPLATE = (REPO / "templates" / "move_data_to_kv_dal.yaml").read_text()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    create_sample_warehouse(tmp_path / "h", rows=2_000)
    return tmp_path / "h"


def _file_transport(path: Path) -> dict[str, str]:
    return {
        "OPENLINEAGE__TRANSPORT__TYPE": "file",
        "OPENLINEAGE__TRANSPORT__LOG_FILE_PATH": str(path),
        "OPENLINEAGE__TRANSPORT__APPEND": "true",
    }


def test_a_run_emits_start_and_complete_with_its_datasets_and_gates(home: Path, tmp_path: Path) -> None:
    events_file = tmp_path / "lineage.jsonl"
    done = _cli(["run", "templates/move_data_to_kv_dal.yaml", "--json"], home, _file_transport(events_file))
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"]
    assert len({e["run"]["runId"] for e in events}) == 1
    assert {e["job"]["namespace"] + "/" + e["job"]["name"] for e in events} == {"bulldozer/user_item_scores"}
    (source,) = events[-1]["inputs"]
    assert (source["namespace"], source["name"]) == ("iceberg://lake", "sample.user_item_scores")
    assert source["facets"]["version"]["datasetVersion"] == str(record["snapshot_id"])
    assert "user_id" in [f["name"] for f in source["facets"]["schema"]["fields"]]
    (target,) = events[-1]["outputs"]
    assert (target["namespace"], target["name"]) == (f"bulldozer://embedded{home / 'kv'}", "user_item_scores")
    assert target["facets"]["version"]["datasetVersion"] == record["version"]
    assert target["outputFacets"]["outputStatistics"]["rowCount"] == 2_000
    gates = events[-1]["run"]["facets"]["bulldozer_gates"]["gates"]
    assert ("min_rows", True) in [(g["gate"], g["passed"]) for g in gates]
    assert all(g["passed"] for g in gates)


def test_a_failed_run_emits_fail_with_the_reason(home: Path, tmp_path: Path) -> None:
    events_file = tmp_path / "lineage.jsonl"
    spec = tmp_path / "strict.yaml"
    spec.write_text(TEMPLATE.replace("min_rows: 1000", "min_rows: 1000000"))
    failed = _cli(["run", str(spec), "-q"], home, _file_transport(events_file))
    assert failed.returncode == 1
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    assert [e["eventType"] for e in events] == ["START", "FAIL"]
    facets = events[-1]["run"]["facets"]
    assert "quality gate failed: min_rows" in facets["errorMessage"]["message"]
    assert ("min_rows", False) in [(g["gate"], g["passed"]) for g in facets["bulldozer_gates"]["gates"]]


def test_a_transport_that_is_down_is_one_line_and_the_run_succeeds(home: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    started = time.monotonic()
    done = _cli(
        ["run", "templates/move_data_to_kv_dal.yaml", "-q"], home, {"OPENLINEAGE_URL": f"http://127.0.0.1:{port}"}
    )
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30  # the run waits at most SEND_WAIT_SECONDS for its events
    lines = [line for line in done.stderr.splitlines() if "OpenLineage" in line]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("transport:\n  type: [\n", ":3:1 does not parse: expected the node content, but found '<stream end>'"),
        ("", " holds no mapping"),
        ("transport: {type: console}\ntransport: {type: http}\n", ":2:1 does not parse: the key 'transport' is given"),
        ("facets:\n  environment_variables: [HOME]\n", " names no transport (transport.type in the file"),
        (None, " cannot be read: No such file or directory"),
    ],
    ids=["does-not-parse", "empty", "a-key-twice", "no-transport", "missing"],
)
def test_an_operator_s_openlineage_file_that_configures_nothing_is_one_line(
    text: str | None, said: str, home: Path, tmp_path: Path
) -> None:
    """The file OPENLINEAGE_CONFIG names does not parse, is empty, names no transport, or is
    not there: the run succeeds and says so in one line. The client logged a traceback for
    the first, sent the events to its console logger (nowhere a command shows) saying it
    "will print events to console", and passed over a missing file in a debug line."""
    config = tmp_path / "operator.yml"
    if text is not None:
        config.write_text(text)
    done = _cli(["run", "templates/move_data_to_kv_dal.yaml", "-q"], home, {"OPENLINEAGE_CONFIG": str(config)})
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(f"OpenLineage: this run emits no lineage: its configuration {config}{said}")
    assert done.stderr.count("\n") == 1, done.stderr


def test_nothing_is_emitted_or_imported_without_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os
    import sys

    from bulldozer import lineage
    from bulldozer.spec.loader import load_spec

    # the OpenLineage client writes the transport it derives from OPENLINEAGE_URL into
    # os.environ: this test's client gets a copy, which later tests' processes do not inherit
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if not k.startswith("OPENLINEAGE")})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    loaded = load_spec(REPO / "templates" / "move_data_to_kv_dal.yaml")
    before = "openlineage.client" in sys.modules
    assert lineage.lineage_for(loaded, "embedded (/x)") is None
    assert ("openlineage.client" in sys.modules) == before
    monkeypatch.setenv("OPENLINEAGE_URL", "http://127.0.0.1:9")
    assert lineage.lineage_for(loaded, "embedded (/x)") is not None
    monkeypatch.setenv("OPENLINEAGE_DISABLED", "true")
    assert lineage.lineage_for(loaded, "embedded (/x)") is None


def test_an_openlineage_file_in_the_working_directory_configures_nothing(home: Path, tmp_path: Path) -> None:
    """The OpenLineage client reads an ``openlineage.yml`` in the working directory first, and
    Bulldozer took one as configuration: run from a checkout of a repository of specs holding
    one, a run wrote its events where the file said, with the values of the environment
    variables it listed (a token here). Such a file configures nothing now, and a run the
    operator configured lineage for emits nothing and says why; the operator's own file,
    named by OPENLINEAGE_CONFIG, is used as before."""
    import os
    import subprocess
    import sys

    checkout, stolen, operators = tmp_path / "specs-repo", tmp_path / "stolen.jsonl", tmp_path / "events.jsonl"
    checkout.mkdir()
    (checkout / "job.yaml").write_text(TEMPLATE)
    (checkout / "openlineage.yml").write_text(
        f"transport:\n  type: file\n  log_file_path: {stolen}\n  append: true\n"
        "facets:\n  environment_variables: [THE_TOKEN]\n"
    )
    (tmp_path / "operator.yml").write_text(f"transport:\n  type: file\n  log_file_path: {operators}\n  append: true\n")

    def run(**env: str) -> subprocess.CompletedProcess[str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("OPENLINEAGE")}
        return subprocess.run(
            [sys.executable, "-m", "bulldozer.cli.main", "run", "job.yaml", "-q"],
            capture_output=True, text=True, timeout=300, cwd=checkout,
            env={**clean, "BULLDOZER_HOME": str(home), "HOME": str(tmp_path), "THE_TOKEN": "s3cret", **env},
        )  # fmt: skip

    alone = run()
    assert alone.returncode == 0 and alone.stderr == "", alone.stderr
    assert not stolen.exists()
    configured = run(OPENLINEAGE_URL="http://127.0.0.1:9")
    assert configured.returncode == 0, configured.stderr
    assert f"OpenLineage: this run emits no lineage: {checkout / 'openlineage.yml'} would choose" in configured.stderr
    assert not stolen.exists()
    named = run(OPENLINEAGE_CONFIG=str(tmp_path / "operator.yml"))
    assert named.returncode == 0, named.stderr
    events = [json.loads(line) for line in operators.read_text().splitlines()]
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"] and "s3cret" not in operators.read_text()
    assert not stolen.exists()


def test_stages_run_one_by_one_emit_one_start_and_one_complete(home: Path, tmp_path: Path) -> None:
    """A scheduler's stages (each its own process) make one run in lineage: START as the load
    creates the version, COMPLETE once retention ran, one run id."""
    events_file = tmp_path / "lineage.jsonl"
    env = _file_transport(events_file)
    for stage in ("validate", "schema", "load", "verify", "flip", "retention"):
        args = ["run", "templates/move_data_to_kv_dal.yaml", "--stage", stage, "--run-key", "dag/run-1", "-q"]
        done = _cli(args, home, env)
        assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"]
    assert len({e["run"]["runId"] for e in events}) == 1
    assert events[-1]["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == 2_000
