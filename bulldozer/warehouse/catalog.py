"""Open the Iceberg catalog a job spec names.

The embedded default is pyiceberg's ``SqlCatalog`` on a SQLite file plus a local warehouse
folder, both under ``$BULLDOZER_HOME`` (``.bulldozer/`` in the working directory by
default). Spark's Iceberg runtime opens the very same catalog as a JDBC catalog on that
SQLite file, which works because both use the same catalog name (``lake``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bulldozer.errors import CatalogError, TableNotFoundError
from bulldozer.spec.models import CatalogConfig

__all__ = ["bulldozer_home", "embedded_catalog_properties", "load_table", "open_catalog"]

DEFAULT_HOME = ".bulldozer"


def bulldozer_home(home: str | os.PathLike[str] | None = None) -> Path:
    """Where embedded state lives: ``home``, else ``$BULLDOZER_HOME``, else ``./.bulldozer``."""
    return Path(home or os.environ.get("BULLDOZER_HOME") or DEFAULT_HOME).absolute()


def embedded_catalog_properties(home: str | os.PathLike[str] | None = None) -> dict[str, str]:
    root = bulldozer_home(home)
    return {
        "type": "sql",
        "uri": f"sqlite:///{root / 'catalog.db'}",
        "warehouse": (root / "warehouse").as_uri(),
    }


def open_catalog(config: CatalogConfig | None = None, home: str | os.PathLike[str] | None = None) -> Any:
    """The pyiceberg catalog for ``config`` (the embedded one when it has no properties)."""
    from pyiceberg.catalog import load_catalog

    config = config or CatalogConfig()
    if config.embedded:
        root = bulldozer_home(home)
        (root / "warehouse").mkdir(parents=True, exist_ok=True)
        props = embedded_catalog_properties(root)
    else:
        props = dict(config.properties)
    try:
        return load_catalog(config.name, **props)
    except Exception as exc:  # pyiceberg raises many unrelated types here
        where = props.get("uri", props.get("type", "?"))
        raise CatalogError(f"cannot open catalog {config.name!r} at {where}: {exc}") from exc


def load_table(catalog: Any, identifier: str) -> Any:
    """Load ``namespace.table``; a missing table or namespace is a TableNotFoundError."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError):
        known: list[str] = []
        try:
            for ns in catalog.list_namespaces():
                known.extend(".".join(t) for t in catalog.list_tables(ns))
        except Exception:  # listing is only a hint
            pass
        hint = f" (tables: {', '.join(sorted(known)[:10])})" if known else ""
        raise TableNotFoundError(f"table {identifier!r} does not exist in the catalog{hint}") from None
