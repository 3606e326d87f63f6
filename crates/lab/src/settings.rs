//! The settings a `lab` command line asks for: its scenarios, swept over the listed
//! backends, KV sizes, session counts, flow scales, replicas and index modes.

use prefix_router_replay::Workload;
use prefix_router_sim::SimConfig;

use crate::scenario::{self, Agent, Scenario, WorkloadSource};
use crate::{IndexMode, LabArgs, LabError, Setting, scenario_args};

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
            (s.name, s.source) = ("custom".into(), WorkloadSource::Trace(path.clone()));
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
                    scheduling: args.scheduling_policy,
                    max_num_batched_tokens: args.max_num_batched_tokens,
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
pub(crate) fn sweep(scenario: &Scenario, args: &LabArgs) -> Result<Vec<Scenario>, LabError> {
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
                WorkloadSource::Agent(agent) => or(&args.sessions, agent.sessions),
                WorkloadSource::Template { requests, .. } => or(&args.sessions, *requests),
                WorkloadSource::Trace(_) => vec![0],
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
                    WorkloadSource::Agent(a) => {
                        (&mut a.sessions, &mut a.session_rate, &mut a.system_prompts)
                    }
                    WorkloadSource::Template {
                        requests,
                        rate,
                        templates,
                    } => (requests, rate, templates),
                    WorkloadSource::Trace(_) => {
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
    if !matches!(scenario.source, WorkloadSource::Agent(_)) {
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

fn session_label(source: &WorkloadSource) -> String {
    match source {
        WorkloadSource::Agent(Agent { sessions, .. })
        | WorkloadSource::Template {
            requests: sessions, ..
        } => {
            format!(" s={sessions}")
        }
        WorkloadSource::Trace(_) => String::new(),
    }
}
