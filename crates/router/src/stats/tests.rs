use std::time::Duration;

use super::*;

#[test]
fn totals_add_up_what_was_recorded() {
    let stats = Stats::new(&Registry::new(), "kv_aware");
    stats.request(Some(Endpoint::Chat), 200, Some("http://b:1"));
    stats.request(None, 0, None);
    let usage = Usage {
        prompt: 10,
        cached: 4,
        completion: 2,
    };
    stats.exchange("http://b:1", None, Duration::from_millis(3), Some(usage));
    stats.decision(Outcome::PrefixHit, TextBytes(3), TextBytes(4));
    stats.retry(RetryReason::Reset);
    stats.reload(true);
    stats.next_generation();
    let b = stats.backend_totals("http://b:1");
    assert_eq!((b.requests, b.prompt_tokens, b.cached_tokens), (1, 10, 4));
    let t = stats.totals();
    assert_eq!(
        (t.matched_bytes, t.text_bytes, t.retries, t.generation),
        (3, 4, 1, 2)
    );
    let text = String::from_utf8(stats.render()).unwrap();
    assert!(
        text.contains(
            "prefix_router_requests_total{backend=\"-\",route=\"other\",status=\"none\"} 1"
        )
    );
    assert!(text.contains("prefix_router_config_reloads_total{result=\"ok\"} 1"));
}
