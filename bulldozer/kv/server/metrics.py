"""Prometheus metrics of a DAL process (served on an optional port).

The names, labels and latency buckets are shared with the native data plane
(``proto/bulldozer/kv/v1/shared.yaml``, section ``metrics``): ``bulldozer-kvd`` counts the
calls it serves itself and serves them on a private socket, and this process's
``/metrics`` adds them to its own (``add_source``), so one scrape counts every call
whichever plane served it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from bulldozer.kv.v1 import shared

__all__ = ["Metrics"]

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

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return int(server.server_port)


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
