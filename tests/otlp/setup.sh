#!/usr/bin/env bash
# A venv with the official `opentelemetry-proto` package, for the OTLP receiver the trace
# tests run (receiver.py). Prints the venv's python. Usage: tests/otlp/setup.sh DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="$(mkdir -p "$1" && cd "$1" && pwd)"
# Tests run in parallel and each may call this: one at a time makes the venv.
exec 9>"$dir/.setup.lock"
flock 9
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get install -y --no-install-recommends python3-venv >&2 \
    || { $sudo apt-get update >&2 && $sudo apt-get install -y --no-install-recommends python3-venv >&2; }
fi
if [ ! -x "$dir/venv/bin/python" ] || ! "$dir/venv/bin/python" -c 'import opentelemetry.proto' 2>/dev/null; then
  rm -rf "$dir/venv"
  python3 -m venv "$dir/venv"
  timeout 600 "$dir/venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt" >&2
fi
echo "$dir/venv/bin/python"
