//! Routing policies: one trait, one file per policy, and the one table where policies are
//! named. A policy picks among ready candidates; it knows nothing of HTTP or of the fleet.
//! Session affinity sits on top of every policy ([`Selector`]).

mod affinity;
mod cache_aware;
mod calibration;
mod consistent_hash;
mod footprint;
mod kv_aware;
mod least_load;
mod power_of_two;
mod prefill_aware;
mod prefix;
mod random;
mod round_robin;
mod sessions;
mod ties;

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;

pub use affinity::Selector;
pub use sessions::Sessions;
pub use ties::Ties;

use crate::BackendId;
use crate::clock::Clock;
use crate::request::{RoutingText, SessionKey};
use crate::tree::{TreeConfig, TreeStats};

/// Balance bounds shared by `cache_aware` and session affinity: the fleet is imbalanced when
/// max in-flight - min in-flight > `abs` and max > min * `rel`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Balance {
    /// Absolute bound in requests. Default 64.
    pub abs: usize,
    /// Relative bound, a factor >= 1. Default 1.5.
    pub rel: f64,
}

impl Default for Balance {
    fn default() -> Self {
        Balance { abs: 64, rel: 1.5 }
    }
}

/// A ready backend as a policy sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Which backend.
    pub id: BackendId,
    /// Its requests in flight.
    pub load: usize,
    /// Bytes of routing text its in-flight requests were not expected to find cached and
    /// that have not been answered yet: the prefill work queued there.
    pub pending: usize,
    /// Bytes of routing text of its requests in flight: the KV they hold while they run.
    pub active: usize,
    /// Its KV capacity, in bytes of routing text; 0 when unknown (prefix policies then take
    /// its index budget instead).
    pub capacity: usize,
    /// A stable hash of its address (same on every router replica).
    pub hash: u64,
}

impl Candidate {
    /// A candidate with nothing known of its KV (`active` and `capacity` 0).
    pub fn new(id: BackendId, load: usize, pending: usize, hash: u64) -> Self {
        Candidate {
            id,
            load,
            pending,
            active: 0,
            capacity: 0,
            hash,
        }
    }
}

/// What a request offers a policy.
pub struct Request<'r, 'a> {
    /// The model; each model has its own prefix tree.
    pub model: &'a [u8],
    /// The routing text (empty for unrouted paths).
    pub text: &'r RoutingText<'a>,
    /// The session key, when the client gave one.
    pub session: Option<SessionKey>,
}

impl Request<'_, '_> {
    /// What names the conversation across its turns: the session key when the client gave
    /// one, else a hash of the text up to its first user message.
    pub fn conversation(&self) -> u128 {
        match self.session {
            Some(session) => session.0,
            None => self.text.anchor_hash(),
        }
    }
}

/// Why a backend was chosen, for logs and stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The best prefix match was good enough to follow.
    PrefixHit,
    /// No match good enough: the least loaded backend.
    PrefixMiss,
    /// The fleet was imbalanced: the least loaded backend.
    Imbalance,
    /// The session's backend.
    Session,
    /// Placed by load or rotation alone (policies that ignore the text).
    Balanced,
    /// Placed by hashing a key.
    Hashed,
    /// A new conversation, placed by the room its backend has for it.
    Placed,
}

impl Outcome {
    /// A short label.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::PrefixHit => "prefix_hit",
            Outcome::PrefixMiss => "prefix_miss",
            Outcome::Imbalance => "imbalance",
            Outcome::Session => "session",
            Outcome::Balanced => "balanced",
            Outcome::Hashed => "hashed",
            Outcome::Placed => "placed",
        }
    }
}

/// A policy's choice: an index into the candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Index of the chosen candidate.
    pub index: usize,
    /// Why.
    pub outcome: Outcome,
    /// Bytes of the text the chosen backend is believed to hold.
    pub matched: usize,
}

impl Decision {
    /// A decision that used no prefix information.
    pub fn new(index: usize, outcome: Outcome) -> Self {
        Decision {
            index,
            outcome,
            matched: 0,
        }
    }
}

/// A routing policy.
pub trait Policy: Send + Sync {
    /// Picks one of `candidates`, which is never empty.
    fn choose(&self, request: &Request, candidates: &[Candidate]) -> Decision;

    /// Learns that `backend` was given `request` by someone else (session affinity);
    /// returns the bytes of its text the backend was believed to hold.
    fn record(&self, _request: &Request, _backend: BackendId) -> usize {
        0
    }

    /// Periodic upkeep (eviction); `live` tells which backends still exist. Returns the
    /// bytes of remembered text evicted.
    fn maintain(&self, _live: &dyn Fn(BackendId) -> bool) -> usize {
        0
    }

    /// Whether upkeep is due before its interval (enough text recorded since the last
    /// eviction to put a backend over budget). Asked after every decision: must be cheap.
    fn needs_upkeep(&self) -> bool {
        false
    }

    /// Prefix-tree figures, for policies that keep a tree.
    fn tree_stats(&self) -> Option<TreeStats> {
        None
    }

    /// Sizes what the policy remembers of `backend` to `tokens` of KV (its capacity), or
    /// back to the configured size (`None`).
    fn set_budget(&self, _backend: BackendId, _tokens: Option<usize>) {}

    /// The tokens of KV the policy remembers at most for `backend`, if it remembers any.
    fn budget(&self, _backend: BackendId) -> Option<usize> {
        None
    }

    /// Learns from a response: `backend` reported `delivered` bytes' worth of cached
    /// tokens where the policy predicted `predicted` bytes.
    fn observe(&self, _backend: BackendId, _predicted: usize, _delivered: usize) {}

    /// Whether the policy keeps sessions on their backends itself (weighing when to move
    /// one), so that the selector's own session affinity must not override it.
    fn keeps_sessions(&self) -> bool {
        false
    }
}

/// Policy parameters a reload may change while requests are being routed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tunables {
    /// Minimum match ratio for `cache_aware` to follow a prefix match. Default 0.3.
    pub cache_threshold: f64,
    /// Imbalance bounds.
    pub balance: Balance,
}

impl Default for Tunables {
    fn default() -> Self {
        Tunables {
            cache_threshold: 0.3,
            balance: Balance::default(),
        }
    }
}

/// [`Tunables`] shared by the policy and the session layer, replaced atomically.
#[derive(Clone, Debug)]
pub struct SharedTunables(Arc<ArcSwap<Tunables>>);

impl SharedTunables {
    /// Shared `tunables`.
    pub fn new(tunables: Tunables) -> Self {
        SharedTunables(Arc::new(ArcSwap::from_pointee(tunables)))
    }

    /// The current values.
    pub fn get(&self) -> Tunables {
        **self.0.load()
    }

    /// Replaces the values; requests routed from now on see them.
    pub fn set(&self, tunables: Tunables) {
        self.0.store(Arc::new(tunables));
    }
}

/// What policies are built from.
#[derive(Clone)]
pub struct PolicyParams {
    /// Reloadable parameters.
    pub tunables: SharedTunables,
    /// Prefix-tree settings.
    pub tree: TreeConfig,
    /// Seed of the policy's tie-breaking turns and random picks.
    pub seed: u64,
    /// The clock the policy measures idleness on (the selector's).
    pub clock: Arc<dyn Clock>,
    /// Whether prefix policies correct each backend's index budget from the cached tokens
    /// it reports ([`calibration`](self)). Default true.
    pub calibrate: bool,
}

/// A policy name with its constructor.
#[derive(Clone, Copy)]
pub struct PolicyChoice {
    /// The name used in config and on the command line.
    pub name: &'static str,
    build: fn(&PolicyParams) -> Box<dyn Policy>,
}

impl PolicyChoice {
    /// Builds the policy.
    pub fn build(&self, params: &PolicyParams) -> Box<dyn Policy> {
        (self.build)(params)
    }
}

impl fmt::Debug for PolicyChoice {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.name)
    }
}

impl PartialEq for PolicyChoice {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

/// The policy used when none is configured.
pub const DEFAULT: &str = "kv_aware";

/// Every policy, by name. Adding a policy: a file and one line here.
const POLICIES: &[PolicyChoice] = &[
    PolicyChoice {
        name: "kv_aware",
        build: kv_aware::build,
    },
    PolicyChoice {
        name: "cache_aware",
        build: cache_aware::build,
    },
    PolicyChoice {
        name: "round_robin",
        build: round_robin::build,
    },
    PolicyChoice {
        name: "random",
        build: random::build,
    },
    PolicyChoice {
        name: "least_load",
        build: least_load::build,
    },
    PolicyChoice {
        name: "power_of_two",
        build: power_of_two::build,
    },
    PolicyChoice {
        name: "consistent_hash",
        build: consistent_hash::build,
    },
    PolicyChoice {
        name: "prefill_aware",
        build: prefill_aware::build,
    },
];

/// A policy name that is not in the table.
#[derive(Debug, thiserror::Error)]
#[error("unknown policy `{name}`, expected one of: {}", names().join(", "))]
pub struct UnknownPolicy {
    /// The name asked for.
    pub name: String,
}

/// The names of every policy, in table order.
pub fn names() -> Vec<&'static str> {
    POLICIES.iter().map(|p| p.name).collect()
}

/// The policy called `name`.
pub fn choose(name: &str) -> Result<PolicyChoice, UnknownPolicy> {
    POLICIES
        .iter()
        .find(|p| p.name == name)
        .copied()
        .ok_or_else(|| UnknownPolicy { name: name.into() })
}

/// Whether `load` is past the imbalance bound relative to the least loaded candidate.
pub fn overloaded(load: usize, candidates: &[Candidate], balance: &Balance) -> bool {
    let min = candidates.iter().map(|c| c.load).min().unwrap_or(0);
    load.saturating_sub(min) > balance.abs && load as f64 > min as f64 * balance.rel
}

/// Whether the fleet is imbalanced: its most loaded candidate is overloaded.
pub fn imbalanced(candidates: &[Candidate], balance: &Balance) -> bool {
    let max = candidates.iter().map(|c| c.load).max().unwrap_or(0);
    overloaded(max, candidates, balance)
}

#[cfg(test)]
pub(crate) mod testing;
