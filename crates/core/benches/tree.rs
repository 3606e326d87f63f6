//! Route latency of the prefix trees on a realistic fleet-sized tree, keyed as the router
//! keys them: by the chain of block hashes of each text (`request::blocks`), hashed inside
//! the timed part.
//!
//! Target: match plus insert of a 400 KB text against a tree already holding
//! 1,000 such conversations in at most 200 microseconds. The tree holds
//! 1,000 conversations of ~400 KB over 4 backends, sharing 5 system prompts
//! of 20 KB; texts are passed as ~80 message-sized parts borrowed from a
//! random corpus (never joined). Every iteration routes a fresh text, so the
//! tree keeps growing; the new-conversation case evicts (outside the timed
//! part) whenever the trees go over budget, as the router's background task
//! would. Each text is read once before it is routed (outside the timed
//! part), as the router has just parsed the request body: the text is warm
//! in cache, the tree is cold.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use prefix_router_core::BackendId;
use prefix_router_core::request::RoutingText;
use prefix_router_core::request::blocks;
use prefix_router_core::tree::{Matches, PrefixTrees, TreeConfig};
use prefix_router_core::units::Tokens;

const MODEL: &[u8] = b"meta-llama/Llama-3.1-8B-Instruct";
const BACKENDS: u32 = 4;
const CONVERSATIONS: usize = 1000;
const SYSTEM_PROMPTS: usize = 5;
const SYSTEM_BYTES: usize = 20 << 10;
/// Messages per conversation; each is a role marker part plus a content part.
const MESSAGES: usize = 40;
const CONTENT_BYTES: usize = 9_500;
const TURN_BYTES: usize = 4 << 10;
const CORPUS_BYTES: usize = 32 << 20;
const ROLES: [&[u8]; 2] = [b"<|user|>\n", b"<|assistant|>\n"];

/// A text as borrowed parts.
type Text = Vec<&'static [u8]>;

/// Deterministic xorshift64* generator.
struct XorShiftRng(u64);

impl XorShiftRng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Random printable bytes, and slices of them at random offsets.
struct Corpus {
    bytes: &'static [u8],
    rng: XorShiftRng,
    systems: Vec<&'static [u8]>,
}

impl Corpus {
    fn new() -> Self {
        let mut rng = XorShiftRng(0x9e37_79b9_7f4a_7c15);
        let bytes: Vec<u8> = (0..CORPUS_BYTES)
            .map(|_| b' ' + (rng.next() % 95) as u8)
            .collect();
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        let mut corpus = Corpus {
            bytes,
            rng,
            systems: Vec::new(),
        };
        corpus.systems = (0..SYSTEM_PROMPTS)
            .map(|_| corpus.slice(SYSTEM_BYTES))
            .collect();
        corpus
    }

    fn slice(&mut self, len: usize) -> &'static [u8] {
        let start = self.rng.below(self.bytes.len() - len);
        &self.bytes[start..start + len]
    }

    /// A fresh ~400 KB conversation as 81 parts.
    fn conversation(&mut self, i: usize) -> Text {
        let mut text = vec![self.systems[i % SYSTEM_PROMPTS]];
        for m in 0..MESSAGES {
            text.push(ROLES[m % 2]);
            text.push(self.slice(CONTENT_BYTES));
        }
        text
    }
}

/// Read the text once, as the router just did when it parsed the request
/// body: the text is warm in cache, the tree is not.
fn warm(text: &Text) {
    let sum = text
        .iter()
        .flat_map(|p| p.iter().step_by(64))
        .fold(0u8, |a, &b| a.wrapping_add(b));
    black_box(sum);
}

/// The text's chain of block hashes, the tree's key.
fn keys(text: &Text) -> Vec<[u8; 8]> {
    let mut routing = RoutingText::with_capacity(text.len());
    text.iter().for_each(|part| routing.push(part));
    blocks::chain(&routing)
}

/// The backend with the longest match, preferring `hint` among equals.
fn pick(m: &Matches, hint: u32) -> Option<BackendId> {
    let best = m.best();
    if m.matched(BackendId(hint)) == best {
        return Some(BackendId(hint));
    }
    m.iter().find(|&(_, n)| n == best).map(|(b, _)| b)
}

/// The trees with 1,000 conversations, each recorded over five turns,
/// spread evenly over the backends.
fn build(corpus: &mut Corpus) -> (PrefixTrees, Vec<(Text, u32)>) {
    let trees = PrefixTrees::new(TreeConfig {
        budget: Tokens(40 << 20).keys(),
        ..TreeConfig::default()
    });
    let started = Instant::now();
    let mut convs = Vec::with_capacity(CONVERSATIONS);
    for i in 0..CONVERSATIONS {
        let text = corpus.conversation(i);
        let backend = (i % BACKENDS as usize) as u32;
        for end in [17, 33, 49, 65, text.len()] {
            let chain = keys(&text[..end].to_vec());
            trees.insert(MODEL, &[chain.as_flattened()], BackendId(backend));
        }
        convs.push((text, backend));
    }
    let stats = trees.stats();
    eprintln!(
        "built in {:?}: {} bytes in {} nodes, per backend {:?}",
        started.elapsed(),
        stats.models[0].bytes,
        stats.models[0].nodes,
        stats.backends
    );
    (trees, convs)
}

fn routes(c: &mut Criterion) {
    let mut corpus = Corpus::new();
    let (trees, mut convs) = build(&mut corpus);
    let mut group = c.benchmark_group("route");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));

    let mut next = 0;
    group.bench_function("next_turn_400k_plus_4k", |bch| {
        bch.iter_batched(
            || {
                next = (next + 1) % convs.len();
                let (text, backend) = &mut convs[next];
                text.push(ROLES[text.len() % 2]);
                text.push(corpus.slice(TURN_BYTES));
                warm(text);
                (text.clone(), *backend)
            },
            |(text, backend)| {
                let chain = keys(&text);
                trees.route(MODEL, &[chain.as_flattened()], |m| pick(m, backend))
            },
            BatchSize::PerIteration,
        )
    });

    group.bench_function("match_only_400k", |bch| {
        let mut i = 0;
        bch.iter_batched(
            || {
                i = (i + 1) % convs.len();
                warm(&convs[i].0);
                &convs[i].0
            },
            |text| {
                let chain = keys(text);
                trees.matches(MODEL, &[chain.as_flattened()]).best()
            },
            BatchSize::PerIteration,
        )
    });

    let mut n = 0;
    group.bench_function("new_small_1k", |bch| {
        bch.iter_batched(
            || {
                n += 1;
                let text = vec![&corpus.systems[0][..200], ROLES[0], corpus.slice(800)];
                warm(&text);
                (text, (n % 4) as u32)
            },
            |(text, backend)| {
                let chain = keys(&text);
                trees.route(MODEL, &[chain.as_flattened()], |m| pick(m, backend))
            },
            BatchSize::SmallInput,
        )
    });

    let started = Instant::now();
    let report = trees.evict();
    eprintln!(
        "evict: {:?}, {} nodes, {} bytes removed",
        started.elapsed(),
        report.nodes_removed,
        report.bytes_removed
    );

    let mut n = CONVERSATIONS;
    group.bench_function("new_conversation_400k", |bch| {
        bch.iter_batched(
            || {
                if trees.over_budget() {
                    trees.evict();
                }
                n += 1;
                let text = corpus.conversation(n);
                warm(&text);
                (text, (n % 4) as u32)
            },
            |(text, backend)| {
                let chain = keys(&text);
                trees.route(MODEL, &[chain.as_flattened()], |m| pick(m, backend))
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
    let stats = trees.stats();
    eprintln!(
        "after: {} bytes in {} nodes",
        stats.models[0].bytes, stats.models[0].nodes
    );
}

criterion_group!(benches, routes);
criterion_main!(benches);
