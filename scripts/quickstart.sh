#!/usr/bin/env bash
# One command from a fresh clone: set everything up and run the main job on the embedded
# default — sample Iceberg table → KV DAL → alias flipped → a value read back.
# Safe to run again: each run loads a new version and flips the alias to it.
set -euo pipefail
cd "$(dirname "$0")/.."

started=$(date +%s)
bash scripts/bootstrap.sh
export BULLDOZER_HOME=${BULLDOZER_HOME:-$PWD/.bulldozer}
bd=.venv/bin/bulldozer
spec=templates/move_data_to_kv_dal.yaml

echo "== 1/4 sample Iceberg warehouse in $BULLDOZER_HOME"
$bd warehouse sample --rows "${BULLDOZER_SAMPLE_ROWS:-100000}"

echo "== 2/4 validate $spec against the sample table"
$bd validate "$spec" --catalog

echo "== 3/4 run the job: load a new version into the embedded KV DAL, verify it, flip the alias"
$bd run "$spec"

echo "== 4/4 read a value back through the alias"
$bd get user_item_scores --key '{"user_id": 1000001, "item_id": 8, "locale": "de_DE"}'

echo "== done in $(( $(date +%s) - started )) s"
