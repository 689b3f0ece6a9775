#!/usr/bin/env bash
# One command from a fresh clone: set everything up and run the main job on the embedded
# default. Safe to run again (the sample table is recreated).
set -euo pipefail
cd "$(dirname "$0")/.."

started=$(date +%s)
bash scripts/bootstrap.sh
export BULLDOZER_HOME=${BULLDOZER_HOME:-$PWD/.bulldozer}
bd=.venv/bin/bulldozer
spec=templates/move_data_to_kv_dal.yaml

echo "== 1/2 sample Iceberg warehouse in $BULLDOZER_HOME"
$bd warehouse sample --rows "${BULLDOZER_SAMPLE_ROWS:-100000}"

echo "== 2/2 validate $spec against the sample table"
$bd validate "$spec" --catalog

echo "== done in $(( $(date +%s) - started )) s"
