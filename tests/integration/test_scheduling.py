"""Scheduling: stages called one at a time, `bulldozer submit` / `jobs`, and the Airflow
DAG loader run for real (Airflow 3 with a SQLite metadata database under a temporary
AIRFLOW_HOME; each Airflow call is its own process, as the scheduler's would be)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bulldozer.warehouse.sample import create_sample_warehouse
from tests.conftest import REPO
from tests.integration.test_run import KEY, _cli

pytestmark = pytest.mark.integration
TEMPLATE = (REPO / "templates" / "move_data_to_kv_dal.yaml").read_text()
STAGES = ["validate", "schema", "load", "verify", "flip", "retention"]


def write_spec(path: Path, **replace: str) -> Path:
    text = TEMPLATE.replace("retries: 2 ", "retries: 0 ")
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)
    return path


@pytest.fixture
def home(tmp_path: Path) -> Path:
    create_sample_warehouse(tmp_path / "h", rows=3_000)
    return tmp_path / "h"


def runs(home: Path) -> list[dict[str, object]]:
    result = _cli(["runs", "user_item_scores", "--json"], home)
    assert result.returncode == 0, result.stderr
    return list(json.loads(result.stdout))


def alias_now(home: Path) -> str:
    result = _cli(["alias", "show", "user_item_scores", "--json"], home)
    assert result.returncode == 0, result.stderr
    return str(json.loads(result.stdout)["namespace"])


# -- stages one at a time ---------------------------------------------------------


def stage(home: Path, name: str, run_key: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    args = ["run", "templates/move_data_to_kv_dal.yaml", "--stage", name, "--run-key", run_key, "--json"]
    return _cli(args, home, fault=fault)


def test_stages_one_by_one_with_a_killed_and_retried_load(tmp_path: Path) -> None:
    home = tmp_path / "h"
    create_sample_warehouse(home, rows=30_000, chunk_rows=10_000)
    for name in ("validate", "schema"):
        assert stage(home, name, "run-1").returncode == 0
    killed = stage(home, "load", "run-1", fault="kill-after-rows:15000")
    assert killed.returncode == -9
    (loading,) = [r["version"] for r in runs(home) if r["state"] == "LOADING"]
    retried = stage(home, "load", "run-1")  # the scheduler's retry: same run key
    assert retried.returncode == 0, retried.stderr
    record = json.loads(retried.stdout)
    assert record["version"] == loading and record["resumed"] is True and record["rows"] == 30_000
    for name in ("verify", "flip", "flip", "retention"):  # a retried flip is a no-op
        done = stage(home, name, "run-1")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["version"] == loading
    assert alias_now(home) == loading
    history = json.loads(_cli(["alias", "history", "user_item_scores", "--json"], home).stdout)
    assert [h["to_namespace"] for h in history] == [loading]  # one flip, not two
    assert [(r["version"], r["state"], r["outcome"]) for r in runs(home)] == [(loading, "ACTIVE", "succeeded")]
    again = stage(home, "load", "run-1")  # a retried load after success changes nothing
    assert again.returncode == 0 and json.loads(again.stdout)["version"] == loading
    assert len(runs(home)) == 1


def test_a_load_retried_after_the_spec_changed_makes_a_new_version(tmp_path: Path) -> None:
    """The spec is replaced (a value column dropped) between a killed load and its retry:
    resuming the first attempt's version would leave it holding records of both texts, each
    encoded for its own schema, and its seal would pass (it measures what was written). The
    retry marks that version FAILED and loads a new one, whose digest is a full run's."""
    home = tmp_path / "h"
    create_sample_warehouse(home, rows=30_000, chunk_rows=10_000)
    spec = write_spec(tmp_path / "job.yaml")
    load = ["run", str(spec), "--stage", "load", "--run-key", "run-9", "--json"]
    assert _cli(load, home, fault="kill-after-rows:15000").returncode == -9
    (first,) = [r["version"] for r in runs(home) if r["state"] == "LOADING"]
    write_spec(spec, **{"    - is_active\n": ""})
    retried = _cli(load, home)
    assert retried.returncode == 0, retried.stderr
    record = json.loads(retried.stdout)
    assert record["version"] != first and record["resumed"] is False and record["rows"] == 30_000
    states = {r["version"]: r["state"] for r in runs(home)}
    assert states[first] == "FAILED"
    for name in ("verify", "flip"):
        assert _cli([*load[:3], name, *load[4:]], home).returncode == 0
    assert alias_now(home) == record["version"]
    full = _cli(["run", str(spec), "--json"], home)
    assert full.returncode == 0, full.stderr
    assert json.loads(full.stdout)["digest"] == record["digest"]  # one text's records, as a full run has


def test_a_version_is_verified_and_flipped_only_under_the_spec_that_loaded_it(home: Path, tmp_path: Path) -> None:
    """The spec changes between a scheduler's load task and its verify or flip task (an edit
    merged while the run was on its way): the verify judged the records with the new text's
    gates, and the flip made live a version the new text would not have loaded (here its
    filter was taken out, so the live version lacked a fifth of the table while the spec
    asked for all of it). Each is refused in one line; the version is marked FAILED and the
    alias stays. A retried flip of a version already live is still a no-op."""
    first = _cli(["run", "templates/move_data_to_kv_dal.yaml", "--json"], home)
    assert first.returncode == 0, first.stderr
    v1 = json.loads(first.stdout)["version"]
    filtered = {"  # filter: is_active = true": "  filter: is_active = true"}
    for run_key, stage_name in (("run-5", "verify"), ("run-6", "flip")):
        spec = write_spec(tmp_path / f"{run_key}.yaml", **filtered)
        load = ["run", str(spec), "--stage", "load", "--run-key", run_key, "--json"]
        loaded = _cli(load, home)
        assert loaded.returncode == 0, loaded.stderr
        version = json.loads(loaded.stdout)["version"]
        write_spec(spec)  # the filter taken out
        done = _cli([*load[:3], stage_name, *load[4:6], "-q"], home)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(
            f"error: {version} is not verified or made live under a spec that did not load it: "
            "another text of the spec began it"
        ), done.stderr
        assert {r["version"]: r["state"] for r in runs(home)}[version] == "FAILED"
        assert alias_now(home) == v1
    spec = write_spec(tmp_path / "run-7.yaml")
    stages = [["run", str(spec), "--stage", name, "--run-key", "run-7", "-q"] for name in ("load", "verify", "flip")]
    for args in stages:
        assert _cli(args, home).returncode == 0
    write_spec(spec, **filtered)
    assert _cli(stages[2], home).returncode == 0  # live already: nothing is judged or made live again


def test_a_stage_option_outside_its_stage_is_refused(home: Path) -> None:
    """``--version`` and ``--run-key`` without ``--stage``, ``--resume`` with one, and
    ``--version`` for a stage that makes or reads no version were ignored: ``run --stage load
    --resume V`` made a new version, ``run --version V`` a whole run of its own. So were
    ``--engine spark`` / ``--master`` on a stage other than the load, and ``--allow-breaking`` /
    ``--take-over`` on one that checks no schema. Each is one line now, before anything is made."""
    spec = "templates/move_data_to_kv_dal.yaml"
    refused = {
        ("--version", "user_item_scores__v1"): "error: --version applies to --stage only",
        ("--run-key", "k", "--version", "v"): "error: --version and --run-key apply to --stage only",
        ("--stage", "load", "--resume", "v"): "error: --resume applies to a whole run; a retried --stage load",
        ("--stage", "schema", "--version", "v"): "error: --version applies to the load, verify, flip and retention",
        ("--stage", "flip", "--engine", "spark"): "error: --engine spark applies to the load stage (or a whole run), "
        "not flip",
        ("--stage", "validate", "--engine", "spark", "--master", "local[1]"): (
            "error: --engine spark and --master apply to the load stage (or a whole run), not validate"
        ),
        ("--stage", "verify", "--allow-breaking"): (
            "error: --allow-breaking applies to the schema and load stages (or a whole run), not verify"
        ),
        ("--stage", "flip", "--allow-breaking", "--take-over"): (
            "error: --allow-breaking and --take-over apply to the schema and load stages (or a whole run), not flip"
        ),
    }
    for args, said in refused.items():
        done = _cli(["run", spec, "-q", *args], home)
        assert done.returncode == 1 and done.stderr.startswith(said) and done.stderr.count("\n") == 1, done.stderr
    assert runs(home) == []  # no version was made


def test_a_failing_verify_stage_marks_the_version_failed_and_keeps_the_alias(home: Path) -> None:
    first = _cli(["run", "templates/move_data_to_kv_dal.yaml", "--json"], home)
    assert first.returncode == 0, first.stderr
    v1 = json.loads(first.stdout)["version"]
    spec = write_spec(home / "strict.yaml", **{"min_rows: 1000": "min_rows: 1000000"})
    assert _cli(["run", str(spec), "--stage", "load", "--run-key", "run-3"], home).returncode == 0
    verify = _cli(["run", str(spec), "--stage", "verify", "--run-key", "run-3"], home)
    assert verify.returncode != 0 and "min_rows" in verify.stderr and "Traceback" not in verify.stderr
    retried = _cli(["run", "templates/move_data_to_kv_dal.yaml", "--stage", "verify", "--run-key", "run-3"], home)
    assert retried.returncode != 0 and "FAILED" in retried.stderr  # a lenient spec cannot revive it
    flip = _cli(["run", str(spec), "--stage", "flip", "--run-key", "run-3"], home)
    assert flip.returncode != 0  # a FAILED version can never go live
    assert alias_now(home) == v1
    states = {r["version"]: r["state"] for r in runs(home)}
    assert list(states.values()).count("FAILED") == 1


# -- submit / jobs ------------------------------------------------------------------


def test_a_specs_folder_that_is_a_file_is_refused_in_one_line(home: Path, tmp_path: Path) -> None:
    """BULLDOZER_SPECS_DIR naming a file: ``jobs`` said no job was submitted, the DAG loader
    made no DAG without a word, and ``submit`` said "File exists"; each says what is wrong."""
    from bulldozer.errors import InvalidArgumentError
    from bulldozer.schedule import airflow_dags

    specs = tmp_path / "specs.yaml"
    specs.write_text("not a folder\n")
    said = f"error: the specs folder {specs} is not a folder (BULLDOZER_SPECS_DIR, else the home's specs/)\n"
    env = {"BULLDOZER_SPECS_DIR": str(specs)}
    for args in (["jobs"], ["submit", "templates/move_data_to_kv_dal.yaml"]):
        done = _cli(args, home, env)
        assert done.returncode == 1 and done.stderr == said, (args, done.stderr)
    with pytest.raises(InvalidArgumentError, match="is not a folder"):
        airflow_dags.build_dags(specs, strict=False)
    assert specs.read_text() == "not a folder\n"
    assert _cli(["jobs"], home, {"BULLDOZER_SPECS_DIR": str(tmp_path / "none-yet")}).returncode == 0


def test_submit_places_the_spec_atomically_and_jobs_lists_it(home: Path, tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    env = {"BULLDOZER_SPECS_DIR": str(specs)}
    result = _cli(["submit", "templates/move_data_to_kv_dal.yaml", "--json"], home, env)
    assert result.returncode == 0, result.stderr
    placed = Path(json.loads(result.stdout)["submitted"])
    assert placed == specs / "user_item_scores.yaml" and placed.read_text() == TEMPLATE
    assert [p.name for p in specs.iterdir()] == ["user_item_scores.yaml"]  # no temporary file left
    again = _cli(["submit", str(write_spec(tmp_path / "again.yaml"))], home, env)
    assert again.returncode == 0  # submitting the job again replaces it
    # the same job name from another owner replaced that team's job without a word: now it
    # is refused, and --take-over hands the job over deliberately
    other_team = write_spec(tmp_path / "other_team.yaml", **{"owner: data-platform@example.com": "owner: growth"})
    refused = _cli(["submit", str(other_team)], home, env)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"{other_team}: metadata.owner: the job 'user_item_scores' belongs to 'data-platform@example.com' (submitted "
        f"as {placed}), not to 'growth': submitting it would replace their job (--take-over hands it over)"
    ]
    assert placed.read_text() == write_spec(tmp_path / "again.yaml").read_text()  # theirs, untouched
    taken = _cli(["submit", str(other_team), "--take-over"], home, env)
    assert taken.returncode == 0 and "owner: growth" in placed.read_text()
    assert _cli(["submit", "templates/move_data_to_kv_dal.yaml", "--take-over"], home, env).returncode == 0
    legacy = write_spec(specs / "legacy.yaml")  # a file placed by hand, same job name
    refused = _cli(["submit", "templates/move_data_to_kv_dal.yaml"], home, env)
    assert refused.returncode == 2 and f"already submitted as {legacy}" in refused.stderr
    legacy.unlink()
    same_alias = write_spec(tmp_path / "same_alias.yaml", **{"name: user_item_scores": "name: other_team"})
    refused = _cli(["submit", str(same_alias)], home, env)
    assert refused.returncode == 2 and "the alias 'user_item_scores' is the job 'user_item_scores'" in refused.stderr
    bad = write_spec(tmp_path / "bad.yaml", **{"name: user_item_scores": "name: other", "user_id": "user_idd"})
    refused = _cli(["submit", str(bad)], home, env)
    assert refused.returncode == 2 and "user_idd" in refused.stderr
    assert sorted(p.name for p in specs.iterdir()) == ["user_item_scores.yaml"]
    listed = json.loads(_cli(["jobs", "--json"], home, env).stdout)
    assert [(j["name"], j["alias"], j["schedule"], j["current_version"], j["last_run"]) for j in listed] == [
        ("user_item_scores", "user_item_scores", "@daily", "", None)
    ]
    ran = _cli(["run", str(placed), "--json"], home)
    version = json.loads(ran.stdout)["version"]
    (job,) = json.loads(_cli(["jobs", "--json"], home, env).stdout)
    assert job["current_version"] == version and job["last_run"]["outcome"] == "succeeded"


# -- Airflow ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An AIRFLOW_HOME with a migrated SQLite metadata database."""
    folder = tmp_path_factory.mktemp("airflow")
    result = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        env=airflow_env(folder, folder / "unused-home", folder / "unused-specs"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


def airflow_env(airflow: Path, home: Path, specs: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "AIRFLOW_HOME": str(airflow),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow}/airflow.db",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "BULLDOZER_HOME": str(home),
        "BULLDOZER_SPECS_DIR": str(specs),
        **extra,
    }


DAGBAG = """
import json
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=%r)
out = {"errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": {}}
for dag in bag.dags.values():
    tasks = {t.task_id: sorted(t.downstream_task_ids) for t in dag.tasks}
    out["dags"][dag.dag_id] = {
        "tasks": tasks, "tags": sorted(dag.tags), "owner": dag.owner,
        "retries": dag.default_args.get("retries"), "doc": dag.doc_md or "",
        "schedule": str(getattr(dag, "schedule", "")), "timezone": str(dag.timezone),
        "timeouts": {
            t.task_id: t.execution_timeout.total_seconds() if t.execution_timeout else None for t in dag.tasks
        },
    }
    if dag.dag_id == "c_berlin":  # when the scheduler (serialized DAG) runs it, winter and summer
        import pendulum
        from airflow.serialization.serialized_objects import DagSerialization
        from airflow.timetables.base import TimeRestriction

        timetable = DagSerialization.from_dict(DagSerialization.to_dict(dag)).timetable
        out["dags"][dag.dag_id]["next_runs"] = [
            timetable.next_dagrun_info(
                last_automated_data_interval=None,
                restriction=TimeRestriction(earliest=pendulum.datetime(2026, m, 15), latest=None, catchup=True),
            ).run_after.isoformat()
            for m in (1, 7)
        ]
print("DAGBAG" + json.dumps(out))
"""


def dagbag(env: dict[str, str]) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", DAGBAG % str(REPO / "dags")], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("DAGBAG")]
    return dict(json.loads(line[len("DAGBAG") :]))


def test_dag_folder_loads_good_specs_and_reports_bad_ones(airflow_home: Path, home: Path, tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    write_spec(specs / "user_item_scores.yaml")
    write_spec(specs / "b_cron.yaml", **{"name: user_item_scores": "name: b_cron", '"@daily"': '"not a cron"'})
    write_spec(specs / "z_twin.yaml")  # a second job called user_item_scores
    berlin = {
        "name: user_item_scores": "name: c_berlin",
        '"@daily"': '"0 6 * * *"',
        "timezone: UTC": "timezone: Europe/Berlin",
    }
    write_spec(specs / "c_berlin.yaml", **berlin)
    write_spec(specs / "h_zone.yaml", **{**berlin, "c_berlin": "h_zone", "Europe/Berlin": "Europe/Berln"})
    write_spec(specs / "d_typo.yaml", **{"name: user_item_scores": "name: d_typo", "  owner:": "  ownr:"})
    (specs / "e_deep.yaml").write_text("a: " + "[" * 600 + "]" * 600 + "\n")  # 1 KB that overflowed the parser
    (specs / "f_zero.yaml").symlink_to("/dev/zero")  # read forever
    os.mkfifo(specs / "g_fifo.yaml")  # blocked forever
    bag = dagbag(airflow_env(airflow_home, home, specs))
    assert bag["errors"] == {}  # one bad spec never breaks the loader file
    dags = bag["dags"]
    assert isinstance(dags, dict)
    good = dags["user_item_scores"]
    assert good["tasks"] == {
        "validate": ["schema"],
        "schema": ["load"],
        "load": ["verify"],
        "verify": ["flip"],
        "flip": ["retention"],
        "retention": [],
    }
    assert good["tags"] == ["bulldozer", "recommendations", "sample"]
    assert good["owner"] == "data-platform@example.com" and good["retries"] == 0
    assert sorted(dags) == [
        "bulldozer_invalid__b_cron",
        "bulldozer_invalid__d_typo",
        "bulldozer_invalid__e_deep",
        "bulldozer_invalid__f_zero",
        "bulldozer_invalid__g_fifo",
        "bulldozer_invalid__h_zone",
        "bulldozer_invalid__z_twin",
        "c_berlin",
        "user_item_scores",
    ]
    # the schedule's 06:00 is Berlin's, summer time included (it was UTC's: 07:00 or 08:00 there)
    assert (good["timezone"], dags["c_berlin"]["timezone"]) == ("UTC", "Europe/Berlin")
    assert dags["c_berlin"]["next_runs"] == ["2026-01-15T05:00:00+00:00", "2026-07-15T04:00:00+00:00"]
    assert "unknown time zone 'Europe/Berln'; did you mean 'Europe/Berlin'?" in dags["bulldozer_invalid__h_zone"]["doc"]
    assert "nested deeper than 50 levels" in dags["bulldozer_invalid__e_deep"]["doc"]
    assert "is not a regular file" in dags["bulldozer_invalid__f_zero"]["doc"]
    assert "is not a regular file" in dags["bulldozer_invalid__g_fifo"]["doc"]
    assert "not a cron expression" in dags["bulldozer_invalid__b_cron"]["doc"]
    assert "is already used by" in dags["bulldozer_invalid__z_twin"]["doc"]
    assert "did you mean 'owner'" in dags["bulldozer_invalid__d_typo"]["doc"]
    assert list(dags["bulldozer_invalid__b_cron"]["tasks"]) == ["invalid_spec"]

    strict = dagbag(airflow_env(airflow_home, home, specs, BULLDOZER_DAGS_STRICT="1"))
    errors = strict["errors"]
    assert isinstance(errors, dict) and list(errors) == [str(REPO / "dags" / "bulldozer_dags.py")]
    assert "not a cron expression" in next(iter(errors.values()))


def test_each_stage_task_is_stopped_past_the_run_s_time_limit(airflow_home: Path, home: Path, tmp_path: Path) -> None:
    """The spec's ``metadata.timeout``, else the operator's ``BULLDOZER_RUN_TIMEOUT``, is each
    stage task's ``execution_timeout``; a spec asking for more than the operator allows is an
    invalid DAG saying so."""
    specs = tmp_path / "specs"
    specs.mkdir()
    write_spec(specs / "user_item_scores.yaml")
    limited = {"name: user_item_scores": "name: i_limited", "  retry_delay: 5m": "  retry_delay: 5m\n  timeout: 90m"}
    write_spec(specs / "i_limited.yaml", **limited)
    write_spec(specs / "j_greedy.yaml", **{**limited, "i_limited": "j_greedy", "timeout: 90m": "timeout: 4h"})
    dags = dagbag(airflow_env(airflow_home, home, specs, BULLDOZER_RUN_TIMEOUT="3h"))["dags"]
    assert isinstance(dags, dict)
    assert sorted(dags) == ["bulldozer_invalid__j_greedy", "i_limited", "user_item_scores"]
    assert set(dags["user_item_scores"]["timeouts"].values()) == {3 * 3600}
    assert set(dags["i_limited"]["timeouts"].values()) == {90 * 60}
    assert len(dags["i_limited"]["timeouts"]) == 6
    assert (
        "metadata.timeout: 4h is longer than a run may take here: at most 3h"
        in (dags["bulldozer_invalid__j_greedy"]["doc"])
    )
    unlimited = dagbag(airflow_env(airflow_home, home, specs))["dags"]
    assert isinstance(unlimited, dict)
    assert set(unlimited["user_item_scores"]["timeouts"].values()) == {None}
    assert set(unlimited["j_greedy"]["timeouts"].values()) == {4 * 3600}


def dags_test(
    airflow: Path, home: Path, specs: Path, dag_id: str = "user_item_scores"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "airflow", "dags", "test", dag_id],
        env=airflow_env(airflow, home, specs),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_stage_past_the_time_limit_is_stopped_by_airflow(airflow_home: Path, tmp_path: Path) -> None:
    """A load whose query computes for hours: Airflow's timeout (SIGALRM in the task's main
    thread) reaches the query DuckDB runs on another thread, and the task fails at its limit."""
    from tests.integration.test_run import _endless_job

    home, specs = tmp_path / "h", tmp_path / "specs"
    specs.mkdir()
    job = _endless_job(tmp_path, home, metadata=", timeout: 6s, retries: 0")
    job.rename(specs / job.name)
    started = time.monotonic()
    result = dags_test(airflow_home, home, specs, "endless")
    assert "Process timed out" in result.stdout + result.stderr, result.stderr[-3000:]
    assert time.monotonic() - started < 120
    (record,) = json.loads(_cli(["runs", "endless", "--json"], home).stdout)
    assert record["error"].startswith("load: AirflowTaskTimeout"), record


def test_a_dag_run_moves_the_alias_and_a_failing_gate_fails_without_retries(
    airflow_home: Path, home: Path, tmp_path: Path
) -> None:
    specs = tmp_path / "specs"
    env = {"BULLDOZER_SPECS_DIR": str(specs)}
    placed = write_spec(tmp_path / "job.yaml")
    assert _cli(["submit", str(placed)], home, env).returncode == 0
    run = dags_test(airflow_home, home, specs)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (v1,) = [r for r in runs(home) if r["state"] == "ACTIVE"]
    assert alias_now(home) == v1["version"] and v1["outcome"] == "succeeded" and v1["rows"] == 3_000
    got = _cli(["get", "user_item_scores", "--key", json.dumps(KEY)], home)
    assert got.returncode == 0 and json.loads(got.stdout)["profile"]["tier"]

    # retries configured, but a refused gate is not retried: the task fails at once
    changes = {
        "min_rows: 1000": "min_rows: 1000000",
        "retries: 0 ": "retries: 2 ",
        "retry_delay: 5m": "retry_delay: 1s",
    }
    strict = write_spec(tmp_path / "job.yaml", **changes)
    assert _cli(["submit", str(strict)], home, env).returncode == 0  # replaces the submitted spec
    failed = dags_test(airflow_home, home, specs)
    output = failed.stdout + failed.stderr
    assert "quality gate failed: min_rows" in output  # the reason, in the task log
    assert "not retried: trying again cannot change it" in output
    assert "up_for_retry" not in output.lower()  # (with the gate retried like a blip, it was)
    finished = [line for line in output.splitlines() if "DagRun Finished" in line]
    assert finished and "state=failed" in finished[-1]  # the DAG run is failed
    assert alias_now(home) == v1["version"]  # never moved
    states = sorted(str(r["state"]) for r in runs(home))
    assert states == ["ACTIVE", "FAILED"]


def test_invalid_specs_whose_file_names_differ_only_in_punctuation_each_keep_their_report(tmp_path: Path) -> None:
    """``a-b.yaml``, ``a b.yml`` and ``a_b.yaml`` all make ``bulldozer_invalid__a_b``: each
    file's failure gets a DAG of its own (one report hid the others')."""
    from bulldozer.schedule import airflow_dags

    specs = tmp_path / "specs"
    specs.mkdir()
    for name, text in (("a-b.yaml", "kind: [unclosed"), ("a b.yml", "- a list"), ("a_b.yaml", "just text")):
        (specs / name).write_text(text)
    dags = airflow_dags.build_dags(specs, strict=False)
    assert sorted(dags) == ["bulldozer_invalid__a_b", "bulldozer_invalid__a_b_2", "bulldozer_invalid__a_b_3"]
    reported = sorted(next(n for n in ("a-b.yaml", "a b.yml", "a_b.yaml") if n in d.doc_md) for d in dags.values())
    assert reported == sorted(["a-b.yaml", "a b.yml", "a_b.yaml"])


def test_an_invalid_spec_s_report_cannot_write_the_airflow_page_it_is_shown_on(tmp_path: Path) -> None:
    """A DAG's documentation is Markdown the Airflow UI renders, and an invalid spec's report
    quotes the spec: a key spelt with backticks and line breaks ended the report's code block
    and put a link of the spec's on the operator's page ("sign in again"). The report is code
    now, fenced past any run of backticks in it, one line per issue as ``validate`` prints."""
    from bulldozer.schedule import airflow_dags

    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "a`b.yaml").write_text(
        'apiVersion: bulldozer/v1\nkind: MoveDataToKvDal\n"x```\\n\\n[sign in again](http://evil.example/)\\n```": 1\n'
    )
    (doc,) = (dag.doc_md for dag in airflow_dags.build_dags(specs, strict=False).values())
    lines = doc.splitlines()
    assert lines[0] == f"``{specs / 'a`b.yaml'}`` does not validate:" and lines[1] == ""
    fence = lines[2]
    assert fence == "````" and lines[-1] == fence and fence not in "\n".join(lines[3:-1])
    (quoted,) = [line for line in lines[3:-1] if "sign in again" in line]  # one line, inside the block
    assert quoted.startswith(f"{specs / 'a`b.yaml'}:3:1: x```\\n\\n[sign in again](http://evil.example/)")


@pytest.mark.parametrize("failure", [RecursionError("deep"), MemoryError(), OSError(5, "I/O error"), KeyError("x")])
def test_any_failure_of_one_spec_stays_in_its_own_invalid_dag(
    failure: Exception, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bulldozer.schedule import airflow_dags

    specs = tmp_path / "specs"
    specs.mkdir()
    write_spec(specs / "user_item_scores.yaml")
    write_spec(specs / "a_bad.yaml", **{"name: user_item_scores": "name: a_bad"})
    real = airflow_dags.load_spec

    def load(path: Path) -> Any:
        if path.name == "a_bad.yaml":
            raise failure
        return real(path)

    monkeypatch.setattr(airflow_dags, "load_spec", load)
    dags = airflow_dags.build_dags(specs, strict=False)
    assert sorted(dags) == ["bulldozer_invalid__a_bad", "user_item_scores"]
    assert type(failure).__name__ in dags["bulldozer_invalid__a_bad"].doc_md
    with pytest.raises(type(failure)):
        airflow_dags.build_dags(specs, strict=True)


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        ("BackendUnavailableError('the DAL is down')", True),
        ("QualityGateError('min_rows: 5 rows (minimum 1,000)')", False),
        ("DuplicateKeyError('two rows share a key')", False),
        ("IncompatibleSchemaError('breaking change', [])", False),
        ("SpecError([])", False),
    ],
)
def test_a_stage_task_fails_fast_only_where_retrying_cannot_help(
    error: str, retried: bool, home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The task body re-raises a transient failure (the DAG's retries apply) and turns one
    that trying again cannot change into AirflowFailException (no retry)."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    from bulldozer import errors
    from bulldozer.load import runner
    from bulldozer.schedule import airflow_dags

    exc = eval(error, vars(errors))

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise exc

    monkeypatch.setattr(runner, "run_stage", failing)
    monkeypatch.setenv("BULLDOZER_HOME", str(home))
    spec = write_spec(tmp_path / "job.yaml")
    context = {"dag": SimpleNamespace(dag_id="user_item_scores"), "run_id": "manual__1"}
    with pytest.raises(Exception) as raised:
        airflow_dags.run_stage_task(str(spec), "load", **context)
    if retried:
        assert raised.value is exc
    else:
        assert isinstance(raised.value, AirflowFailException) and raised.value.__cause__ is exc
        assert "not retried" in str(raised.value)


DOWNSTREAM = """
from datetime import datetime
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset
with DAG("features_ready", schedule=[Asset("bulldozer://user_item_scores")], start_date=datetime(2024, 1, 1)):
    EmptyOperator(task_id="use_the_new_version")
"""

OWN_DAG = """
from datetime import datetime
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG
from bulldozer.schedule.airflow_dags import bulldozer_task_group
with DAG("my_pipeline", schedule=None, start_date=datetime(2024, 1, 1)):
    EmptyOperator(task_id="extract") >> bulldozer_task_group(%r) >> EmptyOperator(task_id="notify")
"""

ASSET_STATE = """
import json
from airflow.models.asset import AssetDagRunQueue, AssetEvent, AssetModel
from airflow.utils.session import create_session
with create_session() as session:
    asset = session.query(AssetModel).filter(AssetModel.name == "bulldozer://user_item_scores").one()
    events = [e.extra for e in session.query(AssetEvent).filter(AssetEvent.asset_id == asset.id).order_by(AssetEvent.id)]
    queued = [q.target_dag_id for q in session.query(AssetDagRunQueue).filter(AssetDagRunQueue.asset_id == asset.id)]
print("ASSETS" + json.dumps({"events": events, "queued": queued}))
"""


def test_a_flip_updates_the_alias_asset_and_a_task_group_runs_the_job_in_your_dag(
    airflow_home: Path, home: Path, tmp_path: Path
) -> None:
    """The flip task's Asset event (with the version in its extra) queues a DAG scheduled on
    ``bulldozer://<alias>``; the load reads the table's Asset; and bulldozer_task_group puts
    the same stage tasks in a user's own DAG."""
    specs, dags = tmp_path / "specs", tmp_path / "dags"
    dags.mkdir()
    (dags / "bulldozer_dags.py").write_text((REPO / "dags" / "bulldozer_dags.py").read_text())
    (dags / "features_ready.py").write_text(DOWNSTREAM)
    (dags / "my_pipeline.py").write_text(OWN_DAG % str(write_spec(tmp_path / "own.yaml")))
    env = airflow_env(
        airflow_home,
        home,
        specs,
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
    )
    assert (
        _cli(["submit", str(write_spec(tmp_path / "job.yaml"))], home, {"BULLDOZER_SPECS_DIR": str(specs)}).returncode
        == 0
    )

    bag = subprocess.run(
        [sys.executable, "-c", DAGBAG % str(dags)], env=env, capture_output=True, text=True, timeout=300
    )
    (line,) = [x for x in bag.stdout.splitlines() if x.startswith("DAGBAG")]
    found = json.loads(line[len("DAGBAG") :])
    assert found["errors"] == {}
    own = found["dags"]["my_pipeline"]["tasks"]
    assert own["extract"] == ["user_item_scores.validate"]
    assert own["user_item_scores.flip"] == ["user_item_scores.retention"]
    assert own["user_item_scores.retention"] == ["notify"]

    serialized = subprocess.run([sys.executable, "-m", "airflow", "dags", "reserialize"], env=env,
                                capture_output=True, text=True, timeout=300)  # fmt: skip
    assert serialized.returncode == 0, serialized.stderr[-3000:]
    lineage = tmp_path / "lineage.jsonl"  # Airflow's OpenLineage provider, to a file
    ol = {"OPENLINEAGE__TRANSPORT__TYPE": "file", "OPENLINEAGE__TRANSPORT__LOG_FILE_PATH": str(lineage),
          "OPENLINEAGE__TRANSPORT__APPEND": "true"}  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "airflow", "dags", "test", "user_item_scores"], env={**env, **ol},
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    live = alias_now(home)
    events = {(e["job"]["name"], e["eventType"]): e for e in map(json.loads, lineage.read_text().splitlines())}
    flip = events[("user_item_scores.flip", "COMPLETE")]  # the provider's task event, with the run's datasets
    assert [(o["name"], o["facets"]["version"]["datasetVersion"]) for o in flip["outputs"]] == [
        ("user_item_scores", live)
    ]
    assert [(i["namespace"], i["name"]) for i in flip["inputs"]] == [("iceberg://lake", "sample.user_item_scores")]
    assert ("user_item_scores", "COMPLETE") in events  # and the run's own event (bulldozer.lineage)
    state = subprocess.run([sys.executable, "-c", ASSET_STATE], env=env, capture_output=True, text=True, timeout=300)
    assert state.returncode == 0, state.stdout[-3000:] + state.stderr[-300:]
    (line,) = [x for x in state.stdout.splitlines() if x.startswith("ASSETS")]
    assets = json.loads(line[len("ASSETS") :])
    # the newest event is this flip's (the metadata database is shared with the tests above)
    assert assets["events"][-1]["version"] == live
    assert assets["events"][-1]["rows"] == 3_000 and assets["events"][-1]["alias"] == "user_item_scores"
    assert assets["queued"] == ["features_ready"]  # the scheduler starts it on its next loop
    scheduler = subprocess.run([sys.executable, "-m", "airflow", "scheduler", "--num-runs", "3"], env=env,
                               capture_output=True, text=True, timeout=300)  # fmt: skip
    assert scheduler.returncode == 0, scheduler.stderr[-3000:]
    runs_of = subprocess.run([sys.executable, "-m", "airflow", "dags", "list-runs", "features_ready"],
                             env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    triggered = [
        [c.strip() for c in line.split("|")] for line in runs_of.stdout.splitlines() if "asset_triggered" in line
    ]
    assert [row[2] for row in triggered] == ["success"], runs_of.stdout  # the downstream DAG ran after the flip

    mine = subprocess.run([sys.executable, "-m", "airflow", "dags", "test", "my_pipeline"], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert mine.returncode == 0, mine.stdout[-3000:] + mine.stderr[-3000:]
    assert alias_now(home) != live  # the task group ran the job again: a new version is live


def test_an_unknown_load_engine_fails_the_task_without_retries(
    home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """BULLDOZER_LOAD_ENGINE naming no engine is a setting to fix: it was
    BackendUnavailableError, which the DAG's retries tried again (two more failures)."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    from bulldozer.schedule import airflow_dags

    monkeypatch.setenv("BULLDOZER_HOME", str(home))
    monkeypatch.setenv("BULLDOZER_LOAD_ENGINE", "flink")
    spec = write_spec(tmp_path / "job.yaml")
    context = {"dag": SimpleNamespace(dag_id="user_item_scores"), "run_id": "manual__1"}
    with pytest.raises(AirflowFailException, match=r"unknown load engine 'flink'; known: local, spark .*not retried"):
        airflow_dags.run_stage_task(str(spec), "load", **context)
