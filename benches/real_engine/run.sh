#!/usr/bin/env bash
# make real-engine: the router in front of a real engine. Builds llama.cpp's llama-server
# and a tiny model with Qwen3's tokenizer (build.sh, cached under target/real-engine),
# starts 4 llama-server instances (4 slots each, prompt cache in RAM, metrics on) and,
# once per policy and run, the router in front of fresh servers; replays a multi-turn agent
# workload sized for CPU prefill with `prefix-router replay`, which reads cached_tokens
# from llama.cpp's own responses. Then the same through the peers, each in a venv of its own
# under target/peers: smg 1.13.0 and vllm-router 0.1.17, both with their default policy,
# cache_aware (vllm-router's kv_aware needs KV events, which llama.cpp does not publish).
# Prints one line per run.
# Env: POLICIES (default round_robin,consistent_hash,cache_aware,kv_aware), RUNS (3),
# PEERS (default smg,vllm-router; empty for none),
# SESSIONS (12), MAX_CONTEXT (5000 tokens of the replay at 4 bytes each; Qwen3 counts more),
# MESSAGE_SCALE (0.2: messages a fifth of the agent default),
# MAX_REQUESTS (240), SPEEDUP (10), CONTEXT (each server's context, 4 slots; 196608).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
policies="${POLICIES:-round_robin,consistent_hash,cache_aware,kv_aware}"
runs="${RUNS:-3}"
bin=target/release/prefix-router
[ -x "$bin" ] || cargo build --release
tests/tokens/fetch.sh target/tokenizers >/dev/null
{ read -r server; read -r model; } < <(benches/real_engine/build.sh target/real-engine target/tokenizers/qwen3)
out="$(mktemp -d)"
source benches/common.sh
trap 'stop; rm -rf "$out"' EXIT
start_servers() {
  urls=()
  for i in 0 1 2 3; do
    local port; port=$(free_port)
    "$server" -m "$model" --alias tiny --host 127.0.0.1 --port "$port" -np 4 -c "${CONTEXT:-196608}" --cache-ram 512 \
      --metrics --no-webui --no-warmup -t 1 >"$out/server-$i.log" 2>&1 &
    pids+=($!)
    urls+=("http://127.0.0.1:$port")
  done
  for u in "${urls[@]}"; do wait_ok "$u/health"; done
}
# The cheap check: one server, the router, two turns; the second is served from cache.
start_servers
start_router kv_aware "${urls[0]}"
python3 - "http://127.0.0.1:$port" <<'PY'
import json, sys, urllib.request
def chat(messages):
    body = json.dumps({"model": "tiny", "max_tokens": 8, "messages": messages}).encode()
    request = urllib.request.Request(sys.argv[1] + "/v1/chat/completions", body,
                                     {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(request, timeout=60))
messages = [{"role": "system", "content": "You review Rust code. " * 60},
            {"role": "user", "content": "What does this function do?"}]
first = chat(messages)
messages += [first["choices"][0]["message"], {"role": "user", "content": "And its errors?"}]
second = chat(messages)
cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
print(f"two turns through the router: second turn {cached} of {second['usage']['prompt_tokens']} prompt tokens cached")
assert cached > 0, second
PY
stop

replay() { # NAME RUN: replays the workload through the proxy on $port, prints one line
  "$bin" replay --url "http://127.0.0.1:$port" --synthetic agent --sessions "${SESSIONS:-12}" \
    --max-context-tokens "${MAX_CONTEXT:-5000}" --message-scale "${MESSAGE_SCALE:-0.2}" \
    --max-requests "${MAX_REQUESTS:-240}" \
    --speedup "${SPEEDUP:-10}" --stream --quiet --backends 4 --model tiny \
    --out "$out/$1-$2.json" >/dev/null
  python3 - "$out/$1-$2.json" "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r.get("ttft_ms") or {}
ok = r["requests"]["ok"]
print(f"{sys.argv[2]:16} run={sys.argv[3]} hit={(r['hit_rate'] or 0)*100:.1f}% ok={ok} "
      f"failed={r['requests']['failed']} ttft_p50={t.get('p50', 0):.0f}ms "
      f"ttft_p99={t.get('p99', 0):.0f}ms req/s={r['throughput']['requests_per_s']:.2f}"
      + (f" errors={r['requests']['errors']}" if r['requests']['failed'] else ""))
PY
}

measure() { # START NAME: $runs replays through NAME, started by START, fresh servers each
  for run in $(seq 1 "$runs"); do
    start_servers
    "$1" "$2" "${urls[@]}"
    replay "$2" "$run"
    stop
  done
}
IFS=, read -ra list <<<"$policies"
for policy in "${list[@]}"; do measure start_router "$policy"; done
IFS=, read -ra peers <<<"${PEERS-smg,vllm-router}"
for peer in "${peers[@]}"; do measure start_peer "$peer"; done
