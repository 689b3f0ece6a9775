#!/usr/bin/env bash
# MySQL's protocol for tests: MariaDB from Debian's packages (Debian ships no MySQL server),
# an operator's SQL catalog (pyiceberg's SqlCatalog, Iceberg's JdbcCatalog) kept in a real
# server. Data lives in the folder given; stop removes it. The server takes password logins
# on loopback only, as user `bulldozer` into database `catalog`; the password is in
# DIR/password.
#
#   mysql.sh install
#   mysql.sh start DIR PORT     # on 127.0.0.1:PORT
#   mysql.sh stop DIR           # the server started in DIR, then DIR is removed
set -euo pipefail

log() { echo "mysql.sh: $*" >&2; }
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"

have_mariadb() { command -v mariadbd >/dev/null 2>&1 && command -v mariadb-install-db >/dev/null 2>&1; }

install() {
  have_mariadb || with_lock apt install_once
}

install_once() {
  have_mariadb && return 0 # installed by the process this one waited for
  log "installing mariadb-server from Debian's packages"
  apt_install --no-install-recommends mariadb-server
  # the package enables a system server on 3306; the project starts its own servers
  if command -v systemctl >/dev/null 2>&1; then systemctl disable --now mariadb >/dev/null 2>&1 || true; fi
  if command -v service >/dev/null 2>&1; then service mariadb stop >/dev/null 2>&1 || true; fi # no systemd
}

start() { # DIR PORT
  local dir=$1 port=$2 user
  user=$(id -un) # as root, the server runs as root (it refuses to unless told so)
  mkdir -p "$dir"
  head -c 18 /dev/urandom | base64 | tr '+/' '-_' >"$dir/password"
  mariadb-install-db --no-defaults --datadir="$dir/data" --user="$user" --auth-root-authentication-method=socket \
    --skip-test-db >"$dir/install.log" 2>&1 || { log "mariadb-install-db failed (see $dir/install.log)"; return 1; }
  nohup mariadbd --no-defaults --datadir="$dir/data" --user="$user" --bind-address=127.0.0.1 --port="$port" \
    --socket="$dir/server.sock" --pid-file="$dir/server.pid" --skip-log-bin --innodb-flush-log-at-trx-commit=0 \
    --innodb-buffer-pool-size=64M --log-error="$dir/server.log" >/dev/null 2>&1 </dev/null &
  for _ in $(seq 1 300); do
    if mariadb-admin --no-defaults --socket="$dir/server.sock" -u root ping >/dev/null 2>&1; then break; fi
    sleep 0.1
  done
  mariadb --no-defaults --socket="$dir/server.sock" -u root -e "
    CREATE DATABASE catalog;
    CREATE USER 'bulldozer'@'127.0.0.1' IDENTIFIED BY '$(cat "$dir/password")';
    GRANT ALL ON catalog.* TO 'bulldozer'@'127.0.0.1';" \
    || { log "the server did not start (see $dir/server.log)"; return 1; }
  log "server on 127.0.0.1:$port (user bulldozer, database catalog)"
}

case "${1:-}" in
  install) install ;;
  start)
    install
    start "$2" "$3"
    ;;
  stop)
    stop_pid "$2/server.pid" 300
    rm -rf "$2"
    ;;
  *)
    echo "usage: mysql.sh install | start DIR PORT | stop DIR" >&2
    exit 2
    ;;
esac
