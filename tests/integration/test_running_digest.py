"""The running digest of the engines that keep one (embedded, Redis standalone and cluster):
the seal reads it instead of scanning the version back, and falls back to the scan whenever
the running sum could be wrong."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bulldozer.codec.digest import digest_pairs
from bulldozer.kv import KvDal
from bulldozer.kv.types import NamespaceRecord
from bulldozer.names import new_version_name
from tests.integration.kv_fixtures import ENGINE_FACTORIES

pytestmark = pytest.mark.integration


def _columnar(dal: KvDal, name: str, pairs: list[tuple[bytes, bytes]]) -> None:
    keys, values = [k for k, _ in pairs], [v for _, v in pairs]
    dal.put_columnar(name, b"".join(keys), [len(k) for k in keys], b"".join(values), [len(v) for v in values])


class _Scans:
    """Counts full scans of the engine (the seal's fallback)."""

    def __init__(self, dal: KvDal, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        iterate = dal.engine.iterate

        def counted(name: str, chunk: int = 50_000) -> Iterator[list[tuple[bytes, bytes]]]:
            self.count += 1
            return iterate(name, chunk)

        monkeypatch.setattr(dal.engine, "iterate", counted)


@pytest.fixture(params=["embedded", "redis", "redis-cluster"])
def dal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KvDal]:
    engine = ENGINE_FACTORIES[request.param](tmp_path)
    yield KvDal(engine)
    engine.close()


def _forget_running_digest(dal: KvDal, name: str) -> None:
    """What a version loaded before the engine kept running digests looks like."""
    engine: Any = dal.engine
    if engine.name == "embedded":
        with engine.env.begin(write=True) as txn:
            txn.delete(name.encode(), db=engine._digests)
    else:
        engine.r.delete(engine._k_digest(name))


def _new(dal: KvDal) -> str:
    name = new_version_name("acct")
    dal.engine.create_namespace(NamespaceRecord(name=name, alias="acct"))
    return name


DATA = [(b"k%05d" % i, b"value %d" % i) for i in range(5000)]


def test_clean_loads_seal_from_the_running_digest(dal: KvDal, monkeypatch: pytest.MonkeyPatch) -> None:
    name = _new(dal)
    for start in range(0, len(DATA), 1500):
        _columnar(dal, name, DATA[start : start + 1500])
    dal.put(name, [(b"z-record-path", b"v")])  # the record (non-columnar) path counts too
    expected = digest_pairs([*DATA, (b"z-record-path", b"v")])
    dal.ingest(name)  # (embedded: staged runs are only measured once ingested)
    assert dal.engine.stored_digest(name) == expected
    scans = _Scans(dal, monkeypatch)
    sealed = dal.seal(name, expected_records=expected.count, expected_digest=expected.value)
    assert scans.count == 0
    assert (sealed.record_count, sealed.digest, sealed.bytes) == (expected.count, expected.value, expected.bytes)


def test_a_retried_batch_makes_the_seal_scan(dal: KvDal, monkeypatch: pytest.MonkeyPatch) -> None:
    name = _new(dal)
    _columnar(dal, name, DATA)
    _columnar(dal, name, DATA[:10])  # retried: every key already there
    dal.ingest(name)  # where the repeat is found
    assert dal.engine.stored_digest(name) is None
    scans = _Scans(dal, monkeypatch)
    expected = digest_pairs(DATA)
    sealed = dal.seal(name, expected_records=len(DATA), expected_digest=expected.value)
    assert scans.count == 1 and sealed.digest == expected.value


def test_a_lost_batch_still_fails_the_seal_without_a_scan(dal: KvDal, monkeypatch: pytest.MonkeyPatch) -> None:
    from bulldozer.errors import VerificationError

    name = _new(dal)
    _columnar(dal, name, DATA[:4000])
    scans = _Scans(dal, monkeypatch)
    with pytest.raises(VerificationError, match="4000 records stored, 5000 expected"):
        dal.seal(name, expected_records=len(DATA), expected_digest=digest_pairs(DATA).value)
    assert scans.count == 0


def test_a_version_without_a_running_digest_is_scanned(dal: KvDal, monkeypatch: pytest.MonkeyPatch) -> None:
    """Versions loaded before the engine kept running digests have no record of one."""
    name = _new(dal)
    _columnar(dal, name, DATA)
    engine = dal.engine
    _forget_running_digest(dal, name)
    assert engine.stored_digest(name) is None
    scans = _Scans(dal, monkeypatch)
    expected = digest_pairs(DATA)
    assert dal.seal(name, len(DATA), expected.value).digest == expected.value and scans.count == 1
