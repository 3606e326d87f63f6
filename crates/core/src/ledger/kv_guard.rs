//! The KV guard: backends whose KV is kept for light flows' conversations
//! ([`protect_kv`]), and on each backend the light flows' conversations that live there.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use parking_lot::Mutex;
use smallvec::SmallVec;

use super::Account;
use crate::BackendId;
use crate::units::Tokens;

/// Reads a light flow's conversation counts in its home's KV after its last request
/// was placed ([`protect_kv`]): 10, a pause between turns of 5-10 s at the default
/// 1 s between reads.
pub const HOME_READS: usize = 10;

/// Light tenants' conversations an account counts at most; past it, new ones are not
/// counted (memory stays bounded).
const MAX_HOMES: usize = 65_536;

/// One backend's light flows' conversations (each with its prompt tokens and the read it
/// was last placed at) and their tokens in all; whether its KV is kept for them; whether
/// one of them found its context evicted here.
#[derive(Debug, Default)]
pub(super) struct KvGuard {
    homes: Mutex<HashMap<u128, (usize, usize)>>,
    resident: AtomicUsize,
    kept: AtomicBool,
    evicted: AtomicBool,
}

impl KvGuard {
    /// Whether its KV is kept for light flows.
    pub fn kept(&self) -> bool {
        self.kept.load(Relaxed)
    }

    /// Keeps its KV for light flows, or not, as [`protect_kv`] would.
    #[cfg(test)]
    pub fn keep(&self, kept: bool) {
        self.kept.store(kept, Relaxed);
    }

    /// Whether the light flows' conversations here, with `tokens` more, stay within two
    /// thirds of `capacity` (the third left for them to grow): a kept backend takes
    /// conversations that move only then, so that they do not pile on one of them.
    pub fn keeps_room_for(&self, capacity: Tokens, tokens: Tokens) -> bool {
        let wanted = self.resident.load(Relaxed).saturating_add(tokens.0);
        wanted.saturating_mul(3) <= capacity.0.saturating_mul(2)
    }

    /// Counts a light flow's `conversation` of `tokens` here, placed at `read`.
    pub fn note_home(&self, conversation: u128, tokens: Tokens, read: usize) {
        let tokens = tokens.0;
        let mut homes = self.homes.lock();
        if homes.len() < MAX_HOMES || homes.contains_key(&conversation) {
            let before = homes
                .insert(conversation, (tokens, read))
                .map_or(0, |(t, _)| t);
            let resident = self.resident.load(Relaxed).saturating_sub(before);
            self.resident
                .store(resident.saturating_add(tokens), Relaxed);
        }
    }

    /// Stops counting a light flow's `conversation` here: it moved.
    pub fn move_home(&self, conversation: u128) {
        let mut homes = self.homes.lock();
        if let Some((tokens, _)) = homes.remove(&conversation) {
            self.resident.fetch_sub(tokens, Relaxed);
        }
    }

    /// Stops counting the conversations last placed [`HOME_READS`] reads before `read`
    /// or earlier.
    pub fn forget_homes(&self, read: usize) {
        let mut homes = self.homes.lock();
        if !homes.is_empty() {
            homes.retain(|_, &mut (_, at)| read.wrapping_sub(at) < HOME_READS);
            let resident = homes.values().map(|&(tokens, _)| tokens).sum();
            self.resident.store(resident, Relaxed);
        }
    }

    /// One of the light flows' requests found most of its context evicted here.
    pub fn evicted(&self) {
        self.evicted.store(true, Relaxed);
    }
}

/// Keeps the KV of some of `accounts` for light flows' requests a reserve is kept for
/// ([`Cap::light`](super::Cap::light): a tenant below its share, or `high`), after a read
/// of them all. Where the engines are bound by KV, a heavy flow's prefills evict a light
/// flow's conversations between their turns however many slots are left free: engines
/// evict the least recently used blocks, whoever's. Limiting the KV a heavy tenant keeps
/// in flight does not stop it; keeping its requests off the backends that hold the light
/// tenant's KV does. So, once one of those requests found most of the context predicted
/// cached evicted on a backend whose requests in flight had prompts of half its KV or
/// more, and until they are all idle, backends are kept for them: as many as hold half
/// again the tokens of their conversations ([`HOME_READS`]), first those kept already,
/// then those where they have the most; at most three quarters of the backends with a
/// published capacity, and none while those tokens outgrow them. No request that leaves
/// the reserve is placed on a held one of them, and the light flows' conversations move
/// there ([`place`](super::place)). Kept backends
/// stay kept while the flows are active. Where the KV holds every conversation nothing is
/// kept.
pub fn protect_kv<'a>(accounts: impl Iterator<Item = &'a Account> + Clone) {
    let mut sized: SmallVec<[(&Account, usize, usize); 16]> = accounts
        .clone()
        .filter_map(|a| Some((a, a.guard.resident.load(Relaxed), a.capacity()?.0)))
        .collect();
    let wanted = sized.iter().map(|&(_, top, _)| top).sum::<usize>();
    let bound = accounts.clone().any(|a| a.guard.evicted.load(Relaxed));
    sized.sort_by_key(|&(a, top, _)| (std::cmp::Reverse(top), a.id));
    let most = sized.len() * 3 / 4;
    let room: usize = sized.iter().take(most).map(|&(_, _, c)| c).sum();
    let mut kept: SmallVec<[BackendId; 8]> = SmallVec::new();
    if bound && (1..=room).contains(&wanted) {
        sized.sort_by_key(|&(a, _, _)| !a.guard.kept());
        let mut needed = wanted.saturating_add(wanted / 2);
        for &(account, _, capacity) in sized.iter().take(most) {
            if needed == 0 && !account.guard.kept() {
                break;
            }
            kept.push(account.id);
            needed = needed.saturating_sub(capacity);
        }
    }
    for a in accounts {
        a.guard.kept.store(kept.contains(&a.id), Relaxed);
        if wanted == 0 {
            a.guard.evicted.store(false, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_counts_in_one_home_until_it_moves_or_its_reads_pass() {
        let (a, b) = (KvGuard::default(), KvGuard::default());
        a.note_home(1, Tokens(30), 0);
        a.note_home(1, Tokens(40), 2);
        assert!(
            a.keeps_room_for(Tokens(90), Tokens(20)),
            "(40 + 20) * 3 <= 90 * 2"
        );
        assert!(!a.keeps_room_for(Tokens(90), Tokens(21)));
        a.move_home(1);
        b.note_home(1, Tokens(40), 2);
        assert!(
            a.keeps_room_for(Tokens(3), Tokens(2)),
            "moved: nothing counts here"
        );
        b.forget_homes(2 + HOME_READS - 1);
        assert!(!b.keeps_room_for(Tokens(60), Tokens(1)), "still counted");
        b.forget_homes(2 + HOME_READS);
        assert!(b.keeps_room_for(Tokens(60), Tokens(40)), "forgotten");
    }
}
