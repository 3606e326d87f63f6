//! Live conversations and where they are: for each backend, the sum of the latest routing
//! text size of the conversations placed on it that were seen within a horizon. That is
//! what the backend's KV must hold for its conversations to keep hitting, to weigh against
//! its capacity when a new conversation is placed. Bounded in entries like the session
//! table; stale entries leave as time passes (amortized on every note).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::BackendId;
use crate::clock::Clock;

/// Default bound on conversations remembered.
pub const MAX_CONVERSATIONS: usize = 1 << 20;

#[derive(Clone, Copy)]
struct Entry {
    backend: BackendId,
    bytes: usize,
    seen: Duration,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<u128, Entry>,
    /// Notes in time order: (when, conversation); stale when the entry was seen later.
    notes: VecDeque<(Duration, u128)>,
    /// Bytes of live conversations, by backend id.
    per_backend: Vec<usize>,
}

/// Conversation -> (backend, size), with per-backend sums.
pub struct Footprints {
    inner: Mutex<Inner>,
    horizon: Duration,
    max: usize,
    clock: Arc<dyn Clock>,
}

impl Footprints {
    /// A table where a conversation idle for `horizon` on `clock` no longer counts.
    pub fn new(horizon: Duration, max: usize, clock: Arc<dyn Clock>) -> Self {
        Footprints {
            inner: Mutex::new(Inner::default()),
            horizon,
            max,
            clock,
        }
    }

    /// `conversation` is now `bytes` long and on `backend`.
    pub fn note(&self, conversation: u128, backend: BackendId, bytes: usize) {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        inner.expire(now.saturating_sub(self.horizon));
        if inner.entries.len() >= self.max && !inner.entries.contains_key(&conversation) {
            return;
        }
        let entry = Entry {
            backend,
            bytes,
            seen: now,
        };
        if let Some(old) = inner.entries.insert(conversation, entry) {
            inner.sub(old);
        }
        inner.add(entry);
        inner.notes.push_back((now, conversation));
    }

    /// Bytes of live conversations on each of `backends`, in that order.
    pub fn of(&self, backends: impl Iterator<Item = BackendId>) -> Vec<usize> {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        inner.expire(now.saturating_sub(self.horizon));
        backends
            .map(|b| inner.per_backend.get(b.0 as usize).copied().unwrap_or(0))
            .collect()
    }

    /// Forgets the conversations of backends for which `live` is false.
    pub fn retain(&self, live: &dyn Fn(BackendId) -> bool) {
        let mut inner = self.inner.lock();
        let gone: Vec<(u128, Entry)> = (inner.entries.iter())
            .filter(|(_, e)| !live(e.backend))
            .map(|(k, e)| (*k, *e))
            .collect();
        for (key, entry) in gone {
            inner.entries.remove(&key);
            inner.sub(entry);
        }
    }
}

impl Inner {
    fn add(&mut self, e: Entry) {
        let i = e.backend.0 as usize;
        if self.per_backend.len() <= i {
            self.per_backend.resize(i + 1, 0);
        }
        self.per_backend[i] += e.bytes;
    }

    fn sub(&mut self, e: Entry) {
        if let Some(sum) = self.per_backend.get_mut(e.backend.0 as usize) {
            *sum = sum.saturating_sub(e.bytes);
        }
    }

    /// Drops conversations last seen before `cutoff`.
    fn expire(&mut self, cutoff: Duration) {
        while let Some(&(at, key)) = self.notes.front() {
            if at >= cutoff {
                return;
            }
            self.notes.pop_front();
            if let Some(entry) = self.entries.get(&key).copied().filter(|e| e.seen == at) {
                self.entries.remove(&key);
                self.sub(entry);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Manual;

    fn table() -> (Footprints, Manual) {
        let clock = Manual::default();
        let t = Footprints::new(Duration::from_secs(60), 100, Arc::new(clock.clone()));
        (t, clock)
    }

    #[test]
    fn sums_the_latest_size_and_follows_moves() {
        let (t, _) = table();
        t.note(1, BackendId(0), 100);
        t.note(1, BackendId(0), 150);
        t.note(2, BackendId(1), 40);
        assert_eq!(t.of([BackendId(0), BackendId(1)].into_iter()), [150, 40]);
        t.note(1, BackendId(1), 160);
        assert_eq!(t.of([BackendId(0), BackendId(1)].into_iter()), [0, 200]);
        t.retain(&|b| b != BackendId(1));
        assert_eq!(t.of([BackendId(1)].into_iter()), [0]);
    }

    #[test]
    fn idle_conversations_stop_counting() {
        let (t, clock) = table();
        t.note(1, BackendId(0), 100);
        clock.set(Duration::from_secs(30));
        t.note(2, BackendId(0), 10);
        clock.set(Duration::from_secs(61));
        assert_eq!(t.of([BackendId(0)].into_iter()), [10]);
        clock.set(Duration::from_secs(95));
        assert_eq!(t.of([BackendId(0)].into_iter()), [0]);
    }
}
