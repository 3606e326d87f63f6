//! The lab: a discrete-event simulation, in virtual time and one process, of clients,
//! the router and a fleet of simulated vLLM engines. The router half is the core's real
//! selection path (parser, policies, index, sessions) with the proxy's in-flight and
//! pending-prefill accounting, and, in the flow scenarios, the proxy's flow control over
//! the core's (tenants and priorities sharing a full fleet); the engine half is the simulator's own model (block prefix
//! cache with LRU and pinning, `max_num_seqs` scheduling, shared prefill throughput, decode
//! interval), fed by the simulator's own template. The clients follow the replay's
//! schedule and the report is the replay's, so a lab run reads like a real-time one.
//!
//! Deterministic (the same inputs and seed give byte-identical output), with no sockets
//! and no sleeps. Not for: timing of the router itself (that is `make overhead`), or
//! anything the simulator does not model.

mod output;
pub mod prepare;
pub mod router;
pub mod scenario;
pub mod world;

use std::path::PathBuf;

use prefix_router_core::policy::{self, Tunables};
use prefix_router_core::tree::TreeConfig;
use prefix_router_core::units::Tokens;
use prefix_router_replay::{ReplayArgs, ReplayError, Report, Synthetic, Workload};
use prefix_router_sim::SimConfig;
use serde::Serialize;

pub use output::{svg, table};
use prepare::Prepared;
use router::RouterSetup;
use scenario::{Agent, Scenario, Source};
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
    /// and places them when a backend frees a slot (0: no limit, the router's default).
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
    pub report: Report,
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
}

impl Setting {
    fn sim(&self) -> SimConfig {
        SimConfig {
            kv_blocks: self.scenario.kv_blocks,
            max_model_len: self.scenario.max_model_len,
            max_num_seqs: self.scenario.max_num_seqs,
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
fn scenario_args(scenario: &Scenario, seed: u64) -> ReplayArgs {
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
        Source::Agent(agent) => {
            args.synthetic = Some(Synthetic::Agent);
            (args.sessions, args.session_rate) = (agent.sessions, agent.session_rate);
            args.system_prompts = agent.system_prompts;
            (args.max_context_tokens, args.min_context_tokens) =
                (agent.contexts.1, agent.contexts.0);
            (args.think_min, args.think_max) = agent.think;
            args.overlap = agent.overlap;
        }
        Source::Template {
            requests,
            rate,
            templates,
        } => {
            args.synthetic = Some(Synthetic::Template);
            (args.sessions, args.session_rate) = (*requests, *rate);
            args.system_prompts = *templates;
        }
        Source::Trace(path) => args.trace = Some(path.clone()),
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
        let prepared = Prepared::new(
            workload.plan(),
            &sim,
            &args.model,
            args.stream,
            threads,
            exact,
        );
        loaded.push((workload, prepared));
    }
    let workloads: Vec<world::Workload> = (loaded.iter())
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
fn moved_turns(outcomes: &[prefix_router_replay::Outcome]) -> u64 {
    let mut placed: Vec<(u32, u32, &str)> = (outcomes.iter())
        .filter_map(|o| Some((o.session, o.turn, o.exchange.backend.as_deref()?)))
        .collect();
    placed.sort_unstable();
    let moved = placed
        .windows(2)
        .filter(|w| w[0].0 == w[1].0 && w[0].2 != w[1].2);
    moved.count() as u64
}

/// The settings `args` asks for: its scenarios, swept over the listed values.
pub fn settings(args: &LabArgs) -> Result<Vec<Setting>, LabError> {
    let all = scenario::all(&args.traces);
    let base: Vec<Scenario> = match (&args.scenario, args.all, &args.trace) {
        (_, true, _) => all,
        (Some(name), _, _) => vec![scenario::named(name, &args.traces).ok_or_else(|| {
            let names: Vec<String> = all.iter().map(|s| s.name.clone()).collect();
            LabError::Scenario(name.clone(), names.join(", "))
        })?],
        (None, _, Some(path)) => {
            let mut s =
                scenario::named("conversation", &args.traces).unwrap_or_else(|| all[0].clone());
            (s.name, s.source) = ("custom".into(), Source::Trace(path.clone()));
            vec![s]
        }
        (None, false, None) => vec![all[0].clone()],
    };
    if args.replicas.contains(&0) || args.scrape_interval.is_nan() || args.scrape_interval <= 0.0 {
        return Err(LabError::Invalid(
            "--replicas must be >= 1 and --scrape-interval > 0".into(),
        ));
    }
    if !(args.note_delay.is_finite() && args.note_delay >= 0.0) {
        return Err(LabError::Invalid("--note-delay must be >= 0".into()));
    }
    if !(0.0..=1.0).contains(&args.bypass) {
        return Err(LabError::Invalid("--bypass must be within 0-1".into()));
    }
    let faults = situation_label(args);
    let mut out = Vec::new();
    for scenario in base {
        for s in sweep(&scenario, args)? {
            for (&replicas, &index) in args
                .replicas
                .iter()
                .flat_map(|r| args.index.iter().map(move |i| (r, i)))
            {
                let mut s = s.clone();
                if replicas > 1 {
                    s.name = format!("{} r={replicas}", s.name);
                }
                s.name.push_str(&faults);
                if args.index.len() > 1 {
                    s.name.push_str(if index == IndexMode::Exact {
                        " exact"
                    } else {
                        " text"
                    });
                }
                out.push(Setting {
                    scenario: s,
                    max_tree_size: args.max_tree_size,
                    unknown_capacity: args.unknown_capacity,
                    calibrate: !args.no_calibration,
                    max_inflight_per_backend: args.max_inflight_per_backend,
                    replicas,
                    scrape_interval: args.scrape_interval,
                    shared_table: !args.no_shared_table,
                    note_delay: args.note_delay,
                    seed: args.seed,
                    max_requests: args.max_requests,
                    send_session_header: args.send_session_header,
                    index,
                    bypass: args.bypass,
                    restart: args.restart,
                });
            }
        }
    }
    Ok(out)
}

/// The faults of `args` as a suffix of scenario names.
fn situation_label(args: &LabArgs) -> String {
    let mut label = String::new();
    if args.bypass > 0.0 {
        label.push_str(&format!(" bypass={:.0}%", args.bypass * 100.0));
    }
    if args.restart {
        label.push_str(" restart");
    }
    label
}

/// `scenario` once per combination of the listed backends, KV sizes and session counts.
fn sweep(scenario: &Scenario, args: &LabArgs) -> Result<Vec<Scenario>, LabError> {
    let or = |list: &[usize], default: usize| {
        if list.is_empty() {
            vec![default]
        } else {
            list.to_vec()
        }
    };
    if [&args.backends, &args.kv_blocks, &args.sessions]
        .iter()
        .any(|l| l.contains(&0))
    {
        return Err(LabError::Invalid(
            "--backends, --kv-blocks and --sessions must be >= 1".into(),
        ));
    }
    let mut out = Vec::new();
    for backends in or(&args.backends, scenario.backends) {
        for kv_blocks in or(&args.kv_blocks, scenario.kv_blocks) {
            let sessions = match &scenario.source {
                Source::Agent(agent) => or(&args.sessions, agent.sessions),
                Source::Template { requests, .. } => or(&args.sessions, *requests),
                Source::Trace(_) => vec![0],
            };
            for n in sessions {
                let mut s = scenario.clone();
                (s.backends, s.kv_blocks) = (backends, kv_blocks);
                s.concurrency = args.concurrency.unwrap_or(s.concurrency);
                if let (Some(flows), Some(n)) = (s.flows.as_mut(), args.standing_slots) {
                    flows.standing_slots = n;
                    s.name.push_str(&format!(" standing={n}"));
                }
                let flow_load = match (s.flows.as_mut(), args.flow_scale) {
                    (Some(flows), Some(k)) if k > 1 => {
                        let load = args.flow_load.unwrap_or(k).max(1);
                        flows.scale(load);
                        s.max_num_seqs *= k;
                        s.name.push_str(&format!(" x{k}"));
                        if load != k {
                            s.name.push_str(&format!(" load {load}"));
                        }
                        load
                    }
                    _ => 1,
                };
                let (sessions, rate, prompts) = match &mut s.source {
                    Source::Agent(a) => {
                        (&mut a.sessions, &mut a.session_rate, &mut a.system_prompts)
                    }
                    Source::Template {
                        requests,
                        rate,
                        templates,
                    } => (requests, rate, templates),
                    Source::Trace(_) => {
                        out.extend(scaled(s, args)?);
                        continue;
                    }
                };
                *sessions = n * flow_load;
                *rate = args.session_rate.unwrap_or(*rate);
                *prompts = args.system_prompts.unwrap_or(*prompts);
                let swept =
                    args.backends.len() > 1 || args.kv_blocks.len() > 1 || args.sessions.len() > 1;
                if swept {
                    s.name = format!(
                        "{} b={backends} kv={kv_blocks}{}",
                        s.name,
                        session_label(&s.source)
                    );
                }
                out.extend(scaled(s, args)?);
            }
        }
    }
    Ok(out)
}

/// `scenario` once per `--kv-scale` point, its KV per backend that share of its sessions'
/// final contexts; as it is without the option.
fn scaled(scenario: Scenario, args: &LabArgs) -> Result<Vec<Scenario>, LabError> {
    if args.kv_scale.is_empty() {
        return Ok(vec![scenario]);
    }
    if args.kv_scale.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
        return Err(LabError::Invalid("--kv-scale must be > 0".into()));
    }
    let finals = final_contexts(&scenario, args.seed)?;
    let block = SimConfig::default().block_tokens as f64;
    Ok((args.kv_scale.iter())
        .map(|&x| {
            let mut s = scenario.clone();
            let per_backend = x * finals as f64 / s.backends.max(1) as f64;
            s.kv_blocks = ((per_backend / block).ceil() as usize).max(1);
            s.name = format!("{} kv={x}x", s.name);
            s
        })
        .collect())
}

/// The sum of every session's last prompt, tokens (an agent workload's final contexts).
fn final_contexts(scenario: &Scenario, seed: u64) -> Result<u64, LabError> {
    if !matches!(scenario.source, Source::Agent(_)) {
        return Err(LabError::Invalid(format!(
            "--kv-scale needs an agent scenario, not {}",
            scenario.name
        )));
    }
    let workload = Workload::load(&scenario_args(scenario, seed))?;
    let sessions = workload.plan().sessions().iter();
    Ok(sessions
        .filter_map(|s| s.turns().last())
        .map(|t| t.prompt_tokens())
        .sum())
}

fn session_label(source: &Source) -> String {
    match source {
        Source::Agent(Agent { sessions, .. })
        | Source::Template {
            requests: sessions, ..
        } => {
            format!(" s={sessions}")
        }
        Source::Trace(_) => String::new(),
    }
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
mod tests {
    use super::*;

    /// A small agent setting: 4 sessions on 2 backends with little KV.
    pub fn small() -> Setting {
        Setting {
            scenario: Scenario {
                name: "small".into(),
                about: "test",
                source: Source::Agent(Agent::new(4, 0.5, 2)),
                backends: 2,
                kv_blocks: 4_000,
                concurrency: 64,
                max_model_len: 131_072,
                max_num_seqs: 256,
                flows: None,
            },
            max_tree_size: None,
            unknown_capacity: false,
            calibrate: true,
            max_inflight_per_backend: 0,
            replicas: 1,
            scrape_interval: 1.0,
            shared_table: true,
            note_delay: 0.002,
            seed: 3,
            max_requests: Some(120),
            send_session_header: false,
            index: IndexMode::Text,
            bypass: 0.0,
            restart: false,
        }
    }

    #[test]
    fn the_same_inputs_give_byte_identical_results() {
        let policies: Vec<String> = policy::names().iter().map(|p| p.to_string()).collect();
        let run = || {
            let results = compare(&small(), &policies, &mut |_| {}).unwrap();
            serde_json::to_string(&results).unwrap()
        };
        let first = run();
        assert!(first.contains("kv_aware") && first.contains("hit_rate"));
        assert_eq!(first, run());
        let mut other = small();
        other.seed = 4;
        let differs =
            serde_json::to_string(&compare(&other, &policies, &mut |_| {}).unwrap()).unwrap();
        assert_ne!(first, differs);
    }

    #[test]
    fn every_request_is_answered_and_counted() {
        let results = compare(&small(), &["kv_aware".to_string()], &mut |_| {}).unwrap();
        let report = &results[0].report;
        assert_eq!((report.requests.sent, report.requests.ok), (120, 120));
        assert!(
            report.hit_rate.is_some_and(|h| h > 0.3),
            "{:?}",
            report.hit_rate
        );
        let backends = report.backends.as_ref().unwrap();
        assert_eq!(backends.rows.len(), 2);
        assert_eq!(results[0].decisions.values().sum::<u64>(), 120);
    }

    /// A small noisy neighbour on 2 backends of 2 slots: tenant `a`'s 16 sessions, 8 in
    /// flight (0: drawn, not sent), beside tenant `b`'s 2, 1 in flight, measured; with a
    /// tenants file when `control`.
    fn neighbours(a_concurrency: usize, control: bool) -> Setting {
        let mut setting = small();
        setting.max_requests = None;
        let mut agent = Agent::new(18, 100.0, 2);
        agent.contexts = (0, 12_000);
        let flow = |tenant, sessions, concurrency, measured| scenario::Flow {
            tenant,
            priority: prefix_router_core::flow::Priority::Normal,
            sessions,
            concurrency,
            delay: if measured { 1.0 } else { 0.0 },
            measured,
        };
        setting.scenario = Scenario {
            source: Source::Agent(agent),
            max_num_seqs: 2,
            flows: Some(scenario::Flows {
                flows: vec![flow("a", 16, a_concurrency, false), flow("b", 2, 1, true)],
                control,
                max_queued: 1024,
                standing_slots: 0,
            }),
            ..setting.scenario
        };
        setting
    }

    fn measured(setting: &Setting) -> world::FlowResult {
        let results = compare(setting, &["kv_aware".to_string()], &mut |_| {}).unwrap();
        let flows = &results[0].flows;
        assert_eq!(flows.len(), 2);
        flows.iter().find(|f| f.measured).unwrap().clone()
    }

    #[test]
    fn flows_split_the_sessions_and_a_tenants_file_keeps_the_light_tenants_ttft() {
        let alone = measured(&neighbours(0, true));
        let fcfs = measured(&neighbours(8, false));
        let control = measured(&neighbours(8, true));
        let turns = alone.ok;
        assert!(turns > 2, "b's two sessions sent {turns} requests");
        for b in [&fcfs, &control] {
            assert_eq!(
                (b.ok, b.shed, b.failed),
                (turns, 0, 0),
                "every turn of b answered"
            );
        }
        let p99 = |f: &world::FlowResult| f.ttft_ms.as_ref().unwrap().p99;
        assert!(
            p99(&control) < p99(&fcfs) / 2.0,
            "b's TTFT p99: {} ms with a tenants file, {} ms without",
            p99(&control),
            p99(&fcfs)
        );
        let json = |s: &Setting| {
            let results = compare(s, &["kv_aware".to_string()], &mut |_| {}).unwrap();
            serde_json::to_string(&results).unwrap()
        };
        let once = json(&neighbours(8, true));
        assert!(once.contains("\"flows\""));
        assert_eq!(once, json(&neighbours(8, true)), "deterministic");
        assert!(!json(&small()).contains("\"flows\""), "no flows, no field");
    }

    #[test]
    fn a_flow_scale_multiplies_the_engines_and_a_flow_load_the_flows_and_the_queue() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            lab: LabArgs,
        }
        let all = scenario::all(std::path::Path::new("."));
        let noisy = all.iter().find(|s| s.name == "noisy-neighbour").unwrap();
        let scaled = |args: &[&str]| {
            let args = <Cli as clap::Parser>::parse_from([&["lab"], args].concat()).lab;
            let s = sweep(noisy, &args).unwrap().remove(0);
            let flows = s.flows.as_ref().unwrap();
            let sizes: Vec<_> = (flows.flows.iter())
                .map(|f| (f.sessions, f.concurrency))
                .collect();
            let Source::Agent(agent) = &s.source else {
                panic!("an agent workload");
            };
            let sessions = agent.sessions;
            (
                s.name.clone(),
                s.max_num_seqs,
                sizes,
                flows.max_queued,
                sessions,
            )
        };
        assert_eq!(
            scaled(&["--flow-scale", "4"]),
            (
                "noisy-neighbour x4".to_string(),
                16,
                vec![(512, 256), (32, 16)],
                4096,
                544
            )
        );
        assert_eq!(
            scaled(&["--flow-scale", "4", "--flow-load", "2"]),
            (
                "noisy-neighbour x4 load 2".to_string(),
                16,
                vec![(256, 128), (16, 8)],
                2048,
                272
            ),
            "the engines 4 times, the flows twice"
        );
    }

    /// `high`'s 2 sessions (1 in flight, measured) beside `normal`'s and `low`'s 16 each
    /// (4 in flight each) on the small fleet, a queue of 2, `standing` slots.
    fn priorities(standing: usize) -> Setting {
        use prefix_router_core::flow::Priority;
        let mut setting = neighbours(4, true);
        let Some(flows) = setting.scenario.flows.as_mut() else {
            panic!("no flows");
        };
        let flow = |priority, sessions, concurrency, measured| scenario::Flow {
            tenant: "p",
            priority,
            sessions,
            concurrency,
            delay: if measured { 1.0 } else { 0.0 },
            measured,
        };
        flows.flows = vec![
            flow(Priority::Normal, 16, 4, false),
            flow(Priority::Low, 16, 4, false),
            flow(Priority::High, 2, 1, true),
        ];
        flows.max_queued = 2;
        flows.standing_slots = standing;
        setting
    }

    #[test]
    fn under_priorities_low_is_shed_before_normal_and_high_never() {
        let setting = priorities(0);
        let results = compare(&setting, &["kv_aware".to_string()], &mut |_| {}).unwrap();
        let [normal, low, high] = &results[0].flows[..] else {
            panic!("three flows");
        };
        assert_eq!((high.shed, high.failed), (0, 0));
        assert!(high.ok > 2, "high answered {}", high.ok);
        let share = |f: &world::FlowResult| f.shed as f64 / (f.ok + f.shed).max(1) as f64;
        assert!(
            share(low) > share(normal),
            "shed: low {} of {}, normal {} of {}",
            low.shed,
            low.ok + low.shed,
            normal.shed,
            normal.ok + normal.shed
        );
    }

    /// `high`'s 4 sessions, 2 in flight, arriving at 3 s (the holds learned) at a fleet
    /// full of `normal`'s and `low`'s requests: its first turns start at once where a
    /// standing slot was left for them.
    #[test]
    fn a_standing_slot_lets_highs_first_turns_start_at_once_beside_full_floods() {
        let first_turn = |standing| {
            let mut setting = priorities(standing);
            let flows = setting.scenario.flows.as_mut().unwrap();
            let high = flows.flows.iter_mut().find(|f| f.measured).unwrap();
            (high.delay, high.sessions, high.concurrency) = (3.0, 4, 2);
            let results = compare(&setting, &["kv_aware".to_string()], &mut |_| {});
            let flows = results.unwrap().remove(0).flows;
            let high = flows.iter().find(|f| f.measured).unwrap().clone();
            assert_eq!((high.shed, high.failed), (0, 0));
            high.first_turn_max_ms.unwrap()
        };
        let (none, one) = (first_turn(0), first_turn(1));
        assert!(
            one < none * 0.8,
            "high's slowest first turn: {one} ms with a standing slot, {none} ms without"
        );
    }
}
