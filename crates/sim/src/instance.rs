//! One simulated instance as its request handlers see it: the state every connection
//! shares, and how a response is built. Neither serving (`http`) nor generating
//! (`generate`) owns it, so the two do not import each other.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::Value;

use super::SimConfig;
use super::driver::EngineHandle;
use super::error::ApiError;
use super::metrics::Metrics;

/// Response body type of every endpoint.
pub type SimBody = BoxBody<Bytes, Infallible>;

/// State shared by every connection of one instance.
#[derive(Debug)]
pub struct Shared {
    /// The instance's settings.
    pub config: SimConfig,
    /// The engine task.
    pub engine: EngineHandle,
    /// The instance's counters.
    pub metrics: Arc<Metrics>,
    /// Next request number (response ids, engine ids).
    pub next_number: AtomicU64,
    /// `x-sim-instance` header value (`None` if the name is not a valid header value).
    pub instance_header: Option<HeaderValue>,
}

/// A whole response with an optional content type.
pub fn full(
    status: StatusCode,
    content_type: Option<&'static str>,
    body: Bytes,
) -> Response<SimBody> {
    let mut response = Response::new(Full::new(body).boxed());
    *response.status_mut() = status;
    if let Some(kind) = content_type {
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    }
    response
}

/// A JSON response.
pub fn json_response(status: StatusCode, body: &Value) -> Response<SimBody> {
    full(
        status,
        Some("application/json"),
        Bytes::from(body.to_string()),
    )
}

/// The OpenAI error response for `err`.
pub fn error_response(err: &ApiError) -> Response<SimBody> {
    json_response(err.status(), &err.body())
}
