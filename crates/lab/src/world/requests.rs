//! The request a client of the lab sends at each turn, as the router is asked to place it
//! and as the engines take it; and whether it bypasses the router.

use prefix_router_core::units::Tokens;

use super::{Want, World};
use crate::prepare::Shape;
use crate::router::{Asked, EngineRecord};

impl<'w> World<'w> {
    /// The body `want` sends, and its `x-session-id` when the clients send one.
    pub(super) fn body(&self, want: Want) -> (Vec<u8>, Option<&'w str>) {
        let plan = self.parties[want.party].plan;
        let session = &plan.sessions()[want.session];
        let turn = &session.turns()[want.turn];
        let body = plan.request_body(turn, &self.clients.model, self.clients.stream);
        let id = (self.clients.send_session_header)
            .then(|| session.id())
            .flatten();
        (body, id)
    }

    /// `f` of the request `want` sends, as the router is asked to place it.
    pub(super) fn asking<T>(&self, want: Want, f: impl FnOnce(Asked) -> T) -> T {
        let (body, session_id) = self.body(want);
        let record = self.records(self.shape(want));
        f(Asked {
            body: &body,
            session_id,
            record: record.as_ref(),
        })
    }

    /// How the engines take `want`'s request.
    pub(super) fn shape(&self, want: Want) -> Option<&'w Shape> {
        (self.parties[want.party].prepared).shape(want.session, want.turn)
    }

    /// The engines' records of a request of `shape`, in exact mode.
    pub(super) fn records(&self, shape: Option<&'w Shape>) -> Option<EngineRecord<'w>> {
        match shape {
            Some(Shape::Accepted {
                hashes,
                prompt_tokens,
                chain: Some(chain),
                ..
            }) if self.situation.exact => Some(EngineRecord {
                chain,
                tokens: Tokens(*prompt_tokens),
                held: (self.engines.iter())
                    .map(|e| {
                        let blocks = e.cache().hit_blocks(hashes, usize::MAX);
                        Tokens(blocks * e.timing().block_tokens)
                    })
                    .collect(),
            }),
            _ => None,
        }
    }

    /// Whether `want` bypasses the router (a draw under the bypass share).
    pub(super) fn bypasses(&self, want: Want) -> bool {
        let share = (self.draw(want) >> 11) as f64 / (1u64 << 53) as f64;
        share < self.situation.bypass
    }

    /// The backend a bypassing request goes to: one of the fleet, drawn.
    pub(super) fn bypass_backend(&self, want: Want) -> usize {
        (self.draw(want).rotate_left(32) % self.engines.len().max(1) as u64) as usize
    }

    fn draw(&self, want: Want) -> u64 {
        let key = [self.situation.seed, want.session as u64, want.turn as u64];
        let bytes: Vec<u8> = key.iter().flat_map(|k| k.to_le_bytes()).collect();
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }
}
