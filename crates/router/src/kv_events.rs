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
//! Not wired into routing yet: nothing starts a subscriber but tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use prefix_router_core::events::decode::{self, Event};
use prefix_router_core::events::held::{Held, Whole};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

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
    /// The sequence number expected next ([`NOT_STARTED`] before the first).
    next: AtomicU64,
    /// Whether an event could not be applied or a gap could not be filled.
    degraded: AtomicBool,
    /// Counters: batches applied, decode failures, gaps, replays.
    pub counts: Counts,
}

/// What a subscriber saw.
#[derive(Debug, Default)]
pub struct Counts {
    /// Batches applied.
    pub batches: AtomicU64,
    /// Events applied.
    pub events: AtomicU64,
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
            next: AtomicU64::new(NOT_STARTED),
            degraded: AtomicBool::new(false),
            counts: Counts::default(),
        })
    }

    /// Tokens of a prompt's leading blocks the backend holds (GPU, GPU or CPU), given the
    /// prompt's chain of 16-token hashes.
    pub fn matched(&self, chain: &[[u8; 8]]) -> (usize, usize) {
        self.held.lock().matched(chain)
    }

    /// Blocks held.
    pub fn blocks(&self) -> usize {
        self.held.lock().len()
    }

    /// Whether the record may miss blocks the backend holds.
    pub fn degraded(&self) -> bool {
        self.degraded.load(Relaxed) || self.held.lock().whole() == Whole::No
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
            if matches!(event, Event::Cleared) {
                self.degraded.store(false, Relaxed);
            }
        }
        self.counts.batches.fetch_add(1, Relaxed);
        (self.counts.events).fetch_add(batch.events.len() as u64, Relaxed);
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
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

async fn follow(subscription: &Subscription, record: &Record) -> Result<(), zeromq::ZmqError> {
    let mut socket = SubSocket::new();
    socket.connect(&subscription.endpoint).await?;
    socket.subscribe(&subscription.topic).await?;
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
