//! Deterministic text and chat-completion request bodies.
//!
//! Every hash id (or generator seed) maps to the same word-like text on every
//! run: a SplitMix64 stream seeded by the id. The text mixes ASCII words with
//! newlines, tabs, quotes, backslashes and some non-ASCII characters (`é`,
//! `中`) so that JSON escaping and UTF-8 handling are exercised downstream.
//!
//! Messages are rendered once into JSON objects ("pieces"); a request body is
//! the concatenation of its pieces between a fixed head and tail, so requests
//! that share their first `k` pieces share a byte-identical body prefix.

use std::fmt::Write as _;

/// SplitMix64: tiny, fast, and stable across versions (unlike library PRNGs).
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator seeded by `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    /// Next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform integer in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        let span = hi.saturating_sub(lo).saturating_add(1);
        lo + ((u128::from(self.next_u64()) * u128::from(span)) >> 64) as u64
    }

    /// Uniform float in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Mixes two values into one seed (so `(domain, id)` pairs get distinct streams).
pub(crate) fn mix(a: u64, b: u64) -> u64 {
    Rng::new(a.rotate_left(17) ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64()
}

/// Appends exactly `len` bytes of deterministic text for `seed` to `out`.
pub(crate) fn fill_text(seed: u64, len: usize, out: &mut String) {
    let mut buf = Vec::with_capacity(len + 16);
    let mut rng = Rng::new(seed);
    while buf.len() < len {
        let before = buf.len();
        push_token(&mut rng, &mut buf);
        if buf.len() > len {
            // Replace the overflowing token with ASCII so the length is exact
            // and no multi-byte character is cut.
            buf.truncate(before);
            let mut bits = rng.next_u64();
            while buf.len() < len {
                buf.push(LETTERS[(bits & 31) as usize]);
                bits >>= 5;
            }
        }
    }
    out.push_str(&String::from_utf8(buf).expect("tokens are whole UTF-8 characters"));
}

/// Returns `len` bytes of text for `seed` (see [`fill_text`]).
pub(crate) fn text(seed: u64, len: usize) -> String {
    let mut s = String::with_capacity(len);
    fill_text(seed, len, &mut s);
    s
}

/// Letters roughly by English frequency; 32 entries so 5 random bits pick one.
const LETTERS: &[u8; 32] = b"etaoinshrdlcumwfgypbvkjxqzetaoin";

/// One token of text: mostly a lowercase word and a space, sometimes punctuation,
/// whitespace, escape-worthy ASCII or multi-byte characters.
fn push_token(rng: &mut Rng, out: &mut Vec<u8>) {
    let r = rng.next_u64();
    let special: &[u8] = match r % 64 {
        0..=2 => b"\n",
        3 => b"\"quoted\" ",
        4 => b"C:\\path\\x ",
        5 => "café ".as_bytes(),
        6 => "中文 ".as_bytes(),
        7 => b"\t",
        8..=10 => b". ",
        11..=12 => b", ",
        _ => b"",
    };
    if !special.is_empty() {
        out.extend_from_slice(special);
        return;
    }
    let len = 1 + ((r >> 6) % 9) as usize;
    let mut word = [b' '; 10];
    let mut bits = r >> 10;
    for c in &mut word[..len] {
        *c = LETTERS[(bits & 31) as usize];
        bits >>= 5;
    }
    out.extend_from_slice(&word[..=len]);
}

/// Cuts `s` to at most `max` bytes, backing off to a char boundary.
pub(crate) fn truncate_on_char(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
}

/// The role a message plays in a chat, with what it needs to render validly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// `{"role":"system"}`.
    System,
    /// `{"role":"user"}`.
    User,
    /// A plain `{"role":"assistant"}` message.
    Assistant,
    /// An assistant message carrying one tool call with id `call_<id>`.
    AssistantCall {
        /// Identifies the call; the following tool message refers to it.
        call: u64,
    },
    /// A tool result answering the call `call_<call>`.
    Tool {
        /// The id of the call answered.
        call: u64,
    },
}

/// Tool names used in tool calls (and by the agent workload's `tools` array).
pub(crate) const TOOL_NAMES: [&str; 12] = [
    "read_file",
    "write_file",
    "edit_file",
    "run_command",
    "search_code",
    "list_dir",
    "apply_patch",
    "run_tests",
    "git_diff",
    "git_log",
    "fetch_docs",
    "ask_user",
];

/// Renders one chat message as a JSON object with `content` (plain text).
pub(crate) fn render_message(role: Role, content: &str) -> String {
    let mut out = String::with_capacity(content.len() + content.len() / 16 + 160);
    let escaped = json_string(content);
    match role {
        Role::System => write!(out, r#"{{"role":"system","content":{escaped}}}"#),
        Role::User => write!(out, r#"{{"role":"user","content":{escaped}}}"#),
        Role::Assistant => write!(out, r#"{{"role":"assistant","content":{escaped}}}"#),
        Role::AssistantCall { call } => {
            let name = TOOL_NAMES[(call % TOOL_NAMES.len() as u64) as usize];
            let args = json_string(&format!(r#"{{"path":"src/module_{}.rs"}}"#, call % 997));
            write!(
                out,
                r#"{{"role":"assistant","content":{escaped},"tool_calls":[{{"id":"call_{call}","type":"function","function":{{"name":"{name}","arguments":{args}}}}}]}}"#
            )
        }
        Role::Tool { call } => write!(
            out,
            r#"{{"role":"tool","tool_call_id":"call_{call}","content":{escaped}}}"#
        ),
    }
    .expect("writing to a String cannot fail");
    out
}

/// `s` as a JSON string literal, quotes included.
pub(crate) fn json_string(s: &str) -> String {
    serde_json::to_string(s).expect("a str always serializes")
}

/// The fixed parts of every body of one run.
#[derive(Debug, Clone)]
pub(crate) struct BodyStyle {
    /// `{"model":"…",` (model name escaped once).
    head: String,
    /// Whether to ask for SSE streaming with usage in the final chunk.
    stream: bool,
}

impl BodyStyle {
    /// Style for `model`, streaming or not.
    pub(crate) fn new(model: &str, stream: bool) -> Self {
        BodyStyle {
            head: format!(r#"{{"model":{},"#, json_string(model)),
            stream,
        }
    }

    /// Builds `{"model":…,["tools":…,]"messages":[pieces…],"max_tokens":N,"stream":…}`
    /// in one exact-size allocation.
    pub(crate) fn build<'a, I>(&self, tools: Option<&str>, pieces: I, max_tokens: u32) -> Vec<u8>
    where
        I: Iterator<Item = &'a str> + Clone,
    {
        let tail = self.tail(max_tokens);
        let tools_len = tools.map_or(0, |t| t.len() + r#""tools":,"#.len());
        let (count, bytes) = pieces
            .clone()
            .fold((0usize, 0usize), |(n, b), p| (n + 1, b + p.len()));
        let commas = count.saturating_sub(1);
        let len =
            self.head.len() + tools_len + r#""messages":[]"#.len() + bytes + commas + tail.len();
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(self.head.as_bytes());
        if let Some(t) = tools {
            out.extend_from_slice(br#""tools":"#);
            out.extend_from_slice(t.as_bytes());
            out.push(b',');
        }
        out.extend_from_slice(br#""messages":["#);
        for (i, p) in pieces.enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(p.as_bytes());
        }
        out.push(b']');
        out.extend_from_slice(tail.as_bytes());
        out
    }

    /// Whether bodies ask for a streamed answer.
    pub(crate) fn stream(&self) -> bool {
        self.stream
    }

    fn tail(&self, max_tokens: u32) -> String {
        if self.stream {
            format!(
                r#","max_tokens":{max_tokens},"stream":true,"stream_options":{{"include_usage":true}}}}"#
            )
        } else {
            format!(r#","max_tokens":{max_tokens},"stream":false}}"#)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_deterministic_and_exact() {
        for len in [0, 1, 2, 3, 7, 100, 2048, 4096] {
            let a = text(42, len);
            assert_eq!(a.len(), len);
            assert_eq!(a, text(42, len));
        }
        assert_ne!(text(1, 2048), text(2, 2048));
    }

    #[test]
    fn text_exercises_escaping_and_utf8() {
        let t = text(7, 20_000);
        for needle in ["\n", "\"", "\\", "é", "中", "\t"] {
            assert!(t.contains(needle), "missing {needle:?}");
        }
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        let mut s = String::from("ab中");
        truncate_on_char(&mut s, 4);
        assert_eq!(s, "ab");
        let mut s = String::from("abc");
        truncate_on_char(&mut s, 10);
        assert_eq!(s, "abc");
    }

    #[test]
    fn messages_are_valid_json() {
        for role in [
            Role::System,
            Role::User,
            Role::Assistant,
            Role::AssistantCall { call: 5 },
            Role::Tool { call: 5 },
        ] {
            let m = render_message(role, &text(3, 500));
            let v: serde_json::Value = serde_json::from_str(&m).unwrap();
            assert_eq!(v["content"].as_str().unwrap(), text(3, 500));
        }
    }

    #[test]
    fn body_is_valid_json_with_exact_capacity() {
        for stream in [false, true] {
            let style = BodyStyle::new("m\"x", stream);
            let pieces = [
                render_message(Role::System, "a"),
                render_message(Role::User, "b"),
            ];
            let body = style.build(Some("[]"), pieces.iter().map(String::as_str), 7);
            assert_eq!(body.len(), body.capacity());
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["messages"].as_array().unwrap().len(), 2);
            assert_eq!(v["max_tokens"], 7);
            assert_eq!(v["stream"], stream);
        }
    }
}
