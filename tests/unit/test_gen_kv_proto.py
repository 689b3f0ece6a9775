"""scripts/gen_kv_proto.py --check: the checked-in KV DAL code is the generator's output for
the .proto source, whichever grpcio-tools release generated it, and pyproject.toml's floors
let it import."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import gen_kv_proto


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generator's output for the .proto source, as the installed grpcio-tools writes it."""
    into = tmp_path_factory.mktemp("fresh")
    gen_kv_proto.generate(into)
    return into / "bulldozer" / "kv" / "v1"


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """A copy of the checked-in code."""
    copy = tmp_path / "out"
    shutil.copytree(gen_kv_proto.OUT, copy)
    return copy


def _newer_generator(folder: Path) -> None:
    """``folder``'s code as a later grpcio-tools, of a later protobuf, writes it."""
    grpc = folder / "kv_pb2_grpc.py"
    grpc.write_text(re.sub(r"GRPC_GENERATED_VERSION = '[^']+'", "GRPC_GENERATED_VERSION = '9.99.9'", grpc.read_text()))
    pb2 = folder / "kv_pb2.py"
    text = re.sub(r"# Protobuf Python Version: .*", "# Protobuf Python Version: 7.99.9", pb2.read_text())
    pb2.write_text(re.sub(r"(Domain\.PUBLIC,\n)\s*\d+,\n\s*\d+,\n\s*\d+,\n", r"\1    7,\n    99,\n    9,\n", text))


def test_the_checked_in_code_is_in_sync_and_importable_with_what_pyproject_allows(fresh: Path) -> None:
    assert gen_kv_proto.problems(fresh) == []


def test_a_newer_generator_s_output_differing_only_in_the_releases_it_needs_is_not_stale(
    tmp_path: Path, fresh: Path
) -> None:
    newer = tmp_path / "newer"
    shutil.copytree(fresh, newer)
    _newer_generator(newer)
    assert "9.99.9" in (newer / "kv_pb2_grpc.py").read_text()
    assert gen_kv_proto.problems(newer) == []


def test_code_differing_anywhere_else_is_stale(fresh: Path, out: Path) -> None:
    grpc = out / "kv_pb2_grpc.py"
    grpc.write_text(grpc.read_text().replace("def PutBatch(", "def PutBatches(", 1))
    assert gen_kv_proto.problems(fresh, out) == [
        "generated KV DAL code is stale: kv_pb2_grpc.py; run scripts/gen_kv_proto.py"
    ]


def test_pyproject_allowing_releases_below_what_the_code_needs_is_refused(
    tmp_path: Path, fresh: Path, out: Path
) -> None:
    pyproject = tmp_path / "pyproject.toml"
    text = (REPO / "pyproject.toml").read_text()
    pyproject.write_text(re.sub(r'"grpcio>=[^,"]+', '"grpcio>=1.66', text))
    needed = gen_kv_proto.floor("kv_pb2_grpc.py", (out / "kv_pb2_grpc.py").read_text())
    assert gen_kv_proto.problems(fresh, out, pyproject) == [
        f"pyproject.toml allows grpcio below {needed}, which the generated kv_pb2_grpc.py needs: "
        f"declare grpcio>={needed}"
    ]
    _newer_generator(out)  # regenerated with a later release and checked in, pyproject left as it was
    said = gen_kv_proto.problems(fresh, out)
    assert "declare protobuf>=7.99.9" in said[0] and "declare grpcio>=9.99.9" in said[1]
