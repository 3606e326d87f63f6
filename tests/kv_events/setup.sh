#!/usr/bin/env bash
# vLLM's own KV event classes and publisher, runnable without vLLM's heavy dependencies:
# downloads the vllm wheel (no dependencies), takes `vllm/distributed/kv_events.py` from it
# into DIR/vllm with small stubs for the few modules it imports, and makes a venv with
# msgspec and pyzmq. Prints the venv's python. Usage: tests/kv_events/setup.sh DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="$(mkdir -p "$1" && cd "$1" && pwd)"
VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
# Tests run in parallel and each may call this: one at a time makes the venv.
exec 9>"$dir/.setup.lock"
flock 9
"$here/../venv.sh" "$dir" "$here/requirements.txt"
if [ ! -s "$dir/vllm/distributed/kv_events.py" ]; then
  rm -rf "$dir/wheel" && mkdir -p "$dir/wheel"
  timeout 900 "$dir/venv/bin/pip" download --quiet --disable-pip-version-check --no-deps \
    "vllm==$VLLM_VERSION" -d "$dir/wheel" >&2
  python3 - "$dir" <<'PY'
import glob, sys, zipfile
dir = sys.argv[1]
wheel = glob.glob(f"{dir}/wheel/vllm-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    source = z.read("vllm/distributed/kv_events.py").decode()
stubs = {
    "vllm/__init__.py": "",
    "vllm/config/__init__.py": "",
    "vllm/config/kv_events.py":
        "from dataclasses import dataclass\n"
        "@dataclass\nclass KVEventsConfig:\n"
        "    enable_kv_cache_events: bool = False\n    publisher: str = 'null'\n"
        "    endpoint: str = 'tcp://*:5557'\n    replay_endpoint: str | None = None\n"
        "    buffer_steps: int = 10000\n    hwm: int = 100000\n"
        "    max_queue_size: int = 100000\n    topic: str = ''\n",
    "vllm/logger.py": "import logging\ndef init_logger(name):\n    return logging.getLogger(name)\n",
    "vllm/utils/__init__.py": "",
    "vllm/utils/network_utils.py":
        "def get_ip():\n    return '127.0.0.1'\n"
        "def get_tcp_uri(ip, port):\n    return f'tcp://{ip}:{port}'\n"
        "def is_valid_ipv6_address(ip):\n    return ':' in ip\n"
        "def split_zmq_path(path):\n"
        "    scheme, rest = path.split('://', 1)\n    host, port = rest.rsplit(':', 1)\n"
        "    return scheme, host, port\n",
    "vllm/v1/__init__.py": "",
    "vllm/v1/core/__init__.py": "",
    "vllm/v1/core/kv_cache_utils.py": "ExternalBlockHash = bytes | int\n",
    "vllm/distributed/__init__.py": "",
    "vllm/distributed/kv_events.py": source,
}
import os
for path, text in stubs.items():
    os.makedirs(os.path.dirname(f"{dir}/{path}"), exist_ok=True)
    with open(f"{dir}/{path}", "w") as f:
        f.write(text)
PY
  rm -rf "$dir/wheel"
fi
echo "$dir/venv/bin/python"
