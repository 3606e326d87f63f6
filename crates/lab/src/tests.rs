//! The lab's results: deterministic, complete, and the flow scenarios' guarantees.

use super::*;
use crate::scenario::Agent;
use crate::settings::sweep;

/// A small agent setting: 4 sessions on 2 backends with little KV.
pub fn small() -> Setting {
    Setting {
        seed: 3,
        max_requests: Some(120),
        ..Setting::of(Scenario::small(4, 2))
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
    let differs = serde_json::to_string(&compare(&other, &policies, &mut |_| {}).unwrap()).unwrap();
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

/// On vLLM's engine steps every request is answered too, deterministically, and the
/// timing is the steps' own: a step's fixed time and chunked prefills move the tail.
#[test]
fn on_engine_steps_every_request_is_answered_the_same_way_twice() {
    let stepped = Setting {
        max_num_batched_tokens: 2048,
        ..small()
    };
    let report = |setting: &Setting| {
        let mut results = compare(setting, &["kv_aware".to_string()], &mut |_| {}).unwrap();
        results.remove(0).report
    };
    let json = |setting: &Setting| serde_json::to_string(&report(setting)).unwrap();
    let first = report(&stepped);
    assert_eq!((first.requests.sent, first.requests.ok), (120, 120));
    assert_eq!(serde_json::to_string(&first).unwrap(), json(&stepped));
    assert_ne!(json(&stepped), json(&small()));
}

/// Without a tenants file, what waits past the router's in-flight limit waits in its
/// queue as the proxy's does: a wait past the router's default `queue_timeout` (30 s)
/// gets 503, and the rest is answered.
#[test]
fn without_a_tenants_file_a_wait_past_the_queue_timeout_is_shed() {
    let base = small();
    let setting = Setting {
        scenario: Scenario {
            source: WorkloadSource::Agent(Agent::new(64, 8.0, 2)),
            ..base.scenario.clone()
        },
        max_inflight_per_backend: 1,
        max_requests: Some(300),
        ..base
    };
    let results = compare(&setting, &["kv_aware".to_string()], &mut |_| {}).unwrap();
    let requests = &results[0].report.requests;
    let shed = requests.errors.get("http_503").copied().unwrap_or(0);
    assert!(shed > 0 && requests.ok > 0, "{requests:?}");
    assert_eq!(
        (requests.ok + shed, requests.failed),
        (requests.sent, shed),
        "{requests:?}"
    );
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
        source: WorkloadSource::Agent(agent),
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
    struct LabCli {
        #[command(flatten)]
        lab: LabArgs,
    }
    let all = scenario::all(std::path::Path::new("."));
    let noisy = all.iter().find(|s| s.name == "noisy-neighbour").unwrap();
    let scaled = |args: &[&str]| {
        let args = <LabCli as clap::Parser>::parse_from([&["lab"], args].concat()).lab;
        let s = sweep(noisy, &args).unwrap().remove(0);
        let flows = s.flows.as_ref().unwrap();
        let sizes: Vec<_> = (flows.flows.iter())
            .map(|f| (f.sessions, f.concurrency))
            .collect();
        let WorkloadSource::Agent(agent) = &s.source else {
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
