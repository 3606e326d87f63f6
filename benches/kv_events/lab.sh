#!/usr/bin/env bash
# The lab's text vs exact index (the engines' KV events), side by side: the agent,
# hot-prompt, burst and conversation-10x scenarios, each without a fault, with backend 0
# restarting halfway, with 20% of requests bypassing the router, and behind 2 and 4 router
# replicas; `kv_aware`, over the seeds given. Prints a Markdown table (docs/LAB.md).
# Usage: benches/kv_events/lab.sh [BINARY] [SEEDS]   (about 3 min per seed on 2 cores)
set -euo pipefail
bin="${1:-target/release/prefix-router}"
seeds="${2:-1 2 3}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for seed in $seeds; do
  for s in agent hot-prompt burst conversation-10x; do
    run() { "$bin" lab --scenario "$s" --policies kv_aware --index text,exact --seed "$seed" \
              --out-dir "$out/$seed-$s-$1" "${@:2}" >/dev/null 2>&1; }
    run none
    run restart --restart
    run bypass --bypass 0.2
    run replicas --replicas 2,4
  done
done
python3 - "$out" <<'PY'
import glob, json, re, statistics, sys
rows = {}
for path in glob.glob(f"{sys.argv[1]}/*/lab.json"):
    for r in json.load(open(path)):
        name = r["scenario"]
        base = name.split(" ")[0]
        situation = re.sub(r" (text|exact)$", "", name[len(base):]).strip() or "none"
        key = (base, situation, r["index"])
        rows.setdefault(key, []).append(r)
def spread(values):
    values = [v * 100 for v in values]
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"
print("| scenario | situation | text: hit | text: routed hit | text: predicted | exact: hit | exact: routed hit | exact: predicted | exact - no fault | text - no fault |")
print("|---|---|---|---|---|---|---|---|---|---|")
order = ["none", "restart", "bypass=20%", "r=2", "r=4"]
for base in ["agent", "hot-prompt", "burst", "conversation-10x"]:
    for situation in order:
        text, exact = rows.get((base, situation, "text")), rows.get((base, situation, "exact"))
        if not text or not exact:
            continue
        hit = lambda rs: [r["report"]["hit_rate"] for r in rs]
        routed = lambda rs: [r["routed_hit_rate"] for r in rs]
        def drop(rs, mode):
            # The routed requests' hit rate against the same scenario without the fault.
            clean = statistics.median(hit(rows[(base, "none", mode)]))
            return f"{(statistics.median(routed(rs)) - clean) * 100:+.1f}"
        predicted = lambda rs: [r["predicted_hit_rate"] for r in rs]
        print(f"| {base} | {situation} | {spread(hit(text))} | {spread(routed(text))} | "
              f"{spread(predicted(text))} | {spread(hit(exact))} | {spread(routed(exact))} | "
              f"{spread(predicted(exact))} | {drop(exact, 'exact')} | {drop(text, 'text')} |")
PY
