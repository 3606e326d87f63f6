#!/usr/bin/env bash
# A fleet under KV pressure, in real time: heavy-tailed coding-agent sessions whose live
# contexts add up to more than the fleet's KV, closed loop (each turn THINK seconds after
# the previous answer, before the speedup), all started within a few seconds, in front of
# 4 `prefix-router sim` backends (--time-scale SPEEDUP) that refuse prompts over
# MAX_MODEL_LEN tokens with 400, as vLLM does. Fresh backends for every run. Prints one
# line per run: hit rate, TTFT p50/p99, makespan (first send to last answer), refusals.
#
# Env: KV (KV per backend in tokens, a comma list; default 480000,512000,576000),
# MAX_MODEL_LEN (500000), RUNS (3), POLICIES (default cache_aware,prefill_aware,kv_aware;
# POLICY@PATH runs the router at PATH, another build, with that policy),
# PEERS (default smg,vllm-router; empty for none), SESSIONS (24), MIN_CONTEXT (20000),
# MAX_CONTEXT (520000), SESSION_RATE (4.8 a second), SYSTEM_PROMPTS (4), THINK (4 s),
# OVERLAP (0: share of turns sent before the previous answer), REPLICAS (1: router
# replicas sharing their table through a redis-server started here, requests spread over
# them in turn; peers run as one instance per replica, smg without sharing),
# SPEEDUP (20), API (the path requests go to: /v1/chat/completions, or /v1/messages for the
# same conversations as Anthropic Messages requests), OUT (a directory to keep the reports
# in; default a temporary one).
set -euo pipefail
cd "$(dirname "$0")/../.."
source benches/common.sh
bench_start
speedup="${SPEEDUP:-20}"
replicas="${REPLICAS:-1}"

start_sims() { # KV_TOKENS: 4 fresh simulated vLLM backends; sets urls
  urls=()
  for i in 0 1 2 3; do
    local p; p=$(free_port)
    "$bin" sim --count 1 --base-port "$p" --time-scale "$speedup" --kv-blocks $(($1 / 16)) \
      --max-model-len "${MAX_MODEL_LEN:-500000}" >"$out/sim-$i.log" 2>&1 &
    pids+=($!)
    urls+=("http://127.0.0.1:$p")
  done
  for u in "${urls[@]}"; do wait_ok "$u/health"; done
}

start_front() { # NAME: the router policy or peer NAME, $replicas times; sets targets
  local targets_list=() shared=""
  if [ "$replicas" -gt 1 ] && [[ $1 != smg && $1 != vllm-router ]]; then
    local rport; rport=$(free_port)
    redis-server --port "$rport" --save '' --appendonly no >"$out/redis.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
    shared="--shared-table redis://127.0.0.1:$rport"
  fi
  for _ in $(seq 1 "$replicas"); do
    case $1 in
      smg | vllm-router) start_peer "$1" "${urls[@]}" ;;
      *@*) ROUTER_BIN="${1#*@}" ROUTER_ARGS="$shared" start_router "${1%@*}" "${urls[@]}" ;;
      *) ROUTER_ARGS="$shared" start_router "$1" "${urls[@]}" ;;
    esac
    targets_list+=("http://127.0.0.1:$port")
  done
  targets=$(IFS=,; echo "${targets_list[*]}")
}

replay() { # NAME KV RUN: the workload through $targets, one line
  local report="$out/${1//\//_}-$2-$3.json"
  "$bin" replay --url "$targets" --path "${API:-/v1/chat/completions}" --synthetic agent --sessions "${SESSIONS:-24}" \
    --session-rate "${SESSION_RATE:-4.8}" --system-prompts "${SYSTEM_PROMPTS:-4}" \
    --min-context-tokens "${MIN_CONTEXT:-20000}" --max-context-tokens "${MAX_CONTEXT:-520000}" \
    --think-min "${THINK:-4}" --think-max "${THINK:-4}" --overlap "${OVERLAP:-0}" \
    --speedup "$speedup" --stream --quiet --backends 4 --concurrency 1024 --timeout 600 \
    --model meta-llama/Llama-3.1-8B-Instruct \
    --out "$report" >/dev/null
  python3 - "$report" "${1/@*/@other}" "$2" "$3" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r.get("ttft_ms") or {}
q = r["requests"]
print(f"{sys.argv[2]:16} kv={sys.argv[3]} run={sys.argv[4]} hit={(r['hit_rate'] or 0):.3f} "
      f"ttft_p50={t.get('p50', 0) / 1000:.3f}s ttft_p99={t.get('p99', 0) / 1000:.3f}s "
      f"makespan={r['elapsed_s']:.1f}s ok={q['ok']} failed={q['failed']} {q['errors'] or ''}", flush=True)
PY
}

IFS=, read -ra kvs <<<"${KV:-480000,512000,576000}"
IFS=, read -ra fronts <<<"${POLICIES-cache_aware,prefill_aware,kv_aware}${PEERS+,}${PEERS-,smg,vllm-router}"
for kv in "${kvs[@]}"; do
  for run in $(seq 1 "${RUNS:-3}"); do
    for front in "${fronts[@]}"; do
      [ -n "$front" ] || continue
      start_sims "$kv"
      start_front "$front"
      replay "$front" "$kv" "$run"
      stop
    done
  done
done
