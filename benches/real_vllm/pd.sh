#!/usr/bin/env bash
# make real-vllm PD=1: prefill/decode disaggregation on real vLLM's CPU build. One prefill
# and one decode instance (one a core) share vLLM's ExampleConnector folder (each saves the
# KV of the prompts it computes there and loads what a prompt finds there). The agent
# sessions of benches/real_vllm/run.sh go through each front:
#   pd             ours with `--prefill` and `--decode`, in vLLM mode (the model's tokens and
#                  the engines' KV events), skipping the prefill leg as it decides;
#   pd-always      the same, with max_local_prefill_length 0: every request in two legs;
#   pd-always-text the same in text mode (no tokenizer, no KV events);
#   whole          ours with both instances as a plain fleet (no legs);
#   vllm-router-pd vllm-router 0.1.17's PD mode (--vllm-pd-disaggregation, cache_aware).
# Prompts are computed in one step (--max-num-batched-tokens = max-model-len): the
# connector is wrong on a chunked prompt. Before each run both prefix caches and the
# connector's folder are emptied. One line per run: the prefill instance's own hit rate
# (its prefix cache's hits over its lookups; the client's `cached_tokens` counts what the
# decode instance loaded), the decode instance's, TTFT, makespan, the router's CPU,
# failures, the requests each instance served, and how our router sent them (`split`: two
# legs, `local`: whole to the decode instance). Each instance's /metrics before and after
# each run are kept in OUT (its own TTFT, queue and prefill times; what the decode instance
# loaded in `external_prefix_cache_hits`, or pulled in `nixl_xfer_time_seconds_count`).
#
# CONNECTOR=nixl runs vLLM's NixlConnector instead, host buffers on the CPU (the prefill
# instance a producer, the decode instance a consumer pulling the blocks the prefill answer
# names; needs `nixl` in vLLM's venv, which tests/vllm/setup.sh installs).
#
# Env: KV (1.0: the share of the workload's final contexts each instance's KV holds),
# FRONTS (pd,pd-always,whole,vllm-router-pd), RUNS (1), MAX_NUM_SEQS (16), SESSIONS (24),
# THINK (1 s), OUTPUT_SCALE (0.25), OUT (a directory for logs and reports).
set -euo pipefail
cd "$(dirname "$0")/../.."
source benches/common.sh
bench_start
source benches/real_vllm/vllm.sh

set_workload agent
store="$out/kv-store"
len=32768

engine_pids=()
connector() { # ROLE: the instance's --kv-transfer-config for $CONNECTOR
  case ${CONNECTOR:-example} in
    example) echo "{\"kv_connector\":\"ExampleConnector\",\"kv_role\":\"kv_both\",\"kv_connector_extra_config\":{\"shared_storage_path\":\"$store\"}}" ;;
    nixl) local role=kv_producer; [ "$1" = decode ] && role=kv_consumer
      echo "{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"$role\",\"kv_buffer_device\":\"cpu\"}" ;;
    *) echo "unknown CONNECTOR $CONNECTOR" >&2; exit 1 ;;
  esac
}
start_engines() { # KV_BLOCKS: the prefill instance on core 0 and the decode instance on core 1; sets prefill, decode
  local blocks=$1 p
  mkdir -p "$store"
  local events='{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:PORT"}'
  local role core=0
  for role in prefill decode; do
    p=$(free_pair)
    VLLM_SERVER_DEV_MODE=1 VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_NIXL_SIDE_CHANNEL_PORT=$(free_port) \
      serve_vllm "$out/$role" "$p" "$core" "$blocks" "$len" "${MAX_NUM_SEQS:-16}" \
      --kv-transfer-config "$(connector $role)" --max-num-batched-tokens "$len" \
      --enable-auto-tool-choice --tool-call-parser hermes --kv-events-config "${events/PORT/$((p + 1))}"
    engine_pids+=($!)
    printf -v "$role" 'http://127.0.0.1:%s' "$p"
    core=$((core + 1))
  done
  wait_healthy "$prefill" "$decode"
}
trap 'stop; for e in "${engine_pids[@]}"; do kill "$e" 2>/dev/null || true; done' EXIT

engine_metrics() { # RUN WHEN: each instance's /metrics kept in OUT (the difference is one run's)
  curl -s "$prefill/metrics" >"$out/$1.prefill.$2" || true
  curl -s "$decode/metrics" >"$out/$1.decode.$2" || true
}

fresh() { # both prefix caches emptied, and the example connector's folder
  reset_caches "$prefill" "$decode"
  find "$store" -mindepth 1 -delete
}

start_vllm_router_pd() { # vllm-router 0.1.17's PD mode; sets $port
  local exe; exe=$(peer_bin vllm-router)
  port=$(free_port); admin=
  "$exe" --host 127.0.0.1 --port "$port" --prometheus-port "$(free_port)" --policy cache_aware \
    --vllm-pd-disaggregation --prefill "$prefill" --decode "$decode" >"$out/vllm-router-pd.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 600); do
    curl -sf -o /dev/null "http://127.0.0.1:$port/health" && return 0
    sleep 0.1
  done
  echo "vllm-router did not start" >&2; return 1
}

start_front() { # NAME: sets $port, and $admin for ours
  local mode="--tokenizer $model --kv-events tcp://{host}:{port+1}" pair="--prefill $prefill --decode $decode"
  case $1 in
    pd) BACKENDS=2 ROUTER_ARGS="$mode $pair" start_router kv_aware ;;
    pd-always) BACKENDS=2 ROUTER_ARGS="$mode $pair --max-local-prefill-length 0" start_router kv_aware ;;
    pd-always-text) BACKENDS=2 ROUTER_ARGS="$pair --max-local-prefill-length 0" start_router kv_aware ;;
    whole) ROUTER_ARGS="$mode" start_router kv_aware "$prefill" "$decode" ;;
    vllm-router-pd) start_vllm_router_pd ;;
    *) echo "unknown front $1" >&2; return 1 ;;
  esac
  front_pid=${pids[-1]}
}

replay() { # NAME RUN: the workload through $port, one line
  local report="$out/$1-$2.json" ways=""
  "$bin" replay --url "http://127.0.0.1:$port" --synthetic agent "${workload[@]}" \
    --stream --quiet --backends 2 --concurrency 1024 --timeout 900 --model tiny \
    --backend-metrics "$prefill,$decode" --out "$report" --requests-out "${report%.json}.jsonl" >/dev/null
  if [ -n "$admin" ]; then
    curl -s "http://127.0.0.1:$admin/metrics" >"${report%.json}.metrics" || true
    ways=$(grep '^prefix_router_disaggregated_total' "${report%.json}.metrics" | sed -E 's/.*way="([a-z]+)"} ([0-9]+)/\1=\2/' | tr '\n' ' ')
  fi
  python3 - "$report" "$1" "$2" "$ways" "$(cpu_seconds "$front_pid")" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r.get("ttft_ms") or {}
q = r["requests"]
rows = (r.get("backend_metrics") or {}).get("rows") or []
own = "/".join(f"{row['hit_rate']:.3f}" if row.get("hit_rate") is not None else "-" for row in rows)
served = "/".join(str(row["requests"]) for row in rows)
print(f"{sys.argv[2]:15} run={sys.argv[3]} prefill/decode_hit={own} client_hit={(r['hit_rate'] or 0):.3f} "
      f"ttft_p50={t.get('p50', 0) / 1000:.2f}s ttft_p99={t.get('p99', 0) / 1000:.2f}s "
      f"makespan={r['elapsed_s']:.1f}s ok={q['ok']} failed={q['failed']} prefill/decode_requests={served} "
      f"cpu={sys.argv[5]}s {q['errors'] or ''} {sys.argv[4]}",
      flush=True)
PY
}

read -r total _ < <(contexts)
blocks=$(python3 -c "import math; print(max(math.ceil(${KV:-1.0} * $total / $block), $len // $block + 1))")
echo "workload agent: final contexts $total tokens; KV ${KV:-1.0}x: $blocks blocks an instance; 1 prefill, 1 decode"
start_engines "$blocks"
warm_up "$prefill"; warm_up "$decode" # one at a time: the example connector fails (its engine
# stops) on a prompt the other instance is still writing
IFS=, read -ra fronts <<<"${FRONTS:-pd,pd-always,whole,vllm-router-pd}"
for run in $(seq 1 "${RUNS:-1}"); do
  for k in "${!fronts[@]}"; do # each run starts one front later, as in run.sh
    front=${fronts[$(((k + run - 1) % ${#fronts[@]}))]}
    fresh
    engine_metrics "$front-$run" before
    start_front "$front"
    replay "$front" "$run"
    engine_metrics "$front-$run" after
    stop
  done
done
