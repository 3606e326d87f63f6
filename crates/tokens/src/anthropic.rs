//! A Messages request (`/v1/messages`, `/v1/messages/count_tokens`) as the chat request
//! vLLM turns it into before the template (`vllm/entrypoints/anthropic/serving.py`, read
//! at 0.32):
//!
//! - a system message first: `system`'s text, without text blocks starting
//!   `x-anthropic-billing-header`; a `role: "system"` message stays where it is, unless the
//!   template wants system first ([`Template::wants_system_first`]): then its text joins
//!   the first (with nothing between);
//! - each other message in order: a user message's `tool_result` blocks become tool
//!   messages placed before it (their text blocks joined with `\n`), and the user message
//!   itself is dropped when nothing else is left of it; `tool_use` blocks become
//!   `tool_calls`; `thinking` becomes `reasoning`; a single text block becomes a string;
//!   images become `image_url` parts;
//! - `tools` become `{type: "function", function: {name, description, parameters}}`.

use minijinja::Value;
use minijinja::value::ValueKind;

#[cfg(doc)]
use crate::template::Template;

/// Claude Code's attribution line, which vLLM strips.
const BILLING: &str = "x-anthropic-billing-header";

/// The chat `messages` of a Messages body; `merge`: inline system messages join the first.
/// The error says which part is not of the shape the API takes.
pub fn messages(body: &Value, merge: bool) -> Result<Value, &'static str> {
    let messages = field(body, "messages");
    let items: Vec<Value> = messages
        .try_iter()
        .map_err(|_| "`messages` must be an array")?
        .collect();
    let system_of = |m: &Value| texts(&field(m, "content"), true);
    let mut system = texts(&field(body, "system"), false);
    if merge {
        items
            .iter()
            .filter(|m| role(m) == "system")
            .for_each(|m| system.push_str(&system_of(m)));
    }
    let mut out = Vec::new();
    let push_system = |out: &mut Vec<Value>, text: &str| {
        if !text.is_empty() {
            out.push(Value::from_iter([("role", "system"), ("content", text)]));
        }
    };
    push_system(&mut out, &system);
    for m in &items {
        match role(m).as_str() {
            "system" if merge => {}
            "system" => push_system(&mut out, &system_of(m)),
            _ => convert(m, &mut out)?,
        }
    }
    Ok(Value::from(out))
}

/// The chat `tools` of a Messages body's `tools`; none when it has none.
pub fn tools(body: &Value) -> Value {
    let Ok(items) = field(body, "tools").try_iter() else {
        return Value::from(());
    };
    let converted: Vec<Value> = items
        .map(|tool| {
            let keys = [("name", "name"), ("description", "description")];
            let mut function: Vec<(&str, Value)> = keys
                .iter()
                .map(|(to, from)| (*to, field(&tool, from)))
                .collect();
            function.push(("parameters", field(&tool, "input_schema")));
            let function = function.into_iter().filter(|(_, v)| !v.is_undefined());
            let function = Value::from_iter(function);
            Value::from_iter([("type", Value::from("function")), ("function", function)])
        })
        .collect();
    Value::from(converted)
}

/// One message other than a system one, appended to `out` with the tool messages its
/// results make.
fn convert(message: &Value, out: &mut Vec<Value>) -> Result<(), &'static str> {
    let role = role(message);
    let content = field(message, "content");
    if content.kind() == ValueKind::String {
        out.push(Value::from_iter([
            ("role", Value::from(role.as_str())),
            ("content", content),
        ]));
        return Ok(());
    }
    let blocks = content
        .try_iter()
        .map_err(|_| "`content` must be a string or an array")?;
    let (mut parts, mut calls, mut reasoning) = (Vec::new(), Vec::new(), String::new());
    for block in blocks {
        let kind = field(&block, "type");
        match kind.as_str().unwrap_or_default() {
            "text" => {
                if let Some(text) = field(&block, "text").as_str().filter(|t| !t.is_empty()) {
                    parts.push(Value::from_iter([("type", "text"), ("text", text)]));
                }
            }
            "image" => parts.push(image(&field(&block, "source"))),
            "thinking" => reasoning.push_str(field(&block, "thinking").as_str().unwrap_or("")),
            "tool_use" => calls.push(call(&block)),
            "tool_result" if role == "user" => out.push(tool_message(&block)),
            "tool_result" => {
                let text = format!("Tool result: {}", field(&block, "content"));
                parts.push(Value::from_iter([
                    ("type", "text"),
                    ("text", text.as_str()),
                ]));
            }
            _ => {}
        }
    }
    let mut converted: Vec<(&str, Value)> = vec![("role", Value::from(role.as_str()))];
    if !reasoning.is_empty() {
        converted.push(("reasoning", Value::from(reasoning.as_str())));
    }
    if !calls.is_empty() {
        converted.push(("tool_calls", Value::from(calls)));
    }
    match parts.len() {
        0 => {}
        1 if field(&parts[0], "type").as_str() == Some("text") => {
            converted.push(("content", field(&parts[0], "text")))
        }
        _ => converted.push(("content", Value::from(parts))),
    }
    let has_content = converted.iter().any(|(k, _)| *k == "content");
    if role != "user" || has_content {
        out.push(Value::from_iter(converted));
    }
    Ok(())
}

/// A user's `tool_result` block as a tool message.
fn tool_message(block: &Value) -> Value {
    let content = field(block, "content");
    let text = match content.as_str() {
        Some(text) => text.to_string(),
        None => {
            let items = content.try_iter().into_iter().flatten();
            let texts: Vec<String> = items
                .filter(|i| field(i, "type").as_str() == Some("text"))
                .map(|i| field(&i, "text").as_str().unwrap_or("").to_string())
                .collect();
            texts.join("\n")
        }
    };
    let id = field(block, "tool_use_id");
    let id = id.as_str().unwrap_or("");
    Value::from_iter([("role", "tool"), ("tool_call_id", id), ("content", &text)])
}

/// A `tool_use` block as a chat tool call, its input as the arguments.
fn call(block: &Value) -> Value {
    let input = field(block, "input");
    let input = match input.is_undefined() || input.is_none() {
        true => Value::from_iter(Vec::<(String, Value)>::new()),
        false => input,
    };
    let function = Value::from_iter([("name", field(block, "name")), ("arguments", input)]);
    Value::from_iter([
        ("id", field(block, "id")),
        ("type", Value::from("function")),
        ("function", function),
    ])
}

/// An image `source` as an `image_url` part.
fn image(source: &Value) -> Value {
    let url = match field(source, "type").as_str() {
        Some("url") => field(source, "url").as_str().unwrap_or("").to_string(),
        _ => {
            let media = field(source, "media_type");
            let media = media.as_str().unwrap_or("image/jpeg");
            let data = field(source, "data");
            format!("data:{media};base64,{}", data.as_str().unwrap_or(""))
        }
    };
    let url = Value::from_iter([("url", url)]);
    Value::from_iter([("type", Value::from("image_url")), ("image_url", url)])
}

/// A string's text, or the text blocks of an array joined with nothing between, without
/// the attribution line (a string that is one is dropped too when `inline`, as vLLM does).
fn texts(value: &Value, inline: bool) -> String {
    if let Some(text) = value.as_str() {
        let dropped = inline && text.starts_with(BILLING);
        return if dropped {
            String::new()
        } else {
            text.to_string()
        };
    }
    let blocks = value.try_iter().into_iter().flatten();
    let kept = blocks
        .filter(|b| field(b, "type").as_str() == Some("text"))
        .filter_map(|b| field(&b, "text").as_str().map(str::to_string))
        .filter(|t| !t.is_empty() && !t.starts_with(BILLING));
    kept.collect()
}

fn role(message: &Value) -> String {
    field(message, "role").as_str().unwrap_or("").to_string()
}

fn field(value: &Value, key: &str) -> Value {
    value.get_attr(key).unwrap_or_default()
}
