"""The KV DAL contract: the whole API and every lifecycle rule, through the client and a
real gRPC server on a loopback port, for every engine (see kv_fixtures.CASES)."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest

from bulldozer.codec.digest import digest_pairs
from bulldozer.errors import (
    AliasConflictError,
    AliasNotFoundError,
    InvalidArgumentError,
    InvalidNameError,
    NamespaceExistsError,
    NamespaceNotFoundError,
    NamespaceStateError,
    ResourceExhaustedError,
    VerificationError,
)
from bulldozer.kv.types import State
from tests.integration.kv_fixtures import TEST_LIMITS, Harness, pairs, seal_as_loaded

pytestmark = pytest.mark.integration


# ---------------------------------------------------------------- namespaces


def test_create_describe_and_list(kv: Harness) -> None:
    alias = kv.alias()
    name = kv.version(alias)
    created = kv.client.create_namespace(
        name,
        alias,
        job_name="jobx",
        snapshot_id=42,
        value_descriptor_set=_descriptor_set(),
        labels={"run": "1"},
    )
    assert created.state == State.LOADING
    info = kv.client.describe(name)
    assert (info.name, info.alias, info.job_name, info.snapshot_id) == (name, alias, "jobx", 42)
    assert info.value_descriptor_set == _descriptor_set() and info.labels == {"run": "1"}
    assert [n.name for n in kv.client.list_namespaces(alias)] == [name]
    assert name in {n.name for n in kv.client.list_namespaces()}


def _descriptor_set(comment_bytes: int = 0) -> bytes:
    """A FileDescriptorSet with messages ``t.K`` and ``t.V`` (and a comment this long)."""
    from google.protobuf import descriptor_pb2

    file = descriptor_pb2.FileDescriptorProto(name="t.proto", package="t", syntax="proto3")
    file.message_type.add(name="K")
    file.message_type.add(name="V")
    if comment_bytes:
        file.source_code_info.location.add(leading_comments="c" * comment_bytes)
    return descriptor_pb2.FileDescriptorSet(file=[file]).SerializeToString()


def test_a_version_s_schema_is_one_its_readers_can_load(kv: Harness) -> None:
    """A version whose descriptor set did not load (bytes that do not parse, a message it
    does not hold) was created and could be flipped to; then ``get``, ``scan``, the console
    and the next run's schema check each failed on it, with a traceback."""
    alias = kv.alias()
    refused = {
        b"garbage\xff": "it does not parse as a protobuf FileDescriptorSet",
        _descriptor_set(): "it has no message 't.Missing'",
    }
    for descriptor_set, said in refused.items():
        with pytest.raises(
            InvalidArgumentError, match=re.escape(f"the version's value descriptor set cannot be read: {said}")
        ):
            kv.client.create_namespace(
                kv.version(alias),
                alias,
                value_descriptor_set=descriptor_set,
                key_message="t.K",
                value_message="t.Missing",
            )
    with pytest.raises(InvalidArgumentError, match=r"it has no message 't\.K'"):
        kv.client.create_namespace(kv.version(alias), alias, key_message="t.K")  # no descriptor set at all
    made = kv.client.create_namespace(
        kv.version(alias), alias, value_descriptor_set=_descriptor_set(), key_message="t.K", value_message="t.V"
    )
    assert [n.name for n in kv.client.list_namespaces(alias)] == [made.name]


def test_the_store_says_what_engine_it_is_and_how_it_copies_a_base(kv: Harness) -> None:
    from bulldozer.kv.types import BaseCopy

    expected = {
        "embedded": BaseCopy.LAYERED,  # a version reads through to its base
        "memory": BaseCopy.IN_STORE,
        "redis": BaseCopy.IN_STORE,  # DUMP/RESTORE of each bucket
        "cassandra": BaseCopy.RECORDS,
    }
    engine = kv.engine_name.removesuffix("-cluster")
    info = kv.client.describe_store()
    assert info is not None and (info.engine, info.base_copy) == (engine, expected[engine])


def test_create_twice_is_refused(kv: Harness) -> None:
    alias = kv.alias()
    name = kv.loaded(alias, [], seal=False)
    with pytest.raises(NamespaceExistsError):
        kv.client.create_namespace(name, alias)


@pytest.mark.parametrize("bad", ["../x", "", "a" * 200, "a'b", 'a"b', "a\x00b", "A__v1", "ünï", "a b"])
def test_invalid_namespace_names(kv: Harness, bad: str) -> None:
    with pytest.raises(InvalidNameError):
        kv.client.create_namespace(bad, "a")


def test_namespace_must_carry_its_alias(kv: Harness) -> None:
    with pytest.raises(InvalidNameError, match="must start with its alias"):
        kv.client.create_namespace("other__v20260101000000_abcdef", kv.alias())


def test_set_labels_merges_and_removes(kv: Harness) -> None:
    name = kv.loaded(kv.alias(), [], seal=False)
    kv.client.set_labels(name, {"a": "1", "b": "2"})
    assert kv.client.set_labels(name, {"a": "", "c": "3"}).labels == {"b": "2", "c": "3"}


def test_describe_unknown(kv: Harness) -> None:
    with pytest.raises(NamespaceNotFoundError):
        kv.client.describe("nope__v20260101000000_abcdef")


# --------------------------------------------------------------------- writes


def test_seal_records_count_and_digest_of_stored_pairs(kv: Harness) -> None:
    data = pairs(2500)
    name = kv.loaded(kv.alias(), [], seal=False)
    with kv.client.writer(name, batch_records=700) as writer:
        writer.add_many(data)
    assert writer.stats.records == 2500 and writer.stats.batches == 4
    sealed = seal_as_loaded(kv.client, name, data)
    expected = digest_pairs(data)
    assert (sealed.state, sealed.record_count, sealed.digest, sealed.verified) == (
        State.SEALED,
        2500,
        expected.value,
        True,
    )
    assert sealed.bytes == expected.bytes and sealed.sealed is not None


def test_writes_are_idempotent(kv: Harness) -> None:
    data = pairs(300)
    name = kv.loaded(kv.alias(), [], seal=False)
    kv.client.put(name, data)
    kv.client.put(name, data[:100])  # a retried batch
    sealed = kv.client.seal(name, expected_records=300, expected_digest=digest_pairs(data).value)
    assert sealed.record_count == 300


def test_an_overwritten_key_counts_once_with_its_last_value(kv: Harness) -> None:
    """Engines that keep a running digest must not add a replaced pair's hash twice."""
    data = pairs(200)
    name = kv.loaded(kv.alias(), [], seal=False)
    kv.client.put(name, data)
    changed = [(data[5][0], b"new value"), (b"fresh", b"x"), (b"fresh", b"y")]  # a repeat inside one batch too
    kv.client.put(name, changed)
    final = [*data[:5], (data[5][0], b"new value"), *data[6:], (b"fresh", b"y")]
    sealed = kv.client.seal(name, expected_records=201, expected_digest=digest_pairs(final).value)
    assert sealed.record_count == 201 and sealed.bytes == digest_pairs(final).bytes
    assert kv.client.get(b"fresh", namespace=name) == b"y"


def test_records_sharing_a_key_are_refused_at_seal(kv: Harness) -> None:
    """What a run leaves to the seal (``JobRun.load``): rows sharing a key, in one batch or
    in two, sealed with the count and digest of every record the load sent."""
    data = pairs(100)
    for repeated in ([data[7]], [(data[7][0], b"other value")]):
        for batches in ([data + repeated], [data, repeated]):
            name = kv.loaded(kv.alias(), [], seal=False)
            for batch in batches:
                kv.client.put(name, batch)
            sent = [pair for batch in batches for pair in batch]
            with pytest.raises(VerificationError, match="expected"):
                kv.client.seal(name, expected_records=len(sent), expected_digest=digest_pairs(sent).value)
            assert kv.client.describe(name).state == State.FAILED


def test_a_lost_batch_is_detected_at_seal(kv: Harness) -> None:
    data = pairs(300)
    name = kv.loaded(kv.alias(), [], seal=False)
    kv.client.put(name, data[:200])  # the last batch never arrives
    with pytest.raises(VerificationError, match="expected"):
        kv.client.seal(name, expected_records=300, expected_digest=digest_pairs(data).value)
    failed = kv.client.describe(name)
    assert failed.state == State.FAILED and "verification failed" in failed.failure_reason


def test_an_altered_value_is_detected_by_the_digest(kv: Harness) -> None:
    data = pairs(50)
    name = kv.loaded(kv.alias(), [], seal=False)
    kv.client.put(name, [*data[:-1], (data[-1][0], b"tampered")])
    with pytest.raises(VerificationError, match="digest"):
        kv.client.seal(name, expected_records=50, expected_digest=digest_pairs(data).value)


def test_columnar_and_record_batches_store_the_same(kv: Harness) -> None:
    import pyarrow as pa

    data = pairs(1000)
    a = kv.loaded(kv.alias(), [], seal=False)
    with kv.client.writer(a, batch_records=128, batch_bytes=4096) as writer:
        writer.add_arrays(
            pa.array([k for k, _ in data], pa.binary()),
            pa.array([v for _, v in data], pa.large_binary()),
        )
    b = kv.loaded(kv.alias(), data)
    assert seal_as_loaded(kv.client, a, data).digest == kv.client.describe(b).digest


def test_put_stream(kv: Harness) -> None:
    data = pairs(1000)
    name = kv.loaded(kv.alias(), [], seal=False)
    stats = kv.client.put_stream(name, [data[i : i + 250] for i in range(0, 1000, 250)])
    assert (stats.batches, stats.records) == (4, 1000)
    assert seal_as_loaded(kv.client, name, data).record_count == 1000


def test_client_disconnect_mid_stream_leaves_the_namespace_loading(kv: Harness) -> None:
    data = pairs(400)
    name = kv.loaded(kv.alias(), [], seal=False)

    def batches() -> Any:
        yield data[:200]
        raise RuntimeError("the client died")

    with pytest.raises(Exception):  # noqa: B017 - whatever the transport raises
        kv.client.put_stream(name, batches())
    info = kv.client.describe(name)
    assert info.state == State.LOADING
    kv.client.put(name, data)  # a resumed run re-sends (puts are idempotent)
    assert kv.client.seal(name, expected_records=400, expected_digest=digest_pairs(data).value).record_count == 400


def test_ingest_merges_staged_writes_newest_batch_winning(kv: Harness) -> None:
    """Batches in no key order, a key repeated across batches and inside one, writes after
    an ingest (into data that is no longer empty, overwriting an ingested key): what is
    sealed is the last value of every key, scanned in key order. An engine that stages
    writes (embedded) merges them here; for the others ingest has nothing to do."""
    import random

    data = pairs(3000)
    shuffled = data[:]
    random.Random(7).shuffle(shuffled)
    name = kv.loaded(kv.alias(), [], seal=False)
    for i in range(0, 3000, 400):
        kv.client.put(name, shuffled[i : i + 400])
    # "x" > "second": a store that settled a repeat by the greater value would keep the wrong one
    kv.client.put(name, [(data[10][0], b"second"), (data[11][0], b"x"), (data[11][0], b"second")])
    runs, records = kv.client.ingest(name)
    staged = kv.engine_name.startswith("embedded")
    assert (runs, records) == ((9, 3002) if staged else (0, 0))  # a key repeated in a batch is staged once
    assert kv.client.ingest(name) == (0, 0)  # nothing left: a retried ingest changes nothing
    assert kv.client.describe(name).state == State.LOADING  # still loading: more writes may come
    kv.client.put(name, [(data[12][0], b"third"), (b"k999999", b"last")])
    final = dict(data)
    final.update({data[10][0]: b"second", data[11][0]: b"second", data[12][0]: b"third", b"k999999": b"last"})
    expected = digest_pairs(sorted(final.items()))
    sealed = kv.client.seal(name, expected.count, expected.value)  # the seal ingests what is left
    assert (sealed.state, sealed.record_count, sealed.digest) == (State.SEALED, 3001, expected.value)
    scanned = list(kv.client.scan(namespace=name, page_size=500))
    assert sorted(scanned) == sorted(final.items())
    if kv.engine.key_ordered_scan:
        assert scanned == sorted(final.items())


def test_ingest_only_while_a_version_has_writes_to_ingest(kv: Harness) -> None:
    alias = kv.alias()
    sealed = kv.loaded(alias, pairs(5))
    assert kv.client.ingest(sealed) == (0, 0)  # a retry after the seal
    failed = kv.loaded(alias, pairs(5), seal=False)
    kv.client.mark_failed(failed, "test")
    with pytest.raises(NamespaceStateError, match="FAILED"):
        kv.client.ingest(failed)
    with pytest.raises(NamespaceNotFoundError):
        kv.client.ingest("nope__v20260101000000_abcdef")
    dropped = kv.loaded(alias, pairs(5), seal=False)
    kv.client.drop(dropped)  # its staged writes go with it
    with pytest.raises((NamespaceNotFoundError, NamespaceStateError)):
        kv.client.ingest(dropped)


@pytest.mark.parametrize("state", ["SEALED", "FAILED", "DROPPED"])
def test_writes_only_while_loading(kv: Harness, state: str) -> None:
    name = kv.loaded(kv.alias(), pairs(3), seal=state != "FAILED")
    if state == "FAILED":
        kv.client.mark_failed(name, "test")
    if state == "DROPPED":
        kv.client.drop(name)
    error = NamespaceNotFoundError if state == "DROPPED" else NamespaceStateError
    with pytest.raises(error):
        kv.client.put(name, pairs(1))


def test_a_retried_seal_returns_the_seal_and_any_other_is_refused(kv: Harness) -> None:
    alias, data = kv.alias(), pairs(3)
    name = kv.loaded(alias, data)
    expected = digest_pairs(data)
    assert kv.client.seal(name, expected.count, expected.value).state == State.SEALED  # a retry: same answer
    with pytest.raises(VerificationError, match="already SEALED with 3 records"):
        kv.client.seal(name, 4, expected.value)
    kv.client.compare_and_set_alias(alias, None, name)
    with pytest.raises(NamespaceStateError, match="only a LOADING namespace"):
        kv.client.seal(name, expected.count, expected.value)


def test_a_seal_needs_the_expected_count_and_digest(kv: Harness) -> None:
    from bulldozer.kv.v1 import kv_pb2

    name = kv.loaded(kv.alias(), pairs(3), seal=False)
    with pytest.raises(InvalidArgumentError, match="needs the expected record count and digest"):
        kv.client._ns("SealNamespace", kv_pb2.SealNamespaceRequest(name=name, expected_records=3))
    assert kv.client.describe(name).state == State.LOADING


def test_empty_key_is_refused(kv: Harness) -> None:
    name = kv.loaded(kv.alias(), [], seal=False)
    with pytest.raises(InvalidArgumentError, match="empty key"):
        kv.client.put(name, [(b"", b"v")])


def test_key_and_value_limits(kv: Harness) -> None:
    """The limits the store says (``DescribeStore``: a writer refuses a larger record
    itself, naming its row) are the ones its puts enforce."""
    name = kv.loaded(kv.alias(), [], seal=False)
    max_key = min(4096, kv.engine.max_key_bytes)
    info = kv.client.describe_store()
    assert info is not None and (info.max_key_bytes, info.max_value_bytes) == (max_key, 256 * 1024)
    with pytest.raises(ResourceExhaustedError, match="key of"):
        kv.client.put(name, [(b"k" * (max_key + 1), b"v")])
    with pytest.raises(ResourceExhaustedError, match="value of"):
        kv.client.put(name, [(b"k", b"v" * (256 * 1024 + 1))])
    kv.client.put(name, [(b"k" * max_key, b"v" * (256 * 1024))])  # exactly at the limits


def test_malformed_columnar_batch(kv: Harness) -> None:
    from bulldozer.kv.v1 import kv_pb2

    name = kv.loaded(kv.alias(), [], seal=False)
    bad = kv_pb2.PutBatchRequest(
        namespace=name,
        columnar=kv_pb2.ColumnarRecords(keys=b"abc", key_lengths=[5], values=b"x", value_lengths=[1]),
    )
    with pytest.raises(InvalidArgumentError, match="lengths do not add up"):
        kv.client._t.call(kv.client._t.data, "PutBatch", bad, 10)


# ---------------------------------------------------------------------- reads


def test_reads_refused_while_loading(kv: Harness) -> None:
    name = kv.loaded(kv.alias(), pairs(3), seal=False)
    with pytest.raises(NamespaceStateError, match="LOADING"):
        kv.client.batch_get([b"k000001"], namespace=name)


def test_get_batch_get_and_scan(kv: Harness) -> None:
    alias = kv.alias()
    name = kv.loaded(alias, pairs(2500))
    kv.client.compare_and_set_alias(alias, None, name)
    assert kv.client.get(b"k000007", alias=alias) == b"v7"
    assert kv.client.get(b"missing", namespace=name) is None
    served, values = kv.client.batch_get([b"k000001", b"zzz", b"k002499"], alias=alias)
    assert served == name and values == [b"v1", None, b"v2499"]
    scanned = list(kv.client.scan(alias=alias, page_size=300))
    assert sorted(scanned) == sorted(pairs(2500)) and len(set(scanned)) == 2500
    if kv.engine.key_ordered_scan:
        assert scanned == sorted(pairs(2500))
    assert list(kv.client.scan(alias=alias, page_size=700)) == scanned  # one stable order, whatever the page size
    assert len(list(kv.client.scan(namespace=name, limit=10))) == 10


def test_pipelined_batch_gets_answer_in_order(kv: Harness) -> None:
    alias = kv.alias()
    name = kv.loaded(alias, pairs(300))
    kv.client.compare_and_set_alias(alias, None, name)
    lists = [[b"k%06d" % i, b"k%06d" % (299 - i), b"absent"] for i in range(0, 300, 7)]
    results = list(kv.client.batch_get_many(lists, alias=alias, in_flight=4))
    assert [served for served, _ in results] == [name] * len(lists)
    assert [values for _, values in results] == [[b"v%d" % i, b"v%d" % (299 - i), None] for i in range(0, 300, 7)]
    with pytest.raises(AliasNotFoundError):
        list(kv.client.batch_get_many([[b"k000001"]], alias=kv.alias()))


def test_scan_is_resumable_with_a_page_token(kv: Harness) -> None:
    alias = kv.alias()
    name = kv.loaded(alias, pairs(1000))
    kv.client.compare_and_set_alias(alias, None, name)
    pages = kv.client.scan_pages(alias=alias, page_size=400)
    first = next(pages)
    assert len(first.records) == 400 and first.next_page_token
    pages.close()
    # a new version goes live; the resumed scan stays on the version it started on
    newer = kv.loaded(alias, pairs(10, value=b"new"))
    kv.client.compare_and_set_alias(alias, name, newer)
    rest = [
        r
        for page in kv.client.scan_pages(alias=alias, page_size=400, page_token=first.next_page_token)
        for r in page.records
    ]
    assert len(rest) == 600 and {
        p.namespace for p in kv.client.scan_pages(alias=alias, page_size=400, page_token=first.next_page_token)
    } == {name}
    keys = [r.key for r in first.records] + [r.key for r in rest]
    assert sorted(keys) == [k for k, _ in pairs(1000)]  # every key once: nothing skipped or repeated
    if kv.engine.key_ordered_scan:
        assert keys == [k for k, _ in pairs(1000)]


def test_a_columnar_scan_sends_the_same_pages(kv: Harness) -> None:
    """Asked for columnar pages (a reader of a whole version), a scan sends the same pages —
    their version, records in the same order, tokens — each page's records laid out
    column-wise and none as messages."""

    def unpacked(c: Any) -> list[tuple[bytes, bytes]]:
        keys, values, at, vat = [], [], 0, 0
        for kn, vn in zip(c.key_lengths, c.value_lengths, strict=True):
            keys.append(c.keys[at : at + kn])
            values.append(c.values[vat : vat + vn])
            at, vat = at + kn, vat + vn
        assert (at, vat) == (len(c.keys), len(c.values))
        return list(zip(keys, values, strict=True))

    alias = kv.alias()
    name = kv.loaded(alias, [*pairs(2500), (b"empty-value", b"")])
    kv.client.compare_and_set_alias(alias, None, name)
    for kwargs in ({"page_size": 300}, {"page_size": 1000, "limit": 1234}, {"namespace": name, "page_size": 5000}):
        target = {} if "namespace" in kwargs else {"alias": alias}
        by_record = list(kv.client.scan_pages(**target, **kwargs))  # type: ignore[arg-type]
        by_column = list(kv.client.scan_pages(**target, **kwargs, columnar=True))  # type: ignore[arg-type]
        assert [(p.namespace, p.next_page_token) for p in by_column] == [
            (p.namespace, p.next_page_token) for p in by_record
        ]
        for rows, columns in zip(by_record, by_column, strict=True):
            assert not columns.records and columns.HasField("columnar")
            assert unpacked(columns.columnar) == [(r.key, r.value) for r in rows.records]
    assert sum(len(p.columnar.key_lengths) for p in kv.client.scan_pages(alias=alias, columnar=True)) == 2501


def test_malformed_page_token(kv: Harness) -> None:
    alias = kv.alias()
    name = kv.loaded(alias, pairs(5))
    with pytest.raises(InvalidArgumentError, match="page token"):
        list(kv.client.scan_pages(namespace=name, page_token=b"garbage-without-separator"))


def test_pinned_reads(kv: Harness) -> None:
    alias = kv.alias()
    v1 = kv.loaded(alias, pairs(5, value=b"one"))
    v2 = kv.loaded(alias, pairs(5, value=b"two"))
    kv.client.compare_and_set_alias(alias, None, v1)
    kv.client.compare_and_set_alias(alias, v1, v2)
    assert kv.client.get(b"k000001", alias=alias) == b"two1"
    assert kv.client.get(b"k000001", alias=f"{alias}@{v1}") == b"one1"
    with pytest.raises(NamespaceNotFoundError, match="has no version"):
        kv.client.get(b"k000001", alias=f"{alias}@{alias}__v20000101000000_000000")


def test_a_version_by_its_short_id(kv: Harness) -> None:
    from bulldozer.names import short_version

    alias = kv.alias()
    v1 = kv.loaded(alias, pairs(5, value=b"one"))
    v2 = kv.loaded(alias, pairs(5, value=b"two"))
    kv.client.compare_and_set_alias(alias, None, v2)
    assert kv.client.get(b"k000001", alias=f"{alias}@{short_version(v1)}") == b"one1"
    assert kv.client.batch_get([b"k000002"], alias=f"{alias}@{short_version(v1)}") == (v1, [b"one2"])
    assert kv.client.describe_target(f"{alias}@{short_version(v2)}").name == v2
    with pytest.raises(NamespaceNotFoundError, match="has no version"):
        kv.client.get(b"k000001", alias=f"{alias}@ffffff")


def test_a_read_names_its_schema_generation(kv: Harness) -> None:
    from bulldozer.errors import SchemaMismatchError

    alias = kv.alias()
    v1 = kv.loaded(alias, pairs(5, value=b"one"))
    v2 = kv.loaded(alias, pairs(5, value=b"two"), generation=2)  # a deliberate breaking change
    kv.client.compare_and_set_alias(alias, None, v1)
    kv.client.compare_and_set_alias(alias, v1, v2)
    assert kv.client.describe(v1).schema_generation == 1 and kv.client.describe(v2).schema_generation == 2
    with pytest.raises(SchemaMismatchError, match=r"schema generation 2 .* built for generation 1"):
        kv.client.get(b"k000001", alias=alias, schema_generation=1)
    with pytest.raises(SchemaMismatchError):
        kv.client.batch_get([b"k000001"], alias=alias, schema_generation=1)
    assert kv.client.get(b"k000001", alias=alias, schema_generation=2) == b"two1"
    assert kv.client.get(b"k000001", alias=alias) == b"two1"  # a reader that names no generation
    # a reader of the old generation may still read the old version, pinned
    assert kv.client.batch_get([b"k000001"], alias=f"{alias}@{v1}", schema_generation=1) == (v1, [b"one1"])


def test_unknown_alias(kv: Harness) -> None:
    with pytest.raises(AliasNotFoundError):
        kv.client.get(b"k", alias=kv.alias())
    with pytest.raises(AliasNotFoundError):
        kv.client.get_alias(kv.alias())


def test_read_must_name_a_target(kv: Harness) -> None:
    with pytest.raises(InvalidArgumentError, match="name a namespace or an alias"):
        kv.client.get(b"k")


# -------------------------------------------------------------------- aliases


def test_flip_lifecycle_and_history(kv: Harness) -> None:
    alias = kv.alias()
    v1 = kv.loaded(alias, pairs(3))
    v2 = kv.loaded(alias, pairs(3, value=b"x"))
    first = kv.client.compare_and_set_alias(alias, None, v1, reason="first load")
    assert (first.namespace, first.generation) == (v1, 1)
    assert kv.client.describe(v1).state == State.ACTIVE
    second = kv.client.compare_and_set_alias(alias, v1, v2, reason="daily")
    assert second.generation == 2
    assert kv.client.describe(v1).state == State.RETIRED and kv.client.describe(v2).state == State.ACTIVE
    back = kv.client.compare_and_set_alias(alias, v2, v1, reason="rollback")  # RETIRED may come back
    assert back.namespace == v1 and kv.client.describe(v2).state == State.RETIRED
    history = kv.client.alias_history(alias)
    assert [(h.from_namespace, h.to_namespace, h.reason) for h in history] == [
        (v2, v1, "rollback"),
        (v1, v2, "daily"),
        ("", v1, "first load"),
    ]
    assert all("tester" in h.principal for h in history)
    assert alias in {a.alias for a in kv.client.list_aliases()}


def test_retried_flip_is_a_no_op(kv: Harness) -> None:
    alias = kv.alias()
    v1 = kv.loaded(alias, pairs(3))
    v2 = kv.loaded(alias, pairs(3))
    kv.client.compare_and_set_alias(alias, None, v1)
    kv.client.compare_and_set_alias(alias, v1, v2)
    again = kv.client.compare_and_set_alias(alias, v1, v2)  # the reply was lost; retry
    assert again.namespace == v2 and again.generation == 2
    assert len(kv.client.alias_history(alias)) == 2


def test_the_previous_version_is_the_one_retired_last_whatever_the_clock_says(
    kv: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollback's default target and retention's newest retired versions were chosen by
    the time a version was retired, read from the clock of the DAL that flipped. A clock
    stepped back between two flips (NTP correcting a VM's clock, a restored snapshot, or
    two DAL hosts whose clocks disagree) made ``rollback`` go back two versions, to older
    data than the one live before, and retention drop the version live before. The flips'
    order is the alias's generation, which no clock moves."""
    from datetime import timedelta

    from bulldozer.kv.backends import _lifecycle
    from bulldozer.kv.types import utcnow
    from bulldozer.versioning.retention import plan_retention
    from bulldozer.versioning.rollback import previous_version

    alias = kv.alias()
    v1, v2, v3 = (kv.loaded(alias, pairs(2, value=bytes([i]))) for i in range(3))
    early = utcnow()
    monkeypatch.setattr(_lifecycle, "utcnow", lambda: early + timedelta(hours=2))  # a clock ahead...
    kv.client.compare_and_set_alias(alias, None, v1)
    kv.client.compare_and_set_alias(alias, v1, v2)  # v1 retired "two hours from now"
    monkeypatch.setattr(_lifecycle, "utcnow", lambda: early)  # ...set right
    kv.client.compare_and_set_alias(alias, v2, v3)  # v2 retired now, by that clock before v1
    assert previous_version(kv.client, alias, v3).name == v2
    records = kv.client.list_namespaces(alias)
    plan = plan_retention(records, 1, timedelta(0), now=early + timedelta(hours=3))
    assert (sorted(plan.keep), plan.drop) == (sorted([v2, v3]), [v1])
    kv.client.compare_and_set_alias(alias, v3, v2, reason="rollback")  # and back: v3 is the previous now
    assert previous_version(kv.client, alias, v2).name == v3


def test_compare_and_set_with_a_stale_expectation(kv: Harness) -> None:
    alias = kv.alias()
    v1, v2, v3 = (kv.loaded(alias, pairs(2)) for _ in range(3))
    kv.client.compare_and_set_alias(alias, None, v1)
    kv.client.compare_and_set_alias(alias, v1, v2)
    with pytest.raises(AliasConflictError, match=f"points at {v2}"):
        kv.client.compare_and_set_alias(alias, v1, v3)
    with pytest.raises(AliasConflictError):
        kv.client.compare_and_set_alias(alias, None, v3)
    assert kv.client.get_alias(alias).namespace == v2


@pytest.mark.parametrize("state", ["LOADING", "FAILED", "DROPPED"])
def test_alias_only_points_at_sealed_versions(kv: Harness, state: str) -> None:
    alias = kv.alias()
    name = kv.loaded(alias, pairs(2), seal=state == "DROPPED")
    if state == "FAILED":
        kv.client.mark_failed(name, "bad data")
    if state == "DROPPED":
        kv.client.drop(name)
    error = NamespaceNotFoundError if state == "DROPPED" else NamespaceStateError
    with pytest.raises(error):
        kv.client.compare_and_set_alias(alias, None, name)
    with pytest.raises(AliasNotFoundError):
        kv.client.get_alias(alias)


def _as_a_crash_leaves_it(kv: Harness, name: str, state: State, **changes: Any) -> None:
    """Store ``name``'s record in ``state`` straight through the engine: what the store holds
    after a DAL was killed there (SEALING: after the freeze, before the measurement)."""
    record = kv.engine.get_namespace(name)
    assert record is not None
    kv.engine.transition(name, frozenset({record.state}), record.with_state(state, **changes))


def test_an_interrupted_seal_is_neither_readable_nor_a_target_and_sealing_again_finishes_it(kv: Harness) -> None:
    alias, data = kv.alias(), pairs(500)
    name = kv.loaded(alias, data, seal=False)
    _as_a_crash_leaves_it(kv, name, State.SEALING)
    info = kv.client.describe(name)
    assert (info.state, info.verified, info.record_count) == (State.SEALING, False, 0)
    with pytest.raises(NamespaceStateError, match="SEALING"):
        kv.client.compare_and_set_alias(alias, None, name)
    with pytest.raises(NamespaceStateError):
        kv.client.put(name, pairs(1, prefix=b"late"))
    with pytest.raises(NamespaceStateError):
        kv.client.batch_get([b"k000001"], namespace=name)
    with pytest.raises(NamespaceStateError):
        kv.client.get(b"k000001", alias=f"{alias}@{name}")
    with pytest.raises(AliasNotFoundError):
        kv.client.get_alias(alias)
    sealed = seal_as_loaded(kv.client, name, data)  # what a resumed run does
    assert (sealed.state, sealed.verified, sealed.record_count) == (State.SEALED, True, 500)
    assert kv.client.compare_and_set_alias(alias, None, name).namespace == name
    assert kv.client.get(b"k000001", alias=alias) == b"v1"


def test_an_interrupted_seal_that_does_not_match_fails_the_version(kv: Harness) -> None:
    alias, data = kv.alias(), pairs(50)
    name = kv.loaded(alias, data, seal=False)
    _as_a_crash_leaves_it(kv, name, State.SEALING)
    with pytest.raises(VerificationError, match="50 records stored, 51 expected"):
        kv.client.seal(name, 51, digest_pairs(data).value)
    assert kv.client.describe(name).state == State.FAILED
    with pytest.raises(NamespaceStateError):
        kv.client.compare_and_set_alias(alias, None, name)


@pytest.mark.parametrize("state", [State.SEALED, State.RETIRED])
def test_a_version_without_a_recorded_verification_is_never_a_target(kv: Harness, state: State) -> None:
    """A SEALED or RETIRED record with no verification (as an unmeasured seal of an older
    DAL left it: count 0, digest 0) is refused by every compare-and-set, on every engine."""
    alias = kv.alias()
    live = kv.loaded(alias, pairs(5))
    kv.client.compare_and_set_alias(alias, None, live)
    name = kv.loaded(alias, pairs(5, value=b"w"), seal=False)
    _as_a_crash_leaves_it(kv, name, state, verified=False)
    with pytest.raises(NamespaceStateError, match="no recorded verification"):
        kv.client.compare_and_set_alias(alias, live, name, reason="rollback by hand")
    kv.client.set_pin(alias, True, "hold")
    with pytest.raises(NamespaceStateError, match="no recorded verification"):
        kv.client.compare_and_set_alias(alias, live, name, reason="operator, pinned alias")
    assert kv.client.get_alias(alias).namespace == live


def test_alias_cannot_point_at_another_alias_version(kv: Harness) -> None:
    other = kv.loaded(kv.alias(), pairs(2))
    with pytest.raises(NamespaceStateError, match="belongs to alias"):
        kv.client.compare_and_set_alias(kv.alias(), None, other)


def test_concurrent_flips_have_exactly_one_winner(kv: Harness) -> None:
    alias = kv.alias()
    v0 = kv.loaded(alias, pairs(2))
    kv.client.compare_and_set_alias(alias, None, v0)
    candidates = [kv.loaded(alias, pairs(2)) for _ in range(6)]
    outcomes: dict[str, str] = {}
    barrier = threading.Barrier(len(candidates))

    def flip(name: str) -> None:
        barrier.wait()
        try:
            kv.client.compare_and_set_alias(alias, v0, name)
            outcomes[name] = "won"
        except AliasConflictError:
            outcomes[name] = "lost"

    threads = [threading.Thread(target=flip, args=(n,)) for n in candidates]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [n for n, o in outcomes.items() if o == "won"]
    assert len(winners) == 1 and len(outcomes) == 6
    assert kv.client.get_alias(alias).namespace == winners[0]
    assert len(kv.client.alias_history(alias)) == 2


def test_exactly_one_active_version(kv: Harness) -> None:
    alias = kv.alias()
    versions = [kv.loaded(alias, pairs(2)) for _ in range(4)]
    expected = None
    for v in versions:
        kv.client.compare_and_set_alias(alias, expected, v)
        expected = v
    states = [n.state for n in kv.client.list_namespaces(alias)]
    assert states.count(State.ACTIVE) == 1 and states.count(State.RETIRED) == 3


# ---------------------------------------------------------------------- drops


def test_drop_active_is_refused_and_retired_can_be_dropped(kv: Harness) -> None:
    alias = kv.alias()
    v1 = kv.loaded(alias, pairs(10))
    v2 = kv.loaded(alias, pairs(10))
    kv.client.compare_and_set_alias(alias, None, v1)
    with pytest.raises(NamespaceStateError, match="ACTIVE"):
        kv.client.drop(v1)
    kv.client.compare_and_set_alias(alias, v1, v2)
    dropped = kv.client.drop(v1)
    assert dropped.state == State.DROPPED
    assert kv.client.drop(v1).state == State.DROPPED  # idempotent
    with pytest.raises(NamespaceNotFoundError):
        kv.client.get(b"k000001", namespace=v1)
    with pytest.raises(NamespaceNotFoundError):
        kv.client.get(b"k000001", alias=f"{alias}@{v1}")
    assert kv.client.get(b"k000001", alias=alias) == b"v1"  # the live version is untouched


def test_dropping_one_version_leaves_the_others(kv: Harness) -> None:
    alias = kv.alias()
    keep = kv.loaded(alias, pairs(100))
    gone = kv.loaded(alias, pairs(100))
    kv.client.drop(gone)
    assert len(list(kv.client.scan(namespace=keep))) == 100


def test_loading_and_failed_versions_can_be_dropped(kv: Harness) -> None:
    alias = kv.alias()
    loading = kv.loaded(alias, pairs(10), seal=False)
    failed = kv.loaded(alias, pairs(10), seal=False)
    kv.client.mark_failed(failed, "boom")
    assert kv.client.drop(loading).state == State.DROPPED
    assert kv.client.drop(failed).state == State.DROPPED


def test_mark_failed_keeps_the_reason_and_refuses_active(kv: Harness) -> None:
    alias = kv.alias()
    name = kv.loaded(alias, pairs(2), seal=False)
    assert kv.client.mark_failed(name, "quality gate: too few rows").failure_reason == "quality gate: too few rows"
    live = kv.loaded(alias, pairs(2))
    kv.client.compare_and_set_alias(alias, None, live)
    with pytest.raises(NamespaceStateError):
        kv.client.mark_failed(live, "no")


def test_pin_holds_runs_off_but_not_operators(kv: Harness) -> None:
    from bulldozer.errors import AliasPinnedError

    alias = kv.alias()
    v1, v2, v3 = (kv.loaded(alias, pairs(2)) for _ in range(3))
    with pytest.raises(AliasNotFoundError):
        kv.client.set_pin(alias, True, "nothing to pin yet")
    kv.client.compare_and_set_alias(alias, None, v1)
    pinned = kv.client.set_pin(alias, True, "incident 42")
    assert pinned.pinned and pinned.namespace == v1
    assert kv.client.set_pin(alias, True, "again").generation == pinned.generation  # no-op
    with pytest.raises(AliasPinnedError, match="pinned"):
        kv.client.compare_and_set_alias(alias, v1, v2, respect_pin=True)
    moved = kv.client.compare_and_set_alias(alias, v1, v3, reason="operator")  # an operator may still move it
    assert moved.namespace == v3 and moved.pinned  # and the pin stays
    assert not kv.client.set_pin(alias, False).pinned
    kv.client.compare_and_set_alias(alias, v3, v2, respect_pin=True)
    reasons = [h.reason for h in kv.client.alias_history(alias)]
    assert reasons[1:4] == ["unpinned", "operator", "pinned: incident 42"]


# ------------------------------------------------------------------- metadata bounds


def test_stored_metadata_is_bounded(kv: Harness) -> None:
    alias = kv.alias()
    limits = TEST_LIMITS.max_message_bytes // 4  # the DAL clamps both bounds to a quarter of a message
    with pytest.raises(ResourceExhaustedError, match="descriptor set"):
        kv.client.create_namespace(kv.version(alias), alias, value_descriptor_set=b"x" * (limits + 1))
    with pytest.raises(ResourceExhaustedError, match="labels would hold"):
        kv.client.create_namespace(kv.version(alias), alias, labels={"a": "x" * limits})
    with pytest.raises(InvalidArgumentError, match="at most 64 labels"):
        kv.client.create_namespace(kv.version(alias), alias, labels={f"l{i}": "v" for i in range(65)})
    with pytest.raises(InvalidArgumentError, match="not a protobuf message name"):
        kv.client.create_namespace(kv.version(alias), alias, key_message="a b" * 10)
    name = kv.loaded(alias, [], seal=False)
    kv.client.set_labels(name, {"a": "x" * (limits // 2)})
    with pytest.raises(ResourceExhaustedError, match="labels would hold"):
        kv.client.set_labels(name, {"b": "x" * (limits // 2 + 100)})  # bounded together, not one by one
    assert [n.name for n in kv.client.list_namespaces(alias)] == [name]


def test_listing_is_paged_and_survives_the_largest_records(kv: Harness) -> None:
    """A principal with write on one alias fills namespaces with the largest metadata the
    DAL accepts; listing (what `namespaces` and `gc` use) still works for everyone, page by
    page, and dropping shrinks the records to what history needs."""
    from bulldozer.kv.v1 import kv_pb2

    alias = kv.alias()
    big = TEST_LIMITS.max_message_bytes // 4 - 64
    names = []
    for _ in range(6):  # 6 x (1 MiB of labels + 1 MiB of descriptor): three times a message
        name = kv.version(alias)
        kv.client.create_namespace(
            name, alias, value_descriptor_set=_descriptor_set(big - 64), labels={"junk": "x" * big}
        )
        names.append(name)
    assert [n.name for n in kv.client.list_namespaces(alias)] == names
    pages, token = [], ""
    while True:
        response = kv.client._t.call(
            kv.client._t.namespaces,
            "ListNamespaces",
            kv_pb2.ListNamespacesRequest(alias=alias, page_token=token),
            30,
        )
        assert response.ByteSize() <= TEST_LIMITS.max_message_bytes
        pages.append([i.name for i in response.namespaces])
        token = response.next_page_token
        if not token:
            break
    assert len(pages) > 1 and [n for page in pages for n in page] == names
    small = [kv.loaded(alias, [], seal=False) for _ in range(5)]
    paged = kv.client.list_namespaces(alias, page_size=2)
    assert [n.name for n in paged] == names + small
    for name in names:
        dropped = kv.client.drop(name)
        assert dropped.value_descriptor_set == b"" and dropped.labels == {}
    assert [n.state for n in kv.client.list_namespaces(alias)][: len(names)] == [State.DROPPED] * len(names)


def test_namespaces_are_listed_by_state(kv: Harness) -> None:
    """A listing may name the states it wants: the store's history of dropped versions is
    then neither read nor sent (retention and rollback list only what the store holds)."""
    from bulldozer.kv import convert
    from bulldozer.kv.types import HELD
    from bulldozer.kv.v1 import kv_pb2

    alias = kv.alias()
    first, second, third = (kv.loaded(alias, pairs(2)) for _ in range(3))
    kv.client.compare_and_set_alias(alias, None, first)
    kv.client.compare_and_set_alias(alias, first, second)  # first RETIRED, second ACTIVE
    kv.client.drop(first)
    loading = kv.loaded(alias, pairs(1), seal=False)
    failed = kv.loaded(alias, pairs(1), seal=False)
    kv.client.mark_failed(failed, "test")
    dropped = [kv.loaded(alias, [], seal=False) for _ in range(3)]
    for name in dropped:
        kv.client.drop(name)
    states = {n.name: n.state for n in kv.client.list_namespaces(alias)}
    assert states == {
        first: State.DROPPED,
        second: State.ACTIVE,
        third: State.SEALED,
        loading: State.LOADING,
        failed: State.FAILED,
        **{name: State.DROPPED for name in dropped},
    }
    in_order = [n.name for n in kv.client.list_namespaces(alias)]
    for wanted in ([State.ACTIVE], [State.DROPPED], [State.SEALED, State.FAILED], [State.RETIRED], HELD):
        listed = kv.client.list_namespaces(alias, states=wanted)
        assert [n.name for n in listed] == [name for name in in_order if states[name] in set(wanted)], wanted
        assert all(n == kv.client.describe(n.name) for n in listed)  # whole records, not just names
        paged = kv.client.list_namespaces(alias, page_size=1, states=wanted)
        assert [n.name for n in paged] == [n.name for n in listed]
        request = kv_pb2.ListNamespacesRequest(alias=alias, states=convert.state_numbers(wanted))
        answered = kv.client._t.call(kv.client._t.namespaces, "ListNamespaces", request, 30)
        assert [i.name for i in answered.namespaces] == [n.name for n in listed]  # chosen by the DAL, not the client
    assert second in {n.name for n in kv.client.list_namespaces(states=[State.ACTIVE])}  # any alias
    for bad in ([kv_pb2.NAMESPACE_STATE_UNSPECIFIED], [99]):
        with pytest.raises(InvalidArgumentError, match="state"):
            kv.client._t.call(
                kv.client._t.namespaces, "ListNamespaces", kv_pb2.ListNamespacesRequest(alias=alias, states=bad), 30
            )


def test_a_forged_page_token_is_refused(kv: Harness) -> None:
    from bulldozer.kv.v1 import kv_pb2

    with pytest.raises(InvalidArgumentError, match="page token"):
        kv.client._t.call(
            kv.client._t.namespaces, "ListNamespaces", kv_pb2.ListNamespacesRequest(page_token="nonsense"), 30
        )


# --------------------------------------------------------------------- sample


def test_sample_is_chosen_by_key_and_seed_alone(kv: Harness) -> None:
    from bulldozer.codec.digest import xxh64

    alias = kv.alias()
    old = kv.loaded(alias, pairs(3000))
    # another version: a third of the keys gone, new keys, some values changed
    changed = [(k, b"changed" if i % 10 == 0 else v) for i, (k, v) in enumerate(pairs(3000)) if i % 3]
    new = kv.loaded(alias, changed + [(b"extra-%05d" % i, b"x") for i in range(500)])
    name, sample, scanned = kv.client.sample(100, seed=7, namespace=old)
    assert name == old and scanned == 3000 and len(sample) == 100
    everything = dict(pairs(3000))
    assert all(everything[k] == v for k, v in sample)  # stored pairs, whole
    hashes = sorted((xxh64(k, 7), k) for k in everything)
    assert [k for k, _ in sample] == [k for _, k in hashes[:100]]  # the 100 smallest XXH64(key, seed), in order
    assert kv.client.sample(100, seed=7, namespace=old)[1] == sample  # repeatable
    assert kv.client.sample(100, seed=8, namespace=old)[1] != sample  # the seed chooses
    # coordinated: a key both versions hold is in both samples, when small enough for both
    _, other, scanned_new = kv.client.sample(100, seed=7, namespace=new)
    assert scanned_new == 2000 + 500
    bound = min(xxh64(sample[-1][0], 7), xxh64(other[-1][0], 7))
    both = set(dict(changed)) & set(everything)
    small = {k for k in both if xxh64(k, 7) <= bound}
    assert small and small <= {k for k, _ in sample} & {k for k, _ in other}
    # a whole version smaller than the sample is returned in full
    assert len(kv.client.sample(5000, seed=1, namespace=new)[1]) == 2500


def test_sample_refuses_bad_counts_and_unreadable_versions(kv: Harness) -> None:
    alias = kv.alias()
    loading = kv.loaded(alias, pairs(5), seal=False)
    with pytest.raises(NamespaceStateError, match="LOADING"):
        kv.client.sample(10, namespace=loading)
    sealed = kv.loaded(alias, pairs(5))
    for bad in (0, TEST_LIMITS.max_batch_get_keys + 1):
        with pytest.raises(InvalidArgumentError, match="a sample holds"):
            kv.client.sample(bad, namespace=sealed)
    kv.client.compare_and_set_alias(alias, None, sealed)
    assert kv.client.sample(3, alias=alias)[0] == sealed


# ---------------------------------------------------------- a version from a base


def test_a_version_built_from_a_base_takes_puts_and_deletes(kv: Harness) -> None:
    alias = kv.alias()
    base_pairs = pairs(1000)
    base = kv.loaded(alias, base_pairs)
    name = kv.version(alias)
    created = kv.client.create_namespace(name, alias, base=base)
    assert created.state == State.LOADING and created.base == base == kv.client.describe(name).base
    expected = dict(base_pairs)
    gone = [k for k, _ in base_pairs[::10]]  # 100 keys deleted
    assert kv.client.delete(name, [*gone, b"not-there"]) == 100
    assert kv.client.delete(name, gone) == 0  # idempotent
    for key in gone:
        del expected[key]
    changed = [(k, b"changed") for k, _ in base_pairs[1::20]]
    added = [(b"new-%04d" % i, b"n") for i in range(30)]
    # a changed key is deleted first, so the put lands on an absent key (running digests stay
    # exact); in several requests on the wire at once, as a delta's loader sends them
    assert kv.client.delete(name, [k for k, _ in changed], chunk=7, in_flight=3) == len(changed)
    kv.client.put(name, changed + added)
    expected.update(changed + added)
    kv.client.ingest(name)
    if kv.engine.name in ("embedded", "redis"):  # they keep a running digest: still exact, the seal need not scan
        assert kv.engine.stored_digest(name) == digest_pairs(sorted(expected.items()))
    sealed = seal_as_loaded(kv.client, name, sorted(expected.items()))
    assert sealed.verified and sealed.record_count == len(expected)
    assert dict(kv.client.scan(namespace=name)) == expected
    asked = [k for k, _ in base_pairs] + [k for k, _ in added] + [b"never"]
    _, values = kv.client.batch_get(asked, namespace=name)  # point reads too (the Go plane's own, natively)
    assert dict(zip(asked, values, strict=True)) == {k: expected.get(k) for k in asked}
    assert dict(kv.client.scan(namespace=base)) == dict(base_pairs)  # the base is untouched


def test_a_delete_after_puts_deletes_them(kv: Harness) -> None:
    alias = kv.alias()
    name = kv.loaded(alias, pairs(50), seal=False)
    assert kv.client.delete(name, [k for k, _ in pairs(50)[:20]]) == 20  # also writes still staged
    seal_as_loaded(kv.client, name, pairs(50)[20:])
    assert dict(kv.client.scan(namespace=name)) == dict(pairs(50)[20:])


def test_deletes_and_bases_are_refused_where_they_would_break_a_version(kv: Harness) -> None:
    alias = kv.alias()
    sealed = kv.loaded(alias, pairs(5))
    with pytest.raises(NamespaceStateError, match="SEALED"):
        kv.client.delete(sealed, [pairs(5)[0][0]])
    assert kv.client.get(pairs(5)[0][0], namespace=sealed) == pairs(5)[0][1]
    loading = kv.loaded(alias, pairs(5), seal=False)
    with pytest.raises(NamespaceStateError, match="LOADING and not verified"):
        kv.client.create_namespace(kv.version(alias), alias, base=loading)
    with pytest.raises(NamespaceNotFoundError):
        kv.client.create_namespace(kv.version(alias), alias, base=f"{alias}__v20200101000000_abcdef")
    other = kv.alias()
    with pytest.raises(InvalidArgumentError, match="is a version of"):
        kv.client.create_namespace(kv.version(other), other, base=sealed)
    with pytest.raises(InvalidArgumentError, match="empty key"):
        kv.client.delete(loading, [b""])
