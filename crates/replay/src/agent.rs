//! Synthetic coding-agent sessions (`--synthetic agent`).
//!
//! A few long system prompts (20-40 KB each) and one shared `tools` array
//! (~10 KB) are shared by all sessions. Sessions arrive as a Poisson process.
//! Each session picks a system prompt, starts with a user task, and each turn
//! appends an assistant tool call and a tool result of 1-8 KB (sometimes a
//! follow-up user message too), until the context would pass
//! `max_context_tokens`. The next turn is sent a think time (uniform in
//! `[think_min, think_max]` seconds, divided by `--speedup`) after the previous
//! response finished. Everything is a pure function of the config (seed).
//!
//! Two options make it look like real agent fleets under pressure:
//! - `min_context_tokens` gives sessions heavy-tailed final sizes: the quantiles of a
//!   bounded Pareto distribution ([`TAIL_ALPHA`]) between it and `max_context_tokens`,
//!   one per session in an order drawn from the seed, so that the largest session always
//!   reaches the maximum and a few are many times the median. A session's messages are
//!   as much longer or shorter as its size (large sessions read large files), so every
//!   session has about as many turns and all grow together: their live contexts add up
//!   to the sum of their sizes near the end.
//! - `overlap` is the share of turns sent a think time after the previous turn was *sent*,
//!   without waiting for its answer, as parallel tool calls and sub-agents sharing a
//!   prefix do; the next turn that does wait waits for every answer of its session.
//!
//! Both draw from random streams of their own, so without them the workload is the same
//! as before they existed.
//!
//! Token counts are estimated as serialized message bytes / bytes-per-token.

use std::sync::Arc;

use super::plan::{Plan, PlannedTurn, Session};
use super::text::{Rng, Role, TOOL_NAMES, json_string, mix, render_message, text};

/// Settings of the agent workload.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// Number of sessions generated.
    pub sessions: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// Mean new sessions per second (Poisson, before `--speedup`).
    pub session_rate: f64,
    /// A session ends before its context would exceed this many tokens.
    pub max_context_tokens: u64,
    /// Bytes of text per token.
    pub bytes_per_token: u32,
    /// Shortest think time between turns, seconds.
    pub think_min: f64,
    /// Longest think time between turns, seconds.
    pub think_max: f64,
    /// Number of distinct shared system prompts.
    pub system_prompts: usize,
    /// Every message's and tool description's length is multiplied by this (1: the sizes
    /// above; 0.1 for engines on a CPU).
    pub message_scale: f64,
    /// The shared system prompts' and tools' lengths are multiplied by this; `None`: by
    /// `message_scale`. Apart, so that heavy-tailed sessions can have long messages (few
    /// turns) beside short shared prompts, as an engine on a CPU needs.
    pub prompt_scale: Option<f64>,
    /// Every turn's `max_tokens` (30-300) is multiplied by this, at least 1 (default 1; an
    /// engine on a CPU decodes a token in tens of milliseconds).
    pub output_scale: f64,
    /// Heavy-tailed session sizes: sessions end between this many tokens and
    /// `max_context_tokens` (see the module doc). 0: every session runs to the maximum.
    pub min_context_tokens: u64,
    /// Share of turns, 0..=1, sent without waiting for the previous turn's answer. Default 0.
    pub overlap: f64,
}

/// Shape of the heavy tail of session sizes: a bounded Pareto of this index (below 1: a
/// few sessions hold most of the context).
pub const TAIL_ALPHA: f64 = 0.6;

/// With heavy-tailed sizes, a session of this many tokens has messages of the usual
/// lengths (about 80 turns); others' are scaled by their size over it.
pub const TAIL_REFERENCE: u64 = 100_000;

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            sessions: 100,
            seed: 1,
            session_rate: 0.5,
            max_context_tokens: 100_000,
            bytes_per_token: 4,
            think_min: 1.0,
            think_max: 5.0,
            system_prompts: 4,
            message_scale: 1.0,
            prompt_scale: None,
            output_scale: 1.0,
            min_context_tokens: 0,
            overlap: 0.0,
        }
    }
}

/// Generates the plan for `cfg`.
pub(crate) fn plan_agent(cfg: &AgentConfig) -> Plan {
    let mut plan = Plan::default();
    let bpt = u64::from(cfg.bytes_per_token.max(1));
    let mut rng = Rng::new(mix(cfg.seed, 0xA6E7));
    let prompt_scale = cfg.prompt_scale.unwrap_or(cfg.message_scale);
    let tools = tools_json(cfg.seed, prompt_scale);
    let tools_tokens = tokens(tools.len(), bpt);
    plan.tools = Some(plan.push_piece(tools, None, tools_tokens));
    let prompts: Vec<u32> = (0..cfg.system_prompts.max(1))
        .map(|i| {
            let len =
                rng.range(scaled(20_000, prompt_scale), scaled(40_000, prompt_scale)) as usize;
            let json = render_message(Role::System, &text(mix(cfg.seed, 0x5157 + i as u64), len));
            let t = tokens(json.len(), bpt);
            plan.push_piece(json, None, t)
        })
        .collect();
    let mut start_s = 0.0;
    for (s, size) in session_sizes(cfg).into_iter().enumerate() {
        if s > 0 {
            start_s += exponential(&mut rng, cfg.session_rate);
        }
        let prompt = prompts[rng.range(0, prompts.len() as u64 - 1) as usize];
        let session = SessionGen::new(cfg, s, &mut plan, prompt, size).run(start_s);
        plan.sessions.push(session);
    }
    plan.finish()
}

/// Each session's final context, tokens: `max_context_tokens` for all, or with
/// `min_context_tokens` the quantiles `i / (n - 1)` of a bounded Pareto in a seeded order.
fn session_sizes(cfg: &AgentConfig) -> Vec<u64> {
    let (lo, hi) = (cfg.min_context_tokens, cfg.max_context_tokens);
    let n = cfg.sessions;
    if lo == 0 || lo >= hi || n < 2 {
        return vec![hi; n];
    }
    let mut ranks: Vec<usize> = (0..n).collect();
    let mut rng = Rng::new(mix(cfg.seed, 0x7A11));
    for i in (1..n).rev() {
        ranks.swap(i, rng.range(0, i as u64) as usize);
    }
    let ratio = (lo as f64 / hi as f64).powf(TAIL_ALPHA);
    let quantile = |u: f64| lo as f64 / (1.0 - u * (1.0 - ratio)).powf(1.0 / TAIL_ALPHA);
    (ranks.iter())
        .map(|&r| (quantile(r as f64 / (n - 1) as f64) as u64).clamp(lo, hi))
        .collect()
}

/// Exponential inter-arrival time with the given rate (per second).
pub(crate) fn exponential(rng: &mut Rng, rate: f64) -> f64 {
    if rate <= 0.0 {
        return 0.0;
    }
    -(1.0 - rng.unit()).ln() / rate
}

pub(crate) fn tokens(bytes: usize, bpt: u64) -> u32 {
    u32::try_from(bytes as u64 / bpt).unwrap_or(u32::MAX)
}

/// The shared `tools` array: one function per [`TOOL_NAMES`] entry.
/// `bytes` times the config's message scale, at least 1.
fn scaled(bytes: u64, scale: f64) -> u64 {
    ((bytes as f64 * scale) as u64).max(1)
}

fn tools_json(seed: u64, scale: f64) -> String {
    let length = |bytes: f64| ((bytes * scale) as usize).max(1);
    let tools: Vec<String> = TOOL_NAMES
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let desc = json_string(&text(mix(seed, 0x7001 + i as u64), length(700.0)));
            let arg = json_string(&text(mix(seed, 0x7101 + i as u64), length(80.0)));
            format!(
                r#"{{"type":"function","function":{{"name":"{name}","description":{desc},"parameters":{{"type":"object","properties":{{"path":{{"type":"string","description":{arg}}}}},"required":["path"]}}}}}}"#
            )
        })
        .collect();
    format!("[{}]", tools.join(","))
}

/// Builds one session's turns.
struct SessionGen<'a> {
    cfg: &'a AgentConfig,
    plan: &'a mut Plan,
    rng: Rng,
    /// Draws whether a turn overlaps the previous one (a stream of its own).
    overlaps: Rng,
    index: usize,
    /// Its messages' lengths times this: the config's message scale, times its size over
    /// [`TAIL_REFERENCE`] with heavy-tailed sizes (every session then has about as many
    /// turns).
    scale: f64,
    /// It ends before its context would pass this many tokens.
    size: u64,
    messages: Vec<u32>,
    /// Context size so far, tokens (tools included).
    context: u64,
}

impl<'a> SessionGen<'a> {
    fn new(cfg: &'a AgentConfig, index: usize, plan: &'a mut Plan, prompt: u32, size: u64) -> Self {
        let tools = plan
            .tools
            .map_or(0, |t| u64::from(plan.piece_tokens[t as usize]));
        let context = tools + u64::from(plan.piece_tokens[prompt as usize]);
        SessionGen {
            cfg,
            plan,
            rng: Rng::new(mix(cfg.seed, 0x5E55_0000 + index as u64)),
            overlaps: Rng::new(mix(cfg.seed, 0x0E1A_0000 + index as u64)),
            index,
            scale: match cfg.min_context_tokens {
                0 => cfg.message_scale,
                _ => cfg.message_scale * size as f64 / TAIL_REFERENCE as f64,
            },
            size,
            messages: vec![prompt],
            context,
        }
    }

    fn run(mut self, start_s: f64) -> Session {
        let mut turns = Vec::new();
        self.message(Role::User, 300, 2_000);
        while self.context <= self.size || turns.is_empty() {
            turns.push(self.turn(turns.is_empty()));
            let call = ((self.index as u64) << 20) | turns.len() as u64;
            self.message(Role::AssistantCall { call }, 40, 400);
            self.message(Role::Tool { call }, 1_000, 8_000);
            if self.rng.unit() < 0.15 {
                self.message(Role::User, 100, 1_500);
            }
        }
        Session {
            id: Some(Arc::from(format!("agent-{}-{}", self.cfg.seed, self.index))),
            start_ms: start_s * 1000.0,
            turns,
        }
    }

    fn turn(&mut self, first: bool) -> PlannedTurn {
        let think = if first {
            0.0
        } else {
            let (lo, hi) = (
                self.cfg.think_min,
                self.cfg.think_max.max(self.cfg.think_min),
            );
            (lo + (hi - lo) * self.rng.unit()) * 1000.0
        };
        let overlaps = !first && self.overlaps.unit() < self.cfg.overlap;
        PlannedTurn {
            pieces: self.messages.clone(),
            max_tokens: ((self.rng.range(30, 300) as f64 * self.cfg.output_scale) as u32).max(1),
            think_ms: think,
            prompt_tokens: self.context,
            overlaps,
        }
    }

    /// Appends a message with `lo..=hi` bytes of content.
    fn message(&mut self, role: Role, lo: u64, hi: u64) {
        let len = self
            .rng
            .range(scaled(lo, self.scale), scaled(hi, self.scale)) as usize;
        let json = render_message(role, &text(self.rng.next_u64(), len));
        let t = tokens(json.len(), u64::from(self.cfg.bytes_per_token.max(1)));
        self.messages.push(self.plan.push_piece(json, None, t));
        self.context += u64::from(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::BodyStyle;

    fn small() -> AgentConfig {
        AgentConfig {
            sessions: 6,
            ..AgentConfig::default()
        }
    }

    #[test]
    fn deterministic_for_a_seed() {
        let (a, b) = (plan_agent(&small()), plan_agent(&small()));
        assert_eq!(a.pieces, b.pieces);
        assert_eq!(a.len(), b.len());
        let style = BodyStyle::new("m", false);
        let last = |p: &Plan| p.body(&style, p.sessions[3].turns.last().unwrap());
        assert_eq!(last(&a), last(&b));
        let other = plan_agent(&AgentConfig { seed: 2, ..small() });
        assert_ne!(a.pieces, other.pieces);
    }

    #[test]
    fn the_prompt_scale_sizes_the_shared_prompts_alone() {
        let plan = plan_agent(&small());
        let short = plan_agent(&AgentConfig {
            prompt_scale: Some(0.1),
            ..small()
        });
        let shared = |p: &Plan| p.piece_tokens[0] + p.piece_tokens[1];
        assert!(shared(&short) * 5 < shared(&plan));
        // The sessions' own messages keep their sizes: the first user message alike.
        let private = |p: &Plan| p.piece_tokens[p.sessions[0].turns[0].pieces[1] as usize];
        assert_eq!(private(&short), private(&plan));
    }

    #[test]
    fn contexts_grow_to_about_100k_tokens() {
        let plan = plan_agent(&small());
        for s in &plan.sessions {
            let sizes: Vec<u64> = s.turns.iter().map(|t| t.prompt_tokens).collect();
            assert!(sizes.windows(2).all(|w| w[0] < w[1]));
            assert!(sizes[0] > 5_000 && sizes[0] < 15_000, "first {}", sizes[0]);
            let last = *sizes.last().unwrap();
            assert!((97_000..=100_000).contains(&last), "last {last}");
            assert!(s.turns.len() > 30, "turns {}", s.turns.len());
            // Each turn extends the previous one.
            for w in s.turns.windows(2) {
                assert!(w[1].pieces.starts_with(&w[0].pieces));
            }
        }
        let body = plan.body(
            &BodyStyle::new("m", true),
            plan.sessions[0].turns.last().unwrap(),
        );
        assert!(body.len() > 350_000, "body {}", body.len());
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["tools"].as_array().unwrap().len(), TOOL_NAMES.len());
    }

    #[test]
    fn sessions_share_system_prompts_and_arrive_over_time() {
        let plan = plan_agent(&AgentConfig {
            sessions: 20,
            ..small()
        });
        let starts: Vec<f64> = plan.sessions.iter().map(|s| s.start_ms).collect();
        assert!(starts.windows(2).all(|w| w[0] <= w[1]));
        assert!(starts[19] > 5_000.0);
        let mut prompts: Vec<u32> = plan.sessions.iter().map(|s| s.turns[0].pieces[0]).collect();
        prompts.sort();
        prompts.dedup();
        assert!(prompts.len() > 1 && prompts.len() <= 4);
        let bound = crate::bound::compute(&plan, plan.schedule_order().into_iter()).hit_rate;
        assert!(bound > 0.9, "bound {bound}");
    }
}
