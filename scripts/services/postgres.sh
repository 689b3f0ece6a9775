#!/usr/bin/env bash
# PostgreSQL for tests and benchmarks, from Debian's packages: an operator's SQL catalog
# (pyiceberg's SqlCatalog, Iceberg's JdbcCatalog) kept in a real server. Data lives in the
# folder given; stop removes it. The server takes password logins (SCRAM) on loopback only,
# as user `bulldozer` into database `catalog`; the password is in DIR/password.
#
#   postgres.sh install
#   postgres.sh start DIR PORT     # on 127.0.0.1:PORT
#   postgres.sh stop DIR           # the server started in DIR, then DIR is removed
set -euo pipefail

log() { echo "postgres.sh: $*" >&2; }
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"

bin_dir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
have_postgres() { [ -n "$(bin_dir)" ] && [ -x "$(bin_dir)/initdb" ] && [ -x "$(bin_dir)/pg_ctl" ]; }

install() {
  have_postgres || with_lock apt install_once
}

install_once() {
  have_postgres && return 0 # installed by the process this one waited for
  log "installing postgresql from Debian's packages"
  apt_install postgresql
  # the package enables a system cluster on 5432; the project starts its own servers
  if command -v systemctl >/dev/null 2>&1; then systemctl disable --now postgresql >/dev/null 2>&1 || true; fi
  if command -v service >/dev/null 2>&1; then service postgresql stop >/dev/null 2>&1 || true; fi # no systemd
}

# as_owner COMMAND...: PostgreSQL refuses to run as root; as root, run as the package's user
as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start() { # DIR PORT
  local dir=$1 port=$2 bin
  bin=$(bin_dir)
  mkdir -p "$dir"
  head -c 18 /dev/urandom | base64 | tr '+/' '-_' >"$dir/password"
  if [ "$(id -u)" = 0 ]; then chown -R postgres "$dir"; fi
  as_owner "$bin/initdb" -D "$dir/data" -U bulldozer --pwfile="$dir/password" --auth-host=scram-sha-256 \
    --auth-local=peer -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 || { log "initdb failed (see $dir/initdb.log)"; return 1; }
  as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c full_page_writes=off" start >/dev/null \
    || { log "the server did not start (see $dir/server.log)"; return 1; }
  PGPASSWORD=$(cat "$dir/password") "$bin/createdb" -h 127.0.0.1 -p "$port" -U bulldozer catalog
  log "server on 127.0.0.1:$port (user bulldozer, database catalog)"
}

stop() { # DIR
  local dir=$1
  if [ -f "$dir/data/postmaster.pid" ]; then
    as_owner "$(bin_dir)/pg_ctl" -D "$dir/data" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
  fi
  rm -rf "$dir"
}

case "${1:-}" in
  install) install ;;
  start)
    install
    start "$2" "$3"
    ;;
  stop) stop "$2" ;;
  *)
    echo "usage: postgres.sh install | start DIR PORT | stop DIR" >&2
    exit 2
    ;;
esac
