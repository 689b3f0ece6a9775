"""A run's job schema compiled without Python modules is kept in the user's cache and read
from there the next time (``bulldozer.schema.compile``): the same bytes protoc makes, never
a torn file or another user's, never across a change of protoc, protobuf or the compiler."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bulldozer.errors import SchemaError
from bulldozer.schema import compile as compile_module
from bulldozer.schema.compile import compile_proto

TEXT = 'syntax = "proto3";\npackage cached.v1;\n// a field\nmessage V {\n  int64 a = 1;\n  string b = 2;\n}\n'
NAME = "cached/v1.proto"


@pytest.fixture
def protoc_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """A cache of this test's own; the protoc runs the test makes."""
    monkeypatch.setenv("BULLDOZER_CACHE", str(tmp_path / "cache"))
    runs: list[list[str]] = []
    real = compile_module._run_protoc

    def counted(args: list[str]) -> tuple[int, str]:
        runs.append(args)
        return real(args)

    monkeypatch.setattr(compile_module, "_run_protoc", counted)
    return runs


def _kept(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "descriptors").glob("*.binpb"))


def test_a_schema_compiled_once_is_read_from_the_cache(protoc_runs: list[list[str]], tmp_path: Path) -> None:
    first = compile_proto(TEXT, NAME, python=False)
    again = compile_proto(TEXT, NAME, python=False)
    assert len(protoc_runs) == 1
    assert again.descriptor_set == first.descriptor_set and again.files == first.files == {NAME: TEXT.encode()}
    (kept,) = _kept(tmp_path)
    assert kept.read_bytes() == first.descriptor_set
    assert oct(os.stat(kept.parent).st_mode & 0o777) == "0o700"
    other = compile_proto(TEXT.replace("string b", "bytes b"), NAME, python=False)
    assert len(protoc_runs) == 2 and other.descriptor_set != first.descriptor_set


def test_python_modules_are_always_compiled(protoc_runs: list[list[str]], tmp_path: Path) -> None:
    compile_proto(TEXT, NAME, python=False)
    with_modules = compile_proto(TEXT, NAME)
    assert len(protoc_runs) == 2 and any(name.endswith("_pb2.py") for name in with_modules.files)


@pytest.mark.parametrize("damage", ["torn", "garbage", "another schema", "others may write", "another user's"])
def test_a_cache_entry_not_to_be_trusted_is_compiled_again(
    protoc_runs: list[list[str]], tmp_path: Path, damage: str
) -> None:
    first = compile_proto(TEXT, NAME, python=False)
    (kept,) = _kept(tmp_path)
    if damage == "torn":
        kept.write_bytes(first.descriptor_set[: len(first.descriptor_set) // 2])
    elif damage == "garbage":
        kept.write_bytes(b"\xff" * 40)
    elif damage == "another schema":
        kept.write_bytes(compile_proto(TEXT, "elsewhere.proto", python=False).descriptor_set)
    elif damage == "others may write":
        kept.chmod(0o666)
    else:
        if os.getuid() != 0:
            pytest.skip("giving a file to another user takes root")
        os.chown(kept, 12345, 12345)
    runs = len(protoc_runs)
    again = compile_proto(TEXT, NAME, python=False)
    assert len(protoc_runs) == runs + 1
    assert again.descriptor_set == first.descriptor_set


def test_another_protoc_or_compiler_does_not_read_the_old_entries(
    protoc_runs: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    compile_proto(TEXT, NAME, python=False)
    monkeypatch.setattr(compile_module, "compiler_identity", lambda: b"another protoc")
    compile_proto(TEXT, NAME, python=False)
    assert len(protoc_runs) == 2


def test_a_refused_schema_is_not_kept(protoc_runs: list[list[str]], tmp_path: Path) -> None:
    for _ in range(2):
        with pytest.raises(SchemaError, match="protoc refused"):
            compile_proto("syntax = 'proto3';\nmessage {\n", NAME, python=False)
    assert len(protoc_runs) == 2 and not _kept(tmp_path)


def test_an_unwritable_cache_is_no_error(protoc_runs: list[list[str]], tmp_path: Path) -> None:
    (tmp_path / "cache").write_text("a file where the cache folder would be")
    for _ in range(2):
        assert compile_proto(TEXT, NAME, python=False).descriptor_set
    assert len(protoc_runs) == 2


def _named(index: int) -> str:
    return TEXT.replace("message V", f"message V{index}")


def test_the_cache_keeps_the_most_recently_used_sets(
    protoc_runs: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compile_module, "KEPT_DESCRIPTORS", 3)
    paths: dict[int, Path] = {}
    for index in range(3):
        before = set(_kept(tmp_path))
        compile_proto(_named(index), NAME, python=False)
        (paths[index],) = set(_kept(tmp_path)) - before
        os.utime(paths[index], (1_000_000 + index, 1_000_000 + index))  # compiled long ago, 0 first
    runs = len(protoc_runs)
    compile_proto(_named(0), NAME, python=False)  # read from the cache: 0 is used now, 1 the least lately
    assert len(protoc_runs) == runs
    compile_proto(_named(3), NAME, python=False)  # a fourth set: one of the three goes
    assert len(protoc_runs) == runs + 1
    assert set(_kept(tmp_path)) - set(paths.values()) and len(_kept(tmp_path)) == 3
    assert not paths[1].exists() and paths[0].exists() and paths[2].exists()


def test_a_killed_writers_half_written_file_is_removed(protoc_runs: list[list[str]], tmp_path: Path) -> None:
    folder = tmp_path / "cache" / "descriptors"
    folder.mkdir(parents=True, mode=0o700)
    stale, fresh = folder / ".old.part", folder / ".new.part"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    os.utime(stale, (1_000_000, 1_000_000))
    compile_proto(TEXT, NAME, python=False)
    assert not stale.exists(), "a file left by a writer killed long ago is removed"
    assert fresh.exists(), "a file another writer may be writing now is left alone"
    assert len(_kept(tmp_path)) == 1
