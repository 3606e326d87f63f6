//! Session keys: the id a client gives to keep a conversation on one backend. Taken from the
//! first configured header present (default `x-session-id`), else from the body's
//! `session_params.session_id`. A session key never replaces the routing text; it is a
//! separate input to session affinity.

use http::{HeaderMap, HeaderName};
use xxhash_rust::xxh3::xxh3_128;

/// Header names that carry a session id, in order of preference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionHeaders(Vec<HeaderName>);

impl SessionHeaders {
    /// The given header names, tried in order.
    pub fn new(names: Vec<HeaderName>) -> Self {
        SessionHeaders(names)
    }
}

impl Default for SessionHeaders {
    /// Just `x-session-id`.
    fn default() -> Self {
        SessionHeaders(vec![HeaderName::from_static("x-session-id")])
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

    /// The session key of a request: the first non-empty configured header, else the body's
    /// session id, else none.
    pub fn find(headers: &HeaderMap, names: &SessionHeaders, body: Option<&[u8]>) -> Option<Self> {
        let from_header = names
            .0
            .iter()
            .filter_map(|name| headers.get(name))
            .map(|value| value.as_bytes())
            .find(|value| !value.is_empty());
        from_header
            .or(body.filter(|id| !id.is_empty()))
            .map(Self::of)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_wins_over_body() {
        let mut headers = HeaderMap::new();
        headers.insert("x-session-id", "h".parse().unwrap());
        let names = SessionHeaders::default();
        let key = SessionKey::find(&headers, &names, Some(b"b"));
        assert_eq!(key, Some(SessionKey::of(b"h")));
    }

    #[test]
    fn body_used_without_header_and_empty_ignored() {
        let mut headers = HeaderMap::new();
        headers.insert("x-session-id", "".parse().unwrap());
        let names = SessionHeaders::default();
        assert_eq!(
            SessionKey::find(&headers, &names, Some(b"b")),
            Some(SessionKey::of(b"b"))
        );
        assert_eq!(SessionKey::find(&headers, &names, Some(b"")), None);
    }

    #[test]
    fn header_order_is_preference() {
        let mut headers = HeaderMap::new();
        headers.insert("x-b", "2".parse().unwrap());
        headers.insert("x-a", "1".parse().unwrap());
        let names = SessionHeaders::new(vec![
            HeaderName::from_static("x-a"),
            HeaderName::from_static("x-b"),
        ]);
        assert_eq!(
            SessionKey::find(&headers, &names, None),
            Some(SessionKey::of(b"1"))
        );
    }
}
