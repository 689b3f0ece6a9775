#!/usr/bin/env bash
# Redis 7 for tests and benchmarks, from Debian's packages: install, start (standalone or a
# three-master cluster on loopback), stop. Data lives in the folder given; stop removes it.
#
#   redis.sh install
#   redis.sh start DIR PORT              # standalone on 127.0.0.1:PORT
#   redis.sh start-cluster DIR PORT      # masters on PORT, PORT+1, PORT+2 (slots split 3 ways)
#   redis.sh stop DIR                    # every server started in DIR, then DIR is removed
set -euo pipefail

log() { echo "redis.sh: $*" >&2; }
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"

have_redis() { command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; }

install() {
  have_redis || with_lock apt install_once
}

install_once() {
  have_redis && return 0 # installed by the process this one waited for
  log "installing redis-server from Debian's packages"
  apt_install redis-server
  # the package enables a system service on 6379; the project starts its own servers
  if command -v systemctl >/dev/null 2>&1; then systemctl disable --now redis-server >/dev/null 2>&1 || true; fi
}

wait_ping() { # PORT
  for _ in $(seq 1 200); do
    if redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null | grep -q PONG; then return 0; fi
    sleep 0.05
  done
  log "redis on 127.0.0.1:$1 did not answer within 10 s"
  return 1
}

start_one() { # DIR PORT [extra args...]
  local dir=$1 port=$2
  shift 2
  mkdir -p "$dir/$port"
  redis-server --bind 127.0.0.1 --port "$port" --dir "$dir/$port" --daemonize yes \
    --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log" \
    --save "" --appendonly no --protected-mode yes --lazyfree-lazy-user-del yes "$@"
  wait_ping "$port"
}

case "${1:-}" in
  install) install ;;
  start)
    install
    start_one "$2" "$3"
    log "standalone server on 127.0.0.1:$3"
    ;;
  start-cluster)
    install
    dir=$2 port=$3
    nodes=()
    for p in "$port" $((port + 1)) $((port + 2)); do
      start_one "$dir" "$p" --cluster-enabled yes --cluster-config-file "$dir/$p/nodes.conf" --cluster-node-timeout 5000
      nodes+=("127.0.0.1:$p")
    done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1
    # every node, not the first alone: a node that has not yet seen the others' slots (or is
    # in its first seconds as a master) answers CLUSTERDOWN, and on a busy machine a client
    # starting at once met that
    deadline=$((SECONDS + 20))
    while [ "$SECONDS" -lt "$deadline" ]; do
      ok=0
      for p in "$port" $((port + 1)) $((port + 2)); do
        if redis-cli -p "$p" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; then ok=$((ok + 1)); fi
      done
      if [ "$ok" = 3 ]; then
        log "cluster of 3 masters on 127.0.0.1:$port-$((port + 2))"
        exit 0
      fi
      sleep 0.05
    done
    log "the cluster did not reach state ok on every node within 20 s (see $dir/create.log)"
    exit 1
    ;;
  stop)
    dir=$2
    pids=()
    for pidfile in "$dir"/*/redis.pid; do
      [ -f "$pidfile" ] && pids+=("$(cat "$pidfile")")
    done
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    done
    rm -rf "$dir"
    ;;
  *)
    sed -n '2,9p' "$0" >&2
    exit 2
    ;;
esac
