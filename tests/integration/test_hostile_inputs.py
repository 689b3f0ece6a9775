"""The bad-input corpus of the KV DAL: hostile identifiers on every engine, malformed RPCs,
and fuzzing of the request validation and of the spec loader. Each case must give a clear
error of the exception tree, and nothing may be written where it should not be."""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import random
import string
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bulldozer.errors import BulldozerError, InvalidArgumentError, KvError, SpecError
from bulldozer.kv import KvClient, KvDal
from bulldozer.kv.v1 import kv_pb2
from bulldozer.names import ALIAS_PATTERN, new_version_name
from bulldozer.spec import load_spec_text
from tests.integration.kv_fixtures import ENGINE_FACTORIES, Harness

pytestmark = pytest.mark.integration

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "move_data_to_kv_dal.yaml"

#: (what it is, the hostile value)
HOSTILE = [
    ("path traversal", "../../etc/passwd"),
    ("absolute path", "/tmp/x"),
    ("CQL injection", "a; DROP KEYSPACE bulldozer"),
    ("CQL quote", "a' OR '1'='1"),
    ("Lua / Redis injection", "a') redis.call('FLUSHALL') --"),
    ("Redis hash tag", "a{meta}"),
    ("glob pattern", "a*"),
    ("NUL byte", "a\x00b"),
    ("newline", "abc\n"),
    ("Cyrillic look-alike", "аlias"),
    ("full-width letters", "ａｌｉａｓ"),
    ("upper case", "Alias"),
    ("leading digit", "1alias"),
    ("empty", ""),
    ("300 characters", "a" * 300),
    ("space", "my alias"),
]


@pytest.mark.parametrize("engine_name", ["memory", "embedded", "redis", "cassandra"])
def test_hostile_identifiers_are_refused_and_nothing_is_written(engine_name: str, tmp_path: Path) -> None:
    harness = Harness(engine_name, "grpc", tmp_path)
    client = harness.client
    try:
        ok_alias = harness.alias()
        before = [n.name for n in client.list_namespaces()]
        accepted = []
        for what, bad in HOSTILE:
            version = f"{bad}__v20260101000000_abcdef"
            attempts = {
                "create (name, alias)": lambda v=version, b=bad: client.create_namespace(v, b),
                "create (good name, alias)": lambda b=bad: client.create_namespace(new_version_name(ok_alias), b),
                "create (name, good alias)": lambda v=version: client.create_namespace(v, ok_alias),
                "put": lambda v=version: client.put(v, [(b"k", b"v")]),
                "seal": lambda v=version: client.seal(v, 1, 0),
                "drop": lambda v=version: client.drop(v),
                "get by alias": lambda b=bad: client.get(b"k", alias=b),
                "batch get by namespace": lambda v=version: client.batch_get([b"k"], namespace=v),
                "flip": lambda v=version, b=bad: client.compare_and_set_alias(b, None, v),
                "alias": lambda b=bad: client.get_alias(b),
                "history": lambda b=bad: client.alias_history(b),
            }
            if bad:  # an empty alias filter lists every namespace, by design
                attempts["list"] = lambda b=bad: client.list_namespaces(b)
            for call, attempt in attempts.items():
                try:
                    attempt()
                    accepted.append((what, call))
                except InvalidArgumentError:
                    pass
        assert accepted == []
        assert [n.name for n in client.list_namespaces()] == before, "a hostile name was written"
        assert not any(a.alias not in {x.alias for x in client.list_aliases()} for a in client.list_aliases())
    finally:
        harness.close()


def test_malformed_rpcs_are_refused_and_the_server_carries_on(tmp_path: Path) -> None:
    harness = Harness("embedded", "grpc", tmp_path)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{harness.port}")
        for method in (
            "/bulldozer.kv.v1.KvData/BatchGet",
            "/bulldozer.kv.v1.KvData/PutBatch",
            "/bulldozer.kv.v1.KvNamespaces/CreateNamespace",
            "/bulldozer.kv.v1.KvAliases/CompareAndSetAlias",
        ):
            call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            for garbage in (b"\xff\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x12" * 64):
                with pytest.raises(grpc.RpcError) as err:
                    call(garbage, timeout=5)
                assert err.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
        unknown = channel.unary_unary("/bulldozer.kv.v1.KvData/NoSuchMethod")
        with pytest.raises(grpc.RpcError) as err:
            unknown(b"", timeout=5)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        channel.close()
        alias = harness.alias()
        name = harness.loaded(alias, [(b"k", b"v")])
        harness.client.compare_and_set_alias(alias, None, name)
        assert harness.client.get(b"k", alias=alias) == b"v"  # still serving
    finally:
        harness.close()


@pytest.mark.parametrize("transport", ["grpc", "native"])
def test_a_client_stream_of_undecodable_messages_is_refused_and_the_server_still_stops(
    transport: str, tmp_path: Path
) -> None:
    """PutStream messages that do not decode as PutBatchRequest: gRPC Python's server,
    decoding them itself, answered INTERNAL and then could not stop (after two such calls,
    grpcio 1.85: ``server.stop``'s wait never ended; ``bulldozer serve`` waited its grace
    period and 15 s more and exited 1). The Python plane decodes them itself, with the same
    code both planes' gRPC give an undecodable unary request; either plane then serves on
    and stops at once."""
    harness = Harness("embedded", transport, tmp_path)
    stopped = threading.Event()
    try:
        loading = harness.version(harness.alias())
        harness.client.create_namespace(loading, loading.split("__")[0])
        good = kv_pb2.PutBatchRequest(namespace=loading, records=[kv_pb2.KeyValue(key=b"a", value=b"b")])
        garbage = b"\xff\xff\xff garbage"
        with grpc.insecure_channel(f"127.0.0.1:{harness.port}") as channel:
            stream = channel.stream_unary(
                "/bulldozer.kv.v1.KvData/PutStream", request_serializer=None, response_deserializer=None
            )
            for messages in ([garbage], [garbage] * 2, [good.SerializeToString(), garbage]) * 3:
                with pytest.raises(grpc.RpcError) as err:
                    stream(iter(messages), timeout=5)
                assert err.value.code() == grpc.StatusCode.INTERNAL, err.value.details()
                if transport == "grpc":  # bulldozer-kvd's gRPC (Go) words it its own way
                    at = messages.index(garbage) + 1
                    assert (
                        err.value.details() == f"PutStream: message {at} of the stream does not decode as its request"
                    )
        alias = harness.alias()
        name = harness.loaded(alias, [(b"k", b"v")])
        harness.client.compare_and_set_alias(alias, None, name)
        assert harness.client.get(b"k", alias=alias) == b"v"  # still serving
    finally:
        harness.client.close()
        assert harness.server is not None

        def stop() -> None:
            harness.server.stop(1)
            stopped.set()

        threading.Thread(target=stop, daemon=True).start()
        assert stopped.wait(15), "the server did not stop"


@pytest.mark.parametrize("transport", ["grpc", "native"])
def test_an_error_quoting_a_long_input_still_reaches_the_client(transport: str, tmp_path: Path) -> None:
    """A status travels in the trailers, which gRPC bounds at 16 KiB: an error that quoted a
    client's long input (a 3,000-entry list of states, a 100,000-character name) reached the
    client as RESOURCE_EXHAUSTED "received metadata size exceeds hard limit", or through the
    native plane as INTERNAL "RST_STREAM", instead of the error. Now the states are named
    once each (and any message is bounded: the test below)."""
    from bulldozer.errors import InvalidNameError

    harness = Harness("embedded", transport, tmp_path)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{harness.port}") as channel:
            listing = channel.unary_unary(
                "/bulldozer.kv.v1.KvNamespaces/ListNamespaces",
                request_serializer=kv_pb2.ListNamespacesRequest.SerializeToString,
                response_deserializer=kv_pb2.ListNamespacesResponse.FromString,
            )
            with pytest.raises(grpc.RpcError) as err:
                listing(kv_pb2.ListNamespacesRequest(states=[99] * 3_000, alias="a"), timeout=5)  # type: ignore[list-item]
            said = (err.value.code(), err.value.details())
            assert said == (grpc.StatusCode.INVALID_ARGUMENT, "unknown namespace state 99")
        for name in ("x" * 100_000, "é" * 50_000):  # a name is quoted shortened
            with pytest.raises(InvalidNameError) as refused:
                harness.client.describe(name)
            assert f"namespace '{name[:36]}... must match" in str(refused.value)
        assert harness.client.list_namespaces() == []  # still serving
    finally:
        harness.close()


def test_a_status_message_is_bounded() -> None:
    """Any error's message, whatever it quotes, travels cut to ``MAX_MESSAGE_BYTES`` of UTF-8
    (on a character's boundary), saying how much was left out."""
    from bulldozer.kv.server.interceptors import MAX_MESSAGE_BYTES, bounded, error_status

    assert bounded("short") == "short"
    exact = "x" * MAX_MESSAGE_BYTES
    assert bounded(exact) == exact
    assert bounded("x" * 100_000) == "x" * MAX_MESSAGE_BYTES + f"… ({100_000 - MAX_MESSAGE_BYTES:,} bytes more)"
    cut = bounded("é" * 50_000)  # two bytes each: the cut falls between two
    assert cut == "é" * (MAX_MESSAGE_BYTES // 2) + f"… ({100_000 - MAX_MESSAGE_BYTES:,} bytes more)"
    odd = bounded("a" + "é" * 50_000)  # the cut would split a character: it is left out whole
    assert odd == "a" + "é" * (MAX_MESSAGE_BYTES // 2 - 1) + f"… ({100_001 - MAX_MESSAGE_BYTES + 1:,} bytes more)"
    status = error_status(KvError("€" * 100_000))
    trailers = sum(len(k) + len(v) for k, v in status.trailing_metadata)
    assert status.details.endswith("bytes more)") and trailers + len(status.details.encode()) * 3 < 16 * 1024


names = st.text(alphabet=string.ascii_letters + string.digits + "_-./;'\"{}*\x00 \nаé", max_size=80)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(alias=names, suffix=names)
def test_fuzzed_names_are_valid_or_refused_cleanly(alias: str, suffix: str) -> None:
    """Every name either follows the identifier pattern and is accepted, or is refused with
    InvalidArgumentError — never another exception, never an accepted odd name."""
    import re

    dal = KvDal(ENGINE_FACTORIES["memory"](Path(".")))
    name = f"{alias}__{suffix}"
    try:
        record = dal.create_namespace(name, alias)
    except InvalidArgumentError:
        assert not (re.fullmatch(ALIAS_PATTERN[1:-1], alias) and re.fullmatch(r"[a-z][a-z0-9_]{0,127}", name))
        return
    assert re.fullmatch(ALIAS_PATTERN[1:-1], record.alias) and record.name == name
    with contextlib.suppress(KvError):
        dal.resolve(alias=alias + "@" + suffix)


SPEC_FRAGMENTS = st.lists(
    st.sampled_from(
        [
            "kind: MoveDataToKvDal\n",
            "apiVersion: bulldozer/v1\n",
            "metadata: {name: x, owner: y}\n",
            "metadata:\n  name: ../../x\n",
            "data_movement: {source: {table: a.b}, key_columns: [k]}\n",
            "key_value_dal: {alias: 'a; DROP TABLE x'}\n",
            "&a [*a, *a]\n",
            "x: !!python/object/apply:os.system ['true']\n",
            "\x00\n",
            "- - - -\n",
            "{{{{\n",
            "metadata: {name: 2.5}\n",
            "  bad indent: [\n",
            "<<: {a: 1}\n",
        ]
    ),
    max_size=6,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(text=st.one_of(SPEC_FRAGMENTS, st.text(max_size=300)))
def test_fuzzed_specs_fail_only_with_spec_errors(text: str) -> None:
    try:
        load_spec_text(text, "fuzz.yaml", env={})
    except SpecError as exc:
        assert exc.issues and all(str(i).startswith("fuzz.yaml") for i in exc.issues)
    except BulldozerError as exc:  # pragma: no cover - a different family would be a bug
        pytest.fail(f"{type(exc).__name__}: {exc}")


#: Values a mutated spec field takes: every type YAML gives, edge numbers, durations, names
#: of real and unknown columns and tables, paths, URLs, SQL, a cron, time zones.
MUTANT_VALUES = [
    None, 0, -1, 1, 2**63, -(2**63), 2**64, 1e308, float("nan"), float("inf"), -0.0, 0.5, True, False,
    "", " ", "x", "a" * 5000, "\x00", "é", "${HOME}", "$${x}", "../../etc/passwd", "/etc/passwd",
    "file:///etc/passwd", "http://169.254.169.254/", "user_id", "score", "updated_at", "payload", "profile",
    "attributes", "recent_orders", "counters", "nope", "1s", "0s", "-5m", "99999999d", "@daily",
    "* * * * *", "Mars/Base", [], [None], ["user_id"], ["user_id", "user_id"], {}, {"a": 1},
    {"policy": "keep_latest", "order_by": "updated_at"}, {"policy": "keep_latest"},
    {"policy": "keep_latest", "order_by": "nope"}, "SELECT * FROM sample.user_item_scores", "score > 0.5",
    "score >", "1=1; DROP TABLE x", "full", "delta", "auto", {"type": "rest", "uri": "http://127.0.0.1:1"},
    {"type": "sql", "uri": "sqlite:////tmp/x.db"}, "sample.user_item_scores", "sample.nope", "a.b.c", ".",
]  # fmt: skip
#: Keys a mutation adds: the spec's optional fields, unknown ones, a dunder.
MUTANT_KEYS = [
    "mode", "filter", "query", "snapshot_id", "ref", "properties", "timeout", "endpoint", "token",
    "shadow_read", "max_changed_fraction", "records_per_second", "sample", "seed", "examples", "unknown",
    "name", "type", "table", "order_by", "policy", "engine", "__class__",
]  # fmt: skip


def _mutated(doc: Any, rnd: random.Random) -> Any:
    """``doc`` with one to three fields replaced, removed or added."""

    def places(node: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
        yield at
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in children:
            yield from places(child, (*at, key))

    for _ in range(rnd.randint(1, 3)):
        at = rnd.choice(list(places(doc))[1:])
        parent = functools.reduce(lambda node, key: node[key], at[:-1], doc)
        how = rnd.random()
        if how < 0.6:
            parent[at[-1]] = copy.deepcopy(rnd.choice(MUTANT_VALUES))
        elif how < 0.75 and isinstance(parent, dict):
            del parent[at[-1]]
        else:
            target = parent[at[-1]] if isinstance(parent[at[-1]], dict) else parent
            if isinstance(target, dict):
                target[rnd.choice(MUTANT_KEYS)] = copy.deepcopy(rnd.choice(MUTANT_VALUES))
    return doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32))  # the mutations' seed (a failure names it)
def test_the_template_with_fields_mutated_is_valid_or_refused_in_lines_naming_the_file(
    seed: int, sample_home: Path
) -> None:
    """The packaged template, one to three of its fields replaced by a value of another type,
    removed, or joined by a field: loading it and checking it against its catalog (``bulldozer
    validate --catalog``) says what is wrong, each issue one line naming the file, or raises an
    error of the tree; never another exception (fragments of text above reach the loader, this
    reaches the checks behind it: the columns, the filter, the query, the types, the catalog)."""
    import yaml

    from bulldozer.spec.checks import spec_issues

    doc = _mutated(yaml.safe_load(TEMPLATE.read_text()), random.Random(seed))
    text = yaml.safe_dump(doc, allow_unicode=True)
    try:
        issues = spec_issues(load_spec_text(text, "mutant.yaml", env={}), True, str(sample_home))
    except SpecError as exc:
        issues = exc.issues
    except BulldozerError as exc:
        assert str(exc) and "\n" not in str(exc), str(exc)
        return
    assert all(str(i).startswith("mutant.yaml") and "\n" not in str(i) for i in issues), issues


def test_a_hostile_client_principal_is_recorded_verbatim_not_interpreted(tmp_path: Path) -> None:
    harness = Harness("embedded", "grpc", tmp_path)
    try:
        alias = harness.alias()
        name = harness.loaded(alias, [(b"k", b"v")])
        with KvClient(f"127.0.0.1:{harness.port}", principal="x'); DROP TABLE aliases; --") as client:
            client.compare_and_set_alias(alias, None, name, reason="../../etc/passwd\x1b[31m")
            (change,) = client.alias_history(alias)
        assert change.principal == "x'); DROP TABLE aliases; -- (unauthenticated)"  # asserted, so marked
        assert change.reason == "../../etc/passwd\x1b[31m"
        # shown by the command line, the reason does not drive the operator's terminal: its
        # escape is printed, in every listing format, and a JSON document keeps it exactly
        endpoint = f"127.0.0.1:{harness.port}"
        for fmt in ("table", "wide", "tsv"):
            shown = _cli(["alias", "history", alias, "--endpoint", endpoint, "-o", fmt], COLUMNS="300")
            assert shown.returncode == 0, shown.stderr
            assert "\x1b" not in shown.stdout and "../../etc/passwd\\x1b[31m" in shown.stdout, (fmt, shown.stdout)
        as_json = _cli(["alias", "history", alias, "--endpoint", endpoint, "--json"])
        assert json.loads(as_json.stdout)[0]["reason"] == change.reason
        # nor does a reason quoted by an error: one line, escaped
        # nor does an endpoint quoted by an error, which is refused at once, not after a 15 s wait
        for bad in ("127.0.0.1:x\x1b]0;owned\x07", "localhost:99999"):
            started = time.monotonic()
            refused = _cli(["namespaces", "--endpoint", bad])
            said = refused.stderr.splitlines()
            assert refused.returncode == 1 and len(said) == 1 and "is not a DAL endpoint" in said[0], refused.stderr
            assert "\x1b" not in refused.stderr and "\x07" not in refused.stderr
            assert time.monotonic() - started < 10
    finally:
        harness.close()


def _cli(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bulldozer.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
