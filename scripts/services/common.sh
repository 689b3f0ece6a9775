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
