//! Small fakes shared by the policies' unit tests.

use std::time::Duration;

use super::{Balance, Candidate, PolicyParams, Request, SharedTunables, Tunables};
use crate::BackendId;
use crate::request::{RoutingText, SessionKey};
use crate::tree::TreeConfig;
use crate::units::{BLOCK_BYTES, TextBytes, TextPerToken, Tokens};

/// Candidates with ids 0.., the given loads, and nothing else known.
pub fn candidates(loads: &[usize]) -> Vec<Candidate> {
    let ids = 0..loads.len() as u32;
    ids.zip(loads)
        .map(|(i, &load)| Candidate {
            id: BackendId(i),
            load,
            pending: TextBytes(0),
            capacity: TextBytes(0),
            sequences: 0,
            block: Tokens(0),
            text_per_token: TextPerToken::ASSUMED,
            hash: u64::from(i) * 7919,
            published: None,
            recorded: None,
        })
        .collect()
}

/// A routing text of one part: `s` with each character repeated for a whole block of the
/// index, so that the prefix relations of `s` hold block for block.
pub fn text(s: &'static str) -> RoutingText<'static> {
    let expanded: String = s
        .chars()
        .flat_map(|c| std::iter::repeat_n(c, BLOCK_BYTES))
        .collect();
    let expanded: &'static str = Box::leak(expanded.into_boxed_str());
    let mut t = RoutingText::default();
    t.push(expanded.as_bytes());
    t.mark_anchor();
    t
}

/// A request for model `m` with `text` and an optional session id.
pub fn request<'r>(text: &'r RoutingText<'static>, session: Option<&str>) -> Request<'r, 'static> {
    Request::new(b"m", text, session.map(|s| SessionKey::of(s.as_bytes())))
}

/// Policy parameters with `threshold` and an imbalance bound of `abs` requests (rel 1.5).
pub fn params(threshold: f64, abs: usize) -> PolicyParams {
    let balance = Balance { abs, rel: 1.5 };
    let tunables = SharedTunables::fixed(Tunables {
        cache_threshold: threshold,
        balance,
    });
    PolicyParams {
        tunables,
        tree: TreeConfig::default(),
        seed: 0,
        clock: std::sync::Arc::new(crate::clock::Monotonic::default()),
        calibrate: true,
        session_ttl: Duration::from_secs(60),
        conversations: None,
    }
}
