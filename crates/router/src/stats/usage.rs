//! Reads `usage.prompt_tokens`, `usage.prompt_tokens_details.cached_tokens` and
//! `usage.completion_tokens` (in the Responses API `usage.input_tokens`,
//! `usage.input_tokens_details.cached_tokens` and `usage.output_tokens`; in the Messages
//! API `input_tokens` plus `cache_read_input_tokens` and `cache_creation_input_tokens`,
//! of which `cache_read_input_tokens` were cached) from a
//! response as it streams through, without holding any of it back: a scanner fed chunk by
//! chunk that remembers the last value of each key (the final SSE chunk carries the usage)
//! and only a few bytes across chunk boundaries.

/// What every key looked for ends with: `"prompt_tokens":`, `"input_tokens":` (prompt
/// tokens) and `"cached_tokens":`, found in one pass over each chunk.
const SUFFIX: &[u8] = b"_tokens\":";
/// The key names before [`SUFFIX`], with their opening quote.
const PROMPT: [&[u8]; 2] = [b"\"prompt", b"\"input"];
const CACHED: &[u8] = b"\"cached";
/// The Messages API's prompt tokens besides `input_tokens`: read from the cache, and
/// written to it.
const CACHE_READ: &[u8] = b"\"cache_read_input";
const CACHE_CREATION: &[u8] = b"\"cache_creation_input";
/// The key names of completion tokens.
const COMPLETION: [&[u8]; 2] = [b"\"completion", b"\"output"];
/// Bytes kept from the end of a chunk: a key and its number can straddle two chunks.
const CARRY: usize = 40;

/// The token counts a backend reported for one response.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt: u64,
    /// Of which found in the prefix cache.
    pub cached: u64,
    /// Completion tokens (0 when not reported).
    pub completion: u64,
}

/// Scans response chunks for usage figures.
#[derive(Default)]
pub struct UsageScanner {
    carry: Vec<u8>,
    prompt: Option<u64>,
    cached: Option<u64>,
    cache_read: Option<u64>,
    cache_creation: Option<u64>,
    completion: Option<u64>,
}

impl UsageScanner {
    /// Looks at the next chunk of the response body.
    pub fn feed(&mut self, chunk: &[u8]) {
        let head = &chunk[..chunk.len().min(CARRY)];
        self.carry.extend_from_slice(head);
        let joined = std::mem::take(&mut self.carry);
        self.scan(&joined);
        if chunk.len() > head.len() {
            self.scan(chunk);
        }
        let tail_from = chunk.len().saturating_sub(CARRY);
        self.carry.clear();
        self.carry.extend_from_slice(&chunk[tail_from..]);
    }

    /// Keys found twice (in the joined boundary and in the chunk) are harmless: only the
    /// last value counts.
    fn scan(&mut self, bytes: &[u8]) {
        let mut from = 0;
        while let Some(at) = find(&bytes[from..], SUFFIX) {
            let (name, value) = bytes.split_at(from + at);
            from += at + SUFFIX.len();
            let Some(n) = number_at(&value[SUFFIX.len()..]) else {
                continue;
            };
            if PROMPT.iter().any(|p| name.ends_with(p)) {
                self.prompt = Some(n);
            } else if name.ends_with(CACHED) {
                self.cached = Some(n);
            } else if name.ends_with(CACHE_READ) {
                self.cache_read = Some(n);
            } else if name.ends_with(CACHE_CREATION) {
                self.cache_creation = Some(n);
            } else if COMPLETION.iter().any(|c| name.ends_with(c)) {
                self.completion = Some(n);
            }
        }
    }

    /// The usage seen, if the response reported prompt tokens.
    pub fn usage(&self) -> Option<Usage> {
        let (read, created) = (
            self.cache_read.unwrap_or(0),
            self.cache_creation.unwrap_or(0),
        );
        self.prompt.map(|input| Usage {
            prompt: input + read + created,
            cached: self.cached.or(self.cache_read).unwrap_or(0),
            completion: self.completion.unwrap_or(0),
        })
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    let first = needle[0];
    let mut i = 0;
    while let Some(pos) = haystack[i..].iter().position(|&b| b == first) {
        let at = i + pos;
        if haystack[at..].starts_with(needle) {
            return Some(at);
        }
        i = at + 1;
    }
    None
}

/// A complete unsigned integer at the start of `bytes` (after spaces): one followed by a
/// non-digit, so a number cut by a chunk boundary is not taken.
fn number_at(bytes: &[u8]) -> Option<u64> {
    let digits_from = bytes.iter().position(|b| *b != b' ')?;
    let rest = &bytes[digits_from..];
    let len = rest.iter().position(|b| !b.is_ascii_digit())?;
    std::str::from_utf8(&rest[..len]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_api_usage_counts_as_prompt_and_cached() {
        let mut s = UsageScanner::default();
        s.feed(br#"event: response.completed
data: {"response":{"usage":{"input_tokens":640,"input_tokens_details":{"cached_tokens":512},"output_tokens":9}}}"#);
        assert_eq!(
            s.usage(),
            Some(Usage {
                prompt: 640,
                cached: 512,
                completion: 9
            })
        );
    }

    #[test]
    fn messages_api_usage_adds_what_the_cache_read_and_wrote() {
        // vLLM 0.32's streamed Messages answer: the last usage is message_delta's.
        let mut s = UsageScanner::default();
        s.feed(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":0,\"output_tokens\":0}}}\n\n");
        s.feed(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":27,\"output_tokens\":4,\"cache_read_input_tokens\":320}}\n\n");
        let usage = Usage {
            prompt: 347,
            cached: 320,
            completion: 4,
        };
        assert_eq!(s.usage(), Some(usage));
    }

    const BODY: &str = r#"{"id":"x","usage":{"prompt_tokens":1234,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":1000}}}"#;

    #[test]
    fn reads_a_json_response() {
        let mut s = UsageScanner::default();
        s.feed(BODY.as_bytes());
        assert_eq!(
            s.usage(),
            Some(Usage {
                prompt: 1234,
                cached: 1000,
                completion: 5
            })
        );
    }

    #[test]
    fn reads_across_every_chunk_boundary() {
        for cut in 0..BODY.len() {
            let mut s = UsageScanner::default();
            s.feed(&BODY.as_bytes()[..cut]);
            s.feed(&BODY.as_bytes()[cut..]);
            assert_eq!(
                s.usage(),
                Some(Usage {
                    prompt: 1234,
                    cached: 1000,
                    completion: 5
                }),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn last_usage_of_a_stream_wins_and_escaped_text_is_ignored() {
        let mut s = UsageScanner::default();
        s.feed(br#"data: {"choices":[{"delta":{"content":"say \"prompt_tokens\":7"}}]}"#);
        s.feed(b"\n\ndata: {\"usage\":{\"prompt_tokens\":50,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n");
        s.feed(b"data: [DONE]\n\n");
        assert_eq!(
            s.usage(),
            Some(Usage {
                prompt: 50,
                cached: 32,
                completion: 0
            })
        );
    }

    #[test]
    fn no_usage_is_none() {
        let mut s = UsageScanner::default();
        s.feed(b"{\"data\":[]}");
        assert_eq!(s.usage(), None);
    }
}
