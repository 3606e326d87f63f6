# What the real-vLLM benches share (sourced, not run): vLLM 0.32's CPU build and the tiny
# model (tests/vllm/setup.sh) in $vllm and $model, and one instance started the same way
# for each: 32-token blocks, prefix caching, `cached_tokens` in usage, a KV sized exactly.
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
