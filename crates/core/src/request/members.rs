//! A JSON object's top-level members, each kept as the bytes it came as, and the object
//! written back with some of them set or removed. Everything not edited (nested objects
//! and their key order, numbers as spelled, string escapes) stays byte for byte what the
//! client sent. That matters to a request the router changes before sending (a prefill
//! leg): a chat template renders tool schemas in their key order, so a body re-serialized
//! through a sorted map is a different prompt, and vLLM's KV connectors match prompts by
//! their tokens.
//!
//! Keys are compared as they are spelled: a key written with escapes (`"n\u0061me"`) is
//! not the key it decodes to, and is kept as it came.

use super::ParseError;
use super::json::Json;

/// The members of a JSON object, in order: each key (its escaped bytes, without quotes)
/// and its value's bytes.
#[derive(Debug)]
pub struct Members<'a> {
    members: Vec<(&'a [u8], &'a [u8])>,
}

impl<'a> Members<'a> {
    /// The members of `body`, which must be one JSON object.
    pub fn of(body: &'a [u8]) -> Result<Self, ParseError> {
        let mut json = Json::new(body);
        let mut members = Vec::new();
        json.object(|j, key| {
            members.push((key, j.raw()?));
            Ok(())
        })?;
        json.end()?;
        Ok(Members { members })
    }

    /// The value of the first member named `key`.
    pub fn get(&self, key: &str) -> Option<&'a [u8]> {
        let key = key.as_bytes();
        self.members.iter().find(|(k, _)| *k == key).map(|m| m.1)
    }

    /// Sets `key` to `value` (JSON): in place of its first member, the others removed, or
    /// appended when it has none.
    pub fn set(&mut self, key: &'a str, value: &'a [u8]) {
        let at = self.members.iter().position(|(k, _)| *k == key.as_bytes());
        self.remove(key);
        let at = at.unwrap_or(self.members.len());
        self.members.insert(at, (key.as_bytes(), value));
    }

    /// Removes every member named `key`.
    pub fn remove(&mut self, key: &str) {
        self.members.retain(|(k, _)| *k != key.as_bytes());
    }

    /// The object, compact between members, each member as it came or as set.
    pub fn write(&self) -> Vec<u8> {
        let size: usize = self
            .members
            .iter()
            .map(|(k, v)| k.len() + v.len() + 4)
            .sum();
        let mut out = Vec::with_capacity(size + 2);
        out.push(b'{');
        for (i, (key, value)) in self.members.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.push(b'"');
            out.extend_from_slice(key);
            out.extend_from_slice(b"\":");
            out.extend_from_slice(value);
        }
        out.push(b'}');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_not_edited_keep_their_bytes_and_order() {
        let body = br#"{ "model" : "m", "tools":[{"type":"function","function":{"name":"r",
            "parameters":{"type":"object","properties":{"z":{"type":"string"},"a":{}}}}}],
            "max_tokens": 64, "stream": true, "stream_options": {"include_usage": true},
            "temperature": 1.50, "note": "caf\u00e9" }"#;
        let mut members = Members::of(body).unwrap();
        members.set("max_tokens", b"1");
        members.set("stream", b"false");
        members.remove("stream_options");
        members.set("kv_transfer_params", br#"{"do_remote_decode":true}"#);
        let written = members.write();
        let tools = &body[body.windows(8).position(|w| w == b"[{\"type\"").unwrap()..];
        let tools = &tools[..tools.windows(3).position(|w| w == b"}}]").unwrap() + 3];
        let text = String::from_utf8(written).unwrap();
        assert!(text.contains(std::str::from_utf8(tools).unwrap()), "{text}");
        assert!(text.starts_with(r#"{"model":"m","tools":[{"#), "{text}");
        assert!(
            text.ends_with(
                r#""max_tokens":1,"stream":false,"temperature":1.50,"note":"caf\u00e9","kv_transfer_params":{"do_remote_decode":true}}"#
            ),
            "{text}"
        );
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["tools"][0]["function"]["name"], "r");
    }

    #[test]
    fn a_key_set_twice_keeps_one_member_where_the_first_was() {
        let mut members = Members::of(br#"{"a":1,"n":2,"b":3,"n":4}"#).unwrap();
        assert_eq!(members.get("n"), Some(&b"2"[..]));
        members.set("n", b"1");
        assert_eq!(members.write(), br#"{"a":1,"n":1,"b":3}"#);
        assert_eq!(Members::of(b"{}").unwrap().write(), b"{}");
    }

    #[test]
    fn anything_but_one_object_is_refused() {
        for body in [&b"[1]"[..], b"{\"a\":1} x", b"{\"a\":}", b"\"s\"", b""] {
            assert!(
                Members::of(body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
