//! Request parsing: one pass over a routed request body yields the routing text, the model
//! and the body's session ids, all borrowed from the body. Pure functions, no I/O; the
//! body itself is never changed (the proxy forwards it byte for byte). Where the router
//! sends a changed request (a prefill leg), [`Members`] writes it with every member it does
//! not change as it came.
//!
//! The routing text of turn N+1 of a conversation starts with the routing text of turn N:
//! everything the router does depends on that, and the tests check it for every endpoint.

pub mod blocks;
mod chat;
mod completions;
mod content;
mod json;
mod members;
mod messages;
mod responses;
mod session;
mod text;

use json::{Json, Kind};

pub use members::Members;
pub use session::{
    BodySessions, DEFAULT_HEADERS, SessionField, SessionKey, SessionSource, SessionSources,
};
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
    /// `POST /v1/messages` (Anthropic's Messages API)
    Messages,
    /// `POST /v1/messages/count_tokens`: a Messages body, counted, not generated.
    CountTokens,
}

impl Endpoint {
    /// The routed endpoint a path names, if any (the query string is ignored).
    pub fn from_path(path: &str) -> Option<Self> {
        match path.split('?').next().unwrap_or_default() {
            "/v1/chat/completions" => Some(Endpoint::Chat),
            "/v1/completions" => Some(Endpoint::Completions),
            "/v1/responses" => Some(Endpoint::Responses),
            "/v1/messages" => Some(Endpoint::Messages),
            "/v1/messages/count_tokens" => Some(Endpoint::CountTokens),
            _ => None,
        }
    }

    /// A short label for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat",
            Endpoint::Completions => "completions",
            Endpoint::Responses => "responses",
            Endpoint::Messages => "messages",
            Endpoint::CountTokens => "count_tokens",
        }
    }

    /// Whether it takes a Messages body (and answers in Anthropic's shapes).
    pub fn is_anthropic(self) -> bool {
        matches!(self, Endpoint::Messages | Endpoint::CountTokens)
    }
}

/// Why a routed body was refused (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The body is not UTF-8, so it cannot be JSON.
    #[error("request body is not valid UTF-8")]
    NotUtf8,
    /// The body is not JSON.
    #[error("invalid JSON at byte {at}: expected {expected}")]
    Syntax { at: usize, expected: &'static str },
    /// A field the router reads appears twice.
    #[error("`{0}` appears more than once")]
    Duplicate(&'static str),
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
    /// Arrays and objects nest deeper than the limit.
    #[error("invalid request body: nested deeper than {max} levels")]
    TooDeep { max: usize },
    /// A `\u` escape is malformed or an unpaired surrogate.
    #[error("invalid request body: {0}")]
    BadEscape(&'static str),
}

/// What routing needs from a body, borrowed from it.
#[derive(Debug)]
pub struct Parsed<'a> {
    /// The `model` field's escaped bytes; empty when absent.
    pub model: &'a [u8],
    /// The conversation as routed text.
    pub text: RoutingText<'a>,
    /// The session ids it carries.
    pub sessions: BodySessions<'a>,
    /// A Responses request's `previous_response_id`: the stored response it continues.
    pub previous_response: Option<&'a [u8]>,
}

/// Top-level fields, in whatever order the body has them.
#[derive(Default)]
struct Fields<'a> {
    model: Option<&'a [u8]>,
    tools: Option<&'a [u8]>,
    instructions: Option<&'a [u8]>,
    sessions: BodySessions<'a>,
    previous_response: Option<&'a [u8]>,
    /// A Messages body's `system` and `messages`, walked once the body is read.
    system: Option<&'a [u8]>,
    messages: Option<&'a [u8]>,
    /// Whether `messages`, `prompt` or `input` was read.
    conversation: bool,
}

/// Parses a routed body of `endpoint` in one pass.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<Parsed<'_>, ParseError> {
    // UTF-8 is checked inside strings, the only place JSON allows non-ASCII bytes; when the
    // body is refused for any reason, invalid UTF-8 anywhere in it is the error reported.
    read(endpoint, body).map_err(|e| match std::str::from_utf8(body) {
        Ok(_) => e,
        Err(_) => ParseError::NotUtf8,
    })
}

fn read(endpoint: Endpoint, body: &[u8]) -> Result<Parsed<'_>, ParseError> {
    let mut j = Json::new(body);
    let mut fields = Fields::default();
    let mut text = RoutingText::with_capacity(64);
    let front = text.reserve(2);
    j.object(|j, key| fields.read(endpoint, j, key, &mut text))?;
    j.end()?;
    fields.finish(endpoint, front, text)
}

impl<'a> Fields<'a> {
    fn read(
        &mut self,
        endpoint: Endpoint,
        j: &mut Json<'a>,
        key: &[u8],
        text: &mut RoutingText<'a>,
    ) -> Result<(), ParseError> {
        match (key, endpoint) {
            (b"model", _) => once(&mut self.model, "model", content::string(j, "model"))?,
            (b"tools", _) if endpoint != Endpoint::Completions => {
                once(&mut self.tools, "tools", tools(j))?
            }
            (b"session_params", _) => once(
                &mut self.sessions.session_params,
                "session_params",
                session_id(j),
            )?,
            (b"prompt_cache_key", _) => once(
                &mut self.sessions.prompt_cache_key,
                "prompt_cache_key",
                nullable_string(j, "prompt_cache_key"),
            )?,
            (b"previous_response_id", Endpoint::Responses) => once(
                &mut self.previous_response,
                "previous_response_id",
                nullable_string(j, "previous_response_id"),
            )?,
            (b"metadata", _) if endpoint.is_anthropic() => {
                self.sessions.metadata_user_id = metadata_session(j)?
            }
            (b"system", _) if endpoint.is_anthropic() => {
                once(&mut self.system, "system", messages::system(j))?
            }
            (b"messages", _) if endpoint.is_anthropic() => {
                let raw = messages::messages(j)?;
                self.conversation(text, "messages", |_| Ok(()))?;
                self.messages = Some(raw);
            }
            (b"instructions", Endpoint::Responses) => once(
                &mut self.instructions,
                "instructions",
                content::string(j, "instructions"),
            )?,
            (b"messages", Endpoint::Chat) => self.conversation(text, "messages", |text| {
                match chat::push_messages(j, text)? {
                    0 => Err(ParseError::Empty("messages")),
                    _ => Ok(()),
                }
            })?,
            (b"prompt", Endpoint::Completions) => {
                self.conversation(text, "prompt", |text| completions::push_prompt(j, text))?
            }
            (b"input", Endpoint::Responses) => {
                self.conversation(text, "input", |text| responses::push_input(j, text))?
            }
            _ => j.skip()?,
        }
        Ok(())
    }

    fn conversation(
        &mut self,
        text: &mut RoutingText<'a>,
        field: &'static str,
        read: impl FnOnce(&mut RoutingText<'a>) -> Result<(), ParseError>,
    ) -> Result<(), ParseError> {
        if std::mem::replace(&mut self.conversation, true) {
            return Err(ParseError::Duplicate(field));
        }
        read(text)
    }

    /// Places `instructions` in `front`, and the tools where a chat template renders them:
    /// after the system prompt (the instructions, else a first message of role `system`),
    /// or in front of the conversation when it has none.
    fn finish(
        self,
        endpoint: Endpoint,
        front: text::Reserved,
        mut text: RoutingText<'a>,
    ) -> Result<Parsed<'a>, ParseError> {
        if !self.conversation {
            return Err(ParseError::Missing(match endpoint {
                Endpoint::Completions => "prompt",
                Endpoint::Responses => "input",
                _ => "messages",
            }));
        }
        let after_front = front.end();
        if let Some(raw) = self.messages {
            messages::push(self.system, raw, &mut text)?;
        }
        if let Some(tools) = self.tools.filter(|tools| !tools.is_empty()) {
            let at = match self.instructions {
                Some(_) => after_front,
                None => text.system_end().unwrap_or(after_front),
            };
            text.insert(at, &[b"<tools>", tools, b"</tools>"]);
        }
        if let Some(instructions) = self.instructions {
            text.fill(front, &[b"\n<|instructions|>\n", instructions]);
        }
        Ok(Parsed {
            model: self.model.unwrap_or_default(),
            text,
            sessions: self.sessions,
            previous_response: self.previous_response.filter(|id| !id.is_empty()),
        })
    }
}

/// Sets `slot` from `value`, refusing a second occurrence of `field`.
fn once<'a>(
    slot: &mut Option<&'a [u8]>,
    field: &'static str,
    value: Result<&'a [u8], ParseError>,
) -> Result<(), ParseError> {
    if slot.replace(value?).is_some() {
        return Err(ParseError::Duplicate(field));
    }
    Ok(())
}

fn tools<'a>(j: &mut Json<'a>) -> Result<&'a [u8], ParseError> {
    match j.kind() {
        Kind::Array => j.raw(),
        _ => Err(ParseError::WrongType {
            field: "tools",
            expected: "an array",
        }),
    }
}

/// A string's escaped bytes, or empty for null.
fn nullable_string<'a>(j: &mut Json<'a>, field: &'static str) -> Result<&'a [u8], ParseError> {
    match j.kind() {
        Kind::Null => j.null().map(|()| &b""[..]),
        _ => content::string(j, field),
    }
}

/// The session `metadata.user_id` names, if any (see [`session::user_id_session`]).
fn metadata_session<'a>(j: &mut Json<'a>) -> Result<Option<&'a [u8]>, ParseError> {
    if j.kind() != Kind::Object {
        return j.skip().map(|()| None);
    }
    let mut found = None;
    j.object(|j, key| match (key, j.kind()) {
        (b"user_id", Kind::String) => {
            found = session::user_id_session(j.string()?);
            Ok(())
        }
        _ => j.skip(),
    })?;
    Ok(found)
}

/// `session_params.session_id`: a string's escaped bytes or a number's digits; empty when
/// absent.
fn session_id<'a>(j: &mut Json<'a>) -> Result<&'a [u8], ParseError> {
    const FIELD: &str = "session_params.session_id";
    let mut id: &[u8] = b"";
    if j.kind() != Kind::Object {
        return Err(ParseError::WrongType {
            field: "session_params",
            expected: "an object",
        });
    }
    j.object(|j, key| {
        id = match (key, j.kind()) {
            (b"session_id", Kind::String) => j.string()?,
            (b"session_id", Kind::Null) => j.null().map(|()| &b""[..])?,
            (b"session_id", _) => j.number().map_err(|_| ParseError::WrongType {
                field: FIELD,
                expected: "a string or a number",
            })?,
            _ => return j.skip(),
        };
        Ok(())
    })?;
    Ok(id)
}

#[cfg(test)]
mod tests;
