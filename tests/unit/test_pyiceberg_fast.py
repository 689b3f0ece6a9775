"""The shortcuts past pyiceberg's public API (bulldozer/warehouse/pyiceberg_fast.py) are
written against a pinned range of pyiceberg: these tests fail loudly, naming the piece, when
the installed pyiceberg leaves that range or no longer has a piece they use, and hold each
shortcut to what the public API gives."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pyarrow as pa
import pytest
from packaging.specifiers import SpecifierSet

from bulldozer.spec.models import CatalogConfig
from bulldozer.warehouse import pyiceberg_fast
from bulldozer.warehouse.catalog import embedded_catalog_properties, load_table, open_catalog
from bulldozer.warehouse.sample import create_sample_warehouse
from tests.conftest import REPO

TABLE = "sample.user_item_scores"


def test_the_installed_pyiceberg_is_the_range_the_shortcuts_are_written_for() -> None:
    version = importlib.metadata.version("pyiceberg")
    assert version in SpecifierSet(pyiceberg_fast.PYICEBERG), (
        f"pyiceberg {version} is outside {pyiceberg_fast.PYICEBERG}: check bulldozer/warehouse/pyiceberg_fast.py"
    )
    assert f'"pyiceberg[sql-sqlite,pyarrow]{pyiceberg_fast.PYICEBERG}"' in (REPO / "pyproject.toml").read_text()


def test_every_private_piece_the_shortcuts_use_exists() -> None:
    from pyiceberg.io import pyarrow as iceberg_arrow

    missing = [
        f"pyiceberg.io.pyarrow.{n}" for n in pyiceberg_fast.PRIVATE_MODULE_FUNCTIONS if not hasattr(iceberg_arrow, n)
    ]
    missing += [
        f"ArrowScan.{n}"
        for n in pyiceberg_fast.PRIVATE_ARROW_SCAN_ATTRIBUTES
        if not hasattr(iceberg_arrow.ArrowScan, n) and n not in iceberg_arrow.ArrowScan.__init__.__code__.co_names
    ]
    assert not missing, f"pyiceberg changed; bulldozer/warehouse/pyiceberg_fast.py uses: {', '.join(missing)}"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("h")
    create_sample_warehouse(home, rows=3_000, chunk_rows=1_000)
    return home


def test_the_catalog_lookup_finds_what_the_sql_catalog_loads(home: Path) -> None:
    table = load_table(open_catalog(CatalogConfig(), home), TABLE)
    assert pyiceberg_fast.embedded_metadata_location(CatalogConfig().name, home, TABLE) == table.metadata_location


def test_both_readers_give_what_the_public_reader_gives(home: Path) -> None:
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.table import StaticTable

    location = pyiceberg_fast.embedded_metadata_location(CatalogConfig().name, home, TABLE)
    assert location is not None
    table = StaticTable.from_metadata(location, embedded_catalog_properties(home))
    scan = table.scan()
    tasks = sorted(scan.plan_files(), key=lambda t: t.file.file_path)
    assert len(tasks) == 3
    for task in tasks:
        arrow_scan = ArrowScan(table.metadata, table.io, scan.projection(), scan.row_filter, scan.case_sensitive)
        public = pa.Table.from_batches(list(arrow_scan.to_record_batches([task])))
        fast = pyiceberg_fast.parquet_batches(arrow_scan, task, 700, 16 << 20)
        streaming = pyiceberg_fast.streaming_reader(arrow_scan)
        assert fast is not None and streaming is not None, "a shortcut fell back: pyiceberg changed"
        assert pa.Table.from_batches(list(fast)).equals(public)
        assert pa.Table.from_batches(list(streaming(task))).equals(public)


def test_a_local_file_is_read_a_piece_of_each_column_at_a_time_and_a_remote_one_fetched_at_once() -> None:
    for local in ("/warehouse/t/data/a.parquet", "file:///warehouse/t/data/a.parquet"):
        assert pyiceberg_fast.read_options(local) == {
            "pre_buffer": False,
            "buffer_size": pyiceberg_fast.LOCAL_READ_BYTES,
        }
    for remote in ("s3://bucket/t/data/a.parquet", "gs://b/a.parquet", "abfss://c@a.dfs.core.windows.net/a.parquet"):
        assert pyiceberg_fast.read_options(remote) == {"pre_buffer": True}


def test_reading_a_local_row_group_does_not_hold_its_compressed_bytes_at_once(tmp_path: Path) -> None:
    """One row group of 49 MiB of random numbers in 6 columns, read in batches of 65,536 rows
    (3 MiB): Arrow's allocations stay below the row group's compressed size (35 MiB here;
    with its column chunks fetched at once, the reader held 79 MiB)."""
    import numpy as np
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    columns, rows = 6, 1_000_000  # (pyiceberg starts a row group every 1,048,576 rows)
    schema = Schema(*(NestedField(1 + c, f"n{c}", LongType(), required=False) for c in range(columns)))
    catalog = open_catalog(CatalogConfig(), tmp_path)
    catalog.create_namespace_if_not_exists("mem")
    table = catalog.create_table("mem.wide", schema=schema)
    numbers = np.random.default_rng(7).integers(-(2**62), 2**62, size=(columns, rows))
    table.append(pa.table({f"n{c}": numbers[c] for c in range(columns)}, schema=schema.as_arrow()))
    [task] = list(table.scan().plan_files())
    with table.io.new_input(task.file.file_path).open() as fin:
        metadata = pq.ParquetFile(fin).metadata
    assert metadata.num_row_groups == 1
    group = metadata.row_group(0)
    compressed = sum(group.column(i).total_compressed_size for i in range(group.num_columns))
    assert compressed > 40 << 20

    scan = table.scan()
    arrow_scan = ArrowScan(table.metadata, table.io, scan.projection(), scan.row_filter, scan.case_sensitive)
    pool = pa.default_memory_pool()
    before, peak, read = pool.bytes_allocated(), 0, 0
    batches = pyiceberg_fast.parquet_batches(arrow_scan, task, 65_536, 16 << 20)
    assert batches is not None
    for batch in batches:
        peak = max(peak, pool.bytes_allocated() - before)
        read += batch.num_rows
    assert read == rows
    assert peak < compressed, f"{peak / 2**20:.0f} MiB held reading a {compressed / 2**20:.0f} MiB row group"
