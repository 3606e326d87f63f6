//! Named scenarios: a workload, a fleet and clients, chosen to exercise the mechanisms
//! routing depends on (capacity, shared prefixes, queues, bursts), not to flatter a policy.

use std::path::PathBuf;

use prefix_router_core::flow::Priority;

/// Where the workload comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkloadSource {
    /// The built-in coding-agent generator.
    Agent(Agent),
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

/// The coding-agent generator's settings in a scenario (the replay's agent options).
#[derive(Clone, Debug, PartialEq)]
pub struct Agent {
    /// Sessions generated.
    pub sessions: usize,
    /// Mean new sessions per second.
    pub session_rate: f64,
    /// Distinct system prompts the sessions share.
    pub system_prompts: usize,
    /// Final context of the smallest and the largest session, tokens; the sizes between
    /// are heavy-tailed (the replay's `--min-context-tokens`). Equal: every session the
    /// same. Default 100,000 both.
    pub contexts: (u64, u64),
    /// Shortest and longest think time between turns, seconds. Default 1-5.
    pub think: (f64, f64),
    /// Share of turns sent without waiting for the previous answer. Default 0.
    pub overlap: f64,
}

impl Agent {
    /// `sessions` arriving at `session_rate` per second over `system_prompts` prompts,
    /// otherwise the replay's defaults.
    pub fn new(sessions: usize, session_rate: f64, system_prompts: usize) -> Self {
        let d = prefix_router_replay::AgentConfig::default();
        Agent {
            sessions,
            session_rate,
            system_prompts,
            contexts: (d.max_context_tokens, d.max_context_tokens),
            think: (d.think_min, d.think_max),
            overlap: d.overlap,
        }
    }

    /// Heavy-tailed session sizes from `min` to `max` tokens, closed loop with `think`
    /// seconds between an answer and the next turn.
    fn pressed(mut self, min: u64, max: u64, think: f64) -> Self {
        (self.contexts, self.think) = ((min, max), (think, think));
        self
    }
}

/// Some of a scenario's sessions, sent by clients of their own as one tenant at one
/// priority (the replay's `--api-key` and `--priority`).
#[derive(Clone, Debug, PartialEq)]
pub struct Flow {
    /// Its tenant's name (a tenants file's `[tenants.NAME]`), with weight 1.
    pub tenant: &'static str,
    /// Its priority.
    pub priority: Priority,
    /// Sessions it sends: a workload of its own, of the scenario's agent settings and a
    /// seed of its own (the run's seed plus its position among the flows).
    pub sessions: usize,
    /// Its requests in flight at most; 0: its sessions are drawn, not sent (the flow's
    /// neighbours run alone on the same sessions).
    pub concurrency: usize,
    /// Seconds after the workload's start that its sessions start.
    pub delay: f64,
    /// Whether the run is about it: a run ends when every measured flow's requests have
    /// ended; the others are left in flight.
    pub measured: bool,
}

/// Flows of a scenario, and what the router does about them.
#[derive(Clone, Debug, PartialEq)]
pub struct Flows {
    /// The flows.
    pub flows: Vec<Flow>,
    /// Whether the router has a tenants file naming every flow's tenant (flow control
    /// on); without one the engines' own first-come-first-served queues decide.
    pub control: bool,
    /// The router's `--max-queued`.
    pub max_queued: usize,
    /// The tenants file's `standing_slots` (default 0; `--standing-slots`).
    pub standing_slots: usize,
}

impl Flows {
    /// `k` times the sessions and the requests in flight of every flow, and the queue.
    pub fn scale(&mut self, k: usize) {
        for flow in &mut self.flows {
            flow.sessions *= k;
            flow.concurrency *= k;
        }
        self.max_queued *= k;
    }
}

/// One scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Its name on the command line.
    pub name: String,
    /// What it shows.
    pub about: &'static str,
    /// The workload.
    pub source: WorkloadSource,
    /// Backends.
    pub backends: usize,
    /// KV blocks per backend.
    pub kv_blocks: usize,
    /// Requests in flight at most (the replay's `--concurrency`).
    pub concurrency: usize,
    /// Longest prompt plus output the engines accept, tokens (beyond: 400, as vLLM's
    /// `--max-model-len`). Default the simulator's, 131,072.
    pub max_model_len: usize,
    /// Requests each engine runs at once (vLLM's `--max-num-seqs`). Default the
    /// simulator's, 256.
    pub max_num_seqs: usize,
    /// Its flows, if its sessions are split among tenants and priorities.
    pub flows: Option<Flows>,
}

/// The simulator's default KV capacity per backend, blocks (420K tokens).
pub const KV_BLOCKS: usize = 26_250;

/// The simulator's default `max_model_len`, tokens.
const MAX_MODEL_LEN: usize = 131_072;

/// The simulator's default `max_num_seqs`.
const MAX_NUM_SEQS: usize = 256;

impl Scenario {
    /// A small agent scenario, quick to run (tests, trials): `sessions` over `prompts`
    /// system prompts on 2 backends of 4,000 KV blocks each.
    pub fn small(sessions: usize, prompts: usize) -> Scenario {
        Scenario {
            backends: 2,
            kv_blocks: 4_000,
            ..agent("small", "test", sessions, 0.5, prompts)
        }
    }
}

fn agent(name: &str, about: &'static str, sessions: usize, rate: f64, prompts: usize) -> Scenario {
    with_agent(name, about, Agent::new(sessions, rate, prompts))
}

fn with_agent(name: &str, about: &'static str, agent: Agent) -> Scenario {
    Scenario {
        name: name.into(),
        about,
        source: WorkloadSource::Agent(agent),
        backends: 4,
        kv_blocks: KV_BLOCKS,
        concurrency: 64,
        max_model_len: MAX_MODEL_LEN,
        max_num_seqs: MAX_NUM_SEQS,
        flows: None,
    }
}

/// The fleets under pressure: heavy-tailed agent sessions from 20K to 520K tokens, all
/// started within a few seconds, each turn 4 s after the previous answer (0.2 s in the
/// demo's 20x time), on backends whose engines refuse prompts over 500K tokens.
fn pressure() -> Vec<Scenario> {
    let tail =
        |sessions, rate, prompts| Agent::new(sessions, rate, prompts).pressed(20_000, 520_000, 4.0);
    let mut list = vec![
        with_agent(
            "pressure",
            "24 heavy-tailed agent sessions (20K-520K tokens), 524K tokens of KV a backend: 0.86x their final contexts",
            tail(24, 4.8, 4),
        ),
        with_agent(
            "pressure-shared",
            "32 heavy-tailed agent sessions over 2 shared prompts, KV 0.77x their final contexts",
            tail(32, 4.8, 2),
        ),
    ];
    list[0].kv_blocks = 32_768;
    list[1].kv_blocks = 37_888;
    for s in &mut list {
        s.max_model_len = 500_000;
    }
    let mut overlap = Agent::new(24, 0.5, 2);
    overlap.overlap = 0.3;
    list.push(with_agent(
        "overlap",
        "24 agent sessions over 2 shared prompts, 30% of turns sent before the previous answer",
        overlap,
    ));
    list
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
        source: WorkloadSource::Trace(traces.join(file)),
        backends: 4,
        kv_blocks: kv,
        concurrency: 64,
        max_model_len: MAX_MODEL_LEN,
        max_num_seqs: MAX_NUM_SEQS,
        flows: None,
    }
}

/// A flow of `sessions` sessions of `tenant` at `priority`, `concurrency` in flight.
fn flow(tenant: &'static str, priority: Priority, sessions: usize, concurrency: usize) -> Flow {
    Flow {
        tenant,
        priority,
        sessions,
        concurrency,
        delay: 0.0,
        measured: false,
    }
}

/// The measured flow of the flow scenarios: 8 sessions at `priority`, 4 in flight,
/// starting 2 s after its neighbours.
fn measured(tenant: &'static str, priority: Priority) -> Flow {
    Flow {
        delay: 2.0,
        measured: true,
        ..flow(tenant, priority, 8, 4)
    }
}

/// The flow scenarios, as `benches/tenants/noisy.sh` runs them in real time: 4 backends
/// running 4 requests each, agent sessions to 60K tokens all started within a few
/// seconds. A noisy neighbour: tenant `a` keeps 16 times the concurrency of tenant `b`,
/// with equal weights, beside `b` alone and without a tenants file. Priority: `high`
/// beside `normal` and `low` that keep twice the fleet's slots in flight, under a queue
/// of half the slots, beside `high` alone. Each alone run sends the same sessions.
fn flows() -> Vec<Scenario> {
    let with = |name: &str, about, flows: Vec<Flow>, control, max_queued| {
        let mut agent = Agent::new(flows.iter().map(|f| f.sessions).sum(), 100.0, 4);
        // No smallest size: every session runs to 60K with messages at the replay's own
        // scale, as the bench's replays (a smallest size would scale them to 60K/100K).
        agent.contexts = (0, 60_000);
        Scenario {
            max_num_seqs: 4,
            flows: Some(Flows {
                flows,
                control,
                max_queued,
                standing_slots: 0,
            }),
            ..with_agent(name, about, agent)
        }
    };
    let a = |concurrency| flow("a", Priority::Normal, 128, concurrency);
    let b = measured("b", Priority::Normal);
    let neighbours = |concurrency| {
        vec![
            flow("p", Priority::Normal, 128, concurrency),
            flow("p", Priority::Low, 128, concurrency),
        ]
    };
    let (slots, queued) = (16, 1024);
    vec![
        with(
            "noisy-neighbour",
            "tenant a keeps 16x tenant b's concurrency, equal weights; b's TTFT against its run alone",
            vec![a(64), b.clone()],
            true,
            queued,
        ),
        with(
            "noisy-neighbour-fcfs",
            "the noisy neighbour without a tenants file: the engines' queues decide",
            vec![a(64), b.clone()],
            false,
            queued,
        ),
        with(
            "noisy-neighbour-alone",
            "tenant b's sessions of the noisy neighbour, alone",
            vec![a(0), b],
            true,
            queued,
        ),
        with(
            "noisy-tie",
            "tenants a, b and c alike, each keeping the fleet's slots in flight, a queue of half the slots: a full queue sheds a and b alike",
            vec![
                flow("a", Priority::Normal, 128, slots),
                flow("b", Priority::Normal, 128, slots),
                Flow {
                    sessions: 32,
                    concurrency: slots,
                    ..measured("c", Priority::Normal)
                },
            ],
            true,
            slots / 2,
        ),
        with(
            "priority",
            "high beside normal and low that keep twice the fleet's slots in flight, a queue of half the slots",
            [neighbours(slots), vec![measured("p", Priority::High)]].concat(),
            true,
            slots / 2,
        ),
        with(
            "priority-alone",
            "the priority scenario's high sessions, alone",
            [neighbours(0), vec![measured("p", Priority::High)]].concat(),
            true,
            slots / 2,
        ),
    ]
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
        source: WorkloadSource::Template {
            requests: 12_000,
            rate: 200.0,
            templates: 1,
        },
        backends: 4,
        kv_blocks: KV_BLOCKS,
        concurrency: 1024,
        max_model_len: MAX_MODEL_LEN,
        max_num_seqs: MAX_NUM_SEQS,
        flows: None,
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
    list.extend(pressure());
    list.extend(flows());
    list
}

/// The scenario called `name`.
pub fn named(name: &str, traces: &std::path::Path) -> Option<Scenario> {
    all(traces).into_iter().find(|s| s.name == name)
}
