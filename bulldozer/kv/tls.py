"""TLS for clients of the KV DAL (the server's side is in ``bulldozer.kv.server.auth``)."""

from __future__ import annotations

import os
from pathlib import Path

import grpc

from bulldozer.errors import InvalidArgumentError

__all__ = ["channel_credentials", "env_credentials"]


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


def env_credentials() -> grpc.ChannelCredentials | None:
    """Client TLS from BULLDOZER_TLS_CA / BULLDOZER_TLS_CERT / BULLDOZER_TLS_KEY (None: plaintext)."""
    ca, cert, key = (os.environ.get(f"BULLDOZER_TLS_{x}") for x in ("CA", "CERT", "KEY"))
    if not (ca or cert):
        return None
    return channel_credentials(ca, cert, key)
