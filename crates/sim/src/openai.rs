//! OpenAI response shapes the simulator answers with: whole responses and SSE events.
//!
//! For: the JSON of `chat.completion`, `text_completion`, Responses API `response`
//! objects, Messages API `message` objects (usage as vLLM reports it), their streaming
//! chunks and events, and the generated text.
//! Not for: timing (the caller decides when each event is sent) or parsing requests.

use bytes::Bytes;
use serde_json::{Value, json};

use super::template::GenerationEndpoint;

/// The text every simulated output is cut from, cyclically (ASCII, so any cut is UTF-8).
const PHRASE: &[u8] = b"The simulated model writes this sentence again and again. ";

/// Output text of tokens `start..start + count`, `bytes_per_token` bytes each.
pub fn output_text(start: usize, count: usize, bytes_per_token: usize) -> String {
    let bpt = bytes_per_token.max(1);
    (start * bpt..(start + count) * bpt)
        .map(|i| char::from(PHRASE[i % PHRASE.len()]))
        .collect()
}

/// Token counts reported in `usage`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportedUsage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
}

impl ReportedUsage {
    fn chat_json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }

    /// vLLM's Messages usage: `input_tokens` are those not read from the cache.
    fn messages_json(&self) -> Value {
        json!({
            "input_tokens": self.prompt_tokens - self.cached_tokens,
            "output_tokens": self.completion_tokens,
            "cache_read_input_tokens": self.cached_tokens,
        })
    }

    fn responses_json(&self) -> Value {
        json!({
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": self.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        })
    }
}

/// Identity of one response.
#[derive(Clone, Debug)]
pub struct Meta {
    /// Which API shape to use.
    pub endpoint: GenerationEndpoint,
    /// Request number, unique within the instance.
    pub number: u64,
    /// Unix seconds.
    pub created: u64,
    /// Model name.
    pub model: String,
    /// Instance name (`system_fingerprint`).
    pub instance: String,
    /// Whether the answer ended of its own accord (else it ran to its length limit).
    pub stopped: bool,
}

impl Meta {
    /// The response id (`chatcmpl-…`, `cmpl-…` or `resp_…`).
    pub fn id(&self) -> String {
        let prefix = match self.endpoint {
            GenerationEndpoint::Chat => "chatcmpl-",
            GenerationEndpoint::Completions => "cmpl-",
            GenerationEndpoint::Responses => "resp_",
            GenerationEndpoint::Messages => "msg_",
        };
        format!("{prefix}{}-{}", self.instance, self.number)
    }

    /// The chat finish reason.
    fn finish(&self) -> &'static str {
        if self.stopped { "stop" } else { "length" }
    }

    /// The Messages stop reason.
    fn stop_reason(&self) -> &'static str {
        if self.stopped {
            "end_turn"
        } else {
            "max_tokens"
        }
    }

    fn message_id(&self) -> String {
        format!("msg_{}-{}", self.instance, self.number)
    }

    fn envelope(&self, object: &str, choices: Value) -> Value {
        json!({
            "id": self.id(),
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.instance,
            "choices": choices,
        })
    }
}

/// The non-streaming response body.
pub fn full_response(meta: &Meta, text: &str, usage: ReportedUsage) -> Value {
    let mut body = match meta.endpoint {
        GenerationEndpoint::Chat => meta.envelope(
            "chat.completion",
            json!([{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": meta.finish()}]),
        ),
        GenerationEndpoint::Completions => meta.envelope(
            "text_completion",
            json!([{"index": 0, "text": text, "logprobs": null, "finish_reason": meta.finish()}]),
        ),
        GenerationEndpoint::Responses => return response_object(meta, "completed", Some(text), Some(usage)),
        GenerationEndpoint::Messages => {
            let mut message = message_object(meta, Some(text), Some(meta.stop_reason()));
            message["usage"] = usage.messages_json();
            return message;
        }
    };
    body["usage"] = usage.chat_json();
    body
}

/// A Messages API `message`; its usage is set by the caller.
fn message_object(meta: &Meta, text: Option<&str>, stop: Option<&str>) -> Value {
    let content = match text {
        Some(text) => json!([{"type": "text", "text": text}]),
        None => json!([]),
    };
    json!({"id": meta.id(), "type": "message", "role": "assistant", "model": meta.model,
        "content": content, "stop_reason": stop, "stop_sequence": null,
        "usage": {"input_tokens": 0, "output_tokens": 0}})
}

fn message_item(meta: &Meta, text: Option<&str>) -> Value {
    let (status, content) = match text {
        Some(text) => (
            "completed",
            json!([{"type": "output_text", "text": text, "annotations": []}]),
        ),
        None => ("in_progress", json!([])),
    };
    json!({"type": "message", "id": meta.message_id(), "status": status, "role": "assistant", "content": content})
}

fn response_object(
    meta: &Meta,
    status: &str,
    text: Option<&str>,
    usage: Option<ReportedUsage>,
) -> Value {
    let output = if text.is_some() {
        json!([message_item(meta, text)])
    } else {
        json!([])
    };
    json!({
        "id": meta.id(),
        "object": "response",
        "created_at": meta.created,
        "status": status,
        "model": meta.model,
        "output": output,
        "usage": usage.map(|u| u.responses_json()),
        "error": null,
        "incomplete_details": null,
        "metadata": {},
    })
}

/// Builds the server-sent events of one streamed response, in order.
#[derive(Debug)]
pub struct StreamWriter {
    meta: Meta,
    sequence: u64,
}

impl StreamWriter {
    /// A writer for `meta`'s endpoint.
    pub fn new(meta: Meta) -> Self {
        Self { meta, sequence: 0 }
    }

    /// Events sent with the response headers (Responses API: `response.created`, `response.in_progress`).
    pub fn start(&mut self) -> Vec<Bytes> {
        if self.meta.endpoint == GenerationEndpoint::Messages {
            let message = message_object(&self.meta, None, None);
            return vec![anthropic("message_start", json!({"message": message}))];
        }
        if self.meta.endpoint != GenerationEndpoint::Responses {
            return Vec::new();
        }
        let response = response_object(&self.meta, "in_progress", None, None);
        vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
        ]
    }

    /// Events sent at the first token, before its text (chat: the role chunk).
    pub fn first(&mut self) -> Vec<Bytes> {
        match self.meta.endpoint {
            GenerationEndpoint::Chat => {
                vec![self.chat_chunk(json!({"role": "assistant", "content": ""}), None)]
            }
            GenerationEndpoint::Completions => Vec::new(),
            GenerationEndpoint::Messages => {
                let block = json!({"index": 0, "content_block": {"type": "text", "text": ""}});
                vec![anthropic("content_block_start", block)]
            }
            GenerationEndpoint::Responses => {
                let item = message_item(&self.meta, None);
                let part = json!({"type": "output_text", "text": "", "annotations": []});
                let item_id = self.meta.message_id();
                vec![
                    self.event("response.output_item.added", json!({"output_index": 0, "item": item})),
                    self.event(
                        "response.content_part.added",
                        json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
                    ),
                ]
            }
        }
    }

    /// One event carrying new output text.
    pub fn delta(&mut self, text: &str) -> Bytes {
        match self.meta.endpoint {
            GenerationEndpoint::Chat => self.chat_chunk(json!({"content": text}), None),
            GenerationEndpoint::Completions => self.completion_chunk(text, None),
            GenerationEndpoint::Messages => {
                let delta = json!({"index": 0, "delta": {"type": "text_delta", "text": text}});
                anthropic("content_block_delta", delta)
            }
            GenerationEndpoint::Responses => {
                let item_id = self.meta.message_id();
                let body = json!({"item_id": item_id, "output_index": 0, "content_index": 0, "delta": text});
                self.event("response.output_text.delta", body)
            }
        }
    }

    /// The closing events: finish reason, then usage (chat and completions: a chunk
    /// with empty `choices` and `usage`, then `data: [DONE]`; Responses API: the
    /// `.done` events and `response.completed` with the usage).
    pub fn end(&mut self, text: &str, usage: ReportedUsage) -> Vec<Bytes> {
        match self.meta.endpoint {
            GenerationEndpoint::Chat => {
                let finish = self.chat_chunk(json!({}), Some(self.meta.finish()));
                self.chat_tail(finish, "chat.completion.chunk", usage)
            }
            GenerationEndpoint::Completions => {
                let finish = self.completion_chunk("", Some(self.meta.finish()));
                self.chat_tail(finish, "text_completion", usage)
            }
            GenerationEndpoint::Responses => self.responses_end(text, usage),
            GenerationEndpoint::Messages => {
                let delta = json!({"delta": {"stop_reason": self.meta.stop_reason(), "stop_sequence": null},
                    "usage": usage.messages_json()});
                vec![
                    anthropic("content_block_stop", json!({"index": 0})),
                    anthropic("message_delta", delta),
                    anthropic("message_stop", json!({})),
                ]
            }
        }
    }

    fn chat_tail(&self, finish: Bytes, object: &str, usage: ReportedUsage) -> Vec<Bytes> {
        let mut last = self.meta.envelope(object, json!([]));
        last["usage"] = usage.chat_json();
        vec![finish, data(&last), Bytes::from_static(b"data: [DONE]\n\n")]
    }

    fn responses_end(&mut self, text: &str, usage: ReportedUsage) -> Vec<Bytes> {
        let item_id = self.meta.message_id();
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        let item = message_item(&self.meta, Some(text));
        let response = response_object(&self.meta, "completed", Some(text), Some(usage));
        vec![
            self.event(
                "response.output_text.done",
                json!({"item_id": item_id, "output_index": 0, "content_index": 0, "text": text}),
            ),
            self.event(
                "response.content_part.done",
                json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
            ),
            self.event(
                "response.output_item.done",
                json!({"output_index": 0, "item": item}),
            ),
            self.event("response.completed", json!({"response": response})),
        ]
    }

    fn chat_chunk(&self, delta: Value, finish: Option<&str>) -> Bytes {
        let choice =
            json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]);
        data(&self.meta.envelope("chat.completion.chunk", choice))
    }

    fn completion_chunk(&self, text: &str, finish: Option<&str>) -> Bytes {
        let choice = json!([{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}]);
        data(&self.meta.envelope("text_completion", choice))
    }

    /// A Responses API event: `event: {kind}` plus `data:` with `type` and `sequence_number`.
    fn event(&mut self, kind: &str, mut body: Value) -> Bytes {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        Bytes::from(format!("event: {kind}\ndata: {body}\n\n"))
    }
}

/// A Messages API event: `event: {kind}` plus `data:` with `type`.
fn anthropic(kind: &str, mut body: Value) -> Bytes {
    body["type"] = json!(kind);
    Bytes::from(format!("event: {kind}\ndata: {body}\n\n"))
}

fn data(body: &Value) -> Bytes {
    Bytes::from(format!("data: {body}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(endpoint: GenerationEndpoint) -> Meta {
        Meta {
            endpoint,
            number: 3,
            created: 1,
            model: "m".into(),
            instance: "sim-a".into(),
            stopped: false,
        }
    }

    #[test]
    fn an_answer_the_model_ended_says_so_in_each_api() {
        let stopped = |endpoint| Meta {
            stopped: true,
            ..meta(endpoint)
        };
        let usage = ReportedUsage {
            prompt_tokens: 8,
            cached_tokens: 0,
            completion_tokens: 2,
        };
        let chat = full_response(&stopped(GenerationEndpoint::Chat), "hi", usage);
        assert_eq!(chat["choices"][0]["finish_reason"], "stop");
        let messages = full_response(&stopped(GenerationEndpoint::Messages), "hi", usage);
        assert_eq!(messages["stop_reason"], "end_turn");
        assert_eq!(
            full_response(&meta(GenerationEndpoint::Messages), "hi", usage)["stop_reason"],
            "max_tokens"
        );
    }

    #[test]
    fn output_text_is_cut_per_token() {
        let whole = output_text(0, 30, 4);
        assert_eq!(whole.len(), 120);
        assert_eq!(
            format!("{}{}", output_text(0, 7, 4), output_text(7, 23, 4)),
            whole
        );
    }

    #[test]
    fn usage_shapes() {
        let usage = ReportedUsage {
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens: 2,
        };
        let chat = full_response(&meta(GenerationEndpoint::Chat), "hi", usage);
        assert_eq!(chat["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
        assert_eq!(chat["usage"]["total_tokens"], 12);
        assert_eq!(chat["system_fingerprint"], "sim-a");
        let resp = full_response(&meta(GenerationEndpoint::Responses), "hi", usage);
        assert_eq!(resp["usage"]["input_tokens_details"]["cached_tokens"], 4);
        assert_eq!(resp["output"][0]["content"][0]["text"], "hi");
    }

    #[test]
    fn streams_end_with_usage() {
        let usage = ReportedUsage {
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens: 2,
        };
        let mut chat = StreamWriter::new(meta(GenerationEndpoint::Chat));
        let end = chat.end("hi", usage);
        assert_eq!(end.last().map(|b| &b[..]), Some(&b"data: [DONE]\n\n"[..]));
        assert!(
            std::str::from_utf8(&end[1])
                .unwrap()
                .contains("\"cached_tokens\":4")
        );
        let mut resp = StreamWriter::new(meta(GenerationEndpoint::Responses));
        assert_eq!(resp.start().len(), 2);
        let end = resp.end("hi", usage);
        let completed = std::str::from_utf8(end.last().unwrap()).unwrap();
        assert!(completed.starts_with("event: response.completed\n"));
        assert!(completed.contains("\"sequence_number\":5"));
    }
}
