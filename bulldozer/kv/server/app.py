"""Build and run a KV DAL gRPC server.

``create_server(address, engine) -> (server, port)`` binds (port 0 picks a free one, for
tests) with health checking and reflection on (reflection off for a DAL a command hosts for
itself on a private socket), the error interceptor installed and request-size limits set.
``serve`` runs one until SIGTERM / SIGINT / SIGHUP, then stops gracefully: new requests are refused
and in-flight batches finish.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bulldozer import scratch
from bulldozer.errors import BackendUnavailableError, InvalidArgumentError
from bulldozer.kv.backends import StorageEngine
from bulldozer.kv.server.admission import AdmissionInterceptor, WriteAdmission
from bulldozer.kv.server.auth import AuthConfig, AuthInterceptor, Authorizer
from bulldozer.kv.server.interceptors import ErrorInterceptor
from bulldozer.kv.server.native import NativeFront
from bulldozer.kv.server.rules import KvDal, Limits
from bulldozer.kv.server.servicer import AliasesServicer, DataServicer, NamespacesServicer
from bulldozer.kv.v1 import kv_pb2, kv_pb2_grpc

if TYPE_CHECKING:
    # prometheus_client (45 ms of imports, html and http.server among them) only for a DAL
    # that counts its calls: ``serve``; a DAL hosted for one command has no metrics
    from bulldozer.kv.server.metrics import Metrics

__all__ = ["SERVICE_NAMES", "NativeServer", "RunningServer", "create_server", "serve"]

log = logging.getLogger("bulldozer.kv.server")
#: seconds a stopping DAL gives its server and store to finish, after the grace period for
#: in-flight requests
STOP_WITHIN = 15.0
SERVICE_NAMES = tuple(s.full_name for s in kv_pb2.DESCRIPTOR.services_by_name.values())


class RunningServer:
    """A started server with what it needs to stop cleanly."""

    def __init__(
        self,
        server: grpc.Server,
        port: int,
        health: health.HealthServicer,
        engine: StorageEngine,
        dal: KvDal,
    ) -> None:
        self.server, self.port, self.health, self.engine, self.dal = (
            server,
            port,
            health,
            engine,
            dal,
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, grace: float = 30.0, close_engine: bool = True) -> None:
        """Refuse new requests, let in-flight ones finish (up to ``grace`` seconds), flush the
        engine and, unless told otherwise, close it."""
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()
        self.engine.flush()
        if close_engine:
            self.engine.close()


def create_server(
    address: str,
    engine: StorageEngine,
    limits: Limits | None = None,
    metrics: Metrics | None = None,
    max_workers: int = 16,
    interceptors: list[Any] | None = None,
    credentials: grpc.ServerCredentials | None = None,
    auth: AuthConfig | None = None,
    data_plane: str = "python",
    allow_unauthenticated: bool = False,
    kvd_stderr: Any = None,
    reflection: bool = True,
) -> tuple[RunningServer, int]:
    """A started KV DAL server on ``address`` (``host:0`` picks a free port); with
    ``credentials`` it speaks TLS, with ``auth`` every call is authenticated and checked
    against the principals' per-alias permissions, and the store remembers it: a later
    server of it without ``auth`` refuses to start unless ``allow_unauthenticated``.
    ``data_plane`` ``native`` (or ``auto``) puts ``bulldozer-kvd`` in front (see
    :mod:`bulldozer.kv.server.native`), its log lines to ``kvd_stderr`` (a file; default: this
    process's stderr). ``reflection``: serve gRPC server reflection (grpcurl and the like),
    which a DAL hosted by one command for itself does without (importing and registering it
    took ≈ 10 ms of that command's start, on the interpreter the command's imports share)."""
    from bulldozer.kv.server.native import DataPlane, choose_data_plane

    if auth is not None:
        engine.require_auth()
    elif engine.auth_required() and not allow_unauthenticated:
        raise InvalidArgumentError(
            f"this {engine.name} store was served with --auth-config; serve it with --auth-config again "
            "(or, to serve it without authentication on purpose, --allow-unauthenticated)"
        )
    if choose_data_plane(data_plane, engine, credentials is not None or auth is not None) == DataPlane.native:
        try:
            return _create_native_server(
                address, engine, limits, metrics, max_workers, interceptors, kvd_stderr, reflection
            )
        except BackendUnavailableError as exc:
            if data_plane == DataPlane.native:
                raise
            log.warning("data plane: python (bulldozer-kvd did not start: %s)", exc)
    limits = limits or Limits()
    dal = KvDal(engine, limits)
    inner = [AuthInterceptor(Authorizer(auth, lambda name: dal.describe(name).alias))] if auth else []
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kv-dal"),
        # admission first: it refuses a write before gRPC reads its batch (bulldozer.kv.server.admission)
        interceptors=[
            AdmissionInterceptor(WriteAdmission(limits.max_writes_in_flight), metrics),
            *(interceptors or []),
            ErrorInterceptor(metrics),
            *inner,
        ],
        options=[
            ("grpc.max_receive_message_length", limits.max_message_bytes),
            ("grpc.max_send_message_length", limits.max_message_bytes),
            ("grpc.so_reuseport", 0),
            # no flow-control window grown by bandwidth probes: with one, gRPC took in up to a
            # whole 48 MiB batch of a write the admission refused (0.3-4 MiB without; a
            # 300 k-row run's load stage 0.67-0.70 s either way, 3 pairs)
            ("grpc.http2.bdp_probe", 0),
        ],
    )
    kv_pb2_grpc.add_KvDataServicer_to_server(DataServicer(dal, metrics), server)
    kv_pb2_grpc.add_KvNamespacesServicer_to_server(NamespacesServicer(dal), server)
    kv_pb2_grpc.add_KvAliasesServicer_to_server(AliasesServicer(dal), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", *SERVICE_NAMES):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    if reflection:
        from grpc_reflection.v1alpha import reflection as server_reflection

        names = (*SERVICE_NAMES, health.SERVICE_NAME, server_reflection.SERVICE_NAME)
        server_reflection.enable_server_reflection(names, server)
    try:
        port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError as exc:
        raise BackendUnavailableError(f"cannot listen on {address}: {exc}") from exc
    if port == 0:
        raise BackendUnavailableError(f"cannot listen on {address} (in use?)")
    server.start()
    return RunningServer(server, port, health_servicer, engine, dal), port


class NativeServer(RunningServer):
    """``bulldozer-kvd`` on the public address, in front of a DAL on a private Unix socket."""

    def __init__(self, reference: RunningServer, front: NativeFront, private: Path) -> None:
        super().__init__(reference.server, front.port, reference.health, reference.engine, reference.dal)
        self.front = front
        self._private = private

    def stop(self, grace: float = 30.0, close_engine: bool = True) -> None:
        """The front first (its in-flight calls may still need the DAL), then the DAL."""
        self.health.enter_graceful_shutdown()
        self.front.stop(grace)
        super().stop(grace, close_engine)
        scratch.remove(self._private)


def _create_native_server(
    address: str,
    engine: StorageEngine,
    limits: Limits | None,
    metrics: Metrics | None,
    max_workers: int,
    interceptors: list[Any] | None,
    kvd_stderr: Any = None,
    reflection: bool = True,
) -> tuple[RunningServer, int]:
    private = scratch.make("dal", sockets=True)
    backend = f"unix:{private / 'reference.sock'}"
    # the private reference DAL behind the front: the caller already decided about authentication
    reference, _ = create_server(
        backend, engine, limits, metrics, max_workers, interceptors, allow_unauthenticated=True, reflection=reflection
    )
    metrics_socket = private / "kvd-metrics.sock" if metrics is not None else None
    try:
        front = NativeFront.start(
            address,
            backend,
            engine,
            reference.dal.limits,
            private / "kvd.port",
            metrics_socket=metrics_socket,
            stderr=kvd_stderr,
        )
        front.wait()
        from bulldozer.kv.backends.embedded import EmbeddedEngine

        if isinstance(engine, EmbeddedEngine):
            engine.use_kvd(front.binary)  # its layer merges and measurements, compiled
    except BaseException:
        reference.stop(0, close_engine=False)
        scratch.remove(private)
        raise
    if metrics is not None and metrics_socket is not None:
        from bulldozer.kv.server.native import fetch_metrics

        socket_path = metrics_socket
        metrics.add_source(lambda: fetch_metrics(socket_path))  # the calls the front serves itself
    log.info("data plane: native (bulldozer-kvd pid %d in front of this DAL)", front.proc.pid)
    return NativeServer(reference, front, private), front.port


def serve(
    address: str,
    engine: StorageEngine,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    grace: float = 30.0,
    port_file: str | os.PathLike[str] | None = None,
    parent_pid: int | None = None,
    stop_within: float = STOP_WITHIN,
    **kwargs: Any,
) -> int:
    """Run until SIGTERM, SIGINT or SIGHUP (or, with ``parent_pid``, until that parent process is
    gone, so a DAL started for a run that was killed does not outlive it); returns the exit
    code. A signal is a graceful stop from the moment this is called, also while the server
    starts. Stopping takes ``grace`` seconds at most for in-flight requests, then up to
    ``stop_within`` more for the store's flush; a store that does not finish by then is left
    (returns 1, one line says so)."""
    from bulldozer.kv.server.metrics import Metrics

    stopping = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: finishing in-flight requests (up to %.0f s)", signum, grace)
        stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: the terminal it ran in closed
        signal.signal(signum, on_signal)
    metrics = Metrics()
    metrics.watch_jobs(engine)  # per-alias freshness and last-run gauges, read at each scrape
    running, port = create_server(address, engine, metrics=metrics, **kwargs)
    if port_file is not None:
        tmp = Path(f"{port_file}.tmp")
        tmp.write_text(str(port))
        tmp.replace(port_file)  # atomic: a reader never sees a half-written port
    if metrics_port is not None:
        try:
            bound = metrics.serve(metrics_port, metrics_host)
        except OSError as exc:  # the DAL serves on without its metrics: one line says why
            log.error(
                "metrics: cannot serve on %s port %d (%s); serving without metrics",
                metrics_host,
                metrics_port,
                exc.strerror or exc,
            )
        else:
            shown = f"[{metrics_host}]" if ":" in metrics_host else metrics_host
            log.info("metrics on http://%s:%d/metrics", shown, bound)
    log.info(
        "KV DAL serving %s engine on %s (data plane: %s)",
        engine.name,
        address if address.startswith("unix:") else f"port {port}",
        "native" if isinstance(running, NativeServer) else "python",
    )
    front_failed = threading.Event()

    if isinstance(running, NativeServer):
        front = running.front

        def watch_front() -> None:
            code = front.proc.wait()
            if not stopping.is_set():
                log.error("bulldozer-kvd exited (code %s): stopping the DAL", code)
                front_failed.set()
                stopping.set()

        threading.Thread(target=watch_front, name="kvd-watch", daemon=True).start()

    if parent_pid is not None:

        def watch_parent() -> None:
            while not stopping.wait(0.5):
                if os.getppid() != parent_pid:
                    log.info("parent process %d is gone: stopping", parent_pid)
                    stopping.set()

        threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()

    # Woken twice a second: a signal the kernel hands to one of gRPC's threads does not
    # interrupt the main thread's wait, and Python runs its handler only in the main
    # thread, once that thread runs again (a fresh-clone CI run saw SIGTERM unheeded 30 s).
    while not stopping.wait(0.5):
        pass
    # A handler thread that outlived the grace period may still touch the engine, and LMDB
    # forbids closing an environment under a live transaction: flush, and leave closing to
    # process exit (the caller exits right away). A store that hangs (a driver waiting on a
    # node that went away) must not keep the process from exiting: the stop is bounded.
    stopper = threading.Thread(
        target=running.stop, args=(grace,), kwargs={"close_engine": False}, name="dal-stop", daemon=True
    )
    stopper.start()
    stopper.join(grace + stop_within)
    if stopper.is_alive():
        log.error(
            "KV DAL stopping: the %s store did not finish within %.0f s after the grace period; exiting without "
            "it (what it committed stays; a write it did not acknowledge is the client's to retry)",
            engine.name,
            stop_within,
        )
        return 1
    log.info("KV DAL stopped")
    return 1 if front_failed.is_set() else 0
