"""TLS for clients of the KV DAL (the server's side is in ``bulldozer.kv.server.auth``)."""

from __future__ import annotations

import os
from pathlib import Path

import grpc

from bulldozer.errors import InvalidArgumentError
from bulldozer.settings import Settings

__all__ = [
    "TlsMaterial",
    "channel_credentials",
    "check_tls_files",
    "material_credentials",
    "settings_tls_material",
]


#: (CA, certificate chain, private key) as PEM bytes: client TLS that travels with a task
TlsMaterial = tuple[bytes | None, bytes | None, bytes | None]


def check_tls_files(
    ca: str | os.PathLike[str] | None = None,
    cert: str | os.PathLike[str] | None = None,
    key: str | os.PathLike[str] | None = None,
) -> None:
    """Refuse, in one line (InvalidArgumentError), TLS files that are not what they are
    given as: a CA file without a PEM certificate, a certificate without its key (or the
    other way round), a key that is not the certificate's, or either not PEM (or the key
    encrypted: gRPC takes no passphrase). gRPC takes any bytes: a client then logged
    gRPC's own error lines and said the DAL did not answer within 15 s, and a server said
    it could not bind its address. Checked with the standard library's OpenSSL, as gRPC's
    own BoringSSL would read them."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        if ca:
            try:
                context.load_verify_locations(cafile=os.fspath(ca))
            except ssl.SSLError:
                raise InvalidArgumentError(f"the TLS CA file {ca} holds no PEM certificate") from None
        if bool(cert) != bool(key):
            given, missing = ("certificate", "private key") if cert else ("private key", "certificate")
            raise InvalidArgumentError(f"a TLS {given} ({cert or key}) needs its {missing} too")
        if cert and key:
            try:
                context.load_cert_chain(os.fspath(cert), os.fspath(key), password=lambda: b"")
            except ssl.SSLError as exc:
                why = (
                    "the key is not the certificate's"
                    if exc.reason == "KEY_VALUES_MISMATCH"
                    else "they are not a PEM certificate and its unencrypted private key"
                )
                raise InvalidArgumentError(f"the TLS certificate {cert} and key {key}: {why}") from None
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read a TLS file: {exc}") from None


def settings_tls_material(settings: Settings) -> TlsMaterial | None:
    """The settings' client TLS files, read (for processes on other machines, such as Spark
    executors, that cannot read the operator's files); None: plaintext."""
    files = settings.tls_files()
    if not files:
        return None
    check_tls_files(*files)
    try:
        ca, cert, key = (Path(f).read_bytes() if f else None for f in files)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read a TLS file: {exc}") from None
    return ca, cert, key


def material_credentials(material: TlsMaterial) -> grpc.ChannelCredentials:
    ca, cert, key = material
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def channel_credentials(
    ca: str | os.PathLike[str] | None = None,
    cert: str | os.PathLike[str] | None = None,
    key: str | os.PathLike[str] | None = None,
) -> grpc.ChannelCredentials:
    """TLS for a client: the CA that signed the server's certificate, and for mutual TLS
    the client's certificate and key."""
    check_tls_files(ca, cert, key)
    try:
        return grpc.ssl_channel_credentials(
            root_certificates=Path(ca).read_bytes() if ca else None,
            private_key=Path(key).read_bytes() if key else None,
            certificate_chain=Path(cert).read_bytes() if cert else None,
        )
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read a TLS file: {exc}") from None
