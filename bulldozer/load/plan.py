"""``bulldozer plan``: what a run would do, without writing anything."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from bulldozer.errors import UnreadableFilesError
from bulldozer.kv.client import KvClient
from bulldozer.schema.job import build_job_schema
from bulldozer.spec.loader import LoadedSpec
from bulldozer.versioning.retention import plan_retention
from bulldozer.warehouse.catalog import load_table, open_catalog, read_snapshot
from bulldozer.warehouse.files import checked_tasks, snapshot_files

if TYPE_CHECKING:
    from bulldozer.versioning.run_state import RunRecord

__all__ = ["RunPlan", "measured_rate", "plan_run"]

#: rows/s assumed when no earlier run of the job measured one (local engine, nested rows)
DEFAULT_RATE = 60_000.0


@dataclass
class RunPlan:
    job: str
    alias: str
    engine: str
    table: str
    snapshot_id: int
    files: int
    rows: int
    bytes: int
    live_version: str | None
    live_rows: int | None
    estimated_seconds: float
    rate_source: str
    schema_differences: list[dict[str, str]] = field(default_factory=list)
    schema_breaking: bool = False
    retention_drops_now: list[str] = field(default_factory=list)
    retention_drops_after_grace: list[str] = field(default_factory=list)
    retention_keeps: list[str] = field(default_factory=list)
    #: "delta" when the run would write the live version plus the changed files' rows
    mode: str = "full"
    #: why a run whose spec asks for a delta would write the whole table
    full_reason: str = ""
    #: a delta: the rows of the changed files it would read (and the files)
    delta_rows: int = 0
    delta_files: int = 0
    #: a delta: the keys its equality deletes by the job's key name, whose base records it
    #: would take by key instead of reading the files they delete from (``load.delta``)
    delta_keys: int = 0
    #: the job the alias serves (its live version's), when it is not this spec's: a run is
    #: refused unless it takes the alias over (``JobRun.owner_issue``)
    other_job: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def measured_rate(records: Iterable[RunRecord | None], engine: str, mode: str) -> tuple[float, str]:
    """The rows/s a run in ``mode`` on ``engine`` is estimated at, and where it comes from:
    the newest successful run of that engine that measured one, one of the same mode first.
    A run's rate is the rows its load stage read over that stage's seconds: a delta run's
    rows read, not its version's (it read the changed files only: a 10 M-row version's delta
    that read 400 k rows in 0.4 s made the next plan estimate a full run at 0.4 s, not 5.8).
    ``records`` (newest first) are read only until a run of the planned mode measured one:
    an alias's versions, dropped ones included, grow with every run."""
    rates: dict[str, tuple[float, str]] = {}
    for record in records:
        if record is None or record.engine != engine or record.outcome != "succeeded" or not record.load_seconds:
            continue
        read = record.delta.get("rows_read", 0) if record.mode == "delta" else record.rows
        if read and record.mode not in rates:
            what = f"{record.mode} run" if record.mode == "delta" else "run"
            rates[record.mode] = read / max(record.load_seconds, 1e-3), f"measured by {engine} {what} {record.run_id}"
            if record.mode == mode:  # the newest of the planned mode: older records are not read
                break
    default = (DEFAULT_RATE, f"default estimate (no earlier {engine} run measured one)")
    return rates.get(mode) or next(iter(rates.values()), default)


def plan_run(loaded: LoadedSpec, client: KvClient, home: str | None = None, engine: str = "local") -> RunPlan:
    """What a run on ``engine`` would do; its time from that engine's latest successful run
    of the job (engines differ several-fold: Spark pays its start-up, a cluster scales)."""
    from bulldozer.load.engines.local import _scan, scan_tasks
    from bulldozer.load.source import schema_at, source_label
    from bulldozer.schema.table_check import require_columns, require_filter
    from bulldozer.versioning.flip import live_version
    from bulldozer.versioning.run_state import run_record_of

    spec = loaded.spec
    dm = spec.data_movement
    if engine == "spark":
        from bulldozer.load.engines.spark.catalog import refuse_unopenable

        refuse_unopenable(dm.catalog)
    catalog = open_catalog(dm.catalog, home, create=False)
    live = live_version(client, spec.alias)
    previous = live.value_descriptor_set if live and live.value_descriptor_set else None
    files = rows = nbytes = 0
    mode, full_reason, delta_rows, delta_files, delta_keys = "full", "", 0, 0, 0
    if dm.source.query is not None or dm.duplicate_keys.policy == "keep_latest":
        # what the query reads: an upper bound of what it moves
        from bulldozer.load.source import build_sql_source

        sql = build_sql_source(loaded, catalog, schema_at)
        job = build_job_schema(spec, sql.schema, source_label(spec), previous, python=False)
        snapshot_id = next(iter(sql.snapshots.values())) if len(sql.snapshots) == 1 else 0
        for table, snap in sql.tables.values():
            for task in checked_tasks(table.scan(snapshot_id=snap), spark_reads=False):
                files, rows, nbytes = files + 1, rows + task.file.record_count, nbytes + task.file.file_size_in_bytes
        source_name = dm.source.table or "query over " + ", ".join(sorted(sql.tables))
    else:
        assert dm.source.table is not None
        table = load_table(catalog, dm.source.table)
        # a pinned snapshot, branch or tag the table lacks fails the plan as it would the run;
        # a table with no snapshot yet plans an empty version
        pinned = dm.snapshot_id is not None or dm.ref is not None
        snapshot = read_snapshot(table, dm.source.table, dm.snapshot_id, dm.ref) if pinned else table.current_snapshot()
        snapshot_id = snapshot.snapshot_id if snapshot else 0
        schema = schema_at(table, snapshot_id) if snapshot_id else table.schema()
        require_columns(loaded, schema, "table")
        require_filter(loaded, table.schema())  # as the run's schema stage: before the scan plans it
        job = build_job_schema(spec, schema, source_label(spec), previous, python=False)
        if snapshot_id:
            from bulldozer.load.engines.base import LoadPlan

            lp = LoadPlan(spec, table, snapshot_id, job.proto, "")
            scan = _scan(lp, lp.columns)
            try:
                data_files = [task.file for task in scan_tasks(scan)]
            except UnreadableFilesError:
                if engine != "spark":
                    raise
                from pyiceberg.manifest import DataFileContent

                # Spark's reader applies them (SparkEngine): the snapshot's data files, before deletes
                data_files = [f for f in snapshot_files(scan) if f.content == DataFileContent.DATA]
            for file in data_files:
                files, rows, nbytes = files + 1, rows + file.record_count, nbytes + file.file_size_in_bytes
            if dm.mode != "full":
                from bulldozer.load.delta import plan_delta

                uuid = str(table.metadata.table_uuid)
                delta = plan_delta(spec, loaded.sha256, table, uuid, snapshot_id, job, live, lp.columns)
                if isinstance(delta, str):
                    full_reason = delta
                else:
                    mode, delta_rows = "delta", delta.rows_to_read
                    delta_files = len(delta.removed) + len(delta.added) - delta.reread  # a file read twice once
                    delta_keys = sum(f.record_count for f in delta.by_key)
        source_name = dm.source.table
    versions = client.list_namespaces(spec.alias)
    rate, source = measured_rate((run_record_of(ns) for ns in reversed(versions)), engine, mode)
    retention = spec.key_value_dal.retention
    # after this run the live version would be retired too, by the next flip (the one that
    # made it live retired the version before it, at the same generation and time)
    from dataclasses import replace

    from bulldozer.kv.types import State

    now = client.now()  # the DAL's: the clock the versions' ages are told on
    after = [
        replace(v, state=State.RETIRED, state_changed=now, alias_generation=v.alias_generation + 1)
        if live and v.name == live.name
        else v
        for v in versions
    ]
    keep = plan_retention(after, retention.keep_versions, retention.grace_period, now)
    differences = [asdict(d) for d in job.compat.differences] if job.compat else []
    return RunPlan(
        job=spec.metadata.name,
        alias=spec.alias,
        engine=engine,
        table=source_name,
        snapshot_id=snapshot_id,
        files=files,
        rows=rows,
        bytes=nbytes,
        live_version=live.name if live else None,
        live_rows=live.record_count if live else None,
        estimated_seconds=round((delta_rows if mode == "delta" else rows) / rate, 1),
        rate_source=source,
        schema_differences=differences,
        schema_breaking=bool(job.compat and job.compat.breaking),
        retention_drops_now=keep.drop,
        retention_drops_after_grace=keep.waiting,
        retention_keeps=keep.keep,
        mode=mode,
        full_reason=full_reason,
        delta_rows=delta_rows,
        delta_files=delta_files,
        delta_keys=delta_keys,
        other_job=live.job_name if live and live.job_name and live.job_name != spec.metadata.name else "",
    )
