//! Request parsing: one pass over a routed request body yields the routing text, the model
//! and the body's session id, all borrowed from the body. Pure functions, no I/O; the
//! body itself is never changed (the proxy forwards it byte for byte).
//!
//! The routing text of turn N+1 of a conversation starts with the routing text of turn N:
//! everything the router does depends on that, and the tests check it for every endpoint.

mod chat;
mod completions;
mod content;
mod raw;
mod responses;
mod session;
mod text;

use serde::Deserialize;
use serde_json::value::RawValue;

pub use session::{SessionHeaders, SessionKey};
pub use text::{Part, RoutingText};

/// The endpoints routed on their prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/responses`
    Responses,
}

impl Endpoint {
    /// The routed endpoint a path names, if any (the query string is ignored).
    pub fn from_path(path: &str) -> Option<Self> {
        match path.split('?').next().unwrap_or_default() {
            "/v1/chat/completions" => Some(Endpoint::Chat),
            "/v1/completions" => Some(Endpoint::Completions),
            "/v1/responses" => Some(Endpoint::Responses),
            _ => None,
        }
    }

    /// A short label for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat",
            Endpoint::Completions => "completions",
            Endpoint::Responses => "responses",
        }
    }
}

/// Why a routed body was refused (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The body is not UTF-8, so it cannot be JSON.
    #[error("request body is not valid UTF-8")]
    NotUtf8,
    /// The body is not JSON, or not JSON of the expected shape.
    #[error("invalid request body: {0}")]
    Json(#[from] serde_json::Error),
    /// A field has the wrong JSON type.
    #[error("`{field}` must be {expected}")]
    WrongType {
        field: &'static str,
        expected: &'static str,
    },
    /// A required field is absent.
    #[error("`{0}` is required")]
    Missing(&'static str),
    /// A required list or text is empty.
    #[error("`{0}` must not be empty")]
    Empty(&'static str),
}

/// What routing needs from a body, borrowed from it.
#[derive(Debug)]
pub struct Parsed<'a> {
    /// The `model` field's escaped bytes; empty when absent.
    pub model: &'a [u8],
    /// The conversation as routed text.
    pub text: RoutingText<'a>,
    /// `session_params.session_id`, when present.
    pub session: Option<&'a [u8]>,
}

/// The fields any routed body may carry, read in one pass.
#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    session_params: Option<SessionParams<'a>>,
    #[serde(borrow)]
    messages: Option<Vec<chat::Message<'a>>>,
    #[serde(borrow)]
    prompt: Option<&'a RawValue>,
    #[serde(borrow)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct SessionParams<'a> {
    #[serde(borrow)]
    session_id: Option<&'a RawValue>,
}

/// Parses a routed body of `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<Parsed<'_>, ParseError> {
    let body = std::str::from_utf8(body).map_err(|_| ParseError::NotUtf8)?;
    let fields: Body = serde_json::from_str(body)?;
    if let Some(tools) = fields.tools {
        raw::require_array(tools, "tools")?;
    }
    let mut text = RoutingText::with_capacity(parts_hint(&fields));
    match endpoint {
        Endpoint::Chat => chat::build(&mut text, fields.tools, fields.messages.as_deref())?,
        Endpoint::Completions => completions::build(&mut text, fields.prompt)?,
        Endpoint::Responses => {
            responses::build(&mut text, fields.tools, fields.instructions, fields.input)?
        }
    }
    let session = match fields.session_params.and_then(|p| p.session_id) {
        Some(id) => Some(raw::id(id, "session_params.session_id")?),
        None => None,
    };
    Ok(Parsed {
        model: raw::opt_string(fields.model, "model")?.unwrap_or_default(),
        text,
        session,
    })
}

fn parts_hint(fields: &Body) -> usize {
    8 + fields.messages.as_ref().map_or(8, |m| m.len() * 6)
}

#[cfg(test)]
mod tests;
