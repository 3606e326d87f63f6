//! The lab: a discrete-event simulation, in virtual time and one process, of clients,
//! the router and a fleet of simulated vLLM engines. The router half is the core's real
//! selection path (parser, policies, index, sessions) with the proxy's in-flight and
//! pending-prefill accounting, and, in the flow scenarios, the proxy's flow control over
//! the core's (tenants and priorities sharing a full fleet); the engine half is the simulator's own model (block prefix
//! cache with LRU and pinning, `max_num_seqs` scheduling, shared prefill throughput and a
//! decode interval, or vLLM's engine steps with `--max-num-batched-tokens`), fed by the
//! simulator's own template. The clients follow the replay's
//! schedule and the report is the replay's, so a lab run reads like a real-time one.
//!
//! Deterministic (the same inputs and seed give byte-identical output), with no sockets
//! and no sleeps. Not for: timing of the router itself (that is `make overhead`), or
//! anything the simulator does not model.

mod output;
pub mod prepare;
pub mod router;
pub mod scenario;
mod settings;
pub mod world;

use std::path::PathBuf;

use prefix_router_core::policy::{self, Tunables};
use prefix_router_core::tree::TreeConfig;
use prefix_router_core::units::Tokens;
use prefix_router_replay::{ReplayArgs, ReplayError, ReplayReport, Synthetic, Workload};
use prefix_router_sim::SimConfig;
use prefix_router_sim::engine::Scheduling;
use serde::Serialize;

pub use output::{svg, table};
use prepare::RequestShapes;
use router::RouterSetup;
use scenario::{Scenario, WorkloadSource};
pub use settings::settings;
use world::{Clients, Situation};

/// Why the lab cannot run.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The workload could not be loaded.
    #[error(transparent)]
    Workload(#[from] ReplayError),
    /// A policy name is unknown.
    #[error(transparent)]
    Policy(#[from] policy::UnknownPolicy),
    /// A scenario name is unknown.
    #[error("unknown scenario `{0}`, expected one of: {1}")]
    Scenario(String, String),
    /// An option has an unusable value.
    #[error("invalid option: {0}")]
    Invalid(String),
    /// The results could not be written.
    #[error("writing {path}: {cause}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
}

/// Options of the `lab` command.
#[derive(clap::Args, Debug, Clone)]
pub struct LabArgs {
    /// A named scenario (see --list); without one, the agent workload or --trace.
    #[arg(long, conflicts_with_all = ["all", "trace"])]
    pub scenario: Option<String>,
    /// Every named scenario.
    #[arg(long)]
    pub all: bool,
    /// List the named scenarios and exit.
    #[arg(long)]
    pub list: bool,
    /// Policies to compare, in order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "round_robin,consistent_hash,cache_aware,prefill_aware,kv_aware"
    )]
    pub policies: Vec<String>,
    /// A Mooncake trace to run instead of the agent workload.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Backends (a list sweeps: 2,4,8) [default: the scenario's, else 4].
    #[arg(long, value_delimiter = ',')]
    pub backends: Vec<usize>,
    /// KV cache per backend in 16-token blocks (a list sweeps) [default: the scenario's, else 26250].
    #[arg(long, value_delimiter = ',')]
    pub kv_blocks: Vec<usize>,
    /// Agent workloads: KV per backend as a share of the sessions' final contexts summed
    /// over the fleet (a list sweeps: 0.6,0.8,1,1.2,1.5); replaces --kv-blocks.
    #[arg(long, value_delimiter = ',', conflicts_with = "kv_blocks")]
    pub kv_scale: Vec<f64>,
    /// Agent workload: sessions (a list sweeps) [default: the scenario's, else 24].
    #[arg(long, value_delimiter = ',')]
    pub sessions: Vec<usize>,
    /// Agent workload: mean new sessions per second.
    #[arg(long)]
    pub session_rate: Option<f64>,
    /// Agent workload: distinct shared system prompts.
    #[arg(long)]
    pub system_prompts: Option<usize>,
    /// Requests in flight at most (the replay's --concurrency) [default: the scenario's, else 64].
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Stop each run after this many requests.
    #[arg(long)]
    pub max_requests: Option<usize>,
    /// Send session ids as `x-session-id`.
    #[arg(long)]
    pub send_session_header: bool,
    /// The router's configured index budget per backend, tokens of KV, for backends that do
    /// not publish their KV capacity [default: the router's default].
    #[arg(long)]
    pub max_tree_size: Option<usize>,
    /// Backends do not publish their KV capacity (`vllm:cache_config_info`): the router
    /// knows no capacity and sizes every index by `--max-tree-size`.
    #[arg(long)]
    pub unknown_capacity: bool,
    /// The router does not learn index budgets from the cached tokens backends report.
    #[arg(long)]
    pub no_calibration: bool,
    /// Requests in flight per backend at most; beyond, the router holds them in its queue
    /// (the router's default bound and timeout: 1,024 waiting, 30 s) and places them when
    /// a backend frees a slot (0: no limit, the router's default).
    #[arg(long, default_value_t = 0)]
    pub max_inflight_per_backend: usize,
    /// Router replicas, each with state of its own, requests spread over them in turn as a
    /// round-robin balancer would (a list sweeps: 1,2,4).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub replicas: Vec<usize>,
    /// Seconds between two reads of each backend's published load by a router.
    #[arg(long, default_value_t = 1.0)]
    pub scrape_interval: f64,
    /// The replicas do not share their conversation table (routers without `shared_table`).
    #[arg(long)]
    pub no_shared_table: bool,
    /// Seconds a replica's note of a placement takes to reach the other replicas (their
    /// shared table's publish and subscribe hop).
    #[arg(long, default_value_t = 0.002)]
    pub note_delay: f64,
    /// What the router knows of the engines' caches (a list sweeps: text,exact): `text`
    /// predicts from what it sent; `exact` reads the engines' own records (their KV
    /// events, without delay) and routes in token mode.
    #[arg(long, value_delimiter = ',', default_value = "text")]
    pub index: Vec<IndexMode>,
    /// Share of requests (0-1) that clients send straight to a backend, past the router.
    #[arg(long, default_value_t = 0.0)]
    pub bypass: f64,
    /// Backend 0 loses its whole prefix cache when half the requests have been sent.
    #[arg(long)]
    pub restart: bool,
    /// Flow scenarios: the tenants file's `standing_slots`, slots of each held backend
    /// left free for a light tenant or a higher priority to arrive at [default: 0].
    #[arg(long)]
    pub standing_slots: Option<usize>,
    /// Flow scenarios: engines running K times the sequences, and every flow K times the
    /// sessions and the requests in flight, under a queue K times as long [default: 1].
    /// From 4, the engines are bound by KV rather than by sequences.
    #[arg(long)]
    pub flow_scale: Option<usize>,
    /// Flow scenarios with `--flow-scale`: every flow L times the sessions and the requests
    /// in flight, under a queue L times as long, instead of K times [default: K]. At
    /// `--flow-scale 4 --flow-load 2` the flows are those of `benches/tenants/noisy.sh`
    /// on engines of 16 sequences.
    #[arg(long)]
    pub flow_load: Option<usize>,
    /// Seed of the workload and of the policies' tie-breaking.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The order the engines admit waiting requests in (vLLM's `--scheduling-policy`);
    /// with a tenants file each request carries its priority to them, as the router's
    /// `X-Vllm-Priority` does.
    #[arg(long, value_enum, default_value = "fcfs")]
    pub scheduling_policy: Scheduling,
    /// Engines compute in vLLM's steps of at most this many tokens (prefill chunks and a
    /// token of each decoding request; vLLM's `--max-num-batched-tokens`); 0 for none:
    /// prefills share the throughput continuously and decode runs beside them.
    #[arg(long, default_value_t = 0)]
    pub max_num_batched_tokens: usize,
    /// Where the named traces are.
    #[arg(long, default_value = "../shared/traces")]
    pub traces: PathBuf,
    /// Where to write `lab.json` and one `lab-SCENARIO.svg` per scenario.
    #[arg(long, default_value = "lab-results")]
    pub out_dir: PathBuf,
}

/// What the router knows of the engines' caches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexMode {
    /// Its own prediction from what it sent.
    Text,
    /// The engines' own records (KV events), in token mode.
    Exact,
}

/// One run's result: its setting, the replay's report of it, and what only the lab sees.
#[derive(Clone, Debug, Serialize)]
pub struct LabResult {
    /// The scenario (or `custom`).
    pub scenario: String,
    /// The policy.
    pub policy: String,
    /// Router replicas.
    pub replicas: usize,
    /// What the router knew of the engines' caches.
    pub index: IndexMode,
    /// Backends.
    pub backends: usize,
    /// KV blocks per backend.
    pub kv_blocks: usize,
    /// The best hit rate with the fleet's KV pooled into one LRU cache, requests in
    /// schedule order with answers taking no time: the same for every policy of a setting
    /// (the report's own pooled bound follows each run's order).
    pub pooled_bound: f64,
    /// The replay's report, in virtual time.
    pub report: ReplayReport,
    /// KV blocks the engines evicted.
    pub kv_evicted_blocks: u64,
    /// Prefix-index text the router evicted, bytes.
    pub index_evicted_bytes: u64,
    /// Hit rate the router predicted (matched / routed text).
    pub predicted_hit_rate: Option<f64>,
    /// Hit rate of the requests the router placed (the report's, less those that
    /// bypassed the router): what the prediction is of.
    pub routed_hit_rate: Option<f64>,
    /// The router's decisions by outcome (`prefix_hit`, `placed`, `session`, ...).
    pub decisions: std::collections::BTreeMap<String, u64>,
    /// Routing text routed, bytes (over the prompt tokens reported: bytes per token).
    pub text_bytes: u64,
    /// Turns placed on another backend than their session's previous turn.
    pub moved_turns: u64,
    /// Each flow's outcomes, in a scenario with flows.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub flows: Vec<world::FlowResult>,
}

/// One setting to run every policy on.
#[derive(Clone, Debug)]
pub struct Setting {
    /// The scenario this setting comes from.
    pub scenario: Scenario,
    /// The configured index budget, tokens per backend (none: the router's default).
    pub max_tree_size: Option<usize>,
    /// Whether backends keep their KV capacity to themselves.
    pub unknown_capacity: bool,
    /// Whether the router learns index budgets from reported cached tokens.
    pub calibrate: bool,
    /// The router's in-flight limit per backend (0: none).
    pub max_inflight_per_backend: usize,
    /// Router replicas.
    pub replicas: usize,
    /// Seconds between two reads of a backend's published load.
    pub scrape_interval: f64,
    /// Whether the replicas share their conversation table.
    pub shared_table: bool,
    /// Seconds a note takes from one replica to the others.
    pub note_delay: f64,
    /// Seed.
    pub seed: u64,
    /// Stop after this many requests.
    pub max_requests: Option<usize>,
    /// Send `x-session-id`.
    pub send_session_header: bool,
    /// What the router knows of the engines' caches.
    pub index: IndexMode,
    /// Share of requests past the router, 0..=1.
    pub bypass: f64,
    /// Whether backend 0 loses its cache halfway.
    pub restart: bool,
    /// The order the engines admit waiting requests in.
    pub scheduling: Scheduling,
    /// Most tokens of an engine step (0: no steps).
    pub max_num_batched_tokens: usize,
}

impl Setting {
    /// `scenario` with the lab's defaults, as `prefix-router lab` runs it without options
    /// (seed 1, text mode, one replica, no in-flight limit, every request).
    pub fn of(scenario: Scenario) -> Self {
        Setting {
            scenario,
            max_tree_size: None,
            unknown_capacity: false,
            calibrate: true,
            max_inflight_per_backend: 0,
            replicas: 1,
            scrape_interval: 1.0,
            shared_table: true,
            note_delay: 0.002,
            seed: 1,
            max_requests: None,
            send_session_header: false,
            index: IndexMode::Text,
            bypass: 0.0,
            restart: false,
            scheduling: Scheduling::Fcfs,
            max_num_batched_tokens: 0,
        }
    }

    fn sim(&self) -> SimConfig {
        SimConfig {
            kv_blocks: self.scenario.kv_blocks,
            max_model_len: self.scenario.max_model_len,
            max_num_seqs: self.scenario.max_num_seqs,
            scheduling_policy: self.scheduling,
            max_num_batched_tokens: self.max_num_batched_tokens,
            ..SimConfig::default()
        }
    }

    fn replay_args(&self) -> ReplayArgs {
        ReplayArgs {
            max_requests: self.max_requests,
            send_session_header: self.send_session_header,
            ..scenario_args(&self.scenario, self.seed)
        }
    }

    fn router(&self, policy: &str) -> Result<RouterSetup, LabError> {
        let sim = self.sim();
        let defaults = TreeConfig::default();
        Ok(RouterSetup {
            policy: policy::choose(policy)?,
            tunables: Tunables::default(),
            tree: TreeConfig {
                budget: (self.max_tree_size.map(|t| Tokens(t).keys())).unwrap_or(defaults.budget),
                ..defaults
            },
            session_ttl: prefix_router_core::policy::SESSION_TTL.as_secs_f64(),
            eviction_interval: prefix_router_core::ledger::EVICTION_INTERVAL.as_secs_f64(),
            seed: self.seed,
            kv_tokens: (!self.unknown_capacity).then_some(Tokens(sim.kv_blocks * sim.block_tokens)),
            block: (!self.unknown_capacity).then_some(Tokens(sim.block_tokens)),
            calibrate: self.calibrate,
            max_inflight_per_backend: self.max_inflight_per_backend,
            replicas: self.replicas.max(1),
            scrape_interval: self.scrape_interval,
            shared_table: self.shared_table,
            note_delay: self.note_delay,
        })
    }
}

/// The replay's options for `scenario`'s workload and clients, with `seed`.
pub(crate) fn scenario_args(scenario: &Scenario, seed: u64) -> ReplayArgs {
    let capacity = scenario.backends * scenario.kv_blocks * SimConfig::default().block_tokens;
    let mut args = ReplayArgs {
        stream: true,
        quiet: true,
        concurrency: scenario.concurrency,
        seed,
        backends: Some(scenario.backends),
        bound_capacity: Some(capacity as u64),
        model: prefix_router_sim::DEFAULT_MODEL.to_string(),
        url: "lab://virtual".into(),
        ..ReplayArgs::default()
    };
    match &scenario.source {
        WorkloadSource::Agent(agent) => {
            args.synthetic = Some(Synthetic::Agent);
            (args.sessions, args.session_rate) = (agent.sessions, agent.session_rate);
            args.system_prompts = agent.system_prompts;
            (args.max_context_tokens, args.min_context_tokens) =
                (agent.contexts.1, agent.contexts.0);
            (args.think_min, args.think_max) = agent.think;
            args.overlap = agent.overlap;
        }
        WorkloadSource::Template {
            requests,
            rate,
            templates,
        } => {
            args.synthetic = Some(Synthetic::Template);
            (args.sessions, args.session_rate) = (*requests, *rate);
            args.system_prompts = *templates;
        }
        WorkloadSource::Trace(path) => args.trace = Some(path.clone()),
    }
    args
}

/// Runs every policy of `policies` on `setting`; `progress` hears of each run.
pub fn compare(
    setting: &Setting,
    policies: &[String],
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<LabResult>, LabError> {
    let flows = setting.scenario.flows.as_ref();
    let all_args = flow_args(setting.replay_args(), flows);
    let main = (flows.and_then(|f| f.flows.iter().position(|f| f.measured))).unwrap_or(0);
    let args = all_args[main].clone();
    let sim = setting.sim();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let exact = setting.index == IndexMode::Exact;
    let mut loaded = Vec::with_capacity(all_args.len());
    for args in &all_args {
        let workload = Workload::load(args)?;
        let prepared = RequestShapes::new(
            workload.plan(),
            &sim,
            &args.model,
            args.stream,
            threads,
            exact,
        );
        loaded.push((workload, prepared));
    }
    let workloads: Vec<world::ShapedWorkload> = (loaded.iter())
        .map(|(w, p)| (w.plan().as_ref(), p))
        .collect();
    let workload = &loaded[main].0;
    let situation = Situation {
        exact,
        bypass: setting.bypass,
        restart: setting.restart,
        seed: setting.seed,
    };
    let names: Vec<String> = (0..setting.scenario.backends)
        .map(|i| format!("backend-{i}"))
        .collect();
    let clients = Clients {
        model: args.model.clone(),
        stream: args.stream,
        concurrency: args.concurrency,
        max_requests: args.max_requests,
        send_session_header: args.send_session_header,
    };
    let pooled_bound = workload.pooled_bound(args.bound_capacity.unwrap_or(0));
    let mut results = Vec::with_capacity(policies.len());
    for name in policies {
        let router = setting.router(name)?;
        let run = world::run(
            &workloads,
            &names,
            &sim,
            &router,
            &clients,
            &situation,
            setting.scenario.flows.as_ref(),
        );
        let report = prefix_router_replay::report(&args, workload, &run.result);
        let line = output::summary(&report, pooled_bound, &run.flows);
        progress(&format!("{} {name}: {line}", setting.scenario.name));
        results.push(LabResult {
            scenario: setting.scenario.name.clone(),
            policy: name.clone(),
            replicas: setting.replicas,
            index: setting.index,
            backends: setting.scenario.backends,
            kv_blocks: setting.scenario.kv_blocks,
            pooled_bound,
            report,
            kv_evicted_blocks: run.kv_evicted_blocks,
            index_evicted_bytes: run.index_evicted_bytes,
            predicted_hit_rate: run.predicted_hit_rate,
            routed_hit_rate: run.routed_hit_rate,
            decisions: (run.outcomes.iter())
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            text_bytes: run.text_bytes,
            moved_turns: moved_turns(&run.result.outcomes),
            flows: run.flows,
        });
    }
    Ok(results)
}

/// The replay's options of each workload: `args`, or, with `flows`, one workload per flow,
/// of its sessions and a seed of its own (the first flow's is `args`' seed).
fn flow_args(args: ReplayArgs, flows: Option<&scenario::Flows>) -> Vec<ReplayArgs> {
    let Some(flows) = flows.filter(|f| !f.flows.is_empty()) else {
        return vec![args];
    };
    (flows.flows.iter().enumerate())
        .map(|(i, flow)| ReplayArgs {
            sessions: flow.sessions,
            seed: args.seed.wrapping_add(i as u64),
            ..args.clone()
        })
        .collect()
}

/// Turns placed on another backend than their session's previous turn.
fn moved_turns(outcomes: &[prefix_router_replay::RequestOutcome]) -> u64 {
    let mut placed: Vec<(u32, u32, &str)> = (outcomes.iter())
        .filter_map(|o| Some((o.session, o.turn, o.exchange.backend.as_deref()?)))
        .collect();
    placed.sort_unstable();
    let moved = placed
        .windows(2)
        .filter(|w| w[0].0 == w[1].0 && w[0].2 != w[1].2);
    moved.count() as u64
}

/// The `lab` command: runs, prints the table, writes `lab.json` and the charts.
pub fn run(args: &LabArgs) -> Result<(), LabError> {
    if args.list {
        for s in scenario::all(&args.traces) {
            println!("{:<18} {}", s.name, s.about);
        }
        return Ok(());
    }
    let mut results = Vec::new();
    for setting in settings(args)? {
        results.extend(compare(&setting, &args.policies, &mut |line| {
            eprintln!("{line}")
        })?);
    }
    println!("{}", table(&results));
    write(args, &results)
}

fn write(args: &LabArgs, results: &[LabResult]) -> Result<(), LabError> {
    let error = |path: PathBuf| move |cause| LabError::Write { path, cause };
    std::fs::create_dir_all(&args.out_dir).map_err(error(args.out_dir.clone()))?;
    let json = args.out_dir.join("lab.json");
    let text = serde_json::to_vec_pretty(results).unwrap_or_default();
    std::fs::write(&json, text).map_err(error(json.clone()))?;
    println!("wrote {}", json.display());
    for (scenario, chart) in svg(results) {
        let slug: String = (scenario.chars())
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = args.out_dir.join(format!("lab-{slug}.svg"));
        std::fs::write(&path, chart).map_err(error(path.clone()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
