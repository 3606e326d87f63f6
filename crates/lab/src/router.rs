//! The router's side of the lab: the core's real selection path (parser, selector, policy,
//! index, sessions) with the in-flight and pending-prefill accounting the proxy keeps
//! (`fleet::Backend` and `proxy::dispatch` in the router crate): a request counts in
//! flight from its placement to the end of its response, and its text not expected cached
//! counts as pending prefill until its first response byte. Upkeep runs when the selector
//! asks for it and every eviction interval, as the router's upkeep service does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use prefix_router_core::clock::Manual;
use prefix_router_core::policy::{
    Candidate, Decision, PolicyChoice, PolicyParams, Request, Selector, SharedTunables, Tunables,
};
use prefix_router_core::request::{self, Endpoint, ParseError, SessionHeaders, SessionKey};
use prefix_router_core::tree::TreeConfig;
use prefix_router_core::{BackendId, TEXT_BYTES_PER_TOKEN};
use xxhash_rust::xxh3::xxh3_64;

/// How the lab's router is set up: what the router's config would say.
#[derive(Clone, Debug)]
pub struct RouterSetup {
    /// The policy.
    pub policy: PolicyChoice,
    /// Its reloadable parameters.
    pub tunables: Tunables,
    /// The prefix index's budget.
    pub tree: TreeConfig,
    /// Idle time after which a session forgets its backend, seconds.
    pub session_ttl: f64,
    /// Time between full upkeep runs, seconds.
    pub eviction_interval: f64,
    /// Seed of the policy's tie-breaking.
    pub seed: u64,
    /// Each backend's KV capacity in tokens, as it publishes it in
    /// `vllm:cache_config_info`; `None` when backends do not say.
    pub kv_tokens: Option<usize>,
    /// Whether the index budgets learn from the cached tokens backends report.
    pub calibrate: bool,
    /// Requests in flight per backend at most (0: no limit); beyond, the router holds
    /// requests in its queue and places them when a backend frees a slot.
    pub max_inflight_per_backend: usize,
}

/// One placed request, as the router tracks it until it ends.
#[derive(Clone, Copy, Debug)]
pub struct Placement {
    /// The backend chosen.
    pub backend: usize,
    /// Routing text bytes counted as pending prefill until the first response byte.
    pub prefill: usize,
    /// The policy's decision.
    pub decision: Decision,
    /// Routing text bytes.
    pub text_len: usize,
}

/// The router over `n` backends.
pub struct LabRouter {
    selector: Selector,
    clock: Manual,
    upkeep_due: Arc<AtomicBool>,
    inflight: Vec<usize>,
    pending: Vec<usize>,
    active: Vec<usize>,
    capacity: usize,
    limit: usize,
    hashes: Vec<u64>,
    headers: SessionHeaders,
    last_upkeep: f64,
    eviction_interval: f64,
    /// Prefix-index text evicted, bytes.
    pub evicted_bytes: u64,
    /// Routing text the chosen backends were believed to hold, bytes.
    pub matched_bytes: u64,
    /// Routing text routed, bytes.
    pub text_bytes: u64,
    /// Decisions by outcome.
    pub outcomes: std::collections::BTreeMap<&'static str, u64>,
}

impl LabRouter {
    /// A router with `setup` in front of backends named `names`.
    pub fn new(setup: &RouterSetup, names: &[String]) -> Self {
        let clock = Manual::default();
        let params = PolicyParams {
            tunables: SharedTunables::new(setup.tunables),
            tree: setup.tree.clone(),
            seed: setup.seed,
            clock: Arc::new(clock.clone()),
            calibrate: setup.calibrate,
        };
        let upkeep_due = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&upkeep_due);
        let ttl = Duration::from_secs_f64(setup.session_ttl.max(0.0));
        let policy = setup.policy.build(&params);
        let selector = Selector::with_clock(policy, params.tunables, ttl, Arc::new(clock.clone()))
            .on_upkeep_due(move || flag.store(true, Relaxed));
        // As the router's upkeep does once it has read each backend's capacity.
        if let Some(tokens) = setup.kv_tokens {
            for b in 0..names.len() {
                selector.set_budget(BackendId(b as u32), Some(tokens));
            }
        }
        LabRouter {
            selector,
            clock,
            upkeep_due,
            inflight: vec![0; names.len()],
            pending: vec![0; names.len()],
            active: vec![0; names.len()],
            capacity: setup.kv_tokens.unwrap_or(0) * TEXT_BYTES_PER_TOKEN,
            limit: setup.max_inflight_per_backend,
            hashes: names.iter().map(|n| xxh3_64(n.as_bytes())).collect(),
            headers: SessionHeaders::default(),
            last_upkeep: 0.0,
            eviction_interval: setup.eviction_interval,
            evicted_bytes: 0,
            matched_bytes: 0,
            text_bytes: 0,
            outcomes: Default::default(),
        }
    }

    /// Places a chat request with `body` (and the `x-session-id` header when given) at
    /// virtual time `now`, seconds: parse, select, acquire.
    pub fn place(
        &mut self,
        now: f64,
        body: &[u8],
        session_id: Option<&str>,
    ) -> Result<Placement, ParseError> {
        self.clock.set(Duration::from_secs_f64(now.max(0.0)));
        let parsed = request::parse(Endpoint::Chat, body)?;
        let mut headers = HeaderMap::new();
        if let Some(value) = session_id.and_then(|id| HeaderValue::from_str(id).ok()) {
            headers.insert("x-session-id", value);
        }
        let request = Request {
            model: parsed.model,
            text: &parsed.text,
            session: SessionKey::find(&headers, &self.headers, parsed.session),
        };
        let below = |b: &usize| self.limit == 0 || self.inflight[*b] < self.limit;
        let candidates: Vec<Candidate> = (0..self.inflight.len())
            .filter(below)
            .map(|b| Candidate {
                active: self.active[b],
                capacity: self.capacity,
                ..Candidate::new(
                    BackendId(b as u32),
                    self.inflight[b],
                    self.pending[b],
                    self.hashes[b],
                )
            })
            .collect();
        let decision = self.selector.select(&request, &candidates);
        let text_len = parsed.text.len();
        let prefill = text_len.saturating_sub(decision.matched);
        let backend = candidates[decision.index].id.0 as usize;
        self.inflight[backend] += 1;
        self.pending[backend] += prefill;
        self.active[backend] += text_len;
        self.matched_bytes += decision.matched as u64;
        self.text_bytes += text_len as u64;
        *self.outcomes.entry(decision.outcome.label()).or_default() += 1;
        self.upkeep(now);
        Ok(Placement {
            backend,
            prefill,
            decision,
            text_len,
        })
    }

    /// The placed request's first response byte arrived.
    pub fn answered(&mut self, placement: &mut Placement) {
        self.pending[placement.backend] -= std::mem::take(&mut placement.prefill);
    }

    /// Whether every backend is at its in-flight limit (never, without a limit).
    pub fn full(&self) -> bool {
        self.limit > 0 && self.inflight.iter().all(|&n| n >= self.limit)
    }

    /// The placed request's response reported `cached_tokens` cached: the router learns
    /// from it as the proxy does.
    pub fn reported(&mut self, placement: &Placement, cached_tokens: u64) {
        let backend = BackendId(placement.backend as u32);
        self.selector
            .observe(backend, placement.decision.matched, cached_tokens);
    }

    /// The placed request's response ended.
    pub fn finished(&mut self, placement: &mut Placement) {
        self.answered(placement);
        self.inflight[placement.backend] -= 1;
        self.active[placement.backend] -= placement.text_len;
    }

    /// Eviction when the selector asked for it; the full upkeep every interval.
    fn upkeep(&mut self, now: f64) {
        if now - self.last_upkeep >= self.eviction_interval {
            self.last_upkeep = now;
            self.upkeep_due.store(false, Relaxed);
            self.evicted_bytes += self.selector.maintain(&|_| true) as u64;
        } else if self.upkeep_due.swap(false, Relaxed) {
            self.evicted_bytes += self.selector.trim_tree() as u64;
        }
    }
}
