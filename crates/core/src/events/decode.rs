//! vLLM's KV events, from the MessagePack payload of one published message: a batch
//! `[ts, events, data_parallel_rank?]`, each event either a map with a `type` key (vLLM's
//! current encoding) or, from older versions, an array whose first item names the type and
//! whose fields follow in their declared order. Unknown event types are counted and
//! skipped; a malformed known one fails the whole batch (the subscriber then treats its
//! backend's record as incomplete).

use xxhash_rust::xxh3::xxh3_64;

use super::msgpack::{self, MsgpackError, Value};

/// Most MessagePack values one payload may hold (a batch of stores of long prompts holds
/// about one value per token).
pub const MAX_VALUES: usize = 4 << 20;

/// An engine's name for a block: its 64-bit integer hash, or a hash of the bytes it
/// publishes instead (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`).
pub type EngineHash = u64;

/// Where a block is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Medium {
    /// GPU memory (also when the event does not say).
    Gpu,
    /// CPU memory (offloaded).
    Cpu,
    /// Another tier (disk, remote storage).
    Other,
}

/// Blocks an engine stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    /// The engine's hashes of the blocks, in order.
    pub hashes: Vec<EngineHash>,
    /// The engine's hash of the block before the first, if any.
    pub parent: Option<EngineHash>,
    /// The blocks' token ids, `block_size` per block.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: usize,
    /// Where they are held.
    pub medium: Medium,
    /// Whether they are not the base model's plain blocks: a LoRA adapter's, or salted
    /// or multimodal (`extra_keys`). Such blocks never match a plain prompt.
    pub keyed: bool,
    /// The KV cache group of a hybrid model, if given.
    pub group: Option<u64>,
}

/// Blocks an engine removed.
#[derive(Clone, Debug, PartialEq)]
pub struct Removed {
    /// The engine's hashes of the blocks.
    pub hashes: Vec<EngineHash>,
    /// Where they were held.
    pub medium: Medium,
    /// The KV cache group, if given.
    pub group: Option<u64>,
}

/// One KV event.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// `BlockStored`.
    Stored(Stored),
    /// `BlockRemoved`.
    Removed(Removed),
    /// `AllBlocksCleared`.
    Cleared,
    /// A type this router does not know (its name).
    Unknown(String),
}

/// One published batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// The engine's timestamp, seconds.
    pub ts: f64,
    /// The events, in order.
    pub events: Vec<Event>,
    /// The data-parallel rank that published it, if given.
    pub rank: Option<u64>,
}

/// Why a payload is not a batch of events.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not MessagePack.
    #[error(transparent)]
    Msgpack(#[from] MsgpackError),
    /// MessagePack, but not of the shape of a batch or of an event.
    #[error("not a KV event batch: {0}")]
    Shape(&'static str),
}

/// Decodes one message's payload.
pub fn batch(payload: &[u8]) -> Result<Batch, DecodeError> {
    let Value::Array(items) = msgpack::read(payload, MAX_VALUES)? else {
        return Err(DecodeError::Shape("a batch is an array"));
    };
    let ts = match items.first() {
        Some(Value::Float(f)) => *f,
        Some(v) => v.as_u64().ok_or(DecodeError::Shape("ts"))? as f64,
        None => return Err(DecodeError::Shape("ts")),
    };
    let Some(Value::Array(events)) = items.get(1) else {
        return Err(DecodeError::Shape("events"));
    };
    let rank = items.get(2).and_then(Value::as_u64);
    let events = events.iter().map(event).collect::<Result<_, _>>()?;
    Ok(Batch { ts, events, rank })
}

/// The fields of an event by name, from either encoding.
struct EventFields<'v> {
    kind: &'v str,
    map: Option<&'v Value>,
    positional: &'v [Value],
}

impl<'v> EventFields<'v> {
    /// Field `name`, declared at `position` (after the type) in the older encoding.
    fn get(&self, name: &str, position: usize) -> Option<&'v Value> {
        match self.map {
            Some(map) => map.get(name),
            None => self.positional.get(position),
        }
        .filter(|v| !matches!(v, Value::Nil))
    }
}

fn event(value: &Value) -> Result<Event, DecodeError> {
    let fields = match value {
        Value::Map(_) => EventFields {
            kind: value
                .get("type")
                .and_then(Value::as_str)
                .ok_or(DecodeError::Shape("type"))?,
            map: Some(value),
            positional: &[],
        },
        Value::Array(items) => EventFields {
            kind: items
                .first()
                .and_then(Value::as_str)
                .ok_or(DecodeError::Shape("type"))?,
            map: None,
            positional: &items[1..],
        },
        _ => return Err(DecodeError::Shape("an event is a map or an array")),
    };
    Ok(match fields.kind {
        "BlockStored" => Event::Stored(stored(&fields)?),
        "BlockRemoved" => Event::Removed(Removed {
            hashes: hashes(fields.get("block_hashes", 0))?,
            medium: medium(fields.get("medium", 1)),
            group: fields.get("group_idx", 2).and_then(Value::as_u64),
        }),
        "AllBlocksCleared" => Event::Cleared,
        other => Event::Unknown(other.chars().take(64).collect()),
    })
}

/// `BlockStored` fields, in declared order: block_hashes, parent_block_hash, token_ids,
/// block_size, lora_id, medium, lora_name, extra_keys, group_idx.
fn stored(fields: &EventFields) -> Result<Stored, DecodeError> {
    let hashes = hashes(fields.get("block_hashes", 0))?;
    let parent = fields.get("parent_block_hash", 1).map(hash).transpose()?;
    let Some(Value::Array(tokens)) = fields.get("token_ids", 2) else {
        return Err(DecodeError::Shape("token_ids"));
    };
    let token_ids = (tokens.iter())
        .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
        .collect::<Option<Vec<u32>>>()
        .ok_or(DecodeError::Shape("token_ids"))?;
    let block_size = (fields.get("block_size", 3).and_then(Value::as_u64))
        .filter(|&b| b > 0 && b <= 1 << 16)
        .ok_or(DecodeError::Shape("block_size"))? as usize;
    if token_ids.len() != hashes.len() * block_size {
        return Err(DecodeError::Shape("token_ids is not block_size per block"));
    }
    let extra = match fields.get("extra_keys", 7) {
        Some(Value::Array(keys)) => keys.iter().any(|k| !matches!(k, Value::Nil)),
        Some(_) => true,
        None => false,
    };
    let adapter = fields.get("lora_id", 4).is_some() || fields.get("lora_name", 6).is_some();
    Ok(Stored {
        hashes,
        parent,
        token_ids,
        block_size,
        medium: medium(fields.get("medium", 5)),
        keyed: adapter || extra,
        group: fields.get("group_idx", 8).and_then(Value::as_u64),
    })
}

fn hashes(value: Option<&Value>) -> Result<Vec<EngineHash>, DecodeError> {
    match value {
        Some(Value::Array(items)) => items.iter().map(hash).collect(),
        _ => Err(DecodeError::Shape("block_hashes")),
    }
}

fn hash(value: &Value) -> Result<EngineHash, DecodeError> {
    match value {
        Value::Uint(n) => Ok(*n),
        Value::Int(n) => Ok(*n as u64),
        Value::Bin(bytes) | Value::Str(bytes) => Ok(xxh3_64(bytes)),
        _ => Err(DecodeError::Shape("a block hash")),
    }
}

fn medium(value: Option<&Value>) -> Medium {
    match value.and_then(Value::as_str) {
        None => Medium::Gpu,
        Some(m) if m.eq_ignore_ascii_case("gpu") => Medium::Gpu,
        Some(m) if m.eq_ignore_ascii_case("cpu") => Medium::Cpu,
        Some(_) => Medium::Other,
    }
}

#[cfg(test)]
mod tests;
