# What the real-vLLM benches share (sourced, not run): vLLM 0.32's CPU build and the tiny
# model (tests/vllm/setup.sh) in $vllm and $model, and one instance started the same way
# for each: 32-token blocks, prefix caching, `cached_tokens` in usage, a KV sized exactly;
# the agent sessions replayed, their final contexts, and each engine's cache emptied.
# Extra environment (VLLM_SERVER_DEV_MODE, VLLM_ENABLE_RESPONSES_API_STORE) is the caller's
# to export.
{ read -r vllm; read -r model; } < <(tests/vllm/setup.sh target/vllm)
block=32
serve_vllm() { # DIR PORT CORE KV_BLOCKS MAX_MODEL_LEN MAX_NUM_SEQS [FLAG...]: an instance in the background, bound to CORE, its caches and log under DIR; $! is its pid
  local dir=$1 port=$2 core=$3 blocks=$4 len=$5 seqs=$6
  shift 6
  mkdir -p "$dir"/{cache,tmp,rpc,inductor}
  VLLM_CPU_OMP_THREADS_BIND=$core VLLM_CACHE_ROOT="$dir/cache" TMPDIR="$dir/tmp" \
  VLLM_RPC_BASE_PATH="$dir/rpc" TORCHINDUCTOR_CACHE_DIR="$dir/inductor" \
  HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
    "$vllm" serve "$model" --served-model-name tiny --host 127.0.0.1 --port "$port" \
    --dtype bfloat16 --enforce-eager --block-size "$block" --enable-prefix-caching \
    --enable-prompt-tokens-details --max-model-len "$len" --max-num-seqs "$seqs" \
    --num-gpu-blocks-override "$blocks" --kv-cache-memory-bytes $((blocks * block * 512)) \
    "$@" >"$dir/log" 2>&1 &
}
wait_healthy() { # URL...: each answers /health within 300 s, else the bench stops
  local u
  for u in "$@"; do
    for _ in $(seq 1 600); do curl -sf -o /dev/null "$u/health" && break; sleep 0.5; done
    curl -sf -o /dev/null "$u/health" || { echo "$u never became healthy" >&2; exit 1; }
  done
}
set_workload() { # agent|shared: the sessions replayed, as replay flags in $workload
  workload_kind=$1
  case "$1" in
    agent) workload=(--sessions "${SESSIONS:-24}" --system-prompts 4 --prompt-scale 0.15
             --message-scale 1.5 --min-context-tokens 2500 --max-context-tokens 20000) ;;
    shared) workload=(--sessions "${SESSIONS:-32}" --system-prompts 2 --prompt-scale 0.6
              --message-scale 1.5 --min-context-tokens 5000 --max-context-tokens 20000) ;;
    *) echo "unknown WORKLOAD $1" >&2; exit 1 ;;
  esac
  workload+=(--output-scale "${OUTPUT_SCALE:-0.25}" --session-rate "${SESSION_RATE:-2}" --think-min "${THINK:-1}" --think-max "${THINK:-1}")
}
free_pair() { # a free port P with P+1 free too (vLLM's HTTP port and its KV events')
  python3 -c 'import socket
while True:
    a = socket.socket(); a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]
    try:
        b = socket.socket(); b.bind(("0.0.0.0", p + 1)); b.close(); a.close(); print(p); break
    except OSError:
        a.close()'
}

contexts() { # the workload's final contexts in the model's tokens: "SUM MAX" (a simulator with the model's tokenizer, no KV limit)
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
print(sum(final.values()), max(final.values()))
PY
}

reset_caches() { # URL...: each engine's prefix cache emptied (vLLM's dev endpoint)
  for u in "$@"; do
    for _ in $(seq 1 50); do
      [ "$(curl -s -X POST "$u/reset_prefix_cache")" = '{"success":true}' ] && break
      sleep 0.2
    done
  done
}

warm_up() { # URL...: 4 sessions straight to each engine at once, then its cache emptied. An
  # engine's first minutes run slower (at 1.0x and 1.5x the first front after a start was
  # the slowest of the four that placed alike; behind PD pairs, the engines' own TTFT was
  # longest in the first run), and no front should pay that.
  local saved=("${workload[@]}") u warm=()
  SESSIONS=4 set_workload "$workload_kind"
  for u in "$@"; do
    "$bin" replay --url "$u" --synthetic agent "${workload[@]}" --model tiny --stream --quiet \
      --timeout 900 >/dev/null 2>&1 &
    warm+=($!)
  done
  wait "${warm[@]}" || true
  workload=("${saved[@]}")
  reset_caches "$@"
}

cpu_seconds() { # PID: CPU seconds of PID and its descendants so far
  python3 - "$1" <<'PY'
import os, sys
tick = os.sysconf("SC_CLK_TCK")
def children(pid):
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            out += open(f"/proc/{pid}/task/{task}/children").read().split()
        except OSError:
            pass
    return out
total, todo = 0, [sys.argv[1]]
while todo:
    pid = todo.pop()
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
        todo += children(pid)
    except OSError:
        pass
print(f"{total / tick:.1f}")
PY
}
