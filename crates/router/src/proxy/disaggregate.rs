//! Prefill/decode disaggregation. In a fleet where some backends prefill and others decode
//! (`prefill`, `decode`), a chat or completions request runs in two legs, by the protocol
//! of vLLM's KV connectors:
//!
//! 1. The **prefill leg**: the client's body with `max_tokens` 1, no stream, and
//!    `kv_transfer_params` asking for a remote decode. It goes where the policy finds the
//!    prompt's prefix among the backends that prefill, and its answer is read whole.
//! 2. The **decode leg**: the client's body with the prefill answer's `kv_transfer_params`
//!    (the blocks to pull, and from where). It goes where the policy places it among the
//!    backends that decode, so a conversation's later turns find their decode instance's
//!    cache too, and streams back as any answer does. A connector whose prefill answer
//!    carries no parameters (vLLM's example connector, over a shared folder) gets the
//!    client's body as it came.
//!
//! **No second hop when it would not pay** (conditional disaggregation, as Dynamo's): a
//! request of which the decode instance the policy would choose lacks at most
//! `max_local_prefill_length` tokens (a conversation's next turn, back where it decoded; a
//! short prompt) goes whole to the decode instances, and that one computes them.
//!
//! A prefill leg that fails is tried on another prefill backend as any attempt is; one the
//! engine refuses (a prompt too long, say) answers the client with its refusal. While no
//! backend that prefills is ready, the backends that decode serve requests whole. A request
//! asking for several choices (`n` > 1), or whose body is not a JSON object, is sent whole.
//! The two legs share the request's tenant charge and its share; each is placed through
//! the queue as a request of its own.

use bytes::Bytes;
use log::debug;
use prefix_router_core::flow::Gate;
use prefix_router_core::ledger::Cap;
use prefix_router_core::request::{Endpoint, Members};

use super::dispatch::{self, Route};
use super::relay::Upstream;
use super::steps::{self, Finished, PlacedRequest};
use crate::error::RouterError;
use crate::fleet::Leg;
use crate::limits::Limits;
use crate::state::State;
use crate::stats::{Label, Split};
use crate::traces::RequestTrace;

/// Bytes of a prefill answer the router reads at most: one token and its parameters.
const PREFILL_ANSWER: usize = 1 << 20;

/// What the prefill leg left for the decode leg.
pub enum Handoff {
    /// The request goes whole to one backend: not a disaggregated request.
    Whole,
    /// It goes whole to a decode instance, which holds all but
    /// `max_local_prefill_length` tokens of its prompt.
    Local,
    /// The decode leg is ready: the upstream carries its body.
    Decode,
    /// The prefill backend refused the request: its status and body, for the client.
    Refused {
        /// The engine's status.
        status: u16,
        /// Its body, as it came.
        body: Bytes,
    },
}

/// Runs the prefill leg of `upstream`'s request where the fleet is disaggregated, then
/// makes `upstream` its decode leg; `Handoff::Whole` leaves it untouched.
pub async fn prefill(
    state: &State,
    limits: &Limits,
    endpoint: Option<Endpoint>,
    upstream: &mut Upstream<'_>,
    (route, gate): (&Route<'_, '_>, Gate<'_>),
    trace: &RequestTrace,
) -> Result<Handoff, RouterError> {
    let Some(client) = upstream.body.as_ref().map(|b| b.bytes.clone()) else {
        return Ok(Handoff::Whole);
    };
    let cap = gate.cap(limits.max_inflight_per_backend);
    let prefill = match Plan::of(state, limits, endpoint, &client, (route, cap)) {
        Plan::Whole => return Ok(Handoff::Whole),
        Plan::Local => {
            went(state, trace, Split::Local);
            return Ok(Handoff::Local);
        }
        Plan::Legs(prefill) => prefill,
    };
    went(state, trace, Split::Legs);
    upstream.set_body(prefill, Leg::Prefill);
    let dispatched = dispatch::run(state, limits, upstream, route, gate, trace).await;
    let dispatch::Answered {
        answer,
        seat,
        backend,
    } = dispatched.result?;
    let ended = answer.ended();
    let (exchanged, answer) = answer
        .collect(
            &state.connector,
            upstream.session,
            &seat,
            &limits.exchange,
            PREFILL_ANSWER,
        )
        .await;
    let status = exchanged.trace.as_ref().map_or(0, |t| t.status);
    debug!("prefill leg -> {} status {status}", backend.worker.url);
    let held = PlacedRequest {
        backend: &backend,
        seat: &seat,
        charge: None,
    };
    let served = exchanged.result.is_ok() && (200..300).contains(&status);
    let finished = Finished {
        ended,
        released: false,
        served,
        trace: exchanged.trace.as_ref(),
        leg: Leg::Prefill,
    };
    steps::note_end(state, limits, held, route, finished);
    exchanged.result.map_err(|f| f.into_error())?;
    if !served {
        return Ok(Handoff::Refused {
            status,
            body: answer,
        });
    }
    let decode = decode_body(&client, transfer_params(&answer)).unwrap_or(client);
    upstream.set_body(decode, Leg::Decode);
    Ok(Handoff::Decode)
}

/// Counts how a disaggregated request went, and tells its trace.
fn went(state: &State, trace: &RequestTrace, way: Split) {
    state.stats.split(way);
    trace.disaggregated(way.label());
}

/// How a request goes in this fleet, before anything is sent.
pub enum Plan {
    /// Whole: the fleet is not disaggregated, or not for this request.
    Whole,
    /// Whole, to the decode instance holding all but `max_local_prefill_length` tokens.
    Local,
    /// In two legs, the first with this body.
    Legs(Bytes),
}

impl Plan {
    /// How `client`'s request to `endpoint`, placed by `route` under `cap`, goes.
    pub fn of(
        state: &State,
        limits: &Limits,
        endpoint: Option<Endpoint>,
        client: &[u8],
        (route, cap): (&Route, Cap),
    ) -> Plan {
        let generates = matches!(endpoint, Some(Endpoint::Chat | Endpoint::Completions));
        // The prefill leg's body is written only for a request that goes in two legs.
        let body = (generates && splits(state)).then(|| splittable(client));
        match body.flatten() {
            None => Plan::Whole,
            Some(_) if decodes_locally(state, limits, route, cap) => Plan::Local,
            Some(body) => Plan::Legs(prefill_leg(body)),
        }
    }

    /// Its way, as `POST /route` and the metrics say it; none for a request sent whole.
    pub fn way(&self) -> Option<Split> {
        match self {
            Plan::Whole => None,
            Plan::Local => Some(Split::Local),
            Plan::Legs(_) => Some(Split::Legs),
        }
    }

    /// The leg its first exchange carries.
    pub fn leg(&self) -> Leg {
        match self {
            Plan::Legs(_) => Leg::Prefill,
            Plan::Whole | Plan::Local => Leg::Whole,
        }
    }
}

/// Whether the fleet splits requests now: it has roles, and a backend serving prefill legs
/// is ready (else the backends that decode serve requests whole, computing their prompts).
fn splits(state: &State) -> bool {
    let fleet = &state.fleet;
    fleet.disaggregated() && !fleet.ready(&[]).for_leg(Leg::Prefill).is_empty()
}

/// Whether the decode instance the policy would choose (asked without remembering
/// anything) lacks at most `max_local_prefill_length` tokens of the prompt.
fn decodes_locally(state: &State, limits: &Limits, route: &Route, cap: Cap) -> bool {
    let Route::Policy(request) = route else {
        return true;
    };
    let ready = state.fleet.ready(&[]).for_leg(Leg::Decode);
    let Ok(ready) = dispatch::serving(ready, route) else {
        return false;
    };
    let Some((_, decision)) = dispatch::unbounded(state, cap, &ready.accounts(), route) else {
        return false;
    };
    let uncached = request.size().saturating_sub(decision.matched).tokens();
    uncached.0 <= limits.max_local_prefill_length
}

/// What the prefill leg asks of the engine: compute the prompt for a decode elsewhere.
const REMOTE_DECODE: &str = concat!(
    r#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"#,
    r#""remote_block_ids":null,"remote_host":null,"remote_port":null}"#
);

/// The client's body as members, when it may go in two legs: a JSON object asking for one
/// choice.
fn splittable(client: &[u8]) -> Option<Members<'_>> {
    let body = Members::of(client).ok()?;
    let choices = body
        .get("n")
        .and_then(|n| std::str::from_utf8(n).ok()?.parse::<u64>().ok());
    choices.is_none_or(|n| n <= 1).then_some(body)
}

/// The prefill leg's body: the client's, computing its prompt and one token for a decode
/// elsewhere, every member it does not change as it came (so the prompt is the decode
/// leg's, token for token).
fn prefill_leg(mut body: Members<'_>) -> Bytes {
    body.set("max_tokens", b"1");
    if body.get("max_completion_tokens").is_some() {
        body.set("max_completion_tokens", b"1");
    }
    body.set("stream", b"false");
    body.remove("stream_options");
    body.set("kv_transfer_params", REMOTE_DECODE.as_bytes());
    body.write().into()
}

/// The `kv_transfer_params` of a prefill answer (its JSON), when it has some (not null).
pub fn transfer_params(answer: &[u8]) -> Option<&[u8]> {
    let params = Members::of(answer).ok()?.get("kv_transfer_params")?;
    (params != b"null").then_some(params)
}

/// The decode leg's body: the client's with the prefill's `params`, every other member as
/// it came; `None` (the client's body as it came) without parameters to pass.
pub fn decode_body(client: &[u8], params: Option<&[u8]>) -> Option<Bytes> {
    let mut body = Members::of(client).ok()?;
    body.set("kv_transfer_params", params?);
    Some(body.write().into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// The prefill leg's body, or `None` for a request that does not go in two legs.
    fn prefill_body(client: &[u8]) -> Option<Bytes> {
        splittable(client).map(prefill_leg)
    }

    fn parse(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn the_prefill_leg_computes_the_prompt_and_one_token_for_a_remote_decode() {
        let client = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],
            "max_tokens":64,"max_completion_tokens":64,"stream":true,
            "stream_options":{"include_usage":true},"temperature":0.7}"#;
        let body = parse(&prefill_body(client).unwrap());
        assert_eq!(body["max_tokens"], 1);
        assert_eq!(body["max_completion_tokens"], 1);
        assert_eq!(body["stream"], false);
        assert!(body.get("stream_options").is_none());
        assert_eq!(body["temperature"], 0.7);
        assert_eq!(body["messages"][0]["content"], "hi");
        let params = &body["kv_transfer_params"];
        assert_eq!(params["do_remote_decode"], true);
        assert_eq!(params["do_remote_prefill"], false);
        assert!(params["remote_block_ids"].is_null());
        let no_completion = parse(&prefill_body(br#"{"prompt":"p"}"#).unwrap());
        assert!(no_completion.get("max_completion_tokens").is_none());
    }

    #[test]
    fn several_choices_or_a_body_that_is_no_object_go_whole() {
        assert!(prefill_body(br#"{"prompt":"p","n":2}"#).is_none());
        assert!(prefill_body(br#"{"prompt":"p","n":1}"#).is_some());
        assert!(prefill_body(b"[1, 2]").is_none());
        assert!(prefill_body(b"{not json").is_none());
    }

    #[test]
    fn the_decode_leg_carries_the_prefills_parameters_or_the_clients_body_as_it_came() {
        let client = br#"{"model":"m","prompt":"p","stream":true}"#;
        let answer = br#"{"id":"x","choices":[],"kv_transfer_params":
            {"remote_engine_id":"e1","remote_block_ids":[1,2],"remote_host":"10.0.0.1","remote_port":5600}}"#;
        let params = transfer_params(answer);
        let written = decode_body(client, params).unwrap();
        assert!(written.starts_with(br#"{"model":"m","prompt":"p","stream":true,"#));
        let body = parse(&written);
        assert_eq!(body["stream"], true);
        assert_eq!(
            body["kv_transfer_params"]["remote_block_ids"],
            json!([1, 2])
        );
        assert_eq!(body["kv_transfer_params"]["remote_engine_id"], "e1");
        let none = transfer_params(br#"{"id":"x","kv_transfer_params":null}"#);
        assert_eq!(none, None);
        assert_eq!(decode_body(client, none), None);
        assert_eq!(transfer_params(b"not json"), None);
    }
}
