"""The Iceberg warehouse side: opening catalogs and the embedded sample warehouse.

The sample warehouse (pyarrow, pyiceberg) is imported on first use: ``bulldozer_home``
is needed early, by the command line, before those imports."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bulldozer.warehouse.catalog import bulldozer_home, embedded_catalog_properties, open_catalog

if TYPE_CHECKING:
    from bulldozer.warehouse.sample import SAMPLE_TABLE, create_sample_warehouse, generate_sample

__all__ = [
    "SAMPLE_TABLE",
    "bulldozer_home",
    "create_sample_warehouse",
    "embedded_catalog_properties",
    "generate_sample",
    "open_catalog",
]


def __getattr__(name: str) -> object:
    if name in ("SAMPLE_TABLE", "create_sample_warehouse", "generate_sample"):
        from bulldozer.warehouse import sample

        return getattr(sample, name)
    raise AttributeError(f"module 'bulldozer.warehouse' has no attribute {name!r}")
