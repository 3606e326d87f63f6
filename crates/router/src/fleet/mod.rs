//! The fleet: the current set of backends as an immutable snapshot swapped atomically when
//! discovery changes it, their in-flight load, and their health. Policies never see this
//! module: they get [`Candidate`]s built from the ready backends.

mod backend;
mod capacity;
mod discovery;
mod health;
mod worker;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use pingora_core::upstreams::peer::HttpPeer;
use prefix_router_core::policy::Candidate;
use prefix_router_core::{BackendId, TEXT_BYTES_PER_TOKEN};
use smallvec::SmallVec;
use tokio::sync::watch;

pub use backend::{Backend, LoadGuard};
pub use discovery::Discovery;
pub use health::{HealthChecks, HealthSettings};
pub use worker::{Worker, WorkerError};

/// The backends at one moment. Never changes once published.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Members, in configuration order.
    pub backends: Vec<Arc<Backend>>,
    /// Increases by one with every published change.
    pub generation: u64,
}

/// The ready backends of one snapshot, as candidates for a policy.
pub struct Ready {
    snapshot: Arc<Snapshot>,
    members: SmallVec<[usize; 16]>,
    /// The candidates, in the same order as their backends.
    pub candidates: SmallVec<[Candidate; 16]>,
}

impl Ready {
    /// Those of the candidates with fewer than `limit` requests in flight.
    pub fn below(&self, limit: usize) -> Ready {
        let keep = |i: &usize| self.candidates[*i].load < limit;
        let kept: SmallVec<[usize; 16]> = (0..self.candidates.len()).filter(keep).collect();
        Ready {
            snapshot: Arc::clone(&self.snapshot),
            members: kept.iter().map(|&i| self.members[i]).collect(),
            candidates: kept.iter().map(|&i| self.candidates[i]).collect(),
        }
    }

    /// The backend of candidate `index`.
    pub fn backend(&self, index: usize) -> Option<&Arc<Backend>> {
        let member = *self.members.get(index)?;
        self.snapshot.backends.get(member)
    }
}

/// Backends, swapped as a whole on change.
pub struct Fleet {
    current: ArcSwap<Snapshot>,
    /// Serializes [`Fleet::replace`].
    replacing: Mutex<()>,
    next_id: std::sync::atomic::AtomicU32,
    generation: AtomicU64,
    connect_timeout: Mutex<Duration>,
    /// Bumped whenever a backend's readiness may have changed.
    readiness: watch::Sender<u64>,
    /// Woken (one waiter) whenever a request in flight ends.
    freed: Arc<tokio::sync::Notify>,
}

impl Fleet {
    /// An empty fleet whose backends connect within `connect_timeout`.
    pub fn new(connect_timeout: Duration) -> Self {
        Fleet {
            current: ArcSwap::from_pointee(Snapshot::default()),
            replacing: Mutex::new(()),
            next_id: std::sync::atomic::AtomicU32::new(0),
            generation: AtomicU64::new(0),
            connect_timeout: Mutex::new(connect_timeout),
            readiness: watch::Sender::new(0),
            freed: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Resolves when a request in flight ends (the longest waiter first): a slot freed.
    pub fn slot_freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.freed.notified()
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// The ready backends except `exclude`, as policy candidates.
    pub fn ready(&self, exclude: &[BackendId]) -> Ready {
        let snapshot = self.snapshot();
        let mut members = SmallVec::new();
        let mut candidates = SmallVec::new();
        for (i, b) in snapshot.backends.iter().enumerate() {
            if b.is_ready() && !exclude.contains(&b.id) {
                members.push(i);
                candidates.push(Candidate {
                    active: b.active_text(),
                    capacity: b.kv_tokens() * TEXT_BYTES_PER_TOKEN,
                    ..Candidate::new(b.id, b.load(), b.pending_prefill(), b.hash)
                });
            }
        }
        Ready {
            snapshot,
            members,
            candidates,
        }
    }

    /// Whether some backend has not had its first health check yet (a fresh start, or a
    /// backend just added) and has not failed one either.
    pub fn awaiting_first_check(&self) -> bool {
        self.snapshot()
            .backends
            .iter()
            .any(|b| b.awaiting_first_check())
    }

    /// Waits until `done` holds of the fleet, looking again whenever a backend's readiness
    /// may have changed, for at most `timeout`; returns whether it held.
    pub async fn wait_until(&self, timeout: Duration, done: impl Fn(&Fleet) -> bool) -> bool {
        let mut changes = self.readiness.subscribe();
        let wait = async {
            while !done(self) {
                if changes.changed().await.is_err() {
                    return false;
                }
            }
            true
        };
        tokio::time::timeout(timeout, wait).await.unwrap_or(false)
    }

    /// Wakes whoever waits in [`Fleet::wait_until`]: a backend's readiness changed.
    pub fn readiness_changed(&self) {
        self.readiness.send_modify(|n| *n += 1);
    }

    /// Publishes `members` as the fleet if they differ from the current one, keeping the
    /// state of backends already present. Returns whether anything changed.
    pub fn replace(&self, members: &[(Worker, SocketAddr)]) -> bool {
        let _one_at_a_time = self.replacing.lock();
        let current = self.current.load_full();
        let same = current.backends.len() == members.len()
            && current
                .backends
                .iter()
                .zip(members)
                .all(|(b, (w, a))| &b.worker == w && &b.addr == a);
        if same {
            return false;
        }
        let backends: Vec<Arc<Backend>> = members
            .iter()
            .map(|(worker, addr)| self.member(&current, worker, *addr))
            .collect();
        let generation = self.generation.fetch_add(1, Relaxed) + 1;
        self.current.store(Arc::new(Snapshot {
            backends,
            generation,
        }));
        self.readiness_changed();
        true
    }

    /// The backend for `worker` at `addr`: the current one if it exists, else a new one.
    fn member(&self, current: &Snapshot, worker: &Worker, addr: SocketAddr) -> Arc<Backend> {
        let existing = current
            .backends
            .iter()
            .find(|b| b.addr == addr && &b.worker == worker);
        match existing {
            Some(backend) => Arc::clone(backend),
            None => {
                let id = BackendId(self.next_id.fetch_add(1, Relaxed));
                let freed = Arc::clone(&self.freed);
                Arc::new(Backend::new(
                    id,
                    worker.clone(),
                    addr,
                    self.peer(addr),
                    freed,
                ))
            }
        }
    }

    /// Connect timeout for backends added from now on.
    pub fn set_connect_timeout(&self, timeout: Duration) {
        *self.connect_timeout.lock() = timeout;
    }

    /// Peer settings of a new backend. Read and write timeouts are set per exchange by the
    /// transport; only connecting is the peer's.
    fn peer(&self, addr: SocketAddr) -> HttpPeer {
        let mut peer = HttpPeer::new(addr, false, String::new());
        let connect = *self.connect_timeout.lock();
        peer.options.connection_timeout = Some(connect);
        peer.options.total_connection_timeout = Some(connect);
        peer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet() -> Fleet {
        Fleet::new(Duration::from_secs(1))
    }

    fn member(port: u16) -> (Worker, SocketAddr) {
        let worker = Worker::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        (worker, SocketAddr::from(([127, 0, 0, 1], port)))
    }

    #[test]
    fn replace_keeps_state_of_kept_backends_and_drops_removed() {
        let fleet = fleet();
        assert!(fleet.replace(&[member(1), member(2)]));
        let first = fleet.snapshot();
        let guard = first.backends[0].acquire(30, 10);
        assert_eq!(first.backends[0].pending_prefill(), 10);
        assert!(!fleet.replace(&[member(1), member(2)]));
        assert!(fleet.replace(&[member(1), member(3)]));
        let second = fleet.snapshot();
        assert_eq!(second.backends[0].id, first.backends[0].id);
        assert_eq!(second.backends[0].load(), 1);
        assert_eq!(second.backends[0].active_text(), 30);
        assert_ne!(second.backends[1].id, first.backends[1].id);
        guard.answered();
        assert_eq!(second.backends[0].pending_prefill(), 0);
        drop(guard);
        assert_eq!(second.backends[0].load(), 0);
    }

    #[test]
    fn only_checked_healthy_backends_are_ready() {
        let fleet = fleet();
        fleet.replace(&[member(1), member(2)]);
        assert!(fleet.ready(&[]).candidates.is_empty());
        let snap = fleet.snapshot();
        snap.backends[0].mark_checked();
        snap.backends[1].mark_checked();
        snap.backends[1].set_healthy(false);
        let ready = fleet.ready(&[]);
        assert_eq!(ready.candidates.len(), 1);
        assert_eq!(ready.backend(0).unwrap().id, snap.backends[0].id);
        assert!(fleet.ready(&[snap.backends[0].id]).candidates.is_empty());
    }

    #[test]
    fn checks_flip_health_after_their_thresholds() {
        let fleet = fleet();
        fleet.replace(&[member(1)]);
        let b = &fleet.snapshot().backends[0];
        assert_eq!(b.observe_check(true, 2, 2), None);
        assert!(b.is_ready());
        assert_eq!(b.observe_check(false, 2, 2), None);
        assert_eq!(b.observe_check(true, 2, 2), None);
        assert_eq!(b.observe_check(false, 2, 2), None);
        assert_eq!(b.observe_check(false, 2, 2), Some(false));
        assert!(!b.is_ready());
        assert_eq!(b.observe_check(true, 2, 2), None);
        assert_eq!(b.observe_check(true, 2, 2), Some(true));
        assert!(b.is_ready());
    }

    #[tokio::test]
    async fn first_checks_wake_the_waiter() {
        let fleet = Arc::new(fleet());
        fleet.replace(&[member(1)]);
        let checker = Arc::clone(&fleet);
        tokio::spawn(async move {
            checker.snapshot().backends[0].observe_check(true, 1, 1);
            checker.readiness_changed();
        });
        let one_ready = |f: &Fleet| f.ready(&[]).candidates.len() == 1;
        assert!(fleet.wait_until(Duration::from_secs(5), one_ready).await);
    }
}
