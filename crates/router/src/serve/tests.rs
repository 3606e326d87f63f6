use std::time::Duration;

use prefix_router_core::policy::Outcome;
use prefix_router_core::request::Endpoint;
use prefix_router_core::units::TextBytes;

use super::PartMetrics;
use crate::admission::ShedReason;
use crate::stats::{Registry, Usage};

#[test]
fn the_grafana_dashboard_uses_only_exported_metrics() {
    let registry = Registry::new();
    PartMetrics::new(&registry, "kv_aware");
    let names = registry.names();
    let dashboard = include_str!("../../../../conf/grafana-dashboard.json");
    let used: Vec<&str> = dashboard
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("prefix_router_"))
        .collect();
    assert!(used.len() > 10);
    for name in used {
        let base = name.strip_suffix("_bucket").unwrap_or(name);
        assert!(names.iter().any(|n| n == base), "{name} is not exported");
    }
}

#[test]
fn every_part_registers_distinct_names() {
    let registry = Registry::new();
    PartMetrics::new(&registry, "kv_aware");
    let mut names = registry.names();
    let all = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), all);
    assert!(all >= 38, "{all} metrics");
}

#[test]
fn renders_every_part_with_every_closed_label_value() {
    let registry = Registry::new();
    let metrics = PartMetrics::new(&registry, "kv_aware");
    let stats = &metrics.stats;
    stats.request(Some(Endpoint::Chat), 200, Some("http://b:1"));
    let usage = Usage {
        prompt: 10,
        cached: 4,
        completion: 2,
    };
    stats.exchange("http://b:1", None, Duration::from_millis(3), Some(usage));
    stats.decision(Outcome::PrefixHit, TextBytes(3), TextBytes(4));
    metrics.admission.shed(ShedReason::QueueFull);
    let text = String::from_utf8(registry.render()).unwrap();
    for line in [
        "prefix_router_requests_total{backend=\"http://b:1\",route=\"chat\",status=\"200\"} 1",
        "prefix_router_backend_cached_tokens_total{backend=\"http://b:1\"} 4",
        "prefix_router_decisions_total{outcome=\"prefix_hit\",policy=\"kv_aware\"} 1",
        "prefix_router_shed_total{reason=\"queue_full\"} 1",
        "prefix_router_shed_total{reason=\"budget\"} 0",
        "prefix_router_config_reloads_total{result=\"failed\"} 0",
        "prefix_router_shared_table_notes_total{direction=\"dropped\"} 0",
        "prefix_router_trace_spans_total{outcome=\"queue_full\"} 0",
        "prefix_router_prompt_tokens_total{source=\"reused\"} 0",
        "prefix_router_config_generation 1",
    ] {
        assert!(text.contains(line), "missing {line}");
    }
    assert!(!text.contains("prefix_router_backend_requests"));
}
