//! Named scenarios: a workload, a fleet and clients, chosen to exercise the mechanisms
//! routing depends on (capacity, shared prefixes, queues, bursts), not to flatter a policy.

use std::path::PathBuf;

/// Where the workload comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// The built-in coding-agent generator.
    Agent {
        /// Sessions generated.
        sessions: usize,
        /// Mean new sessions per second.
        session_rate: f64,
        /// Distinct system prompts the sessions share.
        system_prompts: usize,
    },
    /// The built-in few-shot generator: single requests sharing a template.
    Template {
        /// Requests.
        requests: usize,
        /// Mean requests per second.
        rate: f64,
        /// Distinct templates.
        templates: usize,
    },
    /// A Mooncake JSONL trace.
    Trace(PathBuf),
}

/// One scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Its name on the command line.
    pub name: String,
    /// What it shows.
    pub about: &'static str,
    /// The workload.
    pub source: Source,
    /// Backends.
    pub backends: usize,
    /// KV blocks per backend.
    pub kv_blocks: usize,
    /// Requests in flight at most (the replay's `--concurrency`).
    pub concurrency: usize,
}

/// The simulator's default KV capacity per backend, blocks (420K tokens).
pub const KV_BLOCKS: usize = 26_250;

fn agent(name: &str, about: &'static str, sessions: usize, rate: f64, prompts: usize) -> Scenario {
    Scenario {
        name: name.into(),
        about,
        source: Source::Agent {
            sessions,
            session_rate: rate,
            system_prompts: prompts,
        },
        backends: 4,
        kv_blocks: KV_BLOCKS,
        concurrency: 64,
    }
}

fn trace(
    name: &str,
    about: &'static str,
    file: &str,
    traces: &std::path::Path,
    kv: usize,
) -> Scenario {
    Scenario {
        name: name.into(),
        about,
        source: Source::Trace(traces.join(file)),
        backends: 4,
        kv_blocks: kv,
        concurrency: 64,
    }
}

/// Every named scenario; traces are looked for in `traces`.
pub fn all(traces: &std::path::Path) -> Vec<Scenario> {
    let mut list = vec![
        agent(
            "agent",
            "24 coding-agent sessions, 4 shared system prompts, contexts to 100K tokens",
            24,
            0.5,
            4,
        ),
        agent(
            "agent-48",
            "the agent workload with 48 sessions: more context than the fleet's KV",
            48,
            0.5,
            4,
        ),
        agent(
            "hot-prompt",
            "24 agent sessions all sharing one system prompt",
            24,
            0.5,
            1,
        ),
        agent(
            "burst",
            "48 agent sessions all starting within 10 s",
            48,
            4.8,
            4,
        ),
    ];
    let mut c64 = agent(
        "agent-c64",
        "64 agent sessions, 64 in flight at most",
        64,
        2.0,
        4,
    );
    c64.concurrency = 64;
    let mut c256 = agent(
        "agent-c256",
        "256 agent sessions, 256 in flight at most",
        256,
        8.0,
        4,
    );
    c256.concurrency = 256;
    list.extend([c64, c256]);
    list.push(Scenario {
        name: "template".into(),
        about: "12,000 few-shot requests at 200/s sharing one template beyond the first user message",
        source: Source::Template {
            requests: 12_000,
            rate: 200.0,
            templates: 1,
        },
        backends: 4,
        kv_blocks: KV_BLOCKS,
        concurrency: 1024,
    });
    list.extend([
        trace(
            "conversation",
            "Mooncake conversation trace (12,031 requests), default KV",
            "conversation_trace.jsonl",
            traces,
            KV_BLOCKS,
        ),
        trace(
            "conversation-10x",
            "Mooncake conversation trace with 10x the KV per backend",
            "conversation_trace.jsonl",
            traces,
            KV_BLOCKS * 10,
        ),
        trace(
            "synthetic",
            "Mooncake synthetic trace",
            "synthetic_trace.jsonl",
            traces,
            KV_BLOCKS,
        ),
    ]);
    list
}

/// The scenario called `name`.
pub fn named(name: &str, traces: &std::path::Path) -> Option<Scenario> {
    all(traces).into_iter().find(|s| s.name == name)
}
