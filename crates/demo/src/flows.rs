//! The flow-control scenarios, in real time on simulated backends small enough to saturate
//! (`--max-num-seqs` each) behind the router with a tenants file:
//!
//! - **noisy-neighbour**: tenant B's agent sessions alone, then beside tenant A, who keeps
//!   16 times B's requests in flight (equal weights);
//! - **priority**: sessions at `x-priority: high` alone, then beside `normal` and `low`
//!   floods that together keep twice the fleet's slots in flight, under a router queue
//!   of half the slots.
//!
//! Every flow of a run sends for the same `--scenario-seconds` (in-flight requests then
//! finish), so each report covers the time the others were sending. Each flow reports its
//! requests answered and shed, its TTFT p50 and p99, and its hit rate.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use prefix_router::config::{Config, Settings};
use prefix_router::serve::embedded::Embedded;
use prefix_router_replay::{ReplayArgs, ReplayReport, Synthetic, Workload, replay};
use prefix_router_sim::{SimConfig, SimHandle};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

use crate::{DemoArgs, free_loopback_addr, metrics_interval};

/// One flow of one run: who sent what, and what it got.
#[derive(Debug, serde::Serialize)]
pub struct DemoFlowResult {
    /// The run (`B alone`, `B beside A`, ...).
    pub run: String,
    /// The flow (tenant or priority).
    pub flow: String,
    /// Its replay's report.
    pub report: ReplayReport,
}

/// A flow to replay: its name, API key, priority, sessions, requests in flight and seed.
struct DemoFlow {
    name: &'static str,
    key: &'static str,
    priority: Option<&'static str>,
    sessions: usize,
    concurrency: usize,
    seed: u64,
}

/// B (and the high-priority sessions): 8 sessions, 4 requests in flight.
fn light(name: &'static str, key: &'static str, priority: Option<&'static str>) -> DemoFlow {
    DemoFlow {
        name,
        key,
        priority,
        sessions: 8,
        concurrency: 4,
        seed: 1,
    }
}

/// The noisy-neighbour runs: B alone, then B beside A.
pub async fn noisy_neighbour(
    args: &DemoArgs,
    progress: impl Fn(&str),
) -> anyhow::Result<Vec<DemoFlowResult>> {
    let dir = scratch("noisy")?;
    let file = dir.path().join("tenants.toml");
    let tenants = format!(
        "[tenants.a]\nkeys = [\"sha256:{}\"]\n[tenants.b]\nkeys = [\"sha256:{}\"]\n",
        sha256("sk-demo-a"),
        sha256("sk-demo-b")
    );
    std::fs::write(&file, tenants)?;
    let b = || light("B", "sk-demo-b", None);
    let a = DemoFlow {
        name: "A",
        key: "sk-demo-a",
        priority: None,
        sessions: 128,
        concurrency: 64,
        seed: 7,
    };
    let mut results = Vec::new();
    for (run, flows) in [("B alone", vec![b()]), ("B beside A", vec![b(), a])] {
        progress(&format!("running {run} ..."));
        results.extend(run_flows(args, run, &file, None, flows).await?);
    }
    Ok(results)
}

/// The priority runs: high alone, then high beside normal and low floods.
pub async fn priority(
    args: &DemoArgs,
    progress: impl Fn(&str),
) -> anyhow::Result<Vec<DemoFlowResult>> {
    let dir = scratch("priority")?;
    let file = dir.path().join("tenants.toml");
    let tenants = format!(
        "[tenants.p]\nkeys = [\"sha256:{}\"]\nmax_priority = \"high\"\n",
        sha256("sk-demo-p")
    );
    std::fs::write(&file, tenants)?;
    let slots = args.backends * args.max_num_seqs;
    let high = || light("high", "sk-demo-p", Some("high"));
    let flood = |name, seed| DemoFlow {
        name,
        key: "sk-demo-p",
        priority: Some(name),
        sessions: 128,
        concurrency: slots,
        seed,
    };
    let queued = Some(slots / 2);
    let mut results = Vec::new();
    let runs = [
        ("high alone", vec![high()]),
        (
            "high beside normal and low",
            vec![high(), flood("normal", 7), flood("low", 9)],
        ),
    ];
    for (run, flows) in runs {
        progress(&format!("running {run} ..."));
        results.extend(run_flows(args, run, &file, queued, flows).await?);
    }
    Ok(results)
}

/// Replays `flows` at once on fresh backends behind a router with the tenants `file`.
async fn run_flows(
    args: &DemoArgs,
    run: &str,
    file: &Path,
    max_queued: Option<usize>,
    flows: Vec<DemoFlow>,
) -> anyhow::Result<Vec<DemoFlowResult>> {
    let sims = start_sims(args).await?;
    let urls: Vec<String> = sims.iter().map(|s| format!("http://{}", s.addr)).collect();
    let config = router_config(&urls, file, max_queued, args.speedup)?;
    let backends = urls.len();
    let router = tokio::task::spawn_blocking(move || {
        let running = Embedded::start(&config)?;
        anyhow::Ok((running.wait_ready(backends, Duration::from_secs(30))).then_some(running))
    })
    .await??
    .context("the router did not become ready")?;
    let mut replays = Vec::new();
    for flow in &flows {
        let replay_args = replay_args(args, &router.url, flow);
        replays.push(tokio::spawn(async move {
            let loading = replay_args.clone();
            let workload = tokio::task::spawn_blocking(move || Workload::load(&loading)).await??;
            anyhow::Ok(replay(&replay_args, &workload).await?)
        }));
    }
    let mut results = Vec::new();
    for (flow, handle) in flows.iter().zip(replays) {
        results.push(DemoFlowResult {
            run: run.to_string(),
            flow: flow.name.to_string(),
            report: handle.await??,
        });
    }
    tokio::task::spawn_blocking(move || drop(router)).await?;
    for sim in sims {
        sim.shutdown().await;
    }
    Ok(results)
}

fn replay_args(args: &DemoArgs, url: &str, flow: &DemoFlow) -> ReplayArgs {
    let mut replay = ReplayArgs {
        url: url.to_string(),
        synthetic: Some(Synthetic::Agent),
        speedup: args.speedup,
        stream: true,
        quiet: true,
        concurrency: flow.concurrency,
        duration: Some(args.scenario_seconds),
        sessions: flow.sessions,
        session_rate: 100.0,
        seed: flow.seed,
        backends: Some(args.backends),
        api_key: Some(flow.key.to_string()),
        priority: flow.priority.map(str::to_string),
        ..ReplayArgs::default()
    };
    replay.model = prefix_router_sim::DEFAULT_MODEL.to_string();
    replay
}

async fn start_sims(args: &DemoArgs) -> anyhow::Result<Vec<SimHandle>> {
    let mut sims = Vec::with_capacity(args.backends);
    for i in 0..args.backends {
        let config = SimConfig {
            kv_blocks: args.kv_blocks,
            time_scale: args.speedup,
            max_num_seqs: args.max_num_seqs,
            name: format!("backend-{i}"),
            ..SimConfig::default()
        };
        sims.push(prefix_router_sim::start(config, TcpListener::bind("127.0.0.1:0").await?).await?);
    }
    Ok(sims)
}

/// The router in front of `urls` with the tenants `file`, reading the backends' load at
/// [`metrics_interval`]: holds are learned from those reads.
fn router_config(
    urls: &[String],
    file: &Path,
    max_queued: Option<usize>,
    speedup: f64,
) -> anyhow::Result<Config> {
    let port = |addr: String| -> anyhow::Result<u16> {
        Ok(addr
            .rsplit_once(':')
            .context("loopback address without port")?
            .1
            .parse()?)
    };
    let settings = Settings {
        host: Some("127.0.0.1".into()),
        port: Some(port(free_loopback_addr()?)?),
        admin_port: Some(port(free_loopback_addr()?)?),
        worker_urls: Some(urls.to_vec()),
        tenants_file: Some(file.to_path_buf()),
        max_queued,
        health_check_interval: Some(0.5),
        metrics_interval: Some(metrics_interval(speedup)),
        threads: Some(2),
        grace_period: Some(0.0),
        ..Settings::default()
    };
    Ok(Config::from_settings(settings)?)
}

/// A fresh directory under the system's temporary one, removed when dropped.
fn scratch(name: &str) -> anyhow::Result<tempfile::TempDir> {
    let prefix = format!("prefix-router-demo-{name}-");
    Ok(tempfile::Builder::new().prefix(&prefix).tempdir()?)
}

fn sha256(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The results as a table: per run and flow, requests answered and shed, TTFT p50 and
/// p99, hit rate.
pub fn table(results: &[DemoFlowResult]) -> String {
    let mut out = format!(
        "{:<28} {:<7} {:>6} {:>6} {:>10} {:>10} {:>8}\n",
        "run", "flow", "ok", "shed", "TTFT p50", "TTFT p99", "hit rate"
    );
    for r in results {
        let q = &r.report.requests;
        let shed = q.errors.get("http_503").copied().unwrap_or(0);
        let ttft = |f: fn(&prefix_router_replay::Percentiles) -> f64| {
            (r.report.ttft_ms.as_ref()).map_or("-".into(), |t| format!("{:.3} s", f(t) / 1000.0))
        };
        let hit = r.report.hit_rate.map_or("-".into(), |h| format!("{h:.3}"));
        out += &format!(
            "{:<28} {:<7} {:>6} {:>6} {:>10} {:>10} {:>8}\n",
            r.run,
            r.flow,
            q.ok,
            shed,
            ttft(|t| t.p50),
            ttft(|t| t.p99),
            hit
        );
    }
    out
}
