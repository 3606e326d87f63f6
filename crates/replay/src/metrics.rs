//! Reading vLLM's Prometheus `/metrics` from each backend before and after a
//! run, so per-backend shares can be computed when responses don't name the
//! backend that served them.
//!
//! Counters used (summed over all label sets): `vllm:request_success_total`,
//! `vllm:prompt_tokens_total`, `vllm:prefix_cache_queries_total` and
//! `vllm:prefix_cache_hits_total` (the last two count tokens).

use super::ReplayError;

/// vLLM counters of one backend (or their increase over a run).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct VllmCounters {
    /// `vllm:request_success_total`.
    pub requests: f64,
    /// `vllm:prompt_tokens_total`.
    pub prompt_tokens: f64,
    /// `vllm:prefix_cache_queries_total` (tokens looked up).
    pub cache_queries: f64,
    /// `vllm:prefix_cache_hits_total` (tokens found).
    pub cache_hits: f64,
}

impl VllmCounters {
    /// `self - before`, clamped at zero (a restarted backend resets counters).
    pub fn since(&self, before: &VllmCounters) -> VllmCounters {
        let d = |a: f64, b: f64| (a - b).max(0.0);
        VllmCounters {
            requests: d(self.requests, before.requests),
            prompt_tokens: d(self.prompt_tokens, before.prompt_tokens),
            cache_queries: d(self.cache_queries, before.cache_queries),
            cache_hits: d(self.cache_hits, before.cache_hits),
        }
    }
}

/// Parses Prometheus text exposition, summing the counters of interest;
/// `None` if the text has none of them (not a vLLM metrics page).
pub fn parse(text: &str) -> Option<VllmCounters> {
    let mut c = VllmCounters::default();
    let mut found = false;
    for line in text.lines() {
        let Some((name, value)) = sample(line) else {
            continue;
        };
        let slot = match name {
            "vllm:request_success_total" => &mut c.requests,
            "vllm:prompt_tokens_total" => &mut c.prompt_tokens,
            "vllm:prefix_cache_queries_total" => &mut c.cache_queries,
            "vllm:prefix_cache_hits_total" => &mut c.cache_hits,
            _ => continue,
        };
        found = true;
        if value.is_finite() {
            *slot += value;
        }
    }
    found.then_some(c)
}

/// Splits a sample line into metric name and value (labels and timestamp skipped).
fn sample(line: &str) -> Option<(&str, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let rest = &line[name_end..];
    let rest = if rest.starts_with('{') {
        skip_labels(rest)?
    } else {
        rest
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((name, value))
}

/// Skips `{...}`, honouring quoted label values with escapes.
fn skip_labels(s: &str) -> Option<&str> {
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in s.char_indices().skip(1) {
        match (quoted, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, false, '"') => quoted = !quoted,
            (false, _, '}') => return Some(&s[i + 1..]),
            _ => {}
        }
    }
    None
}

/// The metrics URL for a backend given as a base URL or a full `/metrics` URL.
pub fn metrics_url(backend: &str) -> String {
    let b = backend.trim_end_matches('/');
    let after_scheme = b.split_once("://").map_or(b, |(_, r)| r);
    if after_scheme.contains('/') {
        b.to_owned()
    } else {
        format!("{b}/metrics")
    }
}

/// A short display name for a backend URL (`host:port`).
pub fn backend_name(backend: &str) -> String {
    let after_scheme = backend.split_once("://").map_or(backend, |(_, r)| r);
    after_scheme
        .split('/')
        .next()
        .unwrap_or(after_scheme)
        .to_owned()
}

/// Fetches and parses one backend's counters.
pub(crate) async fn scrape(
    client: &reqwest::Client,
    backend: &str,
) -> Result<VllmCounters, ReplayError> {
    let url = metrics_url(backend);
    let err = |msg: String| ReplayError::Metrics {
        url: url.clone(),
        msg,
    };
    let resp = client
        .get(&url)
        .send()
        .await
        .map_err(|e| err(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(err(format!("HTTP {}", resp.status())));
    }
    let text = resp.text().await.map_err(|e| err(e.to_string()))?;
    parse(&text).ok_or_else(|| err("no vllm:* counters on the page".into()))
}

/// Scrapes every backend in order.
pub(crate) async fn scrape_all(
    client: &reqwest::Client,
    backends: &[String],
) -> Result<Vec<VllmCounters>, ReplayError> {
    let mut out = Vec::with_capacity(backends.len());
    for b in backends {
        out.push(scrape(client, b).await?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1200.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 300
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e9
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 7.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3.0 1712345678000
vllm:prefix_cache_queries_total{model_name="we}ird \"quote\" \\"} 1.5e+03
vllm:prefix_cache_hits_total 640
vllm:prefix_cache_hits_total_other 99
vllm:num_requests_running{model_name="m"} 4
"#;

    #[test]
    fn parses_vllm_counters() {
        let c = parse(TEXT).unwrap();
        assert_eq!(c.prompt_tokens, 1500.0);
        assert_eq!(c.requests, 10.0);
        assert_eq!(c.cache_queries, 1500.0);
        assert_eq!(c.cache_hits, 640.0);
    }

    #[test]
    fn rejects_pages_without_vllm_counters() {
        assert_eq!(parse("# nothing\nother_metric 1\n"), None);
        assert_eq!(parse("{\"id\":\"x\"}"), None);
    }

    #[test]
    fn deltas_clamp_at_zero() {
        let before = VllmCounters {
            requests: 5.0,
            prompt_tokens: 10.0,
            cache_queries: 1.0,
            cache_hits: 1.0,
        };
        let after = VllmCounters {
            requests: 8.0,
            prompt_tokens: 4.0,
            cache_queries: 3.0,
            cache_hits: 2.0,
        };
        let d = after.since(&before);
        assert_eq!(
            (d.requests, d.prompt_tokens, d.cache_queries, d.cache_hits),
            (3.0, 0.0, 2.0, 1.0)
        );
    }

    #[test]
    fn urls_and_names() {
        assert_eq!(
            metrics_url("http://backend-a:8000"),
            "http://backend-a:8000/metrics"
        );
        assert_eq!(metrics_url("http://h:1/"), "http://h:1/metrics");
        assert_eq!(
            metrics_url("http://h:1/custom/metrics"),
            "http://h:1/custom/metrics"
        );
        assert_eq!(backend_name("http://h:1/metrics"), "h:1");
    }
}
