#!/usr/bin/env bash
# What one real vLLM instance of `make real-vllm` costs on this machine's CPU, for
# `prefix-router sim`'s timing: one instance (the bench's model and flags) alone on core 0.
# Prompts of 1K-20K tokens, each new (max_tokens 1, nothing cached), then one token past
# the longest (all but that token cached); the prefill times are fitted, in relative error,
# to `t0 + n / rate + n² / (2 rate L)`: `rate` is --prefill-tokens-per-s at position 0 and
# L is --attention-tokens (the position at which attending to the context doubles a
# token's cost). Then the time per output token of one sequence, after a 2-token and
# after a 16K-token prompt. Two engines share a core in the bench, so its simulators take
# half the rate; its decode is the inter-token latency vLLM reports under the bench.
# Usage: benches/real_vllm/engine_cost.sh (about 2 minutes once vLLM is installed)
set -euo pipefail
cd "$(dirname "$0")/../.."
source benches/common.sh
bench_start
source benches/real_vllm/vllm.sh
port=$(free_port)
serve_vllm "$out" "$port" 0 2000 32768 16
pids+=($!)
wait_healthy "http://127.0.0.1:$port"
python3 - "$port" <<'PY'
import json, random, sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/v1/completions"
words = ["alpha", "beta", "gamma", "delta", "omega", "river", "stone"]
rng = random.Random(1)

def complete(prompt, tokens):
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": tokens,
                       "ignore_eos": True, "temperature": 0}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    start = time.perf_counter()
    usage = json.loads(urllib.request.urlopen(request).read())["usage"]
    return time.perf_counter() - start, usage

complete("warm up", 4)
t0, _ = complete("hello", 1)
points = []
for n in (1000, 2000, 4000, 8000, 12000, 16000, 20000):
    prompt = " ".join(rng.choice(words) for _ in range(n))
    seconds, usage = complete(prompt, 1)
    points.append((usage["prompt_tokens"], seconds - t0))
    print(f"prefill {usage['prompt_tokens']:6} tokens, none cached: {seconds:6.2f} s")
seconds, usage = complete(prompt + " stone", 1)
cached = usage["prompt_tokens_details"]["cached_tokens"]
print(f"prefill {usage['prompt_tokens']:6} tokens, {cached} cached: {seconds:6.2f} s")
# t - t0 = a n + b n², least squares on the relative error.
sxx = sxy = syy = sx = sy = 0.0
for n, t in points:
    x, y = n / t, n * n / t
    sxx += x * x; sxy += x * y; syy += y * y; sx += x; sy += y
det = sxx * syy - sxy * sxy
a = (sx * syy - sy * sxy) / det
b = (sy * sxx - sx * sxy) / det
print(f"fit: request {t0 * 1000:.0f} ms + n / {1 / a:.0f} tokens/s, attention doubling a token's cost at {a / (2 * b):.0f} tokens")
for n, t in points:
    print(f"  {n:6} tokens: measured {t:6.2f} s, fitted {a * n + b * n * n:6.2f} s")
for prompt, label in (("hello", "2-token"), (" ".join(rng.choice(words) for _ in range(16000)), "16K-token")):
    complete(prompt, 1)
    one, _ = complete(prompt, 1)
    many, usage = complete(prompt, 201)
    print(f"decode after a {label} prompt: {(many - one) / 200 * 1000:.1f} ms a token")
PY
