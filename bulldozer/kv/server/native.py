"""The native data plane: ``bulldozer-kvd`` (``native/kvd``, Go) in front of the DAL.

With ``bulldozer serve --data-plane native`` (the default ``auto`` picks it when it can),
the public address is served by ``bulldozer-kvd``. It stores batch puts and answers gets
and batch gets straight from the store (the embedded store, or Redis: pipelined from Go
under the engine's write fence and running digest, whose rules it reads from
``proto/bulldozer/kv/v1/shared.yaml``; on the embedded store, samples and scans too), and
relays every other call, and every request off its fast path, to this Python DAL, which
then listens on a private Unix socket over the same store. So there is one set of
lifecycle rules and error answers (here), and the hot calls skip Python's per-call cost:
measured on this 2-core machine, an empty Python-to-Python gRPC call took 0.73 ms at the
median; the same call answered in Go took 0.46 ms.

Available for the embedded and Redis engines without TLS or authentication (those stay
with the Python data plane); ``scripts/build_native.sh`` builds the binary (``bootstrap.sh`` runs it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import time
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bulldozer.errors import BackendUnavailableError, InvalidArgumentError

if TYPE_CHECKING:
    from bulldozer.kv.backends import StorageEngine
    from bulldozer.kv.server.rules import Limits

__all__ = ["NATIVE_ENGINES", "DataPlane", "NativeFront", "choose_data_plane", "fetch_metrics", "kvd_binary"]

#: the engines bulldozer-kvd serves (its --engine)
NATIVE_ENGINES = ("embedded", "redis")

log = logging.getLogger("bulldozer.kv.server")


class DataPlane(StrEnum):
    auto = "auto"
    native = "native"
    python = "python"


def kvd_binary() -> Path | None:
    """The ``bulldozer-kvd`` binary: ``$BULLDOZER_KVD``, else the one ``scripts/build_native.sh``
    built in this checkout, else one on ``PATH``; None when there is none."""
    from bulldozer.settings import load_settings

    configured = load_settings().kvd
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    built = Path(__file__).resolve().parents[3] / "native" / "bin" / "bulldozer-kvd"
    if os.access(built, os.X_OK):
        return built
    found = shutil.which("bulldozer-kvd")
    return Path(found) if found else None


def choose_data_plane(requested: DataPlane | str, engine: StorageEngine, secured: bool) -> DataPlane:
    """``native`` or ``python`` for this server: ``auto`` is native when it can be, and
    ``native`` raises with the reason when it cannot."""
    requested = DataPlane(requested)
    if requested == DataPlane.python:
        return requested
    reason = None
    if engine.name not in NATIVE_ENGINES:
        reason = f"it serves the {' and '.join(NATIVE_ENGINES)} engines only, not {engine.name}"
    elif secured:
        reason = "it does not do TLS or authentication yet"
    elif kvd_binary() is None:
        reason = _no_binary()
    if reason is None:
        return DataPlane.native
    if requested == DataPlane.native:
        raise InvalidArgumentError(f"--data-plane native is not available: {reason}")
    # the operator named a binary that is not one: said as a warning, not as the usual fallback
    said = log.warning if reason.startswith("BULLDOZER_KVD") else log.info
    said("data plane: python (the native one is not available: %s)", reason)
    return DataPlane.python


def _no_binary() -> str:
    """Why there is no ``bulldozer-kvd`` to start (``kvd_binary`` found none)."""
    from bulldozer.settings import load_settings

    configured = load_settings().kvd
    if configured:
        return f"BULLDOZER_KVD names {configured}, which is not an executable file"
    return "bulldozer-kvd is not built (run scripts/build_native.sh; it needs Go)"


class NativeFront:
    """A running ``bulldozer-kvd`` process."""

    def __init__(self, proc: subprocess.Popen[bytes], ready_file: Path, binary: Path) -> None:
        self.proc = proc
        self.binary = binary
        self._ready_file = ready_file
        self.port = 0

    @classmethod
    def start(
        cls,
        listen: str,
        backend: str,
        engine: StorageEngine,
        limits: Limits,
        ready_file: Path,
        grace: float = 30.0,
        metrics_socket: Path | None = None,
        stderr: Any = None,
    ) -> NativeFront:
        """Start ``bulldozer-kvd`` on ``listen`` in front of the DAL at ``backend``, over the
        store ``engine`` (an open embedded or Redis engine: its settings are passed on); with
        ``metrics_socket``, it serves the metrics of the calls it serves there."""
        binary = kvd_binary()
        if binary is None:
            raise BackendUnavailableError(_no_binary())
        from bulldozer.kv.backends.config import EmbeddedConfig, RedisConfig

        config = getattr(engine, "config", None)
        ready_file.unlink(missing_ok=True)
        args = [str(binary), f"--listen={listen}", f"--backend={backend}"]
        stdin: bytes | None = None
        if isinstance(config, EmbeddedConfig):
            args += [
                "--engine=embedded",
                *config.kvd_arguments(),
            ]
        elif isinstance(config, RedisConfig):
            # on standard input: the URL may hold a password, which neither the arguments
            # nor the environment of a process should show
            args.append("--engine=redis")
            stdin = config.model_dump_json().encode()
        else:
            raise InvalidArgumentError(f"the native data plane does not serve the {engine.name} engine")
        args += [
            f"--max-key-bytes={limits.max_key_bytes}",
            f"--max-value-bytes={limits.max_value_bytes}",
            f"--max-batch-records={limits.max_batch_records}",
            f"--max-batch-get-keys={limits.max_batch_get_keys}",
            f"--max-scan-page={limits.max_scan_page}",
            f"--max-message-bytes={limits.max_message_bytes}",
            f"--max-writes-in-flight={limits.max_writes_in_flight}",
            f"--ready-file={ready_file}",
            *([f"--metrics-listen=unix:{metrics_socket}"] if metrics_socket else []),
            f"--grace={grace}s",
            f"--parent-pid={os.getpid()}",
        ]
        # its log lines go to ``stderr``, else where this process's go
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE, stderr=stderr)
        if stdin is not None:
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError), proc.stdin:  # if it died, wait() says so
                proc.stdin.write(stdin)
        return cls(proc, ready_file, binary)

    def wait(self, timeout: float = 30.0) -> int:
        """Block until it listens; its port (0 on a Unix socket)."""
        deadline = time.monotonic() + timeout
        while not self._ready_file.exists():
            code = self.proc.poll()
            if code is not None:
                raise BackendUnavailableError(f"bulldozer-kvd exited with code {code} before it listened (see the log)")
            if time.monotonic() > deadline:
                self.stop(0)
                raise BackendUnavailableError(f"bulldozer-kvd did not listen within {timeout:.0f} s")
            time.sleep(0.01)
        self.port = int(self._ready_file.read_text() or 0)
        return self.port

    def stop(self, grace: float = 30.0) -> int | None:
        """SIGTERM (in-flight calls get ``grace`` seconds), then SIGKILL; its exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace + 10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def fetch_metrics(socket_path: Path, timeout: float = 5.0) -> str | None:
    """``bulldozer-kvd``'s metrics (Prometheus text) from its private socket; None when it
    does not answer (it is stopping, say)."""
    import http.client
    import socket

    class _Unix(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(str(socket_path))

    conn = _Unix("kvd", timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        return response.read().decode() if response.status == 200 else None
    except OSError:
        return None
    finally:
        conn.close()
