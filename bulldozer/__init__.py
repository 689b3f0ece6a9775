"""Bulldozer: move warehouse (Apache Iceberg) tables into an online key-value store.

Each run writes a brand-new versioned namespace through the storage-agnostic KV DAL,
verifies it, and atomically flips an alias to it. The public API:

* :mod:`bulldozer.spec` — the ``MoveDataToKvDal`` job spec and its loader;
* :mod:`bulldozer.schema` — Iceberg → protobuf generation and compatibility;
* :mod:`bulldozer.errors` — the exception tree.
"""

from bulldozer._version import __version__
from bulldozer.errors import BulldozerError

__all__ = ["BulldozerError", "__version__"]
