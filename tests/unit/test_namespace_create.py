"""A version whose creation fails part way (KvDal.create_namespace): an engine that stores
the record before the version's storage — Cassandra, whose table is a schema change a node
with a full disk cannot flush — leaves a FAILED version saying why, and a client's retry
of that same create (gRPC retries a create answered UNAVAILABLE) is told that reason, not
that the name is taken."""

from __future__ import annotations

import pytest

from bulldozer.errors import BackendUnavailableError, NamespaceExistsError, NamespaceStateError
from bulldozer.kv.backends.memory import MemoryEngine
from bulldozer.kv.server.rules import KvDal
from bulldozer.kv.types import NamespaceRecord, State

REASON = "no Cassandra node at 127.0.0.1:9042 answers"


class StorageFails(MemoryEngine):
    """Stores the record, then fails to make the version's storage."""

    def create_namespace(self, record: NamespaceRecord) -> None:
        super().create_namespace(record)
        raise BackendUnavailableError(REASON)


def create(dal: KvDal, name: str = "a__v1", run: str = "run-1") -> NamespaceRecord:
    return dal.create_namespace(name, "a", job_name="a", labels={"bulldozer.run": run}, snapshot_id=7)


def test_a_create_whose_storage_fails_leaves_the_version_failed_saying_why() -> None:
    dal = KvDal(StorageFails())
    with pytest.raises(BackendUnavailableError, match=REASON):
        create(dal)
    record = dal.describe("a__v1")
    assert record.state == State.FAILED
    assert record.failure_reason == f"making its storage failed: {REASON}"


def test_the_same_create_again_is_told_why_the_first_failed() -> None:
    dal = KvDal(StorageFails())
    with pytest.raises(BackendUnavailableError):
        create(dal)
    with pytest.raises(NamespaceStateError) as again:
        create(dal)
    assert str(again.value) == f"namespace 'a__v1' could not be created: making its storage failed: {REASON}"
    with pytest.raises(NamespaceExistsError):  # another request for the name: taken, as before
        create(dal, run="run-2")


def test_a_name_taken_by_a_live_version_is_refused_as_before() -> None:
    dal = KvDal(MemoryEngine())
    create(dal)
    with pytest.raises(NamespaceExistsError):
        create(dal)
