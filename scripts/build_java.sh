#!/usr/bin/env bash
# Build Bulldozer's Java classes for Spark's driver: native/java/src -> native/bin/bulldozer-iceberg.jar
# (bulldozer.iceberg.PemTlsConfigurer: a REST catalog's TLS settings for Iceberg's Java REST
# client). Compiled against the stubs of the Iceberg interfaces they implement
# (native/java/stubs, left out of the jar): the driver gets Iceberg's own at run time.
#
#   scripts/build_java.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
command -v javac >/dev/null && command -v jar >/dev/null || {
  echo "build_java: a Java 17 JDK (javac, jar) is required: apt-get install openjdk-17-jdk-headless" >&2
  exit 1
}
out=$root/native/bin/bulldozer-iceberg.jar
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mapfile -t sources < <(find "$root/native/java/src" "$root/native/java/stubs" -name '*.java' | sort)
javac --release 17 -nowarn -d "$work/classes" "${sources[@]}"
rm -rf "$work/classes/org" # the stubs: Iceberg's own classes are the driver's
mkdir -p "$root/native/bin"
# a fixed date: the same sources make the same jar
jar --create --date=2026-01-01T00:00:00Z --file "$work/out.jar" -C "$work/classes" .
mv "$work/out.jar" "$out"
echo "build_java: built $out" >&2
