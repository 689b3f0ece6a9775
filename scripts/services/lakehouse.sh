#!/usr/bin/env bash
# A lakehouse as production runs one, on loopback, for tests: an S3-compatible object store
# (S3Proxy, keeping its objects in a local folder) and Apache Iceberg's REST catalog server
# (the server of Iceberg's apache/iceberg-rest-fixture image) keeping its tables in that
# store, both from Maven Central's jars on Java 17. Data lives in the folder given; stop
# removes it.
#
#   lakehouse.sh fetch                   # resolve the jars once (cached)
#   lakehouse.sh start DIR PORT          # S3 on 127.0.0.1:PORT (bucket "lake"), REST catalog on PORT+1
#   lakehouse.sh stop DIR
#
# The catalog's warehouse is s3://lake/warehouse; the store's access key is "bulldozer" and
# its secret key "bulldozer-secret" (a test store's). BULLDOZER_CACHE (default
# ~/.cache/bulldozer) holds the jars.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
s3proxy_version=4.1.0
iceberg_version=1.10.0 # the newest release whose REST server jar Maven Central serves

log() { echo "lakehouse.sh: $*" >&2; }
# shellcheck source=common.sh
. "$here/common.sh"
s3proxy_lib=$services_cache/s3proxy-$s3proxy_version
rest_lib=$services_cache/iceberg-rest-$iceberg_version

fetch() {
  fetch_jars "$s3proxy_lib" "s3proxy-$s3proxy_version" "S3Proxy $s3proxy_version" "$here/lakehouse/s3proxy.pom.xml"
  fetch_jars "$rest_lib" "iceberg-rest-$iceberg_version" "Iceberg's REST catalog server $iceberg_version" \
    "$here/lakehouse/iceberg-rest.pom.xml"
}

start() { # DIR PORT
  local dir=$1 port=$2
  local rest_port=$((port + 1))
  fetch
  mkdir -p "$dir/objects/lake"
  cat >"$dir/s3proxy.conf" <<CONF
s3proxy.endpoint=http://127.0.0.1:$port
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity=bulldozer
s3proxy.credential=bulldozer-secret
jclouds.provider=filesystem
jclouds.filesystem.basedir=$dir/objects
CONF
  # logback's default (no configuration in S3Proxy's jars) logs every request at DEBUG
  cat >"$dir/s3proxy-logback.xml" <<'XML'
<configuration>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{HH:mm:ss.SSS} %-5level %logger{36} - %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="STDOUT"/></root>
</configuration>
XML
  nohup java -Xmx256m -Dlogback.configurationFile="$dir/s3proxy-logback.xml" -cp "$s3proxy_lib/*" \
    org.gaul.s3proxy.Main --properties "$dir/s3proxy.conf" >"$dir/s3proxy.log" 2>&1 &
  echo $! >"$dir/s3proxy.pid"
  wait_for_port S3Proxy "$!" "$port" "$dir/s3proxy.log"
  # the REST server's catalog properties: CATALOG_<KEY> (_ for ".", __ for "-")
  nohup env AWS_REGION=us-east-1 CATALOG_REST_PORT="$rest_port" \
    CATALOG_URI="jdbc:sqlite:$dir/catalog.db" CATALOG_WAREHOUSE=s3://lake/warehouse \
    CATALOG_IO__IMPL=org.apache.iceberg.aws.s3.S3FileIO CATALOG_S3_ENDPOINT="http://127.0.0.1:$port" \
    CATALOG_S3_ACCESS__KEY__ID=bulldozer CATALOG_S3_SECRET__ACCESS__KEY=bulldozer-secret \
    CATALOG_S3_PATH__STYLE__ACCESS=true CATALOG_CLIENT_REGION=us-east-1 \
    java -Xmx512m -jar "$rest_lib/iceberg-open-api-$iceberg_version.jar" \
    >"$dir/iceberg-rest.log" 2>&1 &
  echo $! >"$dir/iceberg-rest.pid"
  wait_for_port "Iceberg's REST catalog server" "$!" "$rest_port" "$dir/iceberg-rest.log"
  log "S3 on 127.0.0.1:$port, Iceberg REST catalog on 127.0.0.1:$rest_port (data in $dir)"
}

stop() { # DIR
  local dir=$1
  stop_pid "$dir/iceberg-rest.pid"
  stop_pid "$dir/s3proxy.pid"
  rm -rf "$dir"
}

case "${1:-}" in
  fetch) fetch ;;
  start) start "$2" "$3" ;;
  stop) stop "$2" ;;
  *)
    sed -n '2,14p' "$0" >&2
    exit 2
    ;;
esac
