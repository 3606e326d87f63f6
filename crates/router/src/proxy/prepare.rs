//! One request's preparation, the same whether the router serves it or explains it
//! (`POST /route`): the body parsed into its routing text, its session key, its tokens
//! when its model has a tokenizer, and then the policy's choice among the open backends,
//! with what the engines' KV events say of it. Serving takes a seat for the choice
//! ([`ledger::place`]); explaining only asks for it ([`ledger::decide`]).

use std::cell::Cell;
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use prefix_router_core::ledger::{self, Account, Cap};
use prefix_router_core::policy::{Asking, Candidate, Decision, Request};
use prefix_router_core::request::{self, Endpoint, Parsed, SessionKey, SessionSource};
use prefix_router_core::units::PromptSize;

use crate::error::RouterError;
use crate::limits::Limits;
use crate::state::State;
use crate::tokens::Tokenizing;

/// A routed request's body, read into what the policy decides on.
pub struct Prepared<'b> {
    parsed: Parsed<'b>,
    session: Option<SessionKey>,
    endpoint: Endpoint,
    /// Where the session key came from.
    pub session_source: Option<SessionSource>,
    /// What token mode made of it.
    pub tokenizing: Tokenizing,
}

impl<'b> Prepared<'b> {
    /// Parses `body`, sent to `endpoint` with `headers`, and tokenizes it when its model
    /// has a tokenizer.
    pub async fn new(
        state: &State,
        limits: &Limits,
        endpoint: Endpoint,
        headers: &HeaderMap,
        body: &'b Bytes,
    ) -> Result<Prepared<'b>, RouterError> {
        let parsed = request::parse(endpoint, body)?;
        let found = SessionKey::find(headers, &limits.sessions, &parsed.sessions);
        let (session, session_source) = found.unzip();
        let tokenizing = (state.tokenizers)
            .tokenize(endpoint, body, parsed.model)
            .await;
        Ok(Prepared {
            parsed,
            session,
            session_source,
            endpoint,
            tokenizing,
        })
    }

    /// The request the policy sees; `explain`: decided on without being remembered. A
    /// count of tokens follows its conversation and is never remembered: it computes no
    /// KV.
    pub fn request(&self, explain: bool) -> Request<'_, 'b> {
        let mut request = Request::new(self.parsed.model, &self.parsed.text, self.session);
        if let Tokenizing::Tokenized(t) = &self.tokenizing {
            request.tokens = Some(t.blocks());
        }
        request.explain = explain || self.endpoint == Endpoint::CountTokens;
        request
    }

    /// The stored response it continues (`previous_response_id`), if any.
    pub fn previous_response(&self) -> Option<&'b [u8]> {
        self.parsed.previous_response
    }

    /// The prompt's size: its tokens in token mode, else estimated from its text.
    pub fn size(&self) -> PromptSize {
        self.request(true).prompt_size()
    }
}

/// The policy's choice for `request` among `candidates`, as flow control is `asking`
/// ([`ledger::place`]), with the engines' own records when they publish them; `recorded`
/// says whether they did.
pub fn choose(
    state: &State,
    request: &Request,
    asking: Asking,
    candidates: &[Candidate],
    recorded: &Cell<bool>,
) -> Decision {
    let request = &request.asked(asking);
    match state.records.recorded(request, candidates) {
        Some(candidates) => {
            recorded.set(true);
            state.selector.select(request, &candidates)
        }
        None => state.selector.select(request, candidates),
    }
}

/// What serving `request` would choose now among `accounts`, without taking a seat:
/// the account's position and the decision; `None` when none is open under `cap`.
pub fn decide(
    state: &State,
    accounts: &[&Arc<Account>],
    cap: Cap,
    request: &Request,
) -> Option<(usize, Decision)> {
    let recorded = Cell::new(false);
    ledger::decide(accounts, cap, |c, asking| {
        choose(state, request, asking, c, &recorded)
    })
}
