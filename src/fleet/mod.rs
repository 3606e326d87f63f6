//! The fleet: the current set of backends as an immutable snapshot swapped atomically when
//! discovery changes it, their in-flight load, and their health. Policies never see this
//! module: they get [`Candidate`]s built from the ready backends.

mod backend;
mod discovery;
mod health;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use pingora_core::upstreams::peer::HttpPeer;
use smallvec::SmallVec;

pub use backend::{Backend, LoadGuard};
pub use discovery::{Discover, FleetDiscovery};
pub use health::ReadyCheck;

use crate::BackendId;
use crate::config::{Timeouts, Worker};
use crate::policy::Candidate;

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
    /// The backend of candidate `index`.
    pub fn backend(&self, index: usize) -> Option<&Arc<Backend>> {
        let member = *self.members.get(index)?;
        self.snapshot.backends.get(member)
    }
}

/// Backends, swapped as a whole on change.
pub struct Fleet {
    current: ArcSwap<Snapshot>,
    known: Mutex<HashMap<SocketAddr, Arc<Backend>>>,
    next_id: AtomicU32,
    generation: AtomicU64,
    timeouts: Mutex<Timeouts>,
}

impl Fleet {
    /// An empty fleet whose backends will use `timeouts`.
    pub fn new(timeouts: Timeouts) -> Self {
        Fleet {
            current: ArcSwap::from_pointee(Snapshot::default()),
            known: Mutex::new(HashMap::new()),
            next_id: AtomicU32::new(0),
            generation: AtomicU64::new(0),
            timeouts: Mutex::new(timeouts),
        }
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
                candidates.push(Candidate::new(b.id, b.load(), b.pending_prefill(), b.hash));
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

    /// The backend at `addr` in the current snapshot.
    pub fn find(&self, addr: &SocketAddr) -> Option<Arc<Backend>> {
        self.known.lock().get(addr).cloned()
    }

    /// Publishes `members` as the fleet if they differ from the current one, keeping the
    /// state of backends already present. Returns whether anything changed.
    pub fn replace(&self, members: &[(Worker, SocketAddr)]) -> bool {
        let mut known = self.known.lock();
        let current = self.current.load();
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
            .map(|(worker, addr)| self.member(&mut known, worker, *addr))
            .collect();
        known.retain(|addr, _| backends.iter().any(|b| &b.addr == addr));
        let generation = self.generation.fetch_add(1, Relaxed) + 1;
        self.current.store(Arc::new(Snapshot {
            backends,
            generation,
        }));
        true
    }

    fn member(
        &self,
        known: &mut HashMap<SocketAddr, Arc<Backend>>,
        worker: &Worker,
        addr: SocketAddr,
    ) -> Arc<Backend> {
        match known.get(&addr) {
            Some(existing) if &existing.worker == worker => Arc::clone(existing),
            _ => {
                let id = BackendId(self.next_id.fetch_add(1, Relaxed));
                let backend = Arc::new(Backend::new(id, worker.clone(), addr, self.peer(addr)));
                known.insert(addr, Arc::clone(&backend));
                backend
            }
        }
    }

    /// Timeouts for backends added from now on.
    pub fn set_timeouts(&self, timeouts: Timeouts) {
        *self.timeouts.lock() = timeouts;
    }

    fn peer(&self, addr: SocketAddr) -> HttpPeer {
        let mut peer = HttpPeer::new(addr, false, String::new());
        let t = &*self.timeouts.lock();
        peer.options.connection_timeout = Some(t.connect);
        peer.options.total_connection_timeout = Some(t.connect);
        peer.options.read_timeout = Some(t.first_byte);
        peer.options.write_timeout = Some(t.upstream_write);
        peer.options.idle_timeout = Some(t.pool_idle);
        peer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn fleet() -> Fleet {
        let d = Duration::from_secs(1);
        Fleet::new(Timeouts {
            connect: d,
            first_byte: d,
            upstream_idle: d,
            upstream_write: d,
            pool_idle: d,
            client_read: d,
            client_body: d,
        })
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
        let guard = first.backends[0].acquire(10);
        assert_eq!(first.backends[0].pending_prefill(), 10);
        assert!(!fleet.replace(&[member(1), member(2)]));
        assert!(fleet.replace(&[member(1), member(3)]));
        let second = fleet.snapshot();
        assert_eq!(second.backends[0].id, first.backends[0].id);
        assert_eq!(second.backends[0].load(), 1);
        assert_ne!(second.backends[1].id, first.backends[1].id);
        assert!(fleet.find(&member(2).1).is_none());
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
}
