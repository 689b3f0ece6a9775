"""Generate the KV DAL's Python code from proto/bulldozer/kv/v1/kv.proto.

    python scripts/gen_kv_proto.py          # (re)write bulldozer/kv/v1/*_pb2*.py[i]
    python scripts/gen_kv_proto.py --check  # exit 1 if the checked-in code is stale

The generated modules are checked in so a wheel needs no protoc; --check (run by the test
command) makes sure they always match the .proto source.

The generated code also names the grpcio and protobuf releases it needs at run time: those of
the generator that wrote it (``FLOORS``), and nothing else in it depends on the generator's
release. So --check compares everything but those floors, and holds the floors against the
ones pyproject.toml declares: an install pyproject allows must be able to import the code (a
newer grpcio-tools, as a fresh install may get, writes the same code with higher floors).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

import gen_constraints  # beside this script: the one reading of a requirement's floor
from grpc_tools import protoc
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
SOURCE = "bulldozer/kv/v1/kv.proto"
OUT = REPO / "bulldozer" / "kv" / "v1"
GENERATED = ["kv_pb2.py", "kv_pb2.pyi", "kv_pb2_grpc.py", "kv_pb2_grpc.pyi"]
#: per generated file: the distribution whose release it needs at least, and the pattern of
#: what says which (its groups: that release's parts, joined by dots)
FLOORS = {
    "kv_pb2.py": ("protobuf", re.compile(r"^# Protobuf Python Version: (\d+)\.(\d+)\.(\d+)$", re.M)),
    "kv_pb2_grpc.py": ("grpcio", re.compile(r"^GRPC_GENERATED_VERSION = '(\d+)\.(\d+)\.(\d+)'$", re.M)),
}
#: the generated protobuf module checks that release again, in numbers (major, minor, patch)
PROTOBUF_CHECK = re.compile(
    r"(ValidateProtobufRuntimeVersion\(\n\s*_runtime_version\.Domain\.PUBLIC,\n)\s*\d+,\n\s*\d+,\n\s*\d+,\n"
)


def floor(name: str, text: str) -> Version | None:
    """The release of its distribution that generated file ``name`` of FLOORS (``text``) needs
    at least."""
    found = FLOORS[name][1].search(text)
    return Version(".".join(found.groups())) if found else None


def without_floors(text: str) -> str:
    """A generated file's ``text`` with the generator's release left out of it (each pattern
    matches in its own file only)."""
    for _, pattern in FLOORS.values():
        text = pattern.sub("<floor>", text)
    return PROTOBUF_CHECK.sub(r"\1<floor>\n", text)


def declared_floors(pyproject: Path) -> dict[str, Version | None]:
    """The lowest release ``pyproject``'s dependencies allow of each distribution FLOORS names
    (None: no ``>=`` bound)."""
    dependencies = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    named = {dist for dist, _ in FLOORS.values()}
    requirements = [Requirement(line) for line in dependencies]
    return {r.name: gen_constraints.floor(r) for r in requirements if r.name in named}


def problems(fresh: Path, out: Path = OUT, pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """What makes the checked-in code (in ``out``) not the generator's output for the .proto
    source (in ``fresh``), or not importable with every release ``pyproject`` allows."""
    said: list[str] = []
    stale = [
        name
        for name in GENERATED
        if not (out / name).exists()
        or without_floors((fresh / name).read_text(encoding="utf-8"))
        != without_floors((out / name).read_text(encoding="utf-8"))
    ]
    if stale:
        said.append(f"generated KV DAL code is stale: {', '.join(stale)}; run scripts/gen_kv_proto.py")
    declared = declared_floors(pyproject)
    for name, (dist, _) in FLOORS.items():
        needed = floor(name, (out / name).read_text(encoding="utf-8")) if (out / name).exists() else None
        if needed is None:
            said.append(f"{name} names no {dist} release it needs: the generator's output changed form")
            continue
        allowed = declared.get(dist)
        if allowed is None or allowed < needed:
            said.append(
                f"pyproject.toml allows {dist} below {needed}, which the generated {name} needs: "
                f"declare {dist}>={needed}"
            )
    return said


def generate(into: Path) -> None:
    include = Path(protoc.__file__).parent / "_proto"
    plugin_dir = Path(sys.executable).parent
    args = [
        "protoc",
        f"-I{REPO / 'proto'}",
        f"-I{include}",
        f"--python_out={into}",
        f"--grpc_python_out={into}",
        f"--plugin=protoc-gen-mypy={plugin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={plugin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={into}",
        f"--mypy_grpc_out={into}",
        SOURCE,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check that the checked-in code is fresh")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = Path(tmp) / "bulldozer" / "kv" / "v1"
        if args.check:
            said = problems(fresh)
            for line in said:
                print(line, file=sys.stderr)
            if said:
                return 1
            print("generated KV DAL code is in sync with proto/, and pyproject.toml's grpcio and protobuf can run it")
            return 0
        OUT.mkdir(parents=True, exist_ok=True)
        for name in GENERATED:
            shutil.copyfile(fresh / name, OUT / name)
        (OUT / "__init__.py").write_text(
            '"""Generated from proto/bulldozer/kv/v1/kv.proto by scripts/gen_kv_proto.py."""\n'
        )
        print(f"wrote {', '.join(GENERATED)} to {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
