//! Unit tests of the timing model, on the simulated clock (a child module of `engine`).

use super::*;

const TOL: f64 = 1e-9;

fn timing() -> Timing {
    Timing {
        prefill_tokens_per_s: 30_000.0,
        attention_tokens: 0.0,
        prefill_overhead_s: 0.020,
        decode_s_per_token: 0.007,
        max_num_batched_tokens: 0,
        max_num_seqs: 256,
        block_tokens: 16,
        transfer_s_per_block: 0.001,
        scheduling: Scheduling::Fcfs,
    }
}

/// A request whose prompt blocks are named by `tag` (equal tags share every block).
fn req(id: u64, tag: u64, prompt_tokens: usize, output_tokens: usize) -> EngineRequest {
    let hashes = (0..prompt_tokens / 16)
        .map(|i| (tag << 40) | i as u64)
        .collect();
    EngineRequest {
        id,
        hashes,
        prompt_tokens,
        output_tokens,
        token_ids: Vec::new(),
        priority: 0,
        remote_blocks: 0,
    }
}

fn run_to_idle(core: &mut EngineCore) -> Vec<Output> {
    while let Some(at) = core.next_deadline() {
        core.advance(at);
    }
    core.take_outputs()
}

fn first_token(outputs: &[Output], want: u64) -> (f64, f64, usize) {
    outputs
        .iter()
        .find_map(|o| match *o {
            Output::FirstToken {
                id,
                at,
                ttft,
                cached_tokens,
            } if id == want => Some((at, ttft, cached_tokens)),
            _ => None,
        })
        .expect("first token")
}

fn finished(outputs: &[Output], want: u64) -> f64 {
    outputs
        .iter()
        .find_map(|o| match *o {
            Output::Finished { id, at, .. } if id == want => Some(at),
            _ => None,
        })
        .expect("finished")
}

/// The cached tokens `want` was admitted with, if it was.
fn cached_on_admission(outputs: &[Output], want: u64) -> Option<usize> {
    outputs.iter().find_map(|o| match *o {
        Output::Admitted {
            id, cached_tokens, ..
        } if id == want => Some(cached_tokens),
        _ => None,
    })
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < TOL
}

#[test]
fn lone_prefill_is_overhead_plus_tokens_over_throughput() {
    let mut core = EngineCore::new(timing(), 26_000);
    core.submit(req(1, 1, 30_000, 10));
    let out = run_to_idle(&mut core);
    let (at, ttft, cached) = first_token(&out, 1);
    assert!(close(at, 1.020), "{at}");
    assert!(close(ttft, 1.020));
    assert_eq!(cached, 0);
    // 9 more tokens at 7 ms.
    assert!(close(finished(&out, 1), 1.020 + 9.0 * 0.007));
    assert_eq!(core.cache().pinned(), 0);
}

#[test]
fn attention_makes_a_turn_after_a_long_context_cost_more() {
    // A token at position p costs 1 + p / 10 000 tokens of the 30K tokens/s.
    let attending = Timing {
        attention_tokens: 10_000.0,
        ..timing()
    };
    let mut core = EngineCore::new(attending, 26_000);
    core.submit(req(1, 7, 20_000, 1));
    let out = run_to_idle(&mut core);
    // 20 000 + 20 000² / 20 000 = 40 000 tokens of work.
    assert!(close(first_token(&out, 1).0, 0.020 + 40_000.0 / 30_000.0));
    // The same 20 000 tokens then 1 600 more, computed after the 20 000 cached.
    let start = core.now();
    core.submit(req(2, 7, 21_600, 1));
    let out = run_to_idle(&mut core);
    let (at, _, cached) = first_token(&out, 2);
    assert_eq!(cached, 20_000);
    let work = 1_600.0 + (21_600f64.powi(2) - 20_000f64.powi(2)) / 20_000.0;
    assert!(close(at - start, 0.020 + work / 30_000.0), "{}", at - start);
}

#[test]
fn tokens_of_inverts_the_work_of_a_prefill() {
    let attending = Timing {
        attention_tokens: 3_000.0,
        ..timing()
    };
    for (from, tokens) in [(0, 1), (0, 5_000), (12_345, 678), (40_000, 40_000)] {
        let work = attending.work(from, tokens);
        let back = attending.tokens_of(from, work);
        assert!(
            (back - tokens as f64).abs() < 1e-6,
            "{from}+{tokens}: {back}"
        );
        assert!(attending.work(from, tokens) > tokens as f64);
    }
    assert_eq!(timing().work(12_345, 678), 678.0);
    assert_eq!(timing().tokens_of(12_345, 678.0), 678.0);
}

#[test]
fn concurrent_prefills_share_throughput() {
    let mut core = EngineCore::new(timing(), 26_000);
    core.submit(req(1, 1, 30_000, 1));
    core.submit(req(2, 2, 30_000, 1));
    let out = run_to_idle(&mut core);
    assert!(close(first_token(&out, 1).0, 2.020));
    assert!(close(first_token(&out, 2).0, 2.020));
    // One output token: finished with the first token.
    assert!(close(finished(&out, 2), 2.020));
}

#[test]
fn staggered_prefills_follow_processor_sharing() {
    let mut core = EngineCore::new(timing(), 26_000);
    core.submit(req(1, 1, 30_000, 1));
    core.advance(0.52);
    core.submit(req(2, 2, 15_000, 1));
    let out = run_to_idle(&mut core);
    // A alone 0.02..0.54 (15.6K done), then both at 15K/s: A's 14.4K end at 1.50;
    // B has 600 left then, alone at 30K/s: 1.52.
    assert!(
        close(first_token(&out, 1).0, 1.50),
        "{:?}",
        first_token(&out, 1)
    );
    assert!(
        close(first_token(&out, 2).0, 1.52),
        "{:?}",
        first_token(&out, 2)
    );
}

#[test]
fn cache_hit_shortens_prefill_and_keeps_last_token() {
    let mut core = EngineCore::new(timing(), 26_000);
    core.submit(req(1, 7, 30_000, 1));
    run_to_idle(&mut core);
    let start = core.now();
    core.submit(req(2, 7, 30_000, 1));
    let out = run_to_idle(&mut core);
    let (at, _, cached) = first_token(&out, 2);
    // 30000 tokens = 1875 full blocks; the cap leaves the last block to compute.
    assert_eq!(cached, 30_000 - 16);
    assert!(close(at - start, 0.020 + 16.0 / 30_000.0), "{}", at - start);
    let admitted = out.iter().any(|o| {
        matches!(
            o,
            Output::Admitted {
                id: 2,
                cached_tokens: 29_984,
                ..
            }
        )
    });
    assert!(admitted);
}

#[test]
fn max_num_seqs_queues_and_ttft_includes_queueing() {
    let mut core = EngineCore::new(
        Timing {
            max_num_seqs: 1,
            ..timing()
        },
        26_000,
    );
    core.submit(req(1, 1, 3_000, 11));
    core.submit(req(2, 2, 3_000, 1));
    assert_eq!((core.running(), core.waiting()), (1, 1));
    let out = run_to_idle(&mut core);
    let end1 = 0.020 + 0.1 + 10.0 * 0.007;
    assert!(close(finished(&out, 1), end1));
    let (at, ttft, _) = first_token(&out, 2);
    assert!(close(at, end1 + 0.120));
    assert!(close(ttft, at));
    assert_eq!((core.running(), core.waiting()), (0, 0));
}

#[test]
fn priority_scheduling_admits_the_lowest_priority_value_first_and_stops_no_one() {
    let admitted = |scheduling| {
        let one_seat = Timing {
            max_num_seqs: 1,
            scheduling,
            ..timing()
        };
        let mut core = EngineCore::new(one_seat, 26_000);
        for (id, priority) in [(1, 1), (2, 1), (3, -1), (4, 0), (5, -1)] {
            core.submit(EngineRequest {
                priority,
                ..req(id, id, 320, 2)
            });
        }
        let order: Vec<u64> = (run_to_idle(&mut core).iter())
            .filter_map(|o| match *o {
                Output::Admitted { id, .. } => Some(id),
                _ => None,
            })
            .collect();
        order
    };
    assert_eq!(admitted(Scheduling::Fcfs), [1, 2, 3, 4, 5]);
    assert_eq!(
        admitted(Scheduling::Priority),
        [1, 3, 5, 4, 2],
        "the running request keeps its seat; then lowest value, earliest arrival"
    );
}

#[test]
fn request_waits_for_blocks_and_oversized_is_rejected() {
    // 100 blocks; request 1 holds 64 + 16 = 80 of them.
    let mut core = EngineCore::new(timing(), 100);
    core.submit(req(1, 1, 1_024, 256));
    core.submit(req(2, 2, 512, 16));
    assert_eq!((core.running(), core.waiting()), (1, 1));
    core.submit(req(3, 3, 1_600, 16));
    let out = run_to_idle(&mut core);
    let end1 = finished(&out, 1);
    let admitted2 = out.iter().find_map(|o| match *o {
        Output::Admitted { id: 2, at, .. } => Some(at),
        _ => None,
    });
    assert_eq!(admitted2, Some(end1));
    assert!(out.contains(&Output::Rejected { id: 3 }));
    assert_eq!(core.blocks_needed(1_600, 16), 101);
}

#[test]
fn abort_releases_blocks_and_admits_the_next() {
    let mut core = EngineCore::new(
        Timing {
            max_num_seqs: 1,
            ..timing()
        },
        26_000,
    );
    core.submit(req(1, 1, 30_000, 100));
    core.submit(req(2, 2, 300, 1));
    core.advance(0.5);
    core.abort(1);
    assert_eq!(core.cache().pinned(), 19);
    let out = run_to_idle(&mut core);
    assert!(
        !out.iter()
            .any(|o| matches!(o, Output::FirstToken { id: 1, .. }))
    );
    assert!(close(first_token(&out, 2).0, 0.5 + 0.020 + 0.01));
    core.abort(2);
    core.abort(99);
    assert_eq!(core.cache().pinned(), 0);
}

#[test]
fn many_requests_all_finish_in_order_and_free_everything() {
    let mut core = EngineCore::new(
        Timing {
            max_num_seqs: 64,
            ..timing()
        },
        2_000,
    );
    let mut seed = 12_345u64;
    let mut rand = move |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    let (mut last_first, mut done) = (0.0, 0);
    let mut check = |outputs: Vec<Output>| {
        for output in outputs {
            match output {
                Output::FirstToken { at, ttft, .. } => {
                    assert!(at >= last_first && ttft >= 0.020 - TOL);
                    last_first = at;
                }
                Output::Finished { .. } => done += 1,
                _ => {}
            }
        }
    };
    for id in 0..1_000u64 {
        core.advance(id as f64 * 0.003);
        core.submit(req(
            id,
            rand(20),
            1 + rand(4_000) as usize,
            1 + rand(300) as usize,
        ));
        check(core.take_outputs());
    }
    check(run_to_idle(&mut core));
    assert_eq!(done, 1_000);
    assert_eq!((core.running(), core.waiting()), (0, 0));
    assert_eq!(core.cache().pinned(), 0);
    assert_eq!(core.cache().free(), 2_000);
}

#[test]
fn an_aborted_prefill_leaves_only_the_blocks_it_computed_cached() {
    let mut core = EngineCore::new(timing(), 26_000);
    core.submit(req(1, 1, 3_200, 10));
    // The overhead, then 1,500 of its 3,200 tokens prefilled.
    core.advance(0.020 + 0.05);
    core.abort(1);
    core.submit(req(2, 1, 3_200, 10));
    let out = run_to_idle(&mut core);
    let cached = cached_on_admission(&out, 2);
    assert_eq!(cached, Some(1_500 / 16 * 16), "{out:?}");
}

#[test]
fn a_hit_on_blocks_still_prefilling_waits_for_them() {
    let mut core = EngineCore::new(timing(), 26_000);
    core.submit(req(1, 7, 30_000, 1));
    core.advance(0.1);
    // The same prompt while the first prefills: a hit, computed by the first alone.
    core.submit(req(2, 7, 30_000, 1));
    let out = run_to_idle(&mut core);
    let (first, _, _) = first_token(&out, 1);
    let (second, _, cached) = first_token(&out, 2);
    assert_eq!(cached, 30_000 - 16);
    // The second computes its last block in 20 ms + a moment, long before the first
    // ends; its first token waits for the first's.
    assert!(close(second, first), "{second} {first}");
    assert!(first > 1.0, "{first}");
}

#[test]
fn an_aborted_prefill_frees_the_requests_waiting_on_its_blocks() {
    let mut core = EngineCore::new(timing(), 26_000);
    core.submit(req(1, 7, 30_000, 1));
    core.advance(0.1);
    core.submit(req(2, 7, 30_000, 1));
    core.advance(0.2);
    assert!(
        core.take_outputs()
            .iter()
            .all(|o| !matches!(o, Output::FirstToken { .. }))
    );
    core.abort(1);
    let out = run_to_idle(&mut core);
    let (at, _, _) = first_token(&out, 2);
    assert!(close(at, 0.2), "{at}");
}

#[test]
fn a_decode_leg_loads_the_blocks_a_remote_prefill_computed_instead_of_computing_them() {
    let first_token = |remote_blocks: usize| {
        let mut core = EngineCore::new(timing(), 1000);
        core.submit(EngineRequest {
            remote_blocks,
            ..req(1, 1, 1600, 2)
        });
        let outputs = run_to_idle(&mut core);
        (outputs.iter())
            .find_map(|o| match *o {
                Output::FirstToken {
                    ttft,
                    cached_tokens,
                    ..
                } => Some((ttft, cached_tokens)),
                _ => None,
            })
            .unwrap()
    };
    let (computed, none) = first_token(0);
    assert_eq!(none, 0);
    assert!(
        (computed - (0.020 + 1600.0 / 30_000.0)).abs() < TOL,
        "{computed}"
    );
    // 99 of its 100 blocks loaded (the last token is always computed), 1 ms each.
    let (loaded, cached) = first_token(100);
    assert_eq!(cached, 99 * 16);
    assert!(
        (loaded - (0.020 + 0.099 + 16.0 / 30_000.0)).abs() < TOL,
        "{loaded}"
    );
}

/// Engine steps of at most 1,000 tokens, 10 ms each plus their prefill at 10,000 tokens/s,
/// and no overhead.
fn stepping() -> Timing {
    Timing {
        prefill_tokens_per_s: 10_000.0,
        prefill_overhead_s: 0.0,
        decode_s_per_token: 0.010,
        max_num_batched_tokens: 1_000,
        ..timing()
    }
}

#[test]
fn a_lone_request_steps_its_prefill_then_a_token_a_step() {
    let mut core = EngineCore::new(stepping(), 26_000);
    core.submit(req(1, 1, 160, 3));
    let out = run_to_idle(&mut core);
    // One step prefills all 160 tokens, then two steps decode.
    assert!(close(first_token(&out, 1).0, 0.010 + 0.016));
    assert!(close(finished(&out, 1), 0.026 + 2.0 * 0.010));
}

#[test]
fn a_long_prefill_is_chunked_and_slows_the_decodes_beside_it() {
    let mut core = EngineCore::new(stepping(), 26_000);
    core.submit(req(1, 1, 16, 10));
    core.submit(req(2, 2, 3_000, 2));
    let out = run_to_idle(&mut core);
    // Step 1 began with the first alone (16 prompt tokens, 0.0116 s); steps 2-4: its
    // decode and 999 of the second's tokens (0.1099 s each); step 5: its decode and the
    // second's last 3 tokens (0.0103 s).
    let prefilled = 0.0116 + 3.0 * 0.1099 + 0.0103;
    assert!(close(first_token(&out, 1).0, 0.0116));
    assert!(close(first_token(&out, 2).0, prefilled), "{out:?}");
    // The second's one more token in step 6; the first's last 5 of 9 in steps 6-10.
    assert!(close(finished(&out, 2), prefilled + 0.010));
    assert!(close(finished(&out, 1), prefilled + 5.0 * 0.010));
}

#[test]
fn an_aborted_stepped_prefill_leaves_the_blocks_of_its_ended_steps_cached() {
    let mut core = EngineCore::new(stepping(), 26_000);
    core.submit(req(1, 1, 3_200, 10));
    // Step 1 (1,000 tokens) ended at 0.11 s; step 2 is under way.
    core.advance(0.15);
    core.abort(1);
    core.submit(req(2, 1, 3_200, 10));
    let out = run_to_idle(&mut core);
    let cached = cached_on_admission(&out, 2);
    assert_eq!(cached, Some(1_000 / 16 * 16), "{out:?}");
    assert_eq!(core.running(), 0);
}

#[test]
fn a_request_admitted_after_a_long_prefill_waits_for_its_chunks() {
    let mut core = EngineCore::new(stepping(), 26_000);
    core.submit(req(1, 1, 3_000, 2));
    core.submit(req(2, 2, 16, 2));
    let out = run_to_idle(&mut core);
    // Three steps of 1,000 of the first's tokens (0.11 s each) spend the whole budget.
    assert!(close(first_token(&out, 1).0, 0.33));
    assert!(close(first_token(&out, 2).0, 0.33 + 0.010 + 0.0016));
}
