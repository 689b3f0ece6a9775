#!/usr/bin/env bash
# Build the native data plane of the KV DAL: native/kvd (Go) -> native/bin/bulldozer-kvd, and the
# bulldozer command's launcher: native/launcher (Go) -> native/bin/bulldozer.
#
#   scripts/build_native.sh            # fetch what is missing, generate, build
#
# What it fetches (nothing is installed by hand):
#   - LMDB's C sources, from the sdist of the py-lmdb release installed in the venv, so
#     the Go process and the Python engine link the very same LMDB release (one on-disk
#     and lock-file format: both may open one store at once);
#   - the Go modules in native/kvd/go.sum and the two protoc plugins, from the Go module proxy.
# The Go code for the API is generated from proto/ at every build (not checked in), with the
# protoc that grpcio-tools ships, so it can never be stale.
set -euo pipefail
# With standard input closed (a runner may start a script so), the next file opened takes
# descriptor 0: protoc then fed its Go plugins the wrong pipe, and the build found no API code.
[ -e /dev/fd/0 ] || exec </dev/null
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
kvd=$root/native/kvd
cache=$root/native/.cache
mkdir -p "$cache/bin" "$root/native/bin"
command -v go >/dev/null || { echo "build_native: Go is not installed; the DAL will use its Python data plane" >&2; exit 1; }

# 1. LMDB sources, the release py-lmdb bundles. mdb.c goes to lmdb/c/, where the Go tool does
#    not compile it on its own: lmdb/search.c compiles it in one unit with the data plane's
#    searches that read LMDB's pages (a checkout built before kept it in lmdb/: moved).
ver=$("$py" -c 'import importlib.metadata as m; print(m.version("lmdb"))')
mkdir -p "$kvd/lmdb/c"
[[ -f $kvd/lmdb/mdb.c ]] && mv -f "$kvd/lmdb/mdb.c" "$kvd/lmdb/c/mdb.c"
if [[ ! -f $kvd/lmdb/c/mdb.c || "$(cat "$kvd/lmdb/VERSION" 2>/dev/null)" != "$ver" ]]; then
  echo "build_native: fetching LMDB sources (py-lmdb $ver sdist)"
  "$py" -m pip download "lmdb==$ver" --no-binary :all: --no-deps -d "$cache" -q
  tar -xzf "$cache/lmdb-$ver.tar.gz" -C "$cache"
  cp "$cache/lmdb-$ver/lib/mdb.c" "$kvd/lmdb/c/"
  cp "$cache/lmdb-$ver/lib/"{midl.c,lmdb.h,midl.h} "$kvd/lmdb/"
  echo "$ver" >"$kvd/lmdb/VERSION"
fi

# 2. Go code for the API, from proto/.
export GOBIN=$cache/bin
[[ -x $GOBIN/protoc-gen-go ]] || go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
[[ -x $GOBIN/protoc-gen-go-grpc ]] || go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
include=$("$py" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')
rm -rf "$kvd/internal/kvpb" && mkdir -p "$kvd/internal/kvpb"
map="Mbulldozer/kv/v1/kv.proto=bulldozer/kvd/internal/kvpb;kvpb"
"$py" -m grpc_tools.protoc -I"$root/proto" -I"$include" \
  --plugin=protoc-gen-go="$GOBIN/protoc-gen-go" --plugin=protoc-gen-go-grpc="$GOBIN/protoc-gen-go-grpc" \
  --go_out="$kvd" --go_opt=module=bulldozer/kvd --go_opt=$map \
  --go-grpc_out="$kvd" --go-grpc_opt=module=bulldozer/kvd --go-grpc_opt=$map \
  "$root/proto/bulldozer/kv/v1/kv.proto"

# 3. Build.
cd "$kvd"
CGO_ENABLED=1 go build -trimpath -o "$root/native/bin/bulldozer-kvd" .
go build -trimpath -o "$root/native/bin/kvd-batchget" ./cmd/kvd-batchget  # a benchmark client (bench/kv.py)
# the bulldozer command's native launcher (the standard library only): bootstrap.sh installs it
(cd "$root/native/launcher" && go build -trimpath -ldflags="-s -w" -o "$root/native/bin/bulldozer" .)
echo "build_native: built native/bin/bulldozer-kvd ($("$root/native/bin/bulldozer-kvd" -version))"
