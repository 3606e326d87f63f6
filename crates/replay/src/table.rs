//! The human-readable form of a [`ReplayReport`].

use std::fmt::Write as _;

use super::report::{Backends, Percentiles, ReplayReport};

impl ReplayReport {
    /// The report as a plain-text table (for stdout).
    pub fn table(&self) -> String {
        let mut s = String::new();
        self.write_summary(&mut s);
        for b in [&self.backends, &self.backend_metrics]
            .into_iter()
            .flatten()
        {
            s.push('\n');
            write_backends(&mut s, b);
        }
        if let Some(e) = &self.backend_metrics_error {
            let _ = writeln!(s, "backend metrics: {e}");
        }
        s
    }

    fn write_summary(&self, s: &mut String) {
        let mode = if self.stream { "stream" } else { "no stream" };
        let _ = writeln!(
            s,
            "replay {} -> {}  [{mode}, concurrency {}, speedup {}]",
            self.workload, self.target, self.concurrency, self.speedup
        );
        let r = &self.requests;
        let _ = writeln!(
            s,
            "{:<13}sent {}/{}  ok {}  failed {}",
            "requests",
            int(r.sent),
            int(r.planned),
            int(r.ok),
            int(r.failed)
        );
        if !r.errors.is_empty() {
            let list: Vec<String> = r
                .errors
                .iter()
                .map(|(k, n)| format!("{k} {}", int(*n)))
                .collect();
            let _ = writeln!(s, "{:<13}{}", "errors", list.join(", "));
        }
        if r.ok_without_usage + r.ok_without_cached_tokens > 0 {
            let _ = writeln!(
                s,
                "{:<13}{} without usage, {} without cached_tokens",
                "note",
                int(r.ok_without_usage),
                int(r.ok_without_cached_tokens)
            );
        }
        self.write_rates(s);
    }

    fn write_rates(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "{:<13}{} of prompt tokens   bound {}   = {} of bound",
            "hit rate",
            pct(self.hit_rate),
            pct(Some(self.bound.hit_rate)),
            pct(self.hit_rate_of_bound)
        );
        if let Some(p) = self.bound.pooled {
            let _ = writeln!(
                s,
                "{:<13}{} with one LRU cache of {} tokens (the fleet's KV pooled)",
                "finite bound",
                pct(Some(p.hit_rate)),
                p.capacity_tokens
            );
        }
        let t = &self.tokens;
        let _ = writeln!(
            s,
            "{:<13}prompt {}  cached {}  completion {}",
            "tokens",
            int(t.prompt),
            int(t.cached),
            int(t.completion)
        );
        match &self.ttft_ms {
            Some(p) => latency(s, "TTFT ms", p, true),
            None => {
                let _ = writeln!(s, "{:<13}not measured (needs --stream)", "TTFT ms");
            }
        }
        if let Some(p) = &self.e2e_ms {
            latency(s, "e2e ms", p, true);
        }
        if let Some(p) = &self.send_lag_ms {
            latency(s, "send lag ms", p, false);
        }
        let tp = &self.throughput;
        let _ = writeln!(
            s,
            "{:<13}{:.1} req/s   {} prompt tok/s   {} completion tok/s   over {:.1} s",
            "throughput",
            tp.requests_per_s,
            int(tp.prompt_tokens_per_s.round() as u64),
            int(tp.completion_tokens_per_s.round() as u64),
            self.elapsed_s
        );
    }
}

fn latency(s: &mut String, label: &str, p: &Percentiles, p90: bool) {
    let mid = if p90 {
        format!("p90 {:.1}  ", p.p90)
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "{label:<13}p50 {:.1}  {mid}p99 {:.1}  max {:.1}",
        p.p50, p.p99, p.max
    );
}

fn write_backends(s: &mut String, b: &Backends) {
    let _ = writeln!(
        s,
        "{:<28}{:>10} {:>7} {:>15} {:>7} {:>7}",
        format!("backends (from {})", b.source),
        "requests",
        "share",
        "uncached tok",
        "share",
        "hit"
    );
    for r in &b.rows {
        let _ = writeln!(
            s,
            "{:<28}{:>10} {:>7} {:>15} {:>7} {:>7}",
            r.name,
            int(r.requests),
            pct(Some(r.request_share)),
            int(r.uncached_prompt_tokens),
            pct(Some(r.uncached_share)),
            pct(r.hit_rate)
        );
    }
    let f = |x: Option<f64>| x.map_or("-".to_owned(), |v| format!("{v:.2}"));
    let _ = writeln!(
        s,
        "{:<28}{:>10} {:>7} {:>15} {:>7}",
        "imbalance (max/mean)",
        "",
        f(b.request_imbalance),
        "",
        f(b.uncached_imbalance)
    );
    if b.unattributed_requests > 0 {
        let _ = writeln!(s, "unattributed requests: {}", int(b.unattributed_requests));
    }
}

/// `0.374` -> `37.4%`; `None` -> `-`.
fn pct(x: Option<f64>) -> String {
    x.map_or("-".to_owned(), |v| format!("{:.1}%", v * 100.0))
}

/// `1234567` -> `1,234,567`.
fn int(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_numbers() {
        assert_eq!(int(0), "0");
        assert_eq!(int(999), "999");
        assert_eq!(int(1000), "1,000");
        assert_eq!(int(1234567), "1,234,567");
        assert_eq!(pct(Some(0.3736)), "37.4%");
        assert_eq!(pct(None), "-");
    }
}
