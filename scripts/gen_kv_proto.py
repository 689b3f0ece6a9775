"""Generate the KV DAL's Python code from proto/bulldozer/kv/v1/kv.proto.

    python scripts/gen_kv_proto.py          # (re)write bulldozer/kv/v1/*_pb2*.py[i]
    python scripts/gen_kv_proto.py --check  # exit 1 if the checked-in code is stale

The generated modules are checked in so a wheel needs no protoc; --check (run by the test
command) makes sure they always match the .proto source.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

REPO = Path(__file__).resolve().parent.parent
SOURCE = "bulldozer/kv/v1/kv.proto"
OUT = REPO / "bulldozer" / "kv" / "v1"
GENERATED = ["kv_pb2.py", "kv_pb2.pyi", "kv_pb2_grpc.py", "kv_pb2_grpc.pyi"]


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
            stale = [
                n for n in GENERATED if not (OUT / n).exists() or not filecmp.cmp(fresh / n, OUT / n, shallow=False)
            ]
            if stale:
                print(
                    f"generated KV DAL code is stale: {', '.join(stale)}; run scripts/gen_kv_proto.py",
                    file=sys.stderr,
                )
                return 1
            print("generated KV DAL code is in sync with proto/")
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
