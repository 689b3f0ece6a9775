#!/usr/bin/env bash
# Apache Cassandra 5.0 for tests and benchmarks, from Maven Central's jars on Java 17:
# fetch, start (one node on loopback, 1 GB heap), stop. Data lives in the folder given;
# stop removes it.
#
#   cassandra.sh fetch                   # resolve the jars once (cached, ~45 s cold)
#   cassandra.sh start DIR PORT          # CQL on 127.0.0.1:PORT (storage port PORT+1)
#   cassandra.sh stop DIR
#
# BULLDOZER_CACHE (default ~/.cache/bulldozer) holds the jars; CASSANDRA_HEAP sets the heap.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
version=5.0.9
heap=${CASSANDRA_HEAP:-1G}

log() { echo "cassandra.sh: $*" >&2; }
# shellcheck source=common.sh
. "$here/common.sh"
lib=$services_cache/cassandra-$version/lib

fetch() {
  fetch_jars "$lib" "cassandra-$version" "cassandra-all $version and its dependencies" \
    "$here/cassandra/pom.xml" -Dcassandra.version="$version"
}

write_conf() { # DIR PORT
  local dir=$1 port=$2
  mkdir -p "$dir/conf" "$dir/data" "$dir/commitlog" "$dir/saved_caches" "$dir/hints" "$dir/cdc" "$dir/logs"
  cat >"$dir/conf/cassandra.yaml" <<YAML
cluster_name: bulldozer-test
num_tokens: 16
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "127.0.0.1:$((port + 1))"
listen_address: 127.0.0.1
rpc_address: 127.0.0.1
storage_port: $((port + 1))
native_transport_port: $port
start_native_transport: true
data_file_directories: [$dir/data]
commitlog_directory: $dir/commitlog
saved_caches_directory: $dir/saved_caches
hints_directory: $dir/hints
cdc_raw_directory: $dir/cdc
commitlog_sync: periodic
commitlog_sync_period: 10000ms
auto_snapshot: false
snapshot_on_duplicate_row_detection: false
authenticator: AllowAllAuthenticator
authorizer: AllowAllAuthorizer
paxos_variant: v2
concurrent_writes: 32
concurrent_reads: 32
write_request_timeout: 10000ms
read_request_timeout: 10000ms
range_request_timeout: 20000ms
cas_contention_timeout: 5000ms
tables_warn_threshold: 2000
YAML
  cat >"$dir/conf/logback.xml" <<'XML'
<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>${cassandra.logdir}/system.log</file>
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
XML
}

jvm_opts() {
  # the JPMS and GC options of Cassandra's own conf/jvm17-server.options
  echo -Xms"$heap" -Xmx"$heap" -XX:+UseG1GC -XX:+ParallelRefProcEnabled -XX:MaxTenuringThreshold=1 \
    -XX:G1HeapRegionSize=16m -XX:MaxGCPauseMillis=300 -Xss256k \
    -Djdk.attach.allowAttachSelf=true \
    --add-exports java.base/jdk.internal.misc=ALL-UNNAMED \
    --add-exports java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED \
    --add-exports java.rmi/sun.rmi.registry=ALL-UNNAMED \
    --add-exports java.rmi/sun.rmi.server=ALL-UNNAMED \
    --add-exports java.sql/java.sql=ALL-UNNAMED \
    --add-exports java.base/java.lang.ref=ALL-UNNAMED \
    --add-exports jdk.unsupported/sun.misc=ALL-UNNAMED \
    --add-exports jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED \
    --add-exports jdk.attach/sun.tools.attach=ALL-UNNAMED \
    --add-opens java.base/java.lang.module=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.loader=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.ref=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.reflect=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.math=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.module=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.util.jar=ALL-UNNAMED \
    --add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED \
    --add-opens java.base/sun.nio.ch=ALL-UNNAMED \
    --add-opens java.base/java.io=ALL-UNNAMED \
    --add-opens java.base/java.lang.reflect=ALL-UNNAMED \
    --add-opens jdk.compiler/com.sun.tools.javac=ALL-UNNAMED \
    --add-opens java.base/java.lang=ALL-UNNAMED \
    --add-opens java.base/java.util=ALL-UNNAMED \
    -Dio.netty.tryReflectionSetAccessible=true
}

start() { # DIR PORT
  local dir=$1 port=$2
  fetch
  write_conf "$dir" "$port"
  # its temporary files (lz4-java's native library, extracted at each start and left in /tmp
  # by a server that was killed) in its own folder, which stop removes
  mkdir -p "$dir/tmp"
  # shellcheck disable=SC2046
  nohup java $(jvm_opts) \
    -Djava.io.tmpdir="$dir/tmp" \
    -Dcassandra.config="file://$dir/conf/cassandra.yaml" \
    -Dlogback.configurationFile="$dir/conf/logback.xml" \
    -Dcassandra.logdir="$dir/logs" -Dcassandra.storagedir="$dir" \
    -Dcassandra-foreground=yes -Dcassandra.skip_wait_for_gossip_to_settle=0 \
    -Dcassandra.ring_delay_ms=100 -Dcassandra.superuser_setup_delay_ms=0 \
    -cp "$dir/conf:$lib/*" org.apache.cassandra.service.CassandraDaemon \
    >"$dir/logs/stdout.log" 2>&1 &
  echo $! >"$dir/cassandra.pid"
  local pid=$!
  for _ in $(seq 1 1200); do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "Cassandra exited during start; the end of its log:"
      tail -n 30 "$dir/logs/stdout.log" "$dir/logs/system.log" >&2 2>/dev/null || true
      return 1
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      log "Cassandra $version on 127.0.0.1:$port (pid $pid, data in $dir)"
      return 0
    fi
    sleep 0.1
  done
  log "Cassandra did not open 127.0.0.1:$port within 120 s (see $dir/logs)"
  return 1
}

stop() { # DIR
  local dir=$1
  stop_pid "$dir/cassandra.pid" 200
  rm -rf "$dir"
}

case "${1:-}" in
  fetch) fetch ;;
  start) start "$2" "$3" ;;
  stop) stop "$2" ;;
  *)
    sed -n '2,10p' "$0" >&2
    exit 2
    ;;
esac
