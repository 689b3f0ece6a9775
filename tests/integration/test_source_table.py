"""The table a run reads: from the embedded catalog, looked up in its SQLite file directly
(no SQLAlchemy), the very table the catalog itself loads; anything else through the catalog."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bulldozer.errors import TableNotFoundError
from bulldozer.spec.models import CatalogConfig
from bulldozer.warehouse import catalog as warehouse
from bulldozer.warehouse.sample import create_sample_warehouse

pytestmark = pytest.mark.integration
TABLE = "sample.user_item_scores"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    create_sample_warehouse(tmp_path, rows=500)
    return tmp_path


def test_the_embedded_lookup_finds_the_catalogs_current_table(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = CatalogConfig()
    full = warehouse.load_table(warehouse.open_catalog(config, home), TABLE)
    monkeypatch.setattr(warehouse, "open_catalog", _not_called)
    direct = warehouse.load_source_table(config, home, TABLE)
    assert direct.metadata_location == full.metadata_location
    assert direct.current_snapshot().snapshot_id == full.current_snapshot().snapshot_id
    assert direct.scan().to_arrow().equals(full.scan().to_arrow())
    # a new snapshot is seen by the next lookup (nothing is cached)
    full.append(full.scan(limit=10).to_arrow())
    assert warehouse.load_source_table(config, home, TABLE).current_snapshot().snapshot_id != (
        direct.current_snapshot().snapshot_id
    )


def _not_called(*_args: object) -> None:
    raise AssertionError("the SqlCatalog was opened")


def test_a_missing_table_is_named_with_the_tables_there_are(home: Path) -> None:
    with pytest.raises(TableNotFoundError, match=r"'sample\.nope'.*sample\.user_item_scores"):
        warehouse.load_source_table(CatalogConfig(), home, "sample.nope")


def test_the_lookup_skips_other_catalogs_and_views(home: Path) -> None:
    db = home / "catalog.db"
    with sqlite3.connect(db) as connection:
        # a view of the same name in the same catalog, and the table under another catalog name
        connection.execute(
            "INSERT INTO iceberg_tables VALUES ('lake', 'sample', 'a_view', 'file:///nowhere.json', NULL, 'VIEW')"
        )
        connection.execute(
            "INSERT INTO iceberg_tables SELECT 'other', table_namespace, table_name, metadata_location, NULL, "
            "iceberg_type FROM iceberg_tables WHERE table_name = 'user_item_scores'"
        )
    connection.close()
    assert warehouse._embedded_metadata_location(CatalogConfig(), home, "sample.a_view") is None
    assert warehouse._embedded_metadata_location(CatalogConfig(name="elsewhere"), home, TABLE) is None
    assert warehouse._embedded_metadata_location(CatalogConfig(name="other"), home, TABLE) is not None
    assert warehouse._embedded_metadata_location(CatalogConfig(), home / "empty", TABLE) is None  # no catalog.db


@pytest.mark.parametrize("damaged", ["manifest", "manifest list", "metadata JSON"])
def test_damaged_table_metadata_is_one_line_naming_the_table(home: Path, damaged: str) -> None:
    """pyiceberg raises whatever its parsers meet on a damaged metadata file
    (UnicodeDecodeError, EOFError, a SystemError from its compiled Avro decoder, pydantic's
    ValidationError): ``run`` said ``run failed: UnicodeDecodeError: 'utf-8' codec can't
    decode byte 0xb7``, and ``plan`` printed a traceback. Each command says one line
    naming the table now."""
    from tests.integration.test_run import _cli

    metadata = home / "warehouse" / "sample" / "user_item_scores" / "metadata"
    files = {
        "manifest": sorted(p for p in metadata.glob("*.avro") if not p.name.startswith("snap-")),
        "manifest list": sorted(metadata.glob("snap-*.avro")),
        "metadata JSON": sorted(metadata.glob("*.metadata.json"))[-1:],  # the current one
    }[damaged]
    for path in files:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    for args in (["run", "templates/move_data_to_kv_dal.yaml", "-q"], ["plan", "templates/move_data_to_kv_dal.yaml"]):
        done = _cli(args, home)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert "Traceback" not in done.stderr
        assert done.stderr.startswith("error: cannot read the metadata of "), done.stderr
        assert "sample.user_item_scores" in done.stderr or "sample/user_item_scores" in done.stderr


def test_a_catalog_that_never_answers_fails_the_command_in_time(home: Path, tmp_path: Path) -> None:
    """pyiceberg's REST catalog asks with no timeout: a catalog that took the connection and
    never answered held ``validate --catalog`` and ``run`` (and a scheduler's task) for ever.
    They fail after ``BULLDOZER_CATALOG_TIMEOUT`` seconds, in one line."""
    import json
    import socket
    import time

    from tests.integration.test_run import TEMPLATE, _cli

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        spec = tmp_path / "job.yaml"
        spec.write_text(TEMPLATE.replace("    name: lake  ", "    name: remote  "))
        env = {
            "BULLDOZER_CATALOGS": json.dumps({"remote": {"type": "rest", "uri": uri}}),
            "BULLDOZER_CATALOG_TIMEOUT": "2",
        }
        said = (
            f"catalog 'remote' at {uri} did not answer within 2 s (BULLDOZER_CATALOG_TIMEOUT): is it up and reachable?"
        )
        for args, code, line in (
            (["validate", str(spec), "--catalog"], 2, f"{spec}:33:5: data_movement.source.table: {said}"),
            (["run", str(spec), "-q"], 1, f"error: {said}"),
        ):
            started = time.monotonic()
            done = _cli(args, home, env)
            assert time.monotonic() - started < 30
            assert (done.returncode, done.stderr.splitlines()) == (code, [line]), done.stderr
