//! Sharing the conversation table, and which backend made each stored response
//! ([`crate::responses`]), among router replicas through Redis (or Valkey)
//! publish/subscribe. Each placement a replica makes of a conversation, and each response
//! id it learns, is published on a channel; every replica merges the others' into its own
//! tables. Replicas then agree on each conversation's home, and on where each response
//! lives, whichever replica a request reaches, at the cost of one note (48 bytes) per
//! routed request, batched off the request path. A message's first byte says what its
//! notes are ([`VERSION`]: placements, [`RESPONSES`]: response ids), so a replica skips
//! what it does not know, such as the placements of an older version during an upgrade.
//! Off unless `shared_table` is configured: a single router never needs it.
//!
//! Backends are named on the wire by the hash of their address, the same on every
//! replica. A replica that loses the server keeps routing on its own table and reconnects
//! with backoff; notes that cannot be sent are dropped and counted, never queued without
//! bound. The server is spoken to through the `redis` crate (one multiplexed connection
//! to publish, one to subscribe).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use log::{info, warn};
use parking_lot::Mutex;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use prefix_router_core::BackendId;
use prefix_router_core::policy::{Conversations, Note};
use prefix_router_core::units::TextBytes;
use tokio::sync::mpsc;

use crate::fleet::Fleet;
use crate::responses::ResponseHomes;
use futures_util::StreamExt;
use redis::RedisError;

use metrics::Direction;
pub use metrics::ReplicationMetrics;

mod metrics;

/// Notes waiting to be published at most; beyond, new ones are dropped.
const OUTBOX: usize = 1 << 16;
/// Notes published in one message at most.
const BATCH: usize = 1024;
/// Wire format version of placements, the first byte of their messages (1 had no shared
/// start).
const VERSION: u8 = 3;
/// The first byte of messages of response ids (notes of 0 bytes, whose conversation is the
/// id's key).
const RESPONSES: u8 = 2;
/// Bytes of one response id's note on the wire.
const NOTE_BYTES: usize = 40;
/// Bytes of one placement on the wire: a note and its shared start.
const PLACEMENT_BYTES: usize = NOTE_BYTES + 8;

/// Where replicas share their table.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedTable {
    /// `host:port` of the Redis or Valkey server.
    pub address: String,
    /// The channel the replicas of one fleet publish on. Default `prefix-router`.
    pub channel: String,
}

/// The tables a router shares.
pub struct Tables {
    /// Its conversation table, when its policy keeps one.
    pub conversations: Option<Arc<Conversations>>,
    /// Which backend made each stored response.
    pub responses: Arc<ResponseHomes>,
}

/// A note on its way out.
enum Outgoing {
    /// A placement.
    Placed(Note),
    /// A response id's key and the backend that made it.
    Response(u128, BackendId),
}

/// The replication of one router's tables, run as a background service.
pub struct Replication {
    settings: SharedTable,
    tables: Tables,
    fleet: Arc<Fleet>,
    metrics: ReplicationMetrics,
    /// This router's id in the table: its own notes come back from the server and are
    /// skipped.
    origin: u64,
    outbox: Mutex<Option<mpsc::Receiver<Outgoing>>>,
}

impl Replication {
    /// Replication of `tables` (whose placements carry `origin`) as `settings` say; from
    /// now on every note made in them is queued for publishing.
    pub fn new(
        settings: SharedTable,
        tables: Tables,
        fleet: Arc<Fleet>,
        metrics: ReplicationMetrics,
        origin: u64,
    ) -> Self {
        let (tx, rx) = mpsc::channel(OUTBOX);
        let dropped = metrics.notes.of(Direction::Dropped);
        let queue = move |note| {
            if tx.try_send(note).is_err() {
                dropped.inc();
            }
        };
        if let Some(conversations) = &tables.conversations {
            let queue = queue.clone();
            conversations.on_note(move |note| queue(Outgoing::Placed(note)));
        }
        (tables.responses).on_note(move |key, backend| queue(Outgoing::Response(key, backend)));
        Replication {
            settings,
            tables,
            fleet,
            metrics,
            origin,
            outbox: Mutex::new(Some(rx)),
        }
    }

    /// The server's client.
    fn client(&self) -> Result<redis::Client, RedisError> {
        redis::Client::open(format!("redis://{}/", self.settings.address))
    }

    /// Publishes queued notes until the connection fails.
    async fn publish(&self, outbox: &mut mpsc::Receiver<Outgoing>) -> Result<(), RedisError> {
        let mut connection = self.client()?.get_multiplexed_async_connection().await?;
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            if outbox.recv_many(&mut batch, BATCH).await == 0 {
                return Ok(());
            }
            let (mut placed, mut responses) = (Vec::new(), Vec::new());
            for note in batch.drain(..) {
                match note {
                    Outgoing::Placed(note) => placed.push(note),
                    Outgoing::Response(key, backend) => responses.push(Note {
                        conversation: key,
                        backend,
                        bytes: TextBytes(0),
                        shared: TextBytes(0),
                        origin: self.origin,
                    }),
                }
            }
            for (kind, notes) in [(VERSION, placed), (RESPONSES, responses)] {
                if notes.is_empty() {
                    continue;
                }
                let payload = self.encode(kind, &notes);
                let publish = redis::cmd("PUBLISH")
                    .arg(&self.settings.channel)
                    .arg(payload)
                    .query_async::<i64>(&mut connection)
                    .await;
                match publish {
                    Ok(_) => (self.metrics.notes).inc_by(Direction::Sent, notes.len() as u64),
                    Err(e) if e.is_io_error() || e.is_connection_dropped() => return Err(e),
                    Err(e) => warn!("shared table: the server refused a publish: {e}"),
                }
            }
        }
    }

    /// Merges the other replicas' notes until the connection fails.
    async fn subscribe(&self) -> Result<(), RedisError> {
        let mut pubsub = self.client()?.get_async_pubsub().await?;
        pubsub.subscribe(&self.settings.channel).await?;
        self.metrics.connected.set(1);
        info!("shared table: subscribed on {}", self.settings.address);
        let mut messages = pubsub.on_message();
        while let Some(message) = messages.next().await {
            self.merge(message.get_payload_bytes());
        }
        Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "the subscription ended",
        )))
    }

    /// A message of `notes` of `kind` ([`VERSION`] or [`RESPONSES`]).
    fn encode(&self, kind: u8, notes: &[Note]) -> Vec<u8> {
        let snapshot = self.fleet.snapshot();
        let hash_of = |id: BackendId| {
            snapshot
                .backends
                .iter()
                .find(|b| b.id == id)
                .map(|b| b.account.hash)
        };
        let mut payload = Vec::with_capacity(1 + notes.len() * PLACEMENT_BYTES);
        payload.push(kind);
        for note in notes {
            let Some(hash) = hash_of(note.backend) else {
                continue;
            };
            payload.extend_from_slice(&note.conversation.to_le_bytes());
            payload.extend_from_slice(&hash.to_le_bytes());
            payload.extend_from_slice(&(note.bytes.0 as u64).to_le_bytes());
            payload.extend_from_slice(&note.origin.to_le_bytes());
            if kind == VERSION {
                payload.extend_from_slice(&(note.shared.0 as u64).to_le_bytes());
            }
        }
        payload
    }

    fn merge(&self, payload: &[u8]) {
        let Some((&kind, records)) = payload.split_first() else {
            return;
        };
        let size = match kind {
            VERSION => PLACEMENT_BYTES,
            RESPONSES => NOTE_BYTES,
            _ => return,
        };
        let snapshot = self.fleet.snapshot();
        let mut merged = 0;
        for record in records.chunks_exact(size) {
            let Some(note) = decode(record) else {
                continue;
            };
            if note.origin == self.origin {
                continue;
            }
            let Some(backend) = snapshot
                .backends
                .iter()
                .find(|b| b.account.hash == note.hash)
            else {
                continue;
            };
            let text = |n: u64| TextBytes(usize::try_from(n).unwrap_or(usize::MAX));
            match (kind, &self.tables.conversations) {
                (RESPONSES, _) => self.tables.responses.merge(note.conversation, backend.id),
                (_, Some(conversations)) => conversations.merge(Note {
                    conversation: note.conversation,
                    backend: backend.id,
                    bytes: text(note.bytes),
                    shared: text(note.shared),
                    origin: note.origin,
                }),
                (_, None) => continue,
            }
            merged += 1;
        }
        self.metrics.notes.inc_by(Direction::Received, merged);
    }
}

/// One note as it travels.
struct Wire {
    conversation: u128,
    hash: u64,
    bytes: u64,
    origin: u64,
    /// 0 where the record has none (a response id's).
    shared: u64,
}

fn decode(record: &[u8]) -> Option<Wire> {
    let u64_at = |at: usize| Some(u64::from_le_bytes(record.get(at..at + 8)?.try_into().ok()?));
    Some(Wire {
        conversation: u128::from_le_bytes(record.get(..16)?.try_into().ok()?),
        hash: u64_at(16)?,
        bytes: u64_at(24)?,
        origin: u64_at(32)?,
        shared: u64_at(40).unwrap_or(0),
    })
}

#[async_trait]
impl BackgroundService for Replication {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(mut outbox) = self.outbox.lock().take() else {
            return;
        };
        let mut backoff = Duration::from_millis(100);
        loop {
            let started = std::time::Instant::now();
            let failed = tokio::select! {
                e = self.publish(&mut outbox) => e.err(),
                e = self.subscribe() => e.err(),
                _ = shutdown.changed() => return,
            };
            self.metrics.connected.set(0);
            if started.elapsed() > Duration::from_secs(10) {
                backoff = Duration::from_millis(100);
            }
            if let Some(e) = failed {
                warn!(
                    "shared table {}: {e}; reconnecting in {backoff:?}",
                    self.settings.address
                );
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = shutdown.changed() => return,
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use prefix_router_core::clock::Manual;

    use super::*;
    use crate::fleet::Worker;
    use crate::stats::Registry;

    /// A replica of id `origin` over a fleet of two backends, with a table of its own.
    fn replica(fleet: &Arc<Fleet>, origin: u64) -> Replication {
        let settings = SharedTable {
            address: "127.0.0.1:9".into(),
            channel: "test".into(),
        };
        let tables = Tables {
            conversations: Some(Arc::new(Conversations::new(Arc::new(Manual::default())))),
            responses: Arc::new(ResponseHomes::new(Duration::from_secs(60))),
        };
        let metrics = ReplicationMetrics::new(&Registry::new());
        Replication::new(settings, tables, Arc::clone(fleet), metrics, origin)
    }

    impl Replication {
        fn conversations(&self) -> &Conversations {
            self.tables.conversations.as_deref().unwrap()
        }
    }

    #[test]
    fn response_ids_travel_in_messages_of_their_own() {
        let fleet = fleet();
        let (a, b) = (replica(&fleet, 1), replica(&fleet, 2));
        let id = Note {
            conversation: 42,
            backend: BackendId(1),
            bytes: TextBytes(0),
            shared: TextBytes(0),
            origin: 1,
        };
        b.merge(&a.encode(RESPONSES, &[id]));
        assert_eq!(b.tables.responses.home_key(42), Some(BackendId(1)));
        assert_eq!(b.conversations().home_of(42), None, "not a conversation");
    }

    fn fleet() -> Arc<Fleet> {
        let fleet = Arc::new(Fleet::new());
        let member = |port: u16| {
            let worker = Worker::parse(&format!("http://127.0.0.1:{port}")).unwrap();
            (worker, SocketAddr::from(([127, 0, 0, 1], port)))
        };
        fleet.replace(&[member(1), member(2)], Duration::from_secs(1));
        fleet
    }

    fn note(conversation: u128, backend: u32, bytes: usize, origin: u64) -> Note {
        Note {
            conversation,
            backend: BackendId(backend),
            bytes: TextBytes(bytes),
            shared: TextBytes(0),
            origin,
        }
    }

    #[test]
    fn notes_travel_by_backend_hash_and_a_replica_skips_its_own() {
        let fleet = fleet();
        let (a, b) = (replica(&fleet, 1), replica(&fleet, 2));
        // 7 and 10 share a start of 100 bytes, which backend 1 holds once.
        let shared = |n: Note| Note {
            shared: TextBytes(100),
            ..n
        };
        let notes = [note(7, 1, 300, 1), note(8, 0, 0, 1), note(9, 0, 50, 2)];
        let payload = a.encode(VERSION, &[shared(notes[0]), notes[1], notes[2]]);
        assert_eq!(payload.len(), 1 + 3 * PLACEMENT_BYTES);
        b.merge(&payload);
        assert_eq!(b.conversations().home_of(7), Some((BackendId(1), 1)));
        // A release (0 bytes) of a conversation b never saw changes nothing; b's own note
        // coming back is skipped.
        assert_eq!(b.conversations().home_of(8), None);
        assert_eq!(b.conversations().home_of(9), None);
        b.merge(&a.encode(VERSION, &[shared(note(10, 1, 250, 1))]));
        let live = b
            .conversations()
            .held([BackendId(0), BackendId(1)].into_iter());
        assert_eq!((live[0].conversations, live[1].bytes), (0, TextBytes(450)));
    }

    #[test]
    fn payloads_of_another_version_or_cut_short_merge_nothing_whole() {
        let fleet = fleet();
        let (a, b) = (replica(&fleet, 1), replica(&fleet, 2));
        let mut payload = a.encode(VERSION, &[note(7, 1, 300, 1)]);
        payload[0] = VERSION + 1;
        b.merge(&payload);
        assert_eq!(b.conversations().home_of(7), None);
        let mut payload = a.encode(VERSION, &[note(7, 1, 300, 1), note(8, 1, 300, 1)]);
        payload.truncate(1 + PLACEMENT_BYTES + 10);
        b.merge(&payload);
        assert_eq!(b.conversations().home_of(7), Some((BackendId(1), 1)));
        assert_eq!(
            b.conversations().home_of(8),
            None,
            "a partial record is dropped"
        );
    }
}
