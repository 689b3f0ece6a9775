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

import json
import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bulldozer.codec.digest import duplicate_hashes
from bulldozer.errors import (
    BackendUnavailableError,
    BulldozerError,
    CatalogError,
    DuplicateKeyError,
    IncompatibleSchemaError,
    InvalidArgumentError,
    KvError,
    LoadError,
    NamespaceExistsError,
    NamespaceNotFoundError,
    NamespaceStateError,
    QualityGateError,
    RetentionError,
    SchemaError,
    SpecError,
    SpecIssue,
    VerificationError,
)
from bulldozer.interrupts import unwound_from
from bulldozer.kv.client import KvClient
from bulldozer.kv.types import NamespaceRecord, State
from bulldozer.lineage import lineage_for
from bulldozer.load.delta import DeltaChanges, DeltaPlan, apply_delta, base_duplicates, plan_delta, read_ahead
from bulldozer.load.engines import LoadEngine, LoadPlan, LoadResult, SplitResult, create_load_engine
from bulldozer.load.gates import GateResult, evaluate_gates
from bulldozer.load.shadow_read import ShadowReadReport, shadow_read
from bulldozer.load.source import schema_at, source_label
from bulldozer.names import new_version_name, short_version
from bulldozer.schema.job import JobSchema, build_job_schema
from bulldozer.spec.loader import LoadedSpec
from bulldozer.versioning.flip import flip, live_version
from bulldozer.versioning.retention import apply_retention, retention_of
from bulldozer.versioning.run_state import (
    ALIVE_WITHIN,
    BASE_COPIED_LABEL,
    LOADED_LABEL,
    MADE_IN,
    RUN_KEY_LABEL,
    RUN_LABEL,
    SPEC_LABEL,
    STAGE_LABEL,
    Heartbeat,
    Loaded,
    RunRecord,
    SplitLedger,
    base_copied,
    being_made_by,
    ledger_of,
    loaded_of,
    run_key_of,
    run_record_of,
)
from bulldozer.warehouse.catalog import catalog_issues, load_source_table, open_catalog, read_snapshot

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = ["STAGES", "JobRun", "duplicate_key_error", "find_run_version", "run_job", "run_stage"]

log = logging.getLogger("bulldozer.run")


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


def duplicate_key_error(keys: list[dict[str, Any]]) -> DuplicateKeyError:
    """The error for source rows sharing a key, naming a few of the keys."""
    shown = ", ".join(json.dumps(k, default=str) for k in keys) or "(not found again)"
    return DuplicateKeyError(
        f"the source has rows sharing a key, e.g. {shown}; fix the source, filter it, or set "
        "data_movement.duplicate_keys"
    )


#: The stages of a run, in order; each can be called on its own (``run_stage``).
STAGES = ("validate", "schema", "load", "verify", "flip", "retention")
#: States of a version whose load stage finished (SEALING: its seal was interrupted).
_LOADED_STATES = frozenset({State.SEALING, State.SEALED, State.ACTIVE, State.RETIRED})
#: Failures a retry cannot fix: the version is marked FAILED at once.
_FINAL = (LoadError, SchemaError, CatalogError, SpecError)
#: how long a run failed by the DAL or its store not being reachable tries to record its
#: failure (``JobRun.failed``): the record meets the same outage, most likely, and one that
#: outlasts this leaves the version LOADING, which a resume finishes or gc drops. With the
#: client's own timeout, the channel's retries of the record kept a run whose Redis stopped
#: mid-load 16.6 s more before it failed (of 21.6 s from its write's failure to its end).
#: The heartbeat's last beat is tried meanwhile, within the same seconds.
UNREACHABLE_RECORD_SECONDS = 5.0


class JobRun:
    """One run of a job, stage by stage. ``run_job`` calls every stage in one process;
    ``run_stage`` calls one, rebuilding what it needs from the version's labels."""

    def __init__(
        self,
        loaded: LoadedSpec,
        client: KvClient,
        *,
        engine: str | LoadEngine = "local",
        home: str | None = None,
        on_stage: Callable[[str], None] = lambda stage: None,
        progress: Callable[[int, int], None] = lambda done, total: None,
        run_key: str = "",
        allow_breaking: bool = False,
        take_over: bool = False,
    ) -> None:
        self.loaded, self.spec, self.client, self.home = loaded, loaded.spec, client, home
        #: a schema change that breaks readers starts a new schema generation instead of being refused
        self.allow_breaking = allow_breaking
        #: the run may flip an alias whose live version another job loaded (``owner_issue``)
        self.take_over = take_over
        self.progress = progress
        self.load_engine = create_load_engine(engine) if isinstance(engine, str) else engine
        self.run_key = run_key
        self.record = RunRecord(
            run_id=uuid.uuid4().hex[:12],
            job=self.spec.metadata.name,
            alias=self.spec.alias,
            engine=self.load_engine.name,
            spec_sha256=loaded.sha256,
            started=_now(),
            retention=retention_of(self.spec.key_value_dal.retention),
        )
        self.stage = _Stages(self.record, on_stage)
        self.version_created = False
        self.live: NamespaceRecord | None = None
        self.table: Any = None
        self.sql_source: Any = None
        self.job: JobSchema | None = None
        self.done: dict[str, SplitResult] = {}
        #: set when this run writes a delta version (``load.delta``)
        self.delta: DeltaPlan | None = None
        #: the delta's changed files being read since its plan was made (``delta.read_ahead``)
        self.delta_read: Future[Any] | None = None
        #: what this process's load stage applied to the delta version
        self.delta_changes: DeltaChanges | None = None
        #: the plan and key hashes of this process's full load, its check for rows sharing a
        #: key left to the seal (``load(seal_follows=True)``, ``_shared_keys``)
        self.unchecked: tuple[LoadPlan, list[Any]] | None = None
        self.null_counts: dict[str, int] = {}
        self.digest_value = 0
        #: the load stage's results are known (it ran, or ``restore`` read them back)
        self.load_done = False
        #: the alias points at this run's version (from then on it is never marked FAILED)
        self.flipped = False
        #: the source table's columns (name, Iceberg type), for lineage
        self.source_fields: list[tuple[str, str]] = []
        #: the run's heartbeat on its version, from its create (or restore) to its end
        self.heartbeat: Heartbeat | None = None
        self.lineage = lineage_for(loaded, getattr(client, "store", "") or "in-process")

    def prepare_engine(self) -> None:
        """Have the engine start what its load needs while the schema and create stages run
        (``LoadEngine.prepare``): for full runs only (a delta run does not use the engine)."""
        if self.spec.data_movement.mode == "full":
            self.load_engine.prepare(self.spec, self.home)

    def refuse_outright(self) -> None:
        """What the spec and the engine alone refuse, before anything is read: a catalog the
        operator does not allow, a setting the engine does not use, a source it cannot run."""
        spec, dm = self.spec, self.spec.data_movement
        refused = catalog_issues(self.loaded)
        if refused:
            raise SpecError(refused)
        if spec.key_value_dal.write.partitions is not None and not self.load_engine.writes_partitions:
            raise SpecError(
                [
                    self.loaded.issue(
                        ("key_value_dal", "write", "partitions"),
                        f"sets the Spark write tasks; the {self.load_engine.name} engine does not use it "
                        "(run with --engine spark, or remove it)",
                    )
                ]
            )
        if (dm.source.query is not None or dm.duplicate_keys.policy == "keep_latest") and not self.load_engine.runs_sql:
            raise CatalogError(
                f"query sources and duplicate_keys keep_latest need --engine local (not {self.load_engine.name})"
            )
        self.load_engine.refuse(spec)

    # -- the stages -------------------------------------------------------------

    def schema(self, start_engine: bool = False) -> JobSchema:
        """Read the source's schema at one snapshot and check the new one against the live
        version's; with ``start_engine``, once the spec is not refused outright, have the
        engine start meanwhile (``prepare_engine``: started before the refusal, Spark's driver
        ran for nothing, and its folder was removed under it as the command ended)."""
        from bulldozer.schema.table_check import require_columns, require_filter

        spec, record = self.spec, self.record
        dm = spec.data_movement
        self.refuse_outright()
        if start_engine:
            self.prepare_engine()
        if dm.source.query is not None or dm.duplicate_keys.policy == "keep_latest":
            from bulldozer.load.source import build_sql_source

            self.sql_source = build_sql_source(
                self.loaded, open_catalog(dm.catalog, self.home, create=False), schema_at
            )
            record.snapshots = self.sql_source.snapshots
            only = len(self.sql_source.snapshots) == 1
            record.snapshot_id = next(iter(self.sql_source.snapshots.values())) if only else 0
            source_schema = self.sql_source.schema
            source_name = source_label(spec)
        else:
            assert dm.source.table is not None
            self.table = load_source_table(dm.catalog, self.home, dm.source.table)
            snapshot = read_snapshot(self.table, dm.source.table, dm.snapshot_id, dm.ref)
            record.snapshot_id = snapshot.snapshot_id
            record.snapshots = {dm.source.table: snapshot.snapshot_id}
            record.table_uuid = str(self.table.metadata.table_uuid)
            require_filter(self.loaded, self.table.schema())
            source_schema = schema_at(self.table, snapshot.snapshot_id)
            source_name = source_label(spec)
            require_columns(self.loaded, source_schema, "table")
            self.source_fields = [(f.name, str(f.field_type)) for f in source_schema.fields]
        return self.schema_of(source_schema, source_name)

    def schema_of(self, source_schema: Any, source_name: str) -> JobSchema:
        """The job's schema for a source with this Iceberg schema, checked against the live
        version's (the ``schema`` stage after it read the source; a Spark DataFrame written
        through the ``bulldozer`` data source comes here with the schema it has)."""
        spec = self.spec
        self.live = live_version(self.client, spec.alias)
        self.record.previous = self.live.name if self.live else ""
        live = self.live
        if live is not None and live.job_name and live.job_name != spec.metadata.name:
            if not self.take_over:
                raise SpecError([self.owner_issue(live)])
            self.record.taken_over_from = live.job_name
        job = self._job_against(source_schema, source_name, live)
        generation = live.schema_generation if live else 1
        if job.compat is not None and job.compat.breaking:
            refused = [f"{d.path}: {d.change} ({d.detail})" for d in job.compat.refused()]
            if not self.allow_breaking:
                raise IncompatibleSchemaError(
                    f"the new schema would break readers of {live.name if live else 'the live version'}: "
                    + "; ".join(refused)
                    + " (to make the change deliberately, run with --allow-breaking: a new schema generation "
                    "that readers built for the old one refuse instead of misreading)",
                    refused,
                )
            generation += 1
            self.record.breaking_changes = refused
            log.info("breaking schema change, allowed: generation %d: %s", generation, "; ".join(refused))
        self.record.schema_generation = generation
        self.job = job
        return job

    def owner_issue(self, live: NamespaceRecord) -> SpecIssue:
        """An alias serves the job that loaded its live version: another job's run would flip
        that job's consumers to its own data, and its retention would drop that job's
        versions (the rollbacks). Two teams choosing one alias name by chance is refused at
        ``key_value_dal.alias``; handing an alias to another job is an operator's deliberate
        ``--take-over``, which the alias history records."""
        return self.loaded.issue(
            ("key_value_dal", "alias"),
            f"the alias {self.spec.alias!r} serves the job {live.job_name!r} (its live version "
            f"{short_version(live.name)} was loaded by it), and this spec is the job {self.spec.metadata.name!r}: "
            "name another alias, or hand this one over deliberately with `bulldozer run --take-over`",
        )

    def _job_against(self, source_schema: Any, source_name: str, live: NamespaceRecord | None) -> JobSchema:
        """The job's schema for this source schema, its field numbers kept from ``live``'s."""
        descriptors = live.value_descriptor_set if live and live.value_descriptor_set else None
        return build_job_schema(self.spec, source_schema, source_name, descriptors, python=False)

    def create(self, resume: str | None, load_follows: bool = False) -> str:
        """A new LOADING version, or the one ``resume`` names (its loaded splits are skipped).
        ``load_follows``: this process runs the load stage next, so a new delta version's
        changed files are read meanwhile (``delta.read_ahead``). Warm 10 M-row deltas
        (1 % changed), two homes and loaders side by side, 14 deltas each: create stage
        27.5 -> 35 ms, load stage 220 -> 189 ms (medians); a whole delta 7 ms faster
        (paired median), in 11 of 14. (Both stages share the machine's two cores with the
        DAL serving the create.)"""
        spec, record, client = self.spec, self.record, self.client
        assert self.job is not None
        if resume:
            existing = client.describe(resume)
            if existing.alias != spec.alias or existing.state not in (State.LOADING, State.SEALING):
                raise NamespaceStateError(
                    f"cannot resume {resume!r}: it is {existing.state.value} (alias {existing.alias!r}); "
                    "only a LOADING version of this job (or one whose seal was interrupted, SEALING) can be resumed"
                )
            refuse_if_being_made(existing, client.now())
            if (mixed := self.mixes_with(existing)) is not None:
                raise NamespaceStateError(
                    f"cannot resume {resume!r}: {mixed}, and a version resumed now would hold records of both; "
                    "start a new run"
                )
            if existing.state == State.SEALING:
                # loaded in full and frozen, its seal interrupted: seal (verify) and flip it
                if loaded_of(existing) is None:
                    raise NamespaceStateError(f"cannot resume {resume!r}: it is SEALING but records no finished load")
                previous, live = record.previous, self.live
                self.restore(resume)
                self.record.previous, self.live, self.record.resumed = previous, live, True
                return resume
            if existing.snapshot_id != record.snapshot_id and not spec.data_movement.snapshot_id:
                record.snapshot_id = existing.snapshot_id  # a resumed run keeps its snapshot
            if not base_copied(existing):
                reason = f"its copy of the base {existing.base} was interrupted (its run was killed as it made it)"
                client.mark_failed(resume, reason)
                raise NamespaceStateError(f"cannot resume {resume!r}: {reason}; it is now FAILED: start a new run")
            if existing.base:  # a delta: its changes are derived again and applied again (idempotent)
                planned = self._plan_delta(client.describe(existing.base), resuming=True)
                if isinstance(planned, str):
                    raise NamespaceStateError(f"cannot resume the delta version {resume!r}: {planned}; start a new run")
                self.delta = planned
                record.mode = "delta"
            ledger = ledger_of(existing)
            if self.load_engine.resumes_splits and self.sql_source is None:
                self.done = {sid: SplitResult.from_json(sid, v) for sid, v in ledger.items()}
            record.version, record.resumed = resume, True
        else:
            if spec.data_movement.mode != "full":
                planned = self._plan_delta(self.live)
                if isinstance(planned, str):
                    record.full_reason = planned
                    log.info("run %s: a full run: %s", record.run_id, planned)
                else:
                    self.delta, record.mode = planned, "delta"
                    if load_follows:
                        self.delta_read = read_ahead(planned, self.table, self.job, client)
            record.version = new_version_name(spec.alias)
            labels = {SPEC_LABEL: record.spec_sha256, STAGE_LABEL: "load", RUN_LABEL: record.to_json()}
            if self.run_key:
                labels[RUN_KEY_LABEL] = self.run_key
            try:
                client.create_namespace(
                    record.version,
                    spec.alias,
                    job_name=spec.metadata.name,
                    snapshot_id=record.snapshot_id,
                    value_descriptor_set=self.job.descriptor_set,
                    key_message=self.job.key_full_name,
                    value_message=self.job.value_full_name,
                    labels=labels,
                    schema_generation=record.schema_generation,
                    base=self.delta.base.name if self.delta else "",
                )
            except NamespaceExistsError:
                if not self._made_by_this_run(record.version, labels):
                    raise
            if self.delta:  # the call returned: the version holds its base (what a resume checks)
                client.set_labels(record.version, {BASE_COPIED_LABEL: self.delta.base.name})
        self.version_created = True
        self.beat()
        return record.version

    def beat(self) -> None:
        """Start the run's heartbeat on its version (``run_state.Heartbeat``): retention and
        ``gc`` leave a version alone while the run making it beats."""
        if self.heartbeat is None:
            version, client = self.record.version, self.client
            self.heartbeat = Heartbeat(version, lambda labels: client.set_labels(version, labels), clock=client.now)
            self.heartbeat.start()

    def stop_beating(self) -> None:
        """Stop the heartbeat (before the run's last word on its version); idempotent."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None

    def mixes_with(self, existing: NamespaceRecord) -> str | None:
        """Why this run's records would not be the kind ``existing`` (a version an earlier
        attempt began) holds, so resuming it would mix two (None: they would be the same):
        another text of the spec began it, or, while it is still LOADING, its records are
        encoded for another schema (the table's changed since: a float promoted to double,
        a column added that the spec takes by default). Its seal would still pass: it
        measures what was written."""
        if (other := self.other_spec(existing)) is not None:
            return other
        assert self.job is not None
        if existing.state == State.LOADING and (
            existing.value_descriptor_set != self.job.descriptor_set
            or (existing.key_message, existing.value_message) != (self.job.key_full_name, self.job.value_full_name)
        ):
            return "its records are encoded for another schema (the table's schema changed since it was begun)"
        return None

    def other_spec(self, existing: NamespaceRecord) -> str | None:
        """Why ``existing`` was begun by another text of the spec than this run's (None: by
        this one)."""
        began = existing.labels.get(SPEC_LABEL, "")
        if began == self.loaded.sha256:
            return None
        return (
            f"another text of the spec began it (sha256 {began[:12] or 'unknown'}, this one {self.loaded.sha256[:12]})"
        )

    def _made_by_this_run(self, version: str, labels: dict[str, str]) -> bool:
        """Whether the version a create was refused as existing is the one this run asked for:
        the channel retries a create answered UNAVAILABLE, so a create the DAL made whose answer
        was lost comes back "already exists". Its record carries this run's own record (a run
        id no other run has), still LOADING and empty. Not for a delta's create: whether the
        first attempt's copy of the base finished cannot be told, so that one fails as it did."""
        if self.delta is not None:
            return False
        try:
            made = self.client.describe(version)
        except BulldozerError:
            return False
        mine = made.labels.get(RUN_LABEL) == labels[RUN_LABEL] and made.state == State.LOADING
        if mine and made.record_count == 0 and not made.base:
            log.info(
                "run %s: %s was made by this run's create (its answer was lost and retried)",
                self.record.run_id,
                version,
            )
            return True
        return False

    def _plan_delta(self, base: NamespaceRecord | None, resuming: bool = False) -> DeltaPlan | str:
        """A delta from ``base`` to this run's snapshot, or why a full run is needed. Mode auto
        weighs what the store's copy of a base costs, unless a delta version is resumed (its
        base is copied already)."""
        if self.table is None:
            return "the source is not a table scan (a query, or a DataFrame): it is loaded in full"
        assert self.job is not None
        columns = LoadPlan(self.spec, self.table, self.record.snapshot_id, self.job.proto, "").columns
        return plan_delta(
            self.spec,
            self.record.spec_sha256,
            self.table,
            self.record.table_uuid,
            self.record.snapshot_id,
            self.job,
            base,
            columns,
            self.client.describe_store() if self.spec.data_movement.mode == "auto" and not resuming else None,
        )

    def load(self, seal_follows: bool = False) -> None:
        """Write every split (skipping those a resumed version holds), then refuse duplicate
        keys. ``seal_follows``: this process seals the version next (``run_job``), so rows
        sharing a key are left to the seal, which finds them for any engine (the store holds
        fewer records than were sent: its count and digest differ) and refuses it; only
        then are the keys named, from the hashes this load kept (``_shared_keys``). The
        check took a 10 M-row run's load 0.26 s (500 k rows: 10 ms) to find nothing in
        every run that loads a sound table. A load stage run on its own (``run_stage``)
        still checks: the verify that would name the keys may run where they are not kept."""
        record, client = self.record, self.client
        assert self.job is not None
        if self.delta is not None:
            reading, self.delta_read = self.delta_read, None
            changes = apply_delta(
                self.delta,
                self.spec,
                self.table,
                self.job,
                client,
                record.version,
                self.progress,
                record.resumed,
                reading,
            )
            record.delta, self.delta_changes = changes.summary, changes
            self.record_load(changes.load_result())
            return
        plan = LoadPlan(
            self.spec,
            self.table,
            record.snapshot_id,
            self.job.proto,
            record.version,
            self.done,
            self.home,
            self.sql_source,
        )
        ledger = SplitLedger(
            lambda labels: client.set_labels(record.version, labels),
            {sid: s.to_json() for sid, s in self.done.items()},
        )

        def on_split(split: SplitResult) -> None:
            ledger.add(split.split_id, split.to_json())

        result: LoadResult = self.load_engine.load(plan, client, on_split, self.progress)
        ledger.flush()
        if seal_follows:
            self.unchecked = plan, list(result.key_hashes)
        elif (error := self._duplicates(plan, list(result.key_hashes))) is not None:
            raise error
        self.record_load(result)

    def _duplicates(self, plan: LoadPlan, hashes: list[Any]) -> DuplicateKeyError | None:
        """The error naming keys that rows of this load share, from the key hashes of the
        splits it wrote (``hashes``) and those a resumed version held already (read again);
        None when no two rows share a key."""
        if self.done:
            hashes = hashes + self.load_engine.key_hashes_of(plan, set(self.done))
        dups = duplicate_hashes(hashes)
        return duplicate_key_error(self.load_engine.find_keys(plan, dups)) if dups else None

    def record_load(self, result: LoadResult) -> None:
        """Record what the load wrote (the end of the load stage; the Spark data source's
        commit calls it with what its tasks reported)."""
        record, client = self.record, self.client
        record.rows, record.bytes = result.rows, result.digest.bytes
        record.engine_start = result.engine_start
        record.digest = f"{result.digest.value:#018x}"
        self.digest_value, self.null_counts = result.digest.value, dict(result.null_counts)
        loaded = Loaded(record.rows, self.digest_value, dict(self.null_counts))
        self.load_done = True
        client.set_labels(
            record.version,
            {
                STAGE_LABEL: "verify",
                LOADED_LABEL: loaded.to_json(),
                RUN_LABEL: record.to_json(),
            },
        )

    def verify(self) -> None:
        """Seal with the expected count and digest (the DAL measures what it stores), then the quality gates."""
        record, client = self.record, self.client
        info = client.describe(record.version)
        if info.state in (State.LOADING, State.SEALING):
            try:
                client.seal(record.version, expected_records=record.rows, expected_digest=self.digest_value)
            except VerificationError:
                shared = self._base_duplicates() if record.mode == "delta" else self._shared_keys()
                if shared is not None:
                    raise shared from None
                raise
            self.unchecked = None  # sealed: no two rows shared a key, and their hashes are not needed
        elif info.state not in (State.SEALED, State.ACTIVE, State.RETIRED):
            raise NamespaceStateError(
                f"{record.version} is {info.state.value}" + (f": {info.failure_reason}" if info.failure_reason else "")
            )
        live = self.live if self.live is None or self.live.name != record.version else None
        shadow = self.shadow_read(live)
        gates: list[GateResult] = evaluate_gates(
            self.spec.key_value_dal.quality_gates,
            record.rows,
            self.null_counts,
            live.record_count if live else None,
            shadow,
        )
        record.gates = [g.as_dict() for g in gates]
        failed = [g for g in gates if not g.passed]
        if failed:
            raise QualityGateError("quality gate failed: " + "; ".join(f"{g.gate}: {g.detail}" for g in failed))

    def _shared_keys(self) -> DuplicateKeyError | None:
        """After a failed seal: the keys rows shared, when that is why it failed (None when
        it is not, or the source is not at hand). A load this process ran left them to the
        seal (``load(seal_follows=True)``): they are among its key hashes. Writers that
        could not see each other's keys (``shared_keys_unchecked``): re-read from the
        source, once the seal stored fewer records than were sent."""
        record = self.record
        if not self.load_engine.shared_keys_unchecked:
            return self._duplicates(*self.unchecked) if self.unchecked is not None else None
        if self.table is None or self.job is None:
            return None
        if self.client.describe(record.version).record_count >= record.rows:
            return None
        plan = LoadPlan(self.spec, self.table, record.snapshot_id, self.job.proto, record.version, home=self.home)
        hashes = self.load_engine.key_hashes_of(plan, None)
        dups = duplicate_hashes(hashes)
        return duplicate_key_error(self.load_engine.find_keys(plan, dups)) if dups else None

    def _base_duplicates(self) -> DuplicateKeyError | None:
        """After a delta version's seal failed: the new keys its base held. A verify stage
        run on its own plans the delta again from what the load stage recorded (its
        snapshot and base) and finds them in the changed files. Should that fail (the
        snapshot expired meanwhile, the DAL went away...), the seal's own error stands."""
        try:
            return self._find_base_duplicates()
        except Exception as exc:  # an explanation only: never in place of the seal's error
            log.warning("run %s: the keys a failed seal counted twice were not found: %s", self.record.run_id, exc)
            return None

    def _find_base_duplicates(self) -> DuplicateKeyError | None:
        if self.delta is None:
            base = (self.record.delta or {}).get("base")
            dm = self.spec.data_movement
            if not base or dm.source.table is None:
                return None
            self.table = load_source_table(dm.catalog, self.home, dm.source.table)
            source_schema = schema_at(self.table, self.record.snapshot_id)
            # the version the load stage built its schema against: the one live then
            self.job = self._job_against(source_schema, source_label(self.spec), self.live)
            planned = self._plan_delta(self.client.describe(base), resuming=True)
            if isinstance(planned, str):
                return None
            self.delta = planned
        assert self.job is not None
        fresh = self.delta_changes.fresh if self.delta_changes is not None else None
        return base_duplicates(self.job, self.client, self.delta, self.table, fresh)

    def shadow_read(self, live: NamespaceRecord | None) -> ShadowReadReport | None:
        """Compare a sample of the sealed version with the live one, when the spec asks."""
        settings = self.spec.key_value_dal.shadow_read_settings
        if settings is None or live is None:
            return None
        record = self.record
        report = shadow_read(self.client, self.client.describe(record.version), live, settings)
        record.shadow_read = report.as_dict()
        self.client.set_labels(record.version, {RUN_LABEL: record.to_json()})
        log.info("run %s: shadow read: %s", record.run_id, report.summary())
        return report

    def flip(self) -> None:
        """Compare-and-set the alias from the version live when the run began; a no-op once it points here."""
        record, client = self.record, self.client
        client.set_labels(record.version, {STAGE_LABEL: "flip"})
        reason = f"run {record.run_id}: {record.rows:,} rows from snapshot {record.snapshot_id}"
        if record.mode == "delta":
            d = record.delta
            reason += (
                f" (a delta from {short_version(d['base'])}: {d['added']:,} keys added, {d['changed']:,} changed, "
                f"{d['deleted']:,} deleted)"
            )
        if record.breaking_changes:
            reason += f"; breaking schema change to generation {record.schema_generation}: " + "; ".join(
                record.breaking_changes
            )
        if record.taken_over_from:
            reason += f"; the alias taken over from the job {record.taken_over_from!r} (--take-over)"
        kept_back = flip(client, self.spec.alias, record.previous or None, record.version, reason)
        if kept_back is not None:
            record.outcome, record.error = "pinned", kept_back
        else:
            self.flipped = True

    def retention(self) -> None:
        retention = self.spec.key_value_dal.retention
        plan = apply_retention(self.client, self.spec.alias, retention.keep_versions, retention.grace_period)
        self.record.retention_dropped = plan.drop

    def retention_after_flip(self) -> None:
        """Retention once the version is live: a failure is recorded (``retention_error``)
        and warned about, never turned into a failed run (the flip stands)."""
        try:
            self.retention()
        except Exception as exc:
            message = str(exc) if isinstance(exc, BulldozerError) else f"{type(exc).__name__}: {exc}"
            self.record.retention_error = message
            log.warning(
                "run %s: %s is live, but retention failed: %s", self.record.run_id, self.record.version, message
            )

    # -- running ----------------------------------------------------------------

    def finish(self) -> RunRecord:
        # the heartbeat's last beat goes with the run's record: one request, not two in turn
        last_beat = self.heartbeat.last_beat() if self.heartbeat is not None else {}
        self.heartbeat = None
        record = self.record
        if record.outcome != "pinned":
            record.outcome = "succeeded"
        record.finished = _now()
        self.client.set_labels(record.version, {STAGE_LABEL: "done", RUN_LABEL: record.to_json(), **last_beat})
        log.info("run %s: %s now points at %s (%d rows)", record.run_id, record.alias, record.version, record.rows)
        return record

    def failed(self, exc: BaseException, final: bool = True) -> BaseException:
        """Record the failure; mark the version FAILED unless a retry of the stage may still
        succeed. Returns what to raise: ``exc``; the interruption ``exc`` was raised while
        unwinding from (``interrupts.unwound_from``); or one line saying the version was
        dropped under the run (its writes say only that the namespace does not exist).
        Failed by an unreachable DAL or store, the heartbeat's last beat and the record are
        tried at once, ``UNREACHABLE_RECORD_SECONDS`` for both: one after the other, the beat
        kept such a run 5 s more before it failed."""
        # an error a library's clean-up raised as an interruption unwound: the interruption
        # stopped the run (its line, its record), not that error
        exc = unwound_from(exc) or exc
        if not isinstance(exc, BackendUnavailableError) or self.heartbeat is None:
            self.stop_beating()
            return self._record_failure(exc, final)
        heartbeat, self.heartbeat = self.heartbeat, None
        heartbeat.end()
        until = time.monotonic() + UNREACHABLE_RECORD_SECONDS
        try:
            return self._record_failure(exc, final)
        finally:
            heartbeat.wait_ended(until - time.monotonic())

    def _record_failure(self, exc: BaseException, final: bool) -> BaseException:
        """``failed``, the heartbeat stopped or ending (``exc`` unwound)."""
        record = self.record
        record.outcome = "failed"
        record.finished = _now()
        if dropped := self._dropped_under_the_run(exc):
            record.failed_stage, record.error = self.stage.current, f"{self.stage.current}: {dropped}"
            return dropped  # a dropped version keeps no record of it: nothing more to write
        message = str(exc) if isinstance(exc, BulldozerError) else f"{type(exc).__name__}: {exc}"
        record.failed_stage = self.stage.current
        record.error = f"{self.stage.current}: {message}"
        if not self.version_created and final and isinstance(exc, _FINAL):
            self.record_refusal()
        elif self.version_created:
            bound = UNREACHABLE_RECORD_SECONDS if isinstance(exc, BackendUnavailableError) else None
            try:
                if final and not self.flipped:
                    self.client.mark_failed(record.version, record.error, bound)
                    labels = {STAGE_LABEL: "failed", RUN_LABEL: record.to_json()}
                    self.client.set_labels(record.version, labels, bound)
                else:
                    self.client.set_labels(record.version, {RUN_LABEL: record.to_json()}, bound)
            except BulldozerError as cleanup:  # the DAL may be the thing that failed
                # a store gone or out of room refuses the record of its own failure too, for
                # the same reason: the run's one error line says it already, and the version
                # left LOADING is resumed or goes with the next gc
                same = isinstance(exc, KvError) and type(cleanup) is type(exc)
                log.log(
                    logging.INFO if same else logging.WARNING,
                    "could not record the failure of %s: %s",
                    record.version,
                    cleanup,
                )
        return exc

    def _dropped_under_the_run(self, exc: BaseException) -> NamespaceStateError | None:
        """The error to say when ``exc`` came of this run's version being dropped while the
        run made it (``bulldozer namespace drop``, ``gc``), else None."""
        if not (self.version_created and isinstance(exc, NamespaceNotFoundError | NamespaceStateError)):
            return None
        try:
            state = self.client.describe(self.record.version).state
        except BulldozerError:
            return None
        if state != State.DROPPED:
            return None
        return NamespaceStateError(
            f"{self.record.version} was dropped while this run made it (bulldozer namespace drop, or gc); "
            "the alias was not moved"
        )

    def record_refusal(self) -> None:
        """Keep a run refused before it created its version (a breaking schema, a spec the
        table does not match) as a FAILED version that holds no data, so ``bulldozer runs``,
        the console and the job metrics show it with its reason; retention drops it like any
        FAILED version. Nothing is recorded when the alias is not a valid name or the DAL
        does not answer (the error is the same either way)."""
        record = self.record
        try:
            record.version = new_version_name(self.spec.alias)
            labels = {SPEC_LABEL: record.spec_sha256, STAGE_LABEL: "failed", RUN_LABEL: record.to_json()}
            self.client.create_namespace(
                record.version,
                self.spec.alias,
                job_name=self.spec.metadata.name,
                snapshot_id=record.snapshot_id,
                labels=labels,
            )
            self.client.mark_failed(record.version, record.error)
        except BulldozerError as cleanup:
            log.warning("could not record the refused run of %s: %s", self.spec.alias, cleanup)
            record.version = ""

    def lineage_start(self) -> None:
        """The run's START event, once its snapshot is pinned (bulldozer.lineage)."""
        if self.lineage is not None:
            self.lineage.fields = self.source_fields
            self.lineage.start(self.record)

    def lineage_fail(self) -> None:
        if self.lineage is not None:
            self.lineage.fail(self.record)

    def restore(self, version: str) -> NamespaceRecord:
        """Pick up a version an earlier stage (another process) created and loaded; its
        namespace record."""
        info = self.client.describe(version)
        if info.alias != self.spec.alias:
            raise NamespaceStateError(f"{version!r} is a version of {info.alias!r}, not {self.spec.alias!r}")
        saved = run_record_of(info)
        if saved is not None:
            saved.outcome, saved.error, saved.failed_stage = "running", "", ""
            self.record = saved
            self.stage.record = saved
        self.record.version = version
        self.version_created = True
        loaded = loaded_of(info)
        if loaded is None and info.state == State.LOADING:
            raise NamespaceStateError(f"{version!r} has not finished its load stage; run the load stage first")
        if loaded is not None:
            self.record.rows, self.digest_value, self.null_counts = loaded.rows, loaded.digest, dict(loaded.null_counts)
            self.load_done = True
        previous = self.record.previous
        self.live = self.client.describe(previous) if previous else None
        if info.state in MADE_IN:  # not flipped yet: this run makes it
            self.beat()
        return info


def run_job(
    loaded: LoadedSpec,
    client: KvClient,
    *,
    engine: str | LoadEngine = "local",
    home: str | None = None,
    resume: str | None = None,
    on_stage: Callable[[str], None] = lambda stage: None,
    progress: Callable[[int, int], None] = lambda done, total: None,
    on_failure: Callable[[RunRecord], None] | None = None,
    allow_breaking: bool = False,
    take_over: bool = False,
) -> RunRecord:
    """Run the job once; returns the run record (raises a BulldozerError on failure,
    after marking the version FAILED and leaving the alias untouched; ``on_failure`` gets
    the failed run's record first). Retention failing after the flip does not fail the run:
    the record's ``retention_error`` says why. ``on_stage`` is called as each stage starts.
    """
    run = JobRun(
        loaded,
        client,
        engine=engine,
        home=home,
        on_stage=on_stage,
        progress=progress,
        allow_breaking=allow_breaking,
        take_over=take_over,
    )
    stage = run.stage
    try:
        with stage("schema"):
            run.schema(start_engine=True)
        run.lineage_start()
        with stage("create"):
            run.create(resume, load_follows=True)
        if not run.load_done:
            with stage("load"):
                run.load(seal_follows=True)
        with stage("verify"):
            run.verify()
        with stage("flip"):
            run.flip()
        with stage("retention"):
            run.retention_after_flip()
        record = run.finish()
        if run.lineage is not None:
            run.lineage.complete(record)
        return record
    except BaseException as exc:
        said = run.failed(exc)
        run.lineage_fail()
        if on_failure is not None:
            on_failure(run.record)
        if said is not exc:
            raise said from exc
        raise
    finally:
        run.stop_beating()


def refuse_if_being_made(version: NamespaceRecord, now: datetime) -> None:
    """Refuse to take up ``version`` while another run is making it (its heartbeat is
    fresh at ``now``, the DAL's time: ``run_state.being_made``): two runs loading one
    version fail each other (the first to seal freezes it under the other, which marks it
    FAILED). A run killed on this machine is known to have ended at once; one elsewhere,
    once it has been silent for ``ALIVE_WITHIN``."""
    if (maker := being_made_by(version, now)) is not None:
        raise NamespaceStateError(
            f"cannot resume {version.name!r}: a run is making it now ({maker}); resume it once that run has "
            f"ended, or has been silent for {int(ALIVE_WITHIN.total_seconds() // 60)} minutes"
        )


def find_run_version(client: KvClient, alias: str, run_key: str) -> NamespaceRecord | None:
    """The version a run with this scheduler key created (newest first), if any."""
    for info in reversed(client.list_namespaces(alias)):
        if run_key_of(info) == run_key:
            return info
    return None


def run_stage(
    stage_name: str,
    loaded: LoadedSpec,
    client: KvClient,
    *,
    version: str | None = None,
    run_key: str = "",
    engine: str | LoadEngine = "local",
    home: str | None = None,
    progress: Callable[[int, int], None] = lambda done, total: None,
    allow_breaking: bool = False,
    take_over: bool = False,
) -> RunRecord:
    """Run one stage, safe to retry, for a scheduler that calls stages separately.

    ``load`` creates the version (or, retried with the same ``run_key``, resumes the one
    its first attempt created) and returns it in the record; ``verify``, ``flip`` and
    ``retention`` take it as ``version`` (or find it by ``run_key``). A retried ``flip``
    is a no-op once the alias points at the version. A load that fails for a reason a
    retry cannot fix (bad data, a breaking schema) marks the version FAILED; one that
    fails otherwise (the DAL went away, the task was killed) leaves it LOADING for the
    retry to resume. A failed verify marks it FAILED; the alias never moves.
    """
    if stage_name not in STAGES:
        raise InvalidArgumentError(f"unknown stage {stage_name!r}; stages: {', '.join(STAGES)}")
    run = JobRun(
        loaded,
        client,
        engine=engine,
        home=home,
        progress=progress,
        run_key=run_key,
        allow_breaking=allow_breaking,
        take_over=take_over,
    )
    try:
        return _run_one_stage(run, stage_name, loaded, client, version, run_key, home)
    finally:
        run.stop_beating()


def _run_one_stage(
    run: JobRun,
    stage_name: str,
    loaded: LoadedSpec,
    client: KvClient,
    version: str | None,
    run_key: str,
    home: str | None,
) -> RunRecord:
    """``run_stage``'s stage ``stage_name`` of ``run``."""
    stage = run.stage
    if stage_name == "validate":
        from bulldozer.schema.table_check import check_against_catalog

        with stage("validate"):
            issues = check_against_catalog(loaded, home=home)
            if issues:
                refused = SpecError(issues)
                run.failed(refused)
                raise refused
        run.record.outcome = "succeeded"
        return run.record
    if stage_name in ("schema", "load"):
        try:
            with stage("schema"):
                run.schema(start_engine=stage_name == "load")
            if stage_name == "schema":
                run.record.outcome = "succeeded"
                return run.record
            earlier = find_run_version(client, run.spec.alias, run_key) if run_key else None
            if earlier is not None and earlier.state in (State.LOADING, State.SEALING):
                refuse_if_being_made(earlier, client.now())  # an earlier attempt still at it (a task taken for lost)
            if earlier is not None and earlier.state == State.LOADING and not base_copied(earlier):
                # the first attempt was killed while the DAL made its version from a base: a new one
                client.mark_failed(earlier.name, f"its copy of the base {earlier.base} was interrupted")
                log.info("run %s: %s never held all of its base; a new version is made", run_key, earlier.name)
                earlier = None
            if earlier is not None and earlier.state == State.LOADING and (mixed := run.mixes_with(earlier)):
                # the spec or the table's schema changed between attempts: the records would mix
                client.mark_failed(earlier.name, f"not resumed: {mixed}")
                log.info("run %s: %s is not resumed (%s); a new version is made", run_key, earlier.name, mixed)
                earlier = None
            if earlier is not None and earlier.state != State.LOADING:
                if earlier.state in _LOADED_STATES and loaded_of(earlier) is not None:
                    run.restore(earlier.name)  # an earlier attempt already loaded it
                    run.record.outcome = "succeeded"
                    return run.record
                raise NamespaceStateError(
                    f"run {run_key!r} already made {earlier.name}, which is {earlier.state.value}; start a new run"
                )
            with stage("create"):
                run.create(earlier.name if earlier is not None else version, load_follows=True)
            if earlier is None:
                run.lineage_start()  # once per run: a resumed load was started by its first attempt
            with stage("load"):
                run.load()
        except BaseException as exc:
            said = run.failed(exc, final=isinstance(exc, _FINAL))
            if isinstance(exc, _FINAL):
                run.lineage_fail()
            if said is not exc:
                raise said from exc
            raise
        run.record.outcome = "succeeded"
        return run.record
    name = version or (found.name if run_key and (found := find_run_version(client, run.spec.alias, run_key)) else None)
    if not name:
        raise InvalidArgumentError(
            f"the {stage_name} stage needs the version the load stage made (--version or a run key)"
        )
    made = run.restore(name)
    try:
        with stage(stage_name):
            if stage_name != "retention" and made.state in MADE_IN and (other := run.other_spec(made)) is not None:
                # the spec changed between a scheduler's stage tasks: its gates and shadow read
                # would judge records another text of it chose
                raise VerificationError(
                    f"{name} is not verified or made live under a spec that did not load it: {other}; start a new run"
                )
            {"verify": run.verify, "flip": run.flip, "retention": run.retention_after_flip}[stage_name]()
    except BaseException as exc:
        final = not isinstance(exc, KvError) and (stage_name == "verify" or isinstance(exc, VerificationError))
        said = run.failed(exc, final=final)
        if final:
            run.lineage_fail()
        if said is not exc:
            raise said from exc
        raise
    if stage_name == "retention":
        record = run.finish()
        if run.lineage is not None:
            run.lineage.complete(record)
        if record.retention_error:  # the task fails (and retries); the version stays live
            raise RetentionError(f"{record.version} is live, but retention failed: {record.retention_error}")
        return record
    if run.record.outcome != "pinned":  # a flip kept back by a pinned alias says so
        run.record.outcome = "succeeded"
    return run.record
