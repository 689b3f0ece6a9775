#!/usr/bin/env bash
# A Spark standalone cluster on loopback for tests and benchmarks: one master and one
# worker, from the pyspark package's own launcher (bin/spark-class; the wheel ships no
# sbin/start-master.sh). The worker starts with a clean environment — no virtualenv on its
# PATH, no BULLDOZER_* variables — so its executors run only what a job ships to them
# (`bulldozer spark package`, spark.archives).
#
#   spark.sh start DIR PORT [CORES]   # master spark://127.0.0.1:PORT (web UI PORT+1),
#                                     # worker with CORES cores (default 2; web UI PORT+2)
#   spark.sh stop DIR                 # the master and worker started in DIR; DIR is removed
#
# PYTHON names the interpreter whose pyspark is used (default: the project's .venv).
set -euo pipefail

log() { echo "spark.sh: $*" >&2; }
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

# The worker deletes a finished application's folder (its executors' logs and the unpacked
# environment the job shipped, ~410 MB for `bulldozer spark package`'s) seconds after it
# ends; Spark's default keeps them 7 days.
worker_opts="-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.interval=5 -Dspark.worker.cleanup.appDataTtl=1"

repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}

spark_home() {
  "$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))'
}

java_home() {
  if [ -n "${JAVA_HOME:-}" ]; then
    echo "$JAVA_HOME"
  else
    dirname "$(dirname "$(readlink -f "$(command -v java)")")"
  fi
}

wait_for() { # LOG PATTERN WHAT
  for _ in $(seq 1 600); do
    if grep -q "$2" "$1" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  log "$3 did not start within 60 s; its log:"
  tail -n 30 "$1" >&2 || true
  return 1
}

launch() { # DIR NAME CLASS ARGS...  (a clean environment, in the background, pid in DIR/NAME.pid)
  local dir=$1 name=$2 class=$3
  shift 3
  env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$dir/home" JAVA_HOME="$(java_home)" SPARK_HOME="$home" \
    SPARK_LOCAL_IP=127.0.0.1 SPARK_LOG_DIR="$dir" SPARK_WORKER_DIR="$dir/work" SPARK_WORKER_OPTS="$worker_opts" \
    nohup "$home/bin/spark-class" "$class" "$@" >"$dir/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/$name.pid"
}

case "${1:-}" in
  start)
    dir=$2 port=$3 cores=${4:-2}
    home=$(spark_home)
    command -v java >/dev/null 2>&1 || [ -n "${JAVA_HOME:-}" ] || {
      log "Java 17+ is required (apt-get install openjdk-17-jre-headless)"
      exit 1
    }
    mkdir -p "$dir/home" "$dir/work"
    launch "$dir" master org.apache.spark.deploy.master.Master \
      --host 127.0.0.1 --port "$port" --webui-port $((port + 1))
    wait_for "$dir/master.log" "I have been elected leader" "the Spark master"
    launch "$dir" worker org.apache.spark.deploy.worker.Worker \
      --host 127.0.0.1 --webui-port $((port + 2)) --cores "$cores" --memory 4g --work-dir "$dir/work" \
      "spark://127.0.0.1:$port"
    wait_for "$dir/worker.log" "Successfully registered with master" "the Spark worker"
    log "master spark://127.0.0.1:$port with one worker ($cores cores)"
    ;;
  stop)
    dir=$2
    stop_pid "$dir/worker.pid"
    stop_pid "$dir/master.pid"
    # executors the worker started (their JVMs run in DIR/work)
    pkill -9 -f -- "$dir/work" 2>/dev/null || true
    rm -rf "$dir"
    ;;
  *)
    echo "usage: spark.sh start DIR PORT [CORES] | stop DIR" >&2
    exit 2
    ;;
esac
