//! A request body as the engine's input: a chat (or a responses or Messages request, turned
//! into one)
//! rendered with the chat template as vLLM renders it, or a completions prompt as text or
//! as token ids. What vLLM does before the template, this does too:
//!
//! - `content` given as a list of parts becomes the text parts joined with `\n`, unless
//!   the template iterates over parts itself; a missing or null `content` becomes `""`;
//! - an assistant's `tool_calls[].function.arguments` given as a JSON string is parsed;
//! - `tools`, `add_generation_prompt` (default true), `documents` and the keys of
//!   `chat_template_kwargs` (`enable_thinking`, ...) reach the template, with the
//!   tokenizer's special tokens (`bos_token`, `eos_token`, ...).

use minijinja::Value;
use minijinja::value::ValueKind;
use prefix_router_core::request::Endpoint;

use crate::template::Template;

/// What the engine tokenizes.
#[derive(Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Text; `special`: the tokenizer adds its special tokens (BOS) as for a completion.
    Text { text: String, special: bool },
    /// Token ids, used as they are.
    Ids(Vec<u32>),
}

/// Why a body was not rendered (it is then routed on its text), by reason.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Unrendered {
    /// Not JSON, or not the shape the endpoint takes.
    #[error("not a body this endpoint takes: {0}")]
    Shape(String),
    /// The chat template failed on it (or raised an exception).
    #[error("the chat template failed: {0}")]
    Template(String),
    /// The tokenizer failed on it.
    #[error("the tokenizer failed: {0}")]
    Tokenizer(String),
}

impl Unrendered {
    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Unrendered::Shape(_) => "shape",
            Unrendered::Template(_) => "template",
            Unrendered::Tokenizer(_) => "tokenizer",
        }
    }
}

/// What rendering a model's chats needs.
pub struct Renderer {
    pub(crate) template: Option<Template>,
    /// Whether `content` reaches the template as a list of parts.
    pub(crate) lists_content: bool,
    /// Whether a Messages request's inline system messages are merged into the leading
    /// one: the template refuses a system message after the first (vLLM 0.32 probes the
    /// same way).
    pub(crate) merges_inline_system: bool,
    /// `bos_token`, `eos_token`, ... as the template sees them.
    pub(crate) special_tokens: Vec<(String, Value)>,
}

impl Renderer {
    /// The prompt of `body` for `endpoint`.
    pub fn prompt(&self, endpoint: Endpoint, body: &[u8]) -> Result<Prompt, Unrendered> {
        let body: Value =
            serde_json::from_slice(body).map_err(|e| Unrendered::Shape(e.to_string()))?;
        match endpoint {
            Endpoint::Chat => {
                let messages = field(&body, "messages");
                self.chat(&body, messages, field(&body, "tools"))
            }
            Endpoint::Responses => {
                let messages = responses_messages(&body)?;
                self.chat(&body, messages, responses_tools(&field(&body, "tools")))
            }
            Endpoint::Completions => completion(&field(&body, "prompt")),
            Endpoint::Messages | Endpoint::CountTokens => {
                let messages = crate::anthropic::messages(&body, self.merges_inline_system)
                    .map_err(|e| Unrendered::Shape(e.into()))?;
                self.chat(&body, messages, crate::anthropic::tools(&body))
            }
        }
    }

    fn chat(&self, body: &Value, messages: Value, tools: Value) -> Result<Prompt, Unrendered> {
        let template = (self.template.as_ref())
            .ok_or_else(|| Unrendered::Template("the model has no chat template".into()))?;
        let messages = self.messages(&messages)?;
        let generation = field(body, "add_generation_prompt");
        let continued = field(body, "continue_final_message").is_true();
        let generation = !continued && (generation.is_undefined() || generation.is_true());
        let mut context: Vec<(String, Value)> = self.special_tokens.clone();
        context.push(("messages".into(), messages));
        context.push(("add_generation_prompt".into(), Value::from(generation)));
        if !tools.is_none() && !tools.is_undefined() {
            context.push(("tools".into(), tools));
        }
        let documents = field(body, "documents");
        if !documents.is_none() && !documents.is_undefined() {
            context.push(("documents".into(), documents));
        }
        let kwargs = field(body, "chat_template_kwargs");
        if kwargs.kind() == ValueKind::Map {
            for key in kwargs.try_iter().map_err(shape)? {
                let value = kwargs.get_item(&key).map_err(shape)?;
                context.push((key.to_string(), value));
            }
        }
        let text = template
            .render(Value::from_iter(context))
            .map_err(|e| Unrendered::Template(e.to_string()))?;
        Ok(Prompt::Text {
            text,
            special: false,
        })
    }

    /// The messages as vLLM hands them to the template.
    fn messages(&self, messages: &Value) -> Result<Value, Unrendered> {
        if messages.kind() != ValueKind::Seq {
            return Err(Unrendered::Shape("`messages` must be an array".into()));
        }
        let normalized: Result<Vec<Value>, Unrendered> = (messages.try_iter().map_err(shape)?)
            .map(|m| self.message(&m))
            .collect();
        Ok(Value::from(normalized?))
    }

    fn message(&self, message: &Value) -> Result<Value, Unrendered> {
        if message.kind() != ValueKind::Map {
            return Err(Unrendered::Shape("a message must be an object".into()));
        }
        let mut out: Vec<(Value, Value)> = Vec::new();
        for key in message.try_iter().map_err(shape)? {
            let value = message.get_item(&key).map_err(shape)?;
            let value = match key.as_str() {
                Some("content") => self.content(&value)?,
                Some("tool_calls") => tool_calls(&value)?,
                _ => value,
            };
            out.push((key, value));
        }
        if !out.iter().any(|(k, _)| k.as_str() == Some("content")) {
            out.push((Value::from("content"), Value::from("")));
        }
        Ok(Value::from_iter(out))
    }

    fn content(&self, content: &Value) -> Result<Value, Unrendered> {
        match content.kind() {
            ValueKind::String => Ok(content.clone()),
            ValueKind::None | ValueKind::Undefined => Ok(Value::from("")),
            ValueKind::Seq if self.lists_content => Ok(content.clone()),
            ValueKind::Seq => {
                let mut texts = Vec::new();
                for part in content.try_iter().map_err(shape)? {
                    let text = part.get_attr("text").map_err(shape)?;
                    if let Some(text) = text.as_str() {
                        texts.push(text.to_string());
                    }
                }
                Ok(Value::from(texts.join("\n")))
            }
            _ => Err(Unrendered::Shape(
                "`content` must be a string or an array".into(),
            )),
        }
    }
}

/// `tool_calls` with each `function.arguments` given as a JSON string parsed, as vLLM
/// parses them before the template.
fn tool_calls(calls: &Value) -> Result<Value, Unrendered> {
    if calls.kind() != ValueKind::Seq {
        return Ok(calls.clone());
    }
    let mut out = Vec::new();
    for call in calls.try_iter().map_err(shape)? {
        let function = call.get_attr("function").map_err(shape)?;
        let arguments = function.get_attr("arguments").map_err(shape)?;
        let Some(text) = arguments.as_str() else {
            out.push(call);
            continue;
        };
        let parsed: Value = serde_json::from_str(text).unwrap_or_else(|_| arguments.clone());
        let function = replace(&function, "arguments", parsed)?;
        out.push(replace(&call, "function", function)?);
    }
    Ok(Value::from(out))
}

/// `map` with `key` set to `value`, keys in their order.
fn replace(map: &Value, key: &str, value: Value) -> Result<Value, Unrendered> {
    if map.kind() != ValueKind::Map {
        return Err(Unrendered::Shape(format!("`{key}` belongs in an object")));
    }
    let mut value = Some(value);
    let mut out: Vec<(Value, Value)> = Vec::new();
    for k in map.try_iter().map_err(shape)? {
        let v = match k.as_str() == Some(key) {
            true => value.take().unwrap_or_default(),
            false => map.get_item(&k).map_err(shape)?,
        };
        out.push((k, v));
    }
    if let Some(v) = value {
        out.push((Value::from(key), v));
    }
    Ok(Value::from_iter(out))
}

/// A completions `prompt`: a string, token ids, or a batch of either (its first).
fn completion(prompt: &Value) -> Result<Prompt, Unrendered> {
    if let Some(text) = prompt.as_str() {
        return Ok(Prompt::Text {
            text: text.to_string(),
            special: true,
        });
    }
    if prompt.kind() != ValueKind::Seq {
        return Err(Unrendered::Shape(
            "`prompt` must be a string or an array".into(),
        ));
    }
    let items: Vec<Value> = prompt.try_iter().map_err(shape)?.collect();
    match items.first().map(Value::kind) {
        Some(ValueKind::Number) => {
            let ids: Option<Vec<u32>> = items
                .iter()
                .map(|v| u32::try_from(v.clone()).ok())
                .collect();
            ids.map(Prompt::Ids)
                .ok_or_else(|| Unrendered::Shape("token ids must be integers".into()))
        }
        Some(_) => completion(&items[0]),
        None => Err(Unrendered::Shape("`prompt` must not be empty".into())),
    }
}

/// A responses request's `instructions` and `input` as chat messages.
fn responses_messages(body: &Value) -> Result<Value, Unrendered> {
    let mut messages = Vec::new();
    if let Some(instructions) = field(body, "instructions").as_str() {
        messages.push(Value::from_iter([
            ("role", "system"),
            ("content", instructions),
        ]));
    }
    let input = field(body, "input");
    if let Some(text) = input.as_str() {
        messages.push(Value::from_iter([("role", "user"), ("content", text)]));
        return Ok(Value::from(messages));
    }
    for item in input.try_iter().map_err(shape)? {
        let kind = field(&item, "type");
        match kind.as_str() {
            Some("function_call") => messages.push(Value::from_iter([
                ("role", Value::from("assistant")),
                ("content", Value::from("")),
                (
                    "tool_calls",
                    Value::from(vec![Value::from_iter([
                        ("id", field(&item, "call_id")),
                        ("type", Value::from("function")),
                        (
                            "function",
                            Value::from_iter([
                                ("name", field(&item, "name")),
                                ("arguments", field(&item, "arguments")),
                            ]),
                        ),
                    ])]),
                ),
            ])),
            Some("function_call_output") => messages.push(Value::from_iter([
                ("role", Value::from("tool")),
                ("tool_call_id", field(&item, "call_id")),
                ("content", field(&item, "output")),
            ])),
            _ => messages.push(item),
        }
    }
    Ok(Value::from(messages))
}

/// Responses `tools` (`{type, name, description, parameters}`) in the chat shape
/// (`{type, function: {name, description, parameters}}`).
fn responses_tools(tools: &Value) -> Value {
    let Ok(items) = tools.try_iter() else {
        return Value::from(());
    };
    let converted: Vec<Value> = items
        .map(|tool| {
            let function = Value::from_iter(
                ["name", "description", "parameters"]
                    .into_iter()
                    .map(|k| (k, field(&tool, k)))
                    .filter(|(_, v)| !v.is_undefined()),
            );
            Value::from_iter([("type", Value::from("function")), ("function", function)])
        })
        .collect();
    Value::from(converted)
}

/// `value[key]`, undefined when absent or when `value` is not a map.
fn field(value: &Value, key: &str) -> Value {
    value.get_attr(key).unwrap_or_default()
}

fn shape(e: minijinja::Error) -> Unrendered {
    Unrendered::Shape(e.to_string())
}
