//! The simulator's prompt as a real model's engine sees it (`--tokenizer DIR`): the body
//! rendered with the model's own chat template (Hugging Face layout: `tokenizer.json`,
//! `tokenizer_config.json`) and tokenized with its tokenizer, as vLLM does.
//!
//! For: running the simulator's cache on the token ids a real engine would hold, so that
//! a router predicting tokens is checked against an engine that counts them itself.
//! Not for: sharing anything with the router's crates. This is a second, independent
//! implementation on the same public libraries (`tokenizers`, `minijinja`); where the two
//! disagree, the simulator's cache hits show it.

use std::path::Path;

use indexmap::IndexMap;
use minijinja::value::ValueKind;
use minijinja::{Environment, Error, ErrorKind, Value as Jinja};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokenizers::Tokenizer;

use crate::error::ApiError;
use crate::template::GenerationEndpoint;

/// A model's tokenizer and chat template.
pub struct HfModel {
    tokenizer: Tokenizer,
    env: Environment<'static>,
    /// `bos_token`, `eos_token`, ... for the template.
    special: IndexMap<String, OrderedJson>,
}

impl std::fmt::Debug for HfModel {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("HfModel")
    }
}

impl HfModel {
    /// Loads the model in `dir`.
    pub fn load(dir: &Path) -> anyhow::Result<HfModel> {
        let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| anyhow::anyhow!("{}: {e}", dir.join("tokenizer.json").display()))?;
        let config: Value = std::fs::read_to_string(dir.join("tokenizer_config.json"))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or(Value::Null);
        let template = std::fs::read_to_string(dir.join("chat_template.jinja"))
            .ok()
            .or_else(|| chat_template(&config))
            .ok_or_else(|| anyhow::anyhow!("{}: no chat template", dir.display()))?;
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", py_json);
        env.add_function("raise_exception", |m: String| -> Result<Jinja, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, m))
        });
        env.add_function("strftime_now", |_: String| "01 Jan 2026".to_string());
        env.add_template_owned("chat", template)?;
        let special = ["bos_token", "eos_token", "unk_token", "pad_token"]
            .iter()
            .filter_map(|k| {
                let v = config.get(*k)?;
                let text = v.as_str().or_else(|| v.get("content")?.as_str())?;
                Some((k.to_string(), OrderedJson::text(text)))
            })
            .collect();
        Ok(HfModel {
            tokenizer,
            env,
            special,
        })
    }

    /// The token ids the engine prefills for the body `raw` of `endpoint`.
    pub fn ids(&self, endpoint: GenerationEndpoint, raw: &[u8]) -> Result<Vec<u32>, ApiError> {
        let body: OrderedJson = serde_json::from_slice(raw)?;
        if let (GenerationEndpoint::Completions, Some(prompt)) = (endpoint, body.get("prompt")) {
            return self.completion(prompt);
        }
        let mut context = self.special.clone();
        context.insert(
            "messages".into(),
            OrderedJson::Array(messages(endpoint, &body)),
        );
        let generation = body.get("add_generation_prompt").cloned();
        context.insert(
            "add_generation_prompt".into(),
            generation.unwrap_or(OrderedJson::Bool(true)),
        );
        for key in ["tools", "documents"] {
            if let Some(v) = body.get(key).filter(|v| !matches!(v, OrderedJson::Null)) {
                context.insert(key.into(), v.clone());
            }
        }
        if let Some(OrderedJson::Object(extra)) = body.get("chat_template_kwargs") {
            context.extend(extra.clone());
        }
        let template = self.env.get_template("chat").map_err(render_error)?;
        let text = template.render(&context).map_err(render_error)?;
        self.encode(&text, false)
    }

    /// `/tokenize`: a chat's render or a completion's prompt, by which the body has.
    pub fn tokenize(&self, raw: &[u8]) -> Result<Vec<u32>, ApiError> {
        let body: OrderedJson = serde_json::from_slice(raw)?;
        match body.get("messages") {
            Some(_) => self.ids(GenerationEndpoint::Chat, raw),
            None => self.ids(GenerationEndpoint::Completions, raw),
        }
    }

    fn completion(&self, prompt: &OrderedJson) -> Result<Vec<u32>, ApiError> {
        let first = match prompt {
            OrderedJson::Array(items)
                if items.iter().all(|i| matches!(i, OrderedJson::Number(_))) =>
            {
                prompt
            }
            OrderedJson::Array(items) => items.first().unwrap_or(prompt),
            _ => prompt,
        };
        match first {
            OrderedJson::String(text) => self.encode(text, true),
            OrderedJson::Array(ids) => Ok(ids.iter().filter_map(OrderedJson::as_id).collect()),
            _ => Err(ApiError::invalid(
                "prompt",
                "prompt must be a string or token ids",
            )),
        }
    }

    fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, ApiError> {
        let encoding = (self.tokenizer.encode_fast(text, special))
            .map_err(|e| ApiError::invalid("prompt", format!("tokenizer: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }
}

/// JSON that keeps its objects' key order, as Python's `json.loads` does (the template's
/// `tojson` shows it).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(untagged)]
enum OrderedJson {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<OrderedJson>),
    Object(IndexMap<String, OrderedJson>),
}

impl OrderedJson {
    fn get(&self, key: &str) -> Option<&OrderedJson> {
        match self {
            OrderedJson::Object(map) => map.get(key),
            _ => None,
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            OrderedJson::String(s) => Some(s),
            _ => None,
        }
    }

    fn as_id(&self) -> Option<u32> {
        match self {
            OrderedJson::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
            _ => None,
        }
    }

    fn text(text: &str) -> OrderedJson {
        OrderedJson::String(text.to_string())
    }
}

fn chat_template(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(named) => named
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(str::to_string),
        _ => None,
    }
}

fn render_error(e: Error) -> ApiError {
    ApiError::invalid("messages", format!("chat template: {e}"))
}

/// The messages as vLLM hands them to the template: content parts joined (text parts,
/// `\n`), null content as "", tool-call arguments given as JSON text parsed. A responses
/// body becomes its `instructions` as a system message, then its `input`.
fn messages(endpoint: GenerationEndpoint, body: &OrderedJson) -> Vec<OrderedJson> {
    let message = |role: &str, text: &str| {
        OrderedJson::Object(IndexMap::from([
            ("role".to_string(), OrderedJson::text(role)),
            ("content".to_string(), OrderedJson::text(text)),
        ]))
    };
    let mut out = Vec::new();
    let list = match endpoint {
        GenerationEndpoint::Responses => {
            if let Some(text) = body.get("instructions").and_then(OrderedJson::as_str) {
                out.push(message("system", text));
            }
            match body.get("input") {
                Some(OrderedJson::String(text)) => vec![message("user", text)],
                Some(OrderedJson::Array(items)) => items.clone(),
                _ => Vec::new(),
            }
        }
        _ => match body.get("messages") {
            Some(OrderedJson::Array(items)) => items.clone(),
            _ => Vec::new(),
        },
    };
    out.extend(list.into_iter().map(normalize));
    out
}

fn normalize(mut message: OrderedJson) -> OrderedJson {
    let OrderedJson::Object(object) = &mut message else {
        return message;
    };
    let content = match object.get("content") {
        None | Some(OrderedJson::Null) => OrderedJson::text(""),
        Some(OrderedJson::Array(parts)) => OrderedJson::text(
            &(parts.iter())
                .filter_map(|p| p.get("text").and_then(OrderedJson::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        Some(other) => other.clone(),
    };
    object.insert("content".into(), content);
    if let Some(OrderedJson::Array(calls)) = object.get_mut("tool_calls") {
        for call in calls {
            let OrderedJson::Object(call) = call else {
                continue;
            };
            let Some(OrderedJson::Object(function)) = call.get_mut("function") else {
                continue;
            };
            let parsed = (function.get("arguments").and_then(OrderedJson::as_str))
                .and_then(|text| serde_json::from_str::<OrderedJson>(text).ok());
            if let Some(parsed) = parsed {
                function.insert("arguments".into(), parsed);
            }
        }
    }
    message
}

/// `tojson` as transformers defines it: Python's `json.dumps` (`", "` and `": "`
/// separators, non-ASCII kept, key order kept), optionally indented.
fn py_json(value: Jinja, indent: Option<usize>) -> Result<Jinja, Error> {
    let mut out = String::new();
    write_json(&value, indent, 0, &mut out)?;
    Ok(Jinja::from_safe_string(out))
}

fn write_json(
    value: &Jinja,
    indent: Option<usize>,
    depth: usize,
    out: &mut String,
) -> Result<(), Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let separator = if indent.is_some() { "," } else { ", " };
    let (open, close, map) = match value.kind() {
        ValueKind::Seq | ValueKind::Iterable => ('[', ']', false),
        ValueKind::Map => ('{', '}', true),
        ValueKind::None | ValueKind::Undefined => {
            out.push_str("null");
            return Ok(());
        }
        ValueKind::String => {
            out.push_str(&Value::from(value.as_str().unwrap_or_default()).to_string());
            return Ok(());
        }
        ValueKind::Bool => {
            out.push_str(if value.is_true() { "true" } else { "false" });
            return Ok(());
        }
        _ => {
            match f64::try_from(value.clone()) {
                Ok(f) if value.as_i64().is_none() => out.push_str(&py_float(f)),
                _ => out.push_str(&value.to_string()),
            }
            return Ok(());
        }
    };
    let items: Vec<Jinja> = value.try_iter()?.collect();
    out.push(open);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(separator);
        }
        newline(out, depth + 1);
        if map {
            write_json(item, None, 0, out)?;
            out.push_str(": ");
            write_json(&value.get_item(item)?, indent, depth + 1, out)?;
        } else {
            write_json(item, indent, depth + 1, out)?;
        }
    }
    if !items.is_empty() {
        newline(out, depth);
    }
    out.push(close);
    Ok(())
}

/// A float as Python's `repr` writes it: the shortest digits that read back, with an
/// exponent (`1e-05`) below 1e-4 and from 1e16, else positional with at least one decimal.
fn py_float(f: f64) -> String {
    if !f.is_finite() {
        return if f.is_nan() {
            "NaN"
        } else if f > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        }
        .into();
    }
    let scientific = format!("{f:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if f != 0.0 && !(-4..16).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exponent.abs());
    }
    let positional = format!("{f}");
    match positional.contains('.') {
        true => positional,
        false => format!("{positional}.0"),
    }
}
