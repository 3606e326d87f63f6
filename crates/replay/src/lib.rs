//! Trace replay load generator: sends a recorded (Mooncake JSONL) or
//! synthetic (coding-agent) workload of chat completions to any
//! OpenAI-compatible URL — our router, a peer router, or a backend — and
//! reports the prefix-cache hit rate the target achieved (from the responses'
//! `usage.prompt_tokens_details.cached_tokens`) against the best achievable
//! (`--bound`), latencies, throughput and how evenly backends were loaded.
//!
//! Library use: build [`ReplayArgs`], [`Workload::load`] once, then
//! [`replay`] as often as needed; [`run`] is the CLI subcommand.

mod agent;
mod bound;
mod client;
pub mod compare;
mod driver;
mod metrics;
mod plan;
mod progress;
mod report;
mod sse;
mod table;
mod template;
mod text;
mod trace;
mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

pub use agent::AgentConfig;
pub use bound::{Bound, Pooled};
pub use client::{ExchangeResult, INSTANCE_HEADER, ServedUsage};
pub use driver::{RequestOutcome, RunResult, SESSION_HEADER};
pub use metrics::VllmCounters;
pub use plan::{Plan, PlannedTurn, Session};
pub use report::{
    BackendRow, Backends, Percentiles, ReplayReport, Requests, Throughput, Tokens, summarize,
};
pub use workload::Workload;

/// Errors of the replay library.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The trace file could not be read.
    #[error("reading {path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// A trace line is malformed.
    #[error("{path}:{line}: {msg}")]
    TraceLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        msg: String,
    },
    /// Neither `--trace` nor `--synthetic` was given.
    #[error("no workload: give --trace FILE or --synthetic agent")]
    NoWorkload,
    /// The workload has no requests.
    #[error("the workload has no requests")]
    EmptyWorkload,
    /// An option has an unusable value.
    #[error("invalid option: {0}")]
    InvalidArg(String),
    /// The HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    /// A backend's `/metrics` could not be read.
    #[error("backend metrics {url}: {msg}")]
    Metrics {
        /// The metrics URL.
        url: String,
        /// What went wrong.
        msg: String,
    },
    /// `--requests-out` could not be written.
    #[error("writing the requests file: {0}")]
    Write(#[source] std::io::Error),
}

/// Built-in workload generators.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synthetic {
    /// Coding-agent sessions: shared long system prompts and tools, growing contexts.
    Agent,
    /// Few-shot traffic: single requests sharing a system prompt and example turns (a hot
    /// prefix beyond the first user message), each with its own question.
    Template,
}

/// Options of the `replay` command.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct ReplayArgs {
    /// Base URL of the target (router, peer router or backend); a comma-separated list
    /// sends requests to each in turn, as a round-robin balancer in front of router
    /// replicas would.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Path appended to `--url` for requests.
    #[arg(long, default_value = "/v1/chat/completions")]
    pub path: String,
    /// Mooncake JSONL trace to replay.
    #[arg(long, conflicts_with = "synthetic")]
    pub trace: Option<PathBuf>,
    /// Built-in workload instead of a trace.
    #[arg(long, value_enum)]
    pub synthetic: Option<Synthetic>,
    /// Tokens per trace hash id (block).
    #[arg(long, default_value_t = 512)]
    pub block_tokens: u32,
    /// Bytes of text per token (the simulator tokenizes ~4 bytes per token).
    #[arg(long, default_value_t = 4)]
    pub bytes_per_token: u32,
    /// Divide arrival times and think times by this factor.
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Send each request's session id as `x-session-id`.
    #[arg(long)]
    pub send_session_header: bool,
    /// Send `Authorization: Bearer KEY` with each request (a tenant's API key).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Send `x-priority: PRIORITY` with each request (high, normal or low).
    #[arg(long)]
    pub priority: Option<String>,
    /// Send a request answered 429 with `Retry-After` again once that time passed (as a
    /// client under a rate limit does), while the run lasts.
    #[arg(long)]
    pub retry_rate_limited: bool,
    /// Maximum requests in flight; later arrivals wait (FIFO).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Stop after this many requests (a trace is cut to its first N at load).
    #[arg(long)]
    pub max_requests: Option<usize>,
    /// Stop sending new requests after this many seconds (in-flight ones finish).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Stream responses (SSE); needed to measure TTFT.
    #[arg(long)]
    pub stream: bool,
    /// Print the best achievable hit rate of the workload and exit without sending.
    #[arg(long)]
    pub bound: bool,
    /// Also compute the bound for one LRU cache of this many tokens (all backends' KV
    /// caches pooled): what any router could reach with the fleet's real capacity.
    #[arg(long)]
    pub bound_capacity: Option<u64>,
    /// Write the report as JSON to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write each request's outcome as a JSON line to this file (session, turn, when it
    /// was sent, TTFT, end to end, backend, usage, error), in the order they were sent.
    #[arg(long)]
    pub requests_out: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Backends whose vLLM `/metrics` to read before and after (comma-separated base URLs).
    #[arg(long, value_delimiter = ',')]
    pub backend_metrics: Vec<String>,
    /// Backends behind the target: those that answered nothing then count, as zero, in the
    /// per-backend rows and the imbalance [default: as many as --backend-metrics names,
    /// else only those that answered]
    #[arg(long)]
    pub backends: Option<usize>,
    /// Model name sent in requests (a router sends each model's requests only to the
    /// backends that list it; the default is the simulator's).
    #[arg(long, default_value = "meta-llama/Llama-3.1-8B-Instruct")]
    pub model: String,
    /// Per-request timeout, seconds.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// Agent workload: number of sessions.
    #[arg(long, default_value_t = 100)]
    pub sessions: usize,
    /// Agent workload: random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Agent workload: mean new sessions per second (Poisson, before --speedup).
    #[arg(long, default_value_t = 0.5)]
    pub session_rate: f64,
    /// Agent workload: sessions end before their context passes this many tokens.
    #[arg(long, default_value_t = 100_000)]
    pub max_context_tokens: u64,
    /// Agent workload: shortest think time between turns, seconds (before --speedup).
    #[arg(long, default_value_t = 1.0)]
    pub think_min: f64,
    /// Agent workload: longest think time between turns, seconds (before --speedup).
    #[arg(long, default_value_t = 5.0)]
    pub think_max: f64,
    /// Agent workload: distinct system prompts the sessions share.
    #[arg(long, default_value_t = 4)]
    pub system_prompts: usize,
    /// Agent workload: every message's length times this (0.1 sizes it for engines on a CPU).
    #[arg(long, default_value_t = 1.0)]
    pub message_scale: f64,
    /// Agent workload: the shared system prompts' and tools' lengths times this [default:
    /// --message-scale].
    #[arg(long)]
    pub prompt_scale: Option<f64>,
    /// Agent workload: every turn's max_tokens (30-300) times this, at least 1.
    #[arg(long, default_value_t = 1.0)]
    pub output_scale: f64,
    /// Agent workload: sessions end between this many tokens and --max-context-tokens,
    /// heavy-tailed (a few sessions near the maximum, most far below) [default: 0, every
    /// session runs to the maximum].
    #[arg(long, default_value_t = 0)]
    pub min_context_tokens: u64,
    /// Agent workload: share of turns (0-1) sent a think time after the previous turn was
    /// sent, without waiting for its answer (parallel tool calls, sub-agents).
    #[arg(long, default_value_t = 0.0)]
    pub overlap: f64,
}

impl Default for ReplayArgs {
    /// The CLI defaults (no workload chosen).
    fn default() -> Self {
        let agent = AgentConfig::default();
        ReplayArgs {
            url: "http://127.0.0.1:8080".into(),
            path: "/v1/chat/completions".into(),
            trace: None,
            synthetic: None,
            block_tokens: 512,
            bytes_per_token: 4,
            speedup: 1.0,
            send_session_header: false,
            api_key: None,
            priority: None,
            retry_rate_limited: false,
            concurrency: 64,
            max_requests: None,
            duration: None,
            stream: false,
            bound: false,
            bound_capacity: None,
            out: None,
            requests_out: None,
            quiet: false,
            backend_metrics: Vec::new(),
            backends: None,
            model: "meta-llama/Llama-3.1-8B-Instruct".into(),
            timeout: 600.0,
            sessions: agent.sessions,
            seed: agent.seed,
            session_rate: agent.session_rate,
            max_context_tokens: agent.max_context_tokens,
            think_min: agent.think_min,
            think_max: agent.think_max,
            system_prompts: agent.system_prompts,
            message_scale: agent.message_scale,
            prompt_scale: agent.prompt_scale,
            output_scale: agent.output_scale,
            min_context_tokens: agent.min_context_tokens,
            overlap: agent.overlap,
        }
    }
}

impl ReplayArgs {
    /// The agent generator settings these options describe.
    pub fn agent_config(&self) -> AgentConfig {
        AgentConfig {
            sessions: self.sessions,
            seed: self.seed,
            session_rate: self.session_rate,
            max_context_tokens: self.max_context_tokens,
            bytes_per_token: self.bytes_per_token,
            think_min: self.think_min,
            think_max: self.think_max,
            system_prompts: self.system_prompts,
            message_scale: self.message_scale,
            prompt_scale: self.prompt_scale,
            output_scale: self.output_scale,
            min_context_tokens: self.min_context_tokens,
            overlap: self.overlap,
        }
    }

    fn validate(&self) -> Result<(), ReplayError> {
        let bad = |m: &str| Err(ReplayError::InvalidArg(m.to_owned()));
        if !(self.message_scale.is_finite() && self.message_scale > 0.0) {
            return bad("--message-scale must be > 0");
        }
        if self
            .prompt_scale
            .is_some_and(|s| !(s.is_finite() && s > 0.0))
        {
            return bad("--prompt-scale must be > 0");
        }
        if !(self.output_scale.is_finite() && self.output_scale > 0.0) {
            return bad("--output-scale must be > 0");
        }
        if !(self.speedup.is_finite() && self.speedup > 0.0) {
            return bad("--speedup must be > 0");
        }
        if self.concurrency == 0 {
            return bad("--concurrency must be >= 1");
        }
        if !(0.0..=1.0).contains(&self.overlap) {
            return bad("--overlap must be within 0-1");
        }
        if !(self.timeout.is_finite() && self.timeout > 0.0) {
            return bad("--timeout must be > 0");
        }
        if self.duration.is_some_and(|d| !(d.is_finite() && d >= 0.0)) {
            return bad("--duration must be >= 0");
        }
        if !self.url.split(',').all(|u| u.starts_with("http://")) {
            return bad("--url must start with http:// (built without TLS)");
        }
        Ok(())
    }

    /// The URLs requests are posted to, in turn.
    fn endpoints(&self) -> Vec<String> {
        let path = self.path.trim_start_matches('/');
        (self.url.split(','))
            .map(|url| format!("{}/{path}", url.trim().trim_end_matches('/')))
            .collect()
    }

    fn settings(&self) -> driver::RunSettings {
        driver::RunSettings {
            endpoints: self.endpoints(),
            style: text::BodyStyle::new(&self.model, self.stream),
            speedup: self.speedup,
            concurrency: self.concurrency,
            max_requests: self.max_requests,
            duration: self.duration.map(Duration::from_secs_f64),
            send_session: self.send_session_header,
            retry_rate_limited: self.retry_rate_limited,
            headers: (self
                .api_key
                .iter()
                .map(|k| ("authorization", format!("Bearer {k}"))))
            .chain(self.priority.iter().map(|p| ("x-priority", p.clone())))
            .collect(),
        }
    }
}

/// Replays `workload` against `args.url` and returns the report. Prints
/// nothing except the progress bar (on stderr, when it is a terminal and
/// `--quiet` is not set).
pub async fn replay(args: &ReplayArgs, workload: &Workload) -> Result<ReplayReport, ReplayError> {
    args.validate()?;
    let client = http_client(args)?;
    let before = metrics::scrape_all(&client, &args.backend_metrics).await?;
    let plan = Arc::clone(workload.plan());
    let total = args.max_requests.map_or(plan.len(), |n| n.min(plan.len()));
    let mut progress = progress::Progress::new(total, args.quiet);
    let run = driver::run(client.clone(), args.settings(), plan.clone(), |o| {
        progress.update(o)
    })
    .await;
    progress.finish();
    if let Some(path) = &args.requests_out {
        report::write_outcomes(path, &run.outcomes).map_err(ReplayError::Write)?;
    }
    let metrics = if args.backend_metrics.is_empty() {
        None
    } else {
        let after = metrics::scrape_all(&client, &args.backend_metrics).await;
        Some(
            after
                .map(|a| report::from_metrics(&args.backend_metrics, &before, &a))
                .map_err(|e| e.to_string()),
        )
    };
    Ok(build_report(args, workload, &run, metrics))
}

/// The report of `run`, a replay of `workload` with `args` made here or elsewhere (the lab
/// runs the same schedule in virtual time): the same figures either way.
pub fn report(args: &ReplayArgs, workload: &Workload, run: &RunResult) -> ReplayReport {
    build_report(args, workload, run, None)
}

fn build_report(
    args: &ReplayArgs,
    workload: &Workload,
    run: &RunResult,
    metrics: Option<Result<Backends, String>>,
) -> ReplayReport {
    let plan = workload.plan();
    let total = args.max_requests.map_or(plan.len(), |n| n.min(plan.len()));
    let mut order: Vec<&RequestOutcome> = run.outcomes.iter().collect();
    order.sort_by_key(|o| (o.sent, o.session, o.turn));
    let sent = order.iter().map(|o| (o.session, o.turn));
    let named = (!args.backend_metrics.is_empty()).then_some(args.backend_metrics.len());
    let ctx = report::Context {
        target: args.url.clone(),
        workload: workload.describe(),
        stream: args.stream,
        concurrency: args.concurrency,
        speedup: args.speedup,
        planned: total as u64,
        bound: bound::compute_sent(plan, sent, args.bound_capacity),
        metrics,
        backends: args.backends.or(named),
    };
    report::build(ctx, run)
}

fn http_client(args: &ReplayArgs) -> Result<reqwest::Client, ReplayError> {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(args.concurrency)
        .pool_idle_timeout(Duration::from_secs(90))
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs_f64(args.timeout))
        .tcp_nodelay(true)
        .build()
        .map_err(ReplayError::Client)
}

/// The CLI subcommand: load, then print the bound (`--bound`) or replay and
/// print the table; write JSON to `--out` when given.
pub async fn run(args: ReplayArgs) -> anyhow::Result<()> {
    let workload = Workload::load(&args)?;
    if args.bound {
        let mut b = workload.bound_detail();
        println!("{}", workload.bound_summary());
        if let Some(capacity_tokens) = args.bound_capacity {
            let hit_rate = workload.pooled_bound(capacity_tokens);
            println!(
                "with one LRU cache of {capacity_tokens} tokens: {:.2}%",
                hit_rate * 100.0
            );
            b.pooled = Some(Pooled {
                capacity_tokens,
                hit_rate,
            });
        }
        if let Some(out) = &args.out {
            let json = serde_json::json!({ "workload": workload.describe(), "bound": b });
            write_json(out, &json)?;
        }
        return Ok(());
    }
    if !args.quiet {
        eprintln!(
            "replaying {} -> {}",
            workload.describe(),
            args.endpoints().join(", ")
        );
    }
    let report = replay(&args, &workload).await?;
    print!("{}", report.table());
    if let Some(out) = &args.out {
        write_json(out, &report)?;
    }
    Ok(())
}

fn write_json(path: &std::path::Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let data = serde_json::to_vec_pretty(value)?;
    std::fs::write(path, data).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct ReplayCli {
        #[command(flatten)]
        args: ReplayArgs,
    }

    #[test]
    fn default_matches_cli_defaults() {
        assert_eq!(
            ReplayCli::parse_from(["replay"]).args,
            ReplayArgs::default()
        );
    }

    #[test]
    fn parses_options() {
        let a = ReplayCli::parse_from([
            "replay",
            "--url",
            "http://h:1/",
            "--synthetic",
            "agent",
            "--stream",
            "--backend-metrics",
            "http://a:1,http://b:2",
            "--max-requests",
            "5",
        ])
        .args;
        assert_eq!(a.synthetic, Some(Synthetic::Agent));
        assert_eq!(a.backend_metrics, ["http://a:1", "http://b:2"]);
        assert_eq!(a.endpoints(), ["http://h:1/v1/chat/completions"]);
        assert!(
            ReplayCli::try_parse_from(["replay", "--trace", "x", "--synthetic", "agent"]).is_err()
        );
    }

    #[test]
    fn rejects_bad_values() {
        let bad = |f: fn(&mut ReplayArgs)| {
            let mut a = ReplayArgs::default();
            f(&mut a);
            a.validate().is_err()
        };
        assert!(bad(|a| a.speedup = 0.0));
        assert!(bad(|a| a.concurrency = 0));
        assert!(bad(|a| a.url = "127.0.0.1:8080".into()));
        assert!(ReplayArgs::default().validate().is_ok());
        assert!(matches!(
            Workload::load(&ReplayArgs::default()),
            Err(ReplayError::NoWorkload)
        ));
    }
}
