//! One backend: its address, its peer settings, its health, and its account in the
//! core's ledger (in-flight load, pending prefill, published KV capacity), which a
//! [`Seat`](prefix_router_core::ledger::Seat) releases however a request ends.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use pingora_core::protocols::l4::socket::SocketAddr as PingoraAddr;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_load_balancing::Backend as Probe;
use prefix_router_core::BackendId;
use prefix_router_core::ledger::Account;
use xxhash_rust::xxh3::xxh3_64;

use super::Worker;

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
    /// The target Pingora's health check probes.
    pub(super) probe: Probe,
    checked: AtomicBool,
    healthy: AtomicBool,
    /// Active checks in a row whose result disagrees with `healthy`.
    streak: AtomicUsize,
    failures: AtomicUsize,
    passive_out: AtomicBool,
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
        let authority = match worker.port {
            80 => worker.host.clone(),
            port => format!("{}:{port}", worker.host),
        };
        // A stable hash of the address: the same on every router replica.
        let hash = xxh3_64(addr.to_string().as_bytes());
        Backend {
            id,
            worker,
            addr,
            peer,
            authority,
            account: Arc::new(Account::new(id, hash).on_free(freed)),
            probe: Probe {
                addr: PingoraAddr::Inet(addr),
                weight: 1,
                ext: http::Extensions::new(),
            },
            checked: AtomicBool::new(false),
            healthy: AtomicBool::new(true),
            streak: AtomicUsize::new(0),
            failures: AtomicUsize::new(0),
            passive_out: AtomicBool::new(false),
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

    /// Whether it may get requests: its first check passed and it is healthy.
    pub fn is_ready(&self) -> bool {
        self.checked.load(Relaxed) && self.healthy.load(Relaxed) && !self.passive_out.load(Relaxed)
    }

    /// Records how an exchange ended. `threshold` failures in a row (0: never) take the
    /// backend out until its next passed health check; returns true when this one did.
    pub fn record_exchange(&self, ok: bool, threshold: usize) -> bool {
        if ok {
            self.failures.store(0, Relaxed);
            return false;
        }
        let failures = self.failures.fetch_add(1, Relaxed) + 1;
        threshold > 0 && failures >= threshold && !self.passive_out.swap(true, Relaxed)
    }

    /// A passed health check brings a backend taken out by failed exchanges back.
    pub fn restore(&self) -> bool {
        self.failures.store(0, Relaxed);
        self.passive_out.swap(false, Relaxed)
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
    fn failed_exchanges_in_a_row_take_it_out_once_until_a_passed_check() {
        let b = backend();
        assert!(b.is_ready());
        assert!(!b.record_exchange(false, 3));
        assert!(!b.record_exchange(false, 3));
        // A success in between starts the count again.
        assert!(!b.record_exchange(true, 3));
        assert!(!b.record_exchange(false, 3) && !b.record_exchange(false, 3));
        assert!(b.record_exchange(false, 3), "the third failure in a row");
        assert!(!b.is_ready());
        assert!(!b.record_exchange(false, 3), "reported once");
        assert!(b.restore());
        assert!(b.is_ready());
        assert!(!b.restore(), "nothing to restore");
    }

    #[test]
    fn a_threshold_of_zero_never_takes_it_out() {
        let b = backend();
        for _ in 0..100 {
            assert!(!b.record_exchange(false, 0));
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
