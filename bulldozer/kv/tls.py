"""TLS for clients of the KV DAL (the server's side is in ``bulldozer.kv.server.auth``)."""

from __future__ import annotations

import os
from pathlib import Path

import grpc

from bulldozer.errors import InvalidArgumentError
from bulldozer.settings import Settings

__all__ = ["channel_credentials", "settings_credentials"]


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
