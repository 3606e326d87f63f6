//! Several runs of one workload side by side (one per policy, in the demo and the lab): a
//! text table and an SVG bar chart of hit rate and TTFT. Latencies are shown in trace time
//! (measured wall time times the speedup), so they read as what a real fleet would see.

use std::fmt::Write as _;

use serde::Serialize;

use super::{Percentiles, ReplayReport};

/// One policy's result.
#[derive(Serialize)]
pub struct PolicyResult {
    /// The policy.
    pub policy: String,
    /// The run's report.
    pub report: ReplayReport,
}

fn pct(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{:.1}%", v * 100.0))
}

fn secs(p: Option<&Percentiles>, pick: fn(&Percentiles) -> f64, speedup: f64) -> String {
    p.map_or("-".into(), |p| {
        format!("{:.2}s", pick(p) * speedup / 1000.0)
    })
}

fn ratio(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.2}"))
}

fn of_finite(report: &ReplayReport) -> Option<f64> {
    let pooled = report.bound.pooled?.hit_rate;
    report.hit_rate.filter(|_| pooled > 0.0).map(|h| h / pooled)
}

fn imbalance(report: &ReplayReport) -> (Option<f64>, Option<f64>) {
    let backends = report.backends.as_ref();
    (
        backends.and_then(|b| b.request_imbalance),
        backends.and_then(|b| b.uncached_imbalance),
    )
}

/// The comparison as a fixed-width table.
pub fn table(results: &[PolicyResult], speedup: f64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7}",
        "policy",
        "hit rate",
        "of bound",
        "of finite",
        "TTFT p50",
        "TTFT p90",
        "TTFT p99",
        "e2e p50",
        "req imbal",
        "unc imbal",
        "failed"
    );
    for r in results {
        let (requests, uncached) = imbalance(&r.report);
        let _ = writeln!(
            out,
            "{:<16} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7}",
            r.policy,
            pct(r.report.hit_rate),
            pct(r.report.hit_rate_of_bound),
            pct(of_finite(&r.report)),
            secs(r.report.ttft_ms.as_ref(), |p| p.p50, speedup),
            secs(r.report.ttft_ms.as_ref(), |p| p.p90, speedup),
            secs(r.report.ttft_ms.as_ref(), |p| p.p99, speedup),
            secs(r.report.e2e_ms.as_ref(), |p| p.p50, speedup),
            ratio(requests),
            ratio(uncached),
            r.report.requests.failed,
        );
    }
    let _ = write!(
        out,
        "(of bound: of one infinite cache; of finite: of the fleet's KV pooled into one LRU cache;\n latencies in trace time: measured x {speedup}; imbalance = max/mean over backends)"
    );
    out
}

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 460.0;
const TOP: f64 = 70.0;
const BOTTOM: f64 = 350.0;
const COLORS: [&str; 3] = ["#4e79a7", "#f28e2b", "#e15759"];

/// One panel of bars: `series` (label, value per policy), scaled to `max`, with a `line`
/// across it (its value and label), if any.
struct Panel<'a> {
    title: &'a str,
    left: f64,
    width: f64,
    max: f64,
    unit: &'a str,
    series: Vec<(&'a str, Vec<f64>)>,
    line: Option<(f64, String)>,
}

/// The comparison as an SVG chart: hit rate on the left, with the workload's bound as a
/// line (the fleet's KV pooled into one LRU cache where it is known, else one infinite
/// cache), and TTFT p50 and p99 on the right.
pub fn svg(results: &[PolicyResult], speedup: f64) -> String {
    let names: Vec<&str> = results.iter().map(|r| r.policy.as_str()).collect();
    let hit: Vec<f64> = results
        .iter()
        .map(|r| r.report.hit_rate.unwrap_or(0.0) * 100.0)
        .collect();
    let ttft = |pick: fn(&Percentiles) -> f64| -> Vec<f64> {
        let value = |r: &PolicyResult| r.report.ttft_ms.as_ref().map_or(0.0, pick);
        results
            .iter()
            .map(|r| value(r) * speedup / 1000.0)
            .collect()
    };
    let (p50, p99) = (ttft(|p| p.p50), ttft(|p| p.p99));
    let ttft_max = p99
        .iter()
        .chain(&p50)
        .copied()
        .fold(0.0, f64::max)
        .max(1e-3)
        * 1.15;
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="24" text-anchor="middle" font-size="16">prefix-router: policies compared on the same workload</text>
"#,
        WIDTH / 2.0
    );
    let panels = [
        Panel {
            title: "prefix cache hit rate (% of prompt tokens)",
            left: 40.0,
            width: 380.0,
            max: 100.0,
            unit: "%",
            series: vec![("hit rate", hit)],
            line: bound(results),
        },
        Panel {
            title: "time to first token (s, trace time)",
            left: 490.0,
            width: 380.0,
            max: ttft_max,
            unit: "s",
            series: vec![("p50", p50), ("p99", p99)],
            line: None,
        },
    ];
    for panel in &panels {
        draw_panel(&mut out, panel, &names);
    }
    out.push_str("</svg>\n");
    out
}

/// The workload's best hit rate, %, and what it is the best of.
fn bound(results: &[PolicyResult]) -> Option<(f64, String)> {
    let bound = &results.first()?.report.bound;
    Some(match bound.pooled {
        Some(pooled) => (
            pooled.hit_rate * 100.0,
            "bound (the fleet's KV pooled)".into(),
        ),
        None => (bound.hit_rate * 100.0, "bound (one infinite cache)".into()),
    })
}

fn draw_panel(out: &mut String, panel: &Panel, names: &[&str]) {
    let center = panel.left + panel.width / 2.0;
    let _ = writeln!(
        out,
        r#"<text x="{center}" y="{}" text-anchor="middle" font-size="13">{}</text>"#,
        TOP - 20.0,
        panel.title
    );
    let _ = writeln!(
        out,
        r#"<line x1="{0}" y1="{BOTTOM}" x2="{1}" y2="{BOTTOM}" stroke="black"/>"#,
        panel.left,
        panel.left + panel.width
    );
    let group = panel.width / names.len().max(1) as f64;
    let bar = group * 0.7 / panel.series.len() as f64;
    for (g, name) in names.iter().enumerate() {
        let x0 = panel.left + g as f64 * group + group * 0.15;
        let (x, y) = (panel.left + (g as f64 + 0.5) * group, BOTTOM + 14.0);
        let _ = writeln!(
            out,
            r#"<text x="{x:.1}" y="{y}" text-anchor="end" transform="rotate(-30 {x:.1} {y})">{name}</text>"#,
        );
        for (s, (_, values)) in panel.series.iter().enumerate() {
            let value = values.get(g).copied().unwrap_or(0.0);
            draw_bar(
                out,
                x0 + s as f64 * bar,
                bar * 0.92,
                value,
                panel,
                COLORS[s % COLORS.len()],
            );
        }
    }
    if let Some((value, label)) = &panel.line {
        draw_line(out, *value, label, panel);
    }
    if panel.series.len() > 1 {
        for (s, (label, _)) in panel.series.iter().enumerate() {
            let x = panel.left + s as f64 * 70.0;
            let _ = writeln!(
                out,
                r#"<rect x="{x}" y="{}" width="10" height="10" fill="{}"/><text x="{}" y="{}">{label}</text>"#,
                BOTTOM + 84.0,
                COLORS[s],
                x + 14.0,
                BOTTOM + 93.0
            );
        }
    }
}

/// A dashed line across `panel` at `value`, and its legend under the panel.
fn draw_line(out: &mut String, value: f64, label: &str, panel: &Panel) {
    let y = BOTTOM - (value / panel.max).clamp(0.0, 1.0) * (BOTTOM - TOP);
    let (left, legend) = (panel.left, BOTTOM + 89.0);
    let _ = writeln!(
        out,
        r##"<line x1="{left}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#333" stroke-dasharray="6 4"/>"##,
        left + panel.width,
    );
    let _ = writeln!(
        out,
        r##"<line x1="{left}" y1="{legend}" x2="{}" y2="{legend}" stroke="#333" stroke-dasharray="6 4"/><text x="{}" y="{}">{label}: {value:.1}%</text>"##,
        left + 24.0,
        left + 30.0,
        legend + 4.0
    );
}

fn draw_bar(out: &mut String, x: f64, width: f64, value: f64, panel: &Panel, color: &str) {
    let height = (value / panel.max).clamp(0.0, 1.0) * (BOTTOM - TOP);
    let y = BOTTOM - height;
    let label = if panel.unit == "%" {
        format!("{value:.1}%")
    } else {
        format!("{value:.2}s")
    };
    let _ = writeln!(
        out,
        r#"<rect x="{x:.1}" y="{y:.1}" width="{width:.1}" height="{height:.1}" fill="{color}"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11">{label}</text>"#,
        x + width / 2.0,
        y - 4.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_are_slanted_and_the_bound_is_a_dashed_line() {
        let panel = Panel {
            title: "hit rate",
            left: 40.0,
            width: 380.0,
            max: 100.0,
            unit: "%",
            series: vec![("hit rate", vec![45.0, 87.0])],
            line: Some((92.5, "bound".into())),
        };
        let mut out = String::new();
        draw_panel(&mut out, &panel, &["consistent_hash", "kv_aware"]);
        assert_eq!(out.matches("rotate(-30").count(), 2, "{out}");
        assert!(out.contains(r#"stroke-dasharray="6 4""#), "{out}");
        assert!(out.contains("bound: 92.5%"), "{out}");
        let y = BOTTOM - 0.925 * (BOTTOM - TOP);
        assert!(
            out.contains(&format!(r#"y1="{y:.1}""#)),
            "at 92.5% of the axis"
        );
    }
}
