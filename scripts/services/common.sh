# Sourced by the service scripts: what they install or fetch once per machine, one process
# at a time. The test suite's two workers each start their own servers on first use, so on
# a new machine two scripts install or fetch the same thing at once: two `apt-get install`s
# failed on dpkg's lock ("Could not get lock /var/lib/dpkg/lock-frontend"), and two Maven
# fetches wrote into one folder while the first started Cassandra from it.

services_cache=${BULLDOZER_CACHE:-$HOME/.cache/bulldozer}
#: how long a script waits for another's install or fetch (a cold Cassandra fetch is ~45 s)
lock_wait=900

# with_lock NAME COMMAND [ARGS...]: run COMMAND holding the exclusive lock NAME (flock on a
# file in the cache; the kernel releases it however the holder ends). COMMAND checks again
# whether the work is still to do: another process may have done it while this one waited.
with_lock() {
  local name=$1
  shift
  mkdir -p "$services_cache/locks"
  (
    if ! flock -w "$lock_wait" 9; then
      echo "$(basename "$0"): another process held $services_cache/locks/$name.lock for $lock_wait s" >&2
      exit 1
    fi
    "$@"
  ) 9>"$services_cache/locks/$name.lock"
}

# apt_install PACKAGE...: Debian's packages (the package lists refreshed when they are stale),
# waiting for dpkg's own lock should another apt run; callers hold `with_lock apt`.
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  local wait=(-o DPkg::Lock::Timeout="$lock_wait")
  apt-get install "${wait[@]}" -y -q "$@" >/dev/null 2>&1 || {
    apt-get update "${wait[@]}" -q >/dev/null
    apt-get install "${wait[@]}" -y -q "$@" >/dev/null
  }
}

# require_jvm_tools: Java 17 and Maven, which resolve and run the servers' jars
require_jvm_tools() {
  command -v java >/dev/null || { echo "$(basename "$0"): Java 17 is required (apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
  command -v mvn >/dev/null || { echo "$(basename "$0"): Maven is required to resolve the jars (apt-get install maven)" >&2; exit 1; }
}

# stop_pid FILE [TENTHS]: end the process FILE names (TERM, then KILL after TENTHS tenths of
# a second, default 100) if FILE exists
stop_pid() {
  local file=$1 tenths=${2:-100} pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 "$tenths"); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

# fetch_jars LIB NAME WHAT POM [MVN_ARGS...]: POM's runtime dependencies (WHAT, for the log)
# from Maven Central into LIB, once per machine (LIB/.complete marks it done), one process
# at a time (the lock NAME)
fetch_jars() {
  [ -f "$1/.complete" ] || with_lock "$2" _fetch_jars_once "$@"
}

_fetch_jars_once() {
  local lib=$1 what=$3 pom=$4
  shift 4
  if [ -f "$lib/.complete" ]; then return 0; fi # fetched by the process this one waited for
  require_jvm_tools
  echo "$(basename "$0"): resolving $what from Maven Central into $lib" >&2
  rm -rf "$lib"
  mkdir -p "$lib"
  mvn -q -B -f "$pom" dependency:copy-dependencies -DoutputDirectory="$lib" -DincludeScope=runtime "$@"
  touch "$lib/.complete"
}

# wait_for_port NAME PID PORT LOG: until 127.0.0.1:PORT takes a connection, 60 s at most (1 if
# the process PID exits first: the end of its LOG is shown); the caller defines log()
wait_for_port() {
  local name=$1 pid=$2 port=$3 output=$4
  for _ in $(seq 1 600); do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "$name exited during start; the end of its log:"
      tail -n 30 "$output" >&2 || true
      return 1
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  log "$name did not open 127.0.0.1:$port within 60 s (see $output)"
  return 1
}
