"""TLS, mutual TLS, bearer tokens and per-alias permissions on the KV DAL. The suite makes
its own CA and certificates (and a rogue CA that nobody trusts)."""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bulldozer.errors import BackendUnavailableError, PermissionDeniedError, SpecError, UnauthenticatedError
from bulldozer.kv import KvClient, create_engine
from bulldozer.kv.server import create_server
from bulldozer.kv.server.auth import AuthConfig, server_credentials
from bulldozer.kv.tls import channel_credentials, material_credentials
from bulldozer.kv.types import State
from bulldozer.names import new_version_name
from tests.integration.kv_fixtures import seal_as_loaded
from tests.integration.test_kv_server import _free_port

pytestmark = pytest.mark.integration
LOADER_TOKEN = "loader-secret-7f3a"
READER_TOKEN = "reader-secret-91bc"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(folder: Path, stem: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
    (folder / f"{stem}.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (folder / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def make_pki(folder: Path) -> Path:
    """ca, rogue-ca, server (127.0.0.1 / localhost), and clients loader, ops, stranger (+ rogue);
    servers whose certificate expired, is not valid yet, or is for other names."""
    now = datetime.datetime.now(datetime.UTC)

    def ca(stem: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = _key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(stem))
            .issuer_name(_name(stem))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        _write(folder, stem, key, cert)
        return key, cert

    def leaf(
        stem: str,
        cn: str,
        issuer: tuple[ec.EllipticCurvePrivateKey, x509.Certificate],
        server: bool,
        valid: tuple[datetime.timedelta, datetime.timedelta] = (
            -datetime.timedelta(minutes=5),
            datetime.timedelta(days=1),
        ),
        names: list[x509.GeneralName] | None = None,
    ) -> None:
        key = _key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(issuer[1].subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now + valid[0])
            .not_valid_after(now + valid[1])
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    names or [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        _write(folder, stem, key, builder.sign(issuer[0], hashes.SHA256()))

    good, rogue = ca("ca"), ca("rogue-ca")
    leaf("server", "localhost", good, server=True)
    leaf("rogue-server", "localhost", rogue, server=True)
    for name in ("loader", "ops", "stranger"):
        leaf(name, name, good, server=False)
    leaf("rogue-loader", "loader", rogue, server=False)
    day = datetime.timedelta(days=1)
    leaf("expired-server", "localhost", good, server=True, valid=(-10 * day, -day))
    leaf("future-server", "localhost", good, server=True, valid=(day, 10 * day))
    leaf("other-server", "other", good, server=True, names=[x509.DNSName("dal.example"), x509.DNSName("kv.example")])
    return folder


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


AUTH = {
    "principals": {
        "loader": {
            "token_sha256": hashlib.sha256(LOADER_TOKEN.encode()).hexdigest(),
            "permissions": {"scores": ["write", "flip"], "*": ["read"]},
        },
        "reader": {"token_env": "BULLDOZER_TEST_READER_TOKEN", "permissions": {"*": ["read"]}},
        "loader-cert": {"cert_cn": "loader", "permissions": {"scores": ["write", "flip", "read"]}},
        "ops": {"cert_cn": "ops", "permissions": {"*": ["admin"]}},
    }
}


@pytest.fixture
def auth_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[int]:
    monkeypatch.setenv("BULLDOZER_TEST_READER_TOKEN", READER_TOKEN)
    engine = create_engine({"type": "embedded", "path": str(tmp_path / "kv"), "map_size": 1024**3})
    server, port = create_server("127.0.0.1:0", engine, auth=AuthConfig.model_validate(AUTH))
    yield port
    server.stop(1)


def loaded(client: KvClient, alias: str) -> str:
    name = new_version_name(alias)
    client.create_namespace(name, alias)
    client.put(name, [(b"k", name.encode())])
    seal_as_loaded(client, name, [(b"k", name.encode())])
    return name


def test_tokens_and_per_alias_permissions(auth_server: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    target = f"127.0.0.1:{auth_server}"
    loader = KvClient(target, token=LOADER_TOKEN, principal="mallory")  # the asserted name is ignored
    reader = KvClient(target, token=READER_TOKEN)
    nobody = KvClient(target)
    forger = KvClient(target, token="guessed-token-123")
    try:
        nobody.wait_ready()  # health checking stays open
        v1 = loaded(loader, "scores")
        loader.compare_and_set_alias("scores", None, v1, reason="first")
        assert reader.get(b"k", alias="scores") == v1.encode()
        assert loader.alias_history("scores")[0].principal == "loader"

        with pytest.raises(PermissionDeniedError, match="'loader' may not write alias 'other'"):
            loader.create_namespace(new_version_name("other"), "other")
        with pytest.raises(PermissionDeniedError, match="may not write"):
            reader.put(v1, [(b"x", b"y")])
        with pytest.raises(PermissionDeniedError, match="may not write"):
            reader.create_namespace(new_version_name("scores"), "scores")
        v2 = loaded(loader, "scores")
        with pytest.raises(PermissionDeniedError, match="'reader' may not flip alias 'scores'"):
            reader.compare_and_set_alias("scores", v1, v2)
        with pytest.raises(PermissionDeniedError, match="may not admin"):
            loader.drop(v2)  # dropping is for admins
        with pytest.raises(UnauthenticatedError, match="credentials required"):
            nobody.get(b"k", alias="scores")
        with pytest.raises(UnauthenticatedError, match="unknown bearer token") as refused:
            forger.batch_get([b"k"], alias="scores")
        assert "guessed-token-123" not in str(refused.value)
        assert reader.get_alias("scores").namespace == v1  # nothing moved
        assert [n.name for n in reader.list_namespaces("scores")] == [v1, v2]
    finally:
        for c in (loader, reader, nobody, forger):
            c.close()
    for secret in (LOADER_TOKEN, READER_TOKEN, "guessed-token-123"):
        assert secret not in caplog.text


def test_tls_and_mutual_tls(pki: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BULLDOZER_TEST_READER_TOKEN", READER_TOKEN)
    engine = create_engine({"type": "embedded", "path": str(tmp_path / "kv"), "map_size": 1024**3})
    creds = server_credentials(pki / "server.pem", pki / "server.key", pki / "ca.pem")
    server, port = create_server("127.0.0.1:0", engine, credentials=creds, auth=AuthConfig.model_validate(AUTH))
    target = f"127.0.0.1:{port}"

    def client(cert: str | None, ca: str = "ca", **kw: str) -> KvClient:
        tls = channel_credentials(
            pki / f"{ca}.pem", pki / f"{cert}.pem" if cert else None, pki / f"{cert}.key" if cert else None
        )
        return KvClient(target, credentials=tls, timeout=5, **kw)

    try:
        with client("loader", principal="mallory") as loader:
            v1 = loaded(loader, "scores")
            loader.compare_and_set_alias("scores", None, v1)
            assert loader.get(b"k", alias="scores") == v1.encode()
            assert loader.alias_history("scores")[0].principal == "loader-cert"  # from the certificate
            with pytest.raises(PermissionDeniedError):
                loader.create_namespace(new_version_name("other"), "other")
        with client("ops") as ops:
            assert ops.get_alias("scores").namespace == v1
        with client("stranger") as stranger, pytest.raises(UnauthenticatedError, match="no known principal"):
            stranger.get(b"k", alias="scores")
        with client("stranger", token=READER_TOKEN) as reader:  # a token over mTLS names the principal
            assert reader.get(b"k", alias="scores") == v1.encode()
        for bad in (
            client(None),  # no client certificate
            client("rogue-loader"),  # a certificate from a CA the server does not trust
            client("loader", ca="rogue-ca"),  # a server the client does not trust
            KvClient(target, timeout=5),  # plaintext
        ):
            with bad, pytest.raises(BackendUnavailableError):
                bad.get(b"k", alias="scores")
    finally:
        server.stop(1)


def test_a_dal_reached_with_the_wrong_tls_settings_is_one_line_at_once(pki: Path, tmp_path: Path) -> None:
    """A client without TLS to a DAL with it, one with TLS to a DAL without, one trusting
    another CA: each waited 15 s and was told the DAL "did not answer". Now the first
    connection attempt's failure says which it is, at once; a client certificate the DAL
    refuses (it closes the connection after the handshake) is still waited out, and then
    named with what to check."""
    engine = create_engine({"type": "embedded", "path": str(tmp_path / "tls"), "map_size": 1024**3})
    tls_server, tls_port = create_server(
        "127.0.0.1:0", engine, credentials=server_credentials(pki / "server.pem", pki / "server.key", pki / "ca.pem")
    )
    plain_engine = create_engine({"type": "embedded", "path": str(tmp_path / "plain"), "map_size": 1024**3})
    plain_server, plain_port = create_server("127.0.0.1:0", plain_engine)
    tls, plain = f"127.0.0.1:{tls_port}", f"127.0.0.1:{plain_port}"

    def said(
        target: str, wait: float = 10.0, ca: str | None = None, cert: str | None = None, *, files: bool = True
    ) -> tuple[str, float]:
        """What a client with TLS from ``ca`` and ``cert`` says: made of the PEM files' bytes
        (as ``connect`` makes it), or, without ``files``, of opaque credentials only."""
        tls = (
            (
                (pki / f"{ca}.pem").read_bytes(),
                (pki / f"{cert}.pem").read_bytes() if cert else None,
                (pki / f"{cert}.key").read_bytes() if cert else None,
            )
            if ca
            else None
        )
        made: dict[str, Any] = {"tls": tls} if files else {"credentials": material_credentials(tls) if tls else None}
        with KvClient(target, **made) as client:
            started = time.monotonic()
            with pytest.raises(BackendUnavailableError) as refused:
                client.wait_ready(wait)
            return str(refused.value), time.monotonic() - started

    try:
        cases = {
            (tls, ()): f"the KV DAL at {tls} speaks TLS, and this client does not (it closed the connection): set "
            "BULLDOZER_TLS_CA to its CA",
            (plain, ("ca",)): f"the KV DAL at {plain} refused the TLS handshake: WRONG_VERSION_NUMBER; what listens "
            "there does not speak TLS (a DAL served without TLS is reached without BULLDOZER_TLS_CA)",
            (tls, ("rogue-ca", "loader")): f"the KV DAL at {tls} refused the TLS handshake: CERTIFICATE_VERIFY_FAILED: "
            "unable to get local issuer certificate; its certificate is not signed by a CA the client trusts "
            "(BULLDOZER_TLS_CA)",
            # refused after the handshake: gRPC's server closes the connection without a word
            (tls, ("ca",)): f"the KV DAL at {tls} requires a client certificate, and this client sends none (it closed "
            "the connection after the TLS handshake): set BULLDOZER_TLS_CERT and BULLDOZER_TLS_KEY",
            (tls, ("ca", "rogue-loader")): f"the KV DAL at {tls} did not accept this client's certificate (it closed "
            "the connection after the TLS handshake): is it signed by a CA the DAL trusts for clients, and still "
            "valid? (BULLDOZER_TLS_CERT)",
        }
        for (target, files), line in cases.items():
            text, took = said(target, 10.0, *files)
            assert (text, took < 5) == (line, True), (files, took)
        # made of opaque credentials, the client cannot ask again with its certificate: it waits
        text, took = said(tls, 3, "ca", files=False)
        assert took >= 2.5 and text == (
            f"the KV DAL at {tls} did not answer within 3 s (the first connection attempt: Socket closed); a DAL that "
            "requires a client certificate closes a connection without one it trusts (BULLDOZER_TLS_CERT, "
            "BULLDOZER_TLS_KEY)"
        ), (text, took)
        for made in (
            {"credentials": channel_credentials(pki / "ca.pem", pki / "loader.pem", pki / "loader.key")},
            {"tls": tuple((pki / name).read_bytes() for name in ("ca.pem", "loader.pem", "loader.key"))},
        ):
            with KvClient(tls, **made) as ok:
                ok.wait_ready(5)  # the right settings: ready
    finally:
        tls_server.stop(0)
        plain_server.stop(0)


def test_a_dal_certificate_out_of_its_dates_or_for_another_name_is_one_line_at_once(pki: Path, tmp_path: Path) -> None:
    """The DAL's certificate expired, or not valid yet: the client said its CA was not one it
    trusts (BULLDOZER_TLS_CA), which no CA would mend. A certificate for other names than
    the one the DAL is reached by: the client waited the whole timeout, then said the DAL
    "did not answer". Each is one line at once now, the names the certificate holds with
    it when the client knows its PEM files (as every command's does)."""
    ca = (pki / "ca.pem").read_bytes()
    verdicts = {
        "expired-server": "refused the TLS handshake: CERTIFICATE_VERIFY_FAILED: certificate has expired; a "
        "certificate of its chain has expired, the DAL's own or its CA's (BULLDOZER_TLS_CA): renew it",
        "future-server": "refused the TLS handshake: CERTIFICATE_VERIFY_FAILED: certificate is not yet valid; a "
        "certificate of its chain is not valid yet, the DAL's own or its CA's (BULLDOZER_TLS_CA): is this "
        "machine's clock right?",
        "other-server": "presented a certificate that is not for 127.0.0.1 (it is for dal.example, kv.example): "
        "reach the DAL by a name its certificate holds (BULLDOZER_ENDPOINT), or give it a certificate for this one",
    }
    for stem, verdict in verdicts.items():
        engine = create_engine({"type": "embedded", "path": str(tmp_path / stem), "map_size": 1024**3})
        server, port = create_server(
            "127.0.0.1:0", engine, credentials=server_credentials(pki / f"{stem}.pem", pki / f"{stem}.key")
        )
        try:
            for made in ({"tls": (ca, None, None)}, {"credentials": material_credentials((ca, None, None))}):
                with KvClient(f"127.0.0.1:{port}", **made) as client:
                    started = time.monotonic()
                    with pytest.raises(BackendUnavailableError) as refused:
                        client.wait_ready(10)
                    took = time.monotonic() - started
                said = verdict if "tls" in made else verdict.replace(" (it is for dal.example, kv.example)", "")
                assert (str(refused.value), took < 5) == (f"the KV DAL at 127.0.0.1:{port} {said}", True), took
        finally:
            server.stop(0)


def test_a_dal_serves_its_tls_files_renewed_in_place_without_a_restart(
    pki: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A DAL's certificate renewed in place (a new file renamed over the old, as renewals
    write them), then its client CA: each connection made after is served the new files,
    with no restart. The server kept the files it started with: once its certificate
    expired, every client was refused until someone restarted it. A renewal half done (a key
    that is not the certificate's yet) is logged, and the previous files stay served."""
    caplog.set_level(logging.INFO, "bulldozer.kv.server.auth")
    folder = tmp_path / "tls"
    folder.mkdir()

    def place(name: str, source: str) -> None:
        staged = folder / f".{name}.new"
        staged.write_bytes((pki / source).read_bytes())
        os.replace(staged, folder / name)

    place("server.pem", "expired-server.pem")
    place("server.key", "expired-server.key")
    place("client-ca.pem", "rogue-ca.pem")
    engine = create_engine({"type": "embedded", "path": str(tmp_path / "kv"), "map_size": 1024**3})
    server, port = create_server(
        "127.0.0.1:0",
        engine,
        credentials=server_credentials(folder / "server.pem", folder / "server.key", folder / "client-ca.pem"),
    )
    material = tuple((pki / name).read_bytes() for name in ("ca.pem", "loader.pem", "loader.key"))

    def said() -> str:
        with KvClient(f"127.0.0.1:{port}", tls=material) as client:
            try:
                client.wait_ready(5)
            except BackendUnavailableError as refused:
                return str(refused).removeprefix(f"the KV DAL at 127.0.0.1:{port} ")
            return "ready"

    try:
        assert said().startswith("refused the TLS handshake: CERTIFICATE_VERIFY_FAILED: certificate has expired")
        place("server.pem", "server.pem")
        place("server.key", "server.key")
        assert said().startswith("did not accept this client's certificate")  # its client CA is still the rogue one
        place("client-ca.pem", "ca.pem")
        assert said() == "ready"
        caplog.clear()
        place("server.pem", "other-server.pem")  # half renewed: the key is still the previous certificate's
        assert said() == "ready"
        (warned,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warned == (
            f"the TLS files changed, and do not load: the TLS certificate {folder / 'server.pem'} and key "
            f"{folder / 'server.key'}: the key is not the certificate's; new connections keep the previous ones"
        )
        assert said() == "ready"  # logged once: the files have not changed since
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
        place("server.key", "other-server.key")  # the renewal done
        assert said().startswith("presented a certificate that is not for 127.0.0.1 (it is for dal.example")
    finally:
        server.stop(0)


def test_cli_serves_tls_with_tokens(pki: Path, tmp_path: Path) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(json.dumps(AUTH))
    port = _free_port()
    env = {**os.environ, "BULLDOZER_TEST_READER_TOKEN": READER_TOKEN, "BULLDOZER_HOME": str(tmp_path / "h")}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bulldozer.cli.main",
            "serve",
            "--path",
            str(tmp_path / "kv"),
            "--port",
            str(port),
            "--tls-cert",
            str(pki / "server.pem"),
            "--tls-key",
            str(pki / "server.key"),
            "--auth-config",
            str(auth),
            "--grace",
            "2",
        ],
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        with KvClient(f"127.0.0.1:{port}", credentials=channel_credentials(pki / "ca.pem"), token=LOADER_TOKEN) as c:
            c.wait_ready(timeout=30)
            first = loaded(c, "scores")
            c.compare_and_set_alias("scores", None, first)
            c.compare_and_set_alias("scores", first, loaded(c, "scores"))

        def cli(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "bulldozer.cli.main", *args, "--endpoint", f"127.0.0.1:{port}"],
                env={**env, "BULLDOZER_TLS_CA": str(pki / "ca.pem"), **extra},
                capture_output=True,
                text=True,
                timeout=120,
            )

        shown = cli("alias", "show", "scores", "--json", BULLDOZER_TOKEN=READER_TOKEN)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["namespace"].startswith("scores__v")
        denied = cli("rollback", "scores", "--yes", BULLDOZER_TOKEN=READER_TOKEN)
        assert denied.returncode != 0 and "may not" in denied.stderr and "Traceback" not in denied.stderr
        anonymous = cli("alias", "show", "scores")
        assert anonymous.returncode != 0 and "credentials required" in anonymous.stderr
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert LOADER_TOKEN.encode() not in err and READER_TOKEN.encode() not in err


def test_tls_files_that_are_not_what_they_are_given_as_are_one_line(pki: Path, tmp_path: Path) -> None:
    """A CA file without a certificate, a certificate without its key, a key of another
    certificate, text that is not PEM: each is refused in one line, by ``serve`` and by a
    client. gRPC took any bytes: the server then printed gRPC's own lines and "cannot
    listen on 127.0.0.1:0: Failed to bind", and a client gRPC's lines and, after 15 s, that
    the DAL did not answer."""
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    server_key, loader_key, server_pem = pki / "server.key", pki / "loader.key", pki / "server.pem"
    home = tmp_path / "h"
    served = {
        ("--tls-cert", str(garbage), "--tls-key", str(garbage)): (
            f"error: the TLS certificate {garbage} and key {garbage}: they are not a PEM certificate and its "
            "unencrypted private key"
        ),
        ("--tls-cert", str(server_pem), "--tls-key", str(loader_key)): (
            f"error: the TLS certificate {server_pem} and key {loader_key}: the key is not the certificate's"
        ),
        ("--tls-cert", str(server_pem), "--tls-key", str(server_key), "--tls-client-ca", str(server_key)): (
            f"error: the TLS CA file {server_key} holds no PEM certificate"
        ),
    }
    for args, said in served.items():
        done = _bulldozer(["serve", "--port", "0", "--allow-unauthenticated", *args], home)
        assert done.returncode != 0 and done.stderr.strip().splitlines()[-1] == said, (args, done.stderr)
        assert "E1" not in done.stderr and "bind" not in done.stderr, done.stderr  # no gRPC lines
    client = {
        (("BULLDOZER_TLS_CA", garbage),): f"error: the TLS CA file {garbage} holds no PEM certificate",
        (("BULLDOZER_TLS_CA", pki / "ca.pem"), ("BULLDOZER_TLS_CERT", pki / "loader.pem")): (
            f"error: a TLS certificate ({pki / 'loader.pem'}) needs its private key too"
        ),
    }
    for settings, said in client.items():
        started = time.monotonic()
        done = _bulldozer(
            ["runs", "scores"], home, BULLDOZER_ENDPOINT=f"127.0.0.1:{_free_port()}", **{k: str(v) for k, v in settings}
        )
        assert done.returncode != 0 and done.stderr == said + "\n", (settings, done.stderr)
        assert time.monotonic() - started < 10  # refused at once, not after the DAL's 15 s


def test_a_request_with_two_authorization_headers_is_refused(auth_server: int) -> None:
    import grpc

    from bulldozer.kv.v1 import kv_pb2, kv_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{auth_server}") as channel:
        stub = kv_pb2_grpc.KvAliasesStub(channel)
        two = [("authorization", f"Bearer {READER_TOKEN}"), ("authorization", f"Bearer {LOADER_TOKEN}")]
        with pytest.raises(grpc.RpcError) as refused:
            stub.GetAlias(kv_pb2.GetAliasRequest(alias="scores"), metadata=two, timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "one authorization header" in (refused.value.details() or "")
        with pytest.raises(grpc.RpcError) as one:  # one header is heard (the alias is simply not set)
            stub.GetAlias(kv_pb2.GetAliasRequest(alias="scores"), metadata=two[:1], timeout=10)
        assert one.value.code() == grpc.StatusCode.NOT_FOUND


class _Capture:
    """A gRPC server on loopback that serves nothing and records each call's metadata."""

    def __init__(self) -> None:
        import grpc

        seen = self.seen = []  # type: list[list[tuple[str, str]]]

        class Interceptor(grpc.ServerInterceptor):  # type: ignore[misc]
            def intercept_service(self, continuation: Any, details: Any) -> Any:
                seen.append([(k, v) for k, v in details.invocation_metadata if k == "authorization"])
                return continuation(details)

        from concurrent.futures import ThreadPoolExecutor

        self.server = grpc.server(ThreadPoolExecutor(2), interceptors=[Interceptor()])
        self.endpoint = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def tokens_sent(self, loaded: Any, endpoint: str | None = None) -> list[str]:
        from bulldozer.errors import BulldozerError
        from bulldozer.kv.connect import connect_for_spec

        self.seen.clear()
        with connect_for_spec(loaded, endpoint=endpoint) as client, pytest.raises(BulldozerError):
            client.get_alias("scores")  # the call is recorded, then refused (nothing is served)
        return [value for call in self.seen for _, value in call]


def test_the_operators_token_goes_only_where_it_was_configured_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from bulldozer.spec import load_spec_text
    from tests.integration.test_run import TEMPLATE

    capture = _Capture()
    try:
        hostile = TEMPLATE.replace("  # endpoint: dal.example.com:7110", f"  endpoint: {capture.endpoint}")
        monkeypatch.setenv("BULLDOZER_TOKEN", "operator-secret")
        monkeypatch.delenv("BULLDOZER_ENDPOINT", raising=False)
        monkeypatch.delenv("BULLDOZER_TOKEN_ENDPOINTS", raising=False)
        # an endpoint the operator lets specs name (test_a_spec_sends_data_only_to_a_dal_the_operator_configured)
        monkeypatch.setenv("BULLDOZER_SPEC_ENDPOINTS", capture.endpoint)
        plain = load_spec_text(hostile, "job.yaml")
        assert capture.tokens_sent(plain) == []  # a spec naming its own endpoint gets no operator token
        with_token = hostile.replace(
            "  alias: user_item_scores", "  alias: user_item_scores\n  token: ${BULLDOZER_TOKEN}"
        )
        with pytest.raises(SpecError, match="BULLDOZER_TOKEN is not one specs may read"):
            load_spec_text(with_token, "job.yaml")  # the operator exposes no variable to specs
        monkeypatch.setenv("BULLDOZER_SPEC_VARIABLES", "BULLDOZER_TOKEN")  # an operator who does
        borrowed = load_spec_text(
            hostile.replace("  alias: user_item_scores", "  alias: user_item_scores\n  token: ${BULLDOZER_TOKEN}"),
            "job.yaml",
        )
        assert capture.tokens_sent(borrowed) == []  # nor by naming the variable
        own = load_spec_text(
            hostile.replace("  alias: user_item_scores", "  alias: user_item_scores\n  token: the-specs-own"),
            "job.yaml",
        )
        assert capture.tokens_sent(own) == ["Bearer the-specs-own"]  # a token the spec carries is its own
        assert capture.tokens_sent(plain, endpoint=capture.endpoint) == ["Bearer operator-secret"]  # --endpoint
        monkeypatch.setenv("BULLDOZER_TOKEN_ENDPOINTS", f"dal.example:7110, {capture.endpoint}")
        assert capture.tokens_sent(plain) == ["Bearer operator-secret"]  # the operator's allowlist
        assert capture.tokens_sent(load_spec_text(hostile, "job.yaml")) == ["Bearer operator-secret"]
        monkeypatch.delenv("BULLDOZER_TOKEN_ENDPOINTS")
        monkeypatch.setenv("BULLDOZER_ENDPOINT", capture.endpoint)
        assert capture.tokens_sent(borrowed) == ["Bearer operator-secret"]  # the operator's own endpoint
    finally:
        capture.server.stop(0)


def test_the_embedded_store_is_private(tmp_path: Path) -> None:
    from bulldozer.kv import create_engine

    old = os.umask(0o022)
    try:
        loose = tmp_path / "loose"
        create_engine({"type": "embedded", "path": str(loose), "map_size": 1024**2 * 64}).close()
        os.chmod(loose, 0o755)  # as a store made before the rule, or by hand
        os.chmod(loose / "data.mdb", 0o644)
        engine = create_engine({"type": "embedded", "path": str(loose), "map_size": 1024**2 * 64})
        engine.close()
        fresh = tmp_path / "fresh" / "kv"
        create_engine({"type": "embedded", "path": str(fresh), "map_size": 1024**2 * 64}).close()
    finally:
        os.umask(old)
    for store in (loose, fresh):
        assert store.stat().st_mode & 0o777 == 0o700
        files = list(store.iterdir())
        assert files and all(f.stat().st_mode & 0o777 == 0o600 for f in files), [
            (f.name, oct(f.stat().st_mode)) for f in files
        ]


def test_a_store_of_another_user_is_refused_naming_its_owner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store is its owner's alone (0700). Another user's command failed on the DAL's log
    file in the home, or on the store's chmod ("Operation not permitted"); it now says whose
    the store is and how to read it, before anything is opened. (The suite runs as root, who
    may open any store: this process is made another user by its effective uid.)"""
    import pwd

    from typer.testing import CliRunner

    from bulldozer.cli.main import app

    home = tmp_path / "h"
    create_engine({"type": "embedded", "path": str(home / "kv"), "map_size": 1024**2 * 64}).close()
    owner = (home / "kv").stat().st_uid
    said = (
        f"cannot open the embedded store at {home / 'kv'}: it belongs to user {pwd.getpwuid(owner).pw_name!r} "
        f"(uid {owner}), and the store is its owner's alone; run the command as that user, or have that user serve "
        "the store (`bulldozer serve`) and name its DAL (--endpoint, BULLDOZER_ENDPOINT)"
    )
    monkeypatch.setattr(os, "geteuid", lambda: owner + 4242)
    result = CliRunner().invoke(app, ["namespaces", "--home", str(home)])
    assert (result.exit_code, result.stderr) == (1, f"error: {said}\n")
    assert not (home / "logs").exists()  # refused before its DAL's log was opened
    loader = CliRunner().invoke(app, ["loader", "start", "--home", str(home)])  # its warm DAL would open it
    assert (loader.exit_code, loader.stderr) == (1, f"error: {said}\n")
    assert sorted(p.name for p in home.iterdir()) == ["kv"]  # no loader folder, no log
    with pytest.raises(BackendUnavailableError) as refused:  # `bulldozer serve` over it
        create_engine({"type": "embedded", "path": str(home / "kv"), "map_size": 1024**2 * 64})
    assert str(refused.value) == said
    monkeypatch.setattr(os, "geteuid", lambda: owner)
    assert CliRunner().invoke(app, ["namespaces", "--home", str(home)]).exit_code == 0  # its owner's


def _serves(store: Path, port_file: Path, *args: str) -> None:
    """``bulldozer serve`` over ``store`` starts and listens (then is stopped), or the test fails."""
    port_file.unlink(missing_ok=True)
    server = _serve(store, *args, "--port-file", str(port_file))
    started = False
    try:
        deadline = time.monotonic() + 60
        while not (started := port_file.exists()) and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:  # never a wait without a limit: a server that did not start may still be running
        server.terminate()
        try:
            _, err = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
    assert started, err


def _serve(store: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bulldozer.cli.main", "serve", "--path", str(store), "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "BULLDOZER_TEST_READER_TOKEN": READER_TOKEN},
    )


def test_a_store_served_with_auth_is_not_served_without_it_by_mistake(tmp_path: Path) -> None:
    store, config = tmp_path / "kv", tmp_path / "auth.json"
    config.write_text(json.dumps(AUTH))
    _serves(store, tmp_path / "port", "--auth-config", str(config))
    opened = _serve(store)
    _, err = opened.communicate(timeout=60)
    assert opened.returncode == 1, err
    assert err.strip().splitlines() == [
        "error: this embedded store was served with --auth-config; serve it with --auth-config again "
        "(or, to serve it without authentication on purpose, --allow-unauthenticated)"
    ], err
    _serves(store, tmp_path / "port", "--allow-unauthenticated")


def test_a_dal_for_other_machines_is_not_served_without_authentication_by_mistake(tmp_path: Path) -> None:
    """``serve --host 0.0.0.0`` without ``--auth-config`` served the store to every machine
    that reached this one, each able to read it, drop its versions and flip its aliases,
    without a word. It is refused in one line unless authentication (or mutual TLS) is
    configured, or ``--allow-unauthenticated`` says it is on purpose; loopback is served as
    before."""
    store, config = tmp_path / "kv", tmp_path / "auth.json"
    config.write_text(json.dumps(AUTH))
    for host in ("0.0.0.0", "::"):
        opened = _serve(store, "--host", host)
        _, err = opened.communicate(timeout=60)
        assert opened.returncode == 1, err
        assert err.splitlines() == [
            f"error: --host {host} serves the store to every machine that reaches this one, and without "
            "--auth-config (or --tls-client-ca) any of them could read it, drop its versions and move its aliases: "
            "give --auth-config, or --allow-unauthenticated to serve it so on purpose (behind a firewall, say)"
        ], err
    assert not store.exists()  # refused before the store was opened
    _serves(store, tmp_path / "port", "--host", "0.0.0.0", "--allow-unauthenticated")
    _serves(store, tmp_path / "port", "--host", "localhost")
    _serves(tmp_path / "other", tmp_path / "port", "--host", "0.0.0.0", "--auth-config", str(config))


def test_retention_failing_after_the_flip_reports_the_flip_and_exits_4(auth_server: int, tmp_path: Path) -> None:
    """The run's principal may write and flip `scores` but not drop (admin): retention fails
    after a successful flip. The version stays live and ACTIVE, the run says so, and the
    command exits with the documented code 4."""
    from bulldozer.load.runner import run_job
    from bulldozer.spec import load_spec_text
    from bulldozer.warehouse.sample import create_sample_warehouse
    from tests.integration.test_run import TEMPLATE

    home = tmp_path / "h"
    create_sample_warehouse(home, rows=2_000)
    text = (
        TEMPLATE.replace("  alias: user_item_scores", "  alias: scores")
        .replace("keep_versions: 2 ", "keep_versions: 0 ")
        .replace("grace_period: 24h", "grace_period: 1s")
    )
    endpoint = f"127.0.0.1:{auth_server}"
    with KvClient(endpoint, token=LOADER_TOKEN) as client:
        first = run_job(load_spec_text(text, "job.yaml"), client, home=str(home))
        run_job(load_spec_text(text, "job.yaml"), client, home=str(home))  # retires the first
        time.sleep(1.2)  # past the grace period: the next run's retention drops the first
        third = run_job(load_spec_text(text, "job.yaml"), client, home=str(home))
        assert third.outcome == "succeeded" and "may not admin" in third.retention_error
        assert client.get_alias("scores").namespace == third.version
        assert client.describe(third.version).state == State.ACTIVE  # never marked FAILED
        assert client.describe(first.version).state == State.RETIRED  # kept: the drop was refused
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(text)
    time.sleep(1.2)
    env = {**os.environ, "BULLDOZER_HOME": str(home), "BULLDOZER_TOKEN": LOADER_TOKEN}
    cmd = [sys.executable, "-m", "bulldozer.cli.main", "run", str(spec_file), "--endpoint", endpoint]
    plain = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert plain.returncode == 4, plain.stderr
    assert "✓ scores →" in plain.stdout
    last = plain.stderr.strip().splitlines()[-1]
    assert last.startswith("error: scores__v") and "is live, but retention failed" in last, plain.stderr
    assert "Traceback" not in plain.stderr
    as_json = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=300, env=env)
    assert as_json.returncode == 4, as_json.stderr
    record = json.loads(as_json.stdout)
    assert record["outcome"] == "succeeded" and "may not admin" in record["retention_error"]
    with KvClient(endpoint, token=READER_TOKEN) as reader:
        assert reader.get_alias("scores").namespace == record["version"]


def test_a_redis_password_is_never_said(tmp_path: Path) -> None:
    """A Redis URL may hold a password: what the engine and the CLI say about that Redis
    shows ``***`` instead (the rules: tests/unit/test_redaction.py)."""
    closed = f"redis://alice:s3cret@127.0.0.1:{_free_port()}/0"
    with pytest.raises(BackendUnavailableError) as refused:
        create_engine({"type": "redis", "url": closed, "prefix": "nopw", "timeout_seconds": 2})
    assert "s3cret" not in str(refused.value) and "alice:***@" in str(refused.value)
    served = subprocess.run(
        [sys.executable, "-m", "bulldozer.cli.main", "serve", "--engine", "redis", "--url", closed, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "BULLDOZER_HOME": str(tmp_path)},
    )
    said = served.stderr.strip().splitlines()
    assert served.returncode != 0 and len(said) == 1 and "cannot reach Redis" in said[0], served.stderr
    assert "s3cret" not in served.stderr + served.stdout


@pytest.mark.parametrize("typed", [True, False], ids=["sql", "no-type"])
def test_a_catalog_uri_password_is_never_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, typed: bool) -> None:
    """A catalog that does not open is named by its URI, without the password in it.
    no-type: pyiceberg's own message repeats the URI (``Could not infer the catalog type
    from the uri: mysql://bob:s3cret@…``), and the line said it, password and all."""
    from bulldozer.errors import CatalogError
    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse.catalog import open_catalog

    scheme = "postgresql+psycopg2" if typed else "mysql"
    uri = f"{scheme}://bob:s3cret@127.0.0.1:{_free_port()}/lake"
    catalog = {"type": "sql", "uri": uri} if typed else {"uri": uri}
    monkeypatch.setenv("BULLDOZER_CATALOGS", json.dumps({"remote": catalog}))
    with pytest.raises(CatalogError) as refused:
        open_catalog(CatalogConfig(name="remote"), tmp_path)
    assert "s3cret" not in str(refused.value) and "bob:***@" in str(refused.value)


def test_a_catalog_that_does_not_open_is_one_line_and_its_library_s_warnings_one_each(tmp_path: Path) -> None:
    """An operator's SQL catalog whose SQLite file cannot be opened, its URI carrying a
    password query parameter: ``run``, ``validate --catalog`` and ``plan`` each say why in
    one line, without SQLAlchemy's "(Background on this error at: ...)" link (it was kept,
    its line break escaped), and SQLAlchemy's warning about that parameter comes as one
    ``warning:`` line, not as Python's two (the library's file and line, then its source
    line). The password is in neither."""
    uri = "sqlite:////nonexistent-dir/lake.db?password=s3cret"
    spec = _spec_with_catalog(tmp_path / "job.yaml", "    name: remote\n")
    env = {"BULLDOZER_CATALOGS": json.dumps({"remote": {"type": "sql", "uri": uri}})}
    for args in (["run", str(spec), "-q"], ["validate", str(spec), "--catalog"], ["plan", str(spec)]):
        done = _bulldozer(args, tmp_path / "home", **env)
        said = done.stderr.strip().splitlines()
        assert done.returncode in (1, 2) and len(said) == 2, (args, done.stderr)
        warned, failed = said
        assert warned.startswith("warning: Query string argument(s) 'password' are not accepted"), (args, warned)
        assert failed.endswith(
            "cannot open catalog 'remote' at sqlite:////nonexistent-dir/lake.db?password=***: "
            "(sqlite3.OperationalError) unable to open database file"
        ), (args, failed)
        assert "s3cret" not in done.stderr + done.stdout


#: a module a hostile spec names as its catalog's or FileIO's class: importing it leaves a mark
_PROBE = """
import os
open(os.environ["PROBE_MARK"], "a").write(__name__ + " imported\n")
class Catalog:
    def __init__(self, *args, **kwargs):
        open(os.environ["PROBE_MARK"], "a").write("called\n")
"""


def _spec_with_catalog(path: Path, catalog: str) -> Path:
    from tests.integration.test_run import TEMPLATE

    text = TEMPLATE.replace("  catalog:\n    name: lake", "  catalog:\n" + catalog, 1)
    assert text != TEMPLATE
    path.write_text(text)
    return path


def _bulldozer(args: list[str], home: Path, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """``bulldozer ARGS`` in ``cwd``, started as the ``bulldozer`` script is: nothing of the
    working directory on ``sys.path`` (``-P``)."""
    return subprocess.run(
        [sys.executable, "-P", "-m", "bulldozer.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "BULLDOZER_HOME": str(home), "BULLDOZER_ENDPOINT": "embedded", **env},
    )


def test_a_spec_cannot_define_its_own_catalog(tmp_path: Path) -> None:
    """A job spec is untrusted: catalog properties of its own would let it create files where it
    likes (a SQL catalog makes its tables in the SQLite file its URI names), import and call any
    installed module (py-catalog-impl, py-io-impl) and reach any host with the machine's own
    credentials. Each is refused before anything is opened, in one located line, by validate
    (with and without --catalog) and by run: no file made, no module imported, no connection."""
    import socket

    from bulldozer.warehouse.sample import create_sample_warehouse

    home = tmp_path / "home"
    create_sample_warehouse(home, rows=1_000)
    (tmp_path / "probe_catalog.py").write_text(_PROBE)
    mark, made = tmp_path / "imported", tmp_path / "made_by_the_spec.db"
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    hostile = {
        "a SQLite file anywhere": f"    name: lake\n    properties:\n      type: sql\n      uri: sqlite:///{made}\n",
        "any module as the catalog": "    name: lake\n    properties:\n      py-catalog-impl: probe_catalog.Catalog\n",
        "any module as the FileIO": f"    name: lake\n    properties:\n      type: sql\n      uri: sqlite:///{made}\n"
        "      py-io-impl: probe_catalog.Catalog\n",
        "any host": f"    name: lake\n    properties:\n      type: rest\n      uri: http://127.0.0.1:{port}/\n",
    }
    env = {"PYTHONPATH": str(tmp_path), "PROBE_MARK": str(mark)}
    try:
        for what, catalog in hostile.items():
            spec = _spec_with_catalog(tmp_path / "job.yaml", catalog)
            for args in (["validate", str(spec)], ["validate", str(spec), "--catalog"], ["run", str(spec), "-q"]):
                done = _bulldozer(args, home, **env)
                said = done.stderr.strip().splitlines()
                assert done.returncode == 2, (what, args, done.stderr)
                assert len(said) == 1 and said[0].startswith(f"{spec}:"), (what, args, done.stderr)
                assert "data_movement.catalog.properties: a spec may not define its own catalog" in said[0]
            assert not mark.exists() and not made.exists(), what
            with pytest.raises(BlockingIOError):
                listener.accept()  # nobody connected
    finally:
        listener.close()


def test_a_spec_names_the_operators_catalog(tmp_path: Path) -> None:
    """The operator's catalogs (BULLDOZER_CATALOGS) are what a spec's catalog name means; a
    deployment that trusts its spec authors may let specs define catalogs themselves."""
    from bulldozer.warehouse.catalog import embedded_catalog_properties
    from bulldozer.warehouse.sample import create_sample_warehouse

    warehouse, home = tmp_path / "warehouse", tmp_path / "home"
    create_sample_warehouse(warehouse, rows=1_000)
    lake = embedded_catalog_properties(warehouse)  # the table is not in the run's own home
    spec = _spec_with_catalog(tmp_path / "job.yaml", "    name: lake\n")
    done = _bulldozer(["run", str(spec), "--json"], home, BULLDOZER_CATALOGS=json.dumps({"lake": lake}))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == 1_000
    missing = _bulldozer(["run", str(spec), "-q"], home)  # without it: the home's embedded catalog, which has none
    assert missing.returncode != 0 and "there is no embedded catalog under" in missing.stderr, missing.stderr
    properties = "".join(f"      {k}: {v}\n" for k, v in lake.items())
    own = _spec_with_catalog(tmp_path / "own.yaml", f"    name: lake\n    properties:\n{properties}")
    assert _bulldozer(["run", str(own), "-q"], home).returncode == 2
    allowed = _bulldozer(["run", str(own), "--json"], home, BULLDOZER_SPEC_CATALOGS="allow")
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["rows"] == 1_000


def test_a_catalog_name_no_one_configured_is_refused(tmp_path: Path) -> None:
    """A spec's catalog is the operator's of its name, or the embedded ``lake``. Any other name
    opened the embedded SQLite file under that name: a name the operator forgot to configure
    read whatever this machine's embedded catalog held under it, and a misspelt one failed as
    if the table were missing. Both are refused in one located line, before anything opens."""
    from pyiceberg.catalog.sql import SqlCatalog

    from bulldozer.warehouse.catalog import embedded_catalog_properties
    from bulldozer.warehouse.sample import SAMPLE_TABLE, create_sample_warehouse

    home = tmp_path / "home"
    create_sample_warehouse(home, rows=1_000)
    embedded = SqlCatalog("prod", **embedded_catalog_properties(home))  # the machine's own 'prod' tables
    embedded.create_namespace("sample")
    lake = SqlCatalog("lake", **embedded_catalog_properties(home)).load_table(SAMPLE_TABLE)
    embedded.register_table(SAMPLE_TABLE, lake.metadata_location)
    spec = _spec_with_catalog(tmp_path / "job.yaml", "    name: prod\n")
    for args in (["validate", str(spec)], ["validate", str(spec), "--catalog"], ["run", str(spec), "-q"]):
        done = _bulldozer(args, home)
        said = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(said) == 1, (args, done.stderr)
        assert said[0].startswith(f"{spec}:") and "data_movement.catalog.name: no catalog is named 'prod'" in said[0]
        assert "the operator configured (there is none) or the embedded one ('lake')" in said[0]
    operator = json.dumps({"prod": embedded_catalog_properties(home)})
    misspelt = _spec_with_catalog(tmp_path / "misspelt.yaml", "    name: prdo\n")
    done = _bulldozer(["run", str(misspelt), "-q"], home, BULLDOZER_CATALOGS=operator)
    assert done.returncode == 2 and done.stderr.strip().endswith("did you mean 'prod'?"), done.stderr
    done = _bulldozer(["run", str(spec), "--json"], home, BULLDOZER_CATALOGS=operator)
    assert done.returncode == 0 and json.loads(done.stdout)["rows"] == 1_000, done.stderr


def test_pyiceberg_s_own_configuration_configures_no_catalog(tmp_path: Path) -> None:
    """pyiceberg's ``load_catalog`` merges its own configuration into a catalog's properties:
    a ``.pyiceberg.yaml`` in the working directory (a checkout of a repository of specs, say)
    set the operator's catalog's FileIO to any installed module, which ``validate --catalog``
    and ``plan`` then imported. Catalogs are now made from Bulldozer's properties alone, the
    keys found there named in a warning; a file that does not parse is one line, not a
    traceback."""
    from bulldozer.warehouse.sample import create_sample_warehouse

    home, cwd = tmp_path / "home", tmp_path / "specs"
    create_sample_warehouse(home, rows=1_000)
    cwd.mkdir()
    (tmp_path / "probe_catalog.py").write_text(_PROBE)
    mark = tmp_path / "imported"
    env = {"PYTHONPATH": str(tmp_path), "PROBE_MARK": str(mark)}
    spec = _spec_with_catalog(cwd / "job.yaml", "    name: lake\n")
    config = cwd / ".pyiceberg.yaml"
    config.write_text("catalog:\n  lake:\n    py-io-impl: probe_catalog.Catalog\n    s3.endpoint: http://elsewhere\n")
    validated = _bulldozer(["validate", str(spec), "--catalog"], home, cwd, **env)
    assert validated.returncode == 0, validated.stderr
    planned = _bulldozer(["plan", str(spec)], home, cwd, **env)
    assert planned.returncode == 0, planned.stderr
    assert "sets py-io-impl, s3.endpoint for it, which Bulldozer does not use" in planned.stderr, planned.stderr
    assert not mark.exists(), mark.read_text()
    config.write_text("catalog: [1, 2\n")
    for args in (["validate", str(spec), "--catalog"], ["plan", str(spec)], ["run", str(spec), "-q"]):
        done = _bulldozer(args, home, cwd)
        said = done.stderr.strip().splitlines()
        assert done.returncode in (1, 2) and len(said) == 1, (args, done.stderr)
        assert "pyiceberg's own configuration (a .pyiceberg.yaml in $PYICEBERG_HOME" in said[0], said
        assert "does not parse" in said[0], said


#: modules planted in the working directory: each leaves a mark and breaks its importer
_PLANTED = """
import os
open(os.environ["PROBE_MARK"], "a").write(__name__ + " imported from the working directory\\n")
raise ImportError("planted")
"""


@pytest.mark.parametrize(
    "how",
    [
        "python-data-plane",
        "warm-loader",
        pytest.param("spark", marks=pytest.mark.spark),
    ],
)
def test_no_child_process_imports_from_the_working_directory(tmp_path: Path, how: str) -> None:
    """A command runs wherever it is started — a checkout of a repository of specs, say. The
    Python children it started with ``-m`` (the embedded DAL on the Python data plane, the
    warm loader, Spark's Python workers) put that directory first on ``sys.path`` and
    imported an ``lmdb.py`` or ``grpc.py`` found there instead of the installed module. They
    start with ``-P`` (``PYTHONSAFEPATH`` for Spark's) now. The command itself is started as
    the ``bulldozer`` script is (``-P`` here)."""
    from bulldozer.warehouse.sample import create_sample_warehouse

    home, checkout = tmp_path / "home", tmp_path / "specs-repo"
    create_sample_warehouse(home, rows=1_000)
    checkout.mkdir()
    for name in ("lmdb", "grpc", "xxhash"):
        (checkout / f"{name}.py").write_text(_PLANTED)
    spec = _spec_with_catalog(checkout / "job.yaml", "    name: lake\n")
    mark = tmp_path / "imported"

    def bulldozer(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return _bulldozer(list(args), home, checkout, PROBE_MARK=str(mark), **env)

    if how == "python-data-plane":
        done = bulldozer("run", str(spec), "-q", BULLDOZER_DATA_PLANE="python")
    elif how == "warm-loader":
        started = bulldozer("loader", "start")
        assert started.returncode == 0, started.stderr
        try:
            done = bulldozer("run", str(spec), "-q")
        finally:
            bulldozer("loader", "stop")
    else:
        done = bulldozer("run", str(spec), "-q", "--engine", "spark", "--master", "local[1]")
    assert done.returncode == 0, done.stderr
    assert not mark.exists(), mark.read_text()
    left = sorted(p.name for p in checkout.iterdir())  # and nothing is left there (spark-warehouse, derby.log...)
    assert left == ["grpc.py", "job.yaml", "lmdb.py", "xxhash.py"], left


def test_a_spec_sends_data_only_to_a_dal_the_operator_configured(tmp_path: Path) -> None:
    """A job's data goes wherever its spec's endpoint says, and a spec is untrusted: it may name
    the embedded store, BULLDOZER_ENDPOINT (or the profile's), BULLDOZER_TOKEN_ENDPOINTS or
    BULLDOZER_SPEC_ENDPOINTS, nothing else. Any other host is refused by validate, submit
    (with and without its catalog check) and run, in one located line, before anything
    connects to it; a name that came from ${VAR} is not printed back."""
    import socket

    from bulldozer.warehouse.sample import create_sample_warehouse
    from tests.integration.test_run import TEMPLATE

    home = tmp_path / "home"
    create_sample_warehouse(home, rows=1_000)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    elsewhere = f"127.0.0.1:{listener.getsockname()[1]}"
    spec, from_variable = tmp_path / "job.yaml", tmp_path / "variable.yaml"
    spec.write_text(TEMPLATE.replace("  # endpoint: dal.example.com:7110", f"  endpoint: {elsewhere}"))
    from_variable.write_text(TEMPLATE.replace("  # endpoint: dal.example.com:7110", "  endpoint: ${ELSEWHERE}"))
    variable = {"ELSEWHERE": elsewhere, "BULLDOZER_SPEC_VARIABLES": "ELSEWHERE"}
    specs = tmp_path / "specs"
    try:
        for path, env in ((spec, {}), (from_variable, variable)):
            for args in (
                ["validate", str(path)],
                ["validate", str(path), "--catalog"],
                ["submit", str(path), "--specs-dir", str(specs)],
                ["submit", str(path), "--no-catalog", "--specs-dir", str(specs)],
                ["run", str(path), "-q"],
            ):
                done = _bulldozer(args, home, **env)
                said = done.stderr.strip().splitlines()
                assert done.returncode == 2, (args, done.stderr)
                assert len(said) == 1 and said[0].startswith(f"{path}:"), (args, done.stderr)
                assert "key_value_dal.endpoint: a spec may name only a DAL the operator configured" in said[0]
                assert ("from a variable" in said[0]) == bool(env) and (elsewhere in said[0]) != bool(env), said[0]
            with pytest.raises(BlockingIOError):
                listener.accept()  # nobody connected
        assert not specs.exists() or not list(specs.iterdir())  # nothing placed for the scheduler
        # the operator's configured DALs: listed for specs (names or patterns), or its own endpoint
        for env in (
            {"BULLDOZER_SPEC_ENDPOINTS": f"dal.example.com:7110, {elsewhere}"},
            {"BULLDOZER_SPEC_ENDPOINTS": "127.0.0.1:*"},
            {"BULLDOZER_TOKEN_ENDPOINTS": elsewhere},
            {"BULLDOZER_ENDPOINT": elsewhere},
        ):
            done = _bulldozer(["validate", str(spec)], home, **env)
            assert done.returncode == 0, (env, done.stderr)
        # the operator's --endpoint overrides the spec's: the run is the operator's
        done = _bulldozer(["run", str(spec), "--endpoint", "embedded", "--json"], home)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["rows"] == 1_000
    finally:
        listener.close()


def test_a_table_is_read_only_from_where_it_lives(
    tmp_path: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table's metadata is its owner's text and may list any file as its data (add_files, a
    manifest written by hand): read as listed, a run would move another table's files, or any
    Parquet file this machine can reach, into the store. A run reads only files under the
    table's location or a root the operator lists (BULLDOZER_DATA_FILE_ROOTS): every engine's
    read, a query's and a delta's; refused in one line, nothing flipped."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from bulldozer.errors import AliasNotFoundError, CatalogError
    from bulldozer.load.runner import run_job
    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse.catalog import open_catalog
    from bulldozer.warehouse.sample import create_sample_warehouse
    from tests.integration.test_run import TEMPLATE
    from tests.integration.test_run_sql import job

    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    create_sample_warehouse(home, rows=1_000)
    table = open_catalog(CatalogConfig(), home).load_table("sample.user_item_scores")

    def stray(name: str, first: int) -> Path:
        """Five rows of new keys in a Parquet file outside the table, added to it as its data."""
        rows = table.scan(limit=5).to_arrow()
        ids = pa.array(range(first, first + 5), rows.schema.field("user_id").type)
        rows = rows.set_column(rows.schema.get_field_index("user_id"), "user_id", ids)
        path = elsewhere / name
        path.parent.mkdir(exist_ok=True)
        pq.write_table(rows.cast(schema_to_pyarrow(table.schema(), include_field_ids=False)), path)
        table.add_files([str(path)])
        return path

    first = stray("stray.parquet", 9_000_000)
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(TEMPLATE)
    said = _bulldozer(["run", str(spec_file), "-q"], home)
    lines = said.stderr.strip().splitlines()
    assert said.returncode == 1 and len(lines) == 1, said.stderr
    assert f"lists a file outside it, {first.as_uri()}" in lines[0] or f"lists a file outside it, {first}" in lines[0]
    assert "BULLDOZER_DATA_FILE_ROOTS" in lines[0]
    flat = "{table: sample.user_item_scores}"
    query = "{query: 'SELECT * FROM sample.user_item_scores'}"
    for source in (flat, query):
        with pytest.raises(CatalogError, match="lists a file outside it"):
            run_job(job(source), dal, home=str(home))
    with pytest.raises(AliasNotFoundError):
        dal.describe_target("scores")  # nothing flipped
    # the operator allows the place: the rows are moved
    monkeypatch.setenv("BULLDOZER_DATA_FILE_ROOTS", f"{tmp_path / 'other'}, {elsewhere}")
    done = run_job(job(flat), dal, home=str(home))
    assert done.outcome == "succeeded" and done.rows == 1_005
    # a delta reads only the changed files: a new stray one is refused there too
    monkeypatch.delenv("BULLDOZER_DATA_FILE_ROOTS")
    stray("stray-2.parquet", 9_100_000)
    with pytest.raises(CatalogError, match="lists a file outside it"):
        run_job(job(flat, extra="  mode: delta"), dal, home=str(home))
    assert dal.describe_target("scores").name == done.version  # the live version stays


@pytest.mark.parametrize("link", ["file", "folder"])
def test_a_symbolic_link_in_a_tables_folder_does_not_take_a_run_outside_it(
    link: str, tmp_path: Path, dal: KvClient
) -> None:
    """Files were held to the table's location by their listed path alone: a table's owner
    could place a symbolic link in the table's folder (a file, or a folder of files) to a
    file only the operator's access reaches — another team's table — add it to the table,
    and a run moved that file's rows into the owner's alias. A local path is now checked
    as the file system resolves it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bulldozer.errors import AliasNotFoundError, CatalogError
    from bulldozer.load.runner import run_job
    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse.catalog import open_catalog
    from bulldozer.warehouse.sample import create_sample_warehouse
    from tests.integration.test_run_sql import job

    home, other_team = tmp_path / "home", tmp_path / "other-team"
    create_sample_warehouse(home, rows=1_000)
    table = open_catalog(CatalogConfig(), home).load_table("sample.user_item_scores")
    (data,) = (home / "warehouse").rglob("*.parquet")
    secret = other_team / "data" / "theirs.parquet"
    secret.parent.mkdir(parents=True)
    rows = pq.read_table(data).slice(0, 5)
    pq.write_table(rows.set_column(0, rows.schema.field(0), pa.array(range(9_000_000, 9_000_005))), secret)
    if link == "file":
        placed = data.parent / "innocent.parquet"
        placed.symlink_to(secret)
    else:
        (data.parent / "more").symlink_to(secret.parent, target_is_directory=True)
        placed = data.parent / "more" / "theirs.parquet"
    table.add_files([str(placed)])
    flat, query = "{table: sample.user_item_scores}", "{query: 'SELECT * FROM sample.user_item_scores'}"
    for source in (flat, query):
        with pytest.raises(
            CatalogError, match=f"lists a file outside it, .*{placed.name} \\(a symbolic link to {secret}\\)"
        ):
            run_job(job(source), dal, home=str(home))
    with pytest.raises(AliasNotFoundError):
        dal.describe_target("scores")  # nothing flipped


@pytest.mark.parametrize(
    "source", ["{table: sample.user_item_scores}", "{query: 'SELECT * FROM sample.user_item_scores'}"]
)
def test_a_data_file_swapped_for_a_link_after_its_check_is_not_read(
    source: str, tmp_path: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a table's files lie was checked as the run planned them, and each file was then
    opened by its path: a table's owner who can write in its folder could swap a checked
    file for a symbolic link, in between, to another team's file of the same rows and
    bytes (what the manifest's counts hold a file to), and the run moved that file's rows.
    Each planned file is now checked again on the descriptor it is read through
    (``warehouse.file_io``); the swap is made here right after the check."""
    import shutil

    from bulldozer.errors import AliasNotFoundError, CatalogError
    from bulldozer.load.runner import run_job
    from bulldozer.warehouse import files
    from bulldozer.warehouse.sample import create_sample_warehouse
    from tests.integration.test_run_sql import job

    home, other_team = tmp_path / "home", tmp_path / "other-team"
    create_sample_warehouse(home, rows=1_000)
    (data,) = (home / "warehouse").rglob("*.parquet")
    other_team.mkdir()
    theirs = other_team / "theirs.parquet"
    shutil.copyfile(data, theirs)  # their rows: here the same bytes, so no count or size tells them apart
    checked = files._inside

    def swapped_after_the_check(*args: Any) -> None:
        checked(*args)
        if not data.is_symlink():
            data.unlink()
            data.symlink_to(theirs)

    monkeypatch.setattr(files, "_inside", swapped_after_the_check)
    with pytest.raises(
        CatalogError, match=f"lists a file outside it, .*{data.name} \\(as opened, a symbolic link to {theirs}\\)"
    ):
        run_job(job(source), dal, home=str(home))
    with pytest.raises(AliasNotFoundError):
        dal.describe_target("scores")  # nothing flipped


@pytest.mark.parametrize("which", ["data file", "manifest list", "manifest"])
def test_a_tables_file_that_is_a_fifo_fails_the_run_in_one_line(which: str, tmp_path: Path) -> None:
    """A table's owner can put a FIFO where one of its files is: a data file (inside the
    table's folder, so the plan's check passes), or the manifest list or a manifest its
    metadata names. pyarrow's (or pyiceberg's) open waited for a writer, and the run hung
    for good. Every local file is opened without blocking and must be a regular file."""
    import os

    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse.catalog import open_catalog
    from bulldozer.warehouse.sample import create_sample_warehouse
    from tests.integration.test_run import TEMPLATE

    home = tmp_path / "home"
    create_sample_warehouse(home, rows=1_000)
    if which == "data file":
        (data,) = (home / "warehouse").rglob("*.parquet")
        listed = data.as_uri()
    else:
        table = open_catalog(CatalogConfig(), home).load_table("sample.user_item_scores")
        snapshot = table.current_snapshot()
        assert snapshot is not None
        manifests = snapshot.manifests(table.io)
        listed = snapshot.manifest_list if which == "manifest list" else manifests[0].manifest_path
    path = Path(listed.removeprefix("file://"))
    path.unlink()
    os.mkfifo(path)
    spec = tmp_path / "job.yaml"
    spec.write_text(TEMPLATE)
    said = _bulldozer(["run", str(spec), "-q"], home)
    lines = said.stderr.strip().splitlines()
    assert said.returncode == 1 and len(lines) == 1, said.stderr
    assert f"the file {listed} is not a regular file" in lines[0]


def test_a_checked_data_file_that_became_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    """A planned local data file is opened without blocking and must be a regular file: a
    FIFO put in its place (no writer ever comes) is one line, not a run that hangs."""
    import os

    from pyiceberg.io.pyarrow import PyArrowFileIO

    from bulldozer.errors import SourceDataError
    from bulldozer.warehouse.file_io import checked_io
    from bulldozer.warehouse.files import _parts

    table = tmp_path / "table"
    (table / "data").mkdir(parents=True)
    fifo = table / "data" / "part-0.parquet"
    os.mkfifo(fifo)
    io = checked_io(PyArrowFileIO())
    io.hold_inside(str(table), [_parts(str(table))], [str(fifo)])
    with pytest.raises(SourceDataError, match="is not a regular file"):
        io.new_input(str(fifo)).open()


_PROBE_IO = """
import os
open(os.environ["PROBE_MARK"], "a").write(__name__ + " imported\\n")
class ProbeIO:
    def __init__(self, properties):
        open(os.environ["PROBE_MARK"], "a").write("called\\n")
"""


def _set_table_properties(home: Path, identifier: str, properties: dict[str, str]) -> None:
    """Commit ``properties`` to the embedded catalog's table as its owner could, without
    pyiceberg acting on them here: a new metadata file, and the catalog row pointed at it."""
    import sqlite3
    import uuid

    from pyiceberg.serializers import ToOutputFile

    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse.catalog import open_catalog

    table = open_catalog(CatalogConfig(), home).load_table(identifier)
    metadata = table.metadata.model_copy(update={"properties": {**table.metadata.properties, **properties}})
    location = table.metadata_location.rsplit("/", 1)[0] + f"/99999-{uuid.uuid4()}.metadata.json"
    ToOutputFile.table_metadata(metadata, table.io.new_output(location))
    namespace, name = identifier.split(".")
    with sqlite3.connect(home / "catalog.db") as db:
        changed = db.execute(
            "UPDATE iceberg_tables SET metadata_location = ? WHERE table_namespace = ? AND table_name = ?",
            (location, namespace, name),
        ).rowcount
    assert changed == 1


def test_a_metadata_file_that_is_not_a_tables_is_said_without_its_text(tmp_path: Path) -> None:
    """A catalog names a table's metadata file, and a table registered with any file as its
    metadata (``register_table``) made a run read that file: pydantic's error quoted its first
    and last 25 characters in the run's error line (a credentials file's key, say), which the
    spec's author reads. The line says what is wrong, not the file's text."""
    import sqlite3

    from bulldozer.warehouse.sample import create_sample_warehouse
    from tests.integration.test_run import TEMPLATE

    home = tmp_path / "home"
    create_sample_warehouse(home, rows=100)
    secret = tmp_path / "credentials"
    secret.write_text(
        "aws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = wJalrXUtnFEMIK7MDENGbPxRfiCY\n"
    )
    with sqlite3.connect(home / "catalog.db") as connection:
        connection.execute("UPDATE iceberg_tables SET metadata_location = ?", (secret.as_uri(),))
    connection.close()
    spec = tmp_path / "job.yaml"
    spec.write_text(TEMPLATE)
    said = _bulldozer(["run", str(spec), "-q"], home)
    assert said.returncode == 1 and len(said.stderr.strip().splitlines()) == 1, said.stderr
    assert said.stderr.startswith("error: cannot read the metadata of table 'sample.user_item_scores': "), said.stderr
    assert "ValidationError: Invalid JSON" in said.stderr, said.stderr
    assert "AKIA" not in said.stderr and "aws_" not in said.stderr and "wJal" not in said.stderr, said.stderr


@pytest.mark.parametrize(
    "properties",
    [{"py-io-impl": "bd_probe_io.ProbeIO"}, {"s3.endpoint": "http://127.0.0.1:9", "s3.signer.uri": "http://x"}],
    ids=["code", "endpoint"],
)
def test_a_table_cannot_choose_how_its_files_are_read(tmp_path: Path, properties: dict[str, str]) -> None:
    """Whoever can commit to a table sets its properties; pyiceberg lets them override the
    catalog's FileIO settings (apache/iceberg-python#3931): which module reads the files
    (imported as the table loads) and where requests, signed with the operator's credentials,
    go. A run, validate --catalog and plan refuse such a table in one line, and import nothing."""
    from bulldozer.warehouse.sample import create_sample_warehouse
    from tests.integration.test_run import TEMPLATE

    home, probe = tmp_path / "home", tmp_path / "probe"
    create_sample_warehouse(home, rows=1_000)
    _set_table_properties(home, "sample.user_item_scores", properties)
    probe.mkdir()
    (probe / "bd_probe_io.py").write_text(_PROBE_IO)
    mark = tmp_path / "mark"
    spec = tmp_path / "job.yaml"
    spec.write_text(TEMPLATE)
    env = {"PYTHONPATH": f"{probe}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "PROBE_MARK": str(mark)}
    for args in (["run", str(spec), "-q"], ["validate", str(spec), "--catalog"], ["plan", str(spec)]):
        said = _bulldozer(args, home, **env)
        lines = said.stderr.strip().splitlines()
        assert said.returncode != 0 and "Traceback" not in said.stderr, said.stderr
        assert f"sets {sorted(properties)[0]}" in lines[-1] and "in its own properties" in lines[-1], said.stderr
        assert not mark.exists(), f"{args[0]}: {mark.read_text()}"
    shown = _bulldozer(["alias", "show", "user_item_scores"], home)
    assert shown.returncode != 0  # nothing was loaded, nothing flipped


def test_a_table_property_that_is_not_its_file_io_is_no_reason_to_refuse_it(tmp_path: Path) -> None:
    """Only FileIO keys are the catalog's: a table's other ``*impl`` property (pyiceberg's
    location provider for writes, which a read never imports) leaves it readable."""
    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse.catalog import load_table, open_catalog
    from bulldozer.warehouse.sample import create_sample_warehouse

    home = tmp_path / "home"
    create_sample_warehouse(home, rows=100)
    _set_table_properties(home, "sample.user_item_scores", {"write.py-location-provider.impl": "nowhere.Provider"})
    table = load_table(open_catalog(CatalogConfig(), home), "sample.user_item_scores")
    assert table.metadata.properties["write.py-location-provider.impl"] == "nowhere.Provider"
    assert table.scan(limit=3).to_arrow().num_rows == 3
