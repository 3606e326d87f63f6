//! The simulator's own chat template and tokenizer: request JSON to prompt bytes
//! to an approximate token count.
//!
//! For: rendering chat, completions, responses and `/tokenize` bodies into the
//! bytes a vLLM instance would tokenize, and reading the few other request fields
//! the simulator needs (`stream`, output length).
//! Not for: fidelity to any real model's template. It deliberately shares no code
//! with the router's request parsing, so that a router bug shows up as lost cache
//! hits instead of hiding in both.
//!
//! Rendering is prefix-stable like a real chat template: a conversation extended
//! by more messages renders to the old rendering (without the generation prompt)
//! followed by the new messages. Layout (ChatML-like): per message
//! `<|im_start|>{role}[ name=..][ tool_call_id=..]\n{content}[<tool_calls>{JSON}</tool_calls>]<|im_end|>\n`,
//! with `<|im_start|>tools\n{tools JSON}<|im_end|>\n` (if any tools) after the leading
//! system turn, else first, as Qwen's and Llama's templates place them; then the generation
//! prompt `<|im_start|>assistant\n`.
//! Tokens: one per `bytes_per_token` bytes of the rendering, rounded up.

use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64;

use super::error::ApiError;

/// Output length when the request names none (`max_tokens` and friends absent).
pub const DEFAULT_OUTPUT_TOKENS: usize = 16;

/// Vocabulary size token ids are reduced to (`/tokenize` ids are `< VOCAB`).
pub const VOCAB: u64 = 128_000;

const GENERATION_PROMPT: &str = "<|im_start|>assistant\n";

/// The OpenAI-compatible generation endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GenerationEndpoint {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completions,
    /// `/v1/responses`
    Responses,
    /// `/v1/messages` (Anthropic's Messages API)
    Messages,
}

/// What the simulator takes from a generation request.
#[derive(Debug)]
pub struct ParsedGeneration {
    /// The rendered prompt.
    pub prompt: Vec<u8>,
    /// Output tokens to generate (exactly; stop conditions are ignored).
    pub output_tokens: usize,
    /// Whether the client asked for server-sent events.
    pub stream: bool,
}

/// Parses a generation request body of `endpoint`.
/// `bytes_per_token` sizes token-id prompts (`/v1/completions` with integer arrays).
pub fn parse(
    endpoint: GenerationEndpoint,
    body: &Value,
    bytes_per_token: usize,
) -> Result<ParsedGeneration, ApiError> {
    if !body.is_object() {
        return Err(ApiError::invalid(
            "body",
            "the request body must be a JSON object",
        ));
    }
    let prompt = match endpoint {
        GenerationEndpoint::Chat => render_chat(body, true)?,
        GenerationEndpoint::Completions => {
            render_completion(required(body, "prompt")?, bytes_per_token)?
        }
        GenerationEndpoint::Responses => render_responses(body)?,
        GenerationEndpoint::Messages => render_messages(body)?,
    };
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid("stream", "`stream` must be a boolean")),
    };
    Ok(ParsedGeneration {
        prompt,
        output_tokens: output_tokens(body)?,
        stream,
    })
}

/// Output length: the first of `max_completion_tokens`, `max_output_tokens`,
/// `max_tokens` that is present and not null; [`DEFAULT_OUTPUT_TOKENS`] if none is.
pub fn output_tokens(body: &Value) -> Result<usize, ApiError> {
    for key in ["max_completion_tokens", "max_output_tokens", "max_tokens"] {
        match body.get(key) {
            None | Some(Value::Null) => continue,
            Some(value) => {
                return match value.as_u64() {
                    Some(n) if n >= 1 => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
                    _ => Err(ApiError::invalid(
                        key,
                        format!("`{key}` must be an integer >= 1"),
                    )),
                };
            }
        }
    }
    Ok(DEFAULT_OUTPUT_TOKENS)
}

/// Token count of a rendered prompt: `ceil(len / bytes_per_token)`.
pub fn token_count(prompt: &[u8], bytes_per_token: usize) -> usize {
    prompt.len().div_ceil(bytes_per_token.max(1))
}

/// Deterministic token ids of a rendered prompt: xxh3 of each `bytes_per_token`
/// chunk modulo [`VOCAB`], so equal prefixes give equal id prefixes.
pub fn token_ids(prompt: &[u8], bytes_per_token: usize) -> Vec<u32> {
    prompt
        .chunks(bytes_per_token.max(1))
        .map(|chunk| (xxh3_64(chunk) % VOCAB) as u32)
        .collect()
}

/// Renders a `/tokenize` body: `{"prompt": ...}` as a completion prompt, or
/// `{"messages": [...], "add_generation_prompt"?: bool (default true)}` as a chat.
pub fn render_tokenize(body: &Value, bytes_per_token: usize) -> Result<Vec<u8>, ApiError> {
    if body.get("messages").is_some() {
        let add = match body.get("add_generation_prompt") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::invalid(
                    "add_generation_prompt",
                    "must be a boolean",
                ));
            }
        };
        return render_chat(body, add);
    }
    match body.get("prompt") {
        Some(prompt) => render_completion(prompt, bytes_per_token),
        None => Err(ApiError::invalid(
            "prompt",
            "`prompt` or `messages` is required",
        )),
    }
}

/// Renders a chat body (`tools`, `messages`) with the simulator's template.
pub fn render_chat(body: &Value, add_generation_prompt: bool) -> Result<Vec<u8>, ApiError> {
    let messages = messages(body)?;
    let tools = tools_turn(body)?;
    let (mut out, mut system_end) = (Vec::new(), 0);
    for (i, message) in messages.iter().enumerate() {
        render_message(&mut out, message)?;
        if i == 0 && message.get("role").and_then(Value::as_str) == Some("system") {
            system_end = out.len();
        }
    }
    out.splice(system_end..system_end, tools);
    if add_generation_prompt {
        out.extend_from_slice(GENERATION_PROMPT.as_bytes());
    }
    Ok(out)
}

/// Renders a completions `prompt`: a string, token ids (each `bytes_per_token`
/// bytes, so one token per id), or an array of those, concatenated.
pub fn render_completion(prompt: &Value, bytes_per_token: usize) -> Result<Vec<u8>, ApiError> {
    let mut out = Vec::new();
    completion_part(&mut out, prompt, bytes_per_token, 0)?;
    Ok(out)
}

fn completion_part(out: &mut Vec<u8>, part: &Value, bpt: usize, depth: u8) -> Result<(), ApiError> {
    match part {
        Value::String(s) => out.extend_from_slice(s.as_bytes()),
        Value::Number(n) => {
            let id = n
                .as_u64()
                .ok_or_else(|| ApiError::invalid("prompt", "token ids must be integers >= 0"))?;
            out.extend((0..bpt.max(1)).map(|i| (id >> (8 * (i % 8))) as u8));
        }
        Value::Array(items) if depth < 2 => {
            for item in items {
                completion_part(out, item, bpt, depth + 1)?;
            }
        }
        _ => {
            let msg = "`prompt` must be a string, an array of strings, or token ids";
            return Err(ApiError::invalid("prompt", msg));
        }
    }
    Ok(())
}

/// Renders a Responses API body: `instructions` (as a system message), then `input` (a
/// string as a user message, or an array of items); `tools` after the leading system turn.
pub fn render_responses(body: &Value) -> Result<Vec<u8>, ApiError> {
    let tools = tools_turn(body)?;
    let (mut out, mut system_end) = (Vec::new(), None);
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => {
            push_turn(&mut out, "system", "", text.as_bytes());
            system_end = Some(out.len());
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "instructions",
                "`instructions` must be a string",
            ));
        }
    }
    match required(body, "input")? {
        Value::String(text) => push_turn(&mut out, "user", "", text.as_bytes()),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                render_item(&mut out, item)?;
                if i == 0 && item.get("role").and_then(Value::as_str) == Some("system") {
                    system_end.get_or_insert(out.len());
                }
            }
        }
        _ => {
            return Err(ApiError::invalid(
                "input",
                "`input` must be a string or an array",
            ));
        }
    }
    let at = system_end.unwrap_or(0);
    out.splice(at..at, tools);
    out.extend_from_slice(GENERATION_PROMPT.as_bytes());
    Ok(out)
}

/// Renders a Messages body as vLLM 0.32 does before a template that accepts system
/// messages anywhere: a system turn of `system` (without Claude Code's
/// `x-anthropic-billing-header` line), then each message in order, a `role: "system"` one
/// as a system turn where it stands, a user's `tool_result` blocks as tool turns before
/// it; `tools` after the leading system turn.
pub fn render_messages(body: &Value) -> Result<Vec<u8>, ApiError> {
    let messages = messages(body)?;
    let tools = tools_turn(body)?;
    let mut out = Vec::new();
    let system = block_texts(body.get("system"));
    if !system.is_empty() {
        push_turn(&mut out, "system", "", &system);
    }
    let system_end = out.len();
    for message in messages {
        let role = (message.get("role").and_then(Value::as_str))
            .ok_or_else(|| ApiError::invalid("messages", "every message needs a string `role`"))?;
        let system = block_texts(message.get("content"));
        match role {
            "system" if !system.is_empty() => push_turn(&mut out, "system", "", &system),
            "system" => {}
            _ => render_anthropic_message(&mut out, role, message.get("content"))?,
        }
    }
    out.splice(system_end..system_end, tools);
    out.extend_from_slice(GENERATION_PROMPT.as_bytes());
    Ok(out)
}

/// The text of a string or of text blocks, without the billing line.
fn block_texts(content: Option<&Value>) -> Vec<u8> {
    match content {
        Some(Value::String(text)) => text.as_bytes().to_vec(),
        Some(Value::Array(blocks)) => (blocks.iter())
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .filter(|t| !t.starts_with("x-anthropic-billing-header"))
            .flat_map(|t| t.as_bytes().iter().copied())
            .collect(),
        _ => Vec::new(),
    }
}

fn render_anthropic_message(
    out: &mut Vec<u8>,
    role: &str,
    content: Option<&Value>,
) -> Result<(), ApiError> {
    let blocks = match content {
        Some(Value::String(text)) => {
            push_turn(out, role, "", text.as_bytes());
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(ApiError::invalid(
                "messages",
                "`content` must be a string or an array",
            ));
        }
    };
    let mut body = Vec::new();
    for block in blocks {
        match block
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
        {
            "text" => body.extend_from_slice(str_field(block, "text").as_bytes()),
            "tool_use" => {
                let input = block.get("input").map(json_bytes).unwrap_or_default();
                let call = format!("<tool_call>{} ", str_field(block, "name"));
                body.extend_from_slice(call.as_bytes());
                body.extend_from_slice(&input);
                body.extend_from_slice(b"</tool_call>");
            }
            "tool_result" if role == "user" => {
                let attrs = format!(" tool_call_id={}", str_field(block, "tool_use_id"));
                push_turn(out, "tool", &attrs, &block_texts(block.get("content")));
            }
            "thinking" | "redacted_thinking" => {}
            other => body.extend_from_slice(media_marker(other, block).as_bytes()),
        }
    }
    if role != "user" || !body.is_empty() {
        push_turn(out, role, "", &body);
    }
    Ok(())
}

/// A body's `messages`: a non-empty array.
fn messages(body: &Value) -> Result<&Vec<Value>, ApiError> {
    required(body, "messages")?
        .as_array()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::invalid("messages", "`messages` must be a non-empty array"))
}

fn required<'a>(body: &'a Value, key: &'static str) -> Result<&'a Value, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Err(ApiError::invalid(key, format!("`{key}` is required"))),
        Some(value) => Ok(value),
    }
}

/// The tools turn of a body (empty without tools), to place after its system turn.
fn tools_turn(body: &Value) -> Result<Vec<u8>, ApiError> {
    let mut out = Vec::new();
    match body.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) if tools.is_empty() => {}
        Some(tools @ Value::Array(_)) => push_turn(&mut out, "tools", "", &json_bytes(tools)),
        Some(_) => return Err(ApiError::invalid("tools", "`tools` must be an array")),
    }
    Ok(out)
}

fn render_message(out: &mut Vec<u8>, message: &Value) -> Result<(), ApiError> {
    let role = message
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid("messages", "every message needs a string `role`"))?;
    let mut attrs = String::new();
    for key in ["name", "tool_call_id"] {
        if let Some(value) = message.get(key).and_then(Value::as_str) {
            attrs.push_str(&format!(" {key}={value}"));
        }
    }
    let mut body = Vec::new();
    if let Some(reasoning) = message.get("reasoning_content").and_then(Value::as_str) {
        body.extend_from_slice(format!("<think>{reasoning}</think>").as_bytes());
    }
    render_content(&mut body, message.get("content"), "messages")?;
    if let Some(calls @ Value::Array(_)) = message.get("tool_calls") {
        body.extend_from_slice(b"<tool_calls>");
        body.extend_from_slice(&json_bytes(calls));
        body.extend_from_slice(b"</tool_calls>");
    }
    push_turn(out, role, &attrs, &body);
    Ok(())
}

/// Content: a string, null, or an array of parts joined by `\n` (text parts as
/// their text, media parts as a short marker naming a hash of their data).
fn render_content(
    out: &mut Vec<u8>,
    content: Option<&Value>,
    param: &'static str,
) -> Result<(), ApiError> {
    match content {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => out.extend_from_slice(text.as_bytes()),
        Some(Value::Array(parts)) => {
            for (i, part) in parts.iter().enumerate() {
                if i > 0 {
                    out.push(b'\n');
                }
                render_part(out, part, param)?;
            }
        }
        Some(_) => {
            return Err(ApiError::invalid(
                param,
                "`content` must be a string, an array or null",
            ));
        }
    }
    Ok(())
}

fn render_part(out: &mut Vec<u8>, part: &Value, param: &'static str) -> Result<(), ApiError> {
    let kind = part
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(param, "every content part needs a string `type`"))?;
    let text_key = match kind {
        "text" | "input_text" | "output_text" | "summary_text" | "reasoning_text" => Some("text"),
        "refusal" => Some("refusal"),
        _ => None,
    };
    match text_key {
        Some(key) => {
            let text = part.get(key).and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(param, format!("a `{kind}` part needs a string `{key}`"))
            })?;
            out.extend_from_slice(text.as_bytes());
        }
        None => out.extend_from_slice(media_marker(kind, part).as_bytes()),
    }
    Ok(())
}

/// `<{kind}:{16 hex digits}>`, hashing the part's payload (url, data or id), or
/// the whole part when it has none of those.
fn media_marker(kind: &str, part: &Value) -> String {
    let payload = [
        "/image_url/url",
        "/image_url",
        "/input_audio/data",
        "/file/file_data",
        "/file/file_id",
        "/file_data",
        "/file_id",
        "/file_url",
    ]
    .iter()
    .find_map(|pointer| part.pointer(pointer).and_then(Value::as_str));
    let hash = match payload {
        Some(data) => xxh3_64(data.as_bytes()),
        None => xxh3_64(&json_bytes(part)),
    };
    let short = kind.strip_prefix("input_").unwrap_or(kind);
    let short = short.strip_suffix("_url").unwrap_or(short);
    format!("<{short}:{hash:016x}>")
}

fn render_item(out: &mut Vec<u8>, item: &Value) -> Result<(), ApiError> {
    match item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message")
    {
        "message" => {
            let role = item.get("role").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid("input", "a message item needs a string `role`")
            })?;
            let mut body = Vec::new();
            render_content(&mut body, item.get("content"), "input")?;
            push_turn(out, role, "", &body);
        }
        "function_call" => {
            let (name, args) = (str_field(item, "name"), str_field(item, "arguments"));
            let body = format!("<tool_call>{name} {args}</tool_call>");
            push_turn(out, "assistant", "", body.as_bytes());
        }
        "function_call_output" => {
            let mut body = Vec::new();
            match item.get("output") {
                Some(Value::String(text)) => body.extend_from_slice(text.as_bytes()),
                other => render_content(&mut body, other, "input")?,
            }
            let attrs = format!(" tool_call_id={}", str_field(item, "call_id"));
            push_turn(out, "tool", &attrs, &body);
        }
        "reasoning" => {
            let mut body = b"<think>".to_vec();
            render_content(&mut body, item.get("summary"), "input")?;
            body.extend_from_slice(b"</think>");
            push_turn(out, "assistant", "", &body);
        }
        other => push_turn(out, other, "", &json_bytes(item)),
    }
    Ok(())
}

/// A string field, or "" when absent or not a string.
fn str_field<'a>(item: &'a Value, key: &str) -> &'a str {
    item.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn push_turn(out: &mut Vec<u8>, role: &str, attrs: &str, body: &[u8]) {
    out.extend_from_slice(b"<|im_start|>");
    out.extend_from_slice(role.as_bytes());
    out.extend_from_slice(attrs.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(body);
    out.extend_from_slice(b"<|im_end|>\n");
}

/// Compact JSON of a value (object keys in serde_json's map order, which is stable).
fn json_bytes(value: &Value) -> Vec<u8> {
    value.to_string().into_bytes()
}

#[cfg(test)]
#[path = "template_tests.rs"]
mod tests;
