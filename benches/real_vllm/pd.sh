#!/usr/bin/env bash
# make real-vllm PD=1: prefill/decode disaggregation on real vLLM's CPU build. One prefill
# and one decode instance (one a core) share vLLM's ExampleConnector folder (each saves the
# KV of the prompts it computes there and loads what a prompt finds there). The agent
# sessions of benches/real_vllm/run.sh go through each front:
#   pd             ours with `--prefill` and `--decode`, in vLLM mode (the model's tokens and
#                  the engines' KV events), skipping the prefill leg as it decides;
#   pd-always      the same, with max_local_prefill_length 0: every request in two legs;
#   whole          ours with both instances as a plain fleet (no legs);
#   vllm-router-pd vllm-router 0.1.17's PD mode (--vllm-pd-disaggregation, cache_aware).
# Prompts are computed in one step (--max-num-batched-tokens = max-model-len): the
# connector is wrong on a chunked prompt. Before each run both prefix caches and the
# connector's folder are emptied. One line per run: the prefill instance's own hit rate
# (its prefix cache's hits over its lookups; the client's `cached_tokens` counts what the
# decode instance loaded), the decode instance's, TTFT, makespan, failures, the requests
# each instance served, and how our router sent them (`split`: two legs, `local`: whole
# to the decode instance).
#
# Env: KV (1.0: the share of the workload's final contexts each instance's KV holds),
# FRONTS (pd,pd-always,whole,vllm-router-pd), RUNS (1), MAX_NUM_SEQS (16), THINK (1 s),
# OUTPUT_SCALE (0.25), OUT (a directory for logs and reports).
set -euo pipefail
cd "$(dirname "$0")/../.."
source benches/common.sh
bench_start
source benches/real_vllm/vllm.sh

workload=(--sessions 24 --system-prompts 4 --prompt-scale 0.15 --message-scale 1.5
  --min-context-tokens 2500 --max-context-tokens 20000 --output-scale "${OUTPUT_SCALE:-0.25}"
  --session-rate 2 --think-min "${THINK:-1}" --think-max "${THINK:-1}")
store="$out/kv-store"
len=32768

contexts() { # the workload's final contexts in the model's tokens, summed
  local p; p=$(free_port)
  "$bin" sim --count 1 --base-port "$p" --model tiny --tokenizer "$model" --kv-blocks 10000000 \
    --max-model-len 10000000 --time-scale 100 >"$out/contexts-sim.log" 2>&1 &
  local sim=$!
  wait_ok "http://127.0.0.1:$p/health"
  "$bin" replay --url "http://127.0.0.1:$p" --synthetic agent "${workload[@]}" --speedup 100 \
    --model tiny --stream --quiet --requests-out "$out/contexts.jsonl" >/dev/null
  kill "$sim"; wait "$sim" 2>/dev/null || true
  python3 - "$out/contexts.jsonl" <<'PY'
import json, sys
final = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    final[r["session"]] = max(final.get(r["session"], 0), r["prompt_tokens"] or 0)
print(sum(final.values()))
PY
}

engine_pids=()
start_engines() { # KV_BLOCKS: the prefill instance on core 0 and the decode instance on core 1; sets prefill, decode
  local blocks=$1 config p q
  mkdir -p "$store"
  config="{\"kv_connector\":\"ExampleConnector\",\"kv_role\":\"kv_both\",\"kv_connector_extra_config\":{\"shared_storage_path\":\"$store\"}}"
  local events='{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:PORT"}'
  p=$(free_pair); q=$(free_pair)
  VLLM_SERVER_DEV_MODE=1 serve_vllm "$out/prefill" "$p" 0 "$blocks" "$len" "${MAX_NUM_SEQS:-16}" \
    --kv-transfer-config "$config" --max-num-batched-tokens "$len" \
    --enable-auto-tool-choice --tool-call-parser hermes --kv-events-config "${events/PORT/$((p + 1))}"
  engine_pids+=($!)
  VLLM_SERVER_DEV_MODE=1 serve_vllm "$out/decode" "$q" 1 "$blocks" "$len" "${MAX_NUM_SEQS:-16}" \
    --kv-transfer-config "$config" --max-num-batched-tokens "$len" \
    --enable-auto-tool-choice --tool-call-parser hermes --kv-events-config "${events/PORT/$((q + 1))}"
  engine_pids+=($!)
  prefill="http://127.0.0.1:$p"; decode="http://127.0.0.1:$q"
  wait_healthy "$prefill" "$decode"
}
trap 'stop; for e in "${engine_pids[@]}"; do kill "$e" 2>/dev/null || true; done' EXIT

free_pair() { # a free port P with P+1 free too (vLLM's HTTP port and its KV events')
  python3 -c 'import socket
while True:
    a = socket.socket(); a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]
    try:
        b = socket.socket(); b.bind(("0.0.0.0", p + 1)); b.close(); a.close(); print(p); break
    except OSError:
        a.close()'
}

fresh() { # both prefix caches emptied, and the connector's folder
  local u
  for u in "$prefill" "$decode"; do
    for _ in $(seq 1 50); do
      [ "$(curl -s -X POST "$u/reset_prefix_cache")" = '{"success":true}' ] && break
      sleep 0.2
    done
  done
  find "$store" -mindepth 1 -delete
}

start_ours() { # [FLAG...]: ours in vLLM mode in front of the pair; sets $port, $admin
  port=$(free_port); admin=$(free_port)
  "$bin" --host 127.0.0.1 --port "$port" --admin-port "$admin" --policy kv_aware \
    --tokenizer "$model" --kv-events 'tcp://{host}:{port+1}' "$@" >"$out/router-$port.log" 2>&1 &
  pids+=($!)
  wait_ok "http://127.0.0.1:$admin/health"
  for _ in $(seq 1 300); do
    ready=$(curl -s "http://127.0.0.1:$admin/stats" | python3 -c \
      'import json,sys; print(sum(b["ready"] for b in json.load(sys.stdin)["backends"]))' || echo 0)
    [ "$ready" = 2 ] && return 0
    sleep 0.1
  done
  echo "the router's backends did not become ready" >&2; return 1
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

start_front() { # NAME
  case $1 in
    pd) start_ours --prefill "$prefill" --decode "$decode" ;;
    pd-always) start_ours --prefill "$prefill" --decode "$decode" --max-local-prefill-length 0 ;;
    whole) start_ours --worker-urls "$prefill,$decode" ;;
    vllm-router-pd) start_vllm_router_pd ;;
    *) echo "unknown front $1" >&2; return 1 ;;
  esac
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
  python3 - "$report" "$1" "$2" "$ways" <<'PY'
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
      f"{q['errors'] or ''} {sys.argv[4]}",
      flush=True)
PY
}

total=$(contexts)
blocks=$(python3 -c "import math; print(max(math.ceil(${KV:-1.0} * $total / $block), $len // $block + 1))")
echo "workload agent: final contexts $total tokens; KV ${KV:-1.0}x: $blocks blocks an instance; 1 prefill, 1 decode"
start_engines "$blocks"
IFS=, read -ra fronts <<<"${FRONTS:-pd,pd-always,whole,vllm-router-pd}"
for run in $(seq 1 "${RUNS:-1}"); do
  for front in "${fronts[@]}"; do
    fresh
    start_front "$front"
    replay "$front" "$run"
    stop
  done
done
