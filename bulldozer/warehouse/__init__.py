"""The Iceberg warehouse side: opening catalogs and the embedded sample warehouse."""

from bulldozer.warehouse.catalog import bulldozer_home, embedded_catalog_properties, open_catalog
from bulldozer.warehouse.sample import SAMPLE_TABLE, create_sample_warehouse, generate_sample

__all__ = [
    "SAMPLE_TABLE",
    "bulldozer_home",
    "create_sample_warehouse",
    "embedded_catalog_properties",
    "generate_sample",
    "open_catalog",
]
