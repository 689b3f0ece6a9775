"""Compile generated ``.proto`` text in-process with grpcio-tools' protoc, and load
message classes from a serialized ``FileDescriptorSet``.

The descriptor set (with its imports) is what a version stores in the DAL, so any reader
can decode that version's values without the ``.proto`` source.

A run compiles its job's schema every time, and the schema is the same from run to run, so
a descriptor set compiled without Python modules is kept in the user's cache
(``cache_folder()/descriptors``, named by a digest of the text, its file name, protoc's
and protobuf's versions and this module's source: ``_descriptor_key``) and read from there
the next time. In a warm run's freshly forked process the compile took a median of 12.6 ms
(protoc run in this process, its scratch folder, the comments stripped), reading a kept one
2.7 ms. The cache is this user's own: a folder or file another user owns, or others may
write, is not read. It holds at most ``KEPT_DESCRIPTORS`` sets: reading one marks it used
(its modification time), and keeping a new one removes the least recently used beyond that,
and any half-written file a killed process left.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, message_factory

from bulldozer import scratch
from bulldozer.codec.descriptors import descriptor_files, message_descriptors
from bulldozer.errors import SchemaError

__all__ = [
    "CompiledSchema",
    "compile_proto",
    "compiler_identity",
    "load_message_classes",
    "protoc_include_dir",
    "stored_files",
]

_PROTOC_LOCK = threading.Lock()

#: the most descriptor sets the cache keeps (a few kB each): about one per job and schema
#: change a user runs; the least recently used beyond it are removed
KEPT_DESCRIPTORS = 512

#: a half-written entry (``.part``) older than this is a killed writer's, and removed
_STALE_PART_SECONDS = 3600.0


def protoc_include_dir() -> str:
    """Where grpcio-tools keeps the well-known types (google/protobuf/*.proto)."""
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


@dataclass
class CompiledSchema:
    """The result of compiling one ``.proto`` file."""

    proto_name: str
    descriptor_set: bytes
    #: Generated files by relative name (``x_pb2.py``, ``x_pb2.pyi``, ``x.proto``).
    files: dict[str, bytes] = field(default_factory=dict)

    def write(self, directory: str | os.PathLike[str]) -> list[Path]:
        out = []
        for name, data in sorted(self.files.items()):
            path = Path(directory) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            out.append(path)
        return out


def _mypy_plugin() -> str | None:
    beside = Path(sys.executable).parent / "protoc-gen-mypy"
    if beside.exists():
        return str(beside)
    return shutil.which("protoc-gen-mypy")


def _run_protoc(args: list[str]) -> tuple[int, str]:
    """Run protoc in this process, capturing what it writes to stderr (file descriptor 2)."""
    from grpc_tools import protoc

    with _PROTOC_LOCK, tempfile.TemporaryFile() as err:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(err.fileno(), 2)
            code = protoc.main(["protoc", *args])
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        return int(code), err.read().decode("utf-8", "replace")


def compile_proto(
    text: str, proto_name: str, python: bool = True, stubs: bool = True, named: str = "the generated schema"
) -> CompiledSchema:
    """Compile ``text`` (saved as ``proto_name``) to a descriptor set and, optionally, to
    Python modules with ``.pyi`` stubs. Raises SchemaError with protoc's message, which
    calls the text ``named``. Without Python modules, a descriptor set compiled before from
    the same text is taken from the cache (see the module's docstring)."""
    key = _descriptor_key(text, proto_name) if not python else None
    if key is not None and (kept := _kept_descriptor(key, proto_name)) is not None:
        return CompiledSchema(proto_name, kept, {proto_name: text.encode("utf-8")})
    compiled = _compiled(text, proto_name, python, stubs, named)
    if key is not None:
        _keep_descriptor(key, compiled.descriptor_set)
    return compiled


def _compiled(text: str, proto_name: str, python: bool, stubs: bool, named: str) -> CompiledSchema:
    with scratch.folder("protoc") as tmp:
        src = tmp / "src"
        out = tmp / "out"
        (src / proto_name).parent.mkdir(parents=True, exist_ok=True)
        out.mkdir()
        (src / proto_name).write_text(text, encoding="utf-8")
        descriptor = tmp / "descriptor.binpb"
        args = [
            f"-I{src}",
            f"-I{protoc_include_dir()}",
            f"--descriptor_set_out={descriptor}",
            "--include_imports",
            "--include_source_info",  # the generated file's comments: each field's column and Iceberg type
        ]
        if python:
            args.append(f"--python_out={out}")
            plugin = _mypy_plugin()
            if stubs and plugin:
                args += [f"--plugin=protoc-gen-mypy={plugin}", f"--mypy_out={out}"]
        args.append(proto_name)
        code, err = _run_protoc(args)
        if code != 0:
            said = err.replace(f"{src}/", "").strip()  # the file's own name, not the scratch folder's
            raise SchemaError(f"protoc refused {named}: {said or f'exit {code}'}")
        files = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
        files[proto_name] = text.encode("utf-8")
        return CompiledSchema(proto_name, _own_comments_only(descriptor.read_bytes(), proto_name), files)


@functools.cache
def compiler_identity() -> bytes:
    """What makes a descriptor set besides its text: protoc's and protobuf's versions and
    this module's source (how it calls protoc and strips the comments)."""
    from google.protobuf import __version__ as protobuf_version
    from grpc_tools.grpc_version import VERSION as tools_version

    source = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    return f"{tools_version}\0{protobuf_version}\0{source}".encode()


def _descriptor_key(text: str, proto_name: str) -> str | None:
    """The cache's name for the descriptor set of ``text`` saved as ``proto_name``; None
    when the compiler's identity cannot be told (its source unreadable)."""
    try:
        return hashlib.sha256(b"\0".join([compiler_identity(), proto_name.encode(), text.encode()])).hexdigest()
    except (OSError, ImportError):
        return None


def _descriptors_folder() -> Path:
    from bulldozer.settings import load_settings

    return load_settings().cache_folder() / "descriptors"


def _ours(st: os.stat_result) -> bool:
    """A cache entry this user made and only this user may change."""
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _kept_descriptor(key: str, proto_name: str) -> bytes | None:
    """The descriptor set kept under ``key``, when it is there, this user's own, and a
    descriptor set of ``proto_name`` (a torn or foreign file is compiled again)."""
    try:
        folder = _descriptors_folder()
        with open(folder / f"{key}.binpb", "rb") as f:
            if not (_ours(os.stat(folder)) and _ours(os.fstat(f.fileno()))):
                return None
            data = f.read()
            files = descriptor_pb2.FileDescriptorSet.FromString(data).file
            if not any(file.name == proto_name for file in files):
                return None
            with contextlib.suppress(OSError):  # a read-only cache is still read
                os.utime(f.fileno())  # used now: the last to be removed (_prune)
    except Exception:  # missing, unreadable, not a descriptor set, no settings: compile it
        return None
    return data


def _keep_descriptor(key: str, descriptor_set: bytes) -> None:
    """Keep a compiled descriptor set (written aside, then renamed into place); a cache
    that cannot be written is no error."""
    try:
        folder = _descriptors_folder()
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _ours(os.stat(folder)):
            return
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".", suffix=".part", delete=False) as f:
            f.write(descriptor_set)
        try:
            os.replace(f.name, folder / f"{key}.binpb")
        except OSError:
            os.unlink(f.name)
        _prune(folder)
    except Exception:
        return


def _prune(folder: Path) -> None:
    """Remove the least recently used descriptor sets beyond ``KEPT_DESCRIPTORS`` and the
    half-written files of writers killed more than an hour ago. Another process may remove
    the same file at the same time: a file already gone is no error."""
    kept: list[tuple[float, str]] = []
    stale_before = time.time() - _STALE_PART_SECONDS
    with os.scandir(folder) as entries:
        for entry in entries:
            try:
                modified = entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            if entry.name.endswith(".binpb"):
                kept.append((modified, entry.name))
            elif entry.name.endswith(".part") and modified < stale_before:
                (folder / entry.name).unlink(missing_ok=True)
    if len(kept) > KEPT_DESCRIPTORS:
        kept.sort()
        for _, name in kept[: len(kept) - KEPT_DESCRIPTORS]:
            (folder / name).unlink(missing_ok=True)


def _own_comments_only(descriptor_set: bytes, proto_name: str) -> bytes:
    """The descriptor set with source info (comments) kept for the generated file only: a
    version's readers learn each field's Iceberg type from them (dates, uuids, times), and
    the imports' long comments would only make every stored version bigger."""
    fds = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
    for file_proto in fds.file:
        if file_proto.name != proto_name:
            file_proto.ClearField("source_code_info")
    return fds.SerializeToString()


def load_message_classes(descriptor_set: bytes, *full_names: str) -> list[Any]:
    """Message classes for ``full_names`` (``package.Message``) from a descriptor set,
    in a private descriptor pool (so versions with different schemas never clash)."""
    try:
        descriptors = message_descriptors(descriptor_set, *full_names)
    except ValueError as exc:
        raise _unreadable(exc) from None
    return [message_factory.GetMessageClass(desc) for desc in descriptors]


def stored_files(descriptor_set: bytes) -> list[Any]:
    """The ``FileDescriptorProto`` s of a version's stored descriptor set; a SchemaError in
    one line when it does not parse."""
    try:
        return descriptor_files(descriptor_set)
    except ValueError as exc:
        raise _unreadable(exc) from None


def _unreadable(exc: ValueError) -> SchemaError:
    """A stored schema that does not load: a version another tool made, or an older DAL took."""
    return SchemaError(f"the version's stored schema cannot be read: {exc}")
