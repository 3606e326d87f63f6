//! The prepared form of a workload: pre-rendered message pieces and the
//! sessions and turns that reference them.
//!
//! A trace request is a session of one turn scheduled at its timestamp; an
//! agent session is a chain of turns, each sent a think time after the
//! previous response finished (closed loop).

use std::sync::Arc;

use super::text::BodyStyle;

/// A prepared workload: rendered text plus schedule. Opaque; built by
/// [`Workload::load`](super::Workload::load) and shared between runs.
#[derive(Debug, Default)]
pub struct Plan {
    /// Rendered chat messages (JSON objects), referenced by index.
    pub(crate) pieces: Vec<Box<str>>,
    /// For each piece, the piece whose first sighting makes this one a cache
    /// hit (itself, or for a cut final block the full block it was cut from).
    pub(crate) piece_key: Vec<u32>,
    /// Prompt tokens each piece stands for (used by the bound).
    pub(crate) piece_tokens: Vec<u32>,
    /// Piece holding the JSON `tools` array sent before the messages, if any.
    pub(crate) tools: Option<u32>,
    /// Sessions sorted by start time.
    pub(crate) sessions: Vec<Session>,
}

/// A sequence of turns sharing a session id.
#[derive(Debug, Clone)]
pub struct Session {
    /// Sent as `x-session-id` with `--send-session-header`.
    pub(crate) id: Option<Arc<str>>,
    /// Arrival of the first turn, in ms from the start (before `--speedup`).
    pub(crate) start_ms: f64,
    /// The requests, in order.
    pub(crate) turns: Vec<PlannedTurn>,
}

/// One request.
#[derive(Debug, Clone)]
pub struct PlannedTurn {
    /// Pieces forming `messages`, in order.
    pub(crate) pieces: Vec<u32>,
    /// `max_tokens` sent.
    pub(crate) max_tokens: u32,
    /// Delay after the previous turn's response, in ms (before `--speedup`).
    pub(crate) think_ms: f64,
    /// Prompt tokens the workload intends (trace `input_length`).
    pub(crate) prompt_tokens: u64,
    /// Sent `think_ms` after the previous turn was sent, without waiting for its answer.
    pub(crate) overlaps: bool,
}

impl Session {
    /// The session id sent as `x-session-id` (with `--send-session-header`).
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// Arrival of the first turn, ms from the start (before `--speedup`).
    pub fn start_ms(&self) -> f64 {
        self.start_ms
    }

    /// The requests, in order.
    pub fn turns(&self) -> &[PlannedTurn] {
        &self.turns
    }
}

impl PlannedTurn {
    /// Delay after the previous turn's response, ms (before `--speedup`).
    pub fn think_ms(&self) -> f64 {
        self.think_ms
    }

    /// Prompt tokens the workload intends (estimated from its bytes for generated ones).
    pub fn prompt_tokens(&self) -> u64 {
        self.prompt_tokens
    }

    /// Whether it is sent a think time after the previous turn was sent, without waiting
    /// for that turn's answer (a turn that waits waits for every earlier answer).
    pub fn overlaps(&self) -> bool {
        self.overlaps
    }
}

impl Plan {
    /// The sessions, by start time.
    pub fn sessions(&self) -> &[Session] {
        &self.sessions
    }

    /// The body the replay sends for `turn`, asking for `model`, streamed or not.
    pub fn request_body(&self, turn: &PlannedTurn, model: &str, stream: bool) -> Vec<u8> {
        self.body(&BodyStyle::new(model, stream), turn)
    }

    /// Adds a piece and returns its index.
    pub(crate) fn push_piece(&mut self, json: String, key: Option<u32>, tokens: u32) -> u32 {
        let idx = u32::try_from(self.pieces.len()).expect("fewer than 2^32 pieces");
        self.pieces.push(json.into_boxed_str());
        self.piece_key.push(key.unwrap_or(idx));
        self.piece_tokens.push(tokens);
        idx
    }

    /// Total number of requests.
    pub(crate) fn len(&self) -> usize {
        self.sessions.iter().map(|s| s.turns.len()).sum()
    }

    /// The pieces a turn's prompt consists of, in the engine's order: the first (the system
    /// prompt, in a plan with tools), then `tools` when present, then the rest, as Qwen's
    /// and Llama's templates render them.
    pub(crate) fn chain<'a>(&'a self, turn: &'a PlannedTurn) -> impl Iterator<Item = u32> + 'a {
        let (first, rest) = turn.pieces.split_at(turn.pieces.len().min(1));
        (first.iter().copied())
            .chain(self.tools)
            .chain(rest.iter().copied())
    }

    /// The request body for `turn`.
    pub(crate) fn body(&self, style: &BodyStyle, turn: &PlannedTurn) -> Vec<u8> {
        let tools = self.tools.map(|t| &*self.pieces[t as usize]);
        let pieces = turn.pieces.iter().map(|&p| &*self.pieces[p as usize]);
        style.build(tools, pieces, turn.max_tokens)
    }

    /// Sorts sessions by start time (stable).
    pub(crate) fn finish(mut self) -> Self {
        self.sessions
            .sort_by(|a, b| a.start_ms.total_cmp(&b.start_ms));
        self
    }

    /// Every turn, sessions by start and turns in order (session after session).
    #[cfg(test)]
    pub(crate) fn all_turns(&self) -> impl Iterator<Item = &PlannedTurn> + Clone {
        self.sessions.iter().flat_map(|s| s.turns.iter())
    }

    /// Every turn in the order its schedule sends it if answers took no time: a session's
    /// turn at its start plus the think times before it. Sessions interleave as in a run.
    pub(crate) fn schedule_order(&self) -> Vec<&PlannedTurn> {
        let mut timed: Vec<(f64, usize, &PlannedTurn)> = Vec::with_capacity(self.len());
        for session in &self.sessions {
            let mut at = session.start_ms;
            for (i, turn) in session.turns.iter().enumerate() {
                at += if i == 0 { 0.0 } else { turn.think_ms };
                timed.push((at, timed.len(), turn));
            }
        }
        timed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        timed.into_iter().map(|(_, _, turn)| turn).collect()
    }
}
