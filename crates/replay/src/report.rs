//! Aggregating outcomes into a [`ReplayReport`]: counts, token-weighted hit rate,
//! latency percentiles, throughput and per-backend shares.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::bound::Bound;
use super::driver::{RequestOutcome, RunResult};
use super::metrics::{self, VllmCounters};

/// Results of one replay run (serialized as the `--out` JSON file).
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// Base URL targeted.
    pub target: String,
    /// What was replayed (trace path or synthetic workload).
    pub workload: String,
    /// Whether responses were streamed (TTFT is only measured then).
    pub stream: bool,
    /// `--concurrency`.
    pub concurrency: usize,
    /// `--speedup`.
    pub speedup: f64,
    /// Request counts.
    pub requests: Requests,
    /// Wall time of the run, seconds.
    pub elapsed_s: f64,
    /// Token totals from the responses' `usage`.
    pub tokens: Tokens,
    /// Σ cached_tokens / Σ prompt_tokens over responses reporting cached tokens.
    pub hit_rate: Option<f64>,
    /// Best possible hit rate over the requests actually sent (see `bound`).
    pub bound: Bound,
    /// `hit_rate / bound.hit_rate`.
    pub hit_rate_of_bound: Option<f64>,
    /// Time to first token, ms (streaming only; null otherwise).
    pub ttft_ms: Option<Percentiles>,
    /// Send to end of answer, ms, successful requests.
    pub e2e_ms: Option<Percentiles>,
    /// How late requests were sent versus their schedule, ms.
    pub send_lag_ms: Option<Percentiles>,
    /// Rates over `elapsed_s`.
    pub throughput: Throughput,
    /// Per-backend shares from response attribution (`x-sim-instance` or `system_fingerprint`).
    pub backends: Option<Backends>,
    /// Per-backend shares from `/metrics` deltas (`--backend-metrics`).
    pub backend_metrics: Option<Backends>,
    /// Why the after-run metrics scrape failed, if it did.
    pub backend_metrics_error: Option<String>,
}

/// Request counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Requests {
    /// Requests in the workload.
    pub planned: u64,
    /// Requests sent.
    pub sent: u64,
    /// 2xx answers read to the end.
    pub ok: u64,
    /// Everything else.
    pub failed: u64,
    /// Failures by kind (`connect`, `timeout`, `http_503`, `stream_incomplete`, ...).
    pub errors: BTreeMap<String, u64>,
    /// Successful answers without `usage`.
    pub ok_without_usage: u64,
    /// Successful answers with `usage` but no `prompt_tokens_details.cached_tokens`.
    pub ok_without_cached_tokens: u64,
}

/// Token totals over successful responses with usage.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Tokens {
    /// Σ `usage.prompt_tokens`.
    pub prompt: u64,
    /// Σ `cached_tokens`.
    pub cached: u64,
    /// Σ `usage.completion_tokens`.
    pub completion: u64,
}

/// Nearest-rank percentiles, milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
    /// Number of samples.
    pub count: u64,
}

/// Rates over the run's wall time.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Throughput {
    /// Successful requests per second.
    pub requests_per_s: f64,
    /// Prompt tokens per second.
    pub prompt_tokens_per_s: f64,
    /// Completion tokens per second.
    pub completion_tokens_per_s: f64,
}

/// Per-backend shares and their imbalance.
#[derive(Debug, Clone, Serialize)]
pub struct Backends {
    /// `response` or `metrics`.
    pub source: String,
    /// One row per backend, by name.
    pub rows: Vec<BackendRow>,
    /// Successful requests no backend could be named for (response source).
    pub unattributed_requests: u64,
    /// max / mean of requests per backend.
    pub request_imbalance: Option<f64>,
    /// max / mean of uncached prompt tokens per backend.
    pub uncached_imbalance: Option<f64>,
}

/// One backend's totals.
#[derive(Debug, Clone, Serialize)]
pub struct BackendRow {
    /// Instance name or `host:port`.
    pub name: String,
    /// Successful requests it served.
    pub requests: u64,
    /// Its share of all attributed requests, 0..=1.
    pub request_share: f64,
    /// Prompt tokens it received.
    pub prompt_tokens: u64,
    /// Of which served from its cache.
    pub cached_tokens: u64,
    /// `prompt_tokens - cached_tokens` (the prefill work it did).
    pub uncached_prompt_tokens: u64,
    /// Its share of all uncached prompt tokens, 0..=1.
    pub uncached_share: f64,
    /// Its own hit rate (metrics source: hits / queries).
    pub hit_rate: Option<f64>,
}

/// Nearest-rank percentile of sorted `v` (`p` in 0..=100); `v` must be non-empty.
pub(crate) fn percentile(v: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Percentiles of `v` in ms, `None` when empty.
pub fn summarize(mut v: Vec<f64>) -> Option<Percentiles> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(Percentiles {
        p50: percentile(&v, 50.0),
        p90: percentile(&v, 90.0),
        p99: percentile(&v, 99.0),
        max: v[v.len() - 1],
        count: v.len() as u64,
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

/// Everything the report is built from besides the outcomes.
pub(crate) struct Context {
    pub(crate) target: String,
    pub(crate) workload: String,
    pub(crate) stream: bool,
    pub(crate) concurrency: usize,
    pub(crate) speedup: f64,
    pub(crate) planned: u64,
    pub(crate) bound: Bound,
    pub(crate) metrics: Option<Result<Backends, String>>,
    /// Backends behind the target, when known: those that answered nothing count as zero.
    pub(crate) backends: Option<usize>,
}

/// Builds the report of a run.
pub(crate) fn build(ctx: Context, run: &RunResult) -> ReplayReport {
    let (requests, tokens, cached_prompt) = count(&run.outcomes, ctx.planned);
    let elapsed_s = run.elapsed.as_secs_f64();
    let hit_rate = ratio(tokens.cached as f64, cached_prompt as f64);
    let ok = run.outcomes.iter().filter(|o| o.exchange.error.is_none());
    let per_s = |x: u64| ratio(x as f64, elapsed_s).unwrap_or(0.0);
    let (backend_metrics, backend_metrics_error) = match ctx.metrics {
        Some(Ok(b)) => (Some(b), None),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    };
    ReplayReport {
        target: ctx.target,
        workload: ctx.workload,
        stream: ctx.stream,
        concurrency: ctx.concurrency,
        speedup: ctx.speedup,
        hit_rate_of_bound: hit_rate.and_then(|h| ratio(h, ctx.bound.hit_rate)),
        bound: ctx.bound,
        hit_rate,
        ttft_ms: summarize(ok.clone().filter_map(|o| o.exchange.ttft.map(ms)).collect()),
        e2e_ms: summarize(ok.map(|o| ms(o.e2e)).collect()),
        send_lag_ms: summarize(run.outcomes.iter().map(|o| ms(o.lag)).collect()),
        throughput: Throughput {
            requests_per_s: per_s(requests.ok),
            prompt_tokens_per_s: per_s(tokens.prompt),
            completion_tokens_per_s: per_s(tokens.completion),
        },
        backends: from_responses(&run.outcomes, ctx.backends),
        backend_metrics,
        backend_metrics_error,
        requests,
        tokens,
        elapsed_s,
    }
}

/// Counts requests and tokens; also returns the prompt tokens of responses
/// that reported cached tokens (the hit rate's denominator).
fn count(outcomes: &[RequestOutcome], planned: u64) -> (Requests, Tokens, u64) {
    let mut r = Requests {
        planned,
        sent: outcomes.len() as u64,
        ..Requests::default()
    };
    let (mut t, mut cached_prompt) = (Tokens::default(), 0);
    for o in outcomes {
        if let Some(kind) = &o.exchange.error {
            r.failed += 1;
            *r.errors.entry(kind.clone()).or_default() += 1;
            continue;
        }
        r.ok += 1;
        let Some(u) = o.exchange.usage else {
            r.ok_without_usage += 1;
            continue;
        };
        t.prompt += u.prompt_tokens;
        t.completion += u.completion_tokens;
        match u.cached_tokens {
            Some(c) => {
                t.cached += c;
                cached_prompt += u.prompt_tokens;
            }
            None => r.ok_without_cached_tokens += 1,
        }
    }
    (r, t, cached_prompt)
}

/// Shares by the backend each successful response named; `None` if none did. With the
/// fleet's size known, backends that answered nothing appear as empty rows (and count in
/// the imbalance).
fn from_responses(outcomes: &[RequestOutcome], fleet: Option<usize>) -> Option<Backends> {
    let mut by_name: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    let mut unattributed = 0;
    for o in outcomes.iter().filter(|o| o.exchange.error.is_none()) {
        let Some(name) = o.exchange.backend.as_deref() else {
            unattributed += 1;
            continue;
        };
        let e = by_name.entry(name).or_default();
        let u = o.exchange.usage.unwrap_or_default();
        e.0 += 1;
        e.1 += u.prompt_tokens;
        e.2 += u.cached_tokens.unwrap_or(0);
    }
    if by_name.is_empty() {
        return None;
    }
    let mut rows: Vec<BackendRow> = by_name
        .into_iter()
        .map(|(n, (req, p, c))| row(n.to_owned(), req, p, c, ratio(c as f64, p as f64)))
        .collect();
    let silent = fleet.unwrap_or(0).saturating_sub(rows.len());
    rows.extend((1..=silent).map(|i| row(format!("(answered nothing #{i})"), 0, 0, 0, None)));
    Some(with_shares("responses", rows, unattributed))
}

/// Shares from `/metrics` deltas (`after - before`, one per backend URL).
pub(crate) fn from_metrics(
    urls: &[String],
    before: &[VllmCounters],
    after: &[VllmCounters],
) -> Backends {
    let rows = urls
        .iter()
        .zip(before.iter().zip(after))
        .map(|(url, (b, a))| {
            let d = a.since(b);
            let hit = ratio(d.cache_hits, d.cache_queries);
            let (req, prompt, hits) = (
                d.requests as u64,
                d.prompt_tokens as u64,
                d.cache_hits as u64,
            );
            row(
                metrics::backend_name(url),
                req,
                prompt,
                hits.min(prompt),
                hit,
            )
        })
        .collect();
    with_shares("metrics", rows, 0)
}

fn row(name: String, requests: u64, prompt: u64, cached: u64, hit_rate: Option<f64>) -> BackendRow {
    BackendRow {
        name,
        requests,
        request_share: 0.0,
        prompt_tokens: prompt,
        cached_tokens: cached,
        uncached_prompt_tokens: prompt.saturating_sub(cached),
        uncached_share: 0.0,
        hit_rate,
    }
}

/// Fills in shares and max/mean imbalances.
fn with_shares(source: &str, mut rows: Vec<BackendRow>, unattributed: u64) -> Backends {
    let reqs: Vec<f64> = rows.iter().map(|r| r.requests as f64).collect();
    let unc: Vec<f64> = rows
        .iter()
        .map(|r| r.uncached_prompt_tokens as f64)
        .collect();
    let (req_total, unc_total) = (reqs.iter().sum::<f64>(), unc.iter().sum::<f64>());
    for r in &mut rows {
        r.request_share = ratio(r.requests as f64, req_total).unwrap_or(0.0);
        r.uncached_share = ratio(r.uncached_prompt_tokens as f64, unc_total).unwrap_or(0.0);
    }
    Backends {
        source: source.to_owned(),
        rows,
        unattributed_requests: unattributed,
        request_imbalance: imbalance(&reqs),
        uncached_imbalance: imbalance(&unc),
    }
}

/// max / mean, `None` when there is nothing to compare.
pub(crate) fn imbalance(v: &[f64]) -> Option<f64> {
    let max = v.iter().copied().fold(f64::NAN, f64::max);
    ratio(max, v.iter().sum::<f64>() / v.len() as f64)
}

/// Writes `outcomes` to `path` as JSON lines, in the order they were sent: session, turn,
/// `sent_ms` (from the start of the run), `ttft_ms`, `e2e_ms`, backend, prompt and cached
/// tokens, error.
pub fn write_outcomes(path: &std::path::Path, outcomes: &[RequestOutcome]) -> std::io::Result<()> {
    let mut order: Vec<&RequestOutcome> = outcomes.iter().collect();
    order.sort_by_key(|o| (o.sent, o.session, o.turn));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut text = String::new();
    for o in order {
        let e = &o.exchange;
        let line = serde_json::json!({
            "session": o.session,
            "turn": o.turn,
            "sent_ms": ms(o.sent),
            "ttft_ms": e.ttft.map(ms),
            "e2e_ms": ms(o.e2e),
            "backend": e.backend,
            "prompt_tokens": e.usage.as_ref().map(|u| u.prompt_tokens),
            "cached_tokens": e.usage.as_ref().and_then(|u| u.cached_tokens),
            "error": e.error,
        });
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(path, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 90.0), 90.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        let p = summarize(vec![3.0, 1.0, 2.0]).unwrap();
        assert_eq!(
            (p.p50, p.p90, p.p99, p.max, p.count),
            (2.0, 3.0, 3.0, 3.0, 3)
        );
        assert!(summarize(Vec::new()).is_none());
    }

    #[test]
    fn imbalance_is_max_over_mean() {
        assert_eq!(imbalance(&[1.0, 1.0]), Some(1.0));
        assert_eq!(imbalance(&[3.0, 1.0, 0.0, 0.0]), Some(3.0));
        assert_eq!(imbalance(&[0.0, 0.0]), None);
        assert_eq!(imbalance(&[]), None);
    }

    #[test]
    fn metrics_shares() {
        let before = vec![VllmCounters::default(); 2];
        let a = VllmCounters {
            requests: 30.0,
            prompt_tokens: 1000.0,
            cache_queries: 1000.0,
            cache_hits: 600.0,
        };
        let b = VllmCounters {
            requests: 10.0,
            prompt_tokens: 500.0,
            cache_queries: 500.0,
            cache_hits: 100.0,
        };
        let urls = vec!["http://a:1".to_owned(), "http://b:2".to_owned()];
        let m = from_metrics(&urls, &before, &[a, b]);
        assert_eq!(m.rows[0].name, "a:1");
        assert_eq!(m.rows[0].request_share, 0.75);
        assert_eq!(m.rows[1].uncached_prompt_tokens, 400);
        assert_eq!(m.request_imbalance, Some(1.5));
        assert_eq!(m.uncached_imbalance, Some(1.0));
        assert_eq!(m.rows[0].hit_rate, Some(0.6));
    }
}
