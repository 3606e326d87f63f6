#!/usr/bin/env bash
# The lab's flow scenarios over several seeds: the measured flow's TTFT p99 beside its
# neighbours over its own p99 alone (`S-alone`), per seed, with the mean, the median and
# how many seeds are within 1.5x, on engines of 4 and on engines of 16 bound by KV
# (`--flow-scale 4 --flow-load 2`), then both p99s' means: a routing change moves the p99
# alone, and so the ratio, with flow control untouched. Virtual time, so every run is
# deterministic: a change to flow control shows as the difference between two builds'
# tables (BIN=...), and its spread as the difference between seed ranges (SEEDS=9-16).
#
# Env: BIN (target/release/prefix-router, built if missing), SEEDS (1-8: first-last),
# SCENARIOS ("noisy-neighbour priority"), POLICY (kv_aware), OUT (a directory for the
# runs' logs). About 4 minutes for 8 seeds on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${BIN:-target/release/prefix-router}"
[ -x "$bin" ] || cargo build --release -p prefix-router-cli
seeds="${SEEDS:-1-8}"
first="${seeds%-*}" last="${seeds#*-}"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"

p99() { # LOG: the measured flow's TTFT p99 in ms, from the summary line
  sed -n '1s/.*; [^:]*: TTFT p50 [^ ]* p99 \([0-9,]*\)ms.*/\1/p' "$1" | tr -d ,
}

mean_ms() { # VALUES...: their mean, whole
  printf '%s\n' "$@" | awk '{ t += $1 } END { printf "%d", t / NR }'
}

for scenario in ${SCENARIOS:-noisy-neighbour priority}; do
  for engines in 4 16; do
    scale=()
    [ "$engines" = 16 ] && scale=(--flow-scale 4 --flow-load 2)
    ratios=() besides=() alones=()
    for seed in $(seq "$first" "$last"); do
      for run in "$scenario" "$scenario-alone"; do
        "$bin" lab --scenario "$run" --policies "${POLICY:-kv_aware}" --seed "$seed" \
          "${scale[@]}" --out-dir "$out/lab" >"$out/$run-$engines-$seed.log" 2>&1
      done
      beside=$(p99 "$out/$scenario-$engines-$seed.log")
      alone=$(p99 "$out/$scenario-alone-$engines-$seed.log")
      ratios+=("$(awk -v b="$beside" -v a="$alone" 'BEGIN { printf "%.2f", b / a }')")
      besides+=("$beside") alones+=("$alone")
    done
    printf '%s\n' "${ratios[@]}" | sort -n | awk -v s="$scenario" -v e="$engines" -v all="${ratios[*]}" \
      -v ms="p99 beside $(mean_ms "${besides[@]}") ms, alone $(mean_ms "${alones[@]}") ms (means)" '
      { r[NR] = $1; sum += $1; within += ($1 <= 1.5) }
      END {
        median = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2
        printf "%-16s engines of %-2s mean %.2f median %.2f within 1.5x %d of %d: %s; %s\n",
          s, e, sum / NR, median, within, NR, all, ms
      }'
  done
done
