"""Prometheus metrics of a DAL process (served on an optional port)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

__all__ = ["Metrics"]


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "bulldozer_kv_requests",
            "Requests by method and status code.",
            ["method", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "bulldozer_kv_request_seconds",
            "Request latency by method.",
            ["method"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30),
            registry=self.registry,
        )
        self.records = Counter(
            "bulldozer_kv_records_written",
            "Records written by namespace.",
            ["namespace"],
            registry=self.registry,
        )
        self.bytes = Counter(
            "bulldozer_kv_bytes_written",
            "Key + value bytes written by namespace.",
            ["namespace"],
            registry=self.registry,
        )

    def request(self, method: str, code: str, seconds: float) -> None:
        self.requests.labels(method, code).inc()
        self.latency.labels(method).observe(seconds)

    def written(self, namespace: str, records: int, nbytes: int) -> None:
        self.records.labels(namespace).inc(records)
        self.bytes.labels(namespace).inc(nbytes)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return int(server.server_port)
