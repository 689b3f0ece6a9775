"""Authentication and per-alias authorization for the KV DAL server, and TLS helpers.

Principals live in a YAML file (``bulldozer serve --auth-config FILE``)::

    principals:
      loader:                          # a name; it is what alias history records
        token_sha256: 9f86d08…         # sha256 of its bearer token (the file holds no secret)
        permissions:
          user_item_scores: [write, flip]
          "*": [read]
      dashboards:
        token_env: DASHBOARDS_TOKEN    # or: the token itself, read from this variable at start
        permissions: {"*": [read]}
      ops:
        cert_cn: ops.example.com       # or: the Common Name of its TLS client certificate (mTLS)
        permissions: {"*": [admin]}

Permissions per alias (``*`` and other shell patterns match several): ``read`` (get, batch
get, scan, describe, list, alias and history), ``write`` (create, load, seal, fail and label
versions), ``flip`` (compare-and-set the alias: runs and rollbacks), ``admin`` (all of these,
plus drop and pin). A request with no credentials, or with an unknown token or certificate,
is UNAUTHENTICATED; a known principal without the permission is PERMISSION_DENIED. Tokens
are compared by hash in constant time and never logged or echoed. Health checking and
reflection stay open (for probes).
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import grpc
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from bulldozer.errors import (
    InvalidArgumentError,
    NamespaceNotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
)
from bulldozer.redaction import yaml_problem, yaml_where
from bulldozer.settings import environment

log = logging.getLogger(__name__)

__all__ = [
    "AuthConfig",
    "AuthInterceptor",
    "Authorizer",
    "Permission",
    "load_auth_config",
    "server_credentials",
]

Permission = Literal["read", "write", "flip", "admin"]
_MODEL = ConfigDict(frozen=True, extra="forbid")


class Principal(BaseModel):
    model_config = _MODEL
    token_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    token_env: str | None = None
    cert_cn: str | None = None
    permissions: dict[str, list[Permission]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_credential(self) -> Principal:
        if sum(x is not None for x in (self.token_sha256, self.token_env, self.cert_cn)) != 1:
            raise ValueError("give exactly one of token_sha256, token_env or cert_cn")
        return self


class AuthConfig(BaseModel):
    model_config = _MODEL
    #: at least one: a DAL that authenticates no one served every request "unauthenticated"
    principals: Annotated[dict[str, Principal], Field(min_length=1)]


def load_auth_config(path: str | os.PathLike[str]) -> AuthConfig:
    import yaml

    from bulldozer.config_files import load_yaml

    try:
        data = load_yaml(Path(path).read_text(encoding="utf-8"))
        return AuthConfig.model_validate(data)
    except yaml.YAMLError as exc:
        raise InvalidArgumentError(
            f"{yaml_where(path, exc)}: cannot read the auth configuration: {yaml_problem(exc)}"
        ) from None
    except OSError as exc:
        raise InvalidArgumentError(f"{path}: cannot read the auth configuration: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        raise InvalidArgumentError(f"{path}: invalid auth configuration: {problems}") from None


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Authorizer:
    """Who is calling, and may they do this to this alias."""

    def __init__(self, config: AuthConfig, alias_of: Callable[[str], str]) -> None:
        self._tokens: list[tuple[str, str]] = []
        self._certs: dict[str, str] = {}
        self._grants: dict[str, dict[str, frozenset[str]]] = {}
        for name, p in config.principals.items():
            if p.token_env is not None:
                value = environment().get(p.token_env)
                if not value:
                    raise InvalidArgumentError(f"principal {name!r}: environment variable {p.token_env} is not set")
                self._tokens.append((_sha256(value), name))
            elif p.token_sha256 is not None:
                self._tokens.append((p.token_sha256, name))
            elif p.cert_cn is not None:
                self._certs[p.cert_cn] = name
            self._grants[name] = {pattern: frozenset(perms) for pattern, perms in p.permissions.items()}
        self._alias_of = alias_of
        self._aliases: dict[str, str] = {}
        self._lock = threading.Lock()

    def authenticate(self, context: grpc.ServicerContext) -> str:
        token = ""
        headers = [value for key, value in context.invocation_metadata() if key == "authorization"]
        if len(headers) > 1:
            raise UnauthenticatedError("a request may carry one authorization header, not several")
        for value in headers:
            if isinstance(value, str) and value.startswith("Bearer "):
                token = value[len("Bearer ") :]
        if token:
            digest = _sha256(token)
            for known, name in self._tokens:
                if hmac.compare_digest(known, digest):
                    return name
            raise UnauthenticatedError("unknown bearer token")
        auth = context.auth_context() or {}
        for cn in auth.get("x509_common_name", []):
            principal = self._certs.get(cn.decode() if isinstance(cn, bytes) else str(cn))
            if principal is not None:
                return principal
        if auth.get("x509_common_name"):
            raise UnauthenticatedError("the client certificate names no known principal")
        raise UnauthenticatedError("credentials required: a bearer token or a client certificate")

    def allowed(self, principal: str, permission: str, alias: str) -> bool:
        for pattern, perms in self._grants.get(principal, {}).items():
            if fnmatch.fnmatchcase(alias, pattern) and (permission in perms or "admin" in perms):
                return True
        return False

    def require(self, principal: str, permission: str, alias: str) -> None:
        if not self.allowed(principal, permission, alias):
            raise PermissionDeniedError(f"principal {principal!r} may not {permission} alias {alias!r}")

    def alias_of_namespace(self, name: str) -> str:
        alias = self._aliases.get(name)
        if alias is None:
            try:
                alias = self._alias_of(name)
            except NamespaceNotFoundError:
                return name.split("__", 1)[0]  # the request fails on its own; check the alias it names
            with self._lock:
                self._aliases[name] = alias
        return alias


def _target_alias(auth: Authorizer, target: Any) -> str:
    which = target.WhichOneof("target")
    if which == "alias":
        return str(target.alias).partition("@")[0]
    return auth.alias_of_namespace(str(target.namespace))


def _token_alias(auth: Authorizer, token: bytes) -> str | None:
    name, sep, _ = token.partition(b"\x00")
    return auth.alias_of_namespace(name.decode(errors="replace")) if sep else None


#: method → (permission, the aliases a request touches)
_RULES: dict[str, tuple[str, Callable[[Authorizer, Any], list[str]]]] = {
    "/bulldozer.kv.v1.KvData/PutBatch": ("write", lambda a, r: [a.alias_of_namespace(r.namespace)]),
    "/bulldozer.kv.v1.KvData/PutStream": ("write", lambda a, r: [a.alias_of_namespace(r.namespace)]),
    "/bulldozer.kv.v1.KvData/Delete": ("write", lambda a, r: [a.alias_of_namespace(r.namespace)]),
    "/bulldozer.kv.v1.KvData/Ingest": ("write", lambda a, r: [a.alias_of_namespace(r.namespace)]),
    "/bulldozer.kv.v1.KvData/Get": ("read", lambda a, r: [_target_alias(a, r.target)]),
    "/bulldozer.kv.v1.KvData/BatchGet": ("read", lambda a, r: [_target_alias(a, r.target)]),
    "/bulldozer.kv.v1.KvData/Sample": ("read", lambda a, r: [_target_alias(a, r.target)]),
    "/bulldozer.kv.v1.KvData/Scan": (
        "read",
        lambda a, r: [x for x in (_target_alias(a, r.target), _token_alias(a, r.page_token)) if x],
    ),
    # what engine the store is: no alias's data, open to every authenticated principal
    "/bulldozer.kv.v1.KvNamespaces/DescribeStore": ("read", lambda a, r: []),
    "/bulldozer.kv.v1.KvNamespaces/CreateNamespace": ("write", lambda a, r: [r.alias]),
    "/bulldozer.kv.v1.KvNamespaces/SealNamespace": ("write", lambda a, r: [a.alias_of_namespace(r.name)]),
    "/bulldozer.kv.v1.KvNamespaces/MarkFailed": ("write", lambda a, r: [a.alias_of_namespace(r.name)]),
    "/bulldozer.kv.v1.KvNamespaces/SetLabels": ("write", lambda a, r: [a.alias_of_namespace(r.name)]),
    "/bulldozer.kv.v1.KvNamespaces/DropNamespace": ("admin", lambda a, r: [a.alias_of_namespace(r.name)]),
    "/bulldozer.kv.v1.KvNamespaces/DescribeNamespace": (
        "read",
        lambda a, r: [_target_alias(a, r.target) if r.HasField("target") else a.alias_of_namespace(r.name)],
    ),
    "/bulldozer.kv.v1.KvNamespaces/ListNamespaces": ("read", lambda a, r: [r.alias or "*"]),
    "/bulldozer.kv.v1.KvAliases/GetAlias": ("read", lambda a, r: [r.alias]),
    "/bulldozer.kv.v1.KvAliases/CompareAndSetAlias": ("flip", lambda a, r: [r.alias]),
    "/bulldozer.kv.v1.KvAliases/SetAliasPin": ("admin", lambda a, r: [r.alias]),
    "/bulldozer.kv.v1.KvAliases/AliasHistory": ("read", lambda a, r: [r.alias]),
    "/bulldozer.kv.v1.KvAliases/ListAliases": ("read", lambda a, r: ["*"]),
}
_OPEN = ("/grpc.health.v1.", "/grpc.reflection.")


class AuthInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Authenticates every call, checks the permission on every alias it touches (each
    message of a stream), and hands the principal to the servicer for the history."""

    def __init__(self, authorizer: Authorizer) -> None:
        self.auth = authorizer

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(_OPEN):
            return handler
        rule = _RULES.get(method)
        auth = self.auth

        def check(request: Any, context: grpc.ServicerContext) -> None:
            # raised, not aborted: the error interceptor (outside this one) maps it to a status
            principal = auth.authenticate(context)
            if rule is None:
                raise PermissionDeniedError(f"{method} is not open to principals")
            permission, aliases = rule
            for alias in aliases(auth, request):
                auth.require(principal, permission, alias)
            context.bulldozer_principal = principal  # type: ignore[attr-defined]

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
                check(request, context)
                return inner(request, context)

            return handler._replace(unary_unary=unary_unary)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            def unary_stream(request: Any, context: grpc.ServicerContext) -> Any:
                check(request, context)
                return inner_us(request, context)

            return handler._replace(unary_stream=unary_stream)
        if handler.stream_unary is not None:
            inner_su = handler.stream_unary

            def stream_unary(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
                def checked() -> Iterator[Any]:
                    for request in requests:
                        check(request, context)
                        yield request

                return inner_su(checked(), context)

            return handler._replace(stream_unary=stream_unary)
        return handler


def server_credentials(cert: Path, key: Path, client_ca: Path | None = None) -> grpc.ServerCredentials:
    """TLS for the server; with ``client_ca``, mutual TLS (a client certificate is required).

    The files are read again when they change (``_RenewedTls``): a certificate renewed in
    place — as cert-manager, an ACME client or an operator's script renews one before it
    expires — is served to every connection made after, with no restart. The server kept
    the files it started with: once they expired, every client was refused until someone
    restarted it."""
    files = _RenewedTls(cert, key, client_ca)
    return grpc.dynamic_ssl_server_credentials(
        files.initial, files.fetch, require_client_authentication=client_ca is not None
    )


class _RenewedTls:
    """A server's TLS files (certificate, key, client CA), for gRPC's dynamic credentials:
    ``fetch`` runs before every new connection's handshake and answers the files' new
    configuration when they changed since it last looked (their inode, size or time, the
    links to them followed: a Kubernetes secret is renewed by swapping a link), else None.
    Changed files that do not load — a key not yet the new certificate's, half written — are
    logged, once, and the previous configuration stays; they are read again when they change
    again. Connections made before keep theirs."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None) -> None:
        self._files = (cert, key, client_ca)
        self._lock = threading.Lock()
        self._seen = self._signature()
        self.initial = self._configuration()

    def _signature(self) -> tuple[tuple[int, int, int, int] | None, ...]:
        def of(path: Path | None) -> tuple[int, int, int, int] | None:
            if path is None:
                return None
            try:
                found = os.stat(path)
            except OSError:
                return None  # gone for a moment (a rename in progress): changed
            return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns)

        return tuple(of(path) for path in self._files)

    def _configuration(self) -> Any:
        """The files' configuration, or InvalidArgumentError in one line (``check_tls_files``)."""
        from bulldozer.kv.tls import check_tls_files

        cert, key, client_ca = self._files
        check_tls_files(client_ca, cert, key)
        try:
            pair = (key.read_bytes(), cert.read_bytes())
            ca = client_ca.read_bytes() if client_ca else None
        except OSError as exc:
            raise InvalidArgumentError(f"cannot read a TLS file: {exc}") from None
        return grpc.ssl_server_certificate_configuration([pair], root_certificates=ca)

    def fetch(self) -> Any:
        with self._lock:
            now = self._signature()
            if now == self._seen:
                return None
            self._seen = now
            try:
                configuration = self._configuration()
            except InvalidArgumentError as exc:
                log.warning("the TLS files changed, and do not load: %s; new connections keep the previous ones", exc)
                return None
            except Exception:  # whatever it is, a connection is not the place to raise it (gRPC logs and drops)
                log.exception("the TLS files changed, and could not be read; new connections keep the previous ones")
                return None
            if self._signature() != now:  # changed again while read: read once they settle
                self._seen = ()
                return None
            log.info("the TLS files changed: connections made from now on use them")
            return configuration
