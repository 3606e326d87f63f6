#!/usr/bin/env bash
# Routing quality through Envoy, in real time: the agent workload (24 coding-agent
# sessions, streamed, 10x faster than their trace time) replayed through
#   router: the router alone (kv_aware) in front of 4 `prefix-router sim` backends, and
#   epp:    Envoy 1.40 (conf/envoy-epp.yaml, from tests/envoy/setup.sh) asking
#           `prefix-router epp` (kv_aware) in front of 4 such backends,
# on fresh backends each run, the two interleaved over ROUNDS rounds. Prints per run the hit
# rate the backends delivered (replay's, from each answer's usage), TTFT p50 and p99, the
# failed requests, and the router's or picker's own predicted and delivered hit rates
# (its /stats: delivered is what it saw of the usage, so a picker that saw no answer has
# none).
#
# Usage: benches/epp/quality.sh   Env: ROUNDS (3), SESSIONS (24), SPEEDUP (10), OUT (logs)
set -euo pipefail
cd "$(dirname "$0")/../.."
source benches/common.sh
bench_start
envoy=$(tests/envoy/setup.sh target/envoy | tail -1)
speedup="${SPEEDUP:-10}"

start_epp() { # the picker and Envoy in front of $urls; sets target and admin
  local grpc listen eadmin; grpc=$(free_port) admin=$(free_port) listen=$(free_port) eadmin=$(free_port)
  "$bin" epp --host 127.0.0.1 --grpc-port "$grpc" --admin-port "$admin" --policy kv_aware \
    --worker-urls "$(IFS=,; echo "${urls[*]}")" >"$out/epp-$grpc.log" 2>&1 &
  pids+=($!)
  sed -e "s/__LISTEN_PORT__/$listen/" -e "s/__EPP_PORT__/$grpc/" -e "s/__ADMIN_PORT__/$eadmin/" \
    conf/envoy-epp.yaml >"$out/envoy-$listen.yaml"
  "$envoy" -c "$out/envoy-$listen.yaml" --disable-hot-restart --concurrency 2 -l warn \
    >"$out/envoy-$listen.log" 2>&1 &
  pids+=($!)
  wait_ok "http://127.0.0.1:$admin/health"
  for _ in $(seq 1 300); do # until every backend is ready behind Envoy
    [ "$(curl -s "http://127.0.0.1:$admin/stats" | python3 -c \
      'import json,sys; print(sum(b["ready"] for b in json.load(sys.stdin)["backends"]))' 2>/dev/null)" = 4 ] &&
      [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$listen/health")" = 200 ] && break
    sleep 0.1
  done
  target="http://127.0.0.1:$listen"
}

summary() { # REPORT ADMIN: one line of figures
  python3 - "$1" "$(curl -s "$2/stats")" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); s = json.loads(sys.argv[2])
t = r["ttft_ms"] or {}
fmt = lambda x: "-" if x is None else f"{x:.3f}"
print(f"hit rate {fmt(r['hit_rate'])}  ttft p50 {t.get('p50', 0) / 1000:.3f} s  p99 {t.get('p99', 0) / 1000:.3f} s  "
      f"failed {r['requests']['failed']}  predicted {fmt(s.get('predicted_hit_rate'))}  "
      f"delivered (seen) {fmt(s.get('delivered_hit_rate'))}")
PY
}

for round in $(seq "${ROUNDS:-3}"); do
  for how in router epp; do
    start_sims
    if [ "$how" = router ]; then
      start_router kv_aware "${urls[@]}"; target="http://127.0.0.1:$port"
    else
      start_epp
    fi
    report="$out/$how-$round.json"
    "$bin" replay --url "$target" --synthetic agent --sessions "${SESSIONS:-24}" \
      --session-rate 2 --speedup "$speedup" --stream --quiet --backends 4 --concurrency 1024 \
      --timeout 600 --model meta-llama/Llama-3.1-8B-Instruct --out "$report" >/dev/null
    echo "$how round $round: $(summary "$report" "http://127.0.0.1:$admin")"
    stop
  done
done
