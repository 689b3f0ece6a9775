"""The KV DAL: a gRPC key-value service with versioned namespaces and atomic aliases.

Public API: :class:`KvClient` (client), :func:`create_server` (server),
:func:`create_engine` (storage engines by name), :class:`KvDal` (the rules).

Each name is imported on first use: ``import bulldozer.kv.connect`` (how a run starts its
DAL) costs no gRPC, numpy or pydantic import, so the command line starts the DAL before
it loads them; and the server's health/reflection imports stay off the client path.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bulldozer.codec.digest import Digest
    from bulldozer.kv.backends import create_engine
    from bulldozer.kv.client import BatchWriter, KvClient
    from bulldozer.kv.server import create_server
    from bulldozer.kv.server.rules import KvDal, Limits

__all__ = ["BatchWriter", "Digest", "KvClient", "KvDal", "Limits", "create_engine", "create_server"]

_HOMES = {
    "create_engine": "bulldozer.kv.backends",
    "BatchWriter": "bulldozer.kv.client",
    "KvClient": "bulldozer.kv.client",
    "KvDal": "bulldozer.kv.server.rules",
    "Limits": "bulldozer.kv.server.rules",
    "Digest": "bulldozer.codec.digest",
    "create_server": "bulldozer.kv.server",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'bulldozer.kv' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
