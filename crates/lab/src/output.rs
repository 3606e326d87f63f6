//! The lab's outputs: one table row per run, and one SVG chart per scenario (the replay's
//! comparison chart). Times are virtual seconds, as a real fleet would see them.

use std::fmt::Write as _;

use prefix_router_replay::ReplayReport;
use prefix_router_replay::compare::{self, PolicyResult};

use super::LabResult;
use crate::world::FlowResult;

fn pct(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{:.1}%", v * 100.0))
}

fn secs(ms: Option<f64>) -> String {
    ms.map_or("-".into(), |ms| format!("{:.2}s", ms / 1000.0))
}

fn ratio(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.2}"))
}

/// Hit rate over the pooled finite bound.
pub fn of_finite(result: &LabResult) -> Option<f64> {
    let pooled = result.pooled_bound;
    result
        .report
        .hit_rate
        .filter(|_| pooled > 0.0)
        .map(|h| h / pooled)
}

/// A one-line summary of a report, and of each measured flow.
pub fn summary(report: &ReplayReport, pooled_bound: f64, flows: &[FlowResult]) -> String {
    let ttft = report.ttft_ms.as_ref();
    format!(
        "hit {} (pooled bound {}), TTFT p50 {} p99 {}, makespan {:.1}s, {} ok, {} failed",
        pct(report.hit_rate),
        pct(Some(pooled_bound)),
        secs(ttft.map(|p| p.p50)),
        secs(ttft.map(|p| p.p99)),
        report.elapsed_s,
        report.requests.ok,
        report.requests.failed
    ) + &measured(flows)
}

/// The measured flows' TTFT and hit rate, as a suffix of the summary.
fn measured(flows: &[FlowResult]) -> String {
    let mut out = String::new();
    for f in flows.iter().filter(|f| f.measured) {
        let ttft = f.ttft_ms.as_ref();
        let _ = write!(
            out,
            "; {} {}: TTFT p50 {} p99 {}, hit {}, {} shed",
            f.tenant,
            f.priority,
            ms(ttft.map(|t| t.p50)),
            ms(ttft.map(|t| t.p99)),
            pct(f.hit_rate),
            f.shed
        );
    }
    out
}

fn shares(report: &ReplayReport) -> String {
    let Some(backends) = &report.backends else {
        return "-".into();
    };
    let parts: Vec<String> = (backends.rows.iter())
        .map(|r| format!("{:.0}", r.request_share * 100.0))
        .collect();
    parts.join("/")
}

/// Every run as a fixed-width table.
pub fn table(results: &[LabResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<22} {:<16} {:>8} {:>7} {:>7} {:>8} {:>8} {:>8} {:>9} {:>7} {:>8} {:>8} {:>6} {:>6} {:>15} {:>9} {:>6}",
        "scenario",
        "policy",
        "hit",
        "bound",
        "of fin",
        "TTFT p50",
        "TTFT p90",
        "TTFT p99",
        "makespan",
        "req/s",
        "e2e p50",
        "e2e p99",
        "req im",
        "unc im",
        "req shares %",
        "KV evict",
        "failed"
    );
    for r in results {
        let (p, ttft, e2e) = (
            &r.report,
            r.report.ttft_ms.as_ref(),
            r.report.e2e_ms.as_ref(),
        );
        let backends = p.backends.as_ref();
        let _ = writeln!(
            out,
            "{:<22} {:<16} {:>8} {:>7} {:>7} {:>8} {:>8} {:>8} {:>9} {:>7} {:>8} {:>8} {:>6} {:>6} {:>15} {:>9} {:>6}",
            r.scenario,
            r.policy,
            pct(p.hit_rate),
            pct(Some(r.pooled_bound)),
            pct(of_finite(r)),
            secs(ttft.map(|t| t.p50)),
            secs(ttft.map(|t| t.p90)),
            secs(ttft.map(|t| t.p99)),
            format!("{:.1}s", p.elapsed_s),
            format!("{:.2}", p.throughput.requests_per_s),
            secs(e2e.map(|t| t.p50)),
            secs(e2e.map(|t| t.p99)),
            ratio(backends.and_then(|b| b.request_imbalance)),
            ratio(backends.and_then(|b| b.uncached_imbalance)),
            shares(p),
            r.kv_evicted_blocks,
            p.requests.failed
        );
    }
    if results.iter().any(|r| !r.flows.is_empty()) {
        out.push('\n');
        out.push_str(&flows_table(results));
    }
    out
}

/// Each flow of each run with flows, measured flows marked `*`.
fn flows_table(results: &[LabResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<22} {:<16} {:<8} {:<8} {:>6} {:>6} {:>9} {:>8} {:>8} {:>10} {:>10} {:>7}",
        "scenario",
        "policy",
        "tenant",
        "priority",
        "ok",
        "shed",
        "preempted",
        "TTFT p50",
        "TTFT p99",
        "first max",
        "later p99",
        "hit"
    );
    for r in results {
        for f in &r.flows {
            let ttft = f.ttft_ms.as_ref();
            let _ = writeln!(
                out,
                "{:<22} {:<16} {:<8} {:<8} {:>6} {:>6} {:>9} {:>8} {:>8} {:>10} {:>10} {:>7}",
                r.scenario,
                r.policy,
                format!("{}{}", f.tenant, if f.measured { "*" } else { "" }),
                f.priority,
                f.ok,
                f.shed,
                f.preempted,
                ms(ttft.map(|t| t.p50)),
                ms(ttft.map(|t| t.p99)),
                ms(f.first_turn_max_ms),
                ms(f.later_turns_p99_ms),
                pct(f.hit_rate),
            );
        }
    }
    out
}

fn ms(ms: Option<f64>) -> String {
    ms.map_or("-".into(), |ms| format!("{ms:.0}ms"))
}

/// One SVG chart per scenario, in order: (scenario, chart).
pub fn svg(results: &[LabResult]) -> Vec<(String, String)> {
    let mut charts: Vec<(String, Vec<PolicyResult>)> = Vec::new();
    for r in results {
        let entry = PolicyResult {
            policy: r.policy.clone(),
            report: r.report.clone(),
        };
        match charts.iter_mut().find(|(name, _)| *name == r.scenario) {
            Some((_, list)) => list.push(entry),
            None => charts.push((r.scenario.clone(), vec![entry])),
        }
    }
    charts
        .into_iter()
        .map(|(name, list)| (name, compare::svg(&list, 1.0)))
        .collect()
}
