//! Token mode: the models whose tokenizer directory is configured have their prompts
//! rendered with the model's chat template and tokenized as the engine will prefill them
//! (`prefix-router-tokens`), and the index keys on blocks of 16 token ids. A body the
//! template cannot render is routed on its text, counted by reason; nothing fails for it.
//! Models without a tokenizer stay in text mode, at text mode's cost.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use prefix_router_core::request::Endpoint;
use prefix_router_tokens::{Model, ModelError, TokenCache, Tokenized, Unrendered};

pub use metrics::TokenMetrics;

mod metrics;

/// Bodies up to this size are tokenized on the request's own thread; larger ones on the
/// blocking pool, so that a long prompt never seen (about 0.13 ms per KB) does not hold up
/// the other requests of its thread.
const INLINE_BYTES: usize = 16 * 1024;

/// Which models are tokenized, and how much the token cache may hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenSettings {
    /// The tokenizer of every model without one of its own (`--tokenizer`, for a fleet
    /// serving one model). Default none.
    pub default: Option<PathBuf>,
    /// Tokenizer directories by served model name (`[tokenizers]` in the config file).
    /// Default none.
    pub models: BTreeMap<String, PathBuf>,
    /// Bytes the token cache (the ids of the prompt segments seen) may hold (LRU).
    /// Default 256 MiB.
    pub cache_bytes: usize,
}

impl Default for TokenSettings {
    fn default() -> Self {
        TokenSettings {
            default: None,
            models: BTreeMap::new(),
            cache_bytes: 256 << 20,
        }
    }
}

/// The loaded tokenizers and the token cache.
pub struct Tokenizers {
    models: HashMap<Vec<u8>, Arc<Model>>,
    default: Option<Arc<Model>>,
    cache: Arc<TokenCache>,
    metrics: TokenMetrics,
}

/// What became of one prompt.
pub enum Tokenizing {
    /// Its model has no tokenizer: text mode, not counted.
    Untokenized,
    /// Rendered and tokenized.
    Tokenized(Tokenized),
    /// Not rendered, for this reason: text mode.
    Unrendered(Unrendered),
}

impl Tokenizers {
    /// Loads every configured tokenizer (a directory used twice is loaded once); `metrics`
    /// count what becomes of the prompts.
    pub fn load(settings: &TokenSettings, metrics: TokenMetrics) -> Result<Tokenizers, ModelError> {
        let mut loaded: HashMap<PathBuf, Arc<Model>> = HashMap::new();
        let mut load = |dir: &PathBuf| -> Result<Arc<Model>, ModelError> {
            if let Some(model) = loaded.get(dir) {
                return Ok(Arc::clone(model));
            }
            let model = Arc::new(Model::load(dir)?);
            loaded.insert(dir.clone(), Arc::clone(&model));
            Ok(model)
        };
        let default = settings.default.as_ref().map(&mut load).transpose()?;
        let models = (settings.models.iter())
            .map(|(name, dir)| Ok((name.as_bytes().to_vec(), load(dir)?)))
            .collect::<Result<_, ModelError>>()?;
        Ok(Tokenizers {
            models,
            default,
            cache: Arc::new(TokenCache::new(settings.cache_bytes)),
            metrics,
        })
    }

    /// No tokenizer at all: every prompt in text mode.
    pub fn none(metrics: TokenMetrics) -> Tokenizers {
        Tokenizers {
            models: HashMap::new(),
            default: None,
            cache: Arc::new(TokenCache::new(0)),
            metrics,
        }
    }

    /// Whether any model is tokenized.
    pub fn any(&self) -> bool {
        self.default.is_some() || !self.models.is_empty()
    }

    /// The tokenizer of `model` (the body's `model` field, as its JSON bytes).
    pub fn model(&self, model: &[u8]) -> Option<&Arc<Model>> {
        self.models.get(model).or(self.default.as_ref())
    }

    /// Counts what became of a prompt that was routed (not one only explained).
    pub fn count(&self, tokenizing: &Tokenizing) {
        self.metrics.prompt(tokenizing);
    }

    /// Sets the gauges of the token cache.
    pub fn set_gauges(&self) {
        (self.metrics).set_cache(self.cache.bytes(), self.cache.len());
    }

    /// Renders and tokenizes `body` of `endpoint` for `model`, taking from the cache the
    /// segments it holds (earlier turns, shared system prompts and tools).
    pub async fn tokenize(&self, endpoint: Endpoint, body: &Bytes, model: &[u8]) -> Tokenizing {
        let Some(model) = self.model(model) else {
            return Tokenizing::Untokenized;
        };
        let result = if body.len() <= INLINE_BYTES {
            encode(model, endpoint, body, &self.cache)
        } else {
            let (model, cache, body) = (Arc::clone(model), Arc::clone(&self.cache), body.clone());
            let work = move || encode(&model, endpoint, &body, &cache);
            match tokio::task::spawn_blocking(work).await {
                Ok(result) => result,
                Err(e) => Err(Unrendered::Tokenizer(e.to_string())),
            }
        };
        match result {
            Ok(tokenized) => Tokenizing::Tokenized(tokenized),
            Err(why) => Tokenizing::Unrendered(why),
        }
    }
}

fn encode(
    model: &Model,
    endpoint: Endpoint,
    body: &[u8],
    cache: &TokenCache,
) -> Result<Tokenized, Unrendered> {
    let prompt = model.renderer().prompt(endpoint, body)?;
    model.encode(&prompt, cache)
}
