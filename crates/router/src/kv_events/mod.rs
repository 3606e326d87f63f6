//! Subscribing to one backend's KV events, as vLLM publishes them (`--kv-events-config`,
//! ZMQ PUB of `[topic, 8-byte big-endian sequence number, msgpack batch]`, with an optional
//! ROUTER socket that replays buffered batches), into a [`Record`] of what it holds.
//!
//! The ZMQ library is `zeromq` (pure Rust, on tokio): no C library to build or ship, and it
//! speaks ZMTP 3 as libzmq does (tested against pyzmq running vLLM's own publisher).
//!
//! Sequence numbers: the next one applies; a gap is filled from the replay socket when
//! there is one, else the record is degraded (not whole) until the engine clears it; a
//! number that goes back means the publisher restarted, and the record starts over.
//!
//! [`Records`] holds a record per backend and gives a request's candidates what each
//! backend holds of it (token mode only: the engine's blocks are token ids), counting the
//! prompts it sent there that have no answer yet ([`Sent`]); [`Subscribers`] keeps one
//! subscriber per backend of the fleet running.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use prefix_router_core::events::decode::{self, Event};
use prefix_router_core::events::held::{Held, Whole};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

pub use metrics::{KvEventMetrics, RecordMode};
pub use prefix_router_core::events::sent::{Sent, SentPrompt};

mod metrics;

/// Longest wait for one replayed batch.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);

/// `Record::next` before any batch.
const NOT_STARTED: u64 = u64::MAX;

/// Longest wait between reconnects.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Where a backend publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscription {
    /// Its PUB endpoint, `tcp://host:port`.
    pub endpoint: String,
    /// Its replay (ROUTER) endpoint, if any.
    pub replay: Option<String>,
    /// The topic it publishes under (vLLM's default: empty).
    pub topic: String,
}

/// What one backend holds as its events said, and how far to trust it.
pub struct Record {
    held: Mutex<Held>,
    /// Whether the subscription is connected (a record of a publisher never reached holds
    /// nothing, and says nothing).
    connected: AtomicBool,
    /// The sequence number expected next ([`NOT_STARTED`] before the first).
    next: AtomicU64,
    /// Whether an event could not be applied or a gap could not be filled.
    degraded: AtomicBool,
    /// Whether the backend failed a health check since the last batch ([`Record::lost`]).
    suspect: AtomicBool,
    /// Counters: batches applied, decode failures, gaps, replays.
    pub counts: SubscriberCounts,
}

/// What a subscriber saw.
#[derive(Debug, Default)]
pub struct SubscriberCounts {
    /// Batches applied.
    pub batches: AtomicU64,
    /// Events applied, by type: stored, removed, cleared, unknown.
    pub events: [AtomicU64; 4],
    /// Payloads that did not decode.
    pub decode_failures: AtomicU64,
    /// Gaps in the sequence numbers.
    pub gaps: AtomicU64,
    /// Gaps filled from the replay socket.
    pub replays: AtomicU64,
}

impl Record {
    /// An empty record for blocks of `block_size` tokens, at most `max_blocks`.
    pub fn new(block_size: usize, max_blocks: usize) -> Option<Record> {
        Some(Record {
            held: Mutex::new(Held::new(block_size, max_blocks)?),
            connected: AtomicBool::new(false),
            next: AtomicU64::new(NOT_STARTED),
            degraded: AtomicBool::new(false),
            suspect: AtomicBool::new(false),
            counts: SubscriberCounts::default(),
        })
    }

    /// Tokens of a prompt's leading blocks the backend holds (GPU, GPU or CPU), given the
    /// prompt's chain of 16-token hashes.
    pub fn matched(&self, chain: &[[u8; 8]]) -> (usize, usize) {
        self.held.lock().matched(chain)
    }

    /// Bounds the record by the engine's KV capacity when it publishes it:
    /// [`TIERS`] times its GPU blocks, at most [`MAX_BLOCKS`].
    pub fn bound(&self, capacity: Option<prefix_router_core::units::Tokens>) {
        let mut held = self.held.lock();
        let blocks = capacity.map(|t| t.0.div_ceil(held.block_size()));
        let max = blocks.map_or(MAX_BLOCKS, |b| b.saturating_mul(TIERS).clamp(1, MAX_BLOCKS));
        held.set_max_blocks(max);
    }

    /// Blocks held.
    pub fn blocks(&self) -> usize {
        self.held.lock().len()
    }

    /// Blocks held on GPU, and elsewhere.
    pub fn by_medium(&self) -> (usize, usize) {
        self.held.lock().by_medium()
    }

    /// The record's mode.
    pub fn mode(&self) -> RecordMode {
        match (self.exact(), self.degraded()) {
            (true, _) => RecordMode::Exact,
            (false, true) => RecordMode::Degraded,
            (false, false) => RecordMode::Connecting,
        }
    }

    /// Whether the record says what the backend holds: connected and whole.
    pub fn exact(&self) -> bool {
        self.connected.load(Relaxed) && !self.degraded()
    }

    /// Whether the record may miss blocks the backend holds, or hold blocks it lost.
    pub fn degraded(&self) -> bool {
        self.degraded.load(Relaxed)
            || self.suspect.load(Relaxed)
            || self.held.lock().whole() == Whole::No
    }

    /// The backend fails its health checks: its engine may be restarting with an empty
    /// cache, and its publisher may say nothing until it stores again. The record is not
    /// trusted until the engine's next batch says which: numbers that start over (a
    /// restart: the record is cleared) or that go on (the blocks are still there).
    pub fn lost(&self) {
        self.suspect.store(true, Relaxed);
    }

    /// Applies the batch numbered `seq`, if it is the next one; says what to do otherwise.
    /// `live`: it came from the PUB socket (a replayed one never means a restart).
    fn receive(&self, seq: u64, payload: &[u8], live: bool) -> Received {
        let next = self.next.load(Relaxed);
        let started = next != NOT_STARTED;
        if started && seq < next {
            if !live {
                return Received::Stale;
            }
            // Numbers went back: the publisher restarted, and so did its cache.
            self.held.lock().clear();
            self.degraded.store(false, Relaxed);
            self.next.store(NOT_STARTED, Relaxed);
            return self.receive(seq, payload, live);
        }
        if live {
            self.suspect.store(false, Relaxed);
        }
        let expected = if started { next } else { 0 };
        if seq > expected {
            self.counts.gaps.fetch_add(1, Relaxed);
            return Received::Gap { from: expected };
        }
        self.apply(payload);
        self.next.store(seq + 1, Relaxed);
        Received::Applied
    }

    fn apply(&self, payload: &[u8]) {
        let batch = match decode::batch(payload) {
            Ok(batch) => batch,
            Err(e) => {
                log::debug!("KV event batch not decoded: {e}");
                self.counts.decode_failures.fetch_add(1, Relaxed);
                self.degraded.store(true, Relaxed);
                return;
            }
        };
        let mut held = self.held.lock();
        for event in &batch.events {
            held.apply(event);
            let kind = match event {
                Event::Stored(_) => 0,
                Event::Removed(_) => 1,
                Event::Cleared => 2,
                Event::Unknown(_) => 3,
            };
            self.counts.events[kind].fetch_add(1, Relaxed);
            if kind == 2 {
                self.degraded.store(false, Relaxed);
            }
        }
        self.counts.batches.fetch_add(1, Relaxed);
    }

    /// Applies the batch numbered `seq` past a gap that could not be filled: the record is
    /// no longer whole.
    fn skip_to(&self, seq: u64, payload: &[u8]) {
        self.degraded.store(true, Relaxed);
        self.next.store(seq, Relaxed);
        self.receive(seq, payload, false);
    }
}

enum Received {
    Applied,
    Stale,
    Gap { from: u64 },
}

/// Subscribes to `subscription` into `record`, reconnecting with backoff, until dropped.
pub async fn run(subscription: Subscription, record: Arc<Record>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match follow(&subscription, &record).await {
            Ok(()) => backoff = Duration::from_millis(100),
            Err(e) => log::warn!("KV events from {}: {e}", subscription.endpoint),
        }
        record.connected.store(false, Relaxed);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

async fn follow(subscription: &Subscription, record: &Record) -> Result<(), zeromq::ZmqError> {
    let mut socket = SubSocket::new();
    socket.connect(&subscription.endpoint).await?;
    socket.subscribe(&subscription.topic).await?;
    record.connected.store(true, Relaxed);
    loop {
        let message = socket.recv().await?;
        let Some((seq, payload)) = frames(&message) else {
            record.counts.decode_failures.fetch_add(1, Relaxed);
            continue;
        };
        if let Received::Gap { from } = record.receive(seq, &payload, true) {
            fill(subscription, record, from, seq).await;
            if let Received::Gap { .. } = record.receive(seq, &payload, false) {
                record.skip_to(seq, &payload);
            }
        }
    }
}

/// Asks the replay socket for the batches from `from` on and applies them; leaves the
/// record's position where they ended.
async fn fill(subscription: &Subscription, record: &Record, from: u64, upto: u64) {
    let Some(endpoint) = &subscription.replay else {
        return;
    };
    let replayed = tokio::time::timeout(REPLAY_TIMEOUT * 2, async {
        let mut dealer = DealerSocket::new();
        dealer.connect(endpoint).await?;
        let mut request = ZmqMessage::from(Bytes::new());
        request.push_back(Bytes::copy_from_slice(&from.to_be_bytes()));
        dealer.send(request).await?;
        loop {
            let reply = tokio::time::timeout(REPLAY_TIMEOUT, dealer.recv()).await;
            let Ok(reply) = reply else {
                return Ok::<_, zeromq::ZmqError>(());
            };
            let Some((seq, payload)) = frames(&reply?) else {
                continue;
            };
            if seq == u64::MAX || seq >= upto {
                return Ok(());
            }
            if let Received::Gap { .. } = record.receive(seq, &payload, false) {
                record.skip_to(seq, &payload);
            }
        }
    })
    .await;
    if matches!(replayed, Ok(Ok(()))) && record.next.load(Relaxed) == upto && !record.degraded() {
        record.counts.replays.fetch_add(1, Relaxed);
    }
}

/// The sequence number and payload of a message: its last two frames (a published
/// `[topic, seq, payload]`, a replayed `["", topic, seq, payload]` or older 2- and
/// 3-frame replies alike). A sequence number of -1 (the end of a replay) is `u64::MAX`.
fn frames(message: &ZmqMessage) -> Option<(u64, Bytes)> {
    let n = message.len();
    let seq = message.get(n.checked_sub(2)?)?;
    let seq = u64::from_be_bytes(seq.as_ref().try_into().ok()?);
    Some((seq, message.get(n - 1)?.clone()))
}

/// Where backends publish their KV events. Off by default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvEventSettings {
    /// Each backend's PUB endpoint, from its host and port: `tcp://{host}:5557`, and
    /// `{port}`, `{port+N}`, `{port-N}` (`kv_events`). Default none: no subscription.
    pub endpoint: Option<String>,
    /// Each backend's replay endpoint, the same way (`kv_events_replay`). Default none.
    pub replay: Option<String>,
    /// The topic (`kv_events_topic`). Default empty, as vLLM's.
    pub topic: String,
}

/// Blocks one backend's record holds at most when the engine does not publish its KV
/// capacity: 8 M blocks of 16 tokens, 128 M tokens, more than any one engine's KV cache;
/// past it, the record is not whole. About 90 bytes a block (88 measured at 2 M blocks).
pub const MAX_BLOCKS: usize = 8 << 20;

/// A record's bound, in GPU capacities, when the engine publishes its capacity
/// (`vllm:cache_config_info`): room for its GPU blocks and up to 15 times as many
/// offloaded to CPU or other tiers.
pub const TIERS: usize = 16;

/// Tokens per engine block a record starts with (vLLM's default `block_size`); the
/// engine's first store sets its own.
pub const BLOCK_SIZE: usize = 16;

/// `template` with `{host}`, `{port}` and `{port+N}` / `{port-N}` filled in; `None` when
/// the port falls outside 1..=65535.
pub fn expand(template: &str, host: &str, port: u16) -> Option<String> {
    let mut out = template
        .replace("{host}", host)
        .replace("{port}", &port.to_string());
    while let Some(start) = out.find("{port") {
        let end = start + out[start..].find('}')?;
        let offset: i64 = out[start + 5..end].trim_start_matches('+').parse().ok()?;
        let shifted = u16::try_from(i64::from(port) + offset)
            .ok()
            .filter(|&p| p > 0)?;
        out.replace_range(start..=end, &shifted.to_string());
    }
    Some(out)
}

/// The records of the backends that publish, by backend, and the prompts sent to them
/// without an answer yet.
pub struct Records {
    map: parking_lot::RwLock<std::collections::HashMap<prefix_router_core::BackendId, Arc<Record>>>,
    sent: Arc<Sent>,
    metrics: KvEventMetrics,
}

impl Records {
    /// No record yet; `metrics` show them.
    pub fn new(metrics: KvEventMetrics) -> Self {
        Records {
            map: Default::default(),
            sent: Arc::default(),
            metrics,
        }
    }

    /// Sets the metrics of every backend of `snapshot` that has a record.
    pub fn set_gauges(&self, snapshot: &crate::fleet::Snapshot) {
        let map = self.map.read();
        for backend in &snapshot.backends {
            if let Some(record) = map.get(&backend.id) {
                self.metrics.set(&backend.worker.url, record);
            }
        }
    }

    /// `backend`'s record, if it has one.
    pub fn get(&self, backend: prefix_router_core::BackendId) -> Option<Arc<Record>> {
        self.map.read().get(&backend).cloned()
    }

    /// `candidates` with what each backend's exact record holds of `request` (token mode
    /// only), or a prompt sent there without an answer yet shares with it, whichever is
    /// more; `None` when no candidate has a record.
    pub fn recorded(
        &self,
        request: &prefix_router_core::policy::Request,
        candidates: &[prefix_router_core::policy::Candidate],
    ) -> Option<Vec<prefix_router_core::policy::Candidate>> {
        let tokens = request.tokens?;
        let map = self.map.read();
        if map.is_empty() {
            return None;
        }
        let unanswered = self.sent.matched(tokens.chain);
        let held = |c: &prefix_router_core::policy::Candidate| {
            let record = map.get(&c.id).filter(|r| r.exact())?;
            let (gpu, _) = record.matched(tokens.chain);
            let gpu = prefix_router_core::units::Tokens(gpu);
            Some(Sent::held(gpu, &unanswered, c.id).text())
        };
        let out: Vec<_> = (candidates.iter())
            .map(|c| prefix_router_core::policy::Candidate {
                recorded: held(c),
                ..*c
            })
            .collect();
        out.iter().any(|c| c.recorded.is_some()).then_some(out)
    }

    /// Counts `request`'s prompt as held by `backend` until the guard is dropped, when the
    /// backend publishes and the request has tokens.
    pub fn sent(
        &self,
        request: &prefix_router_core::policy::Request,
        backend: prefix_router_core::BackendId,
    ) -> Option<SentPrompt> {
        let tokens = request.tokens?;
        (self.map.read().contains_key(&backend)).then(|| self.sent.add(backend, tokens.chain))
    }
}

/// Keeps one subscriber per backend of the fleet running (a background service).
pub struct Subscribers {
    settings: KvEventSettings,
    fleet: Arc<crate::fleet::Fleet>,
    records: Arc<Records>,
}

impl Subscribers {
    /// Subscribers to `fleet`'s backends as `settings` say, into `records`.
    pub fn new(
        settings: KvEventSettings,
        fleet: Arc<crate::fleet::Fleet>,
        records: Arc<Records>,
    ) -> Self {
        Subscribers {
            settings,
            fleet,
            records,
        }
    }

    /// Starts a subscriber for each backend without one; stops those of backends gone.
    fn reconcile(
        &self,
        tasks: &mut std::collections::HashMap<
            prefix_router_core::BackendId,
            tokio::task::JoinHandle<()>,
        >,
    ) {
        let Some(template) = &self.settings.endpoint else {
            return;
        };
        let snapshot = self.fleet.snapshot();
        let live: Vec<_> = snapshot.backends.iter().map(|b| b.id).collect();
        for backend in snapshot.backends.iter() {
            if let Some(record) = self.records.map.read().get(&backend.id) {
                record.bound(backend.account.capacity());
                if backend.is_failing() {
                    record.lost();
                }
            }
        }
        tasks.retain(|id, task| {
            let keep = live.contains(id);
            if !keep {
                task.abort();
                self.records.map.write().remove(id);
            }
            keep
        });
        for backend in snapshot.backends.iter() {
            if tasks.contains_key(&backend.id) {
                continue;
            }
            let (host, port) = (backend.addr.ip().to_string(), backend.addr.port());
            let Some(endpoint) = expand(template, &host, port) else {
                continue;
            };
            let replay = (self.settings.replay.as_deref()).and_then(|t| expand(t, &host, port));
            let Some(record) = Record::new(BLOCK_SIZE, MAX_BLOCKS).map(Arc::new) else {
                continue;
            };
            self.records
                .map
                .write()
                .insert(backend.id, Arc::clone(&record));
            let subscription = Subscription {
                endpoint,
                replay,
                topic: self.settings.topic.clone(),
            };
            tasks.insert(backend.id, tokio::spawn(run(subscription, record)));
        }
    }
}

#[async_trait::async_trait]
impl pingora_core::services::background::BackgroundService for Subscribers {
    async fn start(&self, mut shutdown: pingora_core::server::ShutdownWatch) {
        let mut tasks = std::collections::HashMap::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tick.tick() => self.reconcile(&mut tasks),
                _ = shutdown.changed() => break,
            }
        }
        tasks.values().for_each(|t| t.abort());
    }
}

#[cfg(test)]
mod tests {
    use super::expand;

    #[test]
    fn endpoints_come_from_each_backends_host_and_port() {
        let e = |t: &str| expand(t, "10.0.0.5", 8000);
        assert_eq!(
            e("tcp://{host}:5557").as_deref(),
            Some("tcp://10.0.0.5:5557")
        );
        assert_eq!(
            e("tcp://{host}:{port+1}").as_deref(),
            Some("tcp://10.0.0.5:8001")
        );
        assert_eq!(
            e("tcp://{host}:{port-2000}").as_deref(),
            Some("tcp://10.0.0.5:6000")
        );
        assert_eq!(e("tcp://{host}:{port+60000}"), None);
        assert_eq!(
            e("tcp://127.0.0.1:{port}").as_deref(),
            Some("tcp://127.0.0.1:8000")
        );
    }
}
