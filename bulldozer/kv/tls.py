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
    "material_credentials",
    "settings_credentials",
    "settings_tls_material",
]


#: (CA, certificate chain, private key) as PEM bytes: client TLS that travels with a task
TlsMaterial = tuple[bytes | None, bytes | None, bytes | None]


def settings_tls_material(settings: Settings) -> TlsMaterial | None:
    """The settings' client TLS files, read (for processes on other machines, such as Spark
    executors, that cannot read the operator's files); None: plaintext."""
    files = settings.tls_files()
    if not files:
        return None
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
    try:
        return grpc.ssl_channel_credentials(
            root_certificates=Path(ca).read_bytes() if ca else None,
            private_key=Path(key).read_bytes() if key else None,
            certificate_chain=Path(cert).read_bytes() if cert else None,
        )
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read a TLS file: {exc}") from None


def settings_credentials(settings: Settings) -> grpc.ChannelCredentials | None:
    """Client TLS from the settings (``BULLDOZER_TLS_CA`` / ``_CERT`` / ``_KEY``); None: plaintext."""
    files = settings.tls_files()
    return channel_credentials(*files) if files else None
