//! One HTTP exchange: send a chat-completion body (or the same body to the Messages API),
//! read the JSON answer or the SSE stream, and extract usage, the answering backend and
//! TTFT. The Messages API's usage (`input_tokens` without those read from or written to
//! the cache, as vLLM reports it) counts as the chat usage it stands for.
//!
//! The backend is named by the `x-sim-instance` response header, else by the
//! body's `system_fingerprint`. TTFT is the time from sending to the first
//! SSE event carrying non-empty content (streaming only).

use std::time::Duration;

use serde::Deserialize;
use serde::de::IgnoredAny;
use tokio::time::Instant;

use super::sse::SseParser;

/// Response header naming the backend instance (our simulator sets it).
pub const INSTANCE_HEADER: &str = "x-sim-instance";

/// Token usage reported by a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServedUsage {
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens`, when reported.
    pub cached_tokens: Option<u64>,
    /// `usage.completion_tokens`.
    pub completion_tokens: u64,
}

/// What one request produced.
#[derive(Debug, Clone, Default)]
pub struct ExchangeResult {
    /// Instance that answered, if the response named one.
    pub backend: Option<String>,
    /// Time to first content (streaming only).
    pub ttft: Option<Duration>,
    /// Usage, if the response reported it.
    pub usage: Option<ServedUsage>,
    /// Error kind (`connect`, `timeout`, `http_503`, ...); `None` when ok.
    pub error: Option<String>,
    /// For a 429, the `Retry-After` it gave.
    pub retry_after: Option<Duration>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Answer {
    system_fingerprint: Option<String>,
    usage: Option<UsageJson>,
    choices: Vec<Choice>,
    /// A Messages stream's `content_block_delta`.
    delta: Option<Delta>,
    error: Option<IgnoredAny>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct UsageJson {
    prompt_tokens: u64,
    completion_tokens: u64,
    prompt_tokens_details: Option<Details>,
    /// The Messages API's.
    input_tokens: u64,
    output_tokens: u64,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: u64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Details {
    cached_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Choice {
    delta: Option<Delta>,
    text: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Delta {
    content: Option<String>,
    reasoning_content: Option<String>,
    /// A Messages `text_delta`'s.
    text: Option<String>,
}

impl Delta {
    fn has_content(&self) -> bool {
        let nonempty = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
        nonempty(&self.content) || nonempty(&self.reasoning_content) || nonempty(&self.text)
    }
}

impl From<UsageJson> for ServedUsage {
    fn from(u: UsageJson) -> Self {
        let read = u.cache_read_input_tokens.unwrap_or(0);
        ServedUsage {
            prompt_tokens: u.prompt_tokens + u.input_tokens + read + u.cache_creation_input_tokens,
            cached_tokens: (u.prompt_tokens_details.and_then(|d| d.cached_tokens))
                .or(u.cache_read_input_tokens),
            completion_tokens: u.completion_tokens + u.output_tokens,
        }
    }
}

impl Choice {
    fn has_content(&self) -> bool {
        let nonempty = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
        nonempty(&self.text) || self.delta.as_ref().is_some_and(Delta::has_content)
    }
}

/// Sends `req` (whose send time is `sent`) and reads the whole answer.
pub(crate) async fn exchange(
    req: reqwest::RequestBuilder,
    stream: bool,
    sent: Instant,
) -> ExchangeResult {
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => return failed(None, error_kind(&e)),
    };
    let backend = resp
        .headers()
        .get(INSTANCE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let status = resp.status();
    if !status.is_success() {
        let retry_after = (status == reqwest::StatusCode::TOO_MANY_REQUESTS)
            .then(|| resp.headers().get(reqwest::header::RETRY_AFTER))
            .flatten()
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        // Drain so the connection can be reused; the body is not needed.
        let _ = resp.bytes().await;
        return ExchangeResult {
            retry_after,
            ..failed(backend, format!("http_{}", status.as_u16()))
        };
    }
    let mut ex = if stream {
        read_stream(resp, sent).await
    } else {
        read_json(resp).await
    };
    if backend.is_some() {
        ex.backend = backend;
    }
    ex
}

fn failed(backend: Option<String>, kind: String) -> ExchangeResult {
    ExchangeResult {
        backend,
        error: Some(kind),
        ..ExchangeResult::default()
    }
}

/// Classifies a client error.
fn error_kind(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else if e.is_body() || e.is_decode() {
        "body"
    } else if e.is_request() {
        "request"
    } else {
        "other"
    };
    kind.to_owned()
}

async fn read_json(resp: reqwest::Response) -> ExchangeResult {
    let bytes = match resp.bytes().await {
        Ok(b) => b,
        Err(e) => return failed(None, error_kind(&e)),
    };
    match serde_json::from_slice::<Answer>(&bytes) {
        Ok(a) if a.error.is_some() => failed(a.system_fingerprint, "api_error".into()),
        Ok(a) => ExchangeResult {
            backend: a.system_fingerprint,
            usage: a.usage.map(ServedUsage::from),
            ..ExchangeResult::default()
        },
        Err(_) => failed(None, "decode".into()),
    }
}

async fn read_stream(mut resp: reqwest::Response, sent: Instant) -> ExchangeResult {
    let mut st = StreamState::new(sent);
    let mut parser = SseParser::default();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => parser.push(&c, |d| st.event(d)),
            Ok(None) => break,
            Err(e) => {
                st.error.get_or_insert(error_kind(&e));
                break;
            }
        }
    }
    parser.finish(|d| st.event(d));
    st.finish()
}

/// What a stream has shown so far.
pub(crate) struct StreamState {
    sent: Instant,
    ex: ExchangeResult,
    error: Option<String>,
    done: bool,
}

impl StreamState {
    /// A stream whose request was sent at `sent`.
    pub(crate) fn new(sent: Instant) -> Self {
        StreamState {
            sent,
            ex: ExchangeResult::default(),
            error: None,
            done: false,
        }
    }

    /// Handles one SSE data payload.
    pub(crate) fn event(&mut self, data: &[u8]) {
        if data.trim_ascii() == b"[DONE]" {
            self.done = true;
            return;
        }
        // Once TTFT and the backend are known only usage and errors matter:
        // skip the JSON parse of plain content chunks.
        let known = self.ex.ttft.is_some() && self.ex.backend.is_some();
        if known && !contains(data, b"\"usage\"") && !contains(data, b"\"error\"") {
            return;
        }
        let Ok(a) = serde_json::from_slice::<Answer>(data) else {
            self.error.get_or_insert_with(|| "decode".into());
            return;
        };
        if a.error.is_some() {
            self.error.get_or_insert_with(|| "stream_error".into());
        }
        let content = a.choices.iter().any(Choice::has_content)
            || a.delta.as_ref().is_some_and(Delta::has_content);
        if self.ex.ttft.is_none() && content {
            self.ex.ttft = Some(self.sent.elapsed());
        }
        if let Some(u) = a.usage {
            self.ex.usage = Some(u.into());
        }
        if self.ex.backend.is_none() {
            self.ex.backend = a.system_fingerprint;
        }
    }

    /// The exchange; a stream without `[DONE]` and without usage is incomplete.
    pub(crate) fn finish(mut self) -> ExchangeResult {
        if self.error.is_none() && !self.done && self.ex.usage.is_none() {
            self.error = Some("stream_incomplete".into());
        }
        self.ex.error = self.error;
        self.ex
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: &str = r#"{"id":"c","object":"chat.completion.chunk","system_fingerprint":"sim-1","choices":[{"index":0,"delta":{"content":"hi"}}]}"#;
    const FINAL: &str = r#"{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":5,"total_tokens":105,"prompt_tokens_details":{"cached_tokens":64}}}"#;

    #[test]
    fn stream_yields_usage_backend_and_ttft() {
        let mut st = StreamState::new(Instant::now());
        st.event(br#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#);
        assert!(st.ex.ttft.is_none());
        st.event(CHUNK.as_bytes());
        st.event(CHUNK.as_bytes());
        st.event(FINAL.as_bytes());
        st.event(b"[DONE]");
        let ex = st.finish();
        assert!(ex.ttft.is_some());
        assert_eq!(ex.error, None);
        assert_eq!(ex.backend.as_deref(), Some("sim-1"));
        let u = ex.usage.unwrap();
        assert_eq!(
            (u.prompt_tokens, u.cached_tokens, u.completion_tokens),
            (100, Some(64), 5)
        );
    }

    #[test]
    fn a_messages_stream_counts_its_cache_reads_as_chat_would() {
        let mut st = StreamState::new(Instant::now());
        st.event(br#"{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":0,"output_tokens":0}}}"#);
        st.event(br#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#);
        assert!(st.ex.ttft.is_none(), "an empty block is not content");
        st.event(br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#);
        assert!(st.ex.ttft.is_some());
        st.event(br#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":36,"output_tokens":5,"cache_read_input_tokens":64}}"#);
        let ex = st.finish();
        assert_eq!(ex.error, None);
        let u = ex.usage.unwrap();
        assert_eq!(
            (u.prompt_tokens, u.cached_tokens, u.completion_tokens),
            (100, Some(64), 5)
        );
    }

    #[test]
    fn truncated_stream_is_an_error() {
        let mut st = StreamState::new(Instant::now());
        st.event(CHUNK.as_bytes());
        assert_eq!(st.finish().error.as_deref(), Some("stream_incomplete"));
        let mut st = StreamState::new(Instant::now());
        st.event(br#"{"error":{"message":"overloaded"}}"#);
        st.event(b"[DONE]");
        assert_eq!(st.finish().error.as_deref(), Some("stream_error"));
    }

    #[test]
    fn usage_without_details_has_no_cached_tokens() {
        let a: Answer = serde_json::from_str(
            r#"{"usage":{"prompt_tokens":3,"completion_tokens":1,"prompt_tokens_details":null}}"#,
        )
        .unwrap();
        let s = ServedUsage::from(a.usage.unwrap());
        assert_eq!(s.cached_tokens, None);
        assert_eq!(s.prompt_tokens, 3);
    }
}
