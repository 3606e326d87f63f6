//! `POST /route`: what the router would do with a request, without sending it or
//! remembering it. The body is the request's body as a client would send it to
//! `?path=` (default `/v1/chat/completions`), with its headers (`x-session-id`, ...); the
//! answer names the backend the policy would choose, why (`outcome`: `placed` for a new
//! conversation, `prefix_hit` for one staying home, `imbalance` for one moving off a home
//! whose live conversations overflow its KV), the index mode (`tokens` or `text`), and per
//! ready backend the prefix it is believed to hold, its load, whether it is the
//! conversation's home and the live conversations it holds against its KV capacity.
//! `session` says where the session key came from (`header:NAME` or `body:FIELD`), null
//! without one. A request naming a stored response (`previous_response_id`) is explained
//! among its backend alone, or refused as the data plane refuses it.
//! Sizes are in tokens: exact in token mode, text bytes / 4 in text mode (`estimated`).
//! `admission` says whose request it is (the tenant and priority its headers give) and
//! whether it would wait in the router's queue (`wait`: `full` when no backend is open
//! for it, `behind` when others wait ahead of it); `backend` is null when it would wait
//! for a full fleet. Each backend's `room` is the requests in flight it may be placed
//! below there ([`prefix_router_core::ledger::Account::room`]). With a tenants file,
//! `kept` says whether the reserve is kept for it, each backend's `would_stop` how many
//! requests there with no answer yet it would stop if placed there
//! ([`crate::tenants::preempt`]), and `stops_at_home` names its conversation's home when
//! that is full and it would stop a lower priority there to take the slot.
//! `disaggregation` (in a fleet with prefill and decode roles) says whether the request
//! would go in two legs (`split`: then the backends are those that prefill, and `backend`
//! its prefill leg's) or whole to where it would decode (`local`); null when sent whole
//! anyway.

use bytes::Bytes;
use http::HeaderMap;
use prefix_router_core::ledger::Cap;
use prefix_router_core::policy::Request;
use prefix_router_core::request::Endpoint;
use prefix_router_core::units::TextBytes;
use serde_json::{Value, json};

use crate::error::RouterError;
use prefix_router_core::flow::{AtHome, Gate, Wait};

use crate::proxy::disaggregate::Plan;
use crate::proxy::dispatch::{self, Route};
use crate::proxy::prepare::{self, Prepared};
use crate::proxy::steps;
use crate::responses;
use crate::state::State;
use crate::stats::Label;
use crate::tokens::Tokenizing;

/// Explains the routing of `body` sent to `path` with `headers`: prepared and chosen as
/// the data plane does ([`Prepared`], [`prepare::decide`]), without a seat.
pub async fn explain(
    state: &State,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Value, RouterError> {
    let endpoint = Endpoint::from_path(path)
        .ok_or_else(|| RouterError::Malformed(format!("`{path}` is not a routed path")))?;
    let limits = &state.live().limits;
    let prepared = Prepared::new(state, limits, endpoint, headers, &body).await?;
    let request = prepared.request(true);
    let unrendered = match &prepared.tokenizing {
        Tokenizing::Unrendered(why) => Some(why.to_string()),
        _ => None,
    };
    let route = Route::Policy(&request);
    let stored = (prepared.previous_response())
        .map(|id| responses::pinned(&state.responses, &state.fleet, id))
        .transpose()?
        .flatten();
    let limit = limits.max_inflight_per_backend;
    let live_config = state.live();
    let identity = live_config.tenants.identify(headers);
    let size = prepared.size();
    let gate = identity.as_ref().ok().map(|identity| Gate {
        arriving: true,
        ..steps::gate(state, identity, size.tokens())
    });
    let cap = gate.map_or(Cap::from(limit), |g| g.cap(limit));
    let plan = Plan::of(state, limits, Some(endpoint), &body, (&route, cap));
    let ready = (state.fleet.ready(&[]).within(stored.as_deref())).for_leg(plan.leg());
    let ready = dispatch::serving(ready, &route)?;
    if ready.is_empty() {
        return Err(RouterError::NoBackend);
    }
    let accounts = ready.accounts();
    let decided = prepare::decide(state, &accounts, cap, &request);
    let url = |i: usize| ready.backend(i).map(|b| b.worker.url.clone());
    let matches = (state.selector.index())
        .map(|index| index.matches(request.model, &request.chain(), size.text()));
    let live = state.selector.live(accounts.iter().map(|a| a.id));
    let home = state.selector.home(request.conversation());
    let backends: Vec<Value> = (accounts.iter().enumerate())
        .map(|(i, a)| {
            let live = live.as_ref().map(|l| l[i]);
            json!({
                "url": url(i),
                "matched_tokens": (matches.as_ref())
                    .map(|m| tokens(a.candidate().reusable(m.matched(a.id), m.total()))),
                "load": a.load(),
                "pending_tokens": tokens(a.pending()),
                "capacity_tokens": a.capacity().map(|t| t.0),
                "inflight_tokens": a.tokens_in_flight().0.0,
                "kept_tokens": a.tokens_in_flight().1.0,
                "kv_kept": a.kv_kept(),
                "slots": a.sequences(),
                "room": a.room(cap).slots,
                "open": a.open(cap),
                "would_stop": gate.map_or(0, |g| g.outranked(cap, a.id)),
                "hold": a.hold(),
                "home": home == Some(a.id),
                "live_conversations": live.map(|l| l.conversations),
                "live_tokens": live.map(|l| a.density().tokens(l.bytes).0),
                "record": record(state, a.id, &request),
            })
        })
        .collect();
    let admission = match (&identity, gate) {
        (Ok(identity), Some(gate)) => json!({
            "tenant": identity.tenant.map(|t| t.name.as_str()),
            "priority": identity.priority.label(),
            "reserve": cap.leaves(),
            "kept": cap.kept(),
            "standing_slots": cap.standing(),
            "queued": state.queue.len(),
            "wait": dispatch::wait(state, limits, &ready, &gate).map(Wait::label),
            "stops_at_home": match dispatch::at_home(state, &gate, &ready, &route, cap) {
                Some(AtHome::Stop(home)) => url(home),
                _ => None,
            },
        }),
        (Err(refused), _) => json!({ "refused": RouterError::from(*refused).code() }),
        _ => Value::Null,
    };
    let (chosen, decision) = match decided {
        Some((i, d)) => (url(i), Some(d)),
        None => (None, None),
    };
    Ok(json!({
        "backend": chosen,
        "model": String::from_utf8_lossy(request.model),
        "admission": admission,
        "policy": state.policy_name,
        "outcome": decision.map(|d| d.outcome.label()),
        "mode": if size.estimated() { "text" } else { "tokens" },
        "unrendered": unrendered,
        "prompt_tokens": size.tokens().0,
        "estimated": size.estimated(),
        "matched_tokens": decision.map(|d| tokens(d.matched)),
        "session": prepared.session_source.as_ref().map(ToString::to_string),
        "disaggregation": plan.way().map(|w| w.label()),
        "backends": backends,
        "ejected": ejected(state),
    }))
}

/// The backends outlier detection keeps out (not among the candidates).
fn ejected(state: &State) -> Vec<String> {
    let snapshot = state.fleet.snapshot();
    let out = snapshot.backends.iter().filter(|b| b.is_ejected());
    out.map(|b| b.worker.url.clone()).collect()
}

/// What `backend`'s KV events say of the request: its mode (`exact`, `degraded` or
/// `connecting`), blocks held, and the request's tokens held on GPU and on GPU or CPU (token
/// mode); null when it publishes none.
fn record(state: &State, backend: prefix_router_core::BackendId, request: &Request) -> Value {
    let Some(record) = state.records.get(backend) else {
        return Value::Null;
    };
    let mode = record.mode().label();
    let held = request.tokens.map(|t| record.matched(t.chain));
    json!({
        "mode": mode,
        "blocks": record.blocks(),
        "gpu_tokens": held.map(|h| h.0),
        "tokens": held.map(|h| h.1),
    })
}

/// Tokens a size stands for (exact in token mode).
fn tokens(size: TextBytes) -> usize {
    size.tokens().0
}
