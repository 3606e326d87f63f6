//! The router's side of the lab: the core's real selection path (parser, selector, policy,
//! index, tables) placed through the core's [`ledger`], the same calls the proxy makes:
//! a request is seated from its placement to the end of its response, its prefill until
//! its first response byte, and upkeep runs on its schedule after each placement.
//! No bookkeeping of its own beyond the lab's counters.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use prefix_router_core::BackendId;
use prefix_router_core::clock::Manual;
use prefix_router_core::events::sent::Sent;
use prefix_router_core::ledger::{self, Account, Cap, Placing, Report, Seat, UpkeepSchedule};
use prefix_router_core::policy::{
    Asking, Candidate, Conversations, Decision, PolicyChoice, PolicyParams, Published, Request,
    Selector, SharedTunables, TokenBlocks, Tunables,
};
use prefix_router_core::request::{self, Endpoint, ParseError, SessionKey, SessionSources};
use prefix_router_core::tree::TreeConfig;
use prefix_router_core::units::{PromptSize, TextBytes, Tokens};
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
    /// Each backend's KV capacity, as it publishes it in `vllm:cache_config_info`; `None`
    /// when backends do not say.
    pub kv_tokens: Option<Tokens>,
    /// Tokens per KV block each engine publishes (`None`: it publishes no cache config).
    pub block: Option<Tokens>,
    /// Whether the index budgets learn from the cached tokens backends report.
    pub calibrate: bool,
    /// Requests in flight per backend at most (0: no limit); beyond, the router holds
    /// requests in its queue and places them when a backend frees a slot.
    pub max_inflight_per_backend: usize,
    /// Router replicas, each with state of its own, requests spread over them in turn (as
    /// a balancer in front of them would). Default 1.
    pub replicas: usize,
    /// Seconds between two reads of a backend's published load (`/metrics`) by a router;
    /// replicas read at staggered moments.
    pub scrape_interval: f64,
    /// Whether the replicas share their conversation table (as routers configured with a
    /// `shared_table` do).
    pub shared_table: bool,
    /// Seconds a replica's note takes to reach the other replicas.
    pub note_delay: f64,
}

/// What the engines hold of one request by their own records (their KV events, without
/// delay in virtual time): the request is then routed in token mode.
pub struct EngineRecord<'a> {
    /// The prompt's token chain (one hash per 16 tokens).
    pub chain: &'a [[u8; 8]],
    /// The prompt's tokens.
    pub tokens: Tokens,
    /// Per backend, the leading tokens of the prompt it holds on GPU.
    pub held: Vec<Tokens>,
}

/// A request as the router is asked to place it.
#[derive(Clone, Copy)]
pub struct Asked<'a> {
    /// The chat body.
    pub body: &'a [u8],
    /// Its `x-session-id` header, if sent.
    pub session_id: Option<&'a str>,
    /// The engines' record of its prompt, when they publish one.
    pub record: Option<&'a EngineRecord<'a>>,
}

/// The policy's choice among `candidates`, as flow control is `asking`, over the engines'
/// `record` when there is one, and the prompts `sent` that it does not show yet.
fn select(
    selector: &Selector,
    request: &Request,
    asking: Asking,
    candidates: &[Candidate],
    (record, sent): (Option<&EngineRecord>, &Sent),
) -> Decision {
    let request = &request.asked(asking);
    let Some(record) = record else {
        return selector.select(request, candidates);
    };
    let unanswered = sent.matched(record.chain);
    let held = |c: &Candidate| {
        let recorded = *record.held.get(c.id.0 as usize)?;
        Some(Sent::held(recorded, &unanswered, c.id).text())
    };
    let recorded: Vec<Candidate> = (candidates.iter())
        .map(|c| Candidate {
            recorded: held(c),
            ..*c
        })
        .collect();
    selector.select(request, &recorded)
}

/// One placed request, as the router tracks it until it ends (drop: it ended).
#[derive(Debug)]
pub struct Placement {
    /// The backend chosen.
    pub backend: usize,
    seat: Seat,
    conversation: u128,
    /// The request's size as the router measured it.
    size: PromptSize,
}

impl Placement {
    /// The policy's decision.
    pub fn decision(&self) -> Decision {
        self.seat.decision()
    }
}

/// The router over `n` backends.
pub struct LabRouter {
    selector: Selector,
    upkeep: UpkeepSchedule,
    accounts: Vec<Arc<Account>>,
    clock: Manual,
    limit: usize,
    headers: SessionSources,
    sent: Arc<Sent>,
    /// Prefix-index keys evicted, bytes.
    pub evicted_bytes: u64,
    /// Routing text the chosen backends were believed to hold, bytes.
    pub matched_bytes: u64,
    /// Routing text routed, bytes.
    pub text_bytes: u64,
    /// Decisions by outcome.
    pub outcomes: std::collections::BTreeMap<&'static str, u64>,
}

impl LabRouter {
    /// A router with `setup` in front of backends named `names`, on `clock`; `replica`
    /// numbers it among its replicas (their tie-breaking seeds differ, as processes' do),
    /// and `conversations` is the table they share, if they do.
    pub fn new(
        setup: &RouterSetup,
        names: &[String],
        replica: usize,
        clock: &Manual,
        conversations: Option<Arc<Conversations>>,
    ) -> Self {
        let clock = clock.clone();
        let params = PolicyParams {
            tunables: SharedTunables::fixed(setup.tunables),
            tree: setup.tree.clone(),
            seed: setup.seed.wrapping_add(replica as u64),
            clock: Arc::new(clock.clone()),
            calibrate: setup.calibrate,
            session_ttl: Duration::from_secs_f64(setup.session_ttl.max(0.0)),
            conversations,
        };
        let accounts: Vec<Arc<Account>> = (names.iter().enumerate())
            .map(|(b, name)| {
                let account = Account::new(BackendId(b as u32), xxh3_64(name.as_bytes()));
                account.set_capacity(setup.kv_tokens);
                account.set_block(setup.block);
                Arc::new(account)
            })
            .collect();
        let router = LabRouter {
            selector: setup.policy.build(&params),
            upkeep: UpkeepSchedule::new(Duration::from_secs_f64(setup.eviction_interval.max(0.0))),
            accounts,
            clock,
            limit: setup.max_inflight_per_backend,
            headers: SessionSources::default(),
            sent: Arc::default(),
            evicted_bytes: 0,
            matched_bytes: 0,
            text_bytes: 0,
            outcomes: Default::default(),
        };
        // As the router's upkeep does at start: index budgets from published capacities.
        router.upkeep(0.0);
        router
    }

    /// Places a chat request with `body` (and the `x-session-id` header when given) at
    /// virtual time `now`, seconds, under `cap`, on backend `only` when given: parse, then
    /// the ledger's placement; with the engines' `record` of it when they publish one.
    /// `None` when no backend is open to it.
    pub fn place(
        &mut self,
        now: f64,
        asked: Asked,
        cap: Cap,
        only: Option<usize>,
    ) -> Result<Option<Placement>, ParseError> {
        self.clock.set(Duration::from_secs_f64(now.max(0.0)));
        let parsed = request::parse(Endpoint::Chat, asked.body)?;
        let request = self.request(&parsed, &asked);
        let cap = cap.of_conversation(|| request.conversation());
        let accounts: Vec<&Arc<Account>> = (self.accounts.iter().enumerate())
            .filter(|(i, _)| only.is_none_or(|o| o == *i))
            .map(|(_, a)| a)
            .collect();
        let text = request.size();
        let (selector, record) = (&self.selector, (asked.record, &*self.sent));
        let placing = ledger::place(&accounts, cap, text, |candidates, asking| {
            select(selector, &request, asking, candidates, record)
        });
        let Placing::Placed { seat, index } = placing else {
            return Ok(None);
        };
        let decision = seat.decision();
        self.matched_bytes += decision.matched.0 as u64;
        self.text_bytes += text.0 as u64;
        *self.outcomes.entry(decision.outcome.label()).or_default() += 1;
        self.evicted_bytes += self.upkeep(now);
        let backend = only.unwrap_or(index);
        if let Some(record) = asked.record {
            let id = self.accounts[backend].id;
            seat.count_sent(self.sent.add(id, record.chain));
        }
        Ok(Some(Placement {
            backend,
            seat,
            conversation: request.conversation(),
            size: request.prompt_size(),
        }))
    }

    /// Where the policy would place the request `asked` under `cap` if every backend had
    /// room, asked without remembering anything: the backend and the decision.
    pub fn unbounded(&self, asked: Asked, cap: Cap) -> Option<(usize, Decision)> {
        let parsed = request::parse(Endpoint::Chat, asked.body).ok()?;
        let request = Request {
            explain: true,
            ..self.request(&parsed, &asked)
        };
        let choose = |candidates: &[Candidate], asking| {
            let record = (asked.record, &*self.sent);
            select(&self.selector, &request, asking, candidates, record)
        };
        ledger::unbounded(&self.accounts(), cap, choose)
    }

    /// The size of the routing text of the request `asked` (none if it does not parse).
    pub fn size(&self, asked: Asked) -> TextBytes {
        let Ok(parsed) = request::parse(Endpoint::Chat, asked.body) else {
            return TextBytes(0);
        };
        self.request(&parsed, &asked).size()
    }

    /// The policy's view of a parsed request: its text, session and tokens.
    fn request<'r>(&self, parsed: &'r request::Parsed<'r>, asked: &Asked<'r>) -> Request<'r, 'r> {
        let mut headers = HeaderMap::new();
        if let Some(value) = asked
            .session_id
            .and_then(|id| HeaderValue::from_str(id).ok())
        {
            headers.insert("x-session-id", value);
        }
        let session = SessionKey::find(&headers, &self.headers, &parsed.sessions).map(|(k, _)| k);
        let mut request = Request::new(parsed.model, &parsed.text, session);
        request.tokens = asked.record.map(|r| TokenBlocks {
            chain: r.chain,
            tokens: r.tokens,
        });
        request
    }

    /// The placed request's first response byte arrived.
    pub fn answered(&self, placement: &Placement) {
        placement.seat.answered();
    }

    /// The engine refused the placed request: it holds no KV, as the proxy tells the
    /// policy of an error status.
    pub fn refused(&self, placement: Placement) {
        let backend = self.accounts[placement.backend].id;
        self.selector.released(placement.conversation, backend);
    }

    /// Whether a backend is open to a request under `cap`.
    pub fn open(&self, cap: Cap) -> bool {
        ledger::open(&self.accounts(), cap)
    }

    /// The in-flight limit per backend (0: none).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The backends' accounts, in order.
    pub fn accounts(&self) -> Vec<&Arc<Account>> {
        self.accounts.iter().collect()
    }

    /// Whether the router holds work back from some backend (flow control learned where).
    pub fn holds(&self) -> bool {
        self.accounts.iter().any(|a| a.hold().is_some())
    }

    /// The placed request's response reported `prompt_tokens`, `cached_tokens` of them
    /// cached: the router learns from it as the proxy does.
    pub fn reported(&self, placement: &Placement, prompt_tokens: u64, cached_tokens: u64) {
        let tokens = |n: u64| Tokens(usize::try_from(n).unwrap_or(usize::MAX));
        let report = Report {
            size: placement.size,
            prompt: tokens(prompt_tokens),
            cached: tokens(cached_tokens),
        };
        placement.seat.reported(&self.selector, report);
    }

    /// Backend `backend` published `load` (read from its `/metrics`); with flow control
    /// on, its account learns where to hold work back.
    pub fn published(&self, backend: usize, load: Published, control: bool) {
        self.accounts[backend].set_published(Some(load));
        if control {
            self.accounts[backend].learn_hold(load);
        }
    }

    /// The ledger's upkeep at `now`, seconds; returns the key bytes evicted.
    fn upkeep(&self, now: f64) -> u64 {
        let accounts: Vec<&Arc<Account>> = self.accounts.iter().collect();
        let now = Duration::from_secs_f64(now.max(0.0));
        let evicted = self.upkeep.run(now, 0, &self.selector, &accounts);
        evicted.0 as u64
    }
}
