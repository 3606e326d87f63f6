//! One backend: its address, its peer settings, its in-flight load and its health. Load is
//! counted by [`LoadGuard`]s, so it is released however a request ends.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use pingora_core::protocols::l4::socket::SocketAddr as PingoraAddr;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_load_balancing::Backend as Probe;
use prefix_router_core::BackendId;
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
    /// Stable hash of the address, for rendezvous hashing across router replicas.
    pub hash: u64,
    /// `host:port` to send as the Host header.
    pub authority: String,
    /// The target Pingora's health check probes.
    pub(super) probe: Probe,
    /// Woken when one of its requests ends (the fleet's router queue).
    freed: Arc<tokio::sync::Notify>,
    inflight: AtomicUsize,
    pending_prefill: AtomicUsize,
    active_text: AtomicUsize,
    /// KV cache tokens it published (`vllm:cache_config_info`); 0 when unknown.
    kv_tokens: AtomicUsize,
    /// When its capacity was last asked for, ms since the fleet's origin; 0 never.
    kv_probed_ms: std::sync::atomic::AtomicU64,
    /// The capacity its index budget was last sized from, tokens.
    budget_tokens: AtomicUsize,
    checked: AtomicBool,
    healthy: AtomicBool,
    /// Active checks in a row whose result disagrees with `healthy`.
    streak: AtomicUsize,
    failures: AtomicUsize,
    passive_out: AtomicBool,
}

impl Backend {
    /// A backend that is not ready until its first health check passes; `freed` is woken
    /// whenever one of its requests ends.
    pub fn new(
        id: BackendId,
        worker: Worker,
        addr: SocketAddr,
        peer: HttpPeer,
        freed: Arc<tokio::sync::Notify>,
    ) -> Self {
        let authority = match worker.port {
            80 => worker.host.clone(),
            port => format!("{}:{port}", worker.host),
        };
        Backend {
            id,
            hash: xxh3_64(addr.to_string().as_bytes()),
            worker,
            addr,
            peer,
            authority,
            freed,
            probe: Probe {
                addr: PingoraAddr::Inet(addr),
                weight: 1,
                ext: http::Extensions::new(),
            },
            inflight: AtomicUsize::new(0),
            pending_prefill: AtomicUsize::new(0),
            active_text: AtomicUsize::new(0),
            kv_tokens: AtomicUsize::new(0),
            kv_probed_ms: std::sync::atomic::AtomicU64::new(0),
            budget_tokens: AtomicUsize::new(0),
            checked: AtomicBool::new(false),
            healthy: AtomicBool::new(true),
            streak: AtomicUsize::new(0),
            failures: AtomicUsize::new(0),
            passive_out: AtomicBool::new(false),
        }
    }

    /// Requests selected for this backend and not finished.
    pub fn load(&self) -> usize {
        self.inflight.load(Relaxed)
    }

    /// Bytes of routing text sent here, expected uncached, and not answered yet.
    pub fn pending_prefill(&self) -> usize {
        self.pending_prefill.load(Relaxed)
    }

    /// Bytes of routing text of its requests in flight.
    pub fn active_text(&self) -> usize {
        self.active_text.load(Relaxed)
    }

    /// Its KV cache capacity in tokens, as it published it; 0 when unknown.
    pub fn kv_tokens(&self) -> usize {
        self.kv_tokens.load(Relaxed)
    }

    /// Records the KV capacity it published, if any, asked for at `now_ms`.
    pub fn set_kv_tokens(&self, tokens: Option<usize>, now_ms: u64) {
        self.kv_tokens.store(tokens.unwrap_or(0), Relaxed);
        self.kv_probed_ms.store(now_ms.max(1), Relaxed);
    }

    /// The index budget to give it, in tokens of KV, when that changed since last asked:
    /// `Some(None)` for the configured one (capacity unknown).
    pub fn budget_change(&self) -> Option<Option<usize>> {
        let tokens = self.kv_tokens();
        let before = self.budget_tokens.swap(tokens, Relaxed);
        (before != tokens).then_some((tokens > 0).then_some(tokens))
    }

    /// Whether its capacity is to be asked for again at `now_ms`: never asked, or asked
    /// `every_ms` ago or more.
    pub fn kv_probe_due(&self, now_ms: u64, every_ms: u64) -> bool {
        let last = self.kv_probed_ms.load(Relaxed);
        last == 0 || now_ms.saturating_sub(last) >= every_ms
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

    /// Counts one more request of `text` routing text bytes in flight until the guard
    /// drops, and `prefill` of them as pending prefill until it is answered.
    pub fn acquire(self: &Arc<Self>, text: usize, prefill: usize) -> LoadGuard {
        self.inflight.fetch_add(1, Relaxed);
        self.guard(text, prefill)
    }

    /// Like [`Self::acquire`], only while fewer than `limit` requests are in flight (0: no
    /// limit): the check and the count are one atomic step, so concurrent requests never
    /// push a backend past its limit.
    pub fn acquire_below(
        self: &Arc<Self>,
        limit: usize,
        text: usize,
        prefill: usize,
    ) -> Option<LoadGuard> {
        if limit == 0 {
            return Some(self.acquire(text, prefill));
        }
        let below = |n: usize| (n < limit).then_some(n + 1);
        self.inflight.fetch_update(Relaxed, Relaxed, below).ok()?;
        Some(self.guard(text, prefill))
    }

    fn guard(self: &Arc<Self>, text: usize, prefill: usize) -> LoadGuard {
        self.active_text.fetch_add(text, Relaxed);
        self.pending_prefill.fetch_add(prefill, Relaxed);
        LoadGuard {
            backend: Arc::clone(self),
            text,
            prefill: AtomicUsize::new(prefill),
        }
    }
}

/// One request in flight on a backend; dropping it releases the load.
#[derive(Debug)]
pub struct LoadGuard {
    backend: Arc<Backend>,
    text: usize,
    prefill: AtomicUsize,
}

impl LoadGuard {
    /// The backend this load is on.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }

    /// The backend answered: its prefill for this request is done.
    pub fn answered(&self) {
        let prefill = self.prefill.swap(0, Relaxed);
        self.backend.pending_prefill.fetch_sub(prefill, Relaxed);
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.answered();
        self.backend.active_text.fetch_sub(self.text, Relaxed);
        self.backend.inflight.fetch_sub(1, Relaxed);
        self.backend.freed.notify_one();
    }
}
