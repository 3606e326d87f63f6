#!/usr/bin/env bash
# Real time: `prefix-router demo` on the agent workload with Qwen3's tokenizer, the router
# in token mode predicting from what it sent (text) or following the simulated engines'
# KV events (exact), behind 1 and 2 router replicas, three runs each. Prints one line per
# run: mode, replicas, run, hit rate, predicted hit rate, TTFT p50/p99 (trace seconds).
# Usage: benches/kv_events/demo.sh [BINARY]   (about 10 min on 2 cores; needs
# tests/tokens/fetch.sh target/tokenizers, and redis-server for 2 replicas)
set -euo pipefail
bin="${1:-target/release/prefix-router}"
tokenizer="${TOKENIZER:-target/tokenizers/qwen3}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for replicas in 1 2; do
  for run in 1 2 3; do
    for mode in text exact; do
      events=(); [ "$mode" = exact ] && events=(--kv-events)
      dir="$out/$mode-$replicas-$run"
      "$bin" demo --policies kv_aware --tokenizer "$tokenizer" "${events[@]}" --sessions 12 \
        --max-requests 500 --speedup 10 --kv-blocks 10000 --replicas "$replicas" \
        --out-dir "$dir" >"$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
      python3 - "$dir/demo.json" "$mode" "$replicas" "$run" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))[0]["report"]
t = r.get("ttft_ms") or {}
print(f"{sys.argv[2]:5} replicas={sys.argv[3]} run={sys.argv[4]} hit={r['hit_rate']*100:.1f}% "
      f"ok={r['requests']['ok']} failed={r['requests']['failed']} "
      f"ttft_p50={t.get('p50', 0)/1000:.2f}s ttft_p99={t.get('p99', 0)/1000:.2f}s")
PY
    done
  done
done
