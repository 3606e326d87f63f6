"""vLLM's own ZmqEventPublisher (from the vllm wheel, see setup.sh), driven by JSON lines
on stdin, for tests: {"op": "store", "hashes", "parent", "tokens", "medium"}, {"op":
"remove", "hashes"}, {"op": "clear"}, and {"op": "lose", ...a store...}, a batch put in
the replay buffer under the next sequence number but never sent on the PUB socket (as a
subscriber behind the high-water mark loses it). Prints "ok" after each line, once the
publisher's queue is empty.

Usage: publisher.py STUB_DIR PUB_PORT [REPLAY_PORT]
"""

import json
import sys
import time

import msgspec

sys.path.insert(0, sys.argv[1])
from vllm.distributed.kv_events import (  # noqa: E402
    AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, ZmqEventPublisher)

# vLLM binds endpoints with a wildcard host and connects to the others; tests bind loopback.
ZmqEventPublisher._is_bind_endpoint = staticmethod(lambda endpoint: True)
replay = f"tcp://127.0.0.1:{sys.argv[3]}" if len(sys.argv) > 3 else None
publisher = ZmqEventPublisher(0, endpoint=f"tcp://127.0.0.1:{sys.argv[2]}", replay_endpoint=replay)
encoder = msgspec.msgpack.Encoder()


def event(op):
    if op["op"] in ("store", "lose"):
        return BlockStored(block_hashes=op["hashes"], parent_block_hash=op.get("parent"),
                           token_ids=op["tokens"], block_size=16, lora_id=None,
                           medium=op.get("medium", "GPU"), lora_name=None)
    if op["op"] == "remove":
        return BlockRemoved(block_hashes=op["hashes"], medium=op.get("medium", "GPU"))
    return AllBlocksCleared()


def drain():
    while publisher._event_queue.qsize() > 0:
        time.sleep(0.01)
    time.sleep(0.05)


print("ready", flush=True)
for line in sys.stdin:
    op = json.loads(line)
    batch = KVEventBatch(ts=time.time(), events=[event(op)], data_parallel_rank=0)
    drain()
    if op["op"] == "lose":
        publisher._buffer.append((next(publisher._seq_gen), encoder.encode(batch)))
    else:
        publisher.publish(batch)
    drain()
    print("ok", flush=True)
publisher.shutdown()
