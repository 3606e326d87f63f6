//! The fleet: the current set of backends as an immutable snapshot swapped atomically when
//! discovery changes it, and their health. Policies never see this module: the ledger
//! builds their candidates from the accounts of the ready backends.

mod backend;
mod discovery;
mod fetch;
mod gauges;
mod health;
mod metrics;
mod models;
mod outlier;
mod reader;
mod worker;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::tls::UpstreamTls;
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use pingora_core::upstreams::peer::HttpPeer;
use prefix_router_core::BackendId;
use prefix_router_core::ledger::Account;
use smallvec::SmallVec;
use tokio::sync::watch;

pub use backend::Backend;
pub use discovery::{Discovery, DiscoverySettings, Resolving};
pub use gauges::FleetGauges;
pub use health::{HealthChecks, HealthSettings};
pub use models::{Models, Served, ServedModel};
pub use outlier::{Ejection, Ended, OutlierSettings, Reason};
pub use reader::{AfterRead, MetricsReader, ReaderSettings};
pub use worker::{Leg, Role, Worker, WorkerError, add_pool, add_role};

/// The backends at one moment. Never changes once published.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Members, in configuration order.
    pub backends: Vec<Arc<Backend>>,
    /// Increases by one with every published change.
    pub generation: u64,
    /// Whether some member serves one leg of a disaggregated request only.
    pub disaggregated: bool,
}

impl Snapshot {
    /// The accounts of every member, in order.
    pub fn accounts(&self) -> Vec<&Arc<Account>> {
        self.backends.iter().map(|b| &b.account).collect()
    }
}

/// The ready backends of one snapshot.
pub struct Ready {
    snapshot: Arc<Snapshot>,
    members: SmallVec<[usize; 16]>,
}

impl Ready {
    /// Whether no backend is ready.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// How many are.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Their accounts, in order.
    pub fn accounts(&self) -> SmallVec<[&Arc<Account>; 16]> {
        let backends = &self.snapshot.backends;
        self.members.iter().map(|&m| &backends[m].account).collect()
    }

    /// The `index`th ready backend.
    pub fn backend(&self, index: usize) -> Option<&Arc<Backend>> {
        let member = *self.members.get(index)?;
        self.snapshot.backends.get(member)
    }

    /// Those that may get requests for `model` (all, for none): that list it, or never
    /// listed their models. Where no backend lists it and the fleet serves one model, all
    /// of them: the name chooses nothing, and the backends answer for it. That is the
    /// fleet's models, ready or not: a model whose backends are all down leaves none here,
    /// never another model's backends.
    pub fn serving(mut self, model: Option<&[u8]>) -> Ready {
        let Some(model) = model else {
            return self;
        };
        if !self.listed_anywhere(model) && self.one_model() {
            return self;
        }
        let all = &self.snapshot.backends;
        self.members.retain(|m| all[*m].models.serves(model));
        self
    }

    /// Whether some backend of the fleet, ready or not, may get requests for `model`
    /// ([`Ready::serving`]).
    pub fn known(&self, model: &[u8]) -> bool {
        self.listed_anywhere(model) || self.one_model()
    }

    /// Whether a backend of the fleet, ready or not, may serve `model`.
    fn listed_anywhere(&self, model: &[u8]) -> bool {
        self.snapshot
            .backends
            .iter()
            .any(|b| b.models.serves(model))
    }

    /// Whether the fleet's backends list one model at most.
    fn one_model(&self) -> bool {
        self.fleet_models().len() <= 1
    }

    /// Only the backend `id`, if it is ready.
    pub fn only(mut self, id: BackendId) -> Ready {
        let backends = &self.snapshot.backends;
        self.members.retain(|m| backends[*m].account.id == id);
        self
    }

    /// Those whose role serves `leg` ([`Role::serves`]).
    pub fn for_leg(mut self, leg: Leg) -> Ready {
        if !self.snapshot.disaggregated {
            return self;
        }
        let backends = &self.snapshot.backends;
        self.members
            .retain(|m| backends[*m].worker.role.serves(leg));
        self
    }

    /// Those whose address is in `subset` (all, for none): the endpoints a gateway allows.
    pub fn within(mut self, subset: Option<&[SocketAddr]>) -> Ready {
        if let Some(subset) = subset {
            let backends = &self.snapshot.backends;
            self.members.retain(|m| subset.contains(&backends[*m].addr));
        }
        self
    }

    /// The models they list, by name, with the adapters' parents; sorted.
    pub fn models(&self) -> Vec<ServedModel> {
        let backends = &self.snapshot.backends;
        listed(self.members.iter().map(|&m| &backends[m]))
    }

    /// The models the fleet's backends list, ready or not; sorted.
    pub fn fleet_models(&self) -> Vec<ServedModel> {
        listed(self.snapshot.backends.iter())
    }
}

/// The models `backends` list, by name, with the adapters' parents; sorted.
fn listed<'a>(backends: impl Iterator<Item = &'a Arc<Backend>>) -> Vec<ServedModel> {
    let lists = backends.filter_map(|b| b.models.served());
    let mut all: Vec<ServedModel> = lists.flat_map(|s| s.models.clone()).collect();
    all.sort_by(|a, b| a.id.cmp(&b.id));
    all.dedup_by(|a, b| a.id == b.id);
    all
}

/// Backends, swapped as a whole on change.
pub struct Fleet {
    current: ArcSwap<Snapshot>,
    /// Serializes [`Fleet::replace`].
    replacing: Mutex<()>,
    next_id: std::sync::atomic::AtomicU32,
    generation: AtomicU64,
    /// Bumped whenever a backend's readiness may have changed.
    readiness: watch::Sender<u64>,
    /// Woken (one waiter) whenever a request in flight ends.
    freed: Arc<tokio::sync::Notify>,
    /// How `https://` workers are verified.
    tls: UpstreamTls,
}

impl Fleet {
    /// An empty fleet.
    pub fn new() -> Self {
        Fleet {
            current: ArcSwap::from_pointee(Snapshot::default()),
            replacing: Mutex::new(()),
            next_id: std::sync::atomic::AtomicU32::new(0),
            generation: AtomicU64::new(0),
            readiness: watch::Sender::new(0),
            freed: Arc::new(tokio::sync::Notify::new()),
            tls: UpstreamTls::default(),
        }
    }

    /// An empty fleet whose `https://` workers are verified as `tls` says.
    pub fn with_tls(tls: UpstreamTls) -> Self {
        Fleet {
            tls,
            ..Fleet::new()
        }
    }

    /// How its `https://` workers are verified.
    pub fn tls(&self) -> &UpstreamTls {
        &self.tls
    }

    /// Whether one more backend may be ejected: fewer than `settings` allow are now.
    pub fn may_eject(&self, settings: &OutlierSettings) -> bool {
        let snapshot = self.snapshot();
        let ejected = snapshot.backends.iter().filter(|b| b.is_ejected()).count();
        ejected < settings.max_ejected(snapshot.backends.len())
    }

    /// Resolves when a request in flight ends (the longest waiter first): a slot freed.
    pub fn slot_freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.freed.notified()
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// The ready backends except `exclude`.
    pub fn ready(&self, exclude: &[BackendId]) -> Ready {
        let snapshot = self.snapshot();
        let members = (snapshot.backends.iter().enumerate())
            .filter(|(_, b)| b.is_ready() && !exclude.contains(&b.id))
            .map(|(i, _)| i)
            .collect();
        Ready { snapshot, members }
    }

    /// Whether prefill and decode are disaggregated: some backend, ready or not, serves
    /// one of the two legs only.
    pub fn disaggregated(&self) -> bool {
        self.current.load().disaggregated
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
    /// state of backends already present; new ones connect within `connect`. Returns
    /// whether anything changed.
    pub fn replace(&self, members: &[(Worker, SocketAddr)], connect: Duration) -> bool {
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
            .map(|(worker, addr)| self.member(&current, worker, *addr, connect))
            .collect();
        let generation = self.generation.fetch_add(1, Relaxed) + 1;
        let disaggregated = (backends.iter()).any(|b| b.worker.role != Role::Both);
        self.current.store(Arc::new(Snapshot {
            backends,
            generation,
            disaggregated,
        }));
        self.readiness_changed();
        true
    }

    /// The backend for `worker` at `addr`: the current one if it exists, else a new one.
    fn member(
        &self,
        current: &Snapshot,
        worker: &Worker,
        addr: SocketAddr,
        connect: Duration,
    ) -> Arc<Backend> {
        let existing = current
            .backends
            .iter()
            .find(|b| b.addr == addr && &b.worker == worker);
        match existing {
            Some(backend) => Arc::clone(backend),
            None => {
                let id = BackendId(self.next_id.fetch_add(1, Relaxed));
                let freed = Arc::clone(&self.freed);
                let peer = self.peer(worker, addr, connect);
                let free = move || freed.notify_one();
                Arc::new(Backend::new(id, worker.clone(), addr, peer, free))
            }
        }
    }
}

impl Default for Fleet {
    fn default() -> Self {
        Fleet::new()
    }
}

impl Fleet {
    /// Peer settings of a new backend: TLS for an `https://` worker. Read and write
    /// timeouts are set per exchange by the transport; only connecting is the peer's.
    fn peer(&self, worker: &Worker, addr: SocketAddr, connect: Duration) -> HttpPeer {
        let mut peer = HttpPeer::new(addr, false, String::new());
        if worker.tls {
            self.tls.apply(&mut peer, &worker.host);
        }
        peer.options.connection_timeout = Some(connect);
        peer.options.total_connection_timeout = Some(connect);
        peer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_router_core::ledger::{self, Placing};
    use prefix_router_core::policy::{Decision, Outcome};
    use prefix_router_core::units::TextBytes;

    const CONNECT: Duration = Duration::from_secs(1);

    fn member(port: u16) -> (Worker, SocketAddr) {
        let worker = Worker::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        (worker, SocketAddr::from(([127, 0, 0, 1], port)))
    }

    #[test]
    fn replace_keeps_state_of_kept_backends_and_drops_removed() {
        let fleet = Fleet::new();
        assert!(fleet.replace(&[member(1), member(2)], CONNECT));
        let first = fleet.snapshot();
        let choose = |_: &[_], _| Decision {
            matched: TextBytes(20),
            ..Decision::new(0, Outcome::Balanced)
        };
        let seat = match ledger::place(&first.accounts(), 0, TextBytes(30), choose) {
            Placing::Placed { seat, .. } => seat,
            other => panic!("{other:?}"),
        };
        assert_eq!(first.backends[0].account.pending(), TextBytes(10));
        assert!(!fleet.replace(&[member(1), member(2)], CONNECT));
        assert!(fleet.replace(&[member(1), member(3)], CONNECT));
        let second = fleet.snapshot();
        assert_eq!(second.backends[0].id, first.backends[0].id);
        assert_eq!(second.backends[0].load(), 1);
        assert_ne!(second.backends[1].id, first.backends[1].id);
        seat.answered();
        assert_eq!(second.backends[0].account.pending(), TextBytes(0));
        drop(seat);
        assert_eq!(second.backends[0].load(), 0);
    }

    #[test]
    fn only_checked_healthy_backends_are_ready() {
        let fleet = Fleet::new();
        fleet.replace(&[member(1), member(2)], CONNECT);
        assert!(fleet.ready(&[]).is_empty());
        let snap = fleet.snapshot();
        snap.backends[0].mark_checked();
        snap.backends[1].mark_checked();
        snap.backends[1].set_healthy(false);
        let ready = fleet.ready(&[]);
        assert_eq!(ready.accounts().len(), 1);
        assert_eq!(ready.backend(0).unwrap().id, snap.backends[0].id);
        assert!(fleet.ready(&[snap.backends[0].id]).is_empty());
    }

    #[test]
    fn checks_flip_health_after_their_thresholds() {
        let fleet = Fleet::new();
        fleet.replace(&[member(1)], CONNECT);
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
        let fleet = Arc::new(Fleet::new());
        fleet.replace(&[member(1)], CONNECT);
        let checker = Arc::clone(&fleet);
        tokio::spawn(async move {
            checker.snapshot().backends[0].observe_check(true, 1, 1);
            checker.readiness_changed();
        });
        let one_ready = |f: &Fleet| !f.ready(&[]).is_empty();
        assert!(fleet.wait_until(Duration::from_secs(5), one_ready).await);
    }
}
