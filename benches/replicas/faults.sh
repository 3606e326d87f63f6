#!/usr/bin/env bash
# Router replicas under faults, in real time: 2 replicas of the router (kv_aware) sharing
# their conversation table through a redis-server, in front of 4 `prefix-router sim`
# backends, under the agent workload (24 coding-agent sessions, each turn sent to the
# replicas in turn, or through nginx).
#
#   redis:   Redis is killed at T1 seconds into the run and started again (same port) at T2.
#            Prints the hit rate of the requests answered before T1, between T1 and T2, and
#            after T2 (from the replicas' own /stats), and the failed requests; then the same
#            workload with Redis up throughout, as the baseline of each phase.
#   replica: the 2 replicas behind nginx (round robin); replica 2 is killed (SIGKILL) at T1.
#            Prints its requests in flight just before, and the requests that failed.
#
# Usage: benches/replicas/faults.sh [redis|replica]... (default both)
# Env: SESSIONS (24), SESSION_RATE (2 a second, before the speedup), SPEEDUP (10), T1 (15 s),
# T2 (30 s), RUNS (1), OUT (a directory for logs and reports).
set -euo pipefail
cd "$(dirname "$0")/../.."
source benches/common.sh
bench_start
speedup="${SPEEDUP:-10}" t1="${T1:-15}" t2="${T2:-30}"

start_redis() { # PORT
  redis-server --port "$1" --save '' --appendonly no >>"$out/redis.log" 2>&1 &
  redis_pid=$!
  pids+=($redis_pid)
  for _ in $(seq 1 100); do redis-cli -p "$1" ping >/dev/null 2>&1 && return; sleep 0.05; done
}

start_replicas() { # REDIS_PORT: 2 replicas; sets targets, admins, router_pids
  targets=() admins=() router_pids=()
  for _ in 1 2; do
    ROUTER_ARGS="--shared-table redis://127.0.0.1:$1" start_router kv_aware "${urls[@]}"
    targets+=("http://127.0.0.1:$port") admins+=("http://127.0.0.1:$admin")
    router_pids+=("${pids[-1]}")
  done
}

tokens() { # prompt and cached tokens the replicas' backends reported so far, summed
  for a in "${admins[@]}"; do curl -s "$a/stats"; echo; done | python3 -c '
import json, sys
p = c = 0
for line in sys.stdin:
    if line.strip():
        for b in json.loads(line)["backends"]:
            p += b["prompt_tokens"]; c += b["cached_tokens"]
print(p, c)'
}

replay() { # URL REPORT: the agent workload through URL (a comma list is used in turn)
  "$bin" replay --url "$1" --synthetic agent --sessions "${SESSIONS:-24}" \
    --session-rate "${SESSION_RATE:-2}" --speedup "$speedup" --stream --quiet \
    --backends 4 --concurrency 1024 --timeout 600 --model meta-llama/Llama-3.1-8B-Instruct \
    --out "$2" >/dev/null
}

failed() { python3 -c 'import json,sys; q=json.load(open(sys.argv[1]))["requests"]; print(q["failed"], q["errors"] or "")' "$1"; }

phase_rates() { # the three token samples, then the end: hit rate per phase
  python3 - "$@" <<'PY'
import sys
p = [int(x) for x in sys.argv[1::2]]
c = [int(x) for x in sys.argv[2::2]]
rate = lambda i: (c[i + 1] - c[i]) / max(1, p[i + 1] - p[i])
print(f"before {rate(0):.3f}  during {rate(1):.3f}  after {rate(2):.3f}  whole {c[3] / max(1, p[3]):.3f}")
PY
}

redis_run() { # OUTAGE (1 or 0), RUN
  start_sims
  local rport; rport=$(free_port)
  start_redis "$rport"
  start_replicas "$rport"
  local report="$out/redis-$1-$2.json"
  replay "$(IFS=,; echo "${targets[*]}")" "$report" &
  local replay_pid=$!
  sleep "$t1"; local s1; s1=$(tokens)
  [ "$1" = 1 ] && kill -9 "$redis_pid"
  sleep $((t2 - t1)); local s2; s2=$(tokens)
  [ "$1" = 1 ] && start_redis "$rport"
  wait "$replay_pid"
  local s3; s3=$(tokens)
  local label=baseline; [ "$1" = 1 ] && label="redis down ${t1}-${t2}s"
  # shellcheck disable=SC2086
  echo "$label run=$2: $(phase_rates 0 0 $s1 $s2 $s3) failed=$(failed "$report")"
  stop
}

replica_run() { # RUN
  start_sims
  local rport; rport=$(free_port)
  start_redis "$rport"
  start_replicas "$rport"
  local nport; nport=$(free_port)
  cat >"$out/nginx.conf" <<CONF
worker_processes 1;
master_process off;
pid $out/nginx.pid;
error_log $out/nginx-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  upstream replicas { server ${targets[0]#http://}; server ${targets[1]#http://}; keepalive 64; }
  server {
    listen 127.0.0.1:$nport;
    location / {
      proxy_pass http://replicas;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 600s;
    }
  }
}
CONF
  nginx -c "$out/nginx.conf" -p "$out" &
  pids+=($!)
  wait_ok "http://127.0.0.1:$nport/health"
  local report="$out/replica-$1.json"
  replay "http://127.0.0.1:$nport" "$report" &
  local replay_pid=$!
  sleep "$t1"
  local inflight
  inflight=$(curl -s "${admins[1]}/metrics" | awk '/^prefix_router_inflight_requests/ {n += $2} END {print n + 0}')
  kill -9 "${router_pids[1]}"
  wait "$replay_pid"
  echo "replica killed at ${t1}s run=$1: in flight on it just before: $inflight; failed=$(failed "$report")"
  stop
}

for what in "${@:-redis replica}"; do
  for w in $what; do
    for run in $(seq 1 "${RUNS:-1}"); do
      case $w in
        redis) redis_run 1 "$run"; redis_run 0 "$run" ;;
        replica) replica_run "$run" ;;
        *) echo "unknown: $w (redis or replica)" >&2; exit 2 ;;
      esac
    done
  done
done
