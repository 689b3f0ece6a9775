"""How the embedded engine names a write its disk refused (``EmbeddedEngine._disk_full``):
LMDB says ``ENOSPC`` for a write refused for want of space and ``EIO`` for one cut short by
it; the free space on the store's disk tells a full disk from a failing one. The real
thing, a tmpfs filling up under a run on both data planes, is
tests/integration/test_faults.py::test_embedded_disk_full."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import lmdb
import pytest

from bulldozer.errors import BackendUnavailableError, ResourceExhaustedError
from bulldozer.kv import create_engine
from bulldozer.kv.backends.embedded import DISK_FULL_BELOW, NEW_STORE_NEEDS, EmbeddedEngine

EIO = lmdb.Error(f"mdb_txn_commit: {os.strerror(errno.EIO)}")  # as LMDB words a short write


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[EmbeddedEngine]:
    made = create_engine({"type": "embedded", "path": str(tmp_path / "store")})
    assert isinstance(made, EmbeddedEngine)
    yield made
    made.close()


def _free(monkeypatch: pytest.MonkeyPatch, free: int, total: int = 100 << 30) -> None:
    monkeypatch.setattr(os, "statvfs", lambda path: SimpleNamespace(f_bavail=free, f_frsize=1, f_blocks=total))


def test_a_short_write_on_a_nearly_full_disk_is_a_full_disk(
    engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _free(monkeypatch, DISK_FULL_BELOW - 1)
    said = engine._disk_full(EIO)
    assert isinstance(said, ResourceExhaustedError)
    assert str(engine.path) in str(said) and "is full" in str(said) and "MiB free" in str(said)


def test_a_short_write_with_room_to_spare_is_a_failing_disk(
    engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _free(monkeypatch, 50 << 30)
    said = engine._disk_full(EIO)
    assert isinstance(said, BackendUnavailableError) and "could not be written" in str(said)


def test_enospc_is_a_full_disk_whatever_the_free_space_says(
    engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _free(monkeypatch, 50 << 30)  # e.g. a quota, or space freed since
    assert isinstance(
        engine._disk_full(lmdb.DiskError("mdb_txn_commit: No space left on device")), ResourceExhaustedError
    )


def test_other_lmdb_errors_are_left_as_they_are(engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    _free(monkeypatch, 0)
    assert engine._disk_full(lmdb.MapFullError("mdb_put: MDB_MAP_FULL")) is None  # the map, not the disk
    assert engine._disk_full(lmdb.Error("mdb_get: Invalid argument")) is None


def test_no_store_is_created_without_room_for_its_first_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LMDB writes a new store's lock file through a map: on a full disk that is a SIGBUS,
    so the engine refuses first; an existing store opens whatever the free space."""
    existing = create_engine({"type": "embedded", "path": str(tmp_path / "old")})
    existing.close()
    _free(monkeypatch, NEW_STORE_NEEDS - 1)
    with pytest.raises(ResourceExhaustedError, match="a new store needs"):
        create_engine({"type": "embedded", "path": str(tmp_path / "new")})
    create_engine({"type": "embedded", "path": str(tmp_path / "old")}).close()
