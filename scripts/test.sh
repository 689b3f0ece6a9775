#!/usr/bin/env bash
# The whole test command: installs what it needs, then lint, format, types, generated-code
# freshness and the test suite. Extra arguments go to pytest (e.g. -k spec, -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

echo "== ruff"
ruff check bulldozer tests scripts bench dags
ruff format --check bulldozer tests scripts bench dags
echo "== generated code"
python scripts/gen_kv_proto.py --check
python scripts/gen_shared.py --check
python scripts/gen_constraints.py --check
echo "== go (native/kvd, native/launcher)"
command -v go >/dev/null || { echo "test: Go >= 1.26 is required (native/kvd, the DAL's native data plane)" >&2; exit 1; }
for module in native/kvd native/launcher; do
  (cd "$module" && test -z "$(gofmt -l .)" || { gofmt -l .; echo "gofmt: files above need formatting" >&2; exit 1; })
  (cd "$module" && go vet ./... && go test ./...)
done
echo "== mypy"
mypy
echo "== unit tests on the lowest releases pyproject.toml allows (.venv-floors)"
# Not the two modules that check the development environment itself: the pins installed
# (test_gen_constraints) and the generated code, which depends on the generator's release.
bash scripts/bootstrap.sh --floors
.venv-floors/bin/python scripts/gen_constraints.py --check
.venv-floors/bin/python -m pytest tests/unit -q -n 2 \
  --ignore=tests/unit/test_gen_constraints.py --ignore=tests/unit/test_gen_kv_proto.py
echo "== pytest"
# Two workers (pytest-xdist): most tests wait on processes they start (DALs, Spark, servers),
# so on this 2-core machine the suite ran in 19 min against 28 min in one process. A module's
# tests go to one worker, so its module fixtures (a Spark session, a DAL, a loader) start once:
# --dist loadfile (loadgroup's groups are lost on pytest 9.2, pytest-xdist#1386). The workers
# take modules in the order tests/conftest.py gives them (--no-loadscope-reorder keeps it):
# the modules slow as a whole first, so none is left to run alone at the end. `-n 0` after
# this runs them in one process.
pytest -n 2 --dist loadfile --no-loadscope-reorder "$@"
