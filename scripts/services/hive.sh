#!/usr/bin/env bash
# A Hive Metastore on loopback for tests: an operator's Hive catalog (pyiceberg's HiveCatalog
# over Thrift; Iceberg's HiveCatalog in Spark's JVM). It is Hive 2.3's metastore server from
# the pyspark wheel's own jars (the Hive client Spark ships), keeping its catalog in an
# embedded Derby database in the folder given, on Java 17: nothing to fetch. Data lives in
# the folder given; stop removes it.
#
#   hive.sh start DIR PORT     # thrift://127.0.0.1:PORT
#   hive.sh stop DIR
#
# PYTHON names the interpreter whose pyspark is used (default: the project's .venv). Hive 2.3
# has no `timestamp with local time zone`: a client creating tables gives pyiceberg
# `hive.hive2-compatible=true` (reading them needs nothing).
set -euo pipefail

log() { echo "hive.sh: $*" >&2; }
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"
repo=$(cd "$here/../.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}

start() { # DIR PORT
  local dir=$1 port=$2 jars
  # a JDK's, not only a runtime's: the server runs as a single-file program (hive/Metastore.java)
  java --list-modules 2>/dev/null | grep -q '^jdk.compiler' \
    || { log "a Java 17 JDK is required (apt-get install openjdk-17-jdk-headless)"; return 1; }
  jars="$("$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')/jars"
  mkdir -p "$dir/warehouse" "$dir/tmp"
  # the metastore's settings as system properties (HiveConf reads them); no connection pool
  # (BoneCP is not in Spark's jars), Hive's synchronous logging (the asynchronous one needs
  # the LMAX disruptor), its log in DIR
  local settings=(
    -Djava.io.tmpdir="$dir/tmp"
    -Dhive.async.log.enabled=false
    -Dhive.log.dir="$dir"
    -Dderby.stream.error.file="$dir/derby.log"
    -Ddatanucleus.connectionPoolingType=None
    -Djavax.jdo.option.ConnectionURL="jdbc:derby:;databaseName=$dir/metastore;create=true"
    -Ddatanucleus.schema.autoCreateAll=true
    -Dhive.metastore.schema.verification=false
    -Dhive.metastore.warehouse.dir="file://$dir/warehouse"
  )
  nohup java -Xmx512m -cp "$jars/*" "${settings[@]}" "$here/hive/Metastore.java" -p "$port" >"$dir/metastore.out" 2>&1 &
  echo $! >"$dir/metastore.pid"
  wait_for_port "the Hive Metastore" "$!" "$port" "$dir/metastore.out"
  log "Hive Metastore on thrift://127.0.0.1:$port (data in $dir)"
}

stop() { # DIR
  local dir=$1
  stop_pid "$dir/metastore.pid"
  rm -rf "$dir"
}

case "${1:-}" in
  start) start "$2" "$3" ;;
  stop) stop "$2" ;;
  *)
    echo "usage: hive.sh start DIR PORT | stop DIR" >&2
    exit 2
    ;;
esac
