#!/usr/bin/env bash
# Create .venv and install Bulldozer with the extras the tests need, at the releases
# constraints.txt pins. Idempotent: a second run with nothing changed takes a fraction of a
# second.
#
#   scripts/bootstrap.sh            # .venv, and the native data plane and Java classes
#   scripts/bootstrap.sh --floors   # .venv-floors: every requirement at the lowest release
#                                   # pyproject.toml allows (constraints-floors.txt), for the
#                                   # test command's unit tests; the native parts are .venv's
#   scripts/bootstrap.sh --which-python  # print the interpreter a new venv is made with
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv
pins=constraints.txt
case "${1:-}" in
  "") ;;
  --floors) venv=.venv-floors pins=constraints-floors.txt ;;
  --which-python) ;;
  *) echo "bootstrap: unknown argument '$1' (expected nothing, --floors or --which-python)" >&2; exit 2 ;;
esac

EXTRAS=${BULLDOZER_EXTRAS:-dev,sql,postgres,mysql,hive,spark,cassandra,redis,airflow,lineage,ui}

# The interpreter the venv is made with: PYTHON when set; else the release the first of
# python3.12, python3.11 and python3 on PATH that can make a venv is, in its fastest build on
# PATH (every match of each name, not the first: a pyenv shim and the system's) at a short
# run of plain Python code.
# Builds of one release differ by how they were compiled: here pyenv's 3.11.7 (no
# profile-guided optimisation, a shared libpython) took 1.20-1.73x the time of Debian's 3.11.2
# on plain Python code, 1.15x on a one-shot run of 500 k rows and 1.30x on `bulldozer
# --version` (medians of 20, the two alternating).
PROBE='
import os, sys, timeit
import ensurepip, venv  # it can make a venv with pip (a distribution may ship them apart)
def work():
    d = {}
    for i in range(20000):
        d[str(i)] = [i, i * 2]
    return sorted(d.items(), key=lambda kv: kv[1][1])
if sys.version_info >= (3, 11):
    t = min(timeit.repeat(work, number=3, repeat=3))
    print(sys.version_info[1], f"{t:.6f}", os.path.realpath(sys.executable), sep="\t")
'

find_python() {
  if [ -n "${PYTHON:-}" ]; then
    if "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$PYTHON"
      return 0
    fi
    echo "bootstrap: PYTHON=$PYTHON is not a Python 3.11 or newer" >&2
    return 1
  fi
  local probed minor found
  probed=$(for name in python3.12 python3.11 python3; do
    type -ap "$name" 2>/dev/null || true
  done | while read -r candidate; do
    "$candidate" -c "$PROBE" 2>/dev/null || true
  done)
  minor=$(head -n 1 <<<"$probed" | cut -f1)
  found=$(awk -F '\t' -v minor="$minor" '$1 == minor' <<<"$probed" | sort -t $'\t' -k2,2n | head -n 1 | cut -f3-)
  if [ -z "$found" ]; then
    echo "bootstrap: Python 3.11 or newer, with its venv and ensurepip modules, is required" \
      "(set PYTHON=/path/to/python3.11)" >&2
    return 1
  fi
  echo "$found"
}

if [ "${1:-}" = --which-python ]; then
  find_python
  exit
fi

if [ ! -x "$venv/bin/python" ]; then
  py=$(find_python)
  echo "bootstrap: creating $venv with $($py --version)"
  "$py" -m venv "$venv"
fi

# The install compiles the kernels (native/kernels, Rust): rustup's cargo, where a
# non-login shell has not put it on PATH yet.
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null 2>&1 || {
  echo "bootstrap: Rust (cargo) is required to build the kernels in native/kernels (https://rustup.rs)" >&2
  exit 1
}

# Every distribution, the build's own too, at the release constraints.txt (or
# constraints-floors.txt) pins (scripts/gen_constraints.py): a clean clone installs what the
# tests last passed with, not what was released that day.
pinned=(--constraint "$pins" --build-constraint constraints.txt)

# Editable, as a path entry: setuptools' "compat" mode puts the project folder on sys.path
# with a .pth file. Its default for this layout is an import hook whose module imports
# pathlib, re and importlib.util into every Python process as it starts (12-13 ms; a warm
# run's caller takes 27 ms without it, bulldozer.cli.loader.client), which a wheel install
# never pays.
# setuptools calls the mode transitional: where it refuses it, its default is used.
editable() {
  PYTHONWARNINGS=ignore "$venv/bin/python" -m pip install --quiet "${pinned[@]}" \
    --config-settings editable_mode=compat "$@" \
    || { echo "bootstrap: an editable install with setuptools' default import hook" >&2
         "$venv/bin/python" -m pip install --quiet "${pinned[@]}" "$@"; }
}

stamp=$venv/.bulldozer-installed
# reinstalled (and the kernels rebuilt) when the project's metadata, its pins or the kernels'
# sources change
want="$(cat pyproject.toml constraints.txt "$pins" native/kernels/Cargo.toml native/kernels/Cargo.lock \
  native/kernels/src/*.rs | sha256sum | cut -c1-16) $EXTRAS compat"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "bootstrap: installing bulldozer[$EXTRAS] into $venv"
  # pip first (a new virtualenv's may not know --build-constraint)
  "$venv/bin/python" -m pip install --quiet --constraint constraints.txt --upgrade pip
  editable -e ".[$EXTRAS]"
  echo "$want" > "$stamp"
fi
[ -n "$(ls bulldozer/_kernels*.so 2>/dev/null)" ] || editable --no-deps -e .

# Bytecode for the package: an editable install compiles none, and with
# PYTHONDONTWRITEBYTECODE set (as on these machines) Python would compile every module from
# source in every process (≈ 60 ms per run and per DAL start). compileall only rewrites
# what changed, and Python checks each .pyc against its source as it imports it.
"$venv/bin/python" -m compileall -q bulldozer
[ "$venv" = .venv ] || exit 0

# The native data plane (bulldozer-kvd, Go) and the command's launcher: rebuilt when their
# sources are newer than either.
if command -v go >/dev/null 2>&1; then
  bin=native/bin/bulldozer-kvd
  for built in "$bin" native/bin/bulldozer; do
    if [ ! -x "$built" ] || [ -n "$(find native/kvd native/launcher proto scripts/build_native.sh -newer "$built" \
        -type f ! -path '*/internal/kvpb/*' -print -quit)" ]; then
      # PYTHON here names the venv's interpreter (the build reads its py-lmdb release), not
      # the one this script was told to make the venv with
      PYTHON="$PWD/$venv/bin/python" bash scripts/build_native.sh
      break
    fi
  done
  # The bulldozer command is the native launcher (native/launcher): a run a warm loader takes
  # is handed over without starting Python (20-30 ms of each). pip's script, which this
  # replaces, is written again by the next install, and replaced again here.
  if [ -x native/bin/bulldozer ] && ! cmp -s native/bin/bulldozer "$venv/bin/bulldozer"; then
    install -m 0755 native/bin/bulldozer "$venv/bin/bulldozer"
  fi
else
  echo "bootstrap: Go not found; the DAL will run with its Python data plane only" >&2
fi

# Bulldozer's Java classes for Spark's driver (native/java: TLS for a REST catalog through
# Iceberg's Java client): rebuilt when their sources are newer than the jar.
if command -v javac >/dev/null 2>&1; then
  jar=native/bin/bulldozer-iceberg.jar
  if [ ! -f "$jar" ] || [ -n "$(find native/java scripts/build_java.sh -newer "$jar" -type f -print -quit)" ]; then
    bash scripts/build_java.sh
  fi
else
  echo "bootstrap: no Java JDK (javac); the Spark engine will refuse a REST catalog's TLS settings" >&2
fi
