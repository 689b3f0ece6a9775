"""Prometheus metrics of a DAL process (served on an optional port).

The names, labels and latency buckets are shared with the native data plane
(``proto/bulldozer/kv/v1/shared.yaml``, section ``metrics``): ``bulldozer-kvd`` counts the
calls it serves itself and serves them on a private socket, and this process's
``/metrics`` adds them to its own (``add_source``), so one scrape counts every call
whichever plane served it.

``watch_jobs`` adds, per alias, what an on-call engineer alerts on, read from the DAL's own
metadata at each scrape (so one scrape shows every job's freshness): the live version's
age, size and records, whether the alias is pinned, and the latest run's outcome, time,
stage durations and gates (``JOB_METRICS``).

Served on loopback (the default), ``/metrics`` answers only requests naming a loopback host:
a web page that points its own name at 127.0.0.1 (DNS rebinding) cannot read it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from bulldozer.kv.v1 import shared
from bulldozer.sockets import host_of, is_loopback

__all__ = ["JOB_METRICS", "Metrics"]

#: the per-alias gauges ``watch_jobs`` exports: name -> help
JOB_METRICS = {
    "bulldozer_alias_version_age_seconds": "Seconds since the alias last moved (flip or rollback) to its live version.",
    "bulldozer_alias_records": "Records in the alias's live version.",
    "bulldozer_alias_bytes": "Key + value bytes in the alias's live version.",
    "bulldozer_alias_pinned": "1 while the alias is pinned (runs build versions but do not flip).",
    "bulldozer_job_last_run_success": "1 if the alias's latest run succeeded (or ended pinned), 0 if it failed.",
    "bulldozer_job_last_run_timestamp_seconds": "When the alias's latest run finished (Unix time).",
    "bulldozer_job_last_run_rows": "Rows the alias's latest run loaded.",
    "bulldozer_job_stage_seconds": "Seconds each stage of the alias's latest run took.",
    "bulldozer_job_gate_passed": "1 if a quality gate passed in the alias's latest run, 0 if it refused the version.",
}

log = logging.getLogger("bulldozer.kv.server")


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        own = CollectorRegistry()  # this process's counts; the public registry adds the sources'
        self._sources: list[Callable[[], str | None]] = []
        self.registry.register(_Sum(own, self._sources))
        self.requests = Counter(
            shared.METRICS_REQUESTS, "Requests by method and status code.", ["method", "code"], registry=own
        )
        self.latency = Histogram(
            shared.METRICS_REQUEST_SECONDS,
            "Request latency by method.",
            ["method"],
            buckets=tuple(float(b) for b in shared.METRICS_REQUEST_SECONDS_BUCKETS),
            registry=own,
        )
        self.records = Counter(
            shared.METRICS_RECORDS_WRITTEN, "Records written by namespace.", ["namespace"], registry=own
        )
        self.bytes = Counter(
            shared.METRICS_BYTES_WRITTEN, "Key + value bytes written by namespace.", ["namespace"], registry=own
        )

    def request(self, method: str, code: str, seconds: float) -> None:
        self.requests.labels(method, code).inc()
        self.latency.labels(method).observe(seconds)

    def written(self, namespace: str, records: int, nbytes: int) -> None:
        self.records.labels(namespace).inc(records)
        self.bytes.labels(namespace).inc(nbytes)

    def add_source(self, fetch: Callable[[], str | None]) -> None:
        """Add another process's counts (``fetch``: its exposition text, None if it has
        none now) to every scrape of this registry."""
        self._sources.append(fetch)

    def watch_jobs(self, engine: Any) -> None:
        """Export the per-alias job and freshness gauges of ``engine``'s metadata (``JOB_METRICS``)."""
        self.registry.register(_Jobs(engine))

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``host:port`` (port 0 picks a free one) from a daemon thread;
        returns the port. On loopback, a request naming another host is refused (403)."""
        import socket
        import threading
        from socketserver import ThreadingMixIn
        from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

        app = make_wsgi_app(self.registry)
        if is_loopback(host):
            app = _loopback_only(app)
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

        class Server(ThreadingMixIn, WSGIServer):
            address_family = family
            daemon_threads = True  # a scrape in progress does not hold the process

        class Quiet(WSGIRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Each scrape is not a log line."""

        server = make_server(host, port, app, Server, Quiet)
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
        return int(server.server_port)


def _loopback_only(app: Callable[..., Any]) -> Callable[..., Any]:
    """``app``, answering only requests whose ``Host`` names loopback (or that name none, as
    no browser sends)."""

    def checked(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        named = environ.get("HTTP_HOST")
        if named is not None and not is_loopback(host_of(named)):
            start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"this endpoint answers requests for loopback's names only\n"]
        return app(environ, start_response)

    return checked


class _Sum(Collector):
    """This process's metrics plus each source's: samples of the same name and labels are
    added (counters, histogram buckets, counts and sums alike)."""

    def __init__(self, own: CollectorRegistry, sources: list[Callable[[], str | None]]) -> None:
        self.own = own
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        families = {family.name: family for family in self.own.collect()}
        for fetch in self.sources:
            try:
                text = fetch()
            except Exception as exc:  # a scrape must not fail for a source
                log.warning("metrics: a source did not answer: %s", exc)
                continue
            for family in text_string_to_metric_families(text or ""):
                mine = families.get(family.name)
                if mine is None:
                    families[family.name] = family
                    continue
                samples: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {_key(s): s for s in mine.samples}
                for sample in family.samples:
                    key = _key(sample)
                    if key in samples and not sample.name.endswith("_created"):
                        samples[key] = samples[key]._replace(value=samples[key].value + sample.value)
                    elif key not in samples:
                        samples[key] = sample
                mine.samples = list(samples.values())
        yield from families.values()


def _key(sample: Any) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A sample's name and labels, a histogram bucket's bound written one way (Python writes
    ``le="1.0"``, Go ``le="1"``)."""
    labels = {k: repr(float(v)) if k == "le" else v for k, v in sample.labels.items()}
    return sample.name, tuple(sorted(labels.items()))


class _Jobs(Collector):
    """Per-alias gauges from the engine's aliases and versions, read at each scrape."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        from datetime import UTC, datetime

        from bulldozer.versioning.run_state import run_record_of

        gauges = {
            name: GaugeMetricFamily(name, text, labels=["alias", *extra])
            for (name, text), extra in zip(
                JOB_METRICS.items(), [[], [], [], [], [], [], [], ["stage"], ["gate"]], strict=True
            )
        }
        try:
            aliases = self.engine.list_aliases()
            versions = self.engine.list_namespaces()
        except Exception as exc:  # a scrape must not fail while the store is unreachable
            log.warning("metrics: the job gauges could not be read: %s", exc)
            return
        by_name = {v.name: v for v in versions}
        now = datetime.now(UTC)
        for alias in aliases:
            gauges["bulldozer_alias_version_age_seconds"].add_metric(
                [alias.alias], (now - alias.updated).total_seconds()
            )
            live = by_name.get(alias.namespace)
            if live is not None:
                gauges["bulldozer_alias_records"].add_metric([alias.alias], live.record_count)
                gauges["bulldozer_alias_bytes"].add_metric([alias.alias], live.bytes)
            gauges["bulldozer_alias_pinned"].add_metric([alias.alias], 1.0 if alias.pinned else 0.0)
        latest: dict[str, Any] = {}
        for version in sorted(versions, key=lambda v: v.created):
            record = run_record_of(version)
            if record is not None and record.outcome != "running":
                latest[version.alias] = record
        for alias_name, record in latest.items():
            ok = record.outcome in ("succeeded", "pinned")
            gauges["bulldozer_job_last_run_success"].add_metric([alias_name], 1.0 if ok else 0.0)
            if record.finished:
                finished = datetime.fromisoformat(record.finished).timestamp()
                gauges["bulldozer_job_last_run_timestamp_seconds"].add_metric([alias_name], finished)
            gauges["bulldozer_job_last_run_rows"].add_metric([alias_name], record.rows)
            for stage, seconds in record.timings.items():
                gauges["bulldozer_job_stage_seconds"].add_metric([alias_name, stage], float(seconds))
            for gate in record.gates:
                passed = 1.0 if gate.get("passed") else 0.0
                gauges["bulldozer_job_gate_passed"].add_metric([alias_name, str(gate.get("gate", ""))], passed)
        yield from gauges.values()
