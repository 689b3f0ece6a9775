"""One Airflow DAG per spec in the specs folder, one task per stage of the run.

``build_dags()`` is what the thin loader in ``dags/`` calls. Each DAG has the spec's
schedule, owner, tags, retries and time limit (each stage task's ``execution_timeout``),
and the tasks validate → schema → load → verify → flip → retention, each a Python task
calling :func:`bulldozer.load.runner.run_stage` with the DAG run's id as the run key: a
retried load resumes the version its first attempt created, later stages find that
version by the key, and a retried flip is a no-op. Only transient failures are retried:
one that trying again cannot change (an invalid spec, a breaking schema change, duplicate
keys, a refused gate: errors whose ``retryable`` is False) fails the task at once
(``AirflowFailException``). Spark loads run from the Python task through the load engine
(no Spark provider).

A spec that does not validate never breaks the others: it is logged, and shows up as a
DAG ``bulldozer_invalid__<file>`` whose one task fails with the validation errors (so it
is visible and alerts like any failure). With ``BULLDOZER_DAGS_STRICT=1`` the first bad
spec raises instead, and Airflow reports the loader file as broken.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Container
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from bulldozer.errors import BulldozerError
from bulldozer.load.runner import STAGES
from bulldozer.schedule.jobs import find_specs, specs_folder
from bulldozer.settings import load_settings
from bulldozer.spec.loader import LoadedSpec, load_spec
from bulldozer.spec.policy import time_limit

__all__ = ["INVALID_PREFIX", "alias_asset_uri", "build_dags", "bulldozer_task_group", "run_stage_task"]

log = logging.getLogger("bulldozer.dags")
INVALID_PREFIX = "bulldozer_invalid__"
START = datetime(2024, 1, 1, tzinfo=UTC)


def alias_asset_uri(alias: str) -> str:
    """The Airflow Asset a job's flip updates: a downstream DAG scheduled on it runs once the
    alias points at a new version."""
    return f"bulldozer://{alias}"


def table_asset_uri(loaded: LoadedSpec) -> str | None:
    """The Asset of the Iceberg table a job reads (None for a query source)."""
    source = loaded.spec.data_movement.source
    if not source.table:
        return None
    namespace, _, table = source.table.rpartition(".")
    return f"iceberg://{loaded.spec.data_movement.catalog.name}/{namespace}/{table}"


def run_stage_task(spec_file: str, stage: str, **context: Any) -> str:
    """The body of every task: run one stage of the spec's job; returns the version."""
    from bulldozer.kv.connect import connect_for_spec
    from bulldozer.load.runner import run_stage
    from bulldozer.logs import configure_logging

    configure_logging("info", "text")
    run_key = f"{context['dag'].dag_id}/{context['run_id']}"
    task = context.get("task")
    group = getattr(task, "task_id", "").rpartition(".")[0] if task is not None else ""
    if group:  # a task group in a user's own DAG (bulldozer_task_group): one key per job
        run_key += f"/{group}"
    settings = load_settings()
    engine = settings.load_engine
    home = str(settings.home) if settings.home else None
    try:
        loaded = load_spec(Path(spec_file))
        with connect_for_spec(loaded, home) as client:
            record = run_stage(stage, loaded, client, run_key=run_key, engine=engine, home=home)
            store = client.store
    except BulldozerError as exc:
        if exc.retryable:
            raise  # transient (the DAL unavailable, a timeout...): the DAG's retries apply
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(f"{type(exc).__name__}: {exc} (not retried: trying again cannot change it)") from exc
    log.info("%s %s: %s (%s)", loaded.spec.metadata.name, stage, record.outcome, record.version or "-")
    if task is not None and hasattr(task, "bulldozer_run"):
        task.bulldozer_run = (loaded, store, record)  # for its OpenLineage method
    if stage == "flip":
        _flipped(loaded, record, context)
    return record.version


def _flipped(loaded: LoadedSpec, record: Any, context: dict[str, Any]) -> None:
    """The flip task's Asset event: its extra names the version, rows and snapshot. A flip
    kept back by a pinned alias moved nothing: the task is skipped, so no event is sent."""
    from airflow.sdk import Asset
    from airflow.sdk.exceptions import AirflowSkipException

    if record.outcome == "pinned":
        raise AirflowSkipException(f"{record.version} was built and verified but not made live: {record.error}")
    events = context.get("outlet_events")
    if events is not None:
        events[Asset(alias_asset_uri(loaded.spec.alias))].extra = {
            "alias": loaded.spec.alias,
            "version": record.version,
            "rows": record.rows,
            "snapshot_id": record.snapshot_id,
        }


def _fail_invalid(message: str, **context: Any) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    raise AirflowFailException(message)  # an invalid spec stays invalid: no retry


def _markdown_code(text: str, block: bool = False) -> str:
    """``text`` as Markdown code (a fenced block, or inline) that nothing in it can end
    early: a DAG's documentation is Markdown the Airflow UI renders, and what it quotes (a
    spec's file name, the spec's own text in an error) is a team's. Fenced by one backtick
    more than its longest run of them (CommonMark); inline, on one line."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    if block:
        fence = "`" * max(3, longest + 1)
        return f"{fence}\n{text}\n{fence}"
    flat = " ".join(text.splitlines())
    ticks, pad = "`" * (longest + 1), " " if flat.startswith("`") or flat.endswith("`") else ""
    return f"{ticks}{pad}{flat}{pad}{ticks}"


def _dag_for(path: Path, loaded: LoadedSpec) -> Any:
    from airflow.sdk import DAG

    meta = loaded.spec.metadata
    limit = time_limit(loaded)  # a spec asking for more than the operator allows: an invalid DAG, made instead
    dag = DAG(
        dag_id=meta.name,
        description=meta.description or f"Bulldozer: {path.name} → alias {loaded.spec.alias}",
        schedule=meta.schedule,
        # the cron's times are the spec's zone's, summer time included (Airflow takes the zone
        # of the start date)
        start_date=START.replace(tzinfo=ZoneInfo(meta.timezone)),
        catchup=False,
        max_active_runs=1,
        tags=sorted({"bulldozer", *meta.tags}),
        default_args={"owner": meta.owner, "retries": meta.retries, "retry_delay": meta.retry_delay},
        doc_md=f"Loads {_markdown_code(str(path))} into alias `{loaded.spec.alias}` (stages: {' → '.join(STAGES)}).",
    )
    with dag:
        _stage_tasks(path, loaded, limit)
    return dag


def _stage_tasks(path: Path, loaded: LoadedSpec, limit: tuple[timedelta, str] | None) -> tuple[Any, Any]:
    """The job's stage tasks, chained, in the DAG (or task group) being defined: the load
    reads the table's Asset, the flip updates the alias's; each is stopped past ``limit``
    (``time_limit``). The first and the last task."""
    from airflow.sdk import Asset

    table = table_asset_uri(loaded)
    tasks: list[Any] = []
    for stage in STAGES:
        extra: dict[str, Any] = {}
        if limit is not None:  # Airflow stops a task past it (SIGALRM), as the CLI stops a run
            extra["execution_timeout"] = limit[0]
        if stage == "load" and table is not None:
            extra["inlets"] = [Asset(table)]
        if stage == "flip":
            extra["outlets"] = [Asset(alias_asset_uri(loaded.spec.alias))]
        task = _stage_operator()(
            task_id=stage,
            python_callable=run_stage_task,
            op_kwargs={"spec_file": str(path), "stage": stage},
            **extra,
        )
        if tasks:
            tasks[-1] >> task
        tasks.append(task)
    return tasks[0], tasks[-1]


@functools.cache
def _stage_operator() -> Any:
    """The stage tasks' operator: a PythonOperator that tells Airflow's OpenLineage provider
    (when installed) the run's datasets, as bulldozer.lineage makes them from the record."""
    from airflow.providers.standard.operators.python import PythonOperator

    class BulldozerStageOperator(PythonOperator):
        #: (spec, store, run record) of the stage that ran, set by run_stage_task
        bulldozer_run: tuple[LoadedSpec, str, Any] | None = None

        def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
            from airflow.providers.openlineage.extractors import OperatorLineage

            from bulldozer.lineage import datasets, store_namespace

            if self.bulldozer_run is None:
                return OperatorLineage()
            loaded, store, record = self.bulldozer_run
            inputs, outputs, facets = datasets(loaded, store_namespace(store), [], record, "COMPLETE")
            return OperatorLineage(inputs=inputs, outputs=outputs, run_facets=facets)

    return BulldozerStageOperator


def bulldozer_task_group(spec_file: str | os.PathLike[str], group_id: str | None = None) -> Any:
    """A job's stages as a task group for your own DAG, the same tasks the generated DAGs run
    (resume by run key, fail fast, the Assets), e.g.::

        with DAG("features", schedule="@daily", start_date=...) as dag:
            extract >> bulldozer_task_group("specs/user_item_scores.yaml") >> notify

    ``group_id`` defaults to the job's name; the spec is validated here, so a bad spec is an
    import error of your DAG file."""
    from airflow.sdk import TaskGroup

    path = Path(spec_file).absolute()
    loaded = load_spec(path)
    limit = time_limit(loaded)
    with TaskGroup(group_id=group_id or loaded.spec.metadata.name) as group:
        _stage_tasks(path, loaded, limit)
    return group


def _invalid_dag(path: Path, message: str, taken: Container[str]) -> Any:
    """The DAG reporting ``path``'s failure: ``bulldozer_invalid__<file stem>``, with ``_2``,
    ``_3``... when another file's report took that id (``a-b.yaml`` and ``a_b.yml`` both
    become ``a_b``: one report hid the other's)."""
    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.sdk import DAG

    base = INVALID_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", path.stem)
    dag_id, n = base, 1
    while dag_id in taken:
        n += 1
        dag_id = f"{base}_{n}"
    dag = DAG(
        dag_id=dag_id,
        description=f"INVALID spec {path.name}: fix it and submit again",
        schedule=None,
        start_date=START,
        catchup=False,
        tags=["bulldozer", "bulldozer-invalid"],
        doc_md=f"{_markdown_code(str(path))} does not validate:\n\n{_markdown_code(message, block=True)}",
    )
    PythonOperator(task_id="invalid_spec", python_callable=_fail_invalid, op_kwargs={"message": message}, dag=dag)
    return dag


def build_dags(folder: Path | None = None, strict: bool | None = None) -> dict[str, Any]:
    """DAG id → DAG for every spec in ``folder`` (default: the specs folder)."""
    folder = folder or specs_folder()
    strict = load_settings().dags_strict if strict is None else strict
    dags: dict[str, Any] = {}
    owners: dict[str, Path] = {}
    for path in find_specs(folder):
        try:
            loaded = load_spec(path)
            name = loaded.spec.metadata.name
            if name in owners:
                raise BulldozerError(f"{path}: job name {name!r} is already used by {owners[name]}")
            if name.startswith(INVALID_PREFIX):
                raise BulldozerError(f"{path}: job names may not start with {INVALID_PREFIX!r}")
            dag = _dag_for(path, loaded)
        except Exception as exc:  # any failure of one spec (RecursionError, MemoryError, OSError...) is its own
            if strict:
                raise
            message = _describe_failure(path, exc)
            log.error("bulldozer: skipping invalid spec %s:\n%s", path, message)
            dag = _invalid_dag(path, message, dags)
            dags[dag.dag_id] = dag
            continue
        owners[name] = path
        dags[name] = dag
    return dags


def _describe_failure(path: Path, exc: Exception) -> str:
    """One spec's failure as its invalid DAG shows it: the spec's issues, a Bulldozer error's
    message, or only the kind of an unexpected failure (its text may quote the file). Each
    issue on one line, as ``validate`` prints it (``visible``: a key the spec spells with a
    line break or a terminal's escape is written out)."""
    from bulldozer.redaction import visible

    if isinstance(exc, BulldozerError):
        return "\n".join(visible(str(i)) for i in getattr(exc, "issues", [])) or visible(str(exc))
    return f"{path}: the spec could not be loaded ({type(exc).__name__})"
