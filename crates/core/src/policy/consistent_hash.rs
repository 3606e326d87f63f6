//! `consistent_hash`: rendezvous hashing of a key over the candidates, so that router
//! replicas agree and a change of fleet moves only the keys of the backends that changed.
//! The key is the session key when there is one, else the conversation's anchor (the text
//! up to its first user message), which stays the same over the turns of a conversation.

use super::{Candidate, Decision, Outcome, Policy, PolicyParams, Request, Selector, Ties, Turn};

/// Highest random weight hashing.
pub struct ConsistentHash {
    ties: Ties,
}

/// The policy, with session affinity.
pub fn build(params: &PolicyParams) -> Selector {
    Selector::new(ConsistentHash {
        ties: Ties::new(params.seed),
    })
    .sticky(params)
}

impl Policy for ConsistentHash {
    fn choose(&self, request: &Request, candidates: &[Candidate]) -> Decision {
        let key = (request.session).map_or_else(|| request.text.anchor_hash(), |s| s.0);
        let weight = |i: usize| weight(key, candidates[i].hash);
        let index = self.ties.best(Turn::of(request), candidates.len(), weight);
        Decision::new(index, Outcome::Hashed)
    }
}

/// The weight of `backend` for `key`: a 64-bit mix of both (splitmix64 finalizer).
fn weight(key: u128, backend: u64) -> u64 {
    let mut x = (key as u64) ^ ((key >> 64) as u64).rotate_left(29) ^ backend;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::*;

    fn policy() -> Selector {
        build(&params(0.3, 64))
    }

    #[test]
    fn same_key_same_backend_whatever_the_load() {
        let t = text("conversation");
        let a = policy().select(&request(&t, Some("s")), &candidates(&[0, 0, 0, 0]));
        let b = policy().select(&request(&t, Some("s")), &candidates(&[9, 3, 7, 1]));
        assert_eq!(a.index, b.index);
    }

    #[test]
    fn removing_another_backend_keeps_the_key() {
        let t = text("x");
        let all = candidates(&[0, 0, 0, 0]);
        for session in ["a", "b", "c", "d", "e", "f"] {
            let chosen = policy().select(&request(&t, Some(session)), &all).index;
            let others: Vec<Candidate> = all
                .iter()
                .copied()
                .filter(|c| c.id != all[(chosen + 1) % 4].id)
                .collect();
            let again = policy().select(&request(&t, Some(session)), &others).index;
            assert_eq!(others[again].id, all[chosen].id);
        }
    }

    #[test]
    fn keys_spread() {
        let t = text("x");
        let c = candidates(&[0, 0, 0, 0]);
        let mut seen = [0; 4];
        for i in 0..400 {
            seen[policy()
                .select(&request(&t, Some(&i.to_string())), &c)
                .index] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
    }
}
