"""Bulldozer: move warehouse (Apache Iceberg) tables into an online key-value store.

Each run writes a brand-new versioned namespace through the storage-agnostic KV DAL,
verifies it, and atomically flips an alias to it. The public API:

* :mod:`bulldozer.spec` — the ``MoveDataToKvDal`` job spec and its loader;
* :mod:`bulldozer.schema` — Iceberg → protobuf generation and compatibility;
* :mod:`bulldozer.errors` — the exception tree.
"""

from __future__ import annotations

from bulldozer._version import __version__

#: ``typing.TYPE_CHECKING`` without importing typing (type checkers take this name as True):
#: a ``bulldozer run`` handed to a warm loader imports this package, and typing with its own
#: imports took ≈ 10 ms of that caller's start (bulldozer.cli.loader.client)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from bulldozer.errors import BulldozerError

__all__ = ["BulldozerError", "__version__"]


def __getattr__(name: str) -> type[BulldozerError]:
    """``BulldozerError`` is imported when first asked for: a ``bulldozer run`` handed to a
    warm loader imports this package and the hand-over alone, and the error tree's
    dataclasses took 20 ms of that client's 41 ms before it reached the loader."""
    if name == "BulldozerError":
        from bulldozer.errors import BulldozerError

        return BulldozerError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
