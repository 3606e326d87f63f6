#!/usr/bin/env bash
# Token-mode costs, side by side in one run: the criterion bench of prefix-router-tokens
# (Qwen3's tokenizer: a 1 KB request, a new 400 KB conversation, the render alone, the
# next turn of a 400 KB conversation), then Hugging Face's Python `tokenizers` on the same
# 400 KB render, then the token cache's memory for 1,000 conversations of 400 KB, without
# a limit and with the default token_cache_bytes.
# Usage: benches/tokens/run.sh   (fetches the tokenizer; the venv is tests/tokens')
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
tests/tokens/fetch.sh target/tokenizers
VENV="${VENV:-$root/target/tokens-venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet -r tests/tokens/requirements.txt
fi
cargo bench -p prefix-router-tokens --bench tokens 2>&1 | grep -E "^qwen3|time:"
"$VENV/bin/python" benches/tokens/python.py target/tokenizers/qwen3 target/tokens-bench-400k.txt
for budget in 18446744073709551615 268435456; do   # no limit, then the default
  cargo run --release --quiet -p prefix-router-tokens --example token_cache -- \
    target/tokenizers/qwen3 "${CONVERSATIONS:-1000}" "$budget"
done
