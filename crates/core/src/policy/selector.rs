//! The selector: a policy with the handles of what it keeps (its prefix index, its tables),
//! as [`PolicyChoice::build`](super::PolicyChoice::build) assembles it. Requests ask it to
//! choose; upkeep asks it to sweep and evict; stats read its handles. It never asks the
//! policy which kind it is: a policy without an index simply has none here.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use super::{Candidate, Conversations, Decision, Policy, PolicyParams, Request, Sticky, Table};
use crate::BackendId;
use crate::index::PrefixIndex;
use crate::units::KeyBytes;

/// A table's name and its size, for stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableSize {
    /// The table's name (`sessions`, `conversations`).
    pub name: &'static str,
    /// Entries held.
    pub entries: usize,
}

/// A policy and the handles of what it keeps.
pub struct Selector {
    policy: Box<dyn Policy>,
    index: Option<Arc<PrefixIndex>>,
    tables: Vec<Arc<dyn Table>>,
    /// The conversation table, with this router's id in it.
    conversations: Option<(Arc<Conversations>, u64)>,
    upkeep_due: AtomicBool,
    signal: Box<dyn Fn() + Send + Sync>,
}

impl Selector {
    /// `policy`, keeping nothing besides.
    pub fn new(policy: impl Policy + 'static) -> Self {
        Selector {
            policy: Box::new(policy),
            index: None,
            tables: Vec::new(),
            conversations: None,
            upkeep_due: AtomicBool::new(false),
            signal: Box::new(|| {}),
        }
    }

    /// The policy routes on `index`.
    pub fn indexed(mut self, index: Arc<PrefixIndex>) -> Self {
        self.index = Some(index);
        self
    }

    /// The policy keeps the conversation table `table`, where this router's id is `origin`.
    pub fn with_conversations(mut self, table: Arc<Conversations>, origin: u64) -> Self {
        self.tables.push(Arc::clone(&table) as Arc<dyn Table>);
        self.conversations = Some((table, origin));
        self
    }

    /// The policy with session affinity on top ([`Sticky`]).
    pub fn sticky(mut self, params: &PolicyParams) -> Self {
        let sticky = Sticky::new(self.policy, params);
        self.tables.push(sticky.sessions());
        self.policy = Box::new(sticky);
        self
    }

    /// Calls `signal` whenever a decision finds the index due for eviction before upkeep's
    /// interval (it grew by a tenth of a budget), so that memory stays bounded however fast
    /// text arrives. `signal` must be cheap.
    pub fn on_upkeep_due(mut self, signal: impl Fn() + Send + Sync + 'static) -> Self {
        self.signal = Box::new(signal);
        self
    }

    /// Picks one of `candidates` (never empty) for `request`.
    pub fn select(&self, request: &Request, candidates: &[Candidate]) -> Decision {
        let decision = self.policy.choose(request, candidates);
        if self.index.as_ref().is_some_and(|i| i.eviction_due()) {
            self.upkeep_due.store(true, Relaxed);
            (self.signal)();
        }
        decision
    }

    /// The request of `conversation` placed on `backend` holds no KV there: the engine
    /// refused it (an error status) or the exchange failed. Its conversation stops
    /// counting as live on that backend ([`Conversations::release`]).
    pub fn released(&self, conversation: u128, backend: BackendId) {
        if let Some((table, origin)) = &self.conversations {
            table.release(conversation, backend, *origin);
        }
    }

    /// The live conversations on each of `backends` (what their KV must hold), when the
    /// policy keeps a conversation table.
    pub fn live(&self, backends: impl Iterator<Item = BackendId>) -> Option<Vec<super::Live>> {
        (self.conversations.as_ref()).map(|(table, _)| table.held(backends))
    }

    /// The backend `conversation` was last placed on, when the policy keeps a conversation
    /// table that remembers it.
    pub fn home(&self, conversation: u128) -> Option<BackendId> {
        let (table, _) = self.conversations.as_ref()?;
        table.home_of(conversation).map(|(backend, _)| backend)
    }

    /// Whether a decision found eviction due since the last call.
    pub fn take_upkeep_due(&self) -> bool {
        self.upkeep_due.swap(false, Relaxed)
    }

    /// The prefix index, if the policy routes on one.
    pub fn index(&self) -> Option<&PrefixIndex> {
        self.index.as_deref()
    }

    /// Full upkeep: sweeps the tables, evicts the index, forgets backends for which `live`
    /// is false. Returns the key bytes evicted.
    pub fn maintain(&self, live: &dyn Fn(BackendId) -> bool) -> KeyBytes {
        self.tables.iter().for_each(|t| t.sweep(live));
        self.index
            .as_ref()
            .map_or(KeyBytes(0), |i| i.maintain(live))
    }

    /// Evicts the index down to its budgets, and nothing else. Returns the key bytes evicted.
    pub fn trim(&self) -> KeyBytes {
        self.index.as_ref().map_or(KeyBytes(0), |i| i.trim())
    }

    /// The size of each table the policy keeps.
    pub fn tables(&self) -> Vec<TableSize> {
        (self.tables.iter())
            .map(|t| TableSize {
                name: t.name(),
                entries: t.entries(),
            })
            .collect()
    }
}
