"""Operator commands over a real DAL: rollback, alias show/history, gc, scan, namespaces."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bulldozer.cli.main import app
from bulldozer.errors import AliasConflictError, InvalidArgumentError, NamespaceNotFoundError, NamespaceStateError
from bulldozer.kv import KvClient
from bulldozer.kv.types import State, utcnow
from bulldozer.load.runner import run_job
from bulldozer.names import new_version_name, short_version
from bulldozer.versioning import rollback
from bulldozer.versioning.run_state import HEARTBEAT_LABEL, Beat
from bulldozer.warehouse.sample import create_sample_warehouse
from tests.integration.test_run import KEY, TEMPLATE, read, spec, table

pytestmark = pytest.mark.integration
runner = CliRunner()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    create_sample_warehouse(tmp_path, rows=1_500)
    return tmp_path


def _cli(dal: KvClient, *args: str) -> object:
    return runner.invoke(app, [*args, "--endpoint", dal.target])


def test_v1_v2_rollback_reads_v1_and_history_shows_all_three(home: Path, dal: KvClient) -> None:
    from bulldozer.warehouse.sample import overwrite_sample

    v1 = run_job(spec(), dal, home=str(home))
    first = read(dal, "user_item_scores", KEY)
    overwrite_sample(table(home), rows=1_500, variant=1)
    v2 = run_job(spec(), dal, home=str(home))
    assert read(dal, "user_item_scores", KEY) != first
    result = _cli(dal, "rollback", "user_item_scores", "--yes", "--reason", "bad prices", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "store": dal.target,
        "alias": "user_item_scores",
        "from": v2.version,
        "to": v1.version,
        "generation": 3,
        "schema_generation": 1,
    }
    assert read(dal, "user_item_scores", KEY) == first
    history = json.loads(_cli(dal, "alias", "history", "user_item_scores", "--json").stdout)
    assert [(h["from_namespace"], h["to_namespace"]) for h in history] == [
        (v2.version, v1.version),
        (v1.version, v2.version),
        ("", v1.version),
    ]
    assert history[0]["reason"] == "bad prices" and history[0]["principal"]
    shown = json.loads(_cli(dal, "alias", "show", "user_item_scores", "--json").stdout)
    assert shown["namespace"] == v1.version and shown["version"]["state"] == "ACTIVE"


def test_rollback_with_no_previous_version(home: Path, dal: KvClient) -> None:
    run_job(spec(), dal, home=str(home))
    with pytest.raises(NamespaceNotFoundError, match="no previous version"):
        rollback(dal, "user_item_scores")
    result = _cli(dal, "rollback", "user_item_scores", "--yes")
    assert result.exit_code == 1 and "no previous version" in result.stderr


def test_rollback_to_a_dropped_or_failed_version_is_refused(home: Path, dal: KvClient) -> None:
    v1 = run_job(spec(), dal, home=str(home))
    run_job(spec(), dal, home=str(home))
    dal.drop(v1.version)
    with pytest.raises(NamespaceStateError, match="it is DROPPED"):
        rollback(dal, "user_item_scores", to=v1.version)
    failed = new_version_name("user_item_scores")
    dal.create_namespace(failed, "user_item_scores")
    dal.mark_failed(failed, "bad")
    with pytest.raises(NamespaceStateError, match="it is FAILED"):
        rollback(dal, "user_item_scores", to=failed)


def test_a_flip_between_show_and_rollback_is_refused(home: Path, dal: KvClient) -> None:
    v1 = run_job(spec(), dal, home=str(home))
    v2 = run_job(spec(), dal, home=str(home))
    seen = dal.get_alias("user_item_scores").namespace  # the operator looks: v2
    v3 = run_job(spec(), dal, home=str(home))  # meanwhile a scheduled run flips to v3
    with pytest.raises(AliasConflictError, match="moved it first"):
        rollback(dal, "user_item_scores", to=v1.version, expected=seen)
    result = _cli(dal, "rollback", "user_item_scores", "--to", v1.version, "--expect", v2.version, "--yes")
    assert result.exit_code != 0 and "moved it first" in result.stderr
    assert dal.get_alias("user_item_scores").namespace == v3.version


def test_gc_drops_what_it_should_and_nothing_else(home: Path, dal: KvClient) -> None:
    versions = [run_job(spec(), dal, home=str(home)).version for _ in range(4)]  # 1 ACTIVE + 3 RETIRED
    loading = new_version_name("user_item_scores")
    dal.create_namespace(loading, "user_item_scores")
    failed = new_version_name("user_item_scores")
    dal.create_namespace(failed, "user_item_scores")
    dal.mark_failed(failed, "boom")
    dry = json.loads(_cli(dal, "gc", "--keep", "1", "--grace", "0s", "--dry-run", "--json").stdout)
    assert sorted(dry["dropped"]["user_item_scores"]) == sorted([versions[0], versions[1], loading, failed])
    assert all(n.state != State.DROPPED for n in dal.list_namespaces())  # a dry run changes nothing
    result = _cli(dal, "gc", "--keep", "1", "--grace", "0s", "--json")
    assert result.exit_code == 0, result.output
    states = {n.name: n.state for n in dal.list_namespaces("user_item_scores")}
    assert states[versions[3]] == State.ACTIVE and states[versions[2]] == State.RETIRED
    assert {states[n] for n in (versions[0], versions[1], loading, failed)} == {State.DROPPED}
    kept = json.loads(_cli(dal, "gc", "--json").stdout)  # default grace 24h: nothing young is touched
    assert kept["dropped"] == {}


def test_gc_keeps_what_each_alias_s_job_asked_for(home: Path, dal: KvClient) -> None:
    """``bulldozer gc`` kept 2 retired versions of every alias, whatever its job's spec said:
    an operator's nightly gc dropped the week of rollback a job had asked for
    (``keep_versions: 4``). Each alias now keeps what its live version's run recorded;
    ``--keep`` and ``--grace`` override it when given."""
    keep_four = spec(**{"keep_versions: 2": "keep_versions: 4"})
    versions = [run_job(keep_four, dal, home=str(home)).version for _ in range(6)]
    assert run_job(keep_four, dal, home=str(home)).retention == {"keep_versions": 4, "grace_seconds": 86_400}
    versions.append(dal.get_alias("user_item_scores").namespace)
    swept = json.loads(_cli(dal, "gc", "--grace", "0s", "--json").stdout)
    assert set(swept["dropped"]["user_item_scores"]) == set(versions[:2])  # 4 retired kept, as the job asked
    overridden = json.loads(_cli(dal, "gc", "--keep", "1", "--grace", "0s", "--json").stdout)
    assert sorted(overridden["dropped"]["user_item_scores"]) == sorted(versions[2:5])


def test_a_run_record_that_does_not_parse_stops_nothing(
    home: Path, dal: KvClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Any client the DAL lets write a version's labels (an older or newer release, another
    tool) can leave a run record that does not parse. One such label on a live version made
    ``gc`` of every alias fail with a traceback, ``runs`` too, and every later run of its job
    fail with ``run failed: JSONDecodeError``. The record is left out, with a warning."""
    oldest = run_job(spec(), dal, home=str(home)).version
    first = run_job(spec(), dal, home=str(home)).version
    live = run_job(spec(), dal, home=str(home)).version
    shadow = '{"run_id": "x", "job": "j", "alias": "a", "shadow_read": {"sampled": 3}}'  # -o tsv's KeyError
    damaged = (
        (live, "{not json"),
        (first, '{"run_id": "x", "job": "j", "alias": "a", "rows": "many"}'),
        (oldest, shadow),
    )
    for version, text in damaged:
        dal.set_labels(version, {"bulldozer.run": text})
    swept = _cli(dal, "gc", "--json")
    assert swept.exit_code == 0, swept.output
    for output in ("table", "tsv"):
        shown = _cli(dal, "runs", "user_item_scores", "-o", output)
        assert shown.exit_code == 0, shown.output
    listed = _cli(dal, "runs", "user_item_scores", "--json")
    assert listed.exit_code == 0, listed.output
    # the versions are listed; none says what its run did
    assert [(r["version"], "outcome" in r) for r in json.loads(listed.stdout)] == [
        (live, False),
        (first, False),
        (oldest, False),
    ]
    warned = caplog.text
    assert f"{oldest}: its label bulldozer.run is not a record this release reads; left out: shadow_read" in warned
    assert (
        f"{live}: its label bulldozer.run is not a record this release reads; left out: the record: Invalid JSON"
        in warned
    )
    assert (
        f"{first}: its label bulldozer.run is not a record this release reads; left out: rows: Input should" in warned
    )
    again = run_job(spec(), dal, home=str(home))
    assert again.outcome == "succeeded" and dal.get_alias("user_item_scores").namespace == again.version


def test_a_drop_a_stopped_dal_left_half_done_is_finished_by_gc(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DAL stops between marking a version DROPPED and deleting its data: dropping it
    again was a no-op and nothing listed it, so its data stayed in the store for ever. Its
    record keeps ``kv.dropping`` until the data is gone, and ``gc`` finishes the drop."""
    from bulldozer.kv import create_engine
    from bulldozer.kv.server import create_server
    from bulldozer.kv.types import DROPPING_LABEL

    engine = create_engine({"type": "embedded", "path": str(tmp_path / "kv"), "map_size": 1024**3})
    deleted: list[str] = []
    real = engine.drop_data

    def drop_data(name: str) -> None:
        deleted.append(name)
        if len(deleted) == 1:
            raise RuntimeError("the DAL stops here")
        real(name)

    monkeypatch.setattr(engine, "drop_data", drop_data)
    server, port = create_server("127.0.0.1:0", engine)
    try:
        with KvClient(f"127.0.0.1:{port}") as client:
            first = run_job(spec(), client, home=str(home)).version
            run_job(spec(), client, home=str(home))  # retires the first
            with pytest.raises(Exception, match="internal error"):  # "the DAL stops here"
                client.drop(first)
            half = client.describe(first)
            assert half.state == State.DROPPED and DROPPING_LABEL in half.labels
            dry = json.loads(_cli(client, "gc", "--dry-run", "--json").stdout)
            assert (dry["finished_drops"], deleted) == ([first], [first])
            swept = _cli(client, "gc")
            assert swept.exit_code == 0 and f"finished dropping {first}" in swept.stdout, swept.output
            assert deleted == [first, first] and DROPPING_LABEL not in client.describe(first).labels
            assert json.loads(_cli(client, "gc", "--json").stdout)["finished_drops"] == []
            with pytest.raises(InvalidArgumentError, match="reserved"):  # the DAL's own label
                client.set_labels(first, {DROPPING_LABEL: "1"})
    finally:
        server.stop(1)


def test_scan_and_namespaces(home: Path, dal: KvClient) -> None:
    done = run_job(spec(), dal, home=str(home))
    result = _cli(dal, "scan", "user_item_scores", "--limit", "3")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 3 and set(lines[0]["key"]) == {"user_id", "item_id", "locale"}
    listed = json.loads(_cli(dal, "namespaces", "user_item_scores", "--json").stdout)
    assert [n["name"] for n in listed] == [done.version] and listed[0]["record_count"] == 1_500
    # an empty listing says so (a table of headers only read as if the listing had failed)
    assert _cli(dal, "namespaces", "nothing_here").stdout == "versions of nothing_here: none\n"
    assert _cli(dal, "runs", "nothing_here").stdout == "runs of nothing_here: none\n"
    assert json.loads(_cli(dal, "runs", "nothing_here", "-o", "json").stdout) == []
    described = json.loads(_cli(dal, "namespace", "describe", done.version).stdout)
    assert described["state"] == "ACTIVE" and described["snapshot_id"] == done.snapshot_id
    refused = _cli(dal, "namespace", "drop", done.version, "--yes")
    assert refused.exit_code != 0 and "ACTIVE" in refused.stderr


def test_a_namespace_is_named_as_the_tables_show_it(home: Path, dal: KvClient) -> None:
    """``namespace describe`` and ``drop`` take the short id that ``namespaces`` and ``runs``
    print (they took only the full name), ``ALIAS@VERSION``, and for describe an alias (its
    live version)."""
    v1 = run_job(spec(), dal, home=str(home)).version
    v2 = run_job(spec(), dal, home=str(home)).version

    def described(ref: str) -> str:
        result = _cli(dal, "namespace", "describe", ref)
        assert result.exit_code == 0, result.output
        return str(json.loads(result.stdout)["name"])

    assert described(short_version(v1)) == v1 and described(v1) == v1
    assert described(f"user_item_scores@{short_version(v1)}") == v1
    assert described("user_item_scores") == v2  # the live version
    missing = _cli(dal, "namespace", "describe", "0000aa")
    assert missing.exit_code != 0 and missing.stderr == "error: the store has no version '0000aa'\n"
    refused = _cli(dal, "namespace", "drop", short_version(v2), "--yes")  # the live one
    assert refused.exit_code != 0 and "ACTIVE" in refused.stderr
    # asked: no answer on stdin (a script without --yes), then a no, each one line and nothing dropped
    unanswered = runner.invoke(app, ["namespace", "drop", short_version(v1), "--endpoint", dal.target])
    assert unanswered.exit_code == 1 and unanswered.stderr == (
        "error: not confirmed (no answer on stdin); pass --yes to go ahead without asking\n"
    )
    no = runner.invoke(app, ["namespace", "drop", short_version(v1), "--endpoint", dal.target], input="n\n")
    assert no.exit_code == 1 and no.stderr == "error: not confirmed: nothing was changed\n"
    assert dal.describe(v1).state == State.RETIRED
    dropped = _cli(dal, "namespace", "drop", short_version(v1), "--yes")
    assert dropped.exit_code == 0 and dal.describe(v1).state == State.DROPPED
    loading = new_version_name("user_item_scores")
    dal.create_namespace(loading, "user_item_scores")
    beat = Beat(utcnow(), "elsewhere", "pid:[1]", 4242)  # a run on another machine beats on it
    dal.set_labels(loading, {HEARTBEAT_LABEL: beat.to_json()})
    no = runner.invoke(app, ["namespace", "drop", loading, "--endpoint", dal.target], input="n\n")
    assert (
        f"drop {loading} (LOADING: a run is making it now, process 4242 on elsewhere wrote its heartbeat "
        in (no.stdout)
        and "s ago; that run fails) and all its data?" in no.stdout
    )
    dal.set_labels(loading, {HEARTBEAT_LABEL: ""})  # none: its run was never heard from
    asked = runner.invoke(app, ["namespace", "drop", loading, "--endpoint", dal.target], input="y\n")
    assert asked.exit_code == 0
    assert f"drop {loading} (LOADING: no run has been heard from making it) and all" in asked.stdout
    alias = _cli(dal, "namespace", "drop", "user_item_scores", "--yes")  # an alias is not a namespace to drop
    assert alias.exit_code != 0 and dal.describe(v2).state == State.ACTIVE


def test_pin_blocks_a_flip_and_unpin_releases_it(home: Path, dal: KvClient) -> None:
    v1 = run_job(spec(), dal, home=str(home))
    assert _cli(dal, "pin", "user_item_scores", "--reason", "incident").exit_code == 0
    held = run_job(spec(), dal, home=str(home))
    assert held.outcome == "pinned" and "pinned" in held.error
    assert dal.get_alias("user_item_scores").namespace == v1.version
    assert dal.describe(held.version).state == State.SEALED  # built and verified, kept
    shown = _cli(dal, "alias", "show", "user_item_scores")
    assert "PINNED" in shown.stdout
    (home / "job.yaml").write_text(TEMPLATE)
    said = _cli(dal, "run", str(home / "job.yaml"), "--home", str(home), "-q")
    assert said.exit_code == 0, said.output
    line = " ".join(said.stdout.split())  # the console wraps it
    kept = line.split(" was built and verified")[0].split()[-1]
    assert dal.describe(kept).state == State.SEALED
    assert f"alias 'user_item_scores' is pinned at {v1.version}: only a rollback moves it until it is unpinned" in line
    # the line says how to make it live at once, and that works while the alias is pinned
    assert f"`bulldozer rollback user_item_scores --to {kept}` makes it live now" in line
    assert _cli(dal, "rollback", "user_item_scores", "--to", kept, "--yes").exit_code == 0
    assert dal.get_alias("user_item_scores").namespace == kept
    assert _cli(dal, "unpin", "user_item_scores").exit_code == 0
    freed = run_job(spec(), dal, home=str(home))
    assert freed.outcome == "succeeded" and dal.get_alias("user_item_scores").namespace == freed.version


def test_every_command_without_a_spec_acts_on_bulldozer_endpoint(home: Path, dal: KvClient, tmp_path: Path) -> None:
    """BULLDOZER_ENDPOINT names the DAL for every command, as it does for run: none of them
    falls back to the local embedded store (which would be empty here, and is never made)."""
    v1 = run_job(spec(), dal, home=str(home)).version
    v2 = run_job(spec(), dal, home=str(home)).version
    elsewhere = tmp_path / "elsewhere"
    env = {"BULLDOZER_ENDPOINT": dal.target, "BULLDOZER_HOME": str(elsewhere)}

    def cli(*args: str) -> Any:
        result = runner.invoke(app, list(args), env=env)
        assert result.exit_code == 0, (args, result.output)
        return result

    names = [n["name"] for n in json.loads(cli("namespaces", "--json").stdout)]
    assert [v1, v2] == [n for n in names if n in (v1, v2)]
    assert json.loads(cli("namespace", "describe", v2).stdout)["state"] == "ACTIVE"
    assert json.loads(cli("alias", "show", "user_item_scores", "--json").stdout)["namespace"] == v2
    assert len(json.loads(cli("alias", "history", "user_item_scores", "--json").stdout)) == 2
    assert {r["version"] for r in json.loads(cli("runs", "user_item_scores", "--json").stdout)} >= {v1, v2}
    assert json.loads(cli("get", "user_item_scores", "--key", json.dumps(KEY)).stdout)
    assert len(cli("scan", "user_item_scores", "--limit", "2").stdout.strip().splitlines()) == 2
    cli("pin", "user_item_scores", "--reason", "hold")
    assert dal.get_alias("user_item_scores").pinned
    cli("unpin", "user_item_scores")
    assert not dal.get_alias("user_item_scores").pinned
    assert json.loads(cli("rollback", "user_item_scores", "--yes", "--json").stdout)["to"] == v1
    assert dal.get_alias("user_item_scores").namespace == v1
    assert json.loads(cli("gc", "--dry-run", "--json").stdout)["dry_run"] is True
    assert not (elsewhere / "kv").exists()  # the embedded store was never opened


def _profiles(tmp_path: Path, **profiles: dict[str, str]) -> Path:
    import yaml

    path = tmp_path / "profiles.yaml"
    path.write_text(yaml.safe_dump({"profiles": profiles}))
    return path


def test_a_profile_names_the_dal_for_every_command(home: Path, dal: KvClient, tmp_path: Path) -> None:
    """``--profile remote`` (a profile whose endpoint is a DAL on a loopback port): every
    command — with a spec or without — acts on that DAL, never on the local embedded store."""
    import shutil

    from tests.conftest import REPO

    profiles = _profiles(tmp_path, remote={"endpoint": dal.target, "home": str(home)})
    env = {"BULLDOZER_PROFILES_FILE": str(profiles), "BULLDOZER_HOME": "", "BULLDOZER_ENDPOINT": ""}
    spec_file = tmp_path / "job.yaml"
    shutil.copy(REPO / "templates" / "move_data_to_kv_dal.yaml", spec_file)  # names no endpoint

    def cli(*args: str) -> Any:
        result = runner.invoke(app, ["--profile", "remote", *args], env=env)
        assert result.exit_code == 0, (args, result.output)
        return result

    def said(*args: str) -> Any:
        """The command's JSON, which names the store it acted on: the profile's DAL."""
        data = json.loads(cli(*args).stdout)
        for item in data if isinstance(data, list) else [data]:
            assert item["store"] == dal.target, (args, item)
        return data

    v1 = said("run", str(spec_file), "--json")["version"]
    assert dal.get_alias("user_item_scores").namespace == v1  # the run went to the profile's DAL
    v2 = said("run", str(spec_file), "--json")["version"]
    assert said("plan", str(spec_file), "--json")["live_version"] == v2
    assert [n["name"] for n in said("namespaces", "user_item_scores", "--json")] == [v1, v2]
    assert said("namespace", "describe", v2)["state"] == "ACTIVE"
    assert said("alias", "show", "user_item_scores", "--json")["namespace"] == v2
    assert len(said("alias", "history", "user_item_scores", "--json")) == 2
    assert {r["version"] for r in said("runs", "user_item_scores", "--json")} == {v1, v2}
    assert [r["version"] for r in said("runs", "user_item_scores", "--json", "--limit", "1")] == [v2]  # the newest
    got = cli("get", "user_item_scores", "--key", json.dumps(KEY))
    assert json.loads(got.stdout) and f"store: {dal.target}" in got.stderr  # the value alone on stdout
    assert len(cli("scan", "user_item_scores", "--limit", "3").stdout.strip().splitlines()) == 3
    assert said("pin", "user_item_scores", "--json")["pinned"] is True
    assert dal.get_alias("user_item_scores").pinned
    unpinned = cli("unpin", "user_item_scores")  # a person's output: the store on stderr
    assert f"store: {dal.target}" in unpinned.stderr and "not pinned" in unpinned.stdout
    for human in (
        ["namespaces"],
        ["alias", "show", "user_item_scores"],
        ["runs", "user_item_scores"],
        ["gc", "--dry-run"],
    ):
        assert f"store: {dal.target}" in cli(*human).stderr, human
    assert said("rollback", "user_item_scores", "--yes", "--json")["to"] == v1
    assert said("gc", "--dry-run", "--json")["dry_run"] is True
    loading = new_version_name("user_item_scores")
    dal.create_namespace(loading, "user_item_scores")
    assert said("namespace", "drop", loading, "--json")["state"] == "DROPPED"  # --json: no question asked
    cli("submit", str(spec_file), "--specs-dir", str(tmp_path / "specs"), "--no-catalog")
    (job,) = said("jobs", "--specs-dir", str(tmp_path / "specs"), "--json")
    assert job["current_version"] == v1  # read from the profile's DAL
    header, row = cli("jobs", "--specs-dir", str(tmp_path / "specs"), "-o", "tsv").stdout.splitlines()
    assert header.split("\t")[:4] == ["job", "alias", "schedule", "version"] and v1 in row.split("\t")
    assert short_version(v1) in cli("jobs", "--specs-dir", str(tmp_path / "specs")).stdout


def test_profile_selection_and_precedence(dal: KvClient, tmp_path: Path) -> None:
    from bulldozer.settings import load_settings, select_profile

    profiles = _profiles(tmp_path, remote={"endpoint": dal.target}, other={"endpoint": "other:7110"})
    env = {"BULLDOZER_PROFILES_FILE": str(profiles), "BULLDOZER_ENDPOINT": ""}
    unknown = runner.invoke(app, ["--profile", "nope", "namespaces"], env=env)
    assert unknown.exit_code == 1 and "profile 'nope' is not in" in unknown.output and "other, remote" in unknown.output
    for name, value in env.items():
        os.environ[name] = value
    try:
        select_profile(None)  # as a new process starts
        os.environ["BULLDOZER_PROFILE"] = "other"
        assert load_settings().dal_endpoint() == "other:7110"  # BULLDOZER_PROFILE selects
        select_profile("remote")
        assert load_settings().dal_endpoint() == dal.target  # --profile wins over BULLDOZER_PROFILE
        os.environ["BULLDOZER_ENDPOINT"] = "env:1"
        assert load_settings().dal_endpoint() == "env:1"  # a variable wins over the profile
        assert load_settings().dal_endpoint("flag:2") == "flag:2"  # and a flag over both
    finally:
        select_profile(None)
        for name in (*env, "BULLDOZER_PROFILE"):
            os.environ.pop(name, None)


def test_a_version_is_named_by_its_short_id_everywhere(home: Path, dal: KvClient) -> None:
    from bulldozer.errors import InvalidArgumentError

    v1 = run_job(spec(), dal, home=str(home))
    v2 = run_job(spec(), dal, home=str(home))
    short = short_version(v1.version)
    assert len(short) == 6 and v1.version.endswith(short)
    assert dal.describe_target(f"user_item_scores@{short}").name == v1.version
    assert dal.describe_target("user_item_scores").name == v2.version
    assert read(dal, f"user_item_scores@{short}", KEY) == read(dal, f"user_item_scores@{v1.version}", KEY)
    got = _cli(dal, "get", f"user_item_scores@{short}", "--key", json.dumps(KEY))
    assert got.exit_code == 0, got.output
    result = _cli(dal, "rollback", "user_item_scores", "--to", short, "--expect", short_version(v2.version), "--yes")
    assert result.exit_code == 0, result.output
    assert dal.get_alias("user_item_scores").namespace == v1.version
    # unknown, too short, or another alias's: refused with one line, nothing moves
    for ref, why in (("ffffffff", "has no version 'ffffffff'"), ("abc", "4 characters or more")):
        bad = _cli(dal, "get", f"user_item_scores@{ref}", "--key", json.dumps(KEY))
        assert bad.exit_code != 0 and why in bad.stderr and "Traceback" not in bad.output
    bad = _cli(dal, "rollback", "user_item_scores", "--to", "x/../../etc", "--yes")
    assert bad.exit_code != 0 and "must match" in bad.stderr
    with pytest.raises(NamespaceNotFoundError):
        dal.describe_target(f"other_alias@{short}")
    # two versions sharing a suffix: the shared part is ambiguous, the longer one is not
    for name in ("user_item_scores__v20260101000000_aaaaaa", "user_item_scores__v20260101000001_baaaaa"):
        dal.create_namespace(name, "user_item_scores")
    with pytest.raises(InvalidArgumentError, match="ambiguous"):
        dal.describe_target("user_item_scores@aaaaa")
    assert dal.describe_target("user_item_scores@baaaaa").name.endswith("_baaaaa")


def test_listings_fit_80_columns_and_print_wide_json_and_tsv(
    home: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bulldozer.cli.common import console, made

    monkeypatch.setattr(made(console), "width", 80)
    first = run_job(spec(), dal, home=str(home))
    second = run_job(spec(), dal, home=str(home))
    rollback(dal, "user_item_scores", reason="a long reason " * 8)
    for command in (["alias", "history", "user_item_scores"], ["namespaces"], ["runs", "user_item_scores"]):
        table = _cli(dal, *command)
        assert table.exit_code == 0, table.output
        lines = table.stdout.splitlines()
        assert max(len(line) for line in lines) <= 80, table.stdout
        assert short_version(first.version) in table.stdout and first.version not in table.stdout
        wide = _cli(dal, *command, "-o", "wide")
        assert first.version in wide.stdout and second.version in wide.stdout
        tsv = _cli(dal, *command, "-o", "tsv").stdout.splitlines()
        assert all(len(line.split("\t")) == len(tsv[0].split("\t")) for line in tsv) and len(tsv) >= 3
        assert json.loads(_cli(dal, *command, "-o", "json").stdout) == json.loads(_cli(dal, *command, "--json").stdout)
    history = _cli(dal, "alias", "history", "user_item_scores", "-o", "tsv").stdout
    assert ("a long reason " * 8).strip() in history  # whole values in tsv, cut with "…" in the table
    assert "…" in _cli(dal, "alias", "history", "user_item_scores").stdout
    clash = _cli(dal, "runs", "user_item_scores", "--json", "-o", "tsv")
    assert clash.exit_code == 2 and "disagree" in clash.output


def test_a_failure_asked_for_json_is_json(home: Path, dal: KvClient) -> None:
    for command in (
        ["alias", "show", "no_such_alias", "--json"],
        ["pin", "no_such_alias", "--json"],
        ["runs", "Not-An-Alias", "-o", "json"],
    ):
        result = _cli(dal, *command)
        assert result.exit_code != 0
        failure = json.loads(result.stdout)
        assert failure["exit_code"] == result.exit_code and failure["error_type"].endswith("Error")
        assert failure["error"] and len(result.stderr.strip().splitlines()) == 1


def test_namespace_verify_finds_what_the_store_lost_or_altered_since_the_seal(tmp_path: Path) -> None:
    """A seal measures a version once; what the store holds afterwards is the store's to
    keep (a Redis replica promoted without the last writes, a damaged disk, another tool
    writing there), and nothing said the live version's records had changed. ``namespace
    verify`` reads every record back and measures it as the seal did; it changes nothing."""
    import lmdb

    from bulldozer.kv.backends.embedded import _data_db
    from tests.integration.test_run import _cli as command

    home = tmp_path / "h"
    create_sample_warehouse(home, rows=1_500)
    job = tmp_path / "job.yaml"
    job.write_text(TEMPLATE)
    done = command(["run", str(job), "--json"], home)
    assert done.returncode == 0, done.stderr
    version = json.loads(done.stdout)["version"]
    sealed = json.loads(command(["namespace", "describe", version], home).stdout)
    intact = command(["namespace", "verify", "user_item_scores"], home)
    assert intact.returncode == 0, intact.stderr
    assert intact.stdout.startswith(f"✓ {version} (ACTIVE): 1,500 records, digest {sealed['digest']}, as its seal")

    def damage(change: str) -> None:  # behind the DAL's back, as a damaged disk or another tool would
        env = lmdb.open(str(home / "kv"), max_dbs=64, lock=True)
        try:
            with env.begin(write=True) as txn:
                db = env.open_db(_data_db(version), txn=txn, create=False)
                with txn.cursor(db) as cursor:
                    assert cursor.first()
                    if change == "altered":
                        cursor.put(cursor.key(), cursor.value() + b"\x00")
                    else:
                        cursor.delete()
        finally:
            env.close()

    damage("altered")
    altered = command(["namespace", "verify", "user_item_scores", "--json"], home)
    assert altered.returncode == 1
    report = json.loads(altered.stdout)
    assert (report["intact"], report["records"], report["sealed_records"]) == (False, 1_500, 1_500)
    assert report["sealed_digest"] == sealed["digest"] != report["digest"]
    assert altered.stderr == (
        f"error: {version} has its 1,500 records, with digest {report['digest']} where the seal measured "
        f"{sealed['digest']}: the store lost, gained or altered records since the seal\n"
    )
    every = command(["namespace", "verify", "--all", "--json"], home)  # every alias's live version
    assert every.returncode == 1 and [r["intact"] for r in json.loads(every.stdout)] == [False]
    for args in (["--all", version], []):
        said = command(["namespace", "verify", *args], home)
        assert said.returncode == 1 and said.stderr.startswith("error: give a version (or an alias), or --all")
    damage("lost")
    lost = command(["namespace", "verify", version], home)
    assert lost.returncode == 1 and lost.stdout == ""
    assert lost.stderr.startswith(f"error: {version} has 1,499 records where its seal measured 1,500, with digest ")
    assert json.loads(command(["alias", "show", "user_item_scores", "--json"], home).stdout)["namespace"] == version
    job.write_text(TEMPLATE.replace("min_rows: 1000", "min_rows: 100000"))
    failed = command(["run", str(job), "-q"], home)
    assert failed.returncode == 1
    (refused,) = [
        n["name"] for n in json.loads(command(["namespaces", "--json"], home).stdout) if n["state"] == "FAILED"
    ]
    said = command(["namespace", "verify", refused], home)
    assert (said.returncode, said.stderr) == (
        1,
        f"error: {refused} is FAILED: only a sealed version (SEALED, ACTIVE or RETIRED) has a seal's measurement "
        "to compare with\n",
    )


@pytest.mark.parametrize("transport", ["grpc", "native"])
def test_namespace_verify_finds_the_records_a_redis_failover_lost(tmp_path: Path, transport: str) -> None:
    """The case ``namespace verify`` is for: Redis acknowledged a version's writes, the seal
    measured them, and a replica promoted without the last of them serves the live version
    now (here: a record's field deleted behind the DAL's back, as the lost write would be)."""
    import redis

    from bulldozer.versioning.audit import audit_version
    from tests.integration.kv_fixtures import Harness, pairs

    kv = Harness("redis", transport, tmp_path)
    try:
        alias = kv.alias()
        version = kv.loaded(alias, pairs(2_000))
        kv.client.compare_and_set_alias(alias, "", version)
        intact = audit_version(kv.client, kv.client.describe_target(alias))
        assert (intact.intact, intact.records) == (True, 2_000)
        raw = redis.Redis.from_url(kv.engine.config.url)
        bucket = next(iter(raw.scan_iter(match=f"{kv.engine.config.prefix}:d:{version}:*", count=1000)))
        field = next(f for f in raw.hkeys(bucket) if f)  # a record, not the (empty) hash-table marker
        assert raw.hdel(bucket, field) == 1
        lost = audit_version(kv.client, kv.client.describe_target(alias))
        assert (lost.intact, lost.records, lost.version.record_count) == (False, 1_999, 2_000)
        assert lost.finding().startswith(f"{version} has 1,999 records where its seal measured 2,000, with digest ")
    finally:
        kv.close()
