//! One backend's [`Account`]: its load, what it published, its hold, its reserve and its
//! KV guard, and the one check of whether a request under a [`Cap`] may take it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use super::hold::Hold;
use super::kv_guard::KvGuard;
use super::load::Load;
use super::publication::Publication;
use super::reserve::{KEPT_READS, Reserve};
use super::{Cap, Seat};
use crate::BackendId;
use crate::policy::{Candidate, Decision, Published};
use crate::units::{TextBytes, TextPerToken, Tokens};

/// One backend's account. Shared by every fleet snapshot that holds the backend, so that
/// its counts survive reloads.
pub struct Account {
    /// Which backend.
    pub id: BackendId,
    /// A stable hash of its address (the same on every router replica).
    pub hash: u64,
    pub(super) load: Load,
    pub(super) publication: Publication,
    hold: Hold,
    pub(super) reserve: Reserve,
    pub(super) guard: KvGuard,
    /// Reads of its published load so far.
    reads: AtomicUsize,
    pub(super) on_free: Box<dyn Fn() + Send + Sync>,
}

impl Account {
    /// An idle account with nothing known of the backend's KV.
    pub fn new(id: BackendId, hash: u64) -> Self {
        Account {
            id,
            hash,
            load: Load::default(),
            publication: Publication::default(),
            hold: Hold::default(),
            reserve: Reserve::default(),
            guard: KvGuard::default(),
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
        self.load.requests()
    }

    /// Routing text placed here, expected uncached, not answered yet.
    pub fn pending(&self) -> TextBytes {
        self.load.pending()
    }

    /// Prompt tokens of the requests in flight here (as estimated at admission), and the
    /// most that requests a reserve was kept for had in flight here lately: the KV a
    /// request leaving the reserve leaves them.
    pub fn tokens_in_flight(&self) -> (Tokens, Tokens) {
        (self.load.tokens(), self.reserve.tokens_lately())
    }

    /// Whether its KV is kept for light flows: no request that leaves them a reserve is
    /// placed here while it is held ([`protect_kv`](super::protect_kv)).
    pub fn kv_kept(&self) -> bool {
        self.guard.kept()
    }

    /// The KV capacity the backend published, if it did.
    pub fn capacity(&self) -> Option<Tokens> {
        self.publication.capacity()
    }

    /// Records the KV capacity the backend published (`None`: it does not say).
    pub fn set_capacity(&self, capacity: Option<Tokens>) {
        self.publication.set_capacity(capacity);
    }

    /// Bytes of routing text per token of its prompts (text mode), as its reports taught.
    pub fn density(&self) -> TextPerToken {
        self.publication.density()
    }

    /// Tokens per block of its KV cache, if it published them.
    pub fn block(&self) -> Option<Tokens> {
        self.publication.block()
    }

    /// Records the block size the backend published (`None`: it does not say).
    pub fn set_block(&self, block: Option<Tokens>) {
        self.publication.set_block(block);
    }

    /// How many sequences' KV the backend keeps at once (llama.cpp's slots), if it said.
    pub fn sequences(&self) -> Option<usize> {
        self.publication.sequences()
    }

    /// Records how many sequences' KV the backend keeps at once (`None`: it does not say,
    /// or shares one pool among all, as vLLM does).
    pub fn set_sequences(&self, sequences: Option<usize>) {
        self.publication.set_sequences(sequences);
    }

    /// What the backend last published of its load, if anything.
    pub fn published(&self) -> Option<Published> {
        self.publication.load()
    }

    /// Records what the backend published of its load (`None`: it does not say).
    pub fn set_published(&self, published: Option<Published>) {
        self.publication.set_load(published);
    }

    /// A read of what the backend just published: its hold learns from it (while
    /// requests wait in the engine's own queue, where no priority or fairness acts, the
    /// router sends it at most what it runs), the reserve's window turns every
    /// [`KEPT_READS`] reads, and light flows' conversations placed
    /// [`HOME_READS`](super::HOME_READS) reads ago stop counting here.
    pub fn learn_hold(&self, published: Published) {
        self.hold.learn(published);
        if self.reads.fetch_add(1, Relaxed) % KEPT_READS == KEPT_READS - 1 {
            self.reserve.turn();
        }
        self.guard.forget_homes(self.reads.load(Relaxed));
    }

    /// Takes `peers`' hold and ceiling (the largest its fleet's other backends learnt)
    /// while it learnt none of its own: engines of one fleet mostly run alike, and a
    /// backend without a hold would take every request the held ones refuse, queueing
    /// them in its engine. It then grows or falls as [`Self::learn_hold`] says.
    pub fn adopt_hold(&self, peers: (usize, usize)) {
        self.hold.adopt(peers);
    }

    /// Forgets the hold (flow control is off).
    pub fn forget_hold(&self) {
        self.hold.forget();
    }

    /// Its hold and ceiling (0: none).
    pub fn held(&self) -> (usize, usize) {
        self.hold.held()
    }

    /// Requests in flight it takes before more are held in the router, if it learnt one.
    pub fn hold(&self) -> Option<usize> {
        Some(self.held().0).filter(|&h| h > 0)
    }

    /// Requests placed past any hold that its engine queues, as placed before it learnt
    /// one: what it last published as waiting, at most its load over its hold and over
    /// the hold before the last read (so that neither the quarter a hold probes past the
    /// engine nor a hold that fell counts). 0 without a hold or a published load.
    pub fn excess(&self) -> usize {
        (self.published()).map_or(0, |published| self.hold.excess(self.load(), published))
    }

    /// Whether it takes one more request under `cap` and its learnt hold.
    pub fn open(&self, cap: impl Into<Cap>) -> bool {
        self.below(self.load(), cap.into())
    }

    /// The one admission check: whether `load` is below the slots `cap` may take here
    /// ([`Self::room`]), and, for a request that leaves the reserve, its prompt leaves the
    /// KV the kept requests had lately.
    fn below(&self, load: usize, cap: Cap) -> bool {
        let room = self.room(cap);
        room.admits(load) && (!room.leaves_kv || self.leaves_kv(cap.tokens))
    }

    /// What a request under `cap` may take here now ([`Room`]): the least of `cap`'s
    /// limit (0: none), the hold (0: none; for a request the reserve is kept for, no more
    /// than the ceiling but at its conversation's home), and, with a reserve or standing
    /// slots to leave, the ceiling less those; each raised by `cap.over`. A request that
    /// leaves the reserve free may take none of a held backend while a request the reserve
    /// is kept for prefills there (the prefill guard: engines split their prefill compute
    /// among the requests prefilling at once) or while its KV is kept for light flows.
    pub fn room(&self, cap: Cap) -> Room {
        let (hold, ceiling) = self.held();
        // Past what the engine runs, a kept request would wait in the engine's queue (a
        // hold probes a quarter past it) rather than in the router's.
        let hold = match cap.kept() && !cap.home() && ceiling > 0 {
            true => hold.min(ceiling),
            false => hold,
        };
        let free = if cap.leaves() {
            self.reserve.slots(ceiling)
        } else {
            cap.standing().min(ceiling.saturating_sub(1))
        };
        let leaving = cap.leaves() && hold > 0;
        let kept_off = leaving && (self.reserve.prefilling() || self.guard.kept());
        let bounds = [
            (cap.limit > 0).then_some(cap.limit),
            (hold > 0).then_some(hold),
            (free > 0 && hold > 0 && ceiling > 0).then(|| ceiling.min(hold).saturating_sub(free)),
            kept_off.then_some(0),
        ];
        Room {
            slots: bounds.into_iter().flatten().min(),
            over: cap.over,
            leaves_kv: leaving,
        }
    }

    /// Whether a request of `tokens` that leaves the reserve leaves the kept requests'
    /// KV ([`Reserve::leaves_kv`]); true where the capacity is unknown.
    fn leaves_kv(&self, tokens: Tokens) -> bool {
        let all = self.load.tokens();
        (self.capacity()).is_none_or(|c| self.reserve.leaves_kv(c, all, tokens))
    }

    /// Whether light flows' conversations here, with `tokens` more, stay within two
    /// thirds of its published KV ([`KvGuard::keeps_room_for`]).
    pub(super) fn keeps_room_for(&self, tokens: Tokens) -> bool {
        (self.capacity()).is_some_and(|c| self.guard.keeps_room_for(c, tokens))
    }

    /// Counts a light flow's `conversation` of `tokens` here, placed now.
    pub(super) fn note_home(&self, conversation: u128, tokens: Tokens) {
        (self.guard).note_home(conversation, tokens, self.reads.load(Relaxed));
    }

    /// The backend as a policy sees it.
    pub fn candidate(&self) -> Candidate {
        Candidate {
            id: self.id,
            load: self.load(),
            pending: self.pending(),
            capacity: self.capacity().unwrap_or_default().text(),
            sequences: self.sequences().unwrap_or(0),
            block: self.block().unwrap_or_default(),
            text_per_token: self.density(),
            hash: self.hash,
            published: self.published(),
            recorded: None,
        }
    }

    /// A seat for a request of `prefill` uncached text, while `cap` lets one more in. Check
    /// and count are one atomic step, so concurrent placements never push a backend past
    /// its limit.
    pub(super) fn take(
        self: &Arc<Self>,
        cap: Cap,
        prefill: TextBytes,
        decision: Decision,
    ) -> Option<Seat> {
        if !(self.load).take(|n| self.below(n, cap), prefill, cap.tokens) {
            return None;
        }
        let band = cap.kept_band();
        if let Some(band) = band {
            self.reserve.seat(band, cap.tokens);
        }
        Some(Seat::new(Arc::clone(self), prefill, cap, decision))
    }
}

/// What a request may take of one backend now ([`Account::room`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    /// Requests in flight it may be placed below (`None`: no bound; `Some(0)`: closed to
    /// it).
    pub slots: Option<usize>,
    /// Slots past them it may take ([`Cap::over`]), unless closed.
    pub over: usize,
    /// Whether its prompt must also leave the KV the kept requests had lately.
    pub leaves_kv: bool,
}

impl Room {
    /// Whether one more request fits beside `load` in flight.
    pub fn admits(&self, load: usize) -> bool {
        match self.slots {
            None => true,
            Some(0) => false,
            Some(slots) => load < slots.saturating_add(self.over),
        }
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
