//! Unit tests of the public API on small hand-made trees.

use super::*;

const M: &[u8] = b"model";

fn b(i: u32) -> BackendId {
    BackendId(i)
}

/// One shard, so every text shares one tree.
fn one_shard(budget: usize) -> PrefixTrees {
    PrefixTrees::new(TreeConfig {
        budget: KeyBytes(budget),
        shards: 1,
        ..TreeConfig::default()
    })
}

fn matched(t: &PrefixTrees, parts: &[&str], id: u32) -> usize {
    t.matches(M, parts).matched(b(id))
}

fn ok(t: &PrefixTrees) {
    if let Err(e) = t.check_invariants() {
        panic!("{e}");
    }
}

#[test]
fn matched_lengths_after_inserts_splits_and_partial_edges() {
    let t = one_shard(1 << 20);
    t.insert(M, &["hello world"], b(1));
    assert_eq!(matched(&t, &["hello there"], 1), 6, "partial edge counts");
    t.insert(M, &["hello there"], b(2));
    ok(&t);
    assert_eq!(matched(&t, &["hello world"], 1), 11);
    assert_eq!(matched(&t, &["hello world"], 2), 6);
    assert_eq!(matched(&t, &["hello"], 1), 5);
    assert_eq!(matched(&t, &["hello"], 2), 5);
    assert_eq!(matched(&t, &["help"], 2), 3);
    assert_eq!(matched(&t, &["xhello"], 1), 0);
    t.insert(M, &["hello "], b(3));
    ok(&t);
    assert_eq!(
        matched(&t, &["hello world"], 3),
        6,
        "ends on a node boundary"
    );
    t.insert(M, &["hel"], b(4));
    ok(&t);
    assert_eq!(matched(&t, &["hello world"], 4), 3, "ends mid-edge: split");
    assert_eq!(matched(&t, &["hello world"], 1), 11);
    let m = t.matches(M, &["hello world!!"]);
    assert_eq!(m.total(), 13);
    assert_eq!(m.best(), 11);
    let all: Vec<_> = m.iter().collect();
    assert_eq!(all, vec![(b(1), 11), (b(2), 6), (b(3), 6), (b(4), 3)]);
}

#[test]
fn parts_boundaries_inside_edges() {
    let t = one_shard(1 << 20);
    t.insert(M, &["ab", "", "cdefgh", "ij"], b(1));
    t.insert(M, &["abcdefghijklmnop"], b(2));
    ok(&t);
    assert_eq!(matched(&t, &["a", "bcd", "", "efghi", "jX"], 1), 10);
    assert_eq!(matched(&t, &["a", "bcd", "", "efghi", "jklmnop"], 2), 16);
    assert_eq!(matched(&t, &["abcdefghijklmnopq"], 2), 16);
    assert_eq!(matched(&t, &["", "abcdeX"], 2), 5);
    let stats = t.stats();
    assert_eq!(stats.models[0].bytes, 16);
    assert_eq!(stats.backends, vec![(b(1), 10), (b(2), 16)]);
}

#[test]
fn empty_text_matches_nothing_and_records_nothing() {
    let t = one_shard(1 << 20);
    t.insert(M, &["abc"], b(1));
    let none: [&str; 0] = [];
    let m = t.matches(M, &none);
    assert_eq!((m.total(), m.best(), m.iter().count()), (0, 0, 0));
    let routed = t.route(M, &["", ""], |_| Some(b(2)));
    assert_eq!(
        routed,
        Some(Routed {
            backend: b(2),
            matched: 0,
            total: 0
        })
    );
    assert_eq!(t.stats().backends, vec![(b(1), 3)]);
    ok(&t);
}

#[test]
fn short_texts_share_shard_zero_and_extensions_share_a_shard() {
    let t = PrefixTrees::new(TreeConfig {
        shards: 8,
        shard_key_bytes: 8,
        ..TreeConfig::default()
    });
    t.insert(M, &["abc"], b(1));
    assert_eq!(
        matched(&t, &["abcdefg"], 1),
        3,
        "both shorter than the key: shard 0"
    );
    t.insert(M, &["0123456789"], b(2));
    assert_eq!(matched(&t, &["01234567", "89abc"], 2), 10);
    assert_eq!(matched(&t, &["0123456789"], 1), 0);
    let models = t.models.read();
    let tree = models.get(M).map(Arc::clone);
    drop(models);
    let tree = tree.unwrap();
    assert_eq!(tree.shards[0].lock().usage.first(), Some(&(b(1), 3)));
    ok(&t);
}

#[test]
fn models_do_not_share_trees() {
    let t = one_shard(1 << 20);
    t.insert(b"a", &["same text"], b(1));
    assert_eq!(t.matches(b"b", &["same text"]).best(), 0);
    assert_eq!(t.matches(b"a", &["same text"]).best(), 9);
    t.insert(b"b", &["same"], b(2));
    assert_eq!(t.matches(b"a", &["same text"]).matched(b(2)), 0);
    let names: Vec<_> = t.stats().models.into_iter().map(|m| m.model).collect();
    assert_eq!(names, vec!["a".to_string(), "b".to_string()]);
}

#[test]
fn route_lets_choose_see_matches_and_may_decline() {
    let t = one_shard(1 << 20);
    t.insert(M, &["shared prefix one"], b(1));
    let declined = t.route(M, &["shared prefix two"], |m| {
        assert_eq!(m.matched(b(1)), 14);
        None
    });
    assert_eq!(declined, None);
    assert_eq!(t.stats().backends, vec![(b(1), 17)]);
    assert_eq!(t.route(b"new model", &["text"], |_| None), None);
    assert_eq!(
        t.stats().models.len(),
        1,
        "a declined route creates no tree"
    );
    let routed = t.route(M, &["shared prefix two"], |_| Some(b(1)));
    assert_eq!(
        routed,
        Some(Routed {
            backend: b(1),
            matched: 14,
            total: 17
        })
    );
    assert_eq!(matched(&t, &["shared prefix two"], 1), 17);
    t.insert(M, &["shared prefix two"], b(1));
    assert_eq!(t.stats().backends, vec![(b(1), 20)], "re-insert is free");
    ok(&t);
}

#[test]
fn lru_eviction_removes_the_least_recent_unique_part() {
    let sys = "system-prompt:".to_string();
    let a = format!("{sys}{}", "a".repeat(100));
    let bb = format!("{sys}{}", "b".repeat(100));
    let t = one_shard(sys.len() + 100);
    t.insert(M, &[&a], b(1));
    t.insert(M, &[&bb], b(1));
    t.insert(M, &[&a], b(1));
    assert!(t.over_budget());
    let report = t.evict();
    ok(&t);
    assert_eq!(report.per_backend, vec![(b(1), 100)]);
    assert_eq!((report.nodes_removed, report.bytes_removed), (1, 100));
    assert_eq!(matched(&t, &[&a], 1), a.len());
    assert_eq!(matched(&t, &[&bb], 1), sys.len());
    assert_eq!(t.stats().backends, vec![(b(1), sys.len() + 100)]);
    assert!(!t.over_budget());
}

#[test]
fn shared_prefix_survives_for_a_backend_that_used_it_recently() {
    let p = "p".repeat(50);
    let (a, bb, c) = (
        format!("{p}{}", "a".repeat(100)),
        format!("{p}bbbb"),
        format!("{p}cc"),
    );
    let t = one_shard(70);
    t.insert(M, &[&a], b(1));
    t.insert(M, &[&bb], b(2));
    t.evict();
    ok(&t);
    assert_eq!(matched(&t, &[&a], 1), 0, "backend 1 lost everything");
    assert_eq!(matched(&t, &[&a], 2), 50, "the prefix stays for backend 2");
    assert_eq!(matched(&t, &[&bb], 2), 54);
    t.insert(M, &[&a], b(1));
    t.insert(M, &[&c], b(1));
    t.evict();
    ok(&t);
    assert_eq!(
        matched(&t, &[&c], 1),
        52,
        "recently used prefix kept for backend 1"
    );
    assert_eq!(matched(&t, &[&a], 1), 50);
}

#[test]
fn evicting_everything_drops_nodes_and_empty_models() {
    let t = one_shard(0);
    t.insert(b"x", &["abc", "def"], b(1));
    t.insert(b"y", &["abc"], b(2));
    t.insert(b"y", &["abd"], b(2));
    let report = t.evict();
    assert_eq!(report.models_removed, 2);
    assert_eq!((report.nodes_removed, report.bytes_removed), (4, 10));
    assert_eq!(t.stats(), TreeStats::default());
    ok(&t);
    t.insert(b"x", &["abc"], b(1));
    assert_eq!(t.matches(b"x", &["abc"]).best(), 3);
}

#[test]
fn retain_backends_drops_removed_backends_and_prunes() {
    let t = one_shard(1 << 20);
    t.insert(M, &["common-one"], b(1));
    t.insert(M, &["common-two"], b(2));
    t.insert(M, &["other"], b(2));
    t.retain_backends(|id| id != b(2));
    ok(&t);
    assert_eq!(matched(&t, &["common-two"], 2), 0);
    assert_eq!(matched(&t, &["common-one"], 1), 10);
    let stats = t.stats();
    assert_eq!(stats.backends, vec![(b(1), 10)]);
    assert_eq!((stats.models[0].bytes, stats.models[0].nodes), (10, 2));
    t.retain_backends(|_| false);
    assert!(t.stats().models.is_empty());
}

#[test]
fn over_budget_only_past_ten_percent() {
    let t = one_shard(100);
    t.insert(M, &["x".repeat(105)], b(1));
    assert!(!t.over_budget());
    t.insert(M, &["y".repeat(6)], b(1));
    assert!(t.over_budget());
    t.evict();
    assert!(!t.over_budget());
}

#[test]
fn a_node_can_have_all_256_children() {
    let t = one_shard(1 << 20);
    for byte in 0..=255u8 {
        t.insert(M, &[[byte, 1, 2]], b(u32::from(byte % 3)));
    }
    ok(&t);
    for byte in 0..=255u8 {
        let m = t.matches(M, &[[byte, 1, 9]]);
        assert_eq!(m.matched(b(u32::from(byte % 3))), 2);
    }
    assert_eq!(t.stats().models[0].nodes, 256);
}

#[test]
fn stats_report_bytes_nodes_and_backends() {
    let t = PrefixTrees::new(TreeConfig::default());
    let long = "L".repeat(100);
    t.insert(M, &[&long, "-one"], b(7));
    t.insert(M, &[&long, "-two"], b(3));
    t.insert(&[0xff, b'm'], &["short"], b(3));
    let s = t.stats();
    assert_eq!(s.models.len(), 2);
    let figures = |m: &ModelStats| (m.model.clone(), m.bytes, m.nodes);
    assert_eq!(figures(&s.models[0]), ("model".into(), 107, 3));
    assert_eq!(figures(&s.models[1]), ("\u{fffd}m".into(), 5, 1));
    // The heap holds at least every node slot (the roots too) and every edge byte.
    let slot = std::mem::size_of::<super::radix::Node>();
    assert!(s.models[0].heap >= 107 + 4 * slot, "{}", s.models[0].heap);
    assert_eq!(s.backends, vec![(b(3), 109), (b(7), 104)]);
}

#[test]
fn many_backends_on_one_path_in_any_order() {
    let t = one_shard(1 << 20);
    let text = "0123456789".repeat(20);
    for i in 0..100u32 {
        let id = (i * 37) % 100;
        let len = 1 + (id as usize * 7) % 200;
        t.insert(M, &[&text[..len]], b(id));
    }
    ok(&t);
    let m = t.matches(M, &[&text]);
    assert_eq!(m.iter().count(), 100);
    assert!(m.iter().map(|(id, _)| id).is_sorted());
    for (id, got) in m.iter() {
        assert_eq!(got, 1 + (id.0 as usize * 7) % 200);
    }
}

#[cfg(target_pointer_width = "64")]
#[test]
fn node_size_is_as_documented() {
    assert_eq!(std::mem::size_of::<radix::Node>(), 88);
}

#[test]
fn concurrent_routes_keep_the_trees_consistent() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<PrefixTrees>();
    let t = PrefixTrees::new(TreeConfig {
        shards: 4,
        shard_key_bytes: 2,
        ..TreeConfig::default()
    });
    std::thread::scope(|s| {
        for w in 0..4u32 {
            let t = &t;
            s.spawn(move || {
                for i in 0..300u32 {
                    let text = format!("{}{}-{}", i % 7, "z".repeat((i % 13) as usize), i % 5);
                    t.route(M, &[text.as_bytes()], |m| Some(b(m.best() as u32 % 2 + w)));
                    if i % 50 == 0 {
                        t.evict();
                    }
                }
            });
        }
    });
    ok(&t);
}

#[test]
fn evicting_most_of_a_tree_renumbers_what_is_left_densely() {
    let sys = "system-prompt:";
    let texts: Vec<String> = (0..200)
        .map(|i| format!("{sys}{i:04}{}", "x".repeat(96)))
        .collect();
    let t = one_shard(texts[0].len() * 10);
    for text in &texts {
        t.insert(M, &[text], b(1));
    }
    t.evict();
    ok(&t);
    // The ten most recent conversations remain whole, in an arena without free slots.
    for text in &texts[190..] {
        assert_eq!(matched(&t, &[text], 1), text.len());
    }
    assert_eq!(matched(&t, &[&texts[0]], 1), "system-prompt:0".len());
    let models = t.models.read();
    let radix = models.values().next().unwrap().shards[0].lock();
    assert_eq!(radix.nodes.len(), radix.live + 1);
    assert!(radix.free.is_empty());
}

#[test]
fn a_backend_with_a_budget_of_its_own_is_evicted_down_to_it() {
    let t = one_shard(1000);
    let long = "x".repeat(600);
    let other = "y".repeat(600);
    t.insert(M, &[long.as_str()], b(0));
    t.insert(M, &[other.as_str()], b(1));
    t.set_budget(b(1), Some(KeyBytes(100)));
    assert!(t.eviction_due() || t.over_budget());
    t.evict();
    assert_eq!(matched(&t, &[long.as_str()], 0), 600);
    assert_eq!(matched(&t, &[other.as_str()], 1), 0);
    t.set_budget(b(1), None);
    assert_eq!(t.budget(b(1)), KeyBytes(1000));
}
