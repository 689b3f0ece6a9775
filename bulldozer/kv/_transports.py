"""How ``KvClient`` reaches a DAL: one small interface, ``Transport``, and its two
implementations, in the style of httpx's ``_transports/base.py`` and ``mock.py``:

* ``GrpcTransport``: a gRPC channel (retries for UNAVAILABLE in its service config, a
  deadline on every call);
* ``InProcessTransport``: a ``KvDal`` in this process, through the servicers a server runs;
* ``HostedTransport``: a DAL this process hosts behind its data plane
  (``bulldozer.kv.connect.HostedDal``): data calls over gRPC to the data plane, namespace
  and alias calls in process.

``translate`` turns a failed gRPC call back into the exception the server raised: by the
name the server sent, else by the status code, through the codes the exception classes
declare (``bulldozer.errors``: the one mapping).
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import grpc

from bulldozer.errors import (
    BackendUnavailableError,
    BulldozerError,
    KvError,
    error_class_by_name,
    error_class_for_code,
)
from bulldozer.interrupts import shielded
from bulldozer.kv.convert import ERROR_DOMAIN, PRINCIPAL_KEY
from bulldozer.kv.v1 import kv_pb2, kv_pb2_grpc

if TYPE_CHECKING:
    from bulldozer.kv.tls import TlsMaterial

__all__ = ["GrpcTransport", "HostedTransport", "InProcessTransport", "Transport", "translate"]

#: Failures of the transport itself (the server raised nothing): the DAL is not reachable.
_UNREACHABLE = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)

_RETRY_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [
                    {"service": "bulldozer.kv.v1.KvData"},
                    {"service": "bulldozer.kv.v1.KvNamespaces"},
                    {"service": "bulldozer.kv.v1.KvAliases"},
                ],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


def translate(err: grpc.RpcError) -> BulldozerError:
    """The Bulldozer exception a failed call stands for."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    name = _error_name(err)
    cls = error_class_by_name(name) if name else None
    if cls is None:
        cls = BackendUnavailableError if code in _UNREACHABLE else error_class_for_code(code.name)
    if code in (grpc.StatusCode.UNAVAILABLE, *_UNREACHABLE) and name is None:
        details = f"the KV DAL is not reachable ({code.name.lower()}): {details}"
    try:
        return cls(details or code.name)
    except TypeError:  # an error class with a richer constructor
        return KvError(details or code.name)


def _error_name(err: grpc.RpcError) -> str | None:
    """The exception class the server named in the call's standard status details
    (``google.rpc.ErrorInfo`` of Bulldozer's domain), if any."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    try:
        status = rpc_status.from_call(err) if hasattr(err, "trailing_metadata") else None  # type: ignore[arg-type]
    except ValueError:  # details that contradict the call's own code or message
        return None
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == ERROR_DOMAIN:
                return str(info.reason)
    return None


class Transport(ABC):
    """How a ``KvClient`` reaches a DAL. ``data``, ``namespaces`` and ``aliases`` are the
    three services (what ``call`` and friends are handed back); a failed call raises the
    exception the server raised."""

    data: Any
    namespaces: Any
    aliases: Any

    @abstractmethod
    def call(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        """One unary call."""

    @abstractmethod
    def future(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        """One unary call, answered later (``.result()`` raises what the call raised)."""

    @abstractmethod
    def put_batch_future(self, payload: bytes, timeout: float) -> Any:
        """PutBatch of a request serialized by the caller (``bulldozer.kv.columnar``)."""

    @abstractmethod
    def stream(self, stub: Any, method: str, request: Any, timeout: float) -> Iterator[Any]:
        """A server-streaming call."""

    @abstractmethod
    def client_stream(self, stub: Any, method: str, requests: Iterator[Any], timeout: float) -> Any:
        """A client-streaming call: ``requests`` in, one response out."""

    def set_gate(self, gate: Callable[[], None]) -> None:
        """Run ``gate`` once before the first call (a transport with nothing to wait for
        ignores it)."""
        return None

    def wait_ready(self, timeout: float) -> None:
        """Block until the DAL answers (or raise BackendUnavailableError)."""
        return None

    def close(self) -> None:
        """Release what the transport holds."""
        return None


def _on_loopback(target: str) -> bool:
    """Is the gRPC target ``target`` (``host:port``, ``[v6]:port``, ``dns:///host:port``,
    ``unix:path``) on this machine's loopback or a Unix socket?"""
    from bulldozer.sockets import host_of, is_loopback

    if target.startswith(("unix:", "unix-abstract:")):
        return True
    return is_loopback(host_of(_address_of(target)))


def _address_of(target: str) -> str:
    """The ``host:port`` of a gRPC target (``dns:///host:port``, ``ipv4:host:port``...)."""
    return target.removeprefix("dns:").lstrip("/").removeprefix("ipv4:").removeprefix("ipv6:")


def _through_proxy(target: str) -> str:
    """What to say of the HTTP proxy gRPC sends a channel to ``target`` through, if any."""
    from bulldozer.redaction import shown_url
    from bulldozer.settings import grpc_proxy

    proxy = None if _on_loopback(target) else grpc_proxy()
    if proxy is None:
        return ""
    return (
        f" through the HTTP proxy {shown_url(proxy[1])} that {proxy[0]} names (list the DAL's host in no_grpc_proxy "
        "or no_proxy if it is reached directly)"
    )


class GrpcTransport(Transport):
    """A gRPC channel to a DAL: retries with backoff for UNAVAILABLE declared in the
    channel's service config, a deadline on every call."""

    def __init__(
        self,
        target: str,
        metadata: list[tuple[str, str]],
        credentials: grpc.ChannelCredentials | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
        tls: TlsMaterial | None = None,
    ) -> None:
        """``tls``: the PEM files ``credentials`` were made of, if known; they let a refusal of
        the client's certificate be told at once (``_client_refused``)."""
        options = [
            ("grpc.enable_retries", 1),
            ("grpc.service_config", _RETRY_SERVICE_CONFIG),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        if _on_loopback(target):  # an HTTP proxy (http_proxy...) would reach its own loopback, not ours
            options.append(("grpc.enable_http_proxy", 0))
        channel = (
            grpc.secure_channel(target, credentials, options=options)
            if credentials is not None
            else grpc.insecure_channel(target, options=options)
        )
        self.target = target
        self.tls = credentials is not None
        self._material = tls
        self.channel = channel
        self.metadata = metadata
        self.data = kv_pb2_grpc.KvDataStub(channel)
        self.namespaces = kv_pb2_grpc.KvNamespacesStub(channel)
        self.aliases = kv_pb2_grpc.KvAliasesStub(channel)
        # PutBatch with the request already serialized (see bulldozer.kv.columnar); typed
        # Any: the stubs do not know the `_registered_method` flag generated code passes
        untyped: Any = channel
        self._put_batch_bytes: Any = untyped.unary_unary(
            "/bulldozer.kv.v1.KvData/PutBatch",
            request_serializer=None,
            response_deserializer=kv_pb2.PutBatchResponse.FromString,
            _registered_method=True,
        )
        self._gate: Callable[[], None] | None = None
        self._gate_lock = threading.RLock()

    def set_gate(self, gate: Callable[[], None]) -> None:
        """Run ``gate`` once, before the first call (e.g. wait for a server still starting)."""
        self._gate = gate

    def pass_gate(self) -> None:
        if self._gate is None:
            return
        with self._gate_lock:
            gate, self._gate = self._gate, None
            if gate is None:
                return
            try:
                gate()
            except BaseException:
                self._gate = gate  # the next call waits again
                raise

    def call(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        self.pass_gate()
        try:
            return getattr(stub, method)(request, timeout=timeout, metadata=self.metadata)
        except grpc.RpcError as err:
            raise translate(err) from None

    def future(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        self.pass_gate()
        with shielded():  # gRPC counts the call for its polling thread as it creates it
            return getattr(stub, method).future(request, timeout=timeout, metadata=self.metadata)

    def put_batch_future(self, payload: bytes, timeout: float) -> Any:
        """PutBatch of a request serialized by the caller."""
        self.pass_gate()
        with shielded():
            return self._put_batch_bytes.future(payload, timeout=timeout, metadata=self.metadata)

    def stream(self, stub: Any, method: str, request: Any, timeout: float) -> Iterator[Any]:
        self.pass_gate()
        try:
            with shielded():  # a response stream is a call gRPC's polling thread completes, as a future's is
                responses = getattr(stub, method)(request, timeout=timeout, metadata=self.metadata)
            yield from responses
        except grpc.RpcError as err:
            raise translate(err) from None

    def client_stream(self, stub: Any, method: str, requests: Iterator[Any], timeout: float) -> Any:
        self.pass_gate()
        try:
            return getattr(stub, method)(requests, timeout=timeout, metadata=self.metadata)
        except grpc.RpcError as err:
            raise translate(err) from None

    def wait_ready(self, timeout: float) -> None:
        """A health check that waits for the connection (any answer will do, an error of the
        server's own included; no credentials go with it). grpc's ``channel_ready_future``
        left a connectivity-polling thread behind that made every ``close()`` wait for it:
        0.12-0.19 s of each command.

        It is asked first without waiting: that call ends with the first connection
        attempt, and its error says why it failed. What no wait can mend fails at once
        (``_lost_cause``): a listener that answers in another protocol than HTTP/2 (a web
        server), a TLS handshake that failed (no TLS there, a certificate the client does not
        trust), a server that closed a connection without TLS and answers a TLS client
        (``_tls_unasked``). Each waited the whole ``timeout`` (15 s) and was then said to be a
        DAL that "did not answer". Any other failure (nothing listens yet, the connection
        closed) is waited out as before, and named if the DAL never answers."""
        import time

        from grpc_health.v1 import health_pb2, health_pb2_grpc

        self.pass_gate()
        check = health_pb2_grpc.HealthStub(self.channel).Check
        started = time.monotonic()
        first = ""
        try:
            check(health_pb2.HealthCheckRequest(), timeout=timeout, wait_for_ready=False)
            return
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                first = _attempt_error(err.details() or "")
                lost = _lost_cause(first) or self._wrong_host(first) or self._tls_unasked(first)
                if (lost := lost or self._client_refused(first)) is not None:
                    raise BackendUnavailableError(
                        f"the KV DAL at {self.target}{_through_proxy(self.target)} {lost}"
                    ) from None
            elif err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                return  # the server's own answer
        left = timeout - (time.monotonic() - started)
        try:
            if left > 0:
                check(health_pb2.HealthCheckRequest(), timeout=left, wait_for_ready=True)
                return
        except grpc.RpcError as err:
            if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return
        said = f" (the first connection attempt: {first})" if first else ""
        if self.tls and first == "Socket closed":  # after a TLS handshake the server then refused
            said += (
                "; a DAL that requires a client certificate closes a connection without one it trusts "
                "(BULLDOZER_TLS_CERT, BULLDOZER_TLS_KEY)"
            )
        raise BackendUnavailableError(
            f"the KV DAL at {self.target} did not answer within {timeout:.0f} s{_through_proxy(self.target)}{said}"
        )

    def _wrong_host(self, error: str) -> str | None:
        """When the DAL's certificate is trusted but not for the host the client reached it by
        (``error``: gRPC's failed hostname check), what to say of it: the names it is for,
        when this process can read them (``sockets.certificate_names``). The client waited
        the whole timeout, then said the DAL "did not answer"."""
        from bulldozer.sockets import certificate_names, host_port

        if "Hostname Verification Check failed" not in error:
            return None
        reached = host_port(_address_of(self.target))
        host = reached[0] if reached else self.target
        names = None
        if self._material is not None and self._reached_directly():
            names = certificate_names(_address_of(self.target), *self._material)
        held = f" (it is for {', '.join(names)})" if names else ""
        return (
            f"presented a certificate that is not for {host}{held}: reach the DAL by a name its certificate holds "
            "(BULLDOZER_ENDPOINT), or give it a certificate for this one"
        )

    def _tls_unasked(self, error: str) -> str | None:
        """When a connection without TLS was closed (``error``: "Socket closed") by a server
        that speaks TLS, what to say of it; None otherwise (a channel with TLS, one through
        a proxy, a server that does not speak TLS)."""
        from bulldozer.sockets import speaks_tls

        if self.tls or error != "Socket closed" or not self._reached_directly():
            return None
        if not speaks_tls(_address_of(self.target)):
            return None
        return "speaks TLS, and this client does not (it closed the connection): set BULLDOZER_TLS_CA to its CA"

    def _reached_directly(self) -> bool:
        """Is the DAL reached over TCP, with no proxy between: can this process ask what
        listens at its address itself (``_tls_unasked``, ``_client_refused``)?"""
        return not _through_proxy(self.target) and not self.target.startswith(("unix:", "unix-abstract:"))

    def _client_refused(self, error: str) -> str | None:
        """When a TLS connection was closed after its handshake (``error``: "Socket closed"),
        and the DAL refuses the client's certificate, or the lack of one, when asked again
        (``sockets.client_refusal``, with the PEM files the channel was made of): what to say
        of it; None otherwise (no TLS, files not known, a proxy between, a DAL that takes
        the client). A DAL that requires a client certificate it trusts closes such a
        connection without a word (gRPC's, under TLS 1.3): the client waited the 15 s."""
        from bulldozer.sockets import client_refusal

        if not self.tls or self._material is None or error != "Socket closed" or not self._reached_directly():
            return None
        ca, cert, key = self._material
        refused = client_refusal(_address_of(self.target), ca, cert, key)
        if refused is None:
            return None
        how = "it closed the connection after the TLS handshake" if refused == "closed" else f"its alert: {refused}"
        if not cert:
            return (
                f"requires a client certificate, and this client sends none ({how}): set BULLDOZER_TLS_CERT and "
                "BULLDOZER_TLS_KEY"
            )
        return (
            f"did not accept this client's certificate ({how}): is it signed by a CA the DAL trusts for clients, and "
            "still valid? (BULLDOZER_TLS_CERT)"
        )

    def close(self) -> None:
        """Close the channel, waiting ``CLOSE_SECONDS`` at most: gRPC's close waits for every
        call in flight to end, and a call an interruption left half made (Ctrl-C, SIGTERM in
        the middle of gRPC's code) never does. A run stopped so waited for ever; the channel
        is then left to the process's exit, which follows."""
        closing = threading.Thread(target=self.channel.close, name="grpc-close", daemon=True)
        try:
            closing.start()
        except RuntimeError:  # no new threads (the interpreter is exiting): closed here
            self.channel.close()
            return
        closing.join(CLOSE_SECONDS)
        if closing.is_alive():
            import logging

            logging.getLogger(__name__).warning(
                "the channel to the KV DAL at %s did not close within %.0f s (a call in it never ended); left open",
                self.target,
                CLOSE_SECONDS,
            )


def _attempt_error(details: str) -> str:
    """gRPC's error of a channel's last connection attempt, from an UNAVAILABLE call's
    details ("failed to connect to all addresses; last error: UNKNOWN: ipv4:HOST:PORT: WHY"):
    WHY; the details as they are when they are not of that form."""
    _, found, last = details.partition("last error: ")
    if not found:
        return details.strip()
    parts = last.split(": ", 2)  # the status code's name, the address, what happened
    return parts[2].strip() if len(parts) == 3 else last.strip()


def _lost_cause(error: str) -> str | None:
    """What a connection attempt's ``error`` (``_attempt_error``) says of a listener that
    waiting will not make a DAL, as the end of a sentence naming it; None for any other."""
    import re

    if "Failed parsing HTTP/2" in error or "http1.x server" in error:
        return (
            f"answered in another protocol than gRPC's (HTTP/2): {error}; is that the DAL's port, and not a web "
            "server's?"
        )
    # gRPC's "Tls handshake failed", "Ssl handshake failed", with OpenSSL's verdict (its
    # reason); one that failed on the connection itself (SSL_ERROR_SYSCALL) names none
    reason = re.search(r"andshake failed.*OPENSSL_internal:([A-Z0-9_]+)(?::\s*([^:]+?))?(?::\s*OK)?$", error)
    if reason is None:
        return None
    verdict, detail = reason.group(1), reason.group(2)  # gRPC's own words may follow OpenSSL's reason
    if detail and detail.startswith("Invalid certificate verification context"):
        detail = None
    hint = {
        "WRONG_VERSION_NUMBER": "what listens there does not speak TLS (a DAL served without TLS is reached without "
        "BULLDOZER_TLS_CA)",
        "CERTIFICATE_VERIFY_FAILED": _VERIFY_HINTS.get(detail or "", _UNTRUSTED),
    }.get(verdict)
    return f"refused the TLS handshake: {verdict}" + (f": {detail}" if detail else "") + (f"; {hint}" if hint else "")


_UNTRUSTED = "its certificate is not signed by a CA the client trusts (BULLDOZER_TLS_CA)"
#: OpenSSL's verdicts on the DAL's certificate chain that no other CA would mend: the chain
#: is trusted, but a certificate of it (the DAL's own, or its CA's) is out of its dates.
#: They were said to be a CA the client does not trust.
_VERIFY_HINTS = {
    "certificate has expired": "a certificate of its chain has expired, the DAL's own or its CA's "
    "(BULLDOZER_TLS_CA): renew it",
    "certificate is not yet valid": "a certificate of its chain is not valid yet, the DAL's own or its CA's "
    "(BULLDOZER_TLS_CA): is this machine's clock right?",
}


#: how long closing a channel may wait for its calls in flight to end (``GrpcTransport.close``)
CLOSE_SECONDS = 10.0


class _LocalContext:
    """Enough of a ServicerContext for the in-process transport."""

    def __init__(self, principal: str) -> None:
        self._principal = principal

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return [(PRINCIPAL_KEY, self._principal)]

    def peer(self) -> str:
        return "in-process"


def _answered(call: Callable[[], Any]) -> Future[Any]:
    """A future already done: what ``call`` returned, or the Bulldozer error it raised."""
    done: Future[Any] = Future()
    try:
        done.set_result(call())
    except BulldozerError as exc:
        done.set_exception(exc)
    return done


class InProcessTransport(Transport):
    """A ``KvDal`` in this process, through the very servicers a server runs (validation,
    error mapping): the same interface as gRPC, no network."""

    def __init__(self, dal: Any, principal: str) -> None:
        from bulldozer.kv.server.servicer import AliasesServicer, DataServicer, NamespacesServicer

        self.data = DataServicer(dal)
        self.namespaces = NamespacesServicer(dal)
        self.aliases = AliasesServicer(dal)
        self.context = _LocalContext(principal)

    def call(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        return getattr(stub, method)(request, self.context)

    def future(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        return _answered(lambda: self.call(stub, method, request, timeout))

    def put_batch_future(self, payload: bytes, timeout: float) -> Any:
        return self.future(self.data, "PutBatch", kv_pb2.PutBatchRequest.FromString(payload), timeout)

    def stream(self, stub: Any, method: str, request: Any, timeout: float) -> Iterator[Any]:
        return iter(getattr(stub, method)(request, self.context))

    def client_stream(self, stub: Any, method: str, requests: Iterator[Any], timeout: float) -> Any:
        return getattr(stub, method)(requests, self.context)

    def close(self) -> None:
        pass


class _Service:
    """Which of the DAL's control services a ``HostedTransport`` call is for (``namespaces``
    or ``aliases``): the transport's stand-in for it until the DAL is up."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class HostedTransport(Transport):
    """A DAL hosted in this process (``bulldozer.kv.connect.HostedDal``), reached two ways:
    its namespace and alias calls (create, seal, labels, flips, listings: a run makes about
    fifteen) straight through its servicers here, as ``InProcessTransport`` does; its data
    calls over gRPC (``wire``) to the data plane in front of it (``bulldozer-kvd``, which
    stores and reads itself and relays the rest to the DAL). Over gRPC, each control call went
    from this process to kvd and back into this process's DAL server, whose threads then
    waited for the interpreter the run's own threads were busy with: 2-8 ms a call. Measured
    on the benchmark's 500 k-row one-shot run into the embedded store, alternating with the
    gRPC path, 24 pairs: the create, flip and retention stages 4, 5 and 6 ms -> 2, 2.5 and
    4 ms; the whole command 1.099 -> 1.062 s and 1.275 -> 1.220 CPU-s (medians; the median of
    the pairs' differences 28 ms and 30 CPU-ms, within the runs' noise).

    The first control call waits for the DAL to start (``wire``'s gate), then asks ``dal``
    for it (the ``KvDal`` its server runs). Each call then runs on a thread of its own, as a
    server's call would, and is waited for as a gRPC call is: an interruption (Ctrl-C,
    SIGTERM, a time limit) ends the wait, not the call, which the DAL finishes whole; a call
    not answered within its timeout raises ``BackendUnavailableError`` (the store's one
    writer held elsewhere, say by a process stopped in the middle of a write). An exception
    that is not a Bulldozer error is logged with the DAL's lines (logger
    ``bulldozer.kv.server``) and raised as ``KvError``, as the server answers it (INTERNAL).
    ``close`` waits for calls still running (``CLOSE_SECONDS`` at most), so that the DAL is
    not stopped under one."""

    def __init__(self, wire: GrpcTransport, dal: Callable[[], Any], principal: str) -> None:
        self.wire = wire
        self.data = wire.data
        self.namespaces = _Service("namespaces")
        self.aliases = _Service("aliases")
        self._dal, self._principal = dal, principal
        self._local: InProcessTransport | None = None
        self._lock = threading.Lock()
        self._running: set[Future[Any]] = set()

    def _in_process(self) -> InProcessTransport:
        local = self._local
        if local is None:
            self.wire.pass_gate()  # the DAL started (or the reason it did not, raised)
            with self._lock:
                if self._local is None:
                    self._local = InProcessTransport(self._dal(), self._principal)
                local = self._local
        return local

    def _local_call(self, stub: _Service, method: str, timeout: float, call: Callable[[Any, Any], Any]) -> Any:
        """``call(local transport, its service stub)`` on a thread of its own, waited for at
        most ``timeout`` seconds."""
        local = self._in_process()
        service = getattr(local, stub.name)
        answer: Future[Any] = Future()

        def run() -> None:
            try:
                answer.set_result(call(local, service))
            except BulldozerError as exc:
                answer.set_exception(exc)
            except BaseException as exc:
                import logging

                logging.getLogger("bulldozer.kv.server").error("%s: unexpected error", method, exc_info=exc)
                answer.set_exception(KvError(f"internal error ({type(exc).__name__}); see the DAL's log"))
            finally:
                with self._lock:
                    self._running.discard(answer)

        with self._lock:
            self._running.add(answer)
        threading.Thread(target=run, name=f"kv-dal-{method}", daemon=True).start()
        try:
            return answer.result(timeout)
        except TimeoutError:
            raise BackendUnavailableError(
                f"the KV DAL is not reachable (deadline_exceeded): {method} did not finish within {timeout:g} s"
            ) from None

    def call(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        if isinstance(stub, _Service):
            return self._local_call(stub, method, timeout, lambda t, s: t.call(s, method, request, timeout))
        return self.wire.call(stub, method, request, timeout)

    def future(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        if isinstance(stub, _Service):
            return _answered(lambda: self.call(stub, method, request, timeout))
        return self.wire.future(stub, method, request, timeout)

    def put_batch_future(self, payload: bytes, timeout: float) -> Any:
        return self.wire.put_batch_future(payload, timeout)

    def stream(self, stub: Any, method: str, request: Any, timeout: float) -> Iterator[Any]:
        if isinstance(stub, _Service):
            return iter(
                self._local_call(stub, method, timeout, lambda t, s: list(t.stream(s, method, request, timeout)))
            )
        return self.wire.stream(stub, method, request, timeout)

    def client_stream(self, stub: Any, method: str, requests: Iterator[Any], timeout: float) -> Any:
        if isinstance(stub, _Service):
            return self._local_call(stub, method, timeout, lambda t, s: t.client_stream(s, method, requests, timeout))
        return self.wire.client_stream(stub, method, requests, timeout)

    def set_gate(self, gate: Callable[[], None]) -> None:
        self.wire.set_gate(gate)

    def wait_ready(self, timeout: float) -> None:
        self.wire.wait_ready(timeout)

    def close(self) -> None:
        from concurrent.futures import wait

        with self._lock:
            running = set(self._running)
        if running and wait(running, CLOSE_SECONDS).not_done:
            import logging

            logging.getLogger(__name__).warning(
                "a call to the KV DAL in this process did not end within %.0f s; the DAL stops under it", CLOSE_SECONDS
            )
        self.wire.close()
