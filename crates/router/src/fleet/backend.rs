//! One backend: its address, its peer settings, its health, and its account in the
//! core's ledger (in-flight load, pending prefill, published KV capacity), which a
//! [`Seat`](prefix_router_core::ledger::Seat) releases however a request ends.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};

use pingora_core::upstreams::peer::HttpPeer;
use prefix_router_core::BackendId;
use prefix_router_core::ledger::Account;
use xxhash_rust::xxh3::xxh3_64;

use super::outlier::{Ejection, Ended, Outlier, OutlierSettings, Reason, now_ms};
use super::{Models, Worker};
use crate::stats::Label;

/// A backend of the fleet. Shared by every snapshot that contains it, so its counters
/// survive reloads.
#[derive(Debug)]
pub struct Backend {
    /// Stable id for the router's lifetime.
    pub id: BackendId,
    /// The configured worker this address came from.
    pub worker: Worker,
    /// The resolved address.
    pub addr: SocketAddr,
    /// Connection settings (timeouts) for this address.
    pub peer: HttpPeer,
    /// `host:port` to send as the Host header.
    pub authority: String,
    /// Its load and capacity, as placements see them.
    pub account: Arc<Account>,
    /// The models it serves, as it last listed them.
    pub models: Models,
    checked: AtomicBool,
    healthy: AtomicBool,
    /// Active checks in a row whose result disagrees with `healthy`.
    streak: AtomicUsize,
    outlier: Outlier,
    /// Ejections so far, by [`Reason`].
    ejections: [AtomicU64; 2],
}

impl Backend {
    /// A backend that is not ready until its first health check passes; `freed` is called
    /// whenever one of its requests ends.
    pub fn new(
        id: BackendId,
        worker: Worker,
        addr: SocketAddr,
        peer: HttpPeer,
        freed: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        let authority = match (worker.port, worker.tls) {
            (80, false) | (443, true) => worker.host.clone(),
            (port, _) => format!("{}:{port}", worker.host),
        };
        // A stable hash of the address: the same on every router replica.
        let hash = xxh3_64(addr.to_string().as_bytes());
        let models = Models::new(worker.models.clone());
        Backend {
            id,
            worker,
            addr,
            peer,
            authority,
            account: Arc::new(Account::new(id, hash).on_free(freed)),
            models,
            checked: AtomicBool::new(false),
            healthy: AtomicBool::new(true),
            streak: AtomicUsize::new(0),
            outlier: Outlier::default(),
            ejections: Default::default(),
        }
    }

    /// Requests placed on it and not finished.
    pub fn load(&self) -> usize {
        self.account.load()
    }

    /// Whether its health checks fail now (it answered one before, or never did).
    pub fn is_failing(&self) -> bool {
        !self.healthy.load(Relaxed)
    }

    /// Whether it may get requests: its first check passed, it is healthy, and it is not
    /// ejected.
    pub fn is_ready(&self) -> bool {
        self.checked.load(Relaxed) && self.healthy.load(Relaxed) && !self.is_ejected()
    }

    /// Whether outlier detection keeps it out now.
    pub fn is_ejected(&self) -> bool {
        self.outlier.ejected_now()
    }

    /// Records how an exchange ended; `may_eject` says whether the fleet can spare it.
    /// Returns the ejection when this exchange caused one.
    pub fn record_exchange(
        &self,
        ended: Ended,
        settings: &OutlierSettings,
        may_eject: impl FnOnce() -> bool,
    ) -> Option<Ejection> {
        let ejection = self.outlier.record(ended, now_ms(), settings, may_eject)?;
        let index = Reason::ALL.iter().position(|r| *r == ejection.reason);
        self.ejections[index.unwrap_or(0)].fetch_add(1, Relaxed);
        Some(ejection)
    }

    /// Ejections so far, by reason.
    pub fn ejections(&self) -> impl Iterator<Item = (Reason, u64)> + '_ {
        (Reason::ALL.iter().zip(&self.ejections)).map(|(r, n)| (*r, n.load(Relaxed)))
    }

    /// A passed health check brings a backend ejected for failed exchanges back.
    pub fn restore(&self) -> bool {
        self.outlier.restore(now_ms())
    }

    /// Records an active check's result: `successes` passes in a row make an unhealthy
    /// backend healthy, `failures` failures in a row the reverse. A pass also marks the
    /// backend checked. Returns the new verdict when it flipped. One checker at a time.
    pub fn observe_check(&self, passed: bool, successes: usize, failures: usize) -> Option<bool> {
        if passed {
            self.mark_checked();
        }
        let healthy = self.is_healthy();
        if passed == healthy {
            self.streak.store(0, Relaxed);
            return None;
        }
        let streak = self.streak.fetch_add(1, Relaxed) + 1;
        if streak < if passed { successes } else { failures } {
            return None;
        }
        self.streak.store(0, Relaxed);
        self.set_healthy(passed);
        Some(passed)
    }

    /// Whether its first health check is still to come.
    pub fn awaiting_first_check(&self) -> bool {
        !self.checked.load(Relaxed) && self.healthy.load(Relaxed)
    }

    /// Whether the last health verdict is healthy (ignoring whether it was checked yet).
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Relaxed)
    }

    /// Records a passed health check.
    pub fn mark_checked(&self) {
        self.checked.store(true, Relaxed);
    }

    /// Records a health verdict.
    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend() -> Backend {
        let worker = Worker::parse("http://127.0.0.1:9").unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], 9));
        let peer = HttpPeer::new(addr, false, String::new());
        let backend = Backend::new(BackendId(0), worker, addr, peer, || {});
        backend.mark_checked();
        backend
    }

    #[test]
    fn failed_exchanges_in_a_row_eject_it_until_a_passed_check() {
        let b = backend();
        let settings = OutlierSettings::default();
        assert!(b.is_ready());
        for _ in 0..2 {
            assert_eq!(b.record_exchange(Ended::Failed, &settings, || true), None);
        }
        let ejection = b.record_exchange(Ended::Failed, &settings, || true);
        assert_eq!(ejection.map(|e| e.reason), Some(Reason::Failures));
        assert!(!b.is_ready() && b.is_ejected());
        let counted: Vec<_> = b.ejections().collect();
        assert_eq!(counted, vec![(Reason::Answers, 0), (Reason::Failures, 1)]);
        assert!(b.restore());
        assert!(b.is_ready());
        assert!(!b.restore(), "nothing to restore");
    }

    #[test]
    fn thresholds_of_zero_never_eject() {
        let b = backend();
        let settings = OutlierSettings {
            consecutive_5xx: 0,
            consecutive_failures: 0,
            ..OutlierSettings::default()
        };
        for ended in [Ended::Failed, Ended::Sick].repeat(50) {
            assert_eq!(b.record_exchange(ended, &settings, || true), None);
        }
        assert!(b.is_ready());
    }

    #[test]
    fn it_is_not_ready_before_its_first_check_nor_while_failing() {
        let worker = Worker::parse("http://example.com").unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], 80));
        let peer = HttpPeer::new(addr, false, String::new());
        let b = Backend::new(BackendId(1), worker, addr, peer, || {});
        assert_eq!(b.authority, "example.com", "port 80 is not written");
        assert!(b.awaiting_first_check() && !b.is_ready());
        b.set_healthy(false);
        assert!(!b.awaiting_first_check() && b.is_failing());
        b.mark_checked();
        assert!(!b.is_ready());
    }
}
