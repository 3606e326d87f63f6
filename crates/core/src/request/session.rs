//! Session keys: the id a client gives to keep a conversation on one backend. Taken from the
//! first configured header present, else from the first configured body field present. By
//! default these are what the coding agents and OpenAI's API send: the headers
//! `x-session-id`, `x-claude-code-session-id` (Claude Code), `session-id` and `thread-id`
//! (Codex) and `x-session-affinity` (OpenCode); the body's `session_params.session_id`,
//! the `session_id` inside Claude Code's `metadata.user_id`, and `prompt_cache_key`. A
//! session key never replaces the routing text; it is a separate input to session affinity.

use std::fmt;

use http::{HeaderMap, HeaderName};
use xxhash_rust::xxh3::xxh3_128;

/// A body field that may carry a session id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionField {
    /// `session_params.session_id` (SGLang's and vllm-router's field).
    SessionParams,
    /// The `session_id` inside `metadata.user_id` (Messages API; Claude Code writes a JSON
    /// object, or `..._session_<id>` in older versions, there). A `user_id` without one
    /// names a user, not a session, and is not used.
    MetadataUserId,
    /// `prompt_cache_key` (OpenAI's field for requests that should share a cache).
    PromptCacheKey,
}

impl SessionField {
    /// Every field, in the default order of preference.
    pub const ALL: [SessionField; 3] = [
        SessionField::SessionParams,
        SessionField::MetadataUserId,
        SessionField::PromptCacheKey,
    ];

    /// Its name in the configuration and in `POST /route`.
    pub fn name(self) -> &'static str {
        match self {
            SessionField::SessionParams => "session_params.session_id",
            SessionField::MetadataUserId => "metadata.user_id",
            SessionField::PromptCacheKey => "prompt_cache_key",
        }
    }

    /// The field `name` names, if any.
    pub fn parse(name: &str) -> Option<SessionField> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// The session ids a body carries, as escaped JSON bytes borrowed from it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BodySessions<'a> {
    /// `session_params.session_id`.
    pub session_params: Option<&'a [u8]>,
    /// The `session_id` inside `metadata.user_id`.
    pub metadata_user_id: Option<&'a [u8]>,
    /// `prompt_cache_key`.
    pub prompt_cache_key: Option<&'a [u8]>,
}

impl<'a> BodySessions<'a> {
    /// The non-empty id `field` carries.
    pub fn get(&self, field: SessionField) -> Option<&'a [u8]> {
        let id = match field {
            SessionField::SessionParams => self.session_params,
            SessionField::MetadataUserId => self.metadata_user_id,
            SessionField::PromptCacheKey => self.prompt_cache_key,
        };
        id.filter(|id| !id.is_empty())
    }
}

/// The `session_id` in a `metadata.user_id` string's escaped bytes: Claude Code's
/// `{"device_id":"…","session_id":"…"}` (a JSON object in a string), or the older
/// `user_…_account_…_session_<id>`; `None` when it names no session.
pub fn user_id_session(user_id: &[u8]) -> Option<&[u8]> {
    let after = |key: &[u8]| {
        let at = user_id.windows(key.len()).position(|w| w == key)?;
        Some(&user_id[at + key.len()..])
    };
    let rest = after(b"session_id").or_else(|| after(b"_session_"))?;
    let start = rest
        .iter()
        .position(|b| !matches!(b, b'\\' | b'"' | b':' | b' ' | b'_'))?;
    let rest = &rest[start..];
    let end = rest
        .iter()
        .position(|b| matches!(b, b'\\' | b'"' | b',' | b'}'))
        .unwrap_or(rest.len());
    Some(&rest[..end]).filter(|id| !id.is_empty())
}

/// Where session ids are read, in order of preference: headers first, then body fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSources {
    headers: Vec<HeaderName>,
    fields: Vec<SessionField>,
}

/// The headers read by default, in order.
pub const DEFAULT_HEADERS: [&str; 5] = [
    "x-session-id",
    "x-claude-code-session-id",
    "session-id",
    "thread-id",
    "x-session-affinity",
];

impl SessionSources {
    /// The given header names, then the given body fields, tried in order.
    pub fn new(headers: Vec<HeaderName>, fields: Vec<SessionField>) -> Self {
        SessionSources { headers, fields }
    }

    /// The headers read, in order.
    pub fn headers(&self) -> &[HeaderName] {
        &self.headers
    }

    /// The body fields read, in order.
    pub fn fields(&self) -> &[SessionField] {
        &self.fields
    }
}

impl Default for SessionSources {
    /// [`DEFAULT_HEADERS`], then every [`SessionField`].
    fn default() -> Self {
        let headers = DEFAULT_HEADERS.map(HeaderName::from_static);
        SessionSources::new(headers.to_vec(), SessionField::ALL.to_vec())
    }
}

/// Where a request's session key came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionSource {
    /// A header.
    Header(HeaderName),
    /// A body field.
    Field(SessionField),
}

impl fmt::Display for SessionSource {
    /// `header:NAME` or `body:FIELD`, as `POST /route` shows it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionSource::Header(name) => write!(f, "header:{name}"),
            SessionSource::Field(field) => write!(f, "body:{}", field.name()),
        }
    }
}

/// A session id, reduced to a 128-bit hash: fixed size, so the session table holds no
/// client-sized strings, and a stable input for consistent hashing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionKey(pub u128);

impl SessionKey {
    /// The key of a session id's bytes.
    pub fn of(id: &[u8]) -> Self {
        SessionKey(xxh3_128(id))
    }

    /// The session key of a request and where it came from: the first non-empty
    /// configured header, else the first configured body field present, else none.
    pub fn find(
        headers: &HeaderMap,
        sources: &SessionSources,
        body: &BodySessions,
    ) -> Option<(Self, SessionSource)> {
        let header = (sources.headers.iter())
            .filter_map(|name| Some((name, headers.get(name)?.as_bytes())))
            .find(|(_, value)| !value.is_empty())
            .map(|(name, id)| (id, SessionSource::Header(name.clone())));
        let field =
            || (sources.fields.iter()).find_map(|&f| Some((body.get(f)?, SessionSource::Field(f))));
        header
            .or_else(field)
            .map(|(id, source)| (Self::of(id), source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(id: &'static [u8]) -> BodySessions<'static> {
        BodySessions {
            session_params: Some(id),
            ..BodySessions::default()
        }
    }

    fn key(headers: &HeaderMap, sources: &SessionSources, b: &BodySessions) -> Option<SessionKey> {
        SessionKey::find(headers, sources, b).map(|(k, _)| k)
    }

    #[test]
    fn header_wins_over_body() {
        let mut headers = HeaderMap::new();
        headers.insert("x-session-id", "h".parse().unwrap());
        let sources = SessionSources::default();
        let found = SessionKey::find(&headers, &sources, &body(b"b")).unwrap();
        assert_eq!(found.0, SessionKey::of(b"h"));
        assert_eq!(found.1.to_string(), "header:x-session-id");
    }

    #[test]
    fn body_used_without_header_and_empty_ignored() {
        let mut headers = HeaderMap::new();
        headers.insert("x-session-id", "".parse().unwrap());
        let sources = SessionSources::default();
        let b = body(b"b");
        assert_eq!(key(&headers, &sources, &b), Some(SessionKey::of(b"b")));
        assert_eq!(key(&headers, &sources, &body(b"")), None);
    }

    #[test]
    fn order_is_preference() {
        let mut headers = HeaderMap::new();
        headers.insert("x-b", "2".parse().unwrap());
        headers.insert("x-a", "1".parse().unwrap());
        let names = vec![
            HeaderName::from_static("x-a"),
            HeaderName::from_static("x-b"),
        ];
        let sources = SessionSources::new(names, vec![]);
        let b = body(b"b");
        assert_eq!(key(&headers, &sources, &b), Some(SessionKey::of(b"1")));
        let fields = vec![SessionField::PromptCacheKey, SessionField::SessionParams];
        let sources = SessionSources::new(vec![], fields);
        let b = BodySessions {
            prompt_cache_key: Some(b"k"),
            ..body(b"p")
        };
        let (found, from) = SessionKey::find(&headers, &sources, &b).unwrap();
        assert_eq!(found, SessionKey::of(b"k"));
        assert_eq!(from.to_string(), "body:prompt_cache_key");
    }

    #[test]
    fn the_agents_headers_are_read_by_default() {
        for name in [
            "x-claude-code-session-id",
            "session-id",
            "thread-id",
            "x-session-affinity",
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(HeaderName::from_static(name), "s".parse().unwrap());
            let found = key(
                &headers,
                &SessionSources::default(),
                &BodySessions::default(),
            );
            assert_eq!(found, Some(SessionKey::of(b"s")), "{name}");
        }
    }

    #[test]
    fn claude_codes_user_id_names_its_session() {
        let now = br#"{\"device_id\":\"d1\",\"account_uuid\":\"\",\"session_id\":\"7f3c-11\"}"#;
        assert_eq!(user_id_session(now), Some(&b"7f3c-11"[..]));
        let old = b"user_abc123_account__session_9e1d-22";
        assert_eq!(user_id_session(old), Some(&b"9e1d-22"[..]));
        assert_eq!(user_id_session(b"user-42"), None, "a user is not a session");
        assert_eq!(user_id_session(br#"{\"session_id\":\"\"}"#), None);
    }
}
