//! Counters and gauges of one simulated instance, and their Prometheus text under vLLM's names.
//!
//! For: `/metrics` (so routers and dashboards that scrape vLLM work unchanged) and
//! [`SimStats`] for in-process callers. Lock-free atomics, written by the engine
//! task and read by anyone.
//! Not for: router-side metrics.
//!
//! Exported (labels `model_name`, `engine="0"` as vLLM v1):
//! `vllm:prefix_cache_queries_total` (prompt tokens looked up, one lookup per
//! admitted request), `vllm:prefix_cache_hits_total` (of which cached),
//! `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
//! `vllm:request_success_total` (finished requests; `finished_reason="length"`),
//! `vllm:num_requests_running`, `vllm:num_requests_waiting`,
//! `vllm:kv_cache_usage_perc` (pinned blocks / capacity, 0..1) and the histogram
//! `vllm:time_to_first_token_seconds` in *simulated* seconds (arrival to first
//! token, queueing included; with `--time-scale 1` simulated equals real).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Upper bounds of the TTFT histogram buckets, seconds (vLLM's).
const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// Name (after `vllm:`), type and help of each plain series, in [`Metrics::render`]'s value order.
const SERIES: [(&str, &str, &str); 8] = [
    (
        "prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
    ),
    (
        "prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
    ),
    (
        "prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
    ),
    (
        "generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
    ),
    (
        "request_success_total",
        "counter",
        "Count of successfully processed requests.",
    ),
    (
        "num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
    ),
    (
        "num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
    ),
    (
        "kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
    ),
];

/// A snapshot of one instance's counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimStats {
    /// Requests admitted (each is one prefix-cache lookup).
    pub requests: u64,
    /// Requests finished (all output generated).
    pub finished: u64,
    /// Prompt tokens of admitted requests (`vllm:prefix_cache_queries_total`).
    pub prompt_tokens: u64,
    /// Of those, tokens served from the prefix cache (`vllm:prefix_cache_hits_total`).
    pub cached_tokens: u64,
    /// Output tokens of finished requests.
    pub generation_tokens: u64,
    /// Requests running now.
    pub running: u64,
    /// Requests waiting now.
    pub waiting: u64,
    /// Pinned KV blocks / capacity now, 0..=1.
    pub kv_cache_usage: f64,
}

/// The live counters of one instance.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: AtomicU64,
    finished: AtomicU64,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    running: AtomicU64,
    waiting: AtomicU64,
    kv_usage_bits: AtomicU64,
    ttft_buckets: [AtomicU64; TTFT_BUCKETS.len()],
    ttft_count: AtomicU64,
    ttft_sum_us: AtomicU64,
}

impl Metrics {
    /// Records an admitted request's prefix-cache lookup.
    pub fn on_admitted(&self, prompt_tokens: usize, cached_tokens: usize) {
        self.requests.fetch_add(1, Relaxed);
        self.prompt_tokens.fetch_add(prompt_tokens as u64, Relaxed);
        self.cached_tokens.fetch_add(cached_tokens as u64, Relaxed);
    }

    /// Records a first token `ttft` simulated seconds after arrival.
    pub fn on_first_token(&self, ttft: f64) {
        if let Some(i) = TTFT_BUCKETS.iter().position(|&bound| ttft <= bound) {
            self.ttft_buckets[i].fetch_add(1, Relaxed);
        }
        self.ttft_count.fetch_add(1, Relaxed);
        self.ttft_sum_us
            .fetch_add((ttft.max(0.0) * 1e6) as u64, Relaxed);
    }

    /// Records a finished request.
    pub fn on_finished(&self, output_tokens: usize) {
        self.finished.fetch_add(1, Relaxed);
        self.generation_tokens
            .fetch_add(output_tokens as u64, Relaxed);
    }

    /// Sets the gauges.
    pub fn set_gauges(&self, running: usize, waiting: usize, kv_usage: f64) {
        self.running.store(running as u64, Relaxed);
        self.waiting.store(waiting as u64, Relaxed);
        self.kv_usage_bits.store(kv_usage.to_bits(), Relaxed);
    }

    /// The current values.
    pub fn snapshot(&self) -> SimStats {
        SimStats {
            requests: self.requests.load(Relaxed),
            finished: self.finished.load(Relaxed),
            prompt_tokens: self.prompt_tokens.load(Relaxed),
            cached_tokens: self.cached_tokens.load(Relaxed),
            generation_tokens: self.generation_tokens.load(Relaxed),
            running: self.running.load(Relaxed),
            waiting: self.waiting.load(Relaxed),
            kv_cache_usage: f64::from_bits(self.kv_usage_bits.load(Relaxed)),
        }
    }

    /// Prometheus text exposition (format 0.0.4) for `model`, on an instance whose KV cache
    /// has `kv_blocks` blocks of `block_tokens` tokens (vLLM's `cache_config_info`).
    pub fn render(&self, model: &str, kv_blocks: usize, block_tokens: usize) -> String {
        let s = self.snapshot();
        let labels = format!("model_name=\"{}\",engine=\"0\"", escape_label(model));
        let success = format!("{labels},finished_reason=\"length\"");
        let values = [
            s.prompt_tokens as f64,
            s.cached_tokens as f64,
            s.prompt_tokens as f64,
            s.generation_tokens as f64,
            s.finished as f64,
            s.running as f64,
            s.waiting as f64,
            s.kv_cache_usage,
        ];
        let mut out = String::with_capacity(4096);
        for (&(name, kind, help), value) in SERIES.iter().zip(values) {
            let labels = if name == "request_success_total" {
                &success
            } else {
                &labels
            };
            let _ = writeln!(out, "# HELP vllm:{name} {help}");
            let _ = writeln!(out, "# TYPE vllm:{name} {kind}");
            let _ = writeln!(out, "vllm:{name}{{{labels}}} {value:?}");
        }
        self.render_ttft(&mut out, &labels);
        let _ = writeln!(
            out,
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig"
        );
        let _ = writeln!(out, "# TYPE vllm:cache_config_info gauge");
        let _ = writeln!(
            out,
            "vllm:cache_config_info{{block_size=\"{block_tokens}\",cache_dtype=\"auto\",\
             enable_prefix_caching=\"True\",engine=\"0\",num_gpu_blocks=\"{kv_blocks}\"}} 1.0"
        );
        out
    }

    fn render_ttft(&self, out: &mut String, labels: &str) {
        let name = "vllm:time_to_first_token_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Histogram of time to first token in seconds (simulated time)."
        );
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0u64;
        for (bound, bucket) in TTFT_BUCKETS.iter().zip(&self.ttft_buckets) {
            cumulative += bucket.load(Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels},le=\"{bound:?}\"}} {:?}",
                cumulative as f64
            );
        }
        let count = self.ttft_count.load(Relaxed) as f64;
        let sum = self.ttft_sum_us.load(Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count:?}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {count:?}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum:?}");
    }
}

fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_vllm_names_and_values() {
        let m = Metrics::default();
        m.on_admitted(100, 64);
        m.on_first_token(0.03);
        m.on_finished(7);
        m.set_gauges(2, 3, 0.25);
        let text = m.render("m\"x", 26_250, 16);
        let labels = "{model_name=\"m\\\"x\",engine=\"0\"}";
        for line in [
            format!("vllm:prefix_cache_queries_total{labels} 100.0"),
            format!("vllm:prefix_cache_hits_total{labels} 64.0"),
            format!("vllm:generation_tokens_total{labels} 7.0"),
            format!("vllm:num_requests_running{labels} 2.0"),
            format!("vllm:num_requests_waiting{labels} 3.0"),
            format!("vllm:kv_cache_usage_perc{labels} 0.25"),
            "vllm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",engine=\"0\",le=\"0.02\"} 0.0".to_string(),
            "vllm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",engine=\"0\",le=\"0.04\"} 1.0".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        assert!(text.contains("vllm:request_success_total{model_name=\"m\\\"x\",engine=\"0\",finished_reason=\"length\"} 1.0"));
        assert_eq!(m.snapshot().cached_tokens, 64);
        assert!(text.contains("vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"0\",num_gpu_blocks=\"26250\"} 1.0"));
    }
}
