"""The main job end to end with the local engine: real Iceberg catalog, real gRPC DAL."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from bulldozer.errors import (
    AliasConflictError,
    DuplicateKeyError,
    IncompatibleSchemaError,
    NamespaceExistsError,
    QualityGateError,
    SourceDataError,
    SpecError,
    TableNotFoundError,
)
from bulldozer.kv import KvClient
from bulldozer.kv.types import State
from bulldozer.load.engines import create_load_engine
from bulldozer.load.runner import run_job
from bulldozer.schema.compile import load_message_classes
from bulldozer.spec import load_spec_text
from bulldozer.spec.loader import LoadedSpec
from bulldozer.spec.models import CatalogConfig
from bulldozer.versioning.run_state import RUN_LABEL, beat_of
from bulldozer.warehouse.catalog import open_catalog
from bulldozer.warehouse.sample import create_sample_warehouse, overwrite_sample
from tests.conftest import REPO
from tests.faults import FaultyEngine

pytestmark = pytest.mark.integration
TEMPLATE = (REPO / "templates" / "move_data_to_kv_dal.yaml").read_text()


def spec(**replace: str) -> LoadedSpec:
    text = TEMPLATE
    for old, new in replace.items():
        text = text.replace(old.replace("_SP_", " "), new)
    return load_spec_text(text, "job.yaml", env={})


@pytest.fixture
def home(tmp_path: Path) -> Path:
    create_sample_warehouse(tmp_path, rows=3_000)
    return tmp_path


def table(home: Path) -> Any:
    return open_catalog(CatalogConfig(), home).load_table("sample.user_item_scores")


def read(client: KvClient, alias: str, key: dict[str, Any]) -> dict[str, Any] | None:
    from google.protobuf import json_format

    info = client.describe_target(alias)
    key_cls, value_cls = load_message_classes(info.value_descriptor_set, info.key_message, info.value_message)
    raw = client.get(json_format.ParseDict(key, key_cls()).SerializeToString(), alias=alias)
    return json_format.MessageToDict(value_cls.FromString(raw), preserving_proto_field_name=True) if raw else None


KEY = {"user_id": 1_000_001, "item_id": 8, "locale": "de_DE"}


def test_v1_then_v2_switches_consumers_atomically(home: Path, dal: KvClient) -> None:
    first = run_job(spec(), dal, home=str(home))
    assert first.outcome == "succeeded" and first.rows == 3_000
    v1 = read(dal, "user_item_scores", KEY)
    assert v1 is not None and v1["profile"]["address"]["city"]
    assert dal.describe(first.version).state == State.ACTIVE
    assert dal.describe(first.version).snapshot_id == table(home).current_snapshot().snapshot_id

    overwrite_sample(table(home), rows=3_000, variant=1)
    second = run_job(spec(), dal, home=str(home))
    v2 = read(dal, "user_item_scores", KEY)
    assert v2 is not None and v2 != v1 and v2["price"] != v1["price"]
    assert dal.get_alias("user_item_scores").namespace == second.version
    assert dal.describe(first.version).state == State.RETIRED  # kept readable for rollback
    record = json.loads(dal.describe(second.version).labels[RUN_LABEL])
    assert record["outcome"] == "succeeded" and record["previous"] == first.version
    assert {g["gate"] for g in record["gates"]} >= {"min_rows", "max_row_count_change", "max_null_fraction[nickname]"}
    assert set(record["timings"]) == {"schema", "create", "load", "verify", "flip", "retention"}
    # the heartbeat's last beat, written with the run's record, says the run ended
    beat = beat_of(dal.describe(second.version))
    assert beat is not None and beat.ended and beat.pid == os.getpid()


def test_a_failing_quality_gate_leaves_the_alias_on_v1(home: Path, dal: KvClient) -> None:
    first = run_job(spec(), dal, home=str(home))
    t = table(home)
    overwrite_sample(t, rows=300, variant=1)  # the table shrank by 90 %
    with pytest.raises(
        QualityGateError, match=r"max_row_count_change: 300 rows vs 3,000 .*-90\.0%|max_row_count_change"
    ):
        run_job(spec(), dal, home=str(home))
    assert dal.get_alias("user_item_scores").namespace == first.version
    failed = [n for n in dal.list_namespaces("user_item_scores") if n.state == State.FAILED]
    assert len(failed) == 1 and "quality gate failed" in failed[0].failure_reason
    assert read(dal, "user_item_scores", KEY) is not None


def test_a_dal_lost_mid_load_leaves_the_alias_and_the_version_loading(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A failure driven through the client's transport (the DAL goes away after a few
    batches): the run fails with one clear error (the DAL refusing the record of the
    failure too, for the same reason, is no second warning), the alias stays on the old
    version, and the new one stays LOADING (a resume can finish it), never SEALED or live.
    The record is tried for ``UNREACHABLE_RECORD_SECONDS``, not the client's whole timeout:
    a Redis stopped mid-load kept a run 16.6 s more before it failed, the channel retrying
    the record against the same outage."""
    from bulldozer.errors import BackendUnavailableError
    from bulldozer.kv import KvDal, create_engine
    from bulldozer.load.runner import UNREACHABLE_RECORD_SECONDS
    from tests.faults import FlakyTransport

    home = tmp_path / "h"
    create_sample_warehouse(home, rows=30_000, chunk_rows=10_000)
    dal = KvDal(create_engine({"type": "memory"}))
    healthy = KvClient.in_process(dal)
    first = run_job(spec(), healthy, home=str(home))
    transport = FlakyTransport(KvClient.in_process(dal).transport, batches=1)
    flaky = KvClient.over(transport, "flaky", timeout=60)
    with (
        caplog.at_level(logging.INFO, logger="bulldozer.run"),
        pytest.raises(BackendUnavailableError, match="not reachable"),
    ):
        run_job(spec(), flaky, home=str(home))
    unrecorded = [r for r in caplog.records if r.getMessage().startswith("could not record the failure")]
    assert [r.levelno for r in unrecorded] == [logging.INFO], caplog.text
    assert ("MarkFailed", UNREACHABLE_RECORD_SECONDS) in transport.refused, transport.refused
    assert healthy.get_alias("user_item_scores").namespace == first.version
    states = {n.name: n.state for n in healthy.list_namespaces("user_item_scores")}
    assert states.pop(first.version) == State.ACTIVE
    assert list(states.values()) == [State.LOADING]


def test_a_run_failed_by_a_stalled_store_ends_its_heartbeat_while_it_records_the_failure(tmp_path: Path) -> None:
    """A store that stops answering mid-load: the heartbeat's last beat and the record of
    the failure are tried at once, each meeting the same outage, not one after the other
    (the beat kept a run whose Redis stopped 5 s more before it failed)."""
    from bulldozer.errors import BackendUnavailableError
    from bulldozer.kv import KvDal, create_engine
    from bulldozer.versioning.run_state import HEARTBEAT_LABEL
    from tests.faults import StalledTransport

    home = tmp_path / "h"
    create_sample_warehouse(home, rows=30_000, chunk_rows=10_000)
    dal = KvDal(create_engine({"type": "memory"}))
    transport = StalledTransport(KvClient.in_process(dal).transport, batches=1, stall=1.0)
    with pytest.raises(BackendUnavailableError, match="not reachable"):
        run_job(spec(), KvClient.over(transport, "stalled", timeout=60), home=str(home))
    beats = [(start, end) for method, labels, start, end in transport.stalled if HEARTBEAT_LABEL in labels]
    records = [(start, end) for method, _, start, end in transport.stalled if method == "MarkFailed"]
    assert len(beats) == 1 and len(records) == 1, transport.stalled
    (beat_start, beat_end), (record_start, record_end) = beats[0], records[0]
    assert beat_start < record_end and record_start < beat_end, transport.stalled  # at once


def test_gc_on_a_machine_whose_clock_is_ahead_leaves_a_live_runs_version_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run beats on its DAL's clock and gc reads the beat's age on it too: gc on a machine
    whose clock is ten minutes ahead of the runner's keeps the version the run is loading
    (grace period 0), where it took the run for dead by its own clock and dropped it."""
    from bulldozer.kv import KvDal, create_engine
    from bulldozer.versioning.retention import apply_retention
    from bulldozer.versioning.run_state import HEARTBEAT_LABEL

    home = tmp_path / "h"
    create_sample_warehouse(home, rows=30_000, chunk_rows=10_000)
    dal = KvDal(create_engine({"type": "memory"}))
    runner = KvClient.in_process(dal)
    plans: list[tuple[str, Any]] = []

    def gc_meanwhile(done: int, total: int) -> None:
        loading = [n for n in runner.list_namespaces("user_item_scores") if n.state == State.LOADING]
        if plans or not loading or HEARTBEAT_LABEL not in loading[0].labels:
            return
        with monkeypatch.context() as ahead:  # the gc's machine, its clock ten minutes ahead
            shifted = lambda: datetime.now(UTC) + timedelta(minutes=10)  # noqa: E731
            ahead.setattr("bulldozer.kv.client.utcnow", shifted)
            ahead.setattr("bulldozer.versioning.retention.utcnow", shifted)
            plans.append(
                (loading[0].name, apply_retention(KvClient.in_process(dal), "user_item_scores", 1, timedelta(0)))
            )

    record = run_job(spec(), runner, home=str(home), progress=gc_meanwhile)
    assert plans, "gc did not run during the load"
    ((loading, plan),) = plans
    assert loading == record.version and loading in plan.keep and not plan.drop, plan
    assert record.outcome == "succeeded" and runner.get_alias("user_item_scores").namespace == record.version


def test_a_create_whose_answer_was_lost_is_the_runs_own(tmp_path: Path) -> None:
    """The channel retries a CreateNamespace answered UNAVAILABLE, so a create the DAL made
    whose answer was lost comes back "already exists": the run recognises the version as its
    own (its record holds this run's id) and goes on. A delta's create is not taken over (its
    base copy may not have finished): that run fails as before, with the alias untouched."""
    from bulldozer.kv import KvDal, create_engine
    from tests.faults import LostAnswerTransport

    home = tmp_path / "h"
    create_sample_warehouse(home, rows=3_000)
    dal = KvDal(create_engine({"type": "memory"}))
    healthy = KvClient.in_process(dal)
    transport = LostAnswerTransport(KvClient.in_process(dal).transport, "CreateNamespace")
    retried = KvClient.over(transport, "lost answers")
    delta = spec(**{"  source:": "  mode: delta\n  source:"})  # a full run first: no live version
    first = run_job(delta, retried, home=str(home))
    assert transport.lost == 1 and (first.outcome, first.mode, first.rows) == ("succeeded", "full", 3_000)
    assert healthy.get_alias("user_item_scores").namespace == first.version
    assert [n.state for n in healthy.list_namespaces("user_item_scores")] == [State.ACTIVE]
    overwrite_sample(table(home), rows=3_000, variant=1)
    with pytest.raises(NamespaceExistsError):
        run_job(delta, retried, home=str(home))
    assert healthy.get_alias("user_item_scores").namespace == first.version
    assert transport.lost == 2


def test_an_injected_crash_leaves_the_alias_and_marks_the_version_failed(home: Path, dal: KvClient) -> None:
    first = run_job(spec(), dal, home=str(home))
    with pytest.raises(RuntimeError, match="injected failure"):
        run_job(spec(), dal, home=str(home), engine=FaultyEngine(create_load_engine("local"), "raise", 1000))
    assert dal.get_alias("user_item_scores").namespace == first.version
    states = sorted(n.state.value for n in dal.list_namespaces("user_item_scores"))
    assert states == ["ACTIVE", "FAILED"]


def test_null_fraction_gate(home: Path, dal: KvClient) -> None:
    loaded = spec(**{"nickname: 0.5": "nickname: 0.1"})  # a fifth of nicknames are null
    with pytest.raises(QualityGateError, match=r"max_null_fraction\[nickname\]: 20\.0% of 'nickname' is null"):
        run_job(loaded, dal, home=str(home))
    with pytest.raises(Exception, match="does not point"):
        dal.get_alias("user_item_scores")


def test_duplicate_keys_are_refused_naming_a_key(home: Path, dal: KvClient) -> None:
    from bulldozer.load.runner import RunRecord
    from bulldozer.warehouse.sample import generate_sample

    t = table(home)
    t.append(generate_sample(5, variant=3).cast(t.schema().as_arrow()))  # the first 5 keys again
    failed: list[RunRecord] = []
    with pytest.raises(DuplicateKeyError, match=r'"user_id": 1000000, "item_id": \d+, "locale": "en_US"'):
        run_job(spec(), dal, home=str(home), on_failure=failed.append)
    (only,) = dal.list_namespaces("user_item_scores")
    assert only.state == State.FAILED
    # the seal refused them (the store held fewer records than the load sent); the load did
    # not look for them, and the keys were named from the hashes it kept
    (record,) = failed
    assert record.failed_stage == "verify" and record.error.startswith("verify: the source has rows sharing a key")


def test_a_load_stage_run_on_its_own_refuses_duplicate_keys(home: Path, dal: KvClient) -> None:
    """A scheduler's load task checks the keys itself: its verify task, which the seal's
    refusal would fail, may run where the load's key hashes are not."""
    from bulldozer.load.runner import run_stage
    from bulldozer.warehouse.sample import generate_sample

    t = table(home)
    t.append(generate_sample(5, variant=3).cast(t.schema().as_arrow()))
    with pytest.raises(DuplicateKeyError, match=r'"user_id": 1000000, "item_id": \d+, "locale": "en_US"'):
        run_stage("load", spec(), dal, run_key="day-1", home=str(home))
    (only,) = dal.list_namespaces("user_item_scores")
    assert only.state == State.FAILED and "load: the source has rows sharing a key" in only.failure_reason


def test_null_key_is_refused(tmp_path: Path, dal: KvClient) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    catalog = open_catalog(CatalogConfig(), tmp_path)
    catalog.create_namespace("db")
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "v", StringType(), required=False))
    t = catalog.create_table("db.nullkeys", schema=schema)
    t.append(pa.table({"id": pa.array([1, None, 3]), "v": pa.array(["a", "b", "c"])}, schema=t.schema().as_arrow()))
    text = """apiVersion: bulldozer/v1
kind: MoveDataToKvDal
metadata: {name: nullkeys, owner: tests}
data_movement: {source: {table: db.nullkeys}, key_columns: [id]}
key_value_dal: {alias: nullkeys}
bulldozer_protobuf: {package: tests.nullkeys}
"""
    with pytest.raises(SourceDataError, match="key column 'id' holds 1 null"):
        run_job(load_spec_text(text, "nullkeys.yaml"), dal, home=str(tmp_path))


def test_missing_table_is_a_clear_error(home: Path, dal: KvClient) -> None:
    with pytest.raises(TableNotFoundError, match=r"'sample\.nope' does not exist"):
        run_job(spec(**{"table:_SP_sample.user_item_scores": "table: sample.nope"}), dal, home=str(home))
    # no data was written; the refused run is kept (FAILED, empty) so `bulldozer runs` shows why
    [refused] = dal.list_namespaces()
    assert refused.state is State.FAILED and refused.record_count == 0 and "does not exist" in refused.failure_reason


def test_a_pinned_snapshot_the_table_lacks_is_named(home: Path, dal: KvClient) -> None:
    """A spec pinning a snapshot the table no longer has (expired, or the table replaced under
    its name) is told which and why, not that the table may be empty."""
    from bulldozer.errors import CatalogError

    current = table(home).current_snapshot().snapshot_id
    pinned = spec(**{"  #_SP_snapshot_id: 1234567890": "  snapshot_id: 1234567890"})
    with pytest.raises(CatalogError) as refused:
        run_job(pinned, dal, home=str(home))
    assert str(refused.value) == (
        "data_movement.snapshot_id: table 'sample.user_item_scores' has no snapshot 1234567890 (it expired, or was "
        f"never one of this table: a table replaced under the same name starts anew); its current snapshot is {current}"
    )
    [kept] = dal.list_namespaces()
    assert kept.state is State.FAILED and kept.record_count == 0


def test_a_breaking_schema_change_stops_before_anything_is_written(home: Path, dal: KvClient) -> None:
    from pyiceberg.types import DoubleType

    first = run_job(spec(), dal, home=str(home))
    with table(home).update_schema() as update:
        update.update_column("score", DoubleType())  # float -> double: fixed32 -> fixed64 on the wire
    overwrite_sample(table(home), rows=3_000, variant=1)  # a snapshot written with the new schema
    with pytest.raises(IncompatibleSchemaError, match="score: type changed"):
        run_job(spec(), dal, home=str(home))
    kept, refused = dal.list_namespaces("user_item_scores")
    assert kept.name == first.version and kept.state is State.ACTIVE  # nothing else moved
    assert refused.state is State.FAILED and refused.record_count == 0 and refused.bytes == 0
    # the refusal is listed by `bulldozer runs` with its stage and reason
    from typer.testing import CliRunner

    from bulldozer.cli.main import app

    listed = CliRunner().invoke(app, ["runs", "user_item_scores", "--endpoint", dal.target, "--json"])
    newest = json.loads(listed.stdout)[0]
    assert newest["version"] == refused.name and newest["outcome"] == "failed"
    assert newest["failed_stage"] == "schema" and "score: type changed" in newest["error"]
    table_view = CliRunner().invoke(app, ["runs", "user_item_scores", "--endpoint", dal.target, "-o", "tsv"])
    assert "schema: the new schema would break readers" in table_view.stdout


def test_a_deliberate_breaking_change_starts_a_new_schema_generation(home: Path, dal: KvClient) -> None:
    from pyiceberg.types import DoubleType
    from typer.testing import CliRunner

    from bulldozer.cli.main import app
    from bulldozer.errors import SchemaMismatchError

    first = run_job(spec(), dal, home=str(home))
    with table(home).update_schema() as update:
        update.update_column("score", DoubleType())
    overwrite_sample(table(home), rows=3_000, variant=1)
    template = str(REPO / "templates" / "move_data_to_kv_dal.yaml")
    ran = CliRunner().invoke(
        app, ["run", template, "--home", str(home), "--endpoint", dal.target, "--allow-breaking", "--json"]
    )
    assert ran.exit_code == 0, ran.output
    record = json.loads(ran.stdout)
    assert record["schema_generation"] == 2 and any("score: type changed" in c for c in record["breaking_changes"])
    second = dal.describe(record["version"])
    assert second.schema_generation == 2 and dal.get_alias("user_item_scores").namespace == second.name
    assert "breaking schema change to generation 2" in dal.alias_history("user_item_scores", 1)[0].reason
    # a reader built for generation 1 is refused with a clear error instead of misreading the doubles
    info = dal.describe(first.version)
    key_cls, _ = load_message_classes(info.value_descriptor_set, info.key_message, info.value_message)
    from google.protobuf import json_format

    key = json_format.ParseDict(KEY, key_cls()).SerializeToString()
    with pytest.raises(SchemaMismatchError, match="regenerate it"):
        dal.get(key, alias="user_item_scores", schema_generation=1)
    assert dal.get(key, alias=f"user_item_scores@{first.version}", schema_generation=1) is not None
    # the next run (same schema) stays on generation 2
    assert run_job(spec(), dal, home=str(home)).schema_generation == 2
    # a client generated now reads generation 2
    out = home / "client"
    made = CliRunner().invoke(
        app, ["client", template, "--home", str(home), "--endpoint", dal.target, "--out", str(out)]
    )
    assert made.exit_code == 0 and "schema generation 2" in made.stdout, made.output
    assert "SCHEMA_GENERATION = 2" in (out / "src" / "bulldozer_client_user_item_scores" / "_reader.py").read_text()
    again = CliRunner().invoke(
        app, ["client", template, "--home", str(home), "--schema-generation", "3", "--out", str(out), "--json"]
    )  # told the generation: no DAL asked
    assert json.loads(again.stdout)["schema_generation"] == 3, again.output
    assert "SCHEMA_GENERATION = 3" in (out / "src" / "bulldozer_client_user_item_scores" / "_reader.py").read_text()
    # a folder holding something else is not written into: a Java client replaced README.md and
    # pom.xml and deleted src/main/java whole (a service's own sources, pointed at by mistake)
    service = home / "service"
    (service / "src" / "main" / "java").mkdir(parents=True)
    (service / "README.md").write_text("ours")
    (service / "src" / "main" / "java" / "App.java").write_text("class App {}")
    told = ["client", template, "--home", str(home), "--schema-generation", "3"]
    refused = CliRunner().invoke(app, [*told, "--lang", "java", "--out", str(service)])
    assert refused.exit_code != 0 and refused.stderr == (
        f"error: --out {service} holds files `bulldozer client` did not write (README.md, src): a client "
        "replaces its folder's files and source folders, so write it into a new or empty folder\n"
    ), refused.output
    assert (service / "README.md").read_text() == "ours" and (service / "src" / "main" / "java" / "App.java").exists()
    other = CliRunner().invoke(app, [*told, "--lang", "go", "--out", str(out)])  # the Python client's folder
    assert other.exit_code != 0 and "holds the python client of 'user_item_scores', not the go client" in other.stderr
    # a rollback across the breaking change says what it does to the readers built since
    back = CliRunner().invoke(
        app, ["rollback", "user_item_scores", "--to", first.version, "--endpoint", dal.target], input="n\n"
    )
    assert back.exit_code == 1 and "(schema generation 2 → 1: the readers built for generation 2 refuse" in back.stdout
    assert dal.get_alias("user_item_scores").namespace != first.version  # not confirmed: nothing moved
    said = CliRunner().invoke(
        app, ["rollback", "user_item_scores", "--to", first.version, "--yes", "--endpoint", dal.target]
    )
    assert said.exit_code == 0 and dal.get_alias("user_item_scores").namespace == first.version
    assert "warning: schema generation 2 → 1: the readers built for generation 2 refuse the alias's reads" in (
        said.stderr
    )


def test_a_column_dropped_from_the_table_is_reported(home: Path, dal: KvClient) -> None:
    run_job(spec(), dal, home=str(home))
    with table(home).update_schema() as update:
        update.delete_column("nickname")
    overwrite_sample(table(home), rows=3_000, variant=1)
    with pytest.raises(SpecError) as refused:
        run_job(spec(), dal, home=str(home))
    # the spec's lines that name it, as validate --catalog reports them
    assert [f"{i.path}: {i.message}" for i in refused.value.issues] == [
        "data_movement.value_columns[9]: the table has no column 'nickname'",
        "key_value_dal.quality_gates.max_null_fraction.nickname: the table has no column 'nickname'",
    ]
    assert all(i.line for i in refused.value.issues)


@pytest.mark.parametrize("runs", [2, 3])
def test_concurrent_runs_of_one_job_have_exactly_one_winner(home: Path, dal: KvClient, runs: int) -> None:
    from datetime import timedelta

    from bulldozer.versioning.retention import plan_retention

    live = run_job(spec(), dal, home=str(home)).version
    for _round in range(3):
        outcomes: list[str] = []
        messages: list[tuple[str, str]] = []
        barrier = threading.Barrier(runs)

        def one(
            barrier: threading.Barrier = barrier,
            outcomes: list[str] = outcomes,
            messages: list[tuple[str, str]] = messages,
        ) -> None:
            def on_stage(stage: str) -> None:
                if stage == "flip":
                    barrier.wait(timeout=60)  # all reach the flip together

            failed: list[Any] = []
            try:
                outcomes.append(
                    run_job(spec(), dal, home=str(home), on_stage=on_stage, on_failure=failed.append).version
                )
            except AliasConflictError as lost:
                outcomes.append("conflict")
                messages.append((failed[0].version, str(lost)))

        threads = [threading.Thread(target=one) for _ in range(runs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [o for o in outcomes if o != "conflict"]
        assert len(winners) == 1 and outcomes.count("conflict") == runs - 1
        for own, message in messages:  # a loser names its own version and the winner
            assert message.startswith(f"{own} was verified but not made live") and winners[0] in message
        assert dal.get_alias("user_item_scores").namespace == winners[0] != live
        history = dal.alias_history("user_item_scores", limit=1)
        assert (history[0].from_namespace, history[0].to_namespace) == (live, winners[0])  # exactly one flip
        live = winners[0]
    states = [n.state.value for n in dal.list_namespaces("user_item_scores")]
    assert states.count("LOADING") == 0 and states.count("ACTIVE") == 1  # the losers are FAILED
    plan = plan_retention(dal.list_namespaces("user_item_scores"), 2, timedelta(0))  # what gc does
    for name in plan.drop:
        dal.drop(name)
    left = sorted(n.state.value for n in dal.list_namespaces("user_item_scores") if n.state.value != "DROPPED")
    assert left == ["ACTIVE", "RETIRED", "RETIRED"]  # no LOADING or FAILED namespace survives gc


def test_retention_keeps_n_versions_and_drops_the_rest(home: Path, dal: KvClient) -> None:
    loaded = spec(**{"keep_versions: 2": "keep_versions: 1", "grace_period: 24h": "grace_period: 0s"})
    versions = [run_job(loaded, dal, home=str(home)).version for _ in range(4)]
    states = {n.name: n.state for n in dal.list_namespaces("user_item_scores")}
    assert states[versions[3]] == State.ACTIVE and states[versions[2]] == State.RETIRED
    assert states[versions[0]] == states[versions[1]] == State.DROPPED


def test_a_plan_says_which_versions_the_run_s_retention_keeps(home: Path, dal: KvClient) -> None:
    """The dry run retires the live version in its head before applying retention. It did so
    keeping the time and generation of the flip that made it live, which are the same as the
    version retired by that flip: the two tied, and the plan said the run would drop the live
    version (about to be the rollback target) and keep the older one."""
    from bulldozer.load.plan import plan_run

    loaded = spec(**{"keep_versions: 2": "keep_versions: 1", "grace_period: 24h": "grace_period: 0s"})
    older, live = (run_job(loaded, dal, home=str(home)).version for _ in range(2))
    plan = plan_run(loaded, dal, str(home))
    assert (plan.live_version, plan.retention_drops_now, plan.retention_keeps) == (live, [older], [live])


# ------------------------------------------------------------ the command line


def _cli(
    args: list[str], home: Path, env: dict[str, str] | None = None, fault: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``bulldozer ARGS`` in its own process; with ``fault``, failing as ``tests.faults`` says."""
    command = ["tests.faults", fault] if fault else ["bulldozer.cli.main"]
    return subprocess.run(
        [sys.executable, "-m", *command, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BULLDOZER_HOME": str(home), **(env or {})},
        cwd=REPO,
    )


@pytest.mark.parametrize("name", ["a b", "c{d}", "données", "g%20h"])
def test_a_home_whose_path_a_uri_would_encode_keeps_every_file_inside_it(name: str, tmp_path: Path) -> None:
    """The embedded catalog's warehouse was its folder's ``file:`` URI, percent-encoded, and
    pyiceberg writes a location's path as it stands: a home named ``a b`` had its tables'
    files written in ``a%20b`` beside it. Its SQLite file's URL was not encoded, and
    SQLAlchemy decodes it: a home named ``g%20h`` opened ``g h``. Every file of the sample
    table and of a run now lies under the home, and the run loads the table."""
    home = tmp_path / name
    made = _cli(["warehouse", "sample", "--rows", "1000", "--json"], home)
    assert made.returncode == 0, made.stderr
    result = _cli(["run", "templates/move_data_to_kv_dal.yaml", "--json", "-q"], home)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["rows"] == 1_000
    assert [p.name for p in tmp_path.iterdir()] == [name]  # nothing beside the home
    data = list((home / "warehouse").rglob("*.parquet"))
    assert data and (home / "catalog.db").is_file()


@pytest.mark.parametrize("name", ["e#f", "i?j"])
def test_a_home_whose_path_would_end_a_uri_early_is_refused_in_one_line(name: str, tmp_path: Path) -> None:
    """A ``#`` or ``?`` ends a ``file:`` location's path for pyiceberg: a home named ``i?j``
    had its SQLite catalog made as the file ``i`` beside it. Refused, nothing made."""
    home = tmp_path / name
    made = _cli(["warehouse", "sample", "--rows", "300"], home)
    assert made.returncode == 1, made.stderr
    assert made.stderr.strip() == (
        f"error: the embedded catalog cannot live under {str(home)!r}: Iceberg's file locations are URIs, in which "
        f"{name[1]!r} would end the path; choose a home without them (--home, BULLDOZER_HOME)"
    )
    assert [p.name for p in tmp_path.iterdir()] in ([], [name])  # nothing beside the home
    assert not (home / "catalog.db").exists()


#: commands that read or change what exists, and runs that cannot start, on a home with nothing in it: (args, exit code, what stdout or stderr says)
READERS = [
    (["namespaces", "--json"], 0, "[]"),
    (["runs", "user_item_scores"], 0, "runs of user_item_scores: none"),
    (["gc"], 0, "nothing to drop"),
    (["jobs"], 0, "no jobs submitted"),
    (["alias", "show", "user_item_scores"], 1, "error: alias 'user_item_scores' does not point at any version yet"),
    (["get", "user_item_scores", "--key", json.dumps(KEY)], 1, "does not point at any version yet"),
    (["rollback", "user_item_scores", "--yes"], 1, "does not point at any version yet"),
    (["validate", "templates/move_data_to_kv_dal.yaml", "--catalog"], 2, "there is no embedded catalog under"),
    (["plan", "templates/move_data_to_kv_dal.yaml"], 1, "error: there is no embedded catalog under"),
    (["proto", "templates/move_data_to_kv_dal.yaml"], 1, "error: there is no embedded catalog under"),
    # a run, or its first stages, cannot start without the table: said before the store is made
    (["run", "templates/move_data_to_kv_dal.yaml", "-q"], 1, "error: there is no embedded catalog under"),
    (["run", "templates/move_data_to_kv_dal.yaml", "--stage", "load", "--run-key", "k"], 1, "no embedded catalog"),
    (["run", "templates/move_data_to_kv_dal.yaml", "--resume", "0a925f", "-q"], 1, "no embedded catalog"),
    (["run", "templates/move_data_to_kv_dal.yaml", "--stage", "flip", "--version", "abc", "-q"], 1, "does not exist"),
]


def test_commands_that_read_make_nothing_in_a_home_without_a_store(tmp_path: Path) -> None:
    """A read on a home with no embedded store or catalog (a mistyped ``--home``, or no run
    yet) made both there: the store and its logs folder for the DAL started to answer it, the
    catalog's SQLite file and warehouse folder for the catalog opened — ``plan`` too, which
    says it writes nothing. It now answers as for an empty store, or says in one line that
    there is no catalog there, and the home is never made."""
    home = tmp_path / "typo"
    env = {**os.environ, "BULLDOZER_HOME": str(home)}
    started = [
        (args, code, says, subprocess.Popen([sys.executable, "-m", "bulldozer.cli.main", *args], env=env, cwd=REPO,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for args, code, says in READERS
    ]  # fmt: skip
    for args, code, says, proc in started:
        out, err = proc.communicate(timeout=300)
        assert (proc.returncode, "Traceback" in err) == (code, False), (args, err)
        assert says in out + err, (args, out, err)
        if code:
            assert len(err.strip().splitlines()) == 1, (args, err)
    assert not home.exists(), sorted(p.name for p in home.rglob("*"))


def test_a_run_on_a_store_whose_catalog_is_gone_records_its_failure(tmp_path: Path) -> None:
    """Where the home has a store, a run that finds no catalog there fails as any run does:
    its version FAILED and its run record kept, for ``bulldozer runs`` (only a home with
    neither is left unmade)."""
    home = tmp_path / "h"
    create_sample_warehouse(home, rows=2_000)
    assert _cli(["run", "templates/move_data_to_kv_dal.yaml", "-q"], home).returncode == 0
    (home / "catalog.db").unlink()
    failed = _cli(["run", "templates/move_data_to_kv_dal.yaml", "-q"], home)
    assert failed.returncode == 1 and "there is no embedded catalog under" in failed.stderr
    runs = json.loads(_cli(["runs", "user_item_scores", "--json"], home).stdout)
    assert [r["outcome"] for r in runs] == ["failed", "succeeded"]
    assert "no embedded catalog" in runs[0]["error"]


def test_cli_run_get_runs_on_the_embedded_default(tmp_path: Path) -> None:
    home = tmp_path / "h"
    create_sample_warehouse(home, rows=2_000)
    result = _cli(["run", "templates/move_data_to_kv_dal.yaml", "--json"], home)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["outcome"] == "succeeded" and record["rows"] == 2_000
    got = _cli(["get", "user_item_scores", "--key", json.dumps(KEY)], home)
    assert got.returncode == 0, got.stderr
    value = json.loads(got.stdout)
    assert value["profile"]["tier"] in {"free", "basic", "premium"}
    # readable values: ISO dates and timestamps, uuids as text, decimals exact, int64 as numbers
    assert date.fromisoformat(value["signup_date"]) and str(uuid.UUID(value["session_id"])) == value["session_id"]
    assert datetime.fromisoformat(value["updated_at"]).tzinfo is None and value["event_time"].endswith("Z")
    assert isinstance(value["recent_orders"][0]["order_id"], int) and isinstance(value["price"], str)
    assert isinstance(value["attributes"], dict) and len(str(value["score"])) < 12  # float32 printed shortest
    pinned = _cli(["get", f"user_item_scores@{record['version']}", "--key", json.dumps(KEY)], home)
    assert json.loads(pinned.stdout) == json.loads(got.stdout)
    missing = _cli(["get", "user_item_scores", "--key", '{"user_id": 1}'], home)
    assert missing.returncode == 2 and "missing: item_id, locale" in missing.stderr
    typo = _cli(["get", "user_item_scores", "--key", json.dumps({**KEY, "userid": 1})], home)
    assert typo.returncode == 2 and typo.stderr.strip().splitlines()[-1] == (
        "error: --key: the key has no field 'userid' (did you mean 'user_id'?); its fields are user_id, item_id, locale"
    )
    null = _cli(["get", "user_item_scores", "--key", json.dumps({**KEY, "locale": None})], home)
    assert null.returncode == 2 and null.stderr.strip().splitlines()[-1] == (  # it said "no value for that key"
        "error: --key: the key's 'locale' is null; no key field is (a key with a null is not loaded)"
    )
    twice = _cli(["get", "user_item_scores", "--key", json.dumps(KEY)[:-1] + ', "user_id": 5}'], home)
    assert twice.returncode == 2 and twice.stderr.strip() == (  # it read the last, silently
        "error: --key: the key names 'user_id' more than once"
    )
    deep = _cli(["get", "user_item_scores", "--key", "[" * 5_000], home)  # the parser's recursion, not a traceback
    assert deep.returncode == 2 and deep.stderr.strip() == "error: --key: the key is nested too deeply to be a key"
    runs = _cli(["runs", "user_item_scores", "--json"], home)
    assert json.loads(runs.stdout)[0]["version"] == record["version"]


def test_an_alias_serves_one_job_until_it_is_handed_over(tmp_path: Path) -> None:
    """Two teams choosing one alias name: the second job's run would flip the first's
    consumers to its data and its retention would drop the first's versions. It is refused
    in one line at key_value_dal.alias, before anything is made; ``--take-over`` hands the
    alias over deliberately, recorded in the alias history, and then the first job is the
    one refused."""
    home = tmp_path / "h"
    create_sample_warehouse(home, rows=2_000)
    first = _cli(["run", "templates/move_data_to_kv_dal.yaml", "--json"], home)
    assert first.returncode == 0, first.stderr
    v1 = json.loads(first.stdout)["version"]
    other = tmp_path / "other_team.yaml"
    other.write_text(TEMPLATE.replace("name: user_item_scores ", "name: other_team ", 1))
    refused = _cli(["run", str(other), "-q"], home)
    said = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(said) == 1, refused.stderr
    assert (
        said[0].startswith(f"{other}:")
        and "key_value_dal.alias: the alias 'user_item_scores' serves the job" in said[0]
    )
    assert "--take-over" in said[0]
    versions = json.loads(_cli(["namespaces", "user_item_scores", "--json"], home).stdout)
    # nothing loaded: the refused run is kept as an empty FAILED record, as refused runs are
    assert [(v["state"], v["record_count"]) for v in versions if v["name"] != v1] == [("FAILED", 0)]
    assert json.loads(_cli(["alias", "history", "user_item_scores", "--json"], home).stdout)[0]["to_namespace"] == v1
    planned = _cli(["plan", str(other)], home)  # the dry run says so too
    assert planned.returncode == 2 and "refused: the alias serves the job user_item_scores" in planned.stdout
    taken = _cli(["run", str(other), "--take-over", "--json"], home)
    assert taken.returncode == 0, taken.stderr
    record = json.loads(taken.stdout)
    assert record["taken_over_from"] == "user_item_scores" and record["previous"] == v1
    history = json.loads(_cli(["alias", "history", "user_item_scores", "--json"], home).stdout)
    assert "taken over from the job 'user_item_scores'" in history[0]["reason"]  # newest first
    back = _cli(["run", "templates/move_data_to_kv_dal.yaml", "-q"], home)  # now the first job is another's
    assert back.returncode == 2 and "serves the job 'other_team'" in back.stderr
    again = _cli(["run", str(other), "--json"], home)  # the job the alias serves runs as ever
    assert again.returncode == 0 and json.loads(again.stdout)["taken_over_from"] == ""


def test_cli_failure_is_one_clear_line(tmp_path: Path) -> None:
    home = tmp_path / "h"
    create_sample_warehouse(home, rows=500)  # below the template's min_rows of 1000
    result = _cli(["run", "templates/move_data_to_kv_dal.yaml"], home)
    assert result.returncode != 0
    assert "quality gate failed: min_rows: 500 rows (minimum 1,000)" in result.stderr
    assert "Traceback" not in result.stderr


def _dal_processes(store: Path) -> list[int]:
    """Pids of the processes serving ``store``: ``bulldozer serve``, or ``bulldozer-kvd`` in
    front of a DAL hosted in the command's own process."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (b"serve" in argv and str(store).encode() in argv) or b"--store=%s" % str(store).encode() in argv:
            found.append(int(proc.name))
    return found


def test_a_killed_run_is_resumed(tmp_path: Path) -> None:
    home = tmp_path / "h"
    create_sample_warehouse(home, rows=30_000, chunk_rows=10_000)  # three data files: three splits
    killed = _cli(["run", "templates/move_data_to_kv_dal.yaml", "-q"], home, fault="kill-after-rows:15000")
    assert killed.returncode == -9
    # the data plane the killed run had started notices its parent is gone and stops
    deadline = time.monotonic() + 15
    while _dal_processes(home / "kv") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _dal_processes(home / "kv") == []
    listing = _cli(["runs", "user_item_scores", "--json"], home)
    (version,) = [r["version"] for r in json.loads(listing.stdout) if r["state"] == "LOADING"]
    # resumed with another text of the spec (a value column dropped), the version would hold
    # records of both schemas and still pass its seal: refused, and the version stays resumable
    changed = tmp_path / "changed.yaml"
    changed.write_text((REPO / "templates" / "move_data_to_kv_dal.yaml").read_text().replace("    - is_active\n", ""))
    refused = _cli(["run", str(changed), "--resume", version], home)
    assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1].startswith(
        f"error: cannot resume {version!r}: another text of the spec began it"
    ), refused.stderr
    resumed = _cli(["run", "templates/move_data_to_kv_dal.yaml", "--resume", version, "--json"], home)
    assert resumed.returncode == 0, resumed.stderr
    record = json.loads(resumed.stdout)
    assert record["resumed"] is True and record["rows"] == 30_000 and record["version"] == version
    runs = json.loads(_cli(["runs", "user_item_scores", "--json"], home).stdout)
    assert [(r["version"], r["state"]) for r in runs] == [(version, "ACTIVE")]


def test_a_resume_after_the_tables_schema_changed_is_refused(tmp_path: Path) -> None:
    """Between a killed run and its resume, ``score`` is promoted from float to double and the
    table rewritten: the resume reads the schema at the current snapshot and the rows at its
    own, so its records would be encoded as doubles beside the first attempt's floats (its
    seal passes: it measures what was written). Refused in one line; the version stays."""
    from pyiceberg.types import DoubleType

    home = tmp_path / "h"
    create_sample_warehouse(home, rows=30_000, chunk_rows=10_000)
    killed = _cli(["run", "templates/move_data_to_kv_dal.yaml", "-q"], home, fault="kill-after-rows:15000")
    assert killed.returncode == -9
    (version,) = [r["version"] for r in json.loads(_cli(["runs", "user_item_scores", "--json"], home).stdout)]
    table = open_catalog(CatalogConfig(), home).load_table("sample.user_item_scores")
    with table.update_schema() as update:
        update.update_column("score", DoubleType())
    table.overwrite(table.scan().to_arrow().cast(table.schema().as_arrow()))
    refused = _cli(["run", "templates/move_data_to_kv_dal.yaml", "--resume", version], home)
    assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1] == (
        f"error: cannot resume {version!r}: its records are encoded for another schema (the table's schema "
        "changed since it was begun), and a version resumed now would hold records of both; start a new run"
    ), refused.stderr
    (run,) = json.loads(_cli(["runs", "user_item_scores", "--json"], home).stdout)
    assert (run["version"], run["state"]) == (version, "LOADING")


@contextlib.contextmanager
def _slow_run(tmp_path: Path, home: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A run of 30,000 rows at 3,000 a second in its own process, once its version exists:
    (the process, the LOADING version)."""
    create_sample_warehouse(home, rows=30_000, chunk_rows=10_000)
    job = tmp_path / "slow.yaml"
    job.write_text(TEMPLATE.replace("# records_per_second: 50000", "records_per_second: 3000"))
    run = subprocess.Popen(
        [sys.executable, "-m", "bulldozer.cli.main", "run", str(job), "-q"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "BULLDOZER_HOME": str(home)},
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 60
        loading: list[str] = []
        while not loading and time.monotonic() < deadline:
            time.sleep(0.2)
            listed = _cli(["namespaces", "--json"], home)
            loading = [n["name"] for n in json.loads(listed.stdout or "[]") if n["state"] == "LOADING"]
        assert loading, "the run never made its version"
        yield run, loading[0]
    finally:
        run.kill()


def test_a_version_dropped_under_its_run_is_said_so(tmp_path: Path) -> None:
    """An operator drops the version a run is loading (``namespace drop``): the run ends
    with one line saying so (it said the namespace ``does not exist``, after a warning that
    the failure could not be recorded), and ``runs`` shows it failed (it showed "running"
    for ever: a dropped version keeps no labels written after)."""
    home = tmp_path / "h"
    with _slow_run(tmp_path, home) as (run, loading):
        dropped = _cli(["namespace", "drop", loading, "--yes"], home)
        assert dropped.returncode == 0, dropped.stderr
        _, stderr = run.communicate(timeout=120)
    assert run.returncode == 1
    assert stderr.strip().splitlines() == [
        f"error: {loading} was dropped while this run made it (bulldozer namespace drop, or gc); "
        "the alias was not moved"
    ], stderr
    (record,) = json.loads(_cli(["runs", "user_item_scores", "--json"], home).stdout)
    assert (record["state"], record["outcome"]) == ("DROPPED", "failed") and "dropped" in record["error"], record


def test_gc_leaves_a_version_its_run_is_making(tmp_path: Path) -> None:
    """``gc`` (or another run's retention) while a run loads: the version changed state
    longer ago than ``--grace``, but its run beats (``run_state.Heartbeat``), so it is kept
    and the run goes live. It was dropped under the run — any load outliving the grace
    period (24 h by default; a Spark load of a day) ended so."""
    home = tmp_path / "h"
    with _slow_run(tmp_path, home) as (run, loading):
        time.sleep(1.5)  # older than the grace period below
        swept = _cli(["gc", "--grace", "1s", "--json"], home)
        assert swept.returncode == 0, swept.stderr
        assert json.loads(swept.stdout)["dropped"] == {}
        _, stderr = run.communicate(timeout=120)
    assert run.returncode == 0, stderr
    (record,) = json.loads(_cli(["runs", "user_item_scores", "--json"], home).stdout)
    assert (record["version"], record["state"], record["rows"]) == (loading, "ACTIVE", 30_000)


def test_a_version_its_run_is_making_is_not_resumed_beside_it(tmp_path: Path) -> None:
    """``--resume V`` (or a scheduler's retry of a load taken for lost) while the run making
    V is alive: two runs would load one version, and the first to seal would fail the other
    and itself. Refused in one line naming the process; the run goes live. (A run killed on
    this machine is resumed at once: ``test_a_killed_run_is_resumed``.)"""
    home = tmp_path / "h"
    with _slow_run(tmp_path, home) as (run, loading):
        beside = _cli(["run", str(tmp_path / "slow.yaml"), "--resume", loading, "-q"], home)
        assert beside.returncode == 1, beside.stderr
        (line,) = beside.stderr.strip().splitlines()
        assert re.fullmatch(
            rf"error: cannot resume '{loading}': a run is making it now \(process {run.pid} on \S+ wrote its "
            r"heartbeat \d+ s ago\); resume it once that run has ended, or has been silent for 2 minutes",
            line,
        ), line
        _, stderr = run.communicate(timeout=120)
    assert run.returncode == 0, stderr
    (record,) = json.loads(_cli(["runs", "user_item_scores", "--json"], home).stdout)
    assert (record["version"], record["state"], record["resumed"]) == (loading, "ACTIVE", False)


@pytest.mark.parametrize(
    ("signal_", "code", "said"),
    [
        ("SIGTERM", 143, "error: terminated"),
        ("SIGHUP", 129, "error: terminated (SIGHUP: the terminal it ran in hung up)"),
    ],
)
def test_a_terminated_run_stops_cleanly_and_the_next_run_succeeds(
    tmp_path: Path, signal_: str, code: int, said: str
) -> None:
    """SIGTERM (a scheduler stopping its task) or SIGHUP (the terminal the run was started
    in closed) mid-load: one line, exit 128 + the signal, the alias where it was, the run
    recorded as failed, the data plane stopped and the temporary files removed before the
    command exits. SIGHUP used to end the process on the spot, saying nothing: its version
    was left LOADING, "not heard from"."""
    home = tmp_path / "h"
    create_sample_warehouse(home, rows=30_000, chunk_rows=10_000)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    job = ["run", "templates/move_data_to_kv_dal.yaml", "-q"]
    fault = f"{signal_.removeprefix('SIG').lower()}-after-rows:15000"
    stopped = _cli(job, home, env={"TMPDIR": str(scratch)}, fault=fault)
    assert stopped.returncode == code, stopped.stderr
    assert stopped.stderr.strip().splitlines() == [said]
    assert _dal_processes(home / "kv") == []  # stopped, not left to notice its parent is gone
    assert list(scratch.iterdir()) == []
    (run,) = json.loads(_cli(["runs", "user_item_scores", "--json"], home).stdout)
    assert run["state"] == "FAILED" and signal_ in run["error"], run
    again = _cli([*job[:-1], "--json"], home)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["rows"] == 30_000


def test_a_run_whose_terminal_hangs_up_is_recorded_as_failed_and_cleans_up(tmp_path: Path) -> None:
    """The terminal a run was started in closes (an SSH session dropped) mid-load: the kernel
    sends it SIGHUP, and every write to its terminal fails (EIO). It ended on the spot,
    its version left LOADING; then, once it unwound, its last lines' EIO turned its exit into
    1. Now it unwinds as on SIGTERM, its streams pointed at the null device: exit 129, the
    run recorded as failed, the DAL it started stopped."""
    hang_up_mid_load(tmp_path)


def hang_up_mid_load(tmp_path: Path, *run_args: str) -> None:
    """``bulldozer run RUN_ARGS`` in a pseudo-terminal of its own, which hangs up once the
    run's version is LOADING: the run exits 129, recorded as FAILED for SIGHUP, and leaves
    no DAL running. The terminal is read all along (a run blocks on a terminal nobody reads)."""
    import pty

    home = tmp_path / "h"
    create_sample_warehouse(home, rows=30_000, chunk_rows=10_000)
    job = tmp_path / "slow.yaml"
    job.write_text(TEMPLATE.replace("# records_per_second: 50000", "records_per_second: 3000"))
    env = {**os.environ, "BULLDOZER_HOME": str(home), "BULLDOZER_LOADER": "off"}
    pid, terminal = pty.fork()  # the child leads a session whose terminal is the pty
    if pid == 0:
        os.chdir(REPO)
        os.execve(sys.executable, [sys.executable, "-m", "bulldozer.cli.main", "run", str(job), *run_args], env)
    reading = threading.Event()
    reading.set()

    def read() -> None:  # what the run shows: its progress bar
        while reading.is_set():
            if select.select([terminal], [], [], 0.1)[0]:
                try:
                    os.read(terminal, 1 << 20)
                except OSError:
                    return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        loading: list[str] = []
        deadline = time.monotonic() + 120
        while not loading and time.monotonic() < deadline:
            listed = _cli(["namespaces", "--json"], home)
            loading = [n["name"] for n in json.loads(listed.stdout or "[]") if n["state"] == "LOADING"]
        assert loading, "the run never made its version"
        assert os.waitpid(pid, os.WNOHANG)[0] == 0, "the run ended before its terminal hung up"
    finally:
        reading.clear()
        reader.join()
        os.close(terminal)  # the terminal hangs up
    deadline = time.monotonic() + 60
    while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    if ended[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError("the run did not end after its terminal hung up")
    assert os.waitstatus_to_exitcode(ended[1]) == 129
    assert _dal_processes(home / "kv") == []
    listed = _cli(["runs", "user_item_scores", "--json"], home)
    (run,) = json.loads(listed.stdout)
    assert run["version"] == loading[0] and run["state"] == "FAILED" and "SIGHUP" in run["error"], run


#: a query that computes for hours before its first row: every row of the table with every
#: number up to 10^11, counted per user
_ENDLESS_QUERY = (
    "SELECT s.user_id, count(*) AS n FROM sample.user_item_scores s, range(100000000000) r GROUP BY s.user_id"
)


def _endless_job(tmp_path: Path, home: Path, duplicate_keys: str = "fail", metadata: str = "") -> Path:
    """A spec whose query computes for hours before its first row, over a sample warehouse."""
    create_sample_warehouse(home, rows=1_000)
    job = tmp_path / "endless.yaml"
    job.write_text(
        f"apiVersion: bulldozer/v1\nkind: MoveDataToKvDal\nmetadata: {{name: endless, owner: a@example.com{metadata}}}\n"
        f"data_movement:\n  catalog: {{name: lake}}\n  source: {{query: '{_ENDLESS_QUERY}'}}\n"
        f"  key_columns: [user_id]\n  duplicate_keys: {duplicate_keys}\n"
        "key_value_dal: {alias: endless}\nbulldozer_protobuf: {package: endless, key_message: K, value_message: V}\n"
    )
    return job


@pytest.mark.parametrize(
    ("duplicate_keys", "stage"),
    [("fail", "load"), ("{policy: keep_latest, order_by: n}", "schema")],
    ids=["reading-its-rows", "checking-keep-latest-ties"],
)
def test_a_run_whose_query_computes_for_hours_stops_when_terminated(
    tmp_path: Path, duplicate_keys: str, stage: str
) -> None:
    """SIGTERM while DuckDB computes a query's first rows: on the load's reader thread the
    run waited for the query (hours), and in the main thread (keep_latest's tie check before
    the load) DuckDB made the signal its own "RuntimeError: Query interrupted", a failed run
    and exit 1. Both now stop as any terminated run does, at once."""
    home = tmp_path / "h"
    job = _endless_job(tmp_path, home, duplicate_keys)
    run = subprocess.Popen(
        [sys.executable, "-m", "bulldozer.cli.main", "run", str(job)],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "BULLDOZER_HOME": str(home)},
        cwd=REPO,
    )
    try:
        assert run.stderr is not None
        lines = []
        while not lines or lines[-1] != f"· {stage}":
            line = run.stderr.readline()
            assert line, lines
            lines.append(line.strip())
        time.sleep(2)  # the query is computing
        run.send_signal(signal.SIGTERM)
        _, rest = run.communicate(timeout=30)
    finally:
        run.kill()
    assert run.returncode == 143, rest
    assert rest.strip().splitlines() == ["error: terminated"]
    records = json.loads(_cli(["runs", "endless", "--json"], home).stdout)
    if stage == "load":  # stopped before it made a version, keep_latest's run recorded nothing
        (record,) = records
        assert record["state"] == "FAILED" and "SIGTERM" in record["error"], record
    else:
        assert records == []


@pytest.mark.parametrize(
    ("metadata", "env", "limit"),
    [
        (", timeout: 4s", {}, "4s (metadata.timeout)"),
        ("", {"BULLDOZER_RUN_TIMEOUT": "4"}, "4s (BULLDOZER_RUN_TIMEOUT)"),
        (", timeout: 4s", {"BULLDOZER_RUN_TIMEOUT": "1h"}, "4s (metadata.timeout)"),
    ],
    ids=["the-spec-s", "the-operator-s", "the-spec-s-shorter-than-the-operator-s"],
)
def test_a_run_past_its_time_limit_is_stopped_and_failed(
    tmp_path: Path, metadata: str, env: dict[str, str], limit: str
) -> None:
    """A spec's query that computes for hours held a scheduler's worker as long: the run
    stops once its time limit has passed, fails its version in one line, and leaves the
    alias where it was (and the next run runs)."""
    home = tmp_path / "h"
    job = _endless_job(tmp_path, home, metadata=metadata)
    started = time.monotonic()
    stopped = _cli(["run", str(job), "-q", "--json"], home, env=env)
    assert stopped.returncode == 1, stopped.stderr
    assert stopped.stderr.strip().splitlines() == [f"error: the run took longer than its time limit, {limit}"]
    said = json.loads(stopped.stdout)  # the run record, as for any failed run
    assert (said["outcome"], said["stage"], said["error_type"], said["exit_code"]) == (
        "failed",
        "load",
        "TimeLimitExceeded",
        1,
    ), said
    assert said["reason"] == f"the run took longer than its time limit, {limit}"
    assert time.monotonic() - started < 60
    assert _dal_processes(home / "kv") == []
    (record,) = json.loads(_cli(["runs", "endless", "--json"], home).stdout)
    assert record["state"] == "FAILED" and record["error"] == (
        f"load: TimeLimitExceeded: the run took longer than its time limit, {limit}"
    ), record
    shown = _cli(["alias", "show", "endless"], home)
    assert shown.returncode == 1 and "does not point at any version yet" in shown.stderr, shown.stderr


def test_an_error_a_clean_up_raises_as_the_time_limit_unwinds_does_not_hide_it(home: Path, dal: KvClient) -> None:
    """pyspark's RDD collect() resets its call site on the JVM as the time limit unwinds
    through it, over py4j connections the interruption has just shut: its "Answer from Java
    side is empty" error replaced the time limit, and the run failed with that line. The
    interruption is what the run raises and records; the version is FAILED."""
    from bulldozer.cli.process import TimeLimitExceeded

    limit = "the run took longer than its time limit, 20s (metadata.timeout)"

    def stopped(done: int, total: int) -> None:
        if done:
            try:
                raise TimeLimitExceeded(limit)
            finally:
                raise RuntimeError("Answer from Java side is empty")  # as py4j's, in the clean-up

    with pytest.raises(TimeLimitExceeded, match=re.escape(limit)):
        run_job(spec(), dal, home=str(home), progress=stopped)
    (version,) = dal.list_namespaces("user_item_scores")
    assert version.state == State.FAILED and version.failure_reason == f"load: TimeLimitExceeded: {limit}"


def test_a_spec_may_not_ask_for_more_time_than_the_operator_allows(tmp_path: Path) -> None:
    home = tmp_path / "h"
    job = _endless_job(tmp_path, home, metadata=", timeout: 2h")
    for command in (["validate", str(job)], ["run", str(job)]):
        refused = _cli(command, home, env={"BULLDOZER_RUN_TIMEOUT": "1h30m"})
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.strip().splitlines() == [
            f"{job}:3:49: metadata.timeout: 2h is longer than a run may take here: at most 1h30m "
            "(the operator's BULLDOZER_RUN_TIMEOUT)"
        ]
    assert json.loads(_cli(["runs", "endless", "--json"], home).stdout) == []


def test_resume_refuses_a_version_that_is_not_loading(tmp_path: Path) -> None:
    home = tmp_path / "h"
    create_sample_warehouse(home, rows=1_500)
    done = json.loads(_cli(["run", "templates/move_data_to_kv_dal.yaml", "--json"], home).stdout)
    again = _cli(["run", "templates/move_data_to_kv_dal.yaml", "--resume", done["version"]], home)
    assert again.returncode != 0 and "only a LOADING version of this job" in again.stderr
    assert "it is ACTIVE" in again.stderr


def test_run_json_prints_a_record_on_failure_too(tmp_path: Path) -> None:
    home = tmp_path / "h"
    create_sample_warehouse(home, rows=1_500)
    gated = tmp_path / "gated.yaml"
    gated.write_text(TEMPLATE.replace("min_rows: 1000", "min_rows: 5000"))
    refused = _cli(["run", str(gated), "--json"], home)
    assert refused.returncode == 1, refused.stderr
    record = json.loads(refused.stdout)
    assert (record["outcome"], record["stage"], record["error_type"]) == ("failed", "verify", "QualityGateError")
    assert record["version"].startswith("user_item_scores__v") and "min_rows" in record["reason"]
    assert refused.stderr.strip().splitlines()[-1].startswith("error: ")

    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(TEMPLATE.replace("  alias: user_item_scores", "  alias: Not-Valid"))
    refused = _cli(["run", str(invalid), "--json"], home)
    assert refused.returncode == 2, refused.stderr
    record = json.loads(refused.stdout)
    assert (record["outcome"], record["stage"], record["version"]) == ("failed", "validate", "")
    assert "key_value_dal.alias" in record["reason"]


def test_plan_is_a_dry_run(home: Path, dal: KvClient) -> None:
    from bulldozer.load.plan import plan_run

    first = plan_run(spec(), dal, str(home))
    assert (first.rows, first.live_version, first.schema_differences) == (3_000, None, [])
    assert "default estimate" in first.rate_source
    assert dal.list_namespaces() == []  # nothing written
    done = run_job(spec(), dal, home=str(home))
    again = plan_run(spec(**{"    - payload\n": ""}), dal, str(home))
    assert again.live_version == done.version and again.live_rows == 3_000
    assert "measured by local run" in again.rate_source
    # each engine from its own runs: no Spark run measured anything yet
    on_spark = plan_run(spec(), dal, str(home), engine="spark")
    assert on_spark.engine == "spark" and "no earlier spark run" in on_spark.rate_source
    assert [(d["path"], d["change"], d["verdict"]) for d in again.schema_differences] == [
        ("ValueMessage.payload", "field dropped", "allowed")
    ]
    assert [n.name for n in dal.list_namespaces()] == [done.version]


def test_the_dal_going_away_mid_load(tmp_path: Path) -> None:
    from bulldozer.errors import BackendUnavailableError
    from tests.integration.test_kv_server import _free_port, _start

    home = tmp_path / "h"
    create_sample_warehouse(home, rows=30_000, chunk_rows=10_000)
    store, port = tmp_path / "store", _free_port()
    server = _start(store, port)
    loaded = spec()
    with KvClient(f"127.0.0.1:{port}", timeout=10) as client:
        first = run_job(loaded, client, home=str(home))

        def kill_dal(done: int, total: int) -> None:
            if done >= 12_000 and server.poll() is None:
                server.kill()
                server.wait()

        with pytest.raises(BackendUnavailableError):
            run_job(loaded, client, home=str(home), progress=kill_dal)
    server = _start(store, port)  # the DAL comes back
    try:
        with KvClient(f"127.0.0.1:{port}") as client:
            assert client.get_alias("user_item_scores").namespace == first.version  # never moved
            (stuck,) = [n for n in client.list_namespaces("user_item_scores") if n.state == State.LOADING]
            resumed = run_job(loaded, client, home=str(home), resume=stuck.name)
            assert resumed.rows == 30_000 and client.get_alias("user_item_scores").namespace == stuck.name
    finally:
        server.terminate()
        server.wait(timeout=20)


def _change_table(home: Path, new_keys_from: int) -> tuple[int, int, int]:
    """A new snapshot of the sample table: every 20th row deleted, the price of every 10th
    (other) row raised by a cent, 90 rows with new keys appended. Returns (missing, added, changed)."""
    from decimal import Decimal

    import numpy as np
    import pyarrow.compute as pc

    t = table(home)
    rows = t.scan().to_arrow()
    index = np.arange(rows.num_rows)
    deleted, raised = pa.array(index % 20 == 0), pa.array(index % 10 == 5)
    price = rows.column("price")
    cent = pa.scalar(Decimal("0.01"), price.type)
    new_price = pc.if_else(raised, pc.cast(pc.add(price, cent), price.type), price)
    changed = rows.set_column(rows.schema.get_field_index("price"), rows.schema.field("price"), new_price)
    kept = changed.filter(pc.invert(deleted))
    extra = kept.slice(0, 90)
    user_id = extra.schema.get_field_index("user_id")
    extra = extra.set_column(
        user_id, extra.schema.field("user_id"), pc.add(extra.column("user_id"), pa.scalar(new_keys_from, pa.int64()))
    )
    t.overwrite(pa.concat_tables([kept, extra]))
    return int(pc.sum(deleted).as_py()), 90, int(pc.sum(raised).as_py())


def test_a_shadow_read_reports_what_changed_and_its_gate_refuses_the_flip(home: Path, dal: KvClient) -> None:
    first = run_job(spec(), dal, home=str(home))
    missing, added, changed = _change_table(home, 10_000_000)
    # a sample larger than both versions compares every key: the counts are exact
    shadow_spec = spec(
        **{
            "  quality_gates:": "  shadow_read: {sample: 5000, seed: 11, examples: 2}\n"
            "  quality_gates:\n    max_changed_fraction: 0.5"
        }
    )
    second = run_job(shadow_spec, dal, home=str(home))
    shadow = second.shadow_read
    assert second.outcome == "succeeded" and shadow["live"] == first.version
    assert (shadow["missing"], shadow["added"], shadow["changed"]) == (missing, added, changed)
    assert shadow["sampled"] == 3_000 + added and shadow["same"] == 3_000 - missing - changed
    assert shadow["changed_fraction"] == pytest.approx(changed / (3_000 - missing), abs=1e-6)
    assert (shadow["live_records"], shadow["new_records"]) == (3_000, 3_000 - missing + added)
    kinds = [e["kind"] for e in shadow["examples"]]
    assert sorted(kinds) == ["added"] * 2 + ["changed"] * 2 + ["missing"] * 2
    example = next(e for e in shadow["examples"] if e["kind"] == "changed")
    (diff,) = example["fields"]  # only the price changed, by a cent, shown decoded
    assert diff["field"] == "price" and round(float(diff["new"]) - float(diff["live"]), 2) == 0.01
    assert set(example["key"]) == {"user_id", "item_id", "locale"}
    assert any(g["gate"] == "max_changed_fraction" and g["passed"] for g in second.gates)
    stored = json.loads(dal.describe(second.version).labels[RUN_LABEL])
    assert stored["shadow_read"]["changed"] == changed  # kept with the run record

    # a gate alone runs the shadow read (default sample); 10 % changed is over a 5 % limit
    _change_table(home, 20_000_000)
    with pytest.raises(QualityGateError, match=r"max_changed_fraction: \d+ changed \(\d+\.\d% of the sampled keys"):
        run_job(
            spec(**{"max_null_fraction:": "max_changed_fraction: 0.05\n    max_null_fraction:"}), dal, home=str(home)
        )
    assert dal.get_alias("user_item_scores").namespace == second.version
    failed = [n for n in dal.list_namespaces("user_item_scores") if n.state == State.FAILED]
    assert len(failed) == 1 and "max_changed_fraction" in failed[0].failure_reason
    wide = _cli(["runs", "user_item_scores", "--endpoint", dal.target, "-o", "wide"], home)
    assert wide.returncode == 0, wide.stderr
    fraction = f"~{changed / (3_000 - missing):.1%} of {3_000 + added:,}"
    assert "shadow read" in wide.stdout and fraction in wide.stdout  # the summary of the run that flipped


def test_a_shadow_read_shows_a_live_record_that_does_not_parse_and_lets_the_new_version_replace_it(
    dal: KvClient,
) -> None:
    """A live version stored by a release that did not refuse text that is not UTF-8 holds a
    record no parser reads; the shadow read before the flip of the version that fixes it
    raised protobuf's DecodeError, failing the run that would have replaced it."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from bulldozer.load.shadow_read import shadow_read
    from bulldozer.schema.job import build_job_schema
    from bulldozer.spec.models import ShadowRead
    from tests.integration.kv_fixtures import sealed_version
    from tests.schemas import spec_for

    schema = Schema(NestedField(1, "k", LongType(), required=True), NestedField(2, "name", StringType()))
    job = build_job_schema(spec_for(["k"]), schema)
    key_cls, value_cls = job.classes
    key = key_cls(k=1).SerializeToString()
    fixed = value_cls(name="cafe").SerializeToString()
    live, new = (  # the live one holds Latin-1
        dal.describe(sealed_version(dal, "unparsed", job, [(key, value)]))
        for value in (fixed.replace(b"cafe", b"caf\xe9"), fixed)
    )
    report = shadow_read(dal, new, live, ShadowRead(sample=10))
    assert (report.sampled, report.changed) == (1, 1)
    (example,) = report.examples
    assert example["key"] == {"k": 1}
    assert [(d["field"], d["new"]) for d in example["fields"]] == [("name", "cafe"), ("unreadable", None)]
    live_says = next(d["live"] for d in example["fields"] if d["field"] == "unreadable")
    assert "does not parse with its version's schema" in live_says and "UTF-8" in live_says


def test_get_and_scan_read_what_an_older_release_stored_or_say_in_one_line_why_not(tmp_path: Path) -> None:
    """A version stored before runs refused them (or by another tool) may hold a timestamp
    past the year 9999, a date past it and text that is not UTF-8: ``get`` and ``scan``
    printed a traceback (``Timestamp is not valid``, OverflowError, DecodeError)."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import DateType, LongType, NestedField, StringType, TimestampType

    from bulldozer.kv.connect import connect
    from bulldozer.schema.job import build_job_schema
    from tests.integration.kv_fixtures import sealed_version
    from tests.schemas import spec_for

    home = tmp_path / "h"
    schema = Schema(
        NestedField(1, "k", LongType(), required=True),
        NestedField(2, "day", DateType()),
        NestedField(3, "until", TimestampType()),
        NestedField(4, "name", StringType()),
    )
    job = build_job_schema(spec_for(["k"]), schema)
    key_cls, value_cls = job.classes
    late = value_cls(day=2_932_897, name="XY")  # 10000-01-01
    late.until.seconds = 2**63 // 1_000_000  # Long.MAX_VALUE microseconds
    records = [
        (key_cls(k=1).SerializeToString(), late.SerializeToString()),
        (key_cls(k=2).SerializeToString(), late.SerializeToString().replace(b"XY", b"\xff\xfe")),
    ]
    with connect("embedded", home) as dal:
        name = sealed_version(dal, "older", job, records)
        dal.compare_and_set_alias("older", None, name, reason="stored by an older release")
    got = _cli(["get", "older", "--key", '{"k": 1}'], home)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == {"day": "10000-01-01", "until": "294247-01-10T04:00:54", "name": "XY"}
    bad = _cli(["get", "older", "--key", '{"k": 2}'], home)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1] == (
        "error: a stored record does not parse with its version's schema: Error parsing message with type "
        f"'{job.value_full_name}': String field had bad UTF-8"
    )
    scan = _cli(["scan", "older"], home)
    assert scan.returncode == 1 and [json.loads(line)["key"] for line in scan.stdout.splitlines()] == [{"k": 1}]
    assert scan.stderr.strip().splitlines()[-1].startswith(f'error: the value of key {{"k": 2}} in {name}: a stored')
