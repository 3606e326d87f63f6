//! The simulator's KV events, published as vLLM publishes them (`--kv-events-config`):
//! every change to an instance's block cache (blocks stored, blocks evicted, the cache
//! cleared) goes out on a ZMQ PUB socket as `[topic, 8-byte big-endian sequence number,
//! MessagePack batch]`, one batch per engine step that changed something, and the last
//! `buffer_steps` batches are kept for a ROUTER replay socket.
//!
//! For: running a router's exact index against a publisher that is not the router's own
//! code (this encoder shares nothing with the router's decoder; the tests also run vLLM's
//! own publisher). Not for: the other publishers vLLM has (`null` is accepted and
//! publishes nothing).
//!
//! The batch is `[ts, [event, ...], data_parallel_rank]` and each event a map with a
//! `type` key, as vLLM's `msgspec` structs encode: `BlockStored` (`block_hashes`,
//! `parent_block_hash`, `token_ids`, `block_size`, `lora_id`, `medium`, `lora_name`),
//! `BlockRemoved` (`block_hashes`, `medium`) and `AllBlocksCleared`. Hashes are the
//! simulator's own 64-bit block hashes.

use std::collections::VecDeque;

use bytes::Bytes;
use rmp::encode;
use serde::Deserialize;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::cache::Change;

/// vLLM's `--kv-events-config` (its JSON keys; `hwm` and `max_queue_size` are accepted
/// and ignored).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default)]
pub struct KvEventsConfig {
    /// Whether to publish at all (default false).
    pub enable_kv_cache_events: bool,
    /// `zmq`, or `null` to publish nothing (default `null`).
    pub publisher: String,
    /// The PUB socket's endpoint (default `tcp://*:5557`); instance i binds port + i.
    pub endpoint: String,
    /// The ROUTER replay socket's endpoint, if any (default none); port + i likewise.
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay (default 10 000).
    pub buffer_steps: usize,
    /// High-water mark (accepted, ignored).
    pub hwm: Option<u64>,
    /// Queue size (accepted, ignored).
    pub max_queue_size: Option<u64>,
    /// The topic, the first frame of each message (default empty).
    pub topic: String,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        KvEventsConfig {
            enable_kv_cache_events: false,
            publisher: "null".into(),
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: None,
            max_queue_size: None,
            topic: String::new(),
        }
    }
}

impl KvEventsConfig {
    /// Parses the JSON of `--kv-events-config`.
    pub fn parse(json: &str) -> anyhow::Result<KvEventsConfig> {
        let config: KvEventsConfig =
            serde_json::from_str(json).map_err(|e| anyhow::anyhow!("--kv-events-config: {e}"))?;
        match config.publisher.as_str() {
            "zmq" | "null" => Ok(config),
            other => anyhow::bail!("--kv-events-config: publisher `{other}` is not zmq or null"),
        }
    }

    /// Whether events are published.
    pub fn publishes(&self) -> bool {
        self.enable_kv_cache_events && self.publisher == "zmq"
    }

    /// The settings of instance `i`: both endpoints' ports moved up by `i`.
    pub fn for_instance(&self, i: u16) -> anyhow::Result<KvEventsConfig> {
        Ok(KvEventsConfig {
            endpoint: offset(&self.endpoint, i)?,
            replay_endpoint: (self.replay_endpoint.as_deref())
                .map(|e| offset(e, i))
                .transpose()?,
            ..self.clone()
        })
    }
}

/// `endpoint` with its port moved up by `i` (`*` binds every address).
fn offset(endpoint: &str, i: u16) -> anyhow::Result<String> {
    let (address, port) = endpoint
        .rsplit_once(':')
        .ok_or_else(|| anyhow::anyhow!("KV event endpoint `{endpoint}` has no port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| anyhow::anyhow!("KV event endpoint `{endpoint}`: bad port"))?;
    let port = match port {
        0 => 0,
        p => p
            .checked_add(i)
            .ok_or_else(|| anyhow::anyhow!("KV event endpoint `{endpoint}` + {i}: no port"))?,
    };
    Ok(format!(
        "{}:{port}",
        address.replace("tcp://*", "tcp://0.0.0.0")
    ))
}

/// Sends an instance's changes to its publisher task.
#[derive(Clone, Debug)]
pub struct Publisher {
    tx: UnboundedSender<Vec<Change>>,
}

impl Publisher {
    /// Publishes one engine step's changes, as one batch (none when empty).
    pub fn publish(&self, changes: Vec<Change>) {
        if !changes.is_empty() {
            let _ = self.tx.send(changes);
        }
    }
}

/// Binds the sockets of `config` and starts publishing blocks of `block_size` tokens;
/// the task ends when every [`Publisher`] is dropped.
pub async fn bind(
    config: &KvEventsConfig,
    block_size: usize,
) -> anyhow::Result<(Publisher, JoinHandle<()>)> {
    let mut publish = PubSocket::new();
    publish
        .bind(&config.endpoint)
        .await
        .map_err(|e| anyhow::anyhow!("binding KV events on {}: {e}", config.endpoint))?;
    let replay = match &config.replay_endpoint {
        Some(endpoint) => {
            let mut socket = RouterSocket::new();
            (socket.bind(endpoint).await)
                .map_err(|e| anyhow::anyhow!("binding KV event replay on {endpoint}: {e}"))?;
            Some(socket)
        }
        None => None,
    };
    let (tx, rx) = unbounded_channel();
    let task = Task {
        publish,
        replay,
        topic: Bytes::from(config.topic.clone().into_bytes()),
        buffer: VecDeque::new(),
        buffer_steps: config.buffer_steps,
        next: 0,
        block_size,
        started: std::time::SystemTime::now(),
    };
    Ok((Publisher { tx }, tokio::spawn(task.run(rx))))
}

struct Task {
    publish: PubSocket,
    replay: Option<RouterSocket>,
    topic: Bytes,
    /// The last batches published, with their sequence numbers.
    buffer: VecDeque<(u64, Bytes)>,
    buffer_steps: usize,
    next: u64,
    block_size: usize,
    started: std::time::SystemTime,
}

impl Task {
    async fn run(mut self, mut rx: UnboundedReceiver<Vec<Change>>) {
        loop {
            let replay = async {
                match &mut self.replay {
                    Some(socket) => socket.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changes = rx.recv() => {
                    let Some(changes) = changes else { return };
                    self.send(&changes).await;
                }
                request = replay => match request {
                    Ok(request) => self.serve_replay(request).await,
                    Err(e) => log::warn!("KV event replay: {e}"),
                },
            }
        }
    }

    async fn send(&mut self, changes: &[Change]) {
        let ts = (self.started.elapsed().unwrap_or_default()).as_secs_f64();
        let payload = Bytes::from(encode_batch(ts, changes, self.block_size));
        let seq = self.next;
        self.next += 1;
        let message = frames(&[self.topic.clone(), seq_bytes(seq), payload.clone()]);
        if let Err(e) = self.publish.send(message).await {
            log::warn!("publishing KV events: {e}");
        }
        self.buffer.push_back((seq, payload));
        while self.buffer.len() > self.buffer_steps {
            self.buffer.pop_front();
        }
    }

    /// A replay request `[identity, "", start seq]`: every buffered batch from that
    /// sequence number on, then the end marker (sequence -1).
    async fn serve_replay(&mut self, request: ZmqMessage) {
        let Some(socket) = &mut self.replay else {
            return;
        };
        let last = request.len().checked_sub(1).and_then(|i| request.get(i));
        let (Some(identity), Some(start)) = (request.get(0), last) else {
            return;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()).map(u64::from_be_bytes) else {
            log::warn!("KV event replay: a request without an 8-byte sequence number");
            return;
        };
        let empty = Bytes::new();
        for (seq, payload) in self.buffer.iter().filter(|(seq, _)| *seq >= start) {
            let reply = [identity.clone(), empty.clone(), self.topic.clone()];
            let reply = frames(&[&reply[..], &[seq_bytes(*seq), payload.clone()]].concat());
            if socket.send(reply).await.is_err() {
                return;
            }
        }
        let end = [
            identity.clone(),
            empty.clone(),
            empty.clone(),
            seq_bytes(u64::MAX),
            empty,
        ];
        let _ = socket.send(frames(&end)).await;
    }
}

fn seq_bytes(seq: u64) -> Bytes {
    Bytes::copy_from_slice(&seq.to_be_bytes())
}

fn frames(parts: &[Bytes]) -> ZmqMessage {
    let mut message = ZmqMessage::from(parts[0].clone());
    for part in &parts[1..] {
        message.push_back(part.clone());
    }
    message
}

/// One batch `[ts, events, 0]` of `changes`, MessagePack as vLLM's encoder writes it
/// (through the `rmp` crate: the smallest form of each integer and length).
pub fn encode_batch(ts: f64, changes: &[Change], block_size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail: the results carry nothing.
    let _ = encode::write_array_len(&mut out, 3);
    let _ = encode::write_f64(&mut out, ts);
    let _ = encode::write_array_len(&mut out, changes.len() as u32);
    for change in changes {
        event(&mut out, change, block_size);
    }
    let _ = encode::write_uint(&mut out, 0);
    out
}

fn event(out: &mut Vec<u8>, change: &Change, block_size: usize) {
    let nil = |o: &mut Vec<u8>| {
        let _ = encode::write_nil(o);
    };
    match change {
        Change::Stored {
            hashes,
            parent,
            token_ids,
            ..
        } => {
            let _ = encode::write_map_len(out, 8);
            pair(out, "type", |o| string(o, "BlockStored"));
            pair(out, "block_hashes", |o| uints(o, hashes.iter().copied()));
            pair(out, "parent_block_hash", |o| match parent {
                Some(p) => uint(o, *p),
                None => nil(o),
            });
            let ids = token_ids.iter().map(|&t| u64::from(t));
            pair(out, "token_ids", |o| uints(o, ids));
            pair(out, "block_size", |o| uint(o, block_size as u64));
            pair(out, "lora_id", nil);
            pair(out, "medium", |o| string(o, "GPU"));
            pair(out, "lora_name", nil);
        }
        Change::Removed(hashes) => {
            let _ = encode::write_map_len(out, 3);
            pair(out, "type", |o| string(o, "BlockRemoved"));
            pair(out, "block_hashes", |o| uints(o, hashes.iter().copied()));
            pair(out, "medium", |o| string(o, "GPU"));
        }
        Change::Cleared => {
            let _ = encode::write_map_len(out, 1);
            pair(out, "type", |o| string(o, "AllBlocksCleared"));
        }
    }
}

fn pair(out: &mut Vec<u8>, key: &str, value: impl FnOnce(&mut Vec<u8>)) {
    string(out, key);
    value(out);
}

fn uints(out: &mut Vec<u8>, values: impl ExactSizeIterator<Item = u64>) {
    let _ = encode::write_array_len(out, values.len() as u32);
    values.for_each(|v| uint(out, v));
}

fn uint(out: &mut Vec<u8>, v: u64) {
    let _ = encode::write_uint(out, v);
}

fn string(out: &mut Vec<u8>, s: &str) {
    let _ = encode::write_str(out, s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_move_up_by_the_instance_number() {
        let config = KvEventsConfig {
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: Some("tcp://127.0.0.1:5600".into()),
            ..KvEventsConfig::default()
        };
        let third = config.for_instance(2).unwrap();
        assert_eq!(third.endpoint, "tcp://0.0.0.0:5559");
        assert_eq!(
            third.replay_endpoint.as_deref(),
            Some("tcp://127.0.0.1:5602")
        );
        assert!(offset("tcp://host", 1).is_err());
        assert!(offset("tcp://host:65535", 1).is_err());
    }

    #[test]
    fn vllm_keys_parse_and_other_publishers_are_refused() {
        let config = KvEventsConfig::parse(
            r#"{"enable_kv_cache_events": true, "publisher": "zmq", "topic": "kv",
                "endpoint": "tcp://*:6000", "buffer_steps": 5, "hwm": 1}"#,
        )
        .unwrap();
        assert!(config.publishes());
        assert_eq!((config.topic.as_str(), config.buffer_steps), ("kv", 5));
        assert!(KvEventsConfig::parse(r#"{"publisher": "kafka"}"#).is_err());
        assert!(!KvEventsConfig::parse("{}").unwrap().publishes());
    }
}
