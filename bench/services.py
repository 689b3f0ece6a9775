"""Servers for the benchmarks: Redis and Cassandra started by the project's own scripts
(``scripts/services/*.sh``) in a temporary folder, and KV DAL processes (``bulldozer
serve``) in front of an engine. Everything is stopped, and its folder removed, on exit."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts" / "services"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def engine_server(kind: str) -> Iterator[int]:
    """Start a ``redis`` or ``cassandra`` server on a free loopback port; yield the port."""
    folder = tempfile.mkdtemp(prefix=f"bulldozer-bench-{kind}-")
    port = free_port()
    script = str(SCRIPTS / f"{kind}.sh")
    subprocess.run(["bash", script, "start", folder, str(port)], check=True, stdout=subprocess.DEVNULL)
    try:
        yield port
    finally:
        subprocess.run(["bash", script, "stop", folder], check=False, stdout=subprocess.DEVNULL)
        shutil.rmtree(folder, ignore_errors=True)


def serve_args(kind: str, port: int, store: str) -> list[str]:
    """``bulldozer serve`` flags for an engine: ``embedded`` (``store`` is a folder), or
    ``redis`` / ``cassandra`` on ``port`` (``store`` is a fresh prefix / keyspace)."""
    if kind == "embedded":
        return ["--engine", "embedded", "--path", store]
    if kind == "redis":
        return ["--engine", "redis", "--url", f"redis://127.0.0.1:{port}/0", "--prefix", store]
    return ["--engine", "cassandra", "--cql-port", str(port), "--keyspace", store]


def fresh_store_name() -> str:
    return f"bench_{uuid.uuid4().hex[:8]}"


@dataclass
class Dal:
    """A running ``bulldozer serve`` process."""

    process: subprocess.Popen[bytes]
    endpoint: str

    def peak_rss_kib(self) -> int:
        """The server's peak resident set so far (VmHWM), in KiB."""
        from bench.measured_cli import vm_hwm_kib

        return vm_hwm_kib(self.process.pid)


@contextlib.contextmanager
def dal_server(serve: list[str]) -> Iterator[Dal]:
    """A KV DAL process with ``serve`` flags on a free port, ready to take requests."""
    from bulldozer.kv import KvClient

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "bulldozer.cli.main", "serve", *serve, "--port", str(port), "--grace", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        with KvClient(f"127.0.0.1:{port}", timeout=60) as client:
            client.wait_ready(timeout=90)
        yield Dal(process, f"127.0.0.1:{port}")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
