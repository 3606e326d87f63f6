//! End to end: simulated backends, the router and a replay, as the demo runs them. On a small
//! multi-turn workload, cache_aware must get a clearly higher hit rate than round_robin.

use prefix_router_demo::{DemoArgs, compare};
use prefix_router_replay::compare as chart;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_aware_beats_round_robin_on_multi_turn_sessions() {
    let dir = std::env::temp_dir().join(format!("prefix-router-demo-{}", std::process::id()));
    let args = DemoArgs {
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
    };
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
