"""Connect to the DAL a spec names.

``embedded`` starts a DAL for the duration: a child ``bulldozer serve`` process on a free
loopback port over the embedded store in ``$BULLDOZER_HOME/kv`` (its log goes to
``$BULLDOZER_HOME/logs/``), stopped gracefully afterwards. A separate process lets
encoding and storing run on two cores. ``host:port`` connects to a running DAL.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bulldozer.errors import BackendUnavailableError
from bulldozer.kv.client import KvClient

__all__ = ["connect", "embedded_store_path", "start_embedded_dal"]


def embedded_store_path(home: str | os.PathLike[str] | None = None) -> Path:
    from bulldozer.warehouse.catalog import bulldozer_home

    return bulldozer_home(home) / "kv"


@contextmanager
def start_embedded_dal(home: str | os.PathLike[str] | None = None, startup_timeout: float = 60.0) -> Iterator[str]:
    """A ``bulldozer serve`` child process over the embedded store; yields its address."""
    from bulldozer.warehouse.catalog import bulldozer_home

    logs = bulldozer_home(home) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"dal-{os.getpid()}-{int(time.time())}.log"
    with tempfile.TemporaryDirectory(prefix="bulldozer-dal-") as tmp:
        port_file = Path(tmp) / "port"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable, "-m", "bulldozer.cli.main", "serve",
                    "--path", str(embedded_store_path(home)),
                    "--port", "0", "--port-file", str(port_file), "--grace", "30", "--log-format", "json",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + startup_timeout
            while not port_file.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = log_path.read_text(errors="replace")[-2000:]
                    raise BackendUnavailableError(f"the embedded DAL did not start (log {log_path}): {tail.strip()}")
                time.sleep(0.05)
            yield f"127.0.0.1:{port_file.read_text().strip()}"
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@contextmanager
def connect(
    endpoint: str = "embedded",
    home: str | os.PathLike[str] | None = None,
    token: str | None = None,
    timeout: float = 60.0,
) -> Iterator[KvClient]:
    """A client of ``endpoint``: ``embedded`` (a DAL started for the duration, plaintext on
    loopback) or ``host:port``, with the bearer token (``token`` or ``BULLDOZER_TOKEN``) and TLS
    from ``BULLDOZER_TLS_CA`` / ``BULLDOZER_TLS_CERT`` / ``BULLDOZER_TLS_KEY``."""
    if endpoint == "embedded":
        with start_embedded_dal(home) as address:
            client = KvClient(address, token=token, timeout=timeout)
            try:
                client.wait_ready(timeout=min(timeout, 15.0))
                yield client
            finally:
                client.close()
        return
    from bulldozer.kv.auth import env_credentials

    client = KvClient(
        endpoint,
        token=token or os.environ.get("BULLDOZER_TOKEN") or None,
        timeout=timeout,
        credentials=env_credentials(),
    )
    try:
        client.wait_ready(timeout=min(timeout, 15.0))
        yield client
    finally:
        client.close()
