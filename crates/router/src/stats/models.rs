//! Requests and hit rates by model: the hit rate the router predicted (routing text the
//! chosen backend was believed to hold, of all routed) and the one the backends delivered
//! (cached prompt tokens, of all), per model. The label is the request's model when its
//! backend lists it (or its static pool has it), else `other`: the labels are bounded by
//! what the backends serve, never by what clients send.

use prefix_router_core::units::TextBytes;
use prometheus::IntCounterVec;

use super::{Registry, Usage};

/// The label of requests for models no backend they went to lists.
pub const OTHER: &str = "other";

/// The per-model metrics.
pub struct ModelMetrics {
    requests: IntCounterVec,
    matched_bytes: IntCounterVec,
    text_bytes: IntCounterVec,
    prompt_tokens: IntCounterVec,
    cached_tokens: IntCounterVec,
}

/// One routed request's exchange, as the model metrics count it.
pub struct ModelExchange {
    /// Its status (0: none sent).
    pub status: u16,
    /// Routing text the backend was believed to hold, and all of it.
    pub matched: TextBytes,
    /// All of its routing text.
    pub text: TextBytes,
    /// The usage the backend reported.
    pub usage: Option<Usage>,
}

impl ModelMetrics {
    /// Registers them in `registry`.
    pub fn new(registry: &Registry) -> Self {
        let r = registry;
        let per_model = |short, help| r.counter_vec(short, help, &["model"]);
        ModelMetrics {
            requests: r.counter_vec(
                "model_requests_total",
                "Routed requests by model and status",
                &["model", "status"],
            ),
            matched_bytes: per_model(
                "model_matched_bytes_total",
                "Routing text the chosen backend was believed to hold, by model",
            ),
            text_bytes: per_model("model_text_bytes_total", "Routing text routed, by model"),
            prompt_tokens: per_model(
                "model_prompt_tokens_total",
                "Prompt tokens backends reported, by model",
            ),
            cached_tokens: per_model(
                "model_cached_tokens_total",
                "Cached prompt tokens backends reported, by model",
            ),
        }
    }

    /// Counts `exchange`, a request for `model` (a label: a listed name or [`OTHER`]).
    pub fn count(&self, model: &str, exchange: ModelExchange) {
        let status = exchange.status.to_string();
        self.requests.with_label_values(&[model, &status]).inc();
        let model = [model];
        (self.matched_bytes.with_label_values(&model)).inc_by(exchange.matched.0 as u64);
        (self.text_bytes.with_label_values(&model)).inc_by(exchange.text.0 as u64);
        if let Some(usage) = exchange.usage {
            (self.prompt_tokens.with_label_values(&model)).inc_by(usage.prompt);
            (self.cached_tokens.with_label_values(&model)).inc_by(usage.cached);
        }
    }
}
