//! The steps a request takes around its dispatch, whichever front end carries it: the
//! Pingora data plane ([`super::Router`]) or an Envoy gateway's endpoint picker
//! ([`crate::epp`]). Before it: who sent it and what it asks. After its answer: what the
//! answer taught outlier detection, the conversation table, the index's calibration, the
//! stats and the tenant's rate. And the answers the router gives itself (its health, the
//! fleet's models).

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use log::debug;
use prefix_router_core::flow::{Gate, TenantId, order};
use prefix_router_core::ledger::{Report, Seat};
use prefix_router_core::request::Endpoint;
use prefix_router_core::units::Tokens;

use super::dispatch::{self, Route};
use super::prepare::Prepared;
use super::relay::Trace;
use crate::endpoints::Probe;
use crate::error::RouterError;
use crate::fleet::{Backend, Ended, Leg, Served};
use crate::limits::{Limits, LiveLimits};
use crate::state::State;
use crate::stats::{ModelExchange, OTHER};
use crate::tenants::{Charge, Identity, Priority, Refused};
use crate::tokens::Tokenizing;

/// The request's tenant and priority from its `headers`; an unknown key is counted.
pub fn identify<'l>(
    state: &State,
    live: &'l LiveLimits,
    headers: &HeaderMap,
) -> Result<Identity<'l>, RouterError> {
    let identity = live.tenants.identify(headers).inspect_err(|refused| {
        if *refused == Refused::UnknownKey {
            state.tenancy.unknown_key();
        }
    });
    Ok(identity?)
}

/// A routed request's `body` parsed and tokenized (none for other paths), counted.
pub async fn prepare<'b>(
    state: &State,
    limits: &Limits,
    endpoint: Option<Endpoint>,
    headers: &HeaderMap,
    body: &'b Bytes,
) -> Result<Option<Prepared<'b>>, RouterError> {
    let Some(endpoint) = endpoint else {
        return Ok(None);
    };
    let prepared = Prepared::new(state, limits, endpoint, headers, body).await?;
    if let Tokenizing::Unrendered(why) = &prepared.tokenizing {
        debug!("routed on its text: {why}");
    }
    state.tokenizers.count(&prepared.tokenizing);
    Ok(Some(prepared))
}

/// The request at flow control's gate: its priority and tenant, and `cost`, its
/// estimated prompt tokens.
pub fn gate<'t>(state: &'t State, identity: &Identity<'t>, cost: Tokens) -> Gate<'t> {
    Gate {
        flow: order::QueueTicket {
            priority: identity.priority,
            tenant: identity.tenant.map_or(TenantId::none(), |t| &t.name),
            weight: identity.tenant.map_or(1, |t| t.weight),
            cost,
        },
        control: state.tenancy.flow_control(identity),
        standing: identity.tenant.map_or(0, |t| t.standing_slots),
        arriving: false,
    }
}

/// The priority a request of `identity` carries to the engine (vLLM's `X-Vllm-Priority`):
/// its own, where its tenants file keeps `engine_priority` on; none without a tenants file.
pub fn engine_priority(identity: &Identity) -> Option<Priority> {
    let tenant = identity.tenant.filter(|t| t.engine_priority);
    tenant.map(|_| identity.priority)
}

/// A placed request: where it went, and what it owes.
pub struct PlacedRequest<'a> {
    /// Its backend.
    pub backend: &'a Backend,
    /// Its seat there.
    pub seat: &'a Seat,
    /// Its tenant's charge, settled with the answer's usage.
    pub charge: Option<&'a Charge>,
}

/// How a placed request's exchange ended.
pub struct Finished<'t> {
    /// What it says of the backend's health.
    pub ended: Ended,
    /// Whether the conversation was already released from the backend (a refusal, noted
    /// when its head arrived).
    pub released: bool,
    /// Whether the whole answer was a success (2xx, not cut).
    pub served: bool,
    /// What was seen of the response, if any.
    pub trace: Option<&'t Trace>,
    /// The leg it was: a decode leg's prompt was computed by its prefill leg, whose
    /// figures count in the models' hit rates.
    pub leg: Leg,
}

/// Notes what the end of `held`'s exchange, placed by `route`, taught the router.
pub fn note_end(
    state: &State,
    limits: &Limits,
    held: PlacedRequest,
    route: &Route,
    finished: Finished,
) {
    let PlacedRequest {
        backend,
        seat,
        charge,
    } = held;
    dispatch::note_exchange(state, limits, backend, finished.ended);
    if !finished.released && !finished.served {
        // It holds no KV there.
        route.released(state, backend.id);
    }
    if let Some(trace) = finished.trace {
        note_response(state, backend, seat, route, trace);
    }
    let usage = finished.trace.and_then(|t| t.usage);
    if let Route::Policy(request) = route
        && finished.leg != Leg::Decode
    {
        let listed = |s: &Arc<Served>| s.serves(request.model);
        let model = match backend.models.served().filter(listed) {
            Some(_) => String::from_utf8_lossy(request.model),
            None => OTHER.into(),
        };
        let exchange = ModelExchange {
            status: finished.trace.map_or(0, |t| t.status),
            matched: seat.decision().matched,
            text: route.text(),
            usage,
        };
        state.stats.models.count(&model, exchange);
    }
    if let (Some(charge), Some(usage)) = (charge, usage) {
        state
            .tenancy
            .settle(charge, usage.prompt + usage.completion);
    }
}

/// Stats get what was seen of the response, and the index what the backend reported it
/// had cached against what it predicted (for a prompt it computed: a count of tokens
/// computes nothing).
fn note_response(state: &State, backend: &Backend, seat: &Seat, route: &Route, trace: &Trace) {
    if let (Some(usage), Route::Policy(request)) = (trace.usage, route)
        && !request.explain
    {
        let tokens = |n: u64| Tokens(usize::try_from(n).unwrap_or(usize::MAX));
        let report = Report {
            size: request.prompt_size(),
            prompt: tokens(usage.prompt),
            cached: tokens(usage.cached),
        };
        seat.reported(&state.selector, report);
    }
    let url = backend.worker.url.as_str();
    (state.stats).exchange(url, trace.first_byte, trace.total, trace.usage);
}

/// The answer to a probe of the router's own health: its status and JSON body.
pub fn probe_answer(state: &State, probe: Probe) -> (u16, serde_json::Value) {
    let ready = state.fleet.ready(&[]).len();
    let draining = state.draining();
    let (status, word) = match probe {
        Probe::Live => (200, "alive"),
        Probe::Ready if ready > 0 && !draining => (200, "ready"),
        Probe::Ready => (503, "unavailable"),
    };
    let body = serde_json::json!({"status": word, "ready_backends": ready, "draining": draining});
    (status, body)
}

/// The answer to `GET /v1/models`, in OpenAI's shape: the models the ready backends list
/// (with each adapter's `parent`). `None` when none lists any: the request is forwarded.
pub fn models_answer(state: &State) -> Option<serde_json::Value> {
    let models = state.fleet.ready(&[]).models();
    if models.is_empty() {
        return None;
    }
    let data: Vec<serde_json::Value> = (models.iter())
        .map(|m| {
            let root = m.parent.as_deref().unwrap_or(&m.id);
            serde_json::json!({"id": m.id, "object": "model", "created": 0,
                "owned_by": "prefix-router", "root": root, "parent": m.parent})
        })
        .collect();
    Some(serde_json::json!({"object": "list", "data": data}))
}
