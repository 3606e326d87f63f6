//! A model's tokenizer directory, as Hugging Face lays it out: `tokenizer.json` (the
//! tokenizer), `tokenizer_config.json` (its chat template and special tokens), and, when
//! present, `chat_template.jinja` (a template kept apart, which wins).

use std::path::{Path, PathBuf};

use minijinja::Value;
use serde_json::Value as Json;
use tokenizers::Tokenizer;

use crate::fast::Fast;
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
        Ok(Model {
            fast: Fast::new(&tokenizer),
            ascii_unchanged: leaves_ascii(&tokenizer),
            renderer: Renderer {
                lists_content: source.as_deref().is_some_and(Template::lists_content),
                merges_inline_system: template.as_ref().is_none_or(Template::wants_system_first),
                template,
                special_tokens: special_tokens(&config),
            },
            tokenizer,
        })
    }

    /// The ids of `text` (no special tokens added): by the shortcut where it applies,
    /// else by the tokenizer itself.
    pub(crate) fn plain_ids(&self, text: &str) -> Result<Vec<u32>, Unrendered> {
        match self.shortcut(text) {
            Some(fast) => {
                (fast.encode(self.tokenizer.get_model(), text)).map_err(Unrendered::Tokenizer)
            }
            None => self.reference_ids(text),
        }
    }

    /// The ids of a `segment` holding no added token, appended to `ids`.
    pub(crate) fn segment_ids(&self, segment: &str, ids: &mut Vec<u32>) -> Result<(), Unrendered> {
        match self.shortcut(segment) {
            Some(fast) => (fast.segment(self.tokenizer.get_model(), segment, ids))
                .map_err(Unrendered::Tokenizer),
            None => {
                ids.extend(self.reference_ids(segment)?);
                Ok(())
            }
        }
    }

    /// The shortcut, when it gives the tokenizer's own ids for `text`: the tokenizer has
    /// the shape it handles, and its normalizer (if any) leaves `text` as it is.
    pub(crate) fn shortcut(&self, text: &str) -> Option<&Fast> {
        let unnormalized = self.tokenizer.get_normalizer().is_none();
        (self.fast.as_ref()).filter(|_| unnormalized || (self.ascii_unchanged && text.is_ascii()))
    }

    /// The added tokens of `text` (start, end, id), when the shortcut knows them.
    pub(crate) fn cuts<'t>(
        &'t self,
        text: &'t str,
    ) -> Option<impl Iterator<Item = (usize, usize, u32)> + 't> {
        self.fast.as_ref().map(|fast| fast.cuts(text))
    }

    /// `text`'s ids as the `tokenizers` crate's own pipeline gives them (no special tokens
    /// added): the road when the shortcut does not apply, and its reference in tests.
    #[doc(hidden)]
    pub fn reference_ids(&self, text: &str) -> Result<Vec<u32>, Unrendered> {
        let encoding = (self.tokenizer.encode_fast(text, false))
            .map_err(|e| Unrendered::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
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
