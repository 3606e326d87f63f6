"""KV event batches encoded by vLLM's own classes (`vllm/distributed/kv_events.py`, put in
place by setup.sh), one JSON line each: the payload in hex and what it holds, for the
router's decoder to be checked against. Also the older positional encoding (events as
arrays whose first item is the type), with classes declared as older vLLM declared them.

Usage: payloads.py STUB_DIR
"""

import json
import sys

import msgspec

sys.path.insert(0, sys.argv[1])
from vllm.distributed.kv_events import (  # noqa: E402
    AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch)


class OldEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class OldBlockStored(OldEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class OldBlockRemoved(OldEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class OldAllBlocksCleared(OldEvent, tag="AllBlocksCleared"):
    pass


class OldBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[OldBlockStored | OldBlockRemoved | OldAllBlocksCleared]
    data_parallel_rank: int | None = None


def stored(hashes, parent, medium="GPU", **extra):
    tokens = list(range(1000, 1000 + 16 * len(hashes)))
    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                       block_size=16, lora_id=None, medium=medium, lora_name=None, **extra)


def summary(events):
    out = []
    for e in events:
        kind = type(e).__name__.removeprefix("Old")
        item = {"type": kind}
        if kind != "AllBlocksCleared":
            ints = all(isinstance(h, int) for h in e.block_hashes)
            item["hashes"] = e.block_hashes if ints else None
            item["count"] = len(e.block_hashes)
            item["medium"] = e.medium or "GPU"
            item["group"] = getattr(e, "group_idx", None)
        if kind == "BlockStored":
            item["parent"] = e.parent_block_hash if isinstance(e.parent_block_hash, (int, type(None))) else "bytes"
            item["tokens"] = len(e.token_ids)
            item["keyed"] = bool(e.lora_id is not None or getattr(e, "lora_name", None)
                                 or any(k is not None for k in (getattr(e, "extra_keys", None) or [])))
        out.append(item)
    return out


cases = {
    "current": KVEventBatch(ts=1.5, events=[
        stored([11, 12], None), stored([13], 12),
        BlockRemoved(block_hashes=[12], medium="GPU"), AllBlocksCleared()], data_parallel_rank=0),
    "bytes_hashes": KVEventBatch(ts=2.0, events=[
        stored([b"\x01" * 32, b"\x02" * 32], None),
        BlockRemoved(block_hashes=[b"\x02" * 32], medium="GPU")]),
    "tiers_groups_and_keys": KVEventBatch(ts=3.0, events=[
        stored([21], None, medium="CPU", group_idx=1, kv_cache_spec_kind="full_attention"),
        stored([22], None, extra_keys=[("salt",)]),
        BlockStored(block_hashes=[23], parent_block_hash=None, token_ids=list(range(16)),
                    block_size=16, lora_id=None, medium="GPU", lora_name="adapter"),
        BlockRemoved(block_hashes=[21], medium="CPU", group_idx=1)]),
    "older_positional": OldBatch(ts=4.0, events=[
        OldBlockStored([31, 32], None, list(range(32)), 16, None, "GPU"),
        OldBlockRemoved([31], None), OldAllBlocksCleared()]),
}
encoder = msgspec.msgpack.Encoder()
for name, batch in cases.items():
    print(json.dumps({"name": name, "payload": encoder.encode(batch).hex(),
                      "ts": batch.ts, "events": summary(batch.events)}))
