"""Generate a job's Java (Maven) and Go (module) client projects.

Both hold the job's key/value messages, the KV DAL API stubs and a small typed reader
(``get`` / ``batch_get`` by alias or ``alias@version``) plus a tiny program that reads one
key. The code is produced by protoc from the very descriptors the DAL stores (the job's
descriptor set and the DAL API's), with the language options set here:

* Java: protoc (``com.google.protobuf:protoc``, the version grpcio-tools bundles) and the
  grpc-java plugin (``io.grpc:protoc-gen-grpc-java``), both fetched from Maven Central
  with ``mvn``; the project builds with ``mvn package``.
* Go: ``protoc-gen-go`` and ``protoc-gen-go-grpc`` (installed with ``go install``); the
  module builds with ``go build`` and passes ``go vet``.

The tools are cached under ``$BULLDOZER_CACHE`` (default ``~/.cache/bulldozer/tools``).
Generation is deterministic: the same spec and schema give the same bytes (Go's ``go.sum``
is written by ``go mod tidy`` from pinned versions).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from google.protobuf import descriptor_pb2

from bulldozer import locks, scratch
from bulldozer.codegen.output import claim_folder, write_files
from bulldozer.codegen.python import kv_api_descriptor_set
from bulldozer.codegen.readme import render_readme
from bulldozer.errors import ToolchainError
from bulldozer.schema.job import JobSchema
from bulldozer.settings import child_environment, python_command
from bulldozer.spec.models import JAVA_KEYWORDS, JobSpec

__all__ = [
    "GRPC_JAVA",
    "client_java_package",
    "generate_go_client",
    "generate_java_client",
    "go_plugins",
    "grpc_java_plugin",
    "java_protoc",
]

GRPC_JAVA = "1.80.0"
GO_PROTOBUF = "v1.36.12"
GO_GRPC = "v1.85.0"
GO_GRPC_PLUGIN = "v1.6.2"
GO_VERSION = "1.24"


def _protoc_version() -> str:
    out = subprocess.run(
        python_command("-m", "grpc_tools.protoc", "--version"), capture_output=True, text=True, check=True
    )
    return out.stdout.split()[-1]  # "libprotoc 35.1" -> "35.1"


def _protobuf_java() -> str:
    """protobuf-java's version for the protoc bundled with grpcio-tools (protoc 35.1 → 4.35.1):
    generated Java code needs a runtime at least as new as the protoc that wrote it."""
    return "4." + _protoc_version()


def _cache() -> Path:
    from bulldozer.settings import load_settings

    return load_settings().cache_folder() / "tools"


def _template(lang: str, name: str) -> str:
    return (resources.files("bulldozer.codegen") / "templates" / f"client_{lang}" / name).read_text(encoding="utf-8")


def _tool(name: str, hint: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ToolchainError(f"`{name}` is needed to generate this client but is not on PATH; {hint}")
    return found


def _check(command: list[str], what: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    result = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip()[-2000:]
        raise ToolchainError(f"{what} failed ({' '.join(command[:3])} …): {tail}")


def _fetched_once(tools: list[Path], lock: str, what: str, fetch: Callable[[Path], None]) -> None:
    """Make the ``tools`` (files of one folder in the cache) unless they all exist: by one
    process at a time (``bulldozer.locks``, lock ``lock``), ``fetch(partial)`` writing them
    under their names into a folder of its own, then moved into place whole, so no process
    runs one another is still writing."""
    if all(tool.exists() for tool in tools):
        return
    with locks.held(locks.in_cache(lock), what):
        if all(tool.exists() for tool in tools):
            return  # made by the process this one waited for
        folder = tools[0].parent
        folder.mkdir(parents=True, exist_ok=True)
        with scratch.folder("tools", root=folder) as partial:
            fetch(partial)
            for tool in tools:
                (partial / tool.name).chmod(0o755)
                os.replace(partial / tool.name, tool)


def _maven_exe(group: str, artifact: str, version: str) -> Path:
    """A native executable published on Maven Central (``G:A:V:exe:linux-x86_64``), cached
    (``_fetched_once``)."""
    exe = _cache() / artifact / f"{artifact}-{version}-linux-x86_64.exe"

    def fetch(partial: Path) -> None:
        mvn = _tool("mvn", f"install Maven (apt-get install maven) to fetch {group}:{artifact} from Maven Central")
        _check(
            [
                mvn,
                "-q",
                "-B",
                "dependency:copy",
                f"-Dartifact={group}:{artifact}:{version}:exe:linux-x86_64",
                f"-DoutputDirectory={partial}",
            ],
            f"fetching {group}:{artifact}:{version} from Maven Central",
        )

    _fetched_once([exe], f"{artifact}-{version}", f"fetching {artifact}", fetch)
    return exe


def grpc_java_plugin() -> Path:
    return _maven_exe("io.grpc", "protoc-gen-grpc-java", GRPC_JAVA)


def java_protoc() -> Path:
    """protoc itself (the one grpcio-tools bundles has no Java generator), at the same version."""
    return _maven_exe("com.google.protobuf", "protoc", _protobuf_java())


def go_plugins() -> tuple[Path, Path]:
    """protoc-gen-go and protoc-gen-go-grpc, installed with ``go install``, cached
    (``_fetched_once``)."""
    folder = _cache() / "go" / f"{GO_PROTOBUF}-{GO_GRPC_PLUGIN}"
    gen_go, gen_grpc = folder / "protoc-gen-go", folder / "protoc-gen-go-grpc"

    def fetch(partial: Path) -> None:
        go = _tool("go", "install the Go toolchain to generate Go clients")
        env = child_environment(GOBIN=str(partial))
        for module in (
            f"google.golang.org/protobuf/cmd/protoc-gen-go@{GO_PROTOBUF}",
            f"google.golang.org/grpc/cmd/protoc-gen-go-grpc@{GO_GRPC_PLUGIN}",
        ):
            _check([go, "install", module], f"go install {module}", env=env)

    _fetched_once([gen_go, gen_grpc], f"go-plugins-{folder.name}", "installing the Go protoc plugins", fetch)
    return gen_go, gen_grpc


def _descriptor_set(job: JobSchema, java_package: str | None, go_packages: dict[str, str] | None) -> bytes:
    """The job's files and the DAL API's, deduplicated, with language options set."""
    merged = descriptor_pb2.FileDescriptorSet()
    seen: set[str] = set()
    for raw in (kv_api_descriptor_set(), job.descriptor_set):
        part = descriptor_pb2.FileDescriptorSet.FromString(raw)
        for file in part.file:
            if file.name in seen:
                continue
            seen.add(file.name)
            if file.name == job.compiled.proto_name and java_package:
                file.options.java_package = java_package
                file.options.java_multiple_files = True
            if go_packages and file.name in go_packages:
                file.options.go_package = go_packages[file.name]
            merged.file.append(file)
    return merged.SerializeToString(deterministic=True)


def _protoc(descriptors: bytes, files: list[str], args: list[str], protoc: Path | None = None) -> None:
    """protoc over descriptors (not .proto text): grpcio-tools' unless ``protoc`` is given."""
    command = [str(protoc)] if protoc else python_command("-m", "grpc_tools.protoc")
    with scratch.folder("protoc") as tmp:
        fds = tmp / "all.binpb"
        fds.write_bytes(descriptors)
        _check([*command, f"--descriptor_set_in={fds}", *args, *files], "protoc")


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def client_java_package(spec: JobSpec) -> str:
    """The Java package of the job's client: the spec's ``java_package``, else
    ``dev.bulldozer.clients.<job>``, where a job named as a Java keyword (``default``) gets the
    part ``default_``, as the JLS advises (a spec's own is refused with one: ``JAVA_KEYWORDS``)."""
    name = spec.metadata.name
    return spec.bulldozer_protobuf.output.java_package or "dev.bulldozer.clients." + (
        f"{name}_" if name in JAVA_KEYWORDS else name
    )


def generate_java_client(spec: JobSpec, job: JobSchema, out: Path, schema_generation: int = 1) -> list[Path]:
    """A Maven project: messages, DAL stubs, ``<Job>Reader`` (with a ``main`` reading one key),
    for versions of ``schema_generation``."""
    name = spec.metadata.name
    java_package = client_java_package(spec)
    reader = _camel(name) + "Reader"
    if reader in (job.proto.key.name, job.proto.value.name):  # its file would be the message's
        reader = _camel(name) + "KvReader"
    claim_folder(out, name, "java")
    plugin = grpc_java_plugin()
    sources = out / "src" / "main" / "java"
    if sources.exists():
        shutil.rmtree(sources)  # a regenerated project holds no stale classes
    sources.mkdir(parents=True)
    _protoc(
        _descriptor_set(job, java_package, None),
        [job.compiled.proto_name, "bulldozer/kv/v1/kv.proto"],
        [f"--java_out={sources}", f"--plugin=protoc-gen-grpc-java={plugin}", f"--grpc-java_out={sources}"],
        protoc=java_protoc(),
    )
    digest = hashlib.sha256(job.descriptor_set).hexdigest()[:12]
    values = {
        "job": name,
        "alias": spec.alias,
        "group": "dev.bulldozer.clients",
        "artifact": name.replace("_", "-") + "-client",
        "version": f"0.1.0-{digest}",
        "protobuf_java": _protobuf_java(),
        "grpc_java": GRPC_JAVA,
        "java_package": java_package,
        "reader": reader,
        "key": job.proto.key.name,
        "value": job.proto.value.name,
        "schema_generation": schema_generation,
    }
    package_dir = sources / Path(*java_package.split("."))
    files = {
        out / "pom.xml": _template("java", "pom.xml.tmpl").format(**values).encode(),
        out / "README.md": render_readme("java", job, **values),
        package_dir / f"{reader}.java": _template("java", "Reader.java.tmpl").format(**values).encode(),
    }
    write_files(files)
    return sorted(p for p in out.rglob("*") if p.is_file() and "target" not in p.relative_to(out).parts)


def generate_go_client(spec: JobSpec, job: JobSchema, out: Path, schema_generation: int = 1) -> list[Path]:
    """A Go module: messages (``<job>pb``), DAL stubs (``kvv1``), ``client.Reader`` and ``cmd/read``,
    for versions of ``schema_generation``."""
    name = spec.metadata.name
    go_option = spec.bulldozer_protobuf.output.go_package
    module = go_option.split(";")[0] if go_option else f"bulldozer.dev/clients/{name}"
    if not re.fullmatch(r"[A-Za-z0-9_.\-/]+", module):
        raise ToolchainError(f"go_package {go_option!r} does not name a Go module path")
    pb = name.replace("_", "") + "pb"
    claim_folder(out, name, "go")
    gen_go, gen_grpc = go_plugins()
    go = _tool("go", "install the Go toolchain to generate Go clients")
    for stale in ("kvv1", pb):
        if (out / stale).exists():
            shutil.rmtree(out / stale)
    out.mkdir(parents=True, exist_ok=True)
    go_packages = {
        job.compiled.proto_name: f"{module}/{pb};{pb}",
        "bulldozer/kv/v1/kv.proto": f"{module}/kvv1;kvv1",
    }
    _protoc(
        _descriptor_set(job, None, go_packages),
        [job.compiled.proto_name, "bulldozer/kv/v1/kv.proto"],
        [
            f"--plugin=protoc-gen-go={gen_go}",
            f"--plugin=protoc-gen-go-grpc={gen_grpc}",
            f"--go_out={out}",
            f"--go_opt=module={module}",
            f"--go-grpc_out={out}",
            f"--go-grpc_opt=module={module}",
        ],
    )
    values = {
        "job": name,
        "alias": spec.alias,
        "module": module,
        "pb": pb,
        "key": job.proto.key.name,
        "value": job.proto.value.name,
        "schema_generation": schema_generation,
    }
    go_mod = (
        f"// Generated by `bulldozer client --lang go` for the job '{name}'; do not edit.\n"
        f"module {module}\n\ngo {GO_VERSION}\n\n"
        f"require (\n\tgoogle.golang.org/grpc {GO_GRPC}\n\tgoogle.golang.org/protobuf {GO_PROTOBUF}\n)\n"
    )
    write_files(
        {
            out / "go.mod": go_mod.encode(),
            out / "README.md": render_readme(
                "go", job, go_version=GO_VERSION, go_grpc=GO_GRPC, go_protobuf=GO_PROTOBUF, **values
            ),
            out / "reader.go": _template("go", "reader.go.tmpl").format(**values).encode(),
            out / "cmd" / "read" / "main.go": _template("go", "main.go.tmpl").format(**values).encode(),
        }
    )
    _check([go, "mod", "tidy"], "go mod tidy (resolving grpc and protobuf)", cwd=out)
    return sorted(p for p in out.rglob("*") if p.is_file())
