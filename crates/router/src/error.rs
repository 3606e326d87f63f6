//! The router's request errors and the one mapping from an error to an HTTP status and a
//! body in the API's own shape: OpenAI's `{"error":{"message","type","code"}}`, or on the
//! Messages paths (`/v1/messages...`) Anthropic's `{"type":"error","error":{"type",
//! "message"}}`. The proxy's `fail_to_proxy` is the only caller that turns these into
//! responses.

use bytes::Bytes;

use prefix_router_core::request::ParseError;

pub use crate::admission::ShedReason;
use crate::tenants::Refused;
use crate::tenants::rate::{Headroom, Limit, Verdict};

/// Why a request was not (fully) served.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// The body of a routed request is not what the endpoint takes.
    #[error(transparent)]
    BadRequest(#[from] ParseError),
    /// The request itself is malformed (framing, headers).
    #[error("{0}")]
    Malformed(String),
    /// A path the data plane does not serve (admin paths live on the admin listener).
    #[error("{0} is not served here")]
    NotFound(String),
    /// The body is larger than `max_body_bytes`.
    #[error("request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    /// The client stopped sending its body, or sent it too slowly.
    #[error("client did not send the request body in time")]
    ClientTimeout,
    /// The client went away or broke the connection.
    #[error("client connection failed: {0}")]
    ClientGone(String),
    /// The API key is in no tenant's list (or there is none and no default tenant).
    #[error("the API key is not one of this router's tenants")]
    UnknownApiKey,
    /// `x-priority` is not `high`, `normal` or `low`.
    #[error("x-priority must be high, normal or low")]
    BadPriority,
    /// The tenant is over its own rate.
    #[error("rate limit of {} {} a minute reached; retry after {} s", limit_of(.0), unit(.0), .0.retry_after)]
    RateLimited(Verdict),
    /// No ready backend serves the request's `model`.
    #[error("the model `{0}` does not exist or no ready backend serves it")]
    ModelNotFound(String),
    /// The request has no `model`, and the fleet serves several.
    #[error("`model` is required: this router serves {0}")]
    ModelRequired(String),
    /// The stored response a request names was made by a backend that is gone.
    #[error("response `{0}` not found: the backend that made it is not available")]
    ResponseGone(String),
    /// No backend is healthy.
    #[error("no healthy backend is available")]
    NoBackend,
    /// The router is at its limits; the client should come back after `retry_after` s.
    #[error("overloaded: {}; retry after {retry_after} s", shed.explain())]
    Overloaded { shed: ShedReason, retry_after: u64 },
    /// Every backend tried failed before answering.
    #[error("upstream failed: {0}")]
    Upstream(String),
    /// The backend did not answer in time; says whether while connecting or waiting.
    #[error("upstream did not answer in time ({0})")]
    UpstreamTimeout(&'static str),
    /// Stopped before its answer by a request that outranks it; the dispatch loop places
    /// it again, so no client sees this.
    #[error("stopped before its answer for a request that outranks it")]
    Preempted,
    /// The response had started when the exchange failed; the client sees a cut stream.
    #[error("response aborted after it started: {0}")]
    Aborted(String),
}

impl From<Refused> for RouterError {
    fn from(refused: Refused) -> Self {
        match refused {
            Refused::UnknownKey => RouterError::UnknownApiKey,
            Refused::BadPriority => RouterError::BadPriority,
        }
    }
}

impl RouterError {
    /// Whether the backend is at fault (for passive health): failed connections, timeouts,
    /// responses cut short.
    pub fn is_upstream_fault(&self) -> bool {
        matches!(
            self,
            RouterError::Upstream(_) | RouterError::UpstreamTimeout(_) | RouterError::Aborted(_)
        )
    }

    /// The HTTP status for this error; 0 when no response can be sent any more.
    pub fn status(&self) -> u16 {
        match self {
            RouterError::BadRequest(_)
            | RouterError::Malformed(_)
            | RouterError::BadPriority
            | RouterError::ModelRequired(_) => 400,
            RouterError::UnknownApiKey => 401,
            RouterError::RateLimited(_) => 429,
            RouterError::NotFound(_)
            | RouterError::ModelNotFound(_)
            | RouterError::ResponseGone(_) => 404,
            RouterError::BodyTooLarge { .. } => 413,
            RouterError::ClientTimeout => 408,
            RouterError::NoBackend | RouterError::Overloaded { .. } | RouterError::Preempted => 503,
            RouterError::Upstream(_) => 502,
            RouterError::UpstreamTimeout(_) => 504,
            RouterError::ClientGone(_) | RouterError::Aborted(_) => 0,
        }
    }

    /// The OpenAI error `type`.
    pub fn kind(&self) -> &'static str {
        if let RouterError::RateLimited(v) = self {
            return unit(v);
        }
        match self.status() {
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// A stable machine-readable `code`.
    pub fn code(&self) -> &'static str {
        match self {
            RouterError::BadRequest(_) => "invalid_body",
            RouterError::Malformed(_) => "malformed_request",
            RouterError::NotFound(_) => "not_found",
            RouterError::BodyTooLarge { .. } => "body_too_large",
            RouterError::ClientTimeout => "client_timeout",
            RouterError::ClientGone(_) => "client_gone",
            RouterError::UnknownApiKey => "invalid_api_key",
            RouterError::BadPriority => "invalid_priority",
            RouterError::RateLimited(_) => "rate_limit_exceeded",
            RouterError::ModelNotFound(_) => "model_not_found",
            RouterError::ModelRequired(_) => "model_required",
            RouterError::ResponseGone(_) => "response_not_found",
            RouterError::NoBackend => "no_healthy_backend",
            RouterError::Overloaded { .. } => "overloaded",
            RouterError::Preempted => "preempted",
            RouterError::Upstream(_) => "upstream_failed",
            RouterError::UpstreamTimeout(_) => "upstream_timeout",
            RouterError::Aborted(_) => "response_aborted",
        }
    }

    /// Seconds to send as `Retry-After`, for errors that should be retried later.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            RouterError::Overloaded { retry_after, .. } => Some(*retry_after),
            RouterError::RateLimited(v) => Some(v.retry_after),
            _ => None,
        }
    }

    /// Headers the answer carries besides `Retry-After`: OpenAI's `x-ratelimit-*` on a 429.
    pub fn headers(&self) -> Vec<(String, String)> {
        let RouterError::RateLimited(v) = self else {
            return Vec::new();
        };
        let mut headers = Vec::new();
        for (unit, room) in [("requests", v.requests), ("tokens", v.tokens)] {
            if room.limit > 0 {
                headers.extend(ratelimit_headers(unit, room));
            }
        }
        headers
    }

    /// The JSON error body, in OpenAI's shape.
    pub fn body(&self) -> Bytes {
        error_body(&self.to_string(), self.kind(), self.code())
    }

    /// The JSON error body for a request to `path`: Anthropic's shape on the Messages
    /// paths, OpenAI's elsewhere.
    pub fn body_for(&self, path: &str) -> Bytes {
        if !path.starts_with("/v1/messages") {
            return self.body();
        }
        let error = serde_json::json!({"type": self.anthropic_kind(), "message": self.to_string()});
        Bytes::from(serde_json::json!({"type": "error", "error": error}).to_string())
    }

    /// The Anthropic error `type`.
    fn anthropic_kind(&self) -> &'static str {
        match (self, self.status()) {
            (RouterError::Overloaded { .. } | RouterError::NoBackend, _) => "overloaded_error",
            (_, 401) => "authentication_error",
            (_, 404) => "not_found_error",
            (_, 413) => "request_too_large",
            (_, 429) => "rate_limit_error",
            (_, 400..=499) => "invalid_request_error",
            _ => "api_error",
        }
    }
}

fn ratelimit_headers(unit: &str, room: Headroom) -> [(String, String); 3] {
    [
        (format!("x-ratelimit-limit-{unit}"), room.limit.to_string()),
        (
            format!("x-ratelimit-remaining-{unit}"),
            room.remaining.to_string(),
        ),
        (
            format!("x-ratelimit-reset-{unit}"),
            format!("{}s", room.reset),
        ),
    ]
}

/// The unit of the limit that refused, as OpenAI's error `type` names it.
fn unit(v: &Verdict) -> &'static str {
    match v.refused {
        Some(Limit::Requests) => "requests",
        _ => "tokens",
    }
}

fn limit_of(v: &Verdict) -> u64 {
    match v.refused {
        Some(Limit::Requests) => v.requests.limit,
        _ => v.tokens.limit,
    }
}

/// A Pingora error in words for a client or a log: its kind, then the underlying cause
/// (an OS error, say), without Pingora's context chain.
pub fn reason(e: &pingora_core::Error) -> String {
    let kind = e.etype().as_str();
    let root = e.root_cause();
    match root.downcast_ref::<pingora_core::Error>() {
        Some(_) => kind.to_string(),
        None => format!("{kind}: {root}"),
    }
}

/// An OpenAI-style error body.
pub fn error_body(message: &str, kind: &str, code: &str) -> Bytes {
    let body = serde_json::json!({"error": {"message": message, "type": kind, "code": code}});
    Bytes::from(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape() {
        let body = RouterError::BodyTooLarge { limit: 10 }.body();
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value["error"]["type"], "invalid_request_error");
        assert_eq!(value["error"]["code"], "body_too_large");
        assert!(value["error"]["message"].as_str().unwrap().contains("10"));
    }

    #[test]
    fn the_messages_paths_get_anthropics_shape() {
        let error = RouterError::BodyTooLarge { limit: 10 };
        let value: serde_json::Value =
            serde_json::from_slice(&error.body_for("/v1/messages")).unwrap();
        assert_eq!(value["type"], "error");
        assert_eq!(value["error"]["type"], "request_too_large");
        assert!(value["error"]["message"].as_str().unwrap().contains("10"));
        assert_eq!(error.body_for("/v1/chat/completions"), error.body());
    }

    #[test]
    fn statuses() {
        assert_eq!(RouterError::NoBackend.status(), 503);
        assert_eq!(RouterError::Upstream("x".into()).status(), 502);
        assert_eq!(RouterError::Aborted("x".into()).status(), 0);
    }
}
