#!/usr/bin/env bash
# make real-vllm: the router in front of real vLLM. vLLM 0.32's CPU build and a tiny
# random-weight Qwen3 (tests/vllm/setup.sh, cached under target/vllm), INSTANCES instances
# (two to a core) with 32-token blocks, prefix caching, KV events and a KV sized to a share
# of the workload's final contexts. Closed-loop coding-agent sessions (`prefix-router
# replay --synthetic agent`, contexts sized for CPU prefill) are replayed once per front
# and run: our policies, ours in vLLM mode (token mode on the model's own tokenizer and the
# engines' KV events), smg 1.13.0, vllm-router 0.1.17's cache_aware and its kv_aware on the
# same KV events. Every engine's prefix cache is emptied before each run. Each run starts one
# front later than the run before (the engines' speed drifts over a sitting, so no front
# always goes first). Prints one line per run; the reports (and our routers' /metrics) are
# kept in OUT.
#
# ENGINE=sim runs the same through `prefix-router sim` instances configured like the real
# fleet (block size, KV blocks, max-num-seqs, max-model-len, the model's tokenizer, KV
# events), fresh for every run, with SIM_ARGS for the timing and SPEEDUP (default 1) for
# the replay's and the simulators' clocks.
#
# Env: KV (shares of the sessions' final contexts the fleet's KV holds, a comma list;
# default 0.6,1.0,1.5), RUNS (1), FRONTS (default vllm-mode,kv_aware,cache_aware,
# prefill_aware,consistent_hash,round_robin,smg,vllm-router,vllm-router-kv; token-mode is
# ours on the model's tokens without KV events; POLICY@PATH, or vllm-mode@PATH, runs the
# router at PATH, shown by its file name),
# WORKLOAD (agent: 24 sessions over 4 prompts, 3.7K-33K tokens; shared: 32 sessions over 2
# long prompts), INSTANCES (4), MAX_NUM_SEQS (16), MAX_MODEL_LEN (32768:
# longer prompts get 400; at most the KV less a block), THINK (1 s), OUTPUT_SCALE (0.25: answers
# of 7-75 tokens, as a CPU decodes a token in tens of milliseconds), SESSIONS, SESSION_RATE,
# OUT (a directory for logs and reports; default a temporary one), ENGINE_PORTS (the
# engines' HTTP ports, a comma list, each with the next port free for its KV events;
# default free ones: `consistent_hash` hashes the backends' addresses, so a simulated
# fleet places as a real one did only on the same ports).
set -euo pipefail
cd "$(dirname "$0")/../.."
source benches/common.sh
bench_start
source benches/real_vllm/vllm.sh
instances="${INSTANCES:-4}"
IFS=, read -ra ports <<<"${ENGINE_PORTS:-}"
engine="${ENGINE:-vllm}"

set_workload "${WORKLOAD:-agent}"

start_engines() { # KV_BLOCKS MAX_MODEL_LEN: the instances, healthy; sets urls and events
  urls=(); events=()
  for i in $(seq 0 $((instances - 1))); do
    local p=${ports[$i]:-}; [ -n "$p" ] || p=$(free_pair)
    local dir="$out/engine-$i"
    local config="{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$((p + 1))\"}"
    if [ "$engine" = sim ]; then
      mkdir -p "$dir"
      "$bin" sim --count 1 --base-port "$p" --model tiny --tokenizer "$model" --block-tokens "$block" \
        --kv-blocks "$1" --max-model-len "$2" --max-num-seqs "${MAX_NUM_SEQS:-16}" \
        --kv-events-config "$config" --time-scale "${SPEEDUP:-1}" ${SIM_ARGS:-} >"$dir/log" 2>&1 &
    else
      VLLM_SERVER_DEV_MODE=1 serve_vllm "$dir" "$p" $((i % 2)) "$1" "$2" "${MAX_NUM_SEQS:-16}" \
        --enable-auto-tool-choice --tool-call-parser hermes --kv-events-config "$config"
    fi
    engine_pids+=($!)
    urls+=("http://127.0.0.1:$p"); events+=("tcp://127.0.0.1:$((p + 1))")
  done
  wait_healthy "${urls[@]}"
}

stop_engines() { # each engine's metrics kept in its log directory (its timing over the runs), then stopped
  local i; stops=$((stops + 1))
  for i in "${!urls[@]}"; do curl -s "${urls[$i]}/metrics" >"$out/engine-$i/metrics-$stops" || true; done
  for p in "${engine_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${engine_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  engine_pids=()
}
engine_pids=(); urls=(); stops=0
trap 'stop; stop_engines' EXIT

start_front() { # NAME: the front NAME in front of the engines; sets $port, $front_pid and, for ours, $admin
  admin=
  case $1 in
    vllm-mode) ROUTER_ARGS="--tokenizer $model --kv-events tcp://{host}:{port+1}" start_router kv_aware "${urls[@]}" ;;
    vllm-mode@*) ROUTER_BIN="${1#*@}" ROUTER_ARGS="--tokenizer $model --kv-events tcp://{host}:{port+1}" \
      start_router kv_aware "${urls[@]}" ;;
    token-mode) ROUTER_ARGS="--tokenizer $model" start_router kv_aware "${urls[@]}" ;;
    smg) start_peer smg "${urls[@]}" ;;
    vllm-router) start_peer vllm-router "${urls[@]}" ;;
    vllm-router-kv) start_vllm_router_kv ;;
    *@*) ROUTER_BIN="${1#*@}" start_router "${1%@*}" "${urls[@]}" ;;
    *) start_router "$1" "${urls[@]}" ;;
  esac
  front_pid=${pids[-1]}
}

start_vllm_router_kv() { # vllm-router's kv_aware, fed by every engine's KV events
  local exe sources=() i
  exe=$(peer_bin vllm-router)
  port=$(free_port)
  for i in "${!urls[@]}"; do sources+=(--kv-event-source "${urls[$i]}=${events[$i]}"); done
  VLLM_ROUTER_TOKENIZER="$model" "$exe" --host 127.0.0.1 --port "$port" --prometheus-port "$(free_port)" \
    --policy kv_aware --worker-urls "${urls[@]}" "${sources[@]}" --kv-event-block-size "$block" \
    --kv-event-model tiny >"$out/vllm-router-kv.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 600); do
    [ "$(curl -s "http://127.0.0.1:$port/list_workers" | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("urls", [])))' 2>/dev/null)" = "${#urls[@]}" ] && return 0
    sleep 0.1
  done
  echo "vllm-router did not register its backends" >&2; return 1
}

replay() { # NAME KV RUN: the workload through $port, one line
  local report="$out/${1//\//_}-$2-$3.json"
  "$bin" replay --url "http://127.0.0.1:$port" --synthetic agent "${workload[@]}" --speedup "${SPEEDUP:-1}" \
    --stream --quiet --backends "$instances" --concurrency 1024 --timeout 900 --model tiny \
    --backend-metrics "$(IFS=,; echo "${urls[*]}")" --out "$report" \
    --requests-out "${report%.json}.jsonl" >/dev/null
  [ -z "$admin" ] || curl -s "http://127.0.0.1:$admin/metrics" >"${report%.json}.metrics" || true
  local shown=$1; [[ $1 == *@* ]] && shown="${1%%@*}@${1##*/}"
  python3 - "$report" "$shown" "$2" "$3" "$(cpu_seconds "$front_pid")" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r.get("ttft_ms") or {}
q = r["requests"]
refused = sum(n for kind, n in q["errors"].items() if kind == "http_400")
shares = (r.get("backend_metrics") or {}).get("rows") or []
requests = "/".join(str(row.get("requests", 0)) for row in shares)
print(f"{sys.argv[2]:16} kv={sys.argv[3]} run={sys.argv[4]} hit={(r['hit_rate'] or 0):.3f} "
      f"ttft_p50={t.get('p50', 0) / 1000:.2f}s ttft_p99={t.get('p99', 0) / 1000:.2f}s "
      f"makespan={r['elapsed_s']:.1f}s ok={q['ok']} refused={refused} failed={q['failed'] - refused} "
      f"cpu={sys.argv[5]}s per-backend={requests} "
      f"{dict((k, v) for k, v in q['errors'].items() if k != 'http_400') or ''}", flush=True)
PY
}

read -r total largest < <(contexts)
echo "workload ${WORKLOAD:-agent}: final contexts $total tokens in all, the largest $largest; engine $engine x$instances"
IFS=, read -ra shares <<<"${KV:-0.6,1.0,1.5}"
IFS=, read -ra fronts <<<"${FRONTS:-vllm-mode,kv_aware,cache_aware,prefill_aware,consistent_hash,round_robin,smg,vllm-router,vllm-router-kv}"
for share in "${shares[@]}"; do
  blocks=$(python3 -c "import math; print(math.ceil($share * $total / $instances / $block))")
  len=$(( ${MAX_MODEL_LEN:-32768} < (blocks - 1) * block ? ${MAX_MODEL_LEN:-32768} : (blocks - 1) * block ))
  echo "KV ${share}x: $blocks blocks ($((blocks * block)) tokens) per instance, max-model-len $len"
  [ "$engine" = sim ] || { start_engines "$blocks" "$len"; warm_up "${urls[@]}"; }
  for run in $(seq 1 "${RUNS:-1}"); do
    for k in "${!fronts[@]}"; do
      front=${fronts[$(((k + run - 1) % ${#fronts[@]}))]}
      if [ "$engine" = sim ]; then start_engines "$blocks" "$len"; else reset_caches "${urls[@]}"; fi
      start_front "$front"
      replay "$front" "$share" "$run"
      stop
      [ "$engine" = sim ] && stop_engines
    done
  done
  stop_engines
done
