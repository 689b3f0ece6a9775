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
from bulldozer.redaction import shown_url
from bulldozer.spec.models import CatalogConfig

__all__ = ["bulldozer_home", "embedded_catalog_properties", "load_source_table", "load_table", "open_catalog"]


def bulldozer_home(home: str | os.PathLike[str] | None = None) -> Path:
    """Where embedded state lives: ``home``, else ``$BULLDOZER_HOME``, else ``./.bulldozer``."""
    from bulldozer.settings import load_settings

    return load_settings().home_path(home)


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
        where = shown_url(props["uri"]) if "uri" in props else props.get("type", "?")
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


def _embedded_metadata_location(
    config: CatalogConfig, home: str | os.PathLike[str] | None, identifier: str
) -> str | None:
    from bulldozer.warehouse.pyiceberg_fast import embedded_metadata_location

    return embedded_metadata_location(config.name, bulldozer_home(home), identifier)


def load_source_table(config: CatalogConfig, home: str | os.PathLike[str] | None, identifier: str) -> Any:
    """The table a run reads, read-only: from the embedded catalog, a ``StaticTable`` on the
    table's current metadata file, looked up in the catalog's SQLite file directly
    (``bulldozer.warehouse.pyiceberg_fast``: opening the ``SqlCatalog`` costs 0.2 s of
    SQLAlchemy imports, a tenth of a small load); from any
    other catalog, or when the lookup finds nothing (the full path then says which tables
    exist), the catalog's own table."""
    if config.embedded:
        location = _embedded_metadata_location(config, home, identifier)
        if location is not None:
            from pyiceberg.table import StaticTable

            return StaticTable.from_metadata(location, embedded_catalog_properties(home))
    return load_table(open_catalog(config, home), identifier)
