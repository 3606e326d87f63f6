//! What the engines are given for each request of a workload, computed once per workload
//! and shared by every run on it: the body the replay would send, rendered, tokenized and
//! hashed by the simulator's own template ([`prefix_router_sim::prepare`]). The router side
//! parses the same body with the router's parser, so the two share nothing but the bytes.
//! With the engines' records on ([`RequestShapes::new`]'s `exact`), each request also carries
//! the chain the router's token mode would key it by: the simulator's token ids are its
//! rendered prompt in 4-byte words, so the chain is the core's over those bytes.

use std::sync::Arc;

use prefix_router_core::request::blocks::Chainer;
use prefix_router_replay::{Plan, PlannedTurn};
use prefix_router_sim::SimConfig;
use prefix_router_sim::cache::BlockHash;
use prefix_router_sim::engine::EngineRequest;
use prefix_router_sim::template::GenerationEndpoint;

/// A request as an engine sees it, or why the simulator refuses it (its HTTP status).
#[derive(Clone, Debug)]
pub enum Shape {
    /// Accepted.
    Accepted {
        /// Chained block hashes of the rendered prompt.
        hashes: Arc<[BlockHash]>,
        /// Prompt length in tokens.
        prompt_tokens: usize,
        /// Output tokens to generate.
        output_tokens: usize,
        /// The router's token-mode chain of the prompt (one hash per 16 tokens), when
        /// the engines' records are on.
        chain: Option<Arc<[[u8; 8]]>>,
    },
    /// Refused with this status (400 for a prompt too long).
    Refused(u16),
}

impl Shape {
    /// The engine request for this shape, numbered `id`.
    pub fn request(&self, id: u64) -> Option<EngineRequest> {
        match self {
            Shape::Accepted {
                hashes,
                prompt_tokens,
                output_tokens,
                ..
            } => Some(EngineRequest {
                id,
                hashes: hashes.to_vec(),
                prompt_tokens: *prompt_tokens,
                output_tokens: *output_tokens,
                token_ids: Vec::new(),
                priority: 0,
                remote_blocks: 0,
            }),
            Shape::Refused(_) => None,
        }
    }
}

/// Every request's shape, by session and turn.
pub struct RequestShapes {
    shapes: Vec<Vec<Shape>>,
}

impl RequestShapes {
    /// Shapes of every turn of `plan` as `sim` renders bodies asking for `model`, on up to
    /// `threads` threads (the result does not depend on them); with each prompt's token
    /// chain when `exact`.
    pub fn new(
        plan: &Plan,
        sim: &SimConfig,
        model: &str,
        stream: bool,
        threads: usize,
        exact: bool,
    ) -> Self {
        let sessions = plan.sessions();
        let chunk = sessions.len().div_ceil(threads.max(1)).max(1);
        let shapes = std::thread::scope(|scope| {
            let workers: Vec<_> = sessions
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        part.iter()
                            .map(|s| {
                                s.turns()
                                    .iter()
                                    .map(|t| shape(plan, t, sim, model, stream, exact))
                                    .collect()
                            })
                            .collect::<Vec<Vec<Shape>>>()
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        });
        RequestShapes { shapes }
    }

    /// The shape of `turn` of `session`.
    pub fn shape(&self, session: usize, turn: usize) -> Option<&Shape> {
        self.shapes.get(session)?.get(turn)
    }
}

fn shape(
    plan: &Plan,
    turn: &PlannedTurn,
    sim: &SimConfig,
    model: &str,
    stream: bool,
    exact: bool,
) -> Shape {
    let body = plan.request_body(turn, model, stream);
    match prefix_router_sim::prepare(sim, GenerationEndpoint::Chat, &body, 0) {
        Ok((request, _)) => Shape::Accepted {
            hashes: request.hashes.into(),
            prompt_tokens: request.prompt_tokens,
            output_tokens: request.output_tokens,
            chain: exact.then(|| token_chain(&body, sim)).flatten(),
        },
        Err(e) => Shape::Refused(e.status().as_u16()),
    }
}

/// The chain the router's token mode keys the rendered prompt of `body` by (the simulator's
/// built-in tokenizer: ids are the prompt's 4-byte words).
fn token_chain(body: &[u8], sim: &SimConfig) -> Option<Arc<[[u8; 8]]>> {
    let value = serde_json::from_slice(body).ok()?;
    let parsed =
        prefix_router_sim::template::parse(GenerationEndpoint::Chat, &value, sim.bytes_per_token);
    let mut chain = Vec::new();
    Chainer::default().push(&parsed.ok()?.prompt, &mut chain);
    Some(chain.into())
}
