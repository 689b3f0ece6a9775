"""Connect to the DAL a spec names.

``embedded`` starts a DAL for the duration over the embedded store in
``$BULLDOZER_HOME/kv``, on a private Unix socket (its log goes to the day's
``$BULLDOZER_HOME/logs/dal-YYYY-MM-DD.log``, see ``bulldozer.logs.log_file``), stopped
gracefully afterwards:

- with the native data plane (``bulldozer-kvd`` built, ``BULLDOZER_DATA_PLANE`` not
  ``python``) the DAL is *hosted in this process* (``host_embedded_dal``): kvd, its own
  process, stores and reads, while the DAL's reference server (namespaces, seals, flips)
  runs on threads here, for what kvd relays; the command's own namespace and alias calls
  go to that DAL directly (``KvClient.hosted``). Encoding and storing still run on two
  cores, and the command starts no second Python interpreter: measured side by side, a
  cold delta run with nothing to write 1.07-1.23 s -> 0.90-1.03 s (half its CPU time), a
  500 k-row run's peak memory (command + DAL) 312-349 MiB -> 257-261 MiB;
- otherwise a child ``bulldozer serve`` process (``start_embedded_dal``), so that storing
  in Python does not share this process's interpreter with encoding.

In a command the warm loader runs (bulldozer.cli.loader), the loader's own embedded DAL over
the same store is used instead (``use_warm_dal``), when it answers; the loader keeps its
DAL in a child process, since it forks. ``host:port`` connects to a running DAL.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bulldozer import scratch
from bulldozer.errors import BackendUnavailableError, InvalidArgumentError, SpecError, SpecIssue
from bulldozer.settings import load_settings, python_command

if TYPE_CHECKING:
    from bulldozer.kv.client import KvClient
    from bulldozer.spec.loader import LoadedSpec

__all__ = [
    "EmbeddedDal",
    "connect",
    "connect_for_spec",
    "embedded_data_plane",
    "embedded_store_path",
    "endpoint_issues",
    "host_embedded_dal",
    "host_empty_dal",
    "spec_token",
    "start_embedded_dal",
    "store_not_made",
    "use_warm_dal",
]
log = logging.getLogger("bulldozer.kv.connect")


#: (store, address, data plane) of an embedded DAL already running over that store: set by
#: the warm loader in the command it runs, so the command need not start one
_warm: tuple[Path, str, tuple[str, Path | None]] | None = None


def use_warm_dal(store: Path, address: str, plane: tuple[str, Path | None]) -> None:
    """Connect this process's commands on ``store`` to the DAL at ``address``, which serves
    with ``plane`` (``embedded_data_plane`` where it was started): a command whose own
    settings choose another data plane starts the DAL they choose instead."""
    global _warm
    _warm = (store, address, plane)


def embedded_data_plane() -> tuple[str, Path | None]:
    """How an embedded DAL started now serves, as the settings choose it
    (``BULLDOZER_DATA_PLANE``, ``BULLDOZER_KVD``): ``("native", the kvd binary)`` or
    ``("python", None)``."""
    from bulldozer.kv.server.native import DataPlane, kvd_binary

    kvd = None if load_settings().data_plane == DataPlane.python else kvd_binary()
    return ("native", kvd) if kvd is not None else ("python", None)


def embedded_store_path(home: str | os.PathLike[str] | None = None) -> Path:
    from bulldozer.warehouse.catalog import bulldozer_home

    return bulldozer_home(home) / "kv"


class EmbeddedDal:
    """A ``bulldozer serve`` child process over the embedded store, listening on a Unix
    socket in a private folder, so its address is known before it is up; it serves with
    ``plane`` (``embedded_data_plane`` in the settings it was started with)."""

    def __init__(
        self, proc: subprocess.Popen[bytes], folder: Path, log_path: Path, log_offset: int, startup_timeout: float
    ) -> None:
        self.proc = proc
        self.plane = embedded_data_plane()  # the child reads the settings this process reads
        self.address = f"unix:{folder / 'dal.sock'}"
        self._ready_file = folder / "ready"
        self._log_path = log_path
        self._log_offset = log_offset
        self._deadline = time.monotonic() + startup_timeout

    def wait(self) -> None:
        """Block until the server listens, or raise BackendUnavailableError with its log."""
        while not self._ready_file.exists():
            if self.proc.poll() is not None or time.monotonic() > self._deadline:
                raise BackendUnavailableError(
                    f"the embedded DAL did not start (log {self._log_path}): {self._own_log()[-2000:].strip()}"
                )
            time.sleep(0.02)

    def _own_log(self) -> str:
        """What this DAL logged: the log file from where it started, without the JSON lines
        of other processes sharing the day's file."""
        import json

        with open(self._log_path, "rb") as f:
            f.seek(self._log_offset)
            text = f.read().decode(errors="replace")
        kept = []
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if not isinstance(record, dict) or record.get("pid") in (None, self.proc.pid):
                kept.append(line)
        return "\n".join(kept)


@contextmanager
def start_embedded_dal(
    home: str | os.PathLike[str] | None = None, startup_timeout: float = 60.0
) -> Iterator[EmbeddedDal]:
    """Start a ``bulldozer serve`` child process over the embedded store and return at once;
    ``.wait()`` blocks until it listens on ``.address``. Stopped gracefully on exit."""
    from bulldozer.logs import log_file, open_log
    from bulldozer.warehouse.catalog import bulldozer_home

    log_path = log_file(bulldozer_home(home) / "logs", "dal")
    with scratch.folder("dal", sockets=True) as folder:
        with open(open_log(log_path), "wb") as log:
            offset = os.fstat(log.fileno()).st_size
            proc = subprocess.Popen(
                [
                    *python_command("-m", "bulldozer.cli.main", "serve"),
                    "--path", str(embedded_store_path(home)),
                    "--unix-socket", str(folder / "dal.sock"), "--port-file", str(folder / "ready"),
                    "--grace", "30", "--log-format", "json", "--parent-pid", str(os.getpid()),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )  # fmt: skip
        try:
            yield EmbeddedDal(proc, folder, log_path, offset, startup_timeout)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


class HostedDal:
    """The embedded store's DAL hosted in this process (``host_embedded_dal``): started on a
    thread, so the caller works on meanwhile; ``wait()`` blocks until it listens."""

    def __init__(
        self, home: str | os.PathLike[str] | None, folder: Path, log_path: Path | None, startup_timeout: float
    ) -> None:
        """``log_path`` None: no store at all, an empty one in memory (``host_empty_dal``)."""
        self.address = f"unix:{folder / 'dal.sock'}"
        self.running: Any = None
        self._store, self._log_path, self._timeout = embedded_store_path(home), log_path, startup_timeout
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="embedded-dal-start", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        from bulldozer.kv.backends import create_engine
        from bulldozer.kv.server.app import NativeServer, create_server

        server_log = logging.getLogger("bulldozer.kv.server")
        engine = None
        try:
            if self._log_path is None:
                engine = create_engine({"type": "memory"})
                self.running, _ = create_server(self.address, engine, data_plane="python", reflection=False)
            else:
                engine = create_engine({"type": "embedded", "path": str(self._store)})
                with open(self._log_path, "ab") as kvd_log:  # kvd's lines go to the DAL's log as well
                    # the operator's choice: auto falls back to the Python plane if kvd fails to start
                    plane = load_settings().data_plane
                    self.running, _ = create_server(
                        self.address, engine, data_plane=plane, kvd_stderr=kvd_log, reflection=False
                    )
            server_log.info(
                "KV DAL serving %s engine on %s (data plane: %s, in this process)",
                engine.name,
                self.address,
                "native" if isinstance(self.running, NativeServer) else "python",
            )
        except BaseException as exc:
            server_log.error("the embedded DAL did not start: %s", exc)
            self._error = exc
            if engine is not None:
                engine.close()

    def reference(self) -> Any:
        """The ``KvDal`` its server runs (once ``wait`` has returned), for calls made in
        process (``KvClient.hosted``)."""
        self.wait()
        return self.running.dal

    def wait(self) -> None:
        """Block until the server listens, or raise BackendUnavailableError saying why."""
        self._thread.join(self._timeout)
        if self._thread.is_alive():
            raise BackendUnavailableError(f"the embedded DAL did not start within {self._timeout:.0f} s")
        if self._error is not None:
            logged = f" (log {self._log_path})" if self._log_path else ""
            raise BackendUnavailableError(f"the embedded DAL did not start{logged}: {self._error}") from None

    def stop(self, grace: float = 30.0) -> None:
        """Let in-flight calls finish, stop kvd, flush and close the store."""
        self._thread.join(self._timeout)
        if self._thread.is_alive():  # still starting (``wait`` said so): it ends with the process
            logging.getLogger("bulldozer.kv.server").warning(
                "the embedded DAL was still starting after %.0f s; not stopped", self._timeout
            )
            return
        if self.running is not None:
            self.running.stop(grace)
            logging.getLogger("bulldozer.kv.server").info("KV DAL stopped")


@contextmanager
def host_embedded_dal(home: str | os.PathLike[str] | None = None, startup_timeout: float = 60.0) -> Iterator[HostedDal]:
    """Host a DAL over the embedded store in this process, with ``bulldozer-kvd`` in front,
    and return at once (see the module's docstring); its log lines (logger
    ``bulldozer.kv.server``) and kvd's go to the day's DAL log, not to this process's
    console. Stopped gracefully on exit."""
    from bulldozer.logs import JsonFormatter, log_file, open_log
    from bulldozer.warehouse.catalog import bulldozer_home

    log_path = log_file(bulldozer_home(home) / "logs", "dal")
    os.close(open_log(log_path))  # created private to this user
    handler = logging.FileHandler(log_path, encoding="utf-8")
    handler.setFormatter(JsonFormatter())
    try:
        with _server_log_to(handler), _hosted(home, log_path, startup_timeout) as dal:
            yield dal
    finally:
        handler.close()


@contextmanager
def host_empty_dal(startup_timeout: float = 60.0) -> Iterator[HostedDal]:
    """Host a DAL over an empty store in memory in this process: what a command that only
    reads, or changes what exists, acts on in a home that has no embedded store yet (a
    mistyped ``--home``, or no run yet), so that it answers as for an empty store and makes
    no folder there. Its log lines go nowhere."""
    with _server_log_to(logging.NullHandler()), _hosted(None, None, startup_timeout) as dal:
        yield dal


@contextmanager
def _hosted(home: str | os.PathLike[str] | None, log_path: Path | None, startup_timeout: float) -> Iterator[HostedDal]:
    with scratch.folder("dal", sockets=True) as folder:
        dal = HostedDal(home, folder, log_path, startup_timeout)
        try:
            yield dal
        finally:
            dal.stop()


@contextmanager
def _server_log_to(handler: logging.Handler) -> Iterator[None]:
    """The hosted DAL's log lines (logger ``bulldozer.kv.server``) to ``handler`` alone."""
    server_log = logging.getLogger("bulldozer.kv.server")
    saved = server_log.handlers[:], server_log.propagate, server_log.level
    server_log.handlers[:], server_log.propagate = [handler], False
    server_log.setLevel(logging.INFO)
    try:
        yield
    finally:
        server_log.handlers[:], server_log.propagate = saved[0], saved[1]
        server_log.setLevel(saved[2])


def _hosts_embedded() -> bool:
    """Whether an embedded DAL is hosted in this process (the native data plane can run)."""
    return embedded_data_plane()[0] == "native"


def endpoint_issues(loaded: LoadedSpec) -> list[SpecIssue]:
    """The spec's ``key_value_dal.endpoint``, as a located issue when the operator has not
    configured that DAL (``Settings.spec_may_name``): a job spec is untrusted input, and a
    job's data goes wherever its endpoint says, so a spec may name only the embedded store,
    ``BULLDOZER_ENDPOINT`` (or the profile's), ``BULLDOZER_TOKEN_ENDPOINTS`` or
    ``BULLDOZER_SPEC_ENDPOINTS``. An endpoint that came from ``${VAR}`` is not printed."""
    named = loaded.spec.key_value_dal.endpoint
    settings = load_settings()
    if named is None or settings.spec_may_name(named):
        return []
    shown = "the endpoint it reads from a variable" if "key_value_dal.endpoint" in loaded.expanded else repr(named)
    configured = ["embedded", *([settings.endpoint] if settings.endpoint else [])]
    return [
        loaded.issue(
            ("key_value_dal", "endpoint"),
            f"a spec may name only a DAL the operator configured, and {shown} is not one (a job's data goes "
            f"wherever its spec's endpoint says): name {' or '.join(configured)}, leave it out to use the "
            "operator's, or have the operator list it in BULLDOZER_SPEC_ENDPOINTS",
        )
    ]


def spec_token(loaded: LoadedSpec, endpoint: str, operator_endpoint: bool = False) -> str | None:
    """The bearer token a run of ``loaded`` sends to ``endpoint``.

    A token written in the spec itself is the spec's own and goes to the spec's endpoint.
    The operator's token — ``BULLDOZER_TOKEN``, or a spec token that came from ``${VAR}``
    expansion — goes only to an endpoint it was configured for (``BULLDOZER_ENDPOINT``,
    ``BULLDOZER_TOKEN_ENDPOINTS``, the embedded DAL, or one the operator named on the command
    line); a spec naming any other endpoint gets no token from the environment."""
    own = loaded.spec.key_value_dal.token
    if own and "key_value_dal.token" not in loaded.expanded:
        return own
    settings = load_settings()
    candidate = own or settings.operator_token()
    if candidate is None or operator_endpoint or settings.token_allowed_for(endpoint):
        return candidate
    log.warning(
        "%s: not sending the configured token to %s: the spec names an endpoint the token was not configured "
        "for (BULLDOZER_ENDPOINT or BULLDOZER_TOKEN_ENDPOINTS)",
        loaded.source,
        endpoint,
    )
    return None


@contextmanager
def connect_for_spec(
    loaded: LoadedSpec,
    home: str | os.PathLike[str] | None = None,
    endpoint: str | None = None,
    timeout: float = 60.0,
    create: bool = True,
) -> Iterator[KvClient]:
    """A client of ``endpoint`` (the operator's override), else of the DAL ``loaded`` names,
    else of the operator's (``BULLDOZER_ENDPOINT``, the profile's, else embedded), with the
    token ``spec_token`` allows; ``create``: as ``connect``'s."""
    named = loaded.spec.key_value_dal.endpoint
    if endpoint is None and (refused := endpoint_issues(loaded)):
        raise SpecError(refused)  # before any connection to the spec's host
    target = _spec_target(loaded, endpoint)
    token = spec_token(loaded, target, operator_endpoint=endpoint is not None or named is None)
    with connect(target, home, token=token, timeout=timeout, env_token=False, create=create) as client:
        yield client


def _spec_target(loaded: LoadedSpec, endpoint: str | None) -> str:
    """The DAL ``connect_for_spec`` connects to: ``endpoint``, else the spec's, else the operator's."""
    return endpoint or loaded.spec.key_value_dal.endpoint or load_settings().dal_endpoint()


def store_not_made(loaded: LoadedSpec, home: str | os.PathLike[str] | None, endpoint: str | None = None) -> bool:
    """Whether ``connect_for_spec`` would act on the embedded store of a home that has none
    (a run would make it)."""
    if _spec_target(loaded, endpoint) != "embedded":
        return False
    from bulldozer.warehouse.catalog import not_made

    return not_made(embedded_store_path(home))


def checked_endpoint(endpoint: str) -> str:
    """``endpoint`` when it is ``embedded`` or ``host:port`` (the spec's rule,
    ``spec.models.ENDPOINT_PATTERN``, with a port gRPC can dial), else an
    InvalidArgumentError at once: a typo in ``--endpoint`` or ``BULLDOZER_ENDPOINT`` used to
    wait 15 s and then say the DAL did not answer."""
    import re

    from bulldozer.redaction import visible
    from bulldozer.spec.models import ENDPOINT_PATTERN

    if endpoint == "embedded" or (
        re.fullmatch(ENDPOINT_PATTERN, endpoint) and 0 < int(endpoint.rpartition(":")[2]) < 65536
    ):
        return endpoint
    raise InvalidArgumentError(
        f"'{visible(endpoint)}' is not a DAL endpoint: give embedded or HOST:PORT (a port from 1 to 65535)"
    )


@contextmanager
def connect(
    endpoint: str | None = None,
    home: str | os.PathLike[str] | None = None,
    token: str | None = None,
    timeout: float = 60.0,
    env_token: bool = True,
    create: bool = True,
) -> Iterator[KvClient]:
    """A client of ``endpoint`` (None: ``BULLDOZER_ENDPOINT``, else ``embedded``): ``embedded``
    (a DAL started for the duration, plaintext on loopback) or ``host:port``, with the bearer
    token (``token``, else — with ``env_token``, for an endpoint the operator named —
    ``BULLDOZER_TOKEN``) and TLS from ``BULLDOZER_TLS_CA`` / ``BULLDOZER_TLS_CERT`` /
    ``BULLDOZER_TLS_KEY``. ``create`` False, for a command that only reads or changes what
    exists: on a home without an embedded store it acts on an empty one (``host_empty_dal``)
    and makes nothing there."""
    settings = load_settings()
    endpoint = checked_endpoint(settings.dal_endpoint(endpoint))
    warm = _warm if endpoint == "embedded" else None
    if warm is not None and (warm[0], warm[2]) == (embedded_store_path(home), embedded_data_plane()):
        from bulldozer.kv.client import KvClient

        client = KvClient(warm[1], token=token, timeout=timeout)
        client.store = f"embedded ({warm[0]})"
        try:
            client.wait_ready(timeout=2.0)
        except BackendUnavailableError:
            client.close()  # the loader's DAL does not answer: start one as usual
            log.warning("the warm loader's embedded DAL at %s does not answer; starting one", warm[1])
        else:
            try:
                yield client
            finally:
                client.close()
            return
    if endpoint == "embedded":
        from bulldozer.kv.privacy import owner_refusal
        from bulldozer.warehouse.catalog import not_made

        store = embedded_store_path(home)
        if (refused := owner_refusal(store)) is not None:  # before its DAL's log is opened in that home
            raise BackendUnavailableError(refused)
        absent = not create and not_made(store)
        dal_cm: Any = (
            host_empty_dal() if absent else host_embedded_dal(home) if _hosts_embedded() else start_embedded_dal(home)
        )
        with dal_cm as dal:
            # imported once the DAL is on its way: gRPC, numpy and pydantic load meanwhile
            from bulldozer.kv.client import KvClient

            if isinstance(dal, HostedDal):  # its namespace and alias calls in process: KvClient.hosted
                client = KvClient.hosted(dal.address, dal.reference, token=token, timeout=timeout)
            else:
                client = KvClient(dal.address, token=token, timeout=timeout)
            client.store = f"embedded ({store}{', none there yet' if absent else ''})"

            def ready() -> None:
                dal.wait()
                client.wait_ready(timeout=min(timeout, 15.0))

            # The caller works on while the DAL starts; its first call waits for it.
            client.defer_until(ready)
            try:
                yield client
            finally:
                client.close()
        return
    from bulldozer.kv.client import KvClient
    from bulldozer.kv.tls import settings_tls_material

    client = KvClient(
        endpoint,
        token=token or (settings.operator_token() if env_token else None),
        timeout=timeout,
        tls=settings_tls_material(settings),
    )
    try:
        client.wait_ready(timeout=min(timeout, 15.0))
        yield client
    finally:
        client.close()
