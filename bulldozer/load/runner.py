"""One run of a job: a chain of stages, each safe to retry, state kept in the DAL.

validate → schema (checked against the live version) → create version → load →
verify (duplicates, counts + digest at seal, quality gates) → flip (compare-and-set) →
retention. On any failure after the version exists, it is marked FAILED with the reason
and the alias is left exactly where it was.

The version's labels hold what a resumed run, the CLI and the scheduler need:
``bulldozer.run`` (the run record, JSON), ``bulldozer.ledger`` (splits already loaded),
``bulldozer.spec_sha256`` and ``bulldozer.stage``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from bulldozer.errors import (
    AliasNotFoundError,
    AliasPinnedError,
    BulldozerError,
    CatalogError,
    DuplicateKeyError,
    IncompatibleSchemaError,
    NamespaceStateError,
    QualityGateError,
)
from bulldozer.kv.backends.base import NamespaceRecord, State
from bulldozer.kv.client import KvClient
from bulldozer.load.engines import LoadEngine, LoadPlan, LoadResult, SplitResult, create_load_engine
from bulldozer.load.gates import GateResult, evaluate_gates
from bulldozer.names import new_version_name
from bulldozer.schema.job import JobSchema, build_job_schema
from bulldozer.spec.loader import LoadedSpec
from bulldozer.versioning.retention import apply_retention
from bulldozer.warehouse.catalog import load_table, open_catalog

__all__ = ["RUN_LABEL", "RunRecord", "live_version", "run_job", "schema_at"]

log = logging.getLogger("bulldozer.run")
RUN_LABEL = "bulldozer.run"
LEDGER_LABEL = "bulldozer.ledger"
SPEC_LABEL = "bulldozer.spec_sha256"
STAGE_LABEL = "bulldozer.stage"


@dataclass
class RunRecord:
    """What one run did; kept with the version and shown by ``bulldozer runs``."""

    run_id: str
    job: str
    alias: str
    version: str = ""
    previous: str = ""
    engine: str = "local"
    spec_sha256: str = ""
    snapshot_id: int = 0
    #: every table read, at its pinned snapshot (one for a table source)
    snapshots: dict[str, int] = field(default_factory=dict)
    rows: int = 0
    bytes: int = 0
    digest: str = ""
    gates: list[dict[str, object]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    outcome: str = "running"
    error: str = ""
    started: str = ""
    finished: str = ""
    resumed: bool = False
    retention_dropped: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        return cls(**json.loads(text))


class _Stages:
    """Times each stage and names the one that failed."""

    def __init__(self, record: RunRecord, on_stage: Callable[[str], None]) -> None:
        self.record = record
        self.on_stage = on_stage
        self.current = ""

    def __call__(self, name: str) -> _Stages:
        self.current = name
        self.on_stage(name)
        self._started = time.perf_counter()
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.record.timings[self.current] = round(time.perf_counter() - self._started, 3)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def live_version(client: KvClient, alias: str) -> NamespaceRecord | None:
    """The version the alias points at, or None before its first flip."""
    try:
        return client.describe(client.get_alias(alias).namespace)
    except AliasNotFoundError:
        return None


def schema_at(table: Any, snapshot_id: int) -> Any:
    snapshot = table.snapshot_by_id(snapshot_id)
    if snapshot is None:
        raise CatalogError(f"table has no snapshot {snapshot_id}")
    if snapshot.schema_id is not None:
        for schema in table.metadata.schemas:
            if schema.schema_id == snapshot.schema_id:
                return schema
    return table.schema()


def _duplicates(hashes: list[np.ndarray[Any, Any]]) -> set[int]:
    if not hashes:
        return set()
    allh = np.sort(np.concatenate(hashes))
    dup = allh[1:][allh[1:] == allh[:-1]]
    return {int(h) for h in np.unique(dup[:10])}


def _parse_fault(text: str) -> tuple[str, int]:
    if not text:
        return "", 0
    kind, _, rows = text.partition("-after-rows:")
    if kind not in ("raise", "kill") or not rows.isdigit():
        raise ValueError(f"BULLDOZER_FAULT={text!r}: expected raise-after-rows:N or kill-after-rows:N")
    return kind, int(rows)


def run_job(
    loaded: LoadedSpec,
    client: KvClient,
    *,
    engine: str | LoadEngine = "local",
    home: str | None = None,
    resume: str | None = None,
    on_stage: Callable[[str], None] = lambda stage: None,
    progress: Callable[[int, int], None] = lambda done, total: None,
    fault: str | None = None,
) -> RunRecord:
    """Run the job once; returns the run record (raises a BulldozerError on failure,
    after marking the version FAILED and leaving the alias untouched).

    ``fault`` injects a failure for tests of failure handling (default: the
    ``BULLDOZER_FAULT`` environment variable): ``raise-after-rows:N`` raises once N rows
    were loaded; ``kill-after-rows:N`` kills the process (SIGKILL) at that point.
    """
    fault_kind, fault_rows = _parse_fault(fault if fault is not None else os.environ.get("BULLDOZER_FAULT", ""))
    spec = loaded.spec
    load_engine = create_load_engine(engine) if isinstance(engine, str) else engine
    record = RunRecord(
        run_id=uuid.uuid4().hex[:12],
        job=spec.metadata.name,
        alias=spec.alias,
        engine=load_engine.name,
        spec_sha256=hashlib.sha256(loaded.text.encode()).hexdigest(),
        started=_now(),
    )
    stage = _Stages(record, on_stage)
    version_created = False

    try:
        with stage("schema"):
            dm = spec.data_movement
            catalog = open_catalog(dm.catalog, home)
            sql_source = None
            if dm.source.query is not None or dm.duplicate_keys.policy == "keep_latest":
                if not load_engine.runs_sql:
                    raise CatalogError(
                        f"query sources and duplicate_keys keep_latest need --engine local (not {load_engine.name})"
                    )
                from bulldozer.load.sql import build_sql_source

                sql_source = build_sql_source(spec, catalog, schema_at)
                table = None
                record.snapshots = sql_source.snapshots
                record.snapshot_id = next(iter(sql_source.snapshots.values())) if len(sql_source.snapshots) == 1 else 0
                source_schema = sql_source.schema
                source_name = f"lake.{dm.source.table}" if dm.source.table else "query"
            else:
                assert dm.source.table is not None
                table = load_table(catalog, dm.source.table)
                snapshot = table.snapshot_by_id(dm.snapshot_id) if dm.snapshot_id else table.current_snapshot()
                if snapshot is None:
                    raise CatalogError(f"table {dm.source.table!r} has no snapshot to load (is it empty?)")
                record.snapshot_id = snapshot.snapshot_id
                record.snapshots = {dm.source.table: snapshot.snapshot_id}
                source_schema = schema_at(table, snapshot.snapshot_id)
                source_name = f"lake.{dm.source.table}"
            live = live_version(client, spec.alias)
            record.previous = live.name if live else ""
            job: JobSchema = build_job_schema(
                spec,
                source_schema,
                source_name,
                live.value_descriptor_set if live and live.value_descriptor_set else None,
                python=False,
            )
            if job.compat is not None and job.compat.breaking:
                refused = [f"{d.path}: {d.change} ({d.detail})" for d in job.compat.refused()]
                raise IncompatibleSchemaError(
                    f"the new schema would break readers of {live.name if live else 'the live version'}: "
                    + "; ".join(refused),
                    refused,
                )

        with stage("create"):
            done: dict[str, SplitResult] = {}
            if resume:
                existing = client.describe(resume)
                if existing.alias != spec.alias or existing.state != State.LOADING:
                    raise NamespaceStateError(
                        f"cannot resume {resume!r}: it is {existing.state.value} (alias {existing.alias!r}); "
                        "only a LOADING version of this job can be resumed"
                    )
                if existing.snapshot_id != record.snapshot_id and not dm.snapshot_id:
                    record.snapshot_id = existing.snapshot_id  # a resumed run keeps its snapshot
                ledger = json.loads(existing.labels.get(LEDGER_LABEL, "{}"))
                if load_engine.resumes_splits and sql_source is None:
                    done = {sid: SplitResult.from_json(sid, v) for sid, v in ledger.items()}
                record.version, record.resumed = resume, True
            else:
                record.version = new_version_name(spec.alias)
                client.create_namespace(
                    record.version,
                    spec.alias,
                    job_name=spec.metadata.name,
                    snapshot_id=record.snapshot_id,
                    value_descriptor_set=job.descriptor_set,
                    key_message=job.key_full_name,
                    value_message=job.value_full_name,
                    labels={SPEC_LABEL: record.spec_sha256, STAGE_LABEL: "load", RUN_LABEL: record.to_json()},
                )
            version_created = True

        plan = LoadPlan(spec, table, record.snapshot_id, job.proto, record.version, done, home, sql_source)
        ledger_state = {sid: s.to_json() for sid, s in done.items()}

        def on_split(split: SplitResult) -> None:
            ledger_state[split.split_id] = split.to_json()
            client.set_labels(record.version, {LEDGER_LABEL: json.dumps(ledger_state, separators=(",", ":"))})

        def on_progress(rows: int, total: int) -> None:
            progress(rows, total)
            if fault_kind and rows >= fault_rows:
                if fault_kind == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError(f"injected failure after {rows} rows")

        with stage("load"):
            result: LoadResult = load_engine.load(plan, client, on_split, on_progress)
            record.rows, record.bytes = result.rows, result.digest.bytes
            record.digest = f"{result.digest.value:#018x}"

        with stage("verify"):
            client.set_labels(record.version, {STAGE_LABEL: "verify"})
            hashes = list(result.key_hashes)
            if done:
                hashes += load_engine.key_hashes_of(plan, set(done))
            dups = _duplicates(hashes)
            if dups:
                keys = load_engine.find_keys(plan, dups)
                shown = ", ".join(json.dumps(k, default=str) for k in keys) or "(not found again)"
                raise DuplicateKeyError(
                    f"the source has rows sharing a key, e.g. {shown}; fix the source, filter it, or set "
                    "data_movement.duplicate_keys"
                )
            client.seal(record.version, expected_records=result.rows, expected_digest=result.digest.value)
            gates: list[GateResult] = evaluate_gates(
                spec.key_value_dal.quality_gates, result.rows, result.null_counts, live.record_count if live else None
            )
            record.gates = [g.as_dict() for g in gates]
            failed = [g for g in gates if not g.passed]
            if failed:
                raise QualityGateError("quality gate failed: " + "; ".join(f"{g.gate}: {g.detail}" for g in failed))

        with stage("flip"):
            client.set_labels(record.version, {STAGE_LABEL: "flip"})
            reason = f"run {record.run_id}: {record.rows:,} rows from snapshot {record.snapshot_id}"
            try:
                client.compare_and_set_alias(
                    spec.alias, record.previous or None, record.version, reason=reason, respect_pin=True
                )
            except AliasPinnedError as pinned:
                # built and verified, kept SEALED; the operator decides when it goes live
                record.outcome = "pinned"
                record.error = str(pinned)

        with stage("retention"):
            retention = spec.key_value_dal.retention
            plan_ = apply_retention(client, spec.alias, retention.keep_versions, retention.grace_period)
            record.retention_dropped = plan_.drop

        if record.outcome != "pinned":
            record.outcome = "succeeded"
        record.finished = _now()
        client.set_labels(record.version, {STAGE_LABEL: "done", RUN_LABEL: record.to_json()})
        log.info("run %s: %s now points at %s (%d rows)", record.run_id, spec.alias, record.version, record.rows)
        return record
    except BaseException as exc:
        record.outcome = "failed"
        record.finished = _now()
        message = str(exc) if isinstance(exc, BulldozerError) else f"{type(exc).__name__}: {exc}"
        record.error = f"{stage.current}: {message}"
        if version_created:
            try:
                client.mark_failed(record.version, record.error)
                client.set_labels(record.version, {STAGE_LABEL: "failed", RUN_LABEL: record.to_json()})
            except BulldozerError as cleanup:  # the DAL may be the thing that failed
                log.warning("could not mark %s FAILED: %s", record.version, cleanup)
        raise
