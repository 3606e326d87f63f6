#!/usr/bin/env bash
# aiperf (NVIDIA's benchmark client, from PyPI) and `prefix-router replay` on the same Mooncake
# trace, each against a fresh router (defaults) in front of fresh simulated backends, one after
# the other in one run; prints TTFT, throughput and prefix-cache hits as each tool reports them.
#
# Env: TRACE (default ../shared/traces/conversation_trace.jsonl), REQUESTS (first lines of it,
# default 200), BACKENDS (default 4), AIPERF_VERSION (default 0.13.0), OUT (default
# target/aiperf). Installs aiperf into target/aiperf-venv and builds a local tokenizer (no
# Hugging Face hub access needed: see make_tokenizer.py).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
trace="${TRACE:-$root/../shared/traces/conversation_trace.jsonl}"
requests="${REQUESTS:-200}"
backends="${BACKENDS:-4}"
version="${AIPERF_VERSION:-0.13.0}"
out="${OUT:-$root/target/aiperf}"
venv="$root/target/aiperf-venv"
bin="$root/target/release/prefix-router"
mkdir -p "$out"
export HF_HOME="$out/hf-home" HF_HUB_OFFLINE=1

[ -x "$venv/bin/aiperf" ] || { python3 -m venv "$venv" && timeout 900 "$venv/bin/pip" install --quiet "aiperf==$version"; }
[ -d "$HF_HOME/hub/models--local--sim-tokenizer" ] || "$venv/bin/python" "$here/make_tokenizer.py" "$HF_HOME"
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p prefix-router-cli
head -n "$requests" "$trace" > "$out/workload.jsonl"

free() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
stop() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=(); }
trap stop EXIT
# Starts $backends sims and the router on its defaults; sets $url and $admin.
start() {
  local urls=() port
  for i in $(seq "$backends"); do
    port=$(free)
    RUST_LOG=warn "$bin" sim --base-port "$port" --name "sim$i" >/dev/null 2>&1 & pids+=($!)
    urls+=("http://127.0.0.1:$port")
  done
  local rp ap; rp=$(free); ap=$(free)
  RUST_LOG=warn "$bin" --host 127.0.0.1 --port "$rp" --admin-port "$ap" --upgrade-socket "$out/upgrade-$rp.sock" \
    --worker-urls "$(IFS=,; echo "${urls[*]}")" >"$out/router-$1.log" 2>&1 & pids+=($!)
  url="http://127.0.0.1:$rp" admin="http://127.0.0.1:$ap"
  for _ in $(seq 100); do curl -sf -o /dev/null "$url/v1/models" && return; sleep 0.2; done
  echo "the router did not start" >&2; exit 1
}
# Prompt and cached tokens the backends reported, from the router's metrics.
tokens() {
  curl -s "$admin/metrics" | awk '/^prefix_router_backend_(prompt|cached)_tokens_total/ {split($1,a,"{"); s[a[1]]+=$2}
    END {printf "router saw: prompt %d cached %d tokens (%.1f%%)\n", s["prefix_router_backend_prompt_tokens_total"], s["prefix_router_backend_cached_tokens_total"], 100*s["prefix_router_backend_cached_tokens_total"]/s["prefix_router_backend_prompt_tokens_total"]}'
}

start aiperf
rm -rf "$out/aiperf-artifacts"
"$venv/bin/aiperf" profile --model meta-llama/Llama-3.1-8B-Instruct --url "$url" --endpoint-type chat \
  --streaming --input-file "$out/workload.jsonl" --custom-dataset-type mooncake_trace --fixed-schedule \
  --tokenizer local/sim-tokenizer --use-server-token-count --server-metrics "$admin/metrics" \
  --artifact-dir "$out/aiperf-artifacts" --ui none > "$out/aiperf.log" 2>&1 || { tail -30 "$out/aiperf.log"; exit 1; }
aiperf_tokens=$(tokens)
stop

start replay
"$bin" replay --url "$url" --trace "$out/workload.jsonl" --stream --quiet --out "$out/replay.json" > "$out/replay.txt"
replay_tokens=$(tokens)
stop

"$venv/bin/python" - "$out" "$aiperf_tokens" "$replay_tokens" <<'PY'
import json, sys
out, at, rt = sys.argv[1:4]
a = json.load(open(f"{out}/aiperf-artifacts/profile_export_aiperf.json"))
r = json.load(open(f"{out}/replay.json"))
t, dur = a["time_to_first_token"], a["benchmark_duration"]["avg"]
print(f"{'tool':<8} {'ok':>5} {'TTFT p50':>9} {'TTFT p90':>9} {'TTFT p99':>9} {'req/s':>7} {'out tok/s':>9} {'prompt tok (client)':>20}")
print(f"{'aiperf':<8} {a['request_count']['avg']:>5.0f} {t['p50']:>7.0f}ms {t['p90']:>7.0f}ms {t['p99']:>7.0f}ms "
      f"{a['request_throughput']['avg']:>7.2f} {a['output_token_throughput']['avg']:>9.0f} {a['total_isl']['avg']:>20,.0f}")
rt_ms, th = r["ttft_ms"], r["throughput"]
print(f"{'replay':<8} {r['requests']['ok']:>5} {rt_ms['p50']:>7.0f}ms {rt_ms['p90']:>7.0f}ms {rt_ms['p99']:>7.0f}ms "
      f"{th['requests_per_s']:>7.2f} {th['completion_tokens_per_s']:>9.0f} {r['tokens']['prompt']:>20,}")
print(f"aiperf: {at}; its own cache-read share {a['overall_usage_prompt_cache_read_pct']['avg']:.1f}%, {a['error_request_count']['avg'] if a.get('error_request_count') else 0:.0f} errors")
print(f"replay: {rt}; its own hit rate {100 * r['hit_rate']:.1f}%")
PY
