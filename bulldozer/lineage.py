"""OpenLineage events of runs, through the ``openlineage-python`` client (``bulldozer[lineage]``).

A run emits START once its snapshot is pinned, then COMPLETE or FAIL: input, each Iceberg
table read at its snapshot (namespace ``iceberg://<catalog>``, with its schema and the
snapshot as the dataset version); output, the alias (namespace ``bulldozer://<store>``, ``store_namespace``)
with the new version, its row count and size; run facets, the quality gates' results (and
the error of a failed run). The job is the spec's job name in the namespace ``bulldozer``.

Only when the operator has configured OpenLineage the way its client reads it —
``OPENLINEAGE_URL``, an ``OPENLINEAGE__TRANSPORT__*`` variable, ``OPENLINEAGE_CONFIG`` or
``~/.openlineage/openlineage.yml`` — is the client imported at all; otherwise nothing is
emitted and nothing is paid. An ``openlineage.yml`` in the working directory, which the
client would read first, is not the operator's: a run then emits nothing and says why
(``_foreign_config``). Events are sent from a background thread while the run goes on; the end
of a run waits at most ``SEND_WAIT_SECONDS`` for them. Lineage never fails a run: a
transport that is down, or a client that is not installed, is one warning line.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bulldozer import __version__
from bulldozer.settings import environment

if TYPE_CHECKING:
    from bulldozer.spec.loader import LoadedSpec
    from bulldozer.versioning.run_state import RunRecord

__all__ = ["JOB_NAMESPACE", "Lineage", "datasets", "lineage_for", "store_namespace"]

log = logging.getLogger("bulldozer.lineage")

JOB_NAMESPACE = "bulldozer"
PRODUCER = f"https://github.com/bulldozer/bulldozer/tree/{__version__}"
#: how long the end of a run waits for its events to be sent
SEND_WAIT_SECONDS = 5.0


def _configured() -> bool:
    """Has the operator configured OpenLineage: its variables, or the home folder's file (an
    ``openlineage.yml`` in the working directory is not the operator's: ``_foreign_config``)?"""
    env = environment()
    if env.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    if any(k == "OPENLINEAGE_URL" or k == "OPENLINEAGE_CONFIG" or k.startswith("OPENLINEAGE__") for k in env):
        return True
    return (Path.home() / ".openlineage" / "openlineage.yml").is_file()


def _foreign_config() -> Path | None:
    """The ``openlineage.yml`` of the working directory that the OpenLineage client would
    read (it looks there before ``~/.openlineage``, unless ``OPENLINEAGE_CONFIG`` names a
    file), or None. The working directory is whatever a command is run from — a checkout of
    a repository of specs, say — and such a file chooses where a run's events go (any URL,
    any file, a transport class of its naming, imported) and what they carry (the values of
    any environment variables it lists: tokens, cloud credentials)."""
    if environment().get("OPENLINEAGE_CONFIG"):
        return None
    found = Path.cwd() / "openlineage.yml"
    return found if found.is_file() else None


def _configuration_problem() -> str | None:
    """Why the operator's OpenLineage configuration sends no event anywhere, in one line;
    None when it names a transport. The client reads its file itself (``OPENLINEAGE_CONFIG``,
    else ``~/.openlineage/openlineage.yml``), but one that does not parse it logs with its
    traceback, a file ``OPENLINEAGE_CONFIG`` names that is missing it passes over in a debug
    line, and without a transport it sends the events to its console logger, where no
    command shows them ("will print events to console")."""
    import yaml

    from bulldozer.config_files import load_yaml
    from bulldozer.redaction import yaml_problem, yaml_where

    env = environment()
    named = env.get("OPENLINEAGE_CONFIG")
    path = Path(named) if named else Path.home() / ".openlineage" / "openlineage.yml"
    data: object = {}
    if named or path.is_file():
        try:
            data = load_yaml(path.read_text(encoding="utf-8"))
        except OSError as exc:
            return f"its configuration {path} cannot be read: {exc.strerror or exc}"
        except UnicodeDecodeError:
            return f"its configuration {path} is not UTF-8 text"
        except yaml.YAMLError as exc:
            return f"its configuration {yaml_where(path, exc)} does not parse: {yaml_problem(exc)}"
        if not isinstance(data, dict):
            return f"its configuration {path} holds no mapping (transport, facets, ...)"
    transport = data.get("transport") if isinstance(data, dict) else None
    if isinstance(transport, dict) and transport.get("type"):
        return None
    if env.get("OPENLINEAGE_URL") or any(k.startswith("OPENLINEAGE__TRANSPORT") for k in env):
        return None
    which = path if named or path.is_file() else "(its OPENLINEAGE__ variables)"
    return (
        f"its configuration {which} names no transport "
        "(transport.type in the file, OPENLINEAGE__TRANSPORT__TYPE or OPENLINEAGE_URL)"
    )


class Lineage:
    """The events of one run."""

    def __init__(self, client: Any, loaded: LoadedSpec, store: str, wait_seconds: float = SEND_WAIT_SECONDS) -> None:
        self.client = client
        self.loaded = loaded
        self.namespace = store_namespace(store)
        self.fields: list[tuple[str, str]] = []  # the source table's columns, when known
        self.wait_seconds = wait_seconds
        self._queue: queue.Queue[tuple[str, str, Any] | None] = queue.Queue()
        self._done = threading.Event()
        self._broken = False
        self._sender: threading.Thread | None = None

    def start(self, record: RunRecord) -> None:
        self._emit("START", record)

    def complete(self, record: RunRecord) -> None:
        self._emit("COMPLETE", record)
        self._finish()

    def fail(self, record: RunRecord) -> None:
        self._emit("FAIL", record)
        self._finish()

    def _emit(self, kind: str, record: RunRecord) -> None:
        try:
            event = self._event(kind, record)  # now: the record changes as the run goes on
        except Exception as exc:  # lineage never fails a run
            log.warning("OpenLineage: the %s event of run %s could not be made: %s", kind, record.run_id, exc)
            return
        if self._sender is None:
            # a daemon thread, started by the first event (a stage that sends none starts
            # none): the run never waits on a slow transport beyond wait_seconds, and the
            # process may exit while it still retries
            self._sender = threading.Thread(target=self._send_all, name="lineage", daemon=True)
            self._sender.start()
        self._queue.put((kind, record.run_id, event))

    def _send_all(self) -> None:
        while (item := self._queue.get()) is not None:
            kind, run_id, event = item
            if self._broken:
                continue
            try:
                self.client.emit(event)
            except Exception as exc:
                self._broken = True  # one line per run, and no more waiting on this transport
                log.warning("OpenLineage: the %s event of run %s was not sent (nor later ones): %s", kind, run_id, exc)
        self._done.set()

    def _finish(self) -> None:
        """Let the events go out, waiting at most ``wait_seconds``."""
        if self._sender is None:
            return  # nothing was sent
        self._queue.put(None)
        if not self._done.wait(self.wait_seconds):
            log.warning(
                "OpenLineage: events still unsent after %.0f s; the run does not wait for them", self.wait_seconds
            )

    def _event(self, kind: str, record: RunRecord) -> Any:
        from datetime import UTC, datetime

        from openlineage.client.event_v2 import Job, Run, RunEvent, RunState

        inputs, outputs, run_facets = datasets(self.loaded, self.namespace, self.fields, record, kind)
        return RunEvent(
            eventType=getattr(RunState, kind),
            eventTime=datetime.now(UTC).isoformat(),
            run=Run(runId=str(uuid.uuid5(uuid.NAMESPACE_URL, f"bulldozer-run:{record.run_id}")), facets=run_facets),
            job=Job(namespace=JOB_NAMESPACE, name=self.loaded.spec.metadata.name),
            producer=PRODUCER,
            inputs=inputs,
            outputs=outputs,
        )


def datasets(
    loaded: LoadedSpec, namespace: str, fields: list[tuple[str, str]], record: RunRecord, kind: str
) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """A run's OpenLineage inputs, outputs and run facets as its record says them (``kind``:
    START, COMPLETE or FAIL); used for this module's events and by the Airflow tasks'
    OpenLineage methods (bulldozer.schedule.airflow_dags)."""
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.facet_v2 import (
        dataset_version_dataset,
        error_message_run,
        output_statistics_output_dataset,
        schema_dataset,
    )

    catalog = loaded.spec.data_movement.catalog.name
    schema = schema_dataset.SchemaDatasetFacet(
        fields=[schema_dataset.SchemaDatasetFacetFields(name=n, type=t) for n, t in fields]
    )
    inputs = [
        InputDataset(
            namespace=f"iceberg://{catalog}",
            name=table,
            facets={
                "version": dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=str(snapshot)),
                **({"schema": schema} if fields and len(record.snapshots) == 1 else {}),
            },
        )
        for table, snapshot in record.snapshots.items()
    ]
    outputs = [
        OutputDataset(
            namespace=namespace,
            name=loaded.spec.alias,
            facets={"version": dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=record.version)}
            if record.version
            else {},
            outputFacets={
                "outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                    rowCount=record.rows, size=record.bytes
                )
            }
            if kind == "COMPLETE" and record.rows
            else {},
        )
    ]
    run_facets: dict[str, Any] = {}
    if record.gates:
        run_facets["bulldozer_gates"] = _gates_facet()(gates=[dict(g) for g in record.gates])
    if kind == "FAIL" and record.error:
        run_facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=record.error, programmingLanguage="python"
        )
    return inputs, outputs, run_facets


@functools.cache
def _gates_facet() -> type:
    """The run facet of the gates' results: made when first used (openlineage is imported
    only when lineage is configured)."""
    import attrs
    from openlineage.client.facet_v2 import RunFacet

    @attrs.define
    class _Gates(RunFacet):
        """The quality gates of the run: gate, passed, detail."""

        gates: list[dict[str, object]] = attrs.field(factory=list)

    return _Gates


def store_namespace(store: str) -> str:
    """The output datasets' namespace for a store as a client names it: ``embedded (/path)``
    -> ``bulldozer://embedded/path``, ``host:port (TLS)`` -> ``bulldozer://host:port``."""
    if store.startswith("embedded (") and store.endswith(")"):
        return "bulldozer://embedded" + store[len("embedded (") : -1]
    return "bulldozer://" + store.removesuffix(" (TLS)")


def lineage_for(loaded: LoadedSpec, store: str) -> Lineage | None:
    """The run's lineage, or None when OpenLineage is not configured (or not installed)."""
    if not _configured():
        return None
    if (foreign := _foreign_config()) is not None:
        log.warning(
            "OpenLineage: this run emits no lineage: %s would choose where its events go and what they carry "
            "(the OpenLineage client reads an openlineage.yml in the working directory first); the operator's "
            "file is named by OPENLINEAGE_CONFIG, or lives in ~/.openlineage",
            foreign,
        )
        return None
    if (problem := _configuration_problem()) is not None:
        log.warning("OpenLineage: this run emits no lineage: %s", problem)
        return None
    try:
        from openlineage.client import OpenLineageClient
    except ImportError:
        log.warning(
            "OpenLineage is configured, but openlineage-python is not installed (pip install 'bulldozer[lineage]')"
        )
        return None
    try:
        client = OpenLineageClient()
    except Exception as exc:
        log.warning("OpenLineage: the client could not be set up: %s", exc)
        return None
    return Lineage(client, loaded, store)
