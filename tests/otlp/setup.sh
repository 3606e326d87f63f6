#!/usr/bin/env bash
# A venv with the official `opentelemetry-proto` package, for the OTLP receiver the trace
# tests run (receiver.py). Prints the venv's python. Usage: tests/otlp/setup.sh DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="$(mkdir -p "$1" && cd "$1" && pwd)"
# Tests run in parallel and each may call this: one at a time makes the venv.
exec 9>"$dir/.setup.lock"
flock 9
"$here/../venv.sh" "$dir" "$here/requirements.txt"
echo "$dir/venv/bin/python"
