//! End to end: simulated backends, the router and a replay, as the demo runs them. On a small
//! multi-turn workload, cache_aware must get a clearly higher hit rate than round_robin.
//! The flow-control scenarios run and report every flow: in the noisy neighbour both
//! tenants are served; under priority, `high` is never shed and `low` is shed first.

use prefix_router_demo::{DemoArgs, DemoScenario, compare, flows};
use prefix_router_replay::compare as chart;

fn args(dir: std::path::PathBuf) -> DemoArgs {
    DemoArgs {
        policies: vec!["round_robin".into(), "cache_aware".into()],
        backends: 4,
        trace: None,
        speedup: 50.0,
        sessions: 6,
        session_rate: 2.0,
        max_requests: Some(150),
        send_session_header: false,
        kv_blocks: 26_250,
        max_tree_size: None,
        concurrency: 64,
        out_dir: dir,
        replicas: 1,
        no_shared_table: false,
        tokenizer: None,
        kv_events: false,
        scenario: DemoScenario::Policies,
        max_num_seqs: 4,
        scenario_seconds: 30.0,
    }
}

fn dir(name: &str) -> std::path::PathBuf {
    crate::support::scratch_dir(&format!("demo-{name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_aware_beats_round_robin_on_multi_turn_sessions() {
    let args = args(dir("policies"));
    let results = compare(&args, |_| {}).await.unwrap();
    let hit = |i: usize| results[i].report.hit_rate.unwrap();
    let (rr, ca) = (hit(0), hit(1));
    for r in &results {
        assert_eq!(r.report.requests.failed, 0, "{}: failed requests", r.policy);
        assert_eq!(r.report.requests.ok, 150, "{}", r.policy);
    }
    eprintln!("hit rate: round_robin {rr:.3}, cache_aware {ca:.3}");
    assert!(ca > 0.9, "cache_aware hit rate {ca:.3}");
    assert!(
        ca > rr + 0.05,
        "cache_aware {ca:.3} not clearly above round_robin {rr:.3}"
    );
    // Prefill work is what the hit rate saves: round robin must recompute at least twice
    // as many prompt tokens.
    assert!(
        1.0 - rr > 2.0 * (1.0 - ca),
        "uncached: rr {:.3} vs ca {:.3}",
        1.0 - rr,
        1.0 - ca
    );
    let svg = chart::svg(&results, args.speedup);
    assert!(
        svg.starts_with("<svg")
            && svg.contains("cache_aware")
            && svg.trim_end().ends_with("</svg>")
    );
    assert!(chart::table(&results, args.speedup).contains("round_robin"));
}

/// The flow scenarios' arguments: short runs, 8 slots in the fleet.
fn flow_args(scenario: DemoScenario) -> DemoArgs {
    DemoArgs {
        scenario,
        speedup: 20.0,
        max_num_seqs: 2,
        scenario_seconds: 4.0,
        ..args(dir("flows"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_noisy_neighbour_scenario_serves_both_tenants_and_reports_each() {
    let _heavy = crate::support::heavy().await;
    let results = flows::noisy_neighbour(&flow_args(DemoScenario::NoisyNeighbour), |_| {})
        .await
        .unwrap();
    let runs: Vec<(&str, &str)> = (results.iter())
        .map(|r| (r.run.as_str(), r.flow.as_str()))
        .collect();
    assert_eq!(
        runs,
        [("B alone", "B"), ("B beside A", "B"), ("B beside A", "A")]
    );
    for r in &results {
        assert!(
            r.report.requests.ok > 0,
            "{} in {}: nothing answered",
            r.flow,
            r.run
        );
        assert!(r.report.ttft_ms.is_some() && r.report.hit_rate.is_some());
    }
    assert_eq!(results[1].report.requests.failed, 0, "B is under its share");
    let table = flows::table(&results);
    assert_eq!(table.lines().count(), 4, "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_priority_scenario_sheds_low_first_and_never_high() {
    let _heavy = crate::support::heavy().await;
    let results = flows::priority(&flow_args(DemoScenario::Priority), |_| {})
        .await
        .unwrap();
    let shed = |flow: &str| {
        let r = results.iter().rfind(|r| r.flow == flow).unwrap();
        r.report
            .requests
            .errors
            .get("http_503")
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(results.len(), 4);
    assert_eq!(shed("high"), 0);
    assert!(
        shed("low") > 0,
        "twice the fleet's slots with a queue of half: some are shed"
    );
    assert!(
        shed("low") >= shed("normal"),
        "low {} normal {}",
        shed("low"),
        shed("normal")
    );
}
