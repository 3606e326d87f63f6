//! A model's tokenizer directory, as Hugging Face lays it out: `tokenizer.json` (the
//! tokenizer), `tokenizer_config.json` (its chat template and special tokens), and, when
//! present, `chat_template.jinja` (a template kept apart, which wins).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use minijinja::Value;
use serde_json::Value as Json;
use tokenizers::Tokenizer;

use crate::fast::{Fast, Pieces};
use crate::render::{Renderer, Unrendered};
use crate::template::Template;

/// Why a model directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read.
    #[error("cannot read {path}: {cause}")]
    Read { path: PathBuf, cause: String },
    /// A file is not what it should be.
    #[error("invalid {path}: {cause}")]
    Invalid { path: PathBuf, cause: String },
}

/// A loaded model: its tokenizer and how its chats are rendered.
pub struct Model {
    pub(crate) tokenizer: Tokenizer,
    /// The shortcut to the same ids, for a byte-level BPE tokenizer.
    fast: Option<Fast>,
    /// Whether its normalizer is none or a Unicode normal form (NFC, NFKC, ...), which
    /// leaves ASCII text as it is.
    ascii_unchanged: bool,
    pub(crate) renderer: Renderer,
    /// The ids of its added tokens (special or not): the tokenizer splits the text on
    /// these first, so tokenizing stops and restarts at each of them.
    pub(crate) added: HashSet<u32>,
}

impl Model {
    /// Loads the model in `dir`.
    pub fn load(dir: &Path) -> Result<Model, ModelError> {
        let path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&path).map_err(|e| ModelError::Invalid {
            path: path.clone(),
            cause: e.to_string(),
        })?;
        let config_path = dir.join("tokenizer_config.json");
        let config: Json = match std::fs::read_to_string(&config_path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| ModelError::Invalid {
                path: config_path.clone(),
                cause: e.to_string(),
            })?,
            Err(_) => Json::Null,
        };
        let source = template_source(dir, &config)?;
        let template = (source.as_ref())
            .map(|s| Template::new(s.clone()))
            .transpose()
            .map_err(|e| ModelError::Invalid {
                path: config_path.clone(),
                cause: format!("chat_template: {e}"),
            })?;
        let added = tokenizer.get_added_tokens_decoder().into_keys().collect();
        Ok(Model {
            fast: Fast::new(&tokenizer),
            ascii_unchanged: leaves_ascii(&tokenizer),
            renderer: Renderer {
                lists_content: source.as_deref().is_some_and(Template::lists_content),
                template,
                special_tokens: special_tokens(&config),
            },
            tokenizer,
            added,
        })
    }

    /// The ids of `text` (no special tokens added) and where its added tokens are: by the
    /// shortcut when the normalizer leaves `text` as it is, else by the tokenizer itself.
    pub(crate) fn pieces(&self, text: &str) -> Result<Pieces, Unrendered> {
        let unnormalized = self.tokenizer.get_normalizer().is_none();
        if let Some(fast) = self
            .fast
            .as_ref()
            .filter(|_| unnormalized || (self.ascii_unchanged && text.is_ascii()))
        {
            let model = self.tokenizer.get_model();
            return fast.encode(model, text).map_err(Unrendered::Tokenizer);
        }
        let encoding = (self.tokenizer.encode(text, false))
            .map_err(|e| Unrendered::Tokenizer(e.to_string()))?;
        let ids = encoding.get_ids().to_vec();
        let added = (ids.iter().zip(encoding.get_offsets()).enumerate())
            .filter(|(_, (id, _))| self.added.contains(id))
            .map(|(i, (_, &(from, _)))| (from, i))
            .collect();
        Ok(Pieces { ids, added })
    }

    /// The renderer of its requests.
    pub fn renderer(&self) -> &Renderer {
        &self.renderer
    }
}

/// Whether `tokenizer`'s normalizer leaves ASCII text as it is: none, or only a Unicode
/// normal form.
fn leaves_ascii(tokenizer: &Tokenizer) -> bool {
    let Some(normalizer) = tokenizer.get_normalizer() else {
        return true;
    };
    let kind = serde_json::to_value(normalizer)
        .ok()
        .and_then(|n| n["type"].as_str().map(str::to_string));
    matches!(kind.as_deref(), Some("NFC" | "NFD" | "NFKC" | "NFKD"))
}

/// The chat template: `chat_template.jinja` if present, else the config's `chat_template`
/// (a string, or a list of named templates of which `default` is taken).
fn template_source(dir: &Path, config: &Json) -> Result<Option<String>, ModelError> {
    let file = dir.join("chat_template.jinja");
    if let Ok(text) = std::fs::read_to_string(&file) {
        return Ok(Some(text));
    }
    Ok(match config.get("chat_template") {
        Some(Json::String(s)) => Some(s.clone()),
        Some(Json::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .or_else(|| named.first())
            .and_then(|t| t.get("template"))
            .and_then(Json::as_str)
            .map(str::to_string),
        _ => None,
    })
}

/// The special tokens the template sees, as transformers passes them.
fn special_tokens(config: &Json) -> Vec<(String, Value)> {
    let text = |v: &Json| -> Option<String> {
        match v {
            Json::String(s) => Some(s.clone()),
            Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
            _ => None,
        }
    };
    let mut out: Vec<(String, Value)> = ["bos_token", "eos_token", "unk_token", "pad_token"]
        .iter()
        .filter_map(|k| Some((k.to_string(), Value::from(text(config.get(*k)?)?))))
        .collect();
    if let Some(Json::Array(extra)) = config.get("additional_special_tokens") {
        let extra: Vec<String> = extra.iter().filter_map(text).collect();
        out.push(("additional_special_tokens".into(), Value::from(extra)));
    }
    out
}
