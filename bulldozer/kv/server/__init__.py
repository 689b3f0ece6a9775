"""The KV DAL server: ``create_server(address, engine) -> (server, port)`` and ``serve``.

Its layers, each a module of its own: ``auth`` (who is calling, may they do this),
``servicer`` (API messages to the rules), ``rules`` (``KvDal``: names, limits and the
namespace lifecycle over any storage engine), ``interceptors`` (exceptions to gRPC
status), ``metrics`` (Prometheus) and ``native`` (supervises the Go data plane).

Names are imported on first use, so importing ``bulldozer.kv.server.rules`` (e.g. for an
in-process client) does not load gRPC's health and reflection services.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bulldozer.kv.server.app import SERVICE_NAMES, NativeServer, RunningServer, create_server, serve

__all__ = ["SERVICE_NAMES", "NativeServer", "RunningServer", "create_server", "serve"]


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module 'bulldozer.kv.server' has no attribute {name!r}")
    value = getattr(importlib.import_module("bulldozer.kv.server.app"), name)
    globals()[name] = value
    return value
