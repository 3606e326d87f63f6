//! The placement ledger: what the router knows of each backend from its own placements,
//! kept the same way wherever placement happens (the proxy in real time, the lab in
//! virtual time). Per backend an [`Account`]: requests in flight and their prompt tokens,
//! prefill pending (routing text sent there, not expected cached, not answered yet) and
//! the KV capacity the backend published. A [`Seat`] is one placed request: it counts
//! from [`Ledger::place`] until it drops, its prefill until [`Seat::answered`]. The ledger
//! also holds the in-flight limit's rule and the upkeep schedule of the selector's index
//! and tables ([`Ledger::upkeep`]).
//!
//! Synchronous and lock-free on the request path (atomics), but for a light flow's
//! request where a tenants file is set (a lock per backend: [`protect_kv`]); no I/O, no
//! clock of its own.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::BackendId;
use crate::density::Density;
use crate::policy::{Candidate, Decision, Published, Selector};
use crate::units::{KeyBytes, PromptSize, TextBytes, TextPerToken, Tokens};

/// Time between two full upkeeps of the index and the tables, by default
/// (`eviction_interval`).
pub const EVICTION_INTERVAL: Duration = Duration::from_secs(120);

/// One backend's account. Shared by every fleet snapshot that holds the backend, so that
/// its counts survive reloads.
pub struct Account {
    /// Which backend.
    pub id: BackendId,
    /// A stable hash of its address (the same on every router replica).
    pub hash: u64,
    inflight: AtomicUsize,
    pending: AtomicUsize,
    /// KV tokens it published; 0 when unknown.
    capacity: AtomicUsize,
    /// Tokens per block of its KV cache it published; 0 when unknown.
    block: AtomicUsize,
    /// Bytes of routing text per token of its prompts, as its reports taught.
    density: Density,
    /// The capacity its index budget was last sized from, as routing text.
    sized: AtomicUsize,
    /// Sequences whose KV it keeps at once (slots) when it said; 0 when unknown.
    sequences: AtomicUsize,
    /// What it published of its load: running, waiting, KV usage (f64 bits); running is
    /// `usize::MAX` until it published anything.
    running: AtomicUsize,
    waiting: AtomicUsize,
    kv_usage: AtomicU64,
    /// Requests in flight it takes before more are held in the router (0: no hold),
    /// learned from its published queue ([`Account::learn_hold`]).
    hold: AtomicUsize,
    /// What it ran when it last queued (0: never): the hold before it grew, which a
    /// reserve is kept under.
    ceiling: AtomicUsize,
    /// The hold the requests in flight were placed under: the one before the last read.
    placed_under: AtomicUsize,
    /// Prompt tokens of the requests in flight, as estimated when placed.
    tokens: AtomicUsize,
    /// Requests in flight that a reserve was kept for, by [`Cap::band`].
    kept_in: [AtomicUsize; BANDS],
    /// Requests in flight that a reserve was kept for, every band, and their prompt
    /// tokens, each with its most at once lately.
    kept: Peaked,
    kept_tokens: Peaked,
    /// Requests a reserve was kept for that have no answer yet (prefilling).
    kept_prefilling: AtomicUsize,
    /// Light tenants' conversations last placed here by requests a reserve is kept for
    /// ([`Cap::top`]), each with its prompt tokens and the read it was placed at, for
    /// [`HOME_READS`] reads; and their tokens in all: the KV [`protect_kv`] keeps for
    /// them. Requests in flight are not it: those conversations wait between turns.
    top_homes: Mutex<HashMap<u128, (usize, usize)>>,
    top_resident: AtomicUsize,
    /// Whether its KV is kept for those requests ([`protect_kv`]): no request that leaves
    /// the reserve is placed here while it is held.
    protected: AtomicBool,
    /// Whether one of those requests, since they were last all idle, found most of the
    /// context predicted cached evicted here while its requests in flight had prompts of
    /// half its KV or more ([`protect_kv`]).
    top_evicted: AtomicBool,
    reads: AtomicUsize,
    on_free: Box<dyn Fn() + Send + Sync>,
}

/// A count, with the most it reached at once in this window of [`KEPT_READS`] reads and
/// the one before.
#[derive(Debug, Default)]
struct Peaked {
    now: AtomicUsize,
    peak: AtomicUsize,
    before: AtomicUsize,
}

impl Peaked {
    fn add(&self, n: usize) {
        let now = self.now.fetch_add(n, Relaxed) + n;
        self.peak.fetch_max(now, Relaxed);
    }

    fn sub(&self, n: usize) {
        self.now.fetch_sub(n, Relaxed);
    }

    fn now(&self) -> usize {
        self.now.load(Relaxed)
    }

    /// Starts a new window.
    fn turn(&self) {
        let peak = self.peak.swap(self.now(), Relaxed);
        self.before.store(peak, Relaxed);
    }

    /// The most at once lately, or now.
    fn lately(&self) -> usize {
        let peaks = (self.peak.load(Relaxed)).max(self.before.load(Relaxed));
        peaks.max(self.now())
    }
}

/// Reads of a backend's load ([`Account::learn_hold`], one a second by default) over which
/// the most requests it kept a reserve for at once is remembered: a window of 5, and the
/// window before it.
pub const KEPT_READS: usize = 5;

/// Reads a light flow's conversation counts in its home's KV after its last request
/// was placed ([`protect_kv`]): 10, a pause between turns of 5-10 s at the default
/// 1 s between reads.
pub const HOME_READS: usize = 10;

/// Light tenants' conversations an account counts at most ([`protect_kv`]); past it,
/// new ones are not counted (memory stays bounded).
const MAX_HOMES: usize = 65_536;

/// Bands of requests a reserve is kept for ([`Cap::band`]): one per priority.
pub const BANDS: usize = 3;

/// How many requests in flight an account takes: the in-flight `limit` (0: none), and
/// whether to leave a reserve free for others (flow control keeps it from a tenant over
/// its fair share while a tenant below its share is active, and from a lower priority
/// while a higher one is). The reserve is an eighth of what the backend ran when it last
/// queued (its ceiling), at least one slot, and more where the requests it is kept for
/// recently had more in flight at once than they have now (up to half the ceiling), so
/// that a light tenant's conversations find their slots free where their prefixes are.
/// Where the backend published its KV capacity, a request leaving the reserve also
/// leaves the KV those requests had in flight lately ([`Cap::tokens`]). A reserve counts
/// only where a hold was learned: a backend with room is never held back. A plain
/// `usize` is a limit with no reserve.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cap {
    /// Requests in flight at most (0: no limit).
    pub limit: usize,
    /// Whether this request leaves the reserve free.
    pub reserve: bool,
    /// Whether this request is one the reserve is kept for (counted in how many of
    /// those a backend had at once).
    pub kept: bool,
    /// Whether it is of a light flow (default false): its tenant is below its fair share,
    /// or it is `high` while a lower priority is active. The KV of [`protect_kv`] is kept
    /// for such requests that the reserve is kept for.
    pub light: bool,
    /// Slots this request leaves free while it leaves no reserve and is not one the
    /// reserve is kept for, or is kept for only against a lower priority (the tenants
    /// file's `standing_slots`), so that a light flow or a higher priority arriving at a
    /// full fleet finds them at once; never a backend's every slot.
    pub standing: usize,
    /// The band a request the reserve is kept for counts in (its priority, 0 lowest,
    /// below [`BANDS`]): its new conversations spread by the requests of its own band in
    /// flight ([`Candidate::kept`]), not by those of a band kept before it.
    pub band: usize,
    /// Slots past the limit and the hold this request may take (default 0): those it
    /// just freed by stopping requests there, which they let go a moment later.
    pub over: usize,
    /// Its prompt tokens, as estimated at admission (default 0): counted in its
    /// backend's KV in flight, which a request leaving the reserve free keeps under the
    /// backend's capacity less what the requests the reserve is kept for had lately.
    pub tokens: usize,
    /// Whether it goes to its conversation's home, where a request the reserve is kept
    /// for may take slots past the backend's ceiling, up to its hold (into the engine's
    /// queue), rather than move and compute its context again elsewhere (default false).
    pub home: bool,
    /// Its conversation ([`Request::conversation`](crate::policy::Request::conversation);
    /// 0, the default: none): a light flow's is counted in its home's KV
    /// ([`protect_kv`]). Set by [`Self::of_conversation`].
    pub conversation: u128,
}

impl Cap {
    /// The band it counts in among the requests a reserve is kept for, if it is one.
    fn kept_band(&self) -> Option<usize> {
        self.kept.then(|| self.band.min(BANDS - 1))
    }

    /// Whether it is a light flow's request kept a reserve for: the KV of
    /// [`protect_kv`] is kept for it.
    fn top(&self) -> bool {
        self.kept && self.light
    }

    /// This cap with its request's `conversation` ([`Self::conversation`]), computed only
    /// where it is counted: for a light flow's request kept a reserve for (the hash is
    /// not paid without flow control).
    pub fn of_conversation(self, conversation: impl FnOnce() -> u128) -> Cap {
        Cap {
            conversation: if self.top() { conversation() } else { 0 },
            ..self
        }
    }
}

impl From<usize> for Cap {
    fn from(limit: usize) -> Self {
        Cap {
            limit,
            ..Cap::default()
        }
    }
}

impl Account {
    /// An idle account with nothing known of the backend's KV.
    pub fn new(id: BackendId, hash: u64) -> Self {
        Account {
            id,
            hash,
            inflight: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            capacity: AtomicUsize::new(0),
            block: AtomicUsize::new(0),
            density: Density::default(),
            sized: AtomicUsize::new(0),
            sequences: AtomicUsize::new(0),
            running: AtomicUsize::new(usize::MAX),
            waiting: AtomicUsize::new(0),
            kv_usage: AtomicU64::new(0),
            hold: AtomicUsize::new(0),
            ceiling: AtomicUsize::new(0),
            placed_under: AtomicUsize::new(0),
            tokens: AtomicUsize::new(0),
            kept_in: Default::default(),
            kept: Peaked::default(),
            kept_tokens: Peaked::default(),
            kept_prefilling: AtomicUsize::new(0),
            top_homes: Mutex::default(),
            top_resident: AtomicUsize::new(0),
            protected: AtomicBool::new(false),
            top_evicted: AtomicBool::new(false),
            reads: AtomicUsize::new(0),
            on_free: Box::new(|| {}),
        }
    }

    /// Calls `freed` whenever one of its seats drops (a slot freed), and when one a
    /// reserve was kept for answers (its prefill guard lifts). Must be cheap.
    pub fn on_free(mut self, freed: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_free = Box::new(freed);
        self
    }

    /// Requests placed here and not finished.
    pub fn load(&self) -> usize {
        self.inflight.load(Relaxed)
    }

    /// Routing text placed here, expected uncached, not answered yet.
    pub fn pending(&self) -> TextBytes {
        TextBytes(self.pending.load(Relaxed))
    }

    /// Prompt tokens of the requests in flight here (as estimated at admission, with a
    /// tenants file), and the most that requests a reserve was kept for had in flight
    /// here lately: the KV a request leaving the reserve leaves them.
    pub fn tokens_in_flight(&self) -> (Tokens, Tokens) {
        let all = Tokens(self.tokens.load(Relaxed));
        (all, Tokens(self.kept_tokens.lately()))
    }

    /// Whether its KV is kept for light flows: no request that leaves them a reserve is
    /// placed here while it is held ([`protect_kv`]).
    pub fn kv_kept(&self) -> bool {
        self.protected.load(Relaxed)
    }

    /// Whether light flows' conversations here, with `tokens` more, stay within two
    /// thirds of its published KV (the third left for them to grow): where [`protect_kv`]
    /// keeps it, their conversations move here only then. Without it, all that moved
    /// piled on one kept backend and evicted each other (`benches/tenants/noisy.sh`,
    /// engines of 16, one round of two).
    fn keeps_room_for(&self, tokens: usize) -> bool {
        let wanted = self.top_resident.load(Relaxed).saturating_add(tokens);
        self.capacity()
            .is_some_and(|c| wanted.saturating_mul(3) <= c.0.saturating_mul(2))
    }

    /// Counts a light flow's `conversation` of `tokens` here, placed now.
    fn note_top_home(&self, conversation: u128, tokens: usize) {
        let read = self.reads.load(Relaxed);
        let mut homes = self.top_homes.lock();
        if homes.len() < MAX_HOMES || homes.contains_key(&conversation) {
            let before = homes
                .insert(conversation, (tokens, read))
                .map_or(0, |(t, _)| t);
            let resident = self.top_resident.load(Relaxed).saturating_sub(before);
            self.top_resident
                .store(resident.saturating_add(tokens), Relaxed);
        }
    }

    /// Stops counting a light flow's `conversation` here: it moved.
    fn move_top_home(&self, conversation: u128) {
        let mut homes = self.top_homes.lock();
        if let Some((tokens, _)) = homes.remove(&conversation) {
            self.top_resident.fetch_sub(tokens, Relaxed);
        }
    }

    /// Stops counting the conversations last placed [`HOME_READS`] reads ago or more.
    fn forget_top_homes(&self) {
        let read = self.reads.load(Relaxed);
        let mut homes = self.top_homes.lock();
        if !homes.is_empty() {
            homes.retain(|_, &mut (_, at)| read.wrapping_sub(at) < HOME_READS);
            let resident = homes.values().map(|&(tokens, _)| tokens).sum();
            self.top_resident.store(resident, Relaxed);
        }
    }

    /// The KV capacity the backend published, if it did.
    pub fn capacity(&self) -> Option<Tokens> {
        Some(Tokens(self.capacity.load(Relaxed))).filter(|t| t.0 > 0)
    }

    /// Records the KV capacity the backend published (`None`: it does not say).
    pub fn set_capacity(&self, capacity: Option<Tokens>) {
        self.capacity.store(capacity.map_or(0, |t| t.0), Relaxed);
    }

    /// Bytes of routing text per token of its prompts (text mode), as its reports taught.
    pub fn density(&self) -> TextPerToken {
        self.density.get()
    }

    /// Tokens per block of its KV cache, if it published them.
    pub fn block(&self) -> Option<Tokens> {
        Some(Tokens(self.block.load(Relaxed))).filter(|t| t.0 > 0)
    }

    /// Records the block size the backend published (`None`: it does not say).
    pub fn set_block(&self, block: Option<Tokens>) {
        self.block.store(block.map_or(0, |t| t.0), Relaxed);
    }

    /// How many sequences' KV the backend keeps at once (llama.cpp's slots), if it said.
    pub fn sequences(&self) -> Option<usize> {
        Some(self.sequences.load(Relaxed)).filter(|&n| n > 0)
    }

    /// Records how many sequences' KV the backend keeps at once (`None`: it does not say,
    /// or shares one pool among all, as vLLM does).
    pub fn set_sequences(&self, sequences: Option<usize>) {
        self.sequences.store(sequences.unwrap_or(0), Relaxed);
    }

    /// What the backend last published of its load, if anything.
    pub fn published(&self) -> Option<Published> {
        let running = self.running.load(Relaxed);
        (running != usize::MAX).then(|| Published {
            running,
            waiting: self.waiting.load(Relaxed),
            kv_usage: f64::from_bits(self.kv_usage.load(Relaxed)),
        })
    }

    /// Records what the backend published of its load (`None`: it does not say).
    pub fn set_published(&self, published: Option<Published>) {
        let Some(p) = published else {
            self.running.store(usize::MAX, Relaxed);
            return;
        };
        self.waiting.store(p.waiting, Relaxed);
        self.kv_usage.store(p.kv_usage.to_bits(), Relaxed);
        self.running.store(p.running.min(usize::MAX - 1), Relaxed);
    }

    /// Learns from what the backend just published where the router should hold work
    /// back: while requests wait in the engine's own queue (where no priority or fairness
    /// acts), the router sends it at most what it runs; while it runs all the hold lets
    /// through and none wait, the hold grows by a quarter, so that a backend with room is
    /// never held to an old measure (a hold the router does not fill, as when it keeps
    /// a reserve, stays). No hold until the engine first queued.
    pub fn learn_hold(&self, published: Published) {
        let hold = self.hold.load(Relaxed);
        self.placed_under.store(hold, Relaxed);
        let next = if published.waiting > 0 {
            self.ceiling.store(published.running.max(1), Relaxed);
            published.running.max(1)
        } else if hold > 0 && published.running >= hold {
            hold + (hold / 4).max(1)
        } else {
            hold
        };
        self.hold.store(next, Relaxed);
        if self.reads.fetch_add(1, Relaxed) % KEPT_READS == KEPT_READS - 1 {
            self.kept.turn();
            self.kept_tokens.turn();
        }
        self.forget_top_homes();
    }

    /// Takes `peers`' hold and ceiling (the largest its fleet's other backends learned)
    /// while it learned none of its own: engines of one fleet mostly run alike, and a
    /// backend without a hold takes every request the held ones refuse, queueing them in
    /// its engine (measured in `benches/tenants/noisy.sh`: 12-16 in flight on engines of
    /// 4 while `high` waited). It then grows or falls as [`Self::learn_hold`] says.
    pub fn adopt_hold(&self, (hold, ceiling): (usize, usize)) {
        if self.hold.load(Relaxed) == 0 && hold > 0 {
            self.hold.store(hold, Relaxed);
            self.ceiling.store(ceiling.max(1), Relaxed);
        }
    }

    /// The slots a request that leaves the reserve keeps free under `ceiling`.
    fn reserve(&self, ceiling: usize) -> usize {
        let wanted = self.kept.lately().saturating_sub(self.kept.now());
        (ceiling / 8).max(1).max(wanted.min(ceiling / 2))
    }

    /// Whether a request of `tokens` prompt tokens that leaves the reserve free leaves
    /// the KV that the requests the reserve is kept for had in flight here lately, at
    /// most half the published capacity; the first such request always fits. Where the
    /// engines are bound by KV rather than by sequences, a free slot is no room: the
    /// heavy flow's requests fill the KV and the engine evicts the light flow's
    /// conversations between their turns (measured in `benches/tenants/noisy.sh` on
    /// engines of 16 sequences). True where the capacity is unknown.
    fn leaves_kv(&self, tokens: usize) -> bool {
        let Some(capacity) = self.capacity() else {
            return true;
        };
        let others = (self.tokens.load(Relaxed)).saturating_sub(self.kept_tokens.now());
        let kept = self.kept_tokens.lately().min(capacity.0 / 2);
        others == 0 || others.saturating_add(tokens).saturating_add(kept) <= capacity.0
    }

    /// Forgets the hold (flow control is off).
    pub fn forget_hold(&self) {
        self.hold.store(0, Relaxed);
        self.placed_under.store(0, Relaxed);
        self.ceiling.store(0, Relaxed);
    }

    /// Its hold and ceiling (0: none).
    pub fn held(&self) -> (usize, usize) {
        (self.hold.load(Relaxed), self.ceiling.load(Relaxed))
    }

    /// Requests in flight it takes before more are held in the router, if it learned one.
    pub fn hold(&self) -> Option<usize> {
        Some(self.hold.load(Relaxed)).filter(|&h| h > 0)
    }

    /// Requests placed past any hold that its engine queues, as placed before it learned
    /// one: what it last published as waiting, at most its load over its hold and over
    /// the hold before the last read (so that neither the quarter a hold probes past the
    /// engine nor a hold that fell counts). 0 without a hold or a published load.
    pub fn excess(&self) -> usize {
        let (Some(hold), Some(published)) = (self.hold(), self.published()) else {
            return 0;
        };
        let placed_under = self.placed_under.load(Relaxed);
        (self.load())
            .saturating_sub(hold.max(placed_under))
            .min(published.waiting)
    }

    /// Whether it takes one more request under `cap` and its learned hold.
    pub fn open(&self, cap: impl Into<Cap>) -> bool {
        self.below(self.load(), cap.into())
    }

    /// Whether `load` is below `cap`'s limit (0: none) and its hold (0: none; for a
    /// request the reserve is kept for, no more than its ceiling), and, with a reserve or
    /// standing slots, below its ceiling less those; each raised by `cap.over`. A request
    /// that leaves the reserve free is also kept off a held backend while a request the
    /// reserve is kept for prefills there (the prefill guard): engines split their
    /// prefill compute among the requests prefilling at once.
    fn below(&self, load: usize, cap: Cap) -> bool {
        let (hold, ceiling) = self.held();
        // Past what the engine runs, a kept request would wait in the engine's queue (a
        // hold probes a quarter past it) rather than in the router's.
        let hold = match cap.kept && !cap.home && ceiling > 0 {
            true => hold.min(ceiling),
            false => hold,
        };
        let free = if cap.reserve {
            self.reserve(ceiling)
        } else {
            cap.standing.min(ceiling.saturating_sub(1))
        };
        let reserved = free > 0 && hold > 0 && ceiling > 0;
        let load = load.saturating_sub(cap.over);
        let guarded = cap.reserve && hold > 0 && self.kept_prefilling.load(Relaxed) > 0;
        let protected = cap.reserve && hold > 0 && self.protected.load(Relaxed);
        !guarded
            && !protected
            && (cap.limit == 0 || load < cap.limit)
            && (hold == 0 || load < hold)
            && (!reserved || load + free < ceiling.min(hold))
            && (!cap.reserve || hold == 0 || self.leaves_kv(cap.tokens))
    }

    /// The backend as a policy sees it.
    pub fn candidate(&self) -> Candidate {
        Candidate {
            id: self.id,
            load: self.load(),
            pending: self.pending(),
            capacity: self.capacity().unwrap_or_default().text(),
            sequences: self.sequences().unwrap_or(0),
            block: Tokens(self.block.load(Relaxed)),
            text_per_token: self.density(),
            hash: self.hash,
            published: self.published(),
            recorded: None,
            kept: self.kept.lately(),
            protected: false,
            kv_kept: false,
        }
    }

    /// The capacity to size its index budget from, as routing text at its density, when it
    /// changed since last asked (a density drifting by under 1/32 changes nothing):
    /// `Some(None)` for the configured budget (capacity unknown).
    fn budget_change(&self) -> Option<Option<TextBytes>> {
        let text = self.capacity().map(|c| self.density().text(c));
        let now = text.map_or(0, |t| t.0);
        let before = self.sized.load(Relaxed);
        let moved = now.abs_diff(before) > before / 32 || (now == 0) != (before == 0);
        moved.then(|| {
            self.sized.store(now, Relaxed);
            text
        })
    }

    /// A seat for a request of `prefill` uncached text, while `cap` lets one more in. Check
    /// and count are one atomic step, so concurrent placements never push a backend past
    /// its limit.
    fn take(self: &Arc<Self>, cap: Cap, prefill: TextBytes, decision: Decision) -> Option<Seat> {
        let next = |n: usize| self.below(n, cap).then_some(n + 1);
        self.inflight.fetch_update(Relaxed, Relaxed, next).ok()?;
        self.pending.fetch_add(prefill.0, Relaxed);
        if cap.tokens > 0 {
            self.tokens.fetch_add(cap.tokens, Relaxed);
        }
        let band = cap.kept_band();
        if let Some(band) = band {
            self.kept_in[band].fetch_add(1, Relaxed);
            self.kept.add(1);
            self.kept_tokens.add(cap.tokens);
            self.kept_prefilling.fetch_add(1, Relaxed);
        }
        Some(Seat {
            account: Arc::clone(self),
            prefill: AtomicUsize::new(prefill.0),
            tokens: cap.tokens,
            decision,
            band,
            top: cap.top(),
            guarding: AtomicBool::new(band.is_some()),
        })
    }
}

impl std::fmt::Debug for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.debug_struct("Account")
            .field("id", &self.id)
            .field("load", &self.load())
            .field("pending", &self.pending())
            .field("capacity", &self.capacity())
            .finish()
    }
}

/// Each of `accounts` that published its load but never queued takes the largest hold and
/// ceiling the others learned ([`Account::adopt_hold`]), after a read of them all.
pub fn share_holds<'a>(accounts: impl Iterator<Item = &'a Account> + Clone) {
    let held = accounts.clone().map(Account::held);
    let peers = held.fold((0, 0), |(h, c), (hold, ceiling)| {
        (h.max(hold), c.max(ceiling))
    });
    let published = accounts.filter(|a| a.published().is_some());
    published.for_each(|a| a.adopt_hold(peers));
}

/// Keeps the KV of some of `accounts` for light flows' requests a reserve is kept for
/// ([`Cap::light`]: a tenant below its share, or `high`), after a read of them all.
/// Where the engines are bound by KV, a heavy flow's prefills evict a light flow's
/// conversations between their turns however many slots are left free: engines evict
/// the least recently used blocks, whoever's. Measured in the lab (`--flow-scale 4
/// --flow-load 2`), limiting the KV a heavy tenant keeps in flight did not stop it;
/// keeping its requests off the backends that hold the light tenant's KV did. So, once
/// one of those requests found most of the context predicted cached evicted on a backend
/// whose requests in flight had prompts of half its KV or more, and until they are all
/// idle, backends are kept for them: as many as hold half again the tokens of their
/// conversations ([`HOME_READS`]), first those kept already, then those where they have
/// the most; at most three quarters of the backends with a published capacity, and none
/// while those tokens outgrow them. No request that leaves the reserve is placed on a
/// held one of them, and the light flows' conversations move there
/// ([`Candidate::protected`]). Kept backends stay kept while the flows are active:
/// chosen again at each read, they moved under the conversations moved to them. Where
/// the KV holds every conversation (the lab's flow scenarios on engines of 4) nothing is
/// kept. For `high` in `benches/tenants/noisy.sh` on engines of 16, a first version
/// (sized by requests in flight, nothing moved) cost `normal` 40% of its answers and left
/// `high`'s TTFT p99 where it was; this one brought it from 1.5-1.6 s to 0.2-0.8 s, at
/// 3-9% of `normal`'s answers a second.
pub fn protect_kv<'a>(accounts: impl Iterator<Item = &'a Account> + Clone) {
    let mut sized: SmallVec<[(&Account, usize, usize); 16]> = accounts
        .clone()
        .filter_map(|a| Some((a, a.top_resident.load(Relaxed), a.capacity()?.0)))
        .collect();
    let wanted = sized.iter().map(|&(_, top, _)| top).sum::<usize>();
    let bound = accounts.clone().any(|a| a.top_evicted.load(Relaxed));
    sized.sort_by_key(|&(a, top, _)| (std::cmp::Reverse(top), a.id));
    let most = sized.len() * 3 / 4;
    let room: usize = sized.iter().take(most).map(|&(_, _, c)| c).sum();
    let mut kept: SmallVec<[BackendId; 8]> = SmallVec::new();
    if bound && (1..=room).contains(&wanted) {
        sized.sort_by_key(|&(a, _, _)| !a.protected.load(Relaxed));
        let mut needed = wanted.saturating_add(wanted / 2);
        for &(account, _, capacity) in sized.iter().take(most) {
            if needed == 0 && !account.protected.load(Relaxed) {
                break;
            }
            kept.push(account.id);
            needed = needed.saturating_sub(capacity);
        }
    }
    for a in accounts {
        a.protected.store(kept.contains(&a.id), Relaxed);
        if wanted == 0 {
            a.top_evicted.store(false, Relaxed);
        }
    }
}

/// One placed request: in flight on its backend until it drops.
#[derive(Debug)]
pub struct Seat {
    account: Arc<Account>,
    prefill: AtomicUsize,
    /// Its prompt tokens, as estimated when placed ([`Cap::tokens`]).
    tokens: usize,
    decision: Decision,
    /// The band it counts in among its backend's requests kept a reserve for, if it does.
    band: Option<usize>,
    /// Whether its tokens count in its backend's KV kept ([`Cap::top`]).
    top: bool,
    /// Whether it is kept a reserve for and has no answer yet (the prefill guard).
    guarding: AtomicBool,
}

/// What a backend reported of one placed request, beside the router's own measure of it.
#[derive(Clone, Copy, Debug)]
pub struct Report {
    /// The request's size as the router measured it: routing text (text mode) or tokens.
    pub size: PromptSize,
    /// Its prompt tokens, as the backend counted them.
    pub prompt: Tokens,
    /// Of those, found in the backend's prefix cache.
    pub cached: Tokens,
}

impl Seat {
    /// The account of the backend it is on.
    pub fn account(&self) -> &Arc<Account> {
        &self.account
    }

    /// The decision that placed it.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// The backend answered (its first response byte): its prefill is done.
    pub fn answered(&self) {
        let prefill = self.prefill.swap(0, Relaxed);
        self.account.pending.fetch_sub(prefill, Relaxed);
        if self.band.is_some() && self.guarding.swap(false, Relaxed) {
            self.account.kept_prefilling.fetch_sub(1, Relaxed);
            (self.account.on_free)();
        }
    }

    /// The backend reported on it: a text-mode request teaches the backend's density, and
    /// the selector's index learns how the cached tokens compare with what it predicted.
    pub fn reported(&self, selector: &Selector, report: Report) {
        let Report {
            size,
            prompt,
            cached,
        } = report;
        let density = match size {
            PromptSize::Text(routed) => {
                self.account.density.learn(routed, prompt);
                self.account.density()
            }
            PromptSize::Tokens(_) => TextPerToken::ASSUMED,
        };
        if let Some(index) = selector.index() {
            index.observe(self.account.id, self.decision.matched, density.text(cached));
        }
        let matched = density.tokens(self.decision.matched);
        let account = &self.account;
        let heavy = || {
            let tokens = account.tokens.load(Relaxed);
            account
                .capacity()
                .is_some_and(|c| tokens.saturating_mul(2) >= c.0)
        };
        if self.top && cached.0.saturating_mul(2) < matched.0 && heavy() {
            account.top_evicted.store(true, Relaxed);
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.answered();
        self.account.inflight.fetch_sub(1, Relaxed);
        if self.tokens > 0 {
            self.account.tokens.fetch_sub(self.tokens, Relaxed);
        }
        if let Some(band) = self.band {
            self.account.kept_in[band].fetch_sub(1, Relaxed);
            self.account.kept.sub(1);
            self.account.kept_tokens.sub(self.tokens);
        }
        (self.account.on_free)();
    }
}

/// What [`Ledger::place`] did.
#[derive(Debug)]
pub enum Placing {
    /// Placed on `accounts[index]`.
    Placed {
        /// The seat, in flight until it drops.
        seat: Seat,
        /// Its backend's position in the accounts given.
        index: usize,
    },
    /// Every backend is at the in-flight limit.
    Full,
    /// A concurrent placement took the last slot of the backend chosen: try again.
    Taken,
}

/// What upkeep is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    Nothing,
    /// Evict the index down to its budgets.
    Trim,
    /// Sweep the tables, forget removed backends, evict.
    Full,
}

/// When upkeep last ran in full.
struct Schedule {
    interval: Duration,
    last: Duration,
    generation: u64,
}

impl Schedule {
    fn due(&mut self, now: Duration, generation: u64, grown: bool) -> Work {
        if now.saturating_sub(self.last) >= self.interval || generation != self.generation {
            (self.last, self.generation) = (now, generation);
            Work::Full
        } else if grown {
            Work::Trim
        } else {
            Work::Nothing
        }
    }
}

/// The placement rules and the upkeep schedule, shared by every request.
pub struct Ledger {
    schedule: Mutex<Schedule>,
}

impl Ledger {
    /// A ledger whose full upkeep runs every `eviction_interval`, and whenever the set of
    /// backends changes.
    pub fn new(eviction_interval: Duration) -> Self {
        Ledger {
            schedule: Mutex::new(Schedule {
                interval: eviction_interval,
                last: Duration::ZERO,
                generation: 0,
            }),
        }
    }

    /// Whether some of `accounts` takes one more request under `cap` and its learned hold.
    pub fn open(&self, accounts: &[&Arc<Account>], cap: impl Into<Cap>) -> bool {
        let cap = cap.into();
        accounts.iter().any(|a| a.open(cap))
    }

    /// Places a request of `text` routing text on one of `accounts` open under `cap` (a
    /// `usize` is an in-flight limit, 0: none): `choose` picks among them as candidates,
    /// and the chosen backend counts the request in flight and its text not expected
    /// cached as pending prefill.
    pub fn place(
        &self,
        accounts: &[&Arc<Account>],
        cap: impl Into<Cap>,
        text: TextBytes,
        choose: impl FnOnce(&[Candidate]) -> Decision,
    ) -> Placing {
        let cap = cap.into();
        let Some(decided) = self.choice(accounts, cap, choose) else {
            return Placing::Full;
        };
        let Some((index, decision)) = decided else {
            return Placing::Taken;
        };
        let prefill = text.saturating_sub(decision.matched);
        let Some(seat) = accounts[index].take(cap, prefill, decision) else {
            return Placing::Taken;
        };
        if cap.top() && cap.conversation != 0 {
            for (i, account) in accounts.iter().enumerate() {
                match i == index {
                    true => account.note_top_home(cap.conversation, cap.tokens),
                    false => account.move_top_home(cap.conversation),
                }
            }
        }
        Placing::Placed { seat, index }
    }

    /// What [`Self::place`] would choose, without taking a seat (`POST /route`): the
    /// chosen account's position in `accounts` and the decision; `None` when every one is
    /// full under `cap`.
    pub fn decide(
        &self,
        accounts: &[&Arc<Account>],
        cap: impl Into<Cap>,
        choose: impl FnOnce(&[Candidate]) -> Decision,
    ) -> Option<(usize, Decision)> {
        self.choice(accounts, cap.into(), choose).flatten()
    }

    /// `choose` among the accounts open under `cap`, as candidates: `None` when there are
    /// none, `Some(None)` when it chose none of them.
    fn choice(
        &self,
        accounts: &[&Arc<Account>],
        cap: Cap,
        choose: impl FnOnce(&[Candidate]) -> Decision,
    ) -> Option<Option<(usize, Decision)>> {
        let open: SmallVec<[usize; 16]> = (0..accounts.len())
            .filter(|&i| accounts[i].open(cap))
            .collect();
        if open.is_empty() {
            return None;
        }
        let candidate = |i: usize| {
            let mut candidate = accounts[i].candidate();
            if let Some(band) = cap.kept_band() {
                candidate.kept = accounts[i].kept_in[band].load(Relaxed);
            }
            candidate.kv_kept = cap.top() && accounts[i].protected.load(Relaxed);
            candidate.protected = candidate.kv_kept && accounts[i].keeps_room_for(cap.tokens);
            candidate
        };
        let candidates: SmallVec<[Candidate; 16]> = open.iter().map(|&i| candidate(i)).collect();
        let decision = choose(&candidates);
        Some(open.get(decision.index).map(|&index| (index, decision)))
    }

    /// Upkeep at `now` of `selector`'s index and tables over the backends of `accounts`
    /// (their set's `generation`): index budgets sized from newly published capacities;
    /// then a full sweep every interval or when the set changed, else eviction alone when
    /// a decision found it due. Returns the key bytes evicted.
    pub fn upkeep(
        &self,
        now: Duration,
        generation: u64,
        selector: &Selector,
        accounts: &[&Arc<Account>],
    ) -> KeyBytes {
        for account in accounts {
            if let (Some(capacity), Some(index)) = (account.budget_change(), selector.index()) {
                index.set_capacity(account.id, capacity);
            }
        }
        let grown = selector.take_upkeep_due();
        match self.schedule.lock().due(now, generation, grown) {
            Work::Full => selector.maintain(&|id| accounts.iter().any(|a| a.id == id)),
            Work::Trim => selector.trim(),
            Work::Nothing => KeyBytes(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Outcome;

    fn accounts(n: u32) -> Vec<Arc<Account>> {
        (0..n)
            .map(|i| Arc::new(Account::new(BackendId(i), u64::from(i))))
            .collect()
    }

    /// What a backend published: `running` and `waiting` requests, half its KV used.
    fn load(running: usize, waiting: usize) -> Published {
        Published {
            running,
            waiting,
            kv_usage: 0.5,
        }
    }

    fn first(_: &[Candidate]) -> Decision {
        Decision {
            index: 0,
            outcome: Outcome::Balanced,
            matched: TextBytes(30),
        }
    }

    #[test]
    fn a_backend_that_queues_is_held_near_what_it_runs_and_released_as_it_drains() {
        let all = accounts(1);
        let refs: Vec<&Arc<Account>> = all.iter().collect();
        let ledger = Ledger::new(Duration::from_secs(60));
        all[0].learn_hold(load(8, 0));
        assert_eq!(all[0].hold(), None, "no hold before it ever queued");
        all[0].learn_hold(load(8, 5));
        assert_eq!(all[0].hold(), Some(8), "what it runs");
        let seats: Vec<_> = (0..12)
            .filter_map(|_| match ledger.place(&refs, 0, TextBytes(1), first) {
                Placing::Placed { seat, .. } => Some(seat),
                _ => None,
            })
            .collect();
        assert_eq!(seats.len(), 8);
        assert!(!ledger.open(&refs, 0));
        all[0].learn_hold(load(8, 0));
        assert_eq!(all[0].hold(), Some(10), "no queue: the hold grows");
        assert!(ledger.open(&refs, 0));
        let kept = |home| Cap {
            kept: true,
            home,
            ..Cap::default()
        };
        let reserve = Cap {
            reserve: true,
            ..Cap::default()
        };
        for (cap, open, why) in [
            (reserve, false, "one of the 8 it ran kept for others"),
            (kept(false), false, "a kept request: no further than it ran"),
            (kept(true), true, "unless it stays home"),
        ] {
            assert_eq!(ledger.open(&refs, cap), open, "{why}");
        }
        all[0].learn_hold(load(9, 0));
        assert_eq!(all[0].hold(), Some(10), "a hold it does not fill stays");
        all[0].forget_hold();
        assert_eq!(all[0].hold(), None);
    }

    #[test]
    fn a_backend_that_never_queued_takes_its_peers_hold_until_it_learns_its_own() {
        let all = accounts(1);
        all[0].adopt_hold((0, 0));
        assert_eq!(all[0].hold(), None, "nothing to adopt");
        all[0].adopt_hold((4, 4));
        assert_eq!(all[0].held(), (4, 4));
        all[0].learn_hold(load(4, 0));
        assert_eq!(all[0].hold(), Some(5), "it runs all of it: the hold grows");
        all[0].adopt_hold((8, 8));
        assert_eq!(all[0].hold(), Some(5), "a hold of its own stays");
        all[0].learn_hold(load(3, 2));
        assert_eq!(all[0].held(), (3, 3), "it queued: its own measure");
    }

    #[test]
    fn the_reserve_grows_to_what_the_requests_it_is_kept_for_had_at_once() {
        let all = accounts(1);
        let refs: Vec<&Arc<Account>> = all.iter().collect();
        let ledger = Ledger::new(Duration::from_secs(60));
        all[0].learn_hold(load(8, 3));
        let (heavy, light) = (
            Cap {
                reserve: true,
                ..Cap::default()
            },
            Cap {
                kept: true,
                ..Cap::default()
            },
        );
        let place = |cap: Cap| match ledger.place(&refs, cap, TextBytes(1), first) {
            Placing::Placed { seat, .. } => Some(seat),
            _ => None,
        };
        let mut seats: Vec<_> = (0..8).map_while(|_| place(heavy)).collect();
        assert_eq!(seats.len(), 7, "one of 8 kept");
        let kept: Vec<_> = (0..3).filter_map(|_| place(light)).collect();
        assert_eq!(kept.len(), 1, "the hold is full");
        seats.truncate(4);
        let kept: Vec<_> = kept
            .into_iter()
            .chain(place(light))
            .chain(place(light))
            .collect();
        assert_eq!(kept.len(), 3, "three kept-for requests at once");
        drop(kept);
        let more: Vec<_> = (0..8).map_while(|_| place(heavy)).collect();
        assert_eq!(more.len(), 1, "3 of 8 stay free for them");
        drop(more);
        for _ in 0..2 * KEPT_READS {
            all[0].learn_hold(load(4, 0));
        }
        let more: Vec<_> = (0..8).map_while(|_| place(heavy)).collect();
        assert_eq!(more.len(), 3, "two windows later, one of 8 again");
    }

    #[test]
    fn a_kept_request_sees_the_kept_requests_of_its_own_band_in_flight() {
        let all = accounts(2);
        let refs: Vec<&Arc<Account>> = all.iter().collect();
        let ledger = Ledger::new(Duration::from_secs(60));
        let kept = |band| Cap {
            kept: true,
            band,
            ..Cap::default()
        };
        let on = |i: usize| {
            move |_: &[Candidate]| Decision {
                index: i,
                ..first(&[])
            }
        };
        let seen = |cap: Cap| {
            let mut seen = Vec::new();
            ledger.decide(&refs, cap, |c| {
                seen = c.iter().map(|c| c.kept).collect();
                first(c)
            });
            seen
        };
        let normal: Vec<_> = (0..3)
            .map(|_| ledger.place(&refs, kept(1), TextBytes(1), on(0)))
            .collect();
        let high = ledger.place(&refs, kept(2), TextBytes(1), on(1));
        assert_eq!(
            seen(kept(2)),
            [0, 1],
            "normal's requests kept before do not count"
        );
        assert_eq!(seen(kept(1)), [3, 0]);
        assert_eq!(seen(Cap::default()), [3, 1], "every band, lately");
        drop((normal, high));
        assert_eq!(seen(kept(1)), [0, 0]);
    }

    #[test]
    fn standing_slots_stay_free_on_a_held_backend_and_never_all_of_them() {
        let all = accounts(2);
        let ledger = Ledger::new(Duration::from_secs(60));
        let standing = |n| Cap {
            standing: n,
            ..Cap::default()
        };
        let place = |account: &Arc<Account>, cap: Cap| {
            let one = [account];
            (0..8)
                .map_while(|_| match ledger.place(&one, cap, TextBytes(1), first) {
                    Placing::Placed { seat, .. } => Some(seat),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(place(&all[0], standing(1)).len(), 8, "no hold: none kept");
        all[0].learn_hold(load(4, 2));
        assert_eq!(place(&all[0], standing(1)).len(), 3, "one of 4 stays free");
        let kept = Cap {
            kept: true,
            ..Cap::default()
        };
        let held = place(&all[0], standing(1));
        assert_eq!(place(&all[0], kept).len(), 1, "an arrival takes it");
        drop(held);
        all[1].learn_hold(load(1, 2));
        assert_eq!(place(&all[1], standing(1)).len(), 1, "never the only slot");
    }

    #[test]
    fn a_request_leaving_the_reserve_leaves_the_kv_the_kept_ones_had_lately() {
        let all = accounts(1);
        let ledger = Ledger::new(Duration::from_secs(60));
        let one = [&all[0]];
        let place = |cap: Cap| match ledger.place(&one, cap, TextBytes(1), first) {
            Placing::Placed { seat, .. } => Some(seat),
            _ => None,
        };
        let heavy = Cap {
            reserve: true,
            tokens: 250,
            ..Cap::default()
        };
        let heavies = || (0..8).map_while(|_| place(heavy)).collect::<Vec<_>>();
        all[0].set_capacity(Some(Tokens(1_000)));
        all[0].learn_hold(load(16, 2));
        let answered = |tokens| {
            let seat = place(Cap {
                kept: true,
                tokens,
                ..Cap::default()
            });
            seat.inspect(Seat::answered)
        };
        let kept = answered(400);
        assert_eq!(heavies().len(), 2, "250 + 250 + the kept 400 fill 1,000");
        drop(kept);
        assert_eq!(
            heavies().len(),
            2,
            "what the kept one had lately stays free"
        );
        for _ in 0..2 * KEPT_READS {
            all[0].learn_hold(load(16, 2));
        }
        assert_eq!(heavies().len(), 4, "until two windows passed");
        let huge = answered(5_000);
        assert_eq!(heavies().len(), 2, "at most half the capacity is left");
        drop(huge);
        all[0].set_capacity(None);
        assert_eq!(heavies().len(), 8, "no capacity published: slots only");
    }

    #[test]
    fn a_conversation_is_hashed_only_for_a_light_flows_request_kept_a_reserve_for() {
        let unhashed = Cap::default().of_conversation(|| panic!("hashed without flow control"));
        assert_eq!(unhashed.conversation, 0);
        let light = Cap {
            kept: true,
            light: true,
            ..Cap::default()
        };
        assert_eq!(light.of_conversation(|| 7).conversation, 7);
    }

    #[test]
    fn once_a_light_flows_context_is_evicted_where_kv_is_full_the_floods_leave_its_backends() {
        let all = accounts(4);
        let refs: Vec<&Arc<Account>> = all.iter().collect();
        let ledger = Ledger::new(Duration::from_secs(60));
        let params = crate::policy::testing::params(0.5, 32);
        let selector = crate::policy::choose("least_load").unwrap().build(&params);
        for a in &all {
            a.set_capacity(Some(Tokens(2_000)));
            a.learn_hold(load(16, 2));
        }
        // On backend `i`, predicted to find `matched` cached; among all backends, so that
        // a light conversation placed here is no longer counted where it was.
        let place = |i: usize, cap: Cap, matched: Tokens| {
            let choose = |candidates: &[Candidate]| Decision {
                index: candidates
                    .iter()
                    .position(|c| c.id == all[i].id)
                    .unwrap_or(9),
                matched: matched.text(),
                ..first(&[])
            };
            match ledger.place(&refs, cap, TextBytes(1), choose) {
                Placing::Placed { seat, .. } => Some(seat).inspect(Seat::answered),
                _ => None,
            }
        };
        let light = |conversation: u128| Cap {
            kept: true,
            light: true,
            tokens: 400,
            conversation,
            ..Cap::default()
        };
        let flood = Cap {
            reserve: true,
            tokens: 100,
            ..Cap::default()
        };
        let on = |i: usize, cap: Cap| place(i, cap, Tokens(0));
        // Conversation `c`'s turn predicted to find 200 tokens cached at backend `i` finds 10.
        let evicted = |i: usize, c: u128| {
            let seat = place(i, light(c), Tokens(200)).expect("placed");
            let report = Report {
                size: PromptSize::Tokens(Tokens(400)),
                prompt: Tokens(400),
                cached: Tokens(10),
            };
            seat.reported(&selector, report);
        };
        let protect = || protect_kv(all.iter().map(|a| &**a));
        let protected = || all.iter().map(|a| a.kv_kept()).collect::<Vec<_>>();
        let lights = [on(0, light(1)), on(1, light(2)), on(1, light(3))];
        let floods: Vec<_> = (0..4).map(|i| on(i, flood)).collect();
        assert!(floods.iter().all(Option::is_some));
        evicted(0, 1);
        protect();
        assert_eq!(
            protected(),
            [false; 4],
            "evicted where the prompts in flight (900 tokens) fill under half the KV"
        );
        let more: Vec<_> = (0..3).map(|_| on(1, flood)).collect();
        evicted(1, 2);
        protect();
        assert_eq!(
            protected(),
            [false, true, false, false],
            "evicted at 1,600 of 2,000: the backend of most of the light flow's 1,200 \
             tokens of conversations, for half again those"
        );
        assert!(on(1, flood).is_none(), "a flood leaves it");
        assert!(on(2, flood).is_some(), "and goes to the others");
        let moved = on(2, light(3));
        protect();
        assert_eq!(
            protected(),
            [false, true, false, false],
            "kept while the flow is active, though it has as much on backends 0 and 2"
        );
        let opened = [on(3, light(4)), on(3, light(5))];
        protect();
        assert_eq!(
            protected(),
            [false, true, false, true],
            "one more for its 2,000 tokens: the one where it has the most"
        );
        let grown = [on(0, light(6)), on(2, light(7))];
        protect();
        assert_eq!(
            protected(),
            [true, true, false, true],
            "at most three quarters of the fleet for its 2,800"
        );
        drop((lights, more, moved, opened, grown));
        for _ in 0..HOME_READS {
            all.iter().for_each(|a| a.learn_hold(load(16, 2)));
        }
        protect();
        assert_eq!(protected(), [false; 4], "the light flow idle");
        let back = on(1, light(2));
        protect();
        assert!(back.is_some());
        assert_eq!(protected(), [false; 4], "back, and not evicted since");
    }

    #[test]
    fn a_seat_counts_its_load_and_prefill_until_answered_and_dropped() {
        let all = accounts(2);
        let refs: Vec<&Arc<Account>> = all.iter().collect();
        let ledger = Ledger::new(Duration::from_secs(60));
        let Placing::Placed { seat, index } = ledger.place(&refs, 0, TextBytes(100), first) else {
            panic!("not placed");
        };
        assert_eq!(
            (index, all[0].load(), all[0].pending()),
            (0, 1, TextBytes(70))
        );
        seat.answered();
        assert_eq!((all[0].load(), all[0].pending()), (1, TextBytes(0)));
        drop(seat);
        assert_eq!(all[0].load(), 0);
    }

    #[test]
    fn the_limit_leaves_out_full_backends_and_reports_a_full_fleet() {
        let all = accounts(2);
        let refs: Vec<&Arc<Account>> = all.iter().collect();
        let ledger = Ledger::new(Duration::from_secs(60));
        let Placing::Placed { seat: a, index } = ledger.place(&refs, 1, TextBytes(0), first) else {
            panic!("not placed");
        };
        assert_eq!(index, 0);
        // Backend 0 is full: the first candidate offered is now backend 1.
        let Placing::Placed { seat: b, index } = ledger.place(&refs, 1, TextBytes(0), first) else {
            panic!("not placed");
        };
        assert_eq!(index, 1);
        assert!(!ledger.open(&refs, 1));
        assert!(matches!(
            ledger.place(&refs, 1, TextBytes(0), first),
            Placing::Full
        ));
        drop((a, b));
        assert!(ledger.open(&refs, 1));
    }

    #[test]
    fn a_cap_over_takes_that_many_slots_past_the_limit_and_the_hold() {
        let all = accounts(1);
        let refs: Vec<&Arc<Account>> = all.iter().collect();
        let ledger = Ledger::new(Duration::from_secs(60));
        all[0].learn_hold(load(1, 1));
        assert_eq!(all[0].hold(), Some(1));
        let over = Cap {
            limit: 1,
            over: 1,
            ..Cap::default()
        };
        let Placing::Placed { seat: _one, .. } = ledger.place(&refs, 1, TextBytes(0), first) else {
            panic!("not placed");
        };
        assert!(!ledger.open(&refs, 1), "at its limit and its hold");
        let Placing::Placed { seat: _two, .. } = ledger.place(&refs, over, TextBytes(0), first)
        else {
            panic!("one past both");
        };
        assert!(!ledger.open(&refs, over), "no more than one past");
    }

    #[test]
    fn a_request_leaving_the_reserve_waits_while_a_kept_one_prefills_on_a_held_backend() {
        let (account, freed) = counting();
        let ledger = Ledger::new(Duration::from_secs(60));
        let (kept, reserve) = (
            Cap {
                kept: true,
                ..Cap::from(8)
            },
            Cap {
                reserve: true,
                ..Cap::from(8)
            },
        );
        let Placing::Placed { seat, .. } = ledger.place(&[&account], kept, TextBytes(0), first)
        else {
            panic!("not placed");
        };
        assert!(account.open(reserve), "no hold learned: never held back");
        account.learn_hold(load(4, 1));
        assert!(
            !account.open(reserve),
            "guarded while the kept one prefills"
        );
        assert!(
            account.open(kept) && account.open(8),
            "only those leaving the reserve"
        );
        seat.answered();
        assert_eq!(freed.load(Relaxed), 1, "the guard lifting wakes a waiter");
        assert!(account.open(reserve), "open once it answered");
        seat.answered();
        drop(seat);
        assert_eq!(freed.load(Relaxed), 2, "lifted once, freed once");
    }

    /// An account, and how many times it called its hook.
    fn counting() -> (Arc<Account>, Arc<AtomicUsize>) {
        let freed = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&freed);
        let account = Account::new(BackendId(0), 0).on_free(move || {
            count.fetch_add(1, Relaxed);
        });
        (Arc::new(account), freed)
    }

    #[test]
    fn a_freed_seat_calls_its_accounts_hook() {
        let (account, freed) = counting();
        let ledger = Ledger::new(Duration::from_secs(60));
        let placed = ledger.place(&[&account], 0, TextBytes(0), first);
        drop(placed);
        assert_eq!(freed.load(Relaxed), 1);
    }

    #[test]
    fn upkeep_runs_in_full_on_its_interval_or_a_new_fleet_and_trims_when_grown() {
        let mut s = Schedule {
            interval: Duration::from_secs(10),
            last: Duration::ZERO,
            generation: 0,
        };
        let at = Duration::from_secs;
        assert_eq!(s.due(at(1), 0, false), Work::Nothing);
        assert_eq!(s.due(at(2), 0, true), Work::Trim);
        assert_eq!(s.due(at(3), 1, false), Work::Full);
        assert_eq!(s.due(at(12), 1, false), Work::Nothing);
        assert_eq!(s.due(at(13), 1, false), Work::Full);
    }
}
