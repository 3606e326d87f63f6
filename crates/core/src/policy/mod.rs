//! Routing policies: one trait of two methods, one file per policy, and the one table
//! where policies are named. A policy picks among ready candidates; it knows nothing of
//! HTTP or of the fleet. What some policies keep besides (the prefix index, the session
//! and conversation tables) are handles the [`Selector`] holds, not methods of the trait;
//! session affinity is a wrapper ([`Sticky`]) around the policies that want it.

mod cache_aware;
mod consistent_hash;
mod conversations;
mod kv_aware;
mod least_load;
mod power_of_two;
mod prefill_aware;
mod prefix;
mod random;
mod round_robin;
mod selector;
mod sessions;
mod sticky;
mod ties;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use conversations::{Conversations, Live, Note};
pub use selector::{Selector, TableSize};
pub use sessions::{SESSION_TTL, Sessions};
pub use sticky::Sticky;
pub use ties::{Ties, Turn};

use crate::BackendId;
use crate::clock::Clock;
use crate::index::PrefixIndex;
use crate::request::{RoutingText, SessionKey, blocks};
use crate::tree::TreeConfig;
use crate::units::{PromptSize, TextBytes, TextPerToken, Tokens};

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
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// Which backend.
    pub id: BackendId,
    /// Its requests in flight.
    pub load: usize,
    /// Routing text of its in-flight requests that was not expected cached and has not
    /// been answered yet: the prefill work queued there.
    pub pending: TextBytes,
    /// Its KV capacity, in the unit of `Request::size` (prefix policies convert it for a
    /// text-mode request at `text_per_token`); 0 when unknown (they then take what their
    /// index may remember of it).
    pub capacity: TextBytes,
    /// Bytes of routing text per token of its prompts, as its reports taught (text mode).
    pub text_per_token: TextPerToken,
    /// How many sequences' KV it keeps at once when each sequence has a KV of its own
    /// (llama.cpp's slots): a conversation beyond that many takes another's place. 0 when
    /// unknown or unbounded (vLLM's shared block pool).
    pub sequences: usize,
    /// Tokens per block of its KV cache, as the engine published it; the engine reuses a
    /// prefix in whole blocks. 0 when unknown (the index's own 16-token blocks).
    pub block: Tokens,
    /// A stable hash of its address (same on every router replica).
    pub hash: u64,
    /// The load the backend itself published, as last read; `None` when it does not say.
    /// Every router replica reads the same.
    pub published: Option<Published>,
    /// The prefix of this request the backend holds by its own record (its KV events), in
    /// the unit of `Request::size`; `None` when it has no whole record (prefix policies then
    /// take what their index predicts).
    pub recorded: Option<TextBytes>,
}

/// The load a backend publishes of itself (vLLM's `/metrics`), as a router last read it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Published {
    /// Requests running (`vllm:num_requests_running`).
    pub running: usize,
    /// Requests waiting to be scheduled (`vllm:num_requests_waiting`).
    pub waiting: usize,
    /// Fraction of its KV blocks held by running requests, 0..=1
    /// (`vllm:kv_cache_usage_perc`).
    pub kv_usage: f64,
}

impl Eq for Candidate {}

impl Candidate {
    /// What the engine would reuse of a `prompt` of which it holds `matched` (both in the
    /// unit of `Request::size`): whole blocks of its own size, and never the prompt's last
    /// token, which it always computes (vLLM looks up at most `prompt - 1` tokens).
    /// Unchanged where its block is not known.
    pub fn reusable(&self, matched: TextBytes, prompt: TextBytes) -> TextBytes {
        let block = self.block.text().0;
        if block == 0 {
            return matched;
        }
        let most = matched.min(prompt.saturating_sub(Tokens(1).text()));
        TextBytes(most.0 / block * block)
    }
}

/// What a request offers a policy.
#[derive(Clone, Copy)]
pub struct Request<'r, 'a> {
    /// The model; each model has its own prefix tree.
    pub model: &'a [u8],
    /// The routing text (empty for unrouted paths).
    pub text: &'r RoutingText<'a>,
    /// The session key, when the client gave one.
    pub session: Option<SessionKey>,
    /// The prompt's own tokens, when its model's tokenizer rendered it (token mode): the
    /// index then keys on their blocks and every size is in tokens. `None`: text mode.
    pub tokens: Option<TokenBlocks<'r>>,
    /// Decide without remembering anything (`POST /route`): the index, the tables and
    /// the rotation stay as they were.
    pub explain: bool,
    /// Place it as a new conversation, whatever a backend holds of its start (default
    /// `false`): flow control asks so ([`Asking::New`]).
    pub new: bool,
}

/// How a policy is asked for a request ([`ledger::place`](crate::ledger::place)'s
/// `choose`): flow control looks first where a request it keeps room for would go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asking {
    /// Where it would go, remembering nothing ([`Request::explain`]).
    Look,
    /// Where it goes.
    Take,
    /// Where it goes as a new conversation ([`Request::new`]).
    New,
}

/// A prompt's tokens as the index keys on them: the chained hashes of its blocks of 16
/// token ids, and its token count.
#[derive(Clone, Copy, Debug)]
pub struct TokenBlocks<'r> {
    /// One hash per full block.
    pub chain: &'r [[u8; 8]],
    /// Tokens in the prompt.
    pub tokens: Tokens,
}

impl<'r, 'a> Request<'r, 'a> {
    /// A request routed on its text, to be remembered.
    pub fn new(model: &'a [u8], text: &'r RoutingText<'a>, session: Option<SessionKey>) -> Self {
        Request {
            model,
            text,
            session,
            tokens: None,
            explain: false,
            new: false,
        }
    }

    /// This request as `asking` asks it.
    pub fn asked(self, asking: Asking) -> Self {
        Request {
            explain: self.explain || asking == Asking::Look,
            new: asking == Asking::New,
            ..self
        }
    }

    /// What names the conversation across its turns: a hash of the text up to its first
    /// user message, with the session key when the client gave one. A session's request
    /// that starts otherwise (a sub-agent, an agent's title request) is a conversation of
    /// its own, placed where its own prefix is.
    pub fn conversation(&self) -> u128 {
        let anchor = self.text.anchor_hash();
        match self.session {
            Some(session) => session.0 ^ anchor.rotate_left(64),
            None => anchor,
        }
    }

    /// What the index keys on: the token blocks in token mode, else the text's blocks.
    pub fn chain(&self) -> Cow<'r, [[u8; 8]]> {
        match self.tokens {
            Some(t) => Cow::Borrowed(t.chain),
            None => Cow::Owned(blocks::chain(self.text)),
        }
    }

    /// The prompt's size in routing text: its tokens at [`TEXT_BYTES_PER_TOKEN`] in token
    /// mode (exact in the index's units), else the text's bytes.
    ///
    /// [`TEXT_BYTES_PER_TOKEN`]: crate::units::TEXT_BYTES_PER_TOKEN
    pub fn size(&self) -> TextBytes {
        self.prompt_size().text()
    }

    /// The prompt's size: counted tokens in token mode, else its text.
    pub fn prompt_size(&self) -> PromptSize {
        match self.tokens {
            Some(t) => PromptSize::Tokens(t.tokens),
            None => PromptSize::Text(self.text.size()),
        }
    }

    /// The text up to the first user message, in the unit of [`Self::size`] (scaled from
    /// its bytes in token mode).
    pub fn anchor(&self) -> TextBytes {
        let bytes = self.text.anchor_len();
        match self.tokens {
            Some(t) if !self.text.is_empty() => {
                let share = bytes as f64 / self.text.len() as f64;
                TextBytes((t.tokens.text().0 as f64 * share) as usize)
            }
            _ => TextBytes(bytes),
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
    /// A new conversation, placed by the room its backend has for it (or one moved to the
    /// backends kept for its tenant).
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
    /// Routing text the chosen backend is believed to hold.
    pub matched: TextBytes,
    /// The candidate holding the request's conversation, as the policy reckons it: the
    /// one it followed it to (its history, its session), or the home it moved it from
    /// (that home's KV overflowing). `None` for a new conversation, and for an opening turn
    /// without a session, whose text is only its start, which other conversations may
    /// share. Flow control keeps a kept flow's conversation there
    /// ([`ledger::place`](crate::ledger::place)).
    pub home: Option<usize>,
}

impl Decision {
    /// A decision that used no prefix information.
    pub fn new(index: usize, outcome: Outcome) -> Self {
        Decision {
            index,
            outcome,
            matched: TextBytes(0),
            home: None,
        }
    }
}

/// A routing policy.
pub trait Policy: Send + Sync {
    /// Picks one of `candidates`, which is never empty.
    fn choose(&self, request: &Request, candidates: &[Candidate]) -> Decision;

    /// Learns that `backend` was given `request` by someone else (session affinity);
    /// returns the routing text the backend was believed to hold.
    fn record(&self, _request: &Request, _backend: BackendId) -> TextBytes {
        TextBytes(0)
    }
}

impl<P: Policy + ?Sized> Policy for Box<P> {
    fn choose(&self, request: &Request, candidates: &[Candidate]) -> Decision {
        (**self).choose(request, candidates)
    }

    fn record(&self, request: &Request, backend: BackendId) -> TextBytes {
        (**self).record(request, backend)
    }
}

/// What a policy remembers by key besides the prefix index (sessions, conversations):
/// bounded, swept by upkeep, counted in stats.
pub trait Table: Send + Sync {
    /// The name stats show it under.
    fn name(&self) -> &'static str;

    /// Entries held.
    fn entries(&self) -> usize;

    /// Drops expired entries and those of backends for which `live` is false.
    fn sweep(&self, live: &dyn Fn(BackendId) -> bool);
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

/// Where policies read the current [`Tunables`]: fixed, or read from a snapshot the caller
/// swaps on reload.
#[derive(Clone)]
pub struct SharedTunables(Arc<dyn Fn() -> Tunables + Send + Sync>);

impl SharedTunables {
    /// Always `tunables`.
    pub fn fixed(tunables: Tunables) -> Self {
        SharedTunables(Arc::new(move || tunables))
    }

    /// Whatever `read` returns at each decision (it must be cheap).
    pub fn reading(read: impl Fn() -> Tunables + Send + Sync + 'static) -> Self {
        SharedTunables(Arc::new(read))
    }

    /// The current values.
    pub fn get(&self) -> Tunables {
        (self.0)()
    }
}

impl fmt::Debug for SharedTunables {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.get().fmt(f)
    }
}

/// What policies are built from.
#[derive(Clone)]
pub struct PolicyParams {
    /// Reloadable parameters.
    pub tunables: SharedTunables,
    /// Prefix-index settings.
    pub tree: TreeConfig,
    /// Seed of the policy's tie-breaking turns and random picks.
    pub seed: u64,
    /// The clock sessions and conversations measure idleness on.
    pub clock: Arc<dyn Clock>,
    /// Whether the prefix index corrects each backend's budget from the cached tokens it
    /// reports. Default true.
    pub calibrate: bool,
    /// Idle time after which a session forgets its backend. Default 30 min.
    pub session_ttl: Duration,
    /// The conversation table, when router replicas share one (the router replicates it,
    /// the lab hands every replica the same); `None`: the policy keeps its own.
    pub conversations: Option<Arc<Conversations>>,
}

impl PolicyParams {
    /// An empty prefix index of these settings.
    pub fn index(&self) -> Arc<PrefixIndex> {
        Arc::new(PrefixIndex::new(self.tree.clone(), self.calibrate))
    }
}

/// A policy name with its constructor.
#[derive(Clone, Copy)]
pub struct PolicyChoice {
    /// The name used in config and on the command line.
    pub name: &'static str,
    build: fn(&PolicyParams) -> Selector,
}

impl PolicyChoice {
    /// The policy with the handles it keeps.
    pub fn build(&self, params: &PolicyParams) -> Selector {
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
