"""The KV DAL: a gRPC key-value service with versioned namespaces and atomic aliases.

Public API: :class:`KvClient` (client), :func:`create_server` (server),
:func:`create_engine` (storage engines by name), :class:`KvDal` (the rules).
"""

from bulldozer.kv.backends import create_engine
from bulldozer.kv.client import BatchWriter, KvClient
from bulldozer.kv.dal import KvDal, Limits
from bulldozer.kv.digest import Digest

__all__ = ["BatchWriter", "Digest", "KvClient", "KvDal", "Limits", "create_engine", "create_server"]


def __getattr__(name: str) -> object:
    if name == "create_server":  # keeps grpc health/reflection imports off the client path
        from bulldozer.kv.server import create_server

        return create_server
    raise AttributeError(name)
