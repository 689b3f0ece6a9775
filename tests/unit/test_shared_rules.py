"""The rules the Go data plane, the Rust kernels and Python share have one written source,
proto/bulldozer/kv/v1/shared.yaml: the generated constants of all three languages must
match it, and the Python code must take its values from them."""

from __future__ import annotations

import struct
import subprocess
import sys

from bulldozer.codec import digest
from bulldozer.errors import error_class_by_name
from bulldozer.kv.backends import embedded
from bulldozer.kv.convert import ERROR_DOMAIN
from bulldozer.kv.server.rules import Limits
from bulldozer.kv.types import READABLE, WRITABLE
from bulldozer.kv.v1 import shared
from bulldozer.names import ALIAS_PATTERN, NAMESPACE_PATTERN
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import gen_shared


def test_every_generated_file_matches_the_source() -> None:
    assert gen_shared.stale() == [], "run scripts/gen_shared.py"


def test_a_changed_source_makes_every_language_stale(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The check fails when the source and a language drift apart (here: a limit changed)."""
    rules = gen_shared.load()
    rules["limits"]["max_batch_records"] += 1
    assert sorted(p.suffix for p in gen_shared.stale(rules)) == [".go", ".py", ".rs"]
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_shared.py"), "--check"], capture_output=True)
    assert proc.returncode == 0, proc.stderr


def test_a_value_no_language_writes_the_same_way_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """JSON's \\u escapes are not Rust literals: a control character in a rule is refused."""
    import pytest

    source = tmp_path / "shared.yaml"
    source.write_text('store:\n  tombstone: "\\x01"\n')
    with pytest.raises(SystemExit, match="printable ASCII"):
        gen_shared.load(source)
    source.write_text('redis:\n  script: "return 1\\nreturn 2"\n')
    assert gen_shared.load(source)["redis"]["script"] == "return 1\nreturn 2"  # newlines are fine


def test_python_takes_the_shared_values() -> None:
    assert (ALIAS_PATTERN, NAMESPACE_PATTERN) == (shared.NAMES_ALIAS_PATTERN, shared.NAMES_NAMESPACE_PATTERN)
    assert {s.value for s in READABLE} == set(shared.STATES_READABLE)
    assert WRITABLE.value == shared.STATES_WRITABLE
    limits = Limits()
    assert (limits.max_key_bytes, limits.max_value_bytes, limits.max_batch_records) == (
        shared.LIMITS_MAX_KEY_BYTES,
        shared.LIMITS_MAX_VALUE_BYTES,
        shared.LIMITS_MAX_BATCH_RECORDS,
    )
    assert embedded.EmbeddedEngine.max_key_bytes == shared.LIMITS_EMBEDDED_MAX_KEY_BYTES
    assert shared.STORE_META_STATES.encode() == embedded._META_STATES
    assert embedded._DIGEST.size == struct.calcsize(shared.STORE_DIGEST_RECORD) == 25
    assert digest._VALUE_SEED == shared.DIGEST_VALUE_SEED
    assert limits.max_writes_in_flight == shared.LIMITS_MAX_WRITES_IN_FLIGHT
    # the Go plane names the busy refusal's class itself: one of the tree, of its status code
    busy = error_class_by_name(shared.ERRORS_BUSY)
    assert busy is not None and busy.grpc_code == "RESOURCE_EXHAUSTED" and busy.retryable
    assert ERROR_DOMAIN == shared.ERRORS_DOMAIN
    # the calls admission counts are the API's write calls
    from bulldozer.kv.v1 import kv_pb2

    data = kv_pb2.DESCRIPTOR.services_by_name["KvData"]
    writes = {f"/{data.full_name}/{m.name}" for m in data.methods if m.input_type.name == "PutBatchRequest"}
    assert (
        set(shared.LIMITS_WRITE_METHODS)
        == writes
        == {
            "/bulldozer.kv.v1.KvData/PutBatch",
            "/bulldozer.kv.v1.KvData/PutStream",
        }
    )


def test_the_go_plane_is_built_from_the_current_rules() -> None:
    """bulldozer-kvd's flag defaults come from the generated Go constants: a binary built
    from stale rules shows other defaults."""
    kvd = REPO / "native" / "bin" / "bulldozer-kvd"
    proc = subprocess.run([str(kvd), "-help"], capture_output=True, text=True)
    usage = proc.stderr
    for flag, value in (
        ("max-key-bytes", shared.LIMITS_EMBEDDED_MAX_KEY_BYTES),
        ("max-value-bytes", shared.LIMITS_MAX_VALUE_BYTES),
        ("max-batch-records", shared.LIMITS_MAX_BATCH_RECORDS),
        ("max-batch-get-keys", shared.LIMITS_MAX_BATCH_GET_KEYS),
        ("max-message-bytes", shared.LIMITS_MAX_MESSAGE_BYTES),
        ("max-writes-in-flight", shared.LIMITS_MAX_WRITES_IN_FLIGHT),
    ):
        assert f"-{flag} int" in usage and f"(default {value})" in usage.split(f"-{flag} int", 1)[1].split("\n  -")[0]
