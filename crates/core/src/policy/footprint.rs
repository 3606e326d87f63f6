//! Conversations and where they are: which backend each conversation was last placed on
//! (remembered for a time-to-live), and for each backend the sum of the latest routing
//! text size of its *live* conversations, those seen within a shorter horizon. That sum
//! is what the backend's KV must hold for its conversations to keep hitting, to weigh
//! against its capacity when a new conversation is placed. Bounded in entries like the
//! session table; entries leave as time passes (amortized on every note).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::BackendId;
use crate::clock::Clock;
use crate::units::TextBytes;

/// Default bound on conversations remembered.
pub const MAX_CONVERSATIONS: usize = 1 << 20;

#[derive(Clone, Copy)]
struct Entry {
    backend: BackendId,
    bytes: TextBytes,
    seen: Duration,
    /// Whether `bytes` counts in its backend's sum (seen within the horizon).
    live: bool,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<u128, Entry>,
    /// Notes in time order, (when, conversation), once to leave the sums at the horizon
    /// and once to leave the table at the time-to-live; stale when seen again later.
    live: VecDeque<(Duration, u128)>,
    kept: VecDeque<(Duration, u128)>,
    /// Routing text of live conversations, by backend id.
    per_backend: Vec<TextBytes>,
}

/// Conversation -> (backend, size), with per-backend sums of live conversations.
pub struct Footprints {
    inner: Mutex<Inner>,
    horizon: Duration,
    ttl: Duration,
    max: usize,
    clock: Arc<dyn Clock>,
}

impl Footprints {
    /// A table where a conversation idle for `horizon` on `clock` no longer counts in its
    /// backend's sum, and one idle for `ttl` is forgotten.
    pub fn new(horizon: Duration, ttl: Duration, max: usize, clock: Arc<dyn Clock>) -> Self {
        Footprints {
            inner: Mutex::new(Inner::default()),
            horizon,
            ttl: ttl.max(horizon),
            max,
            clock,
        }
    }

    /// `conversation` is now `bytes` long and on `backend`.
    pub fn note(&self, conversation: u128, backend: BackendId, bytes: TextBytes) {
        let now = self.expire();
        let mut inner = self.inner.lock();
        if inner.entries.len() >= self.max && !inner.entries.contains_key(&conversation) {
            return;
        }
        let entry = Entry {
            backend,
            bytes,
            seen: now,
            live: true,
        };
        if let Some(old) = inner.entries.insert(conversation, entry) {
            inner.sub(old);
        }
        inner.add(entry);
        inner.live.push_back((now, conversation));
        inner.kept.push_back((now, conversation));
    }

    /// Routing text of live conversations on each of `backends`, in that order.
    pub fn of(&self, backends: impl Iterator<Item = BackendId>) -> Vec<TextBytes> {
        self.expire();
        let inner = self.inner.lock();
        backends
            .map(|b| (inner.per_backend.get(b.0 as usize).copied()).unwrap_or_default())
            .collect()
    }

    /// The backend `conversation` was last placed on, if it was seen within the TTL.
    pub fn backend_of(&self, conversation: u128) -> Option<BackendId> {
        self.expire();
        self.inner
            .lock()
            .entries
            .get(&conversation)
            .map(|e| e.backend)
    }

    /// Lets time pass: sums and table drop what went idle. Returns the time now.
    fn expire(&self) -> Duration {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        inner.expire_live(now.saturating_sub(self.horizon));
        inner.expire_kept(now.saturating_sub(self.ttl));
        now
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

impl super::Table for Footprints {
    fn name(&self) -> &'static str {
        "conversations"
    }

    fn entries(&self) -> usize {
        self.inner.lock().entries.len()
    }

    fn sweep(&self, live: &dyn Fn(BackendId) -> bool) {
        self.expire();
        self.retain(live);
    }
}

impl Inner {
    fn add(&mut self, e: Entry) {
        if !e.live {
            return;
        }
        let i = e.backend.0 as usize;
        if self.per_backend.len() <= i {
            self.per_backend.resize(i + 1, TextBytes(0));
        }
        self.per_backend[i] += e.bytes;
    }

    fn sub(&mut self, e: Entry) {
        if !e.live {
            return;
        }
        if let Some(sum) = self.per_backend.get_mut(e.backend.0 as usize) {
            *sum = sum.saturating_sub(e.bytes);
        }
    }

    /// Conversations last seen before `cutoff` stop counting in the sums.
    fn expire_live(&mut self, cutoff: Duration) {
        while let Some((at, key)) = self.live.front().copied().filter(|&(at, _)| at < cutoff) {
            self.live.pop_front();
            let Some(entry) = self.entries.get(&key).copied().filter(|e| e.seen == at) else {
                continue;
            };
            self.sub(entry);
            if let Some(e) = self.entries.get_mut(&key) {
                e.live = false;
            }
        }
    }

    /// Conversations last seen before `cutoff` are forgotten.
    fn expire_kept(&mut self, cutoff: Duration) {
        while let Some((at, key)) = self.kept.front().copied().filter(|&(at, _)| at < cutoff) {
            self.kept.pop_front();
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

    fn sizes(bytes: &[usize]) -> Vec<TextBytes> {
        bytes.iter().map(|&b| TextBytes(b)).collect()
    }

    fn table() -> (Footprints, Manual) {
        let clock = Manual::default();
        let ttl = Duration::from_secs(600);
        let t = Footprints::new(Duration::from_secs(60), ttl, 100, Arc::new(clock.clone()));
        (t, clock)
    }

    #[test]
    fn sums_the_latest_size_and_follows_moves() {
        let (t, _) = table();
        t.note(1, BackendId(0), TextBytes(100));
        t.note(1, BackendId(0), TextBytes(150));
        t.note(2, BackendId(1), TextBytes(40));
        assert_eq!(
            t.of([BackendId(0), BackendId(1)].into_iter()),
            sizes(&[150, 40])
        );
        t.note(1, BackendId(1), TextBytes(160));
        assert_eq!(
            t.of([BackendId(0), BackendId(1)].into_iter()),
            sizes(&[0, 200])
        );
        t.retain(&|b| b != BackendId(1));
        assert_eq!(t.of([BackendId(1)].into_iter()), sizes(&[0]));
    }

    #[test]
    fn idle_conversations_stop_counting() {
        let (t, clock) = table();
        t.note(1, BackendId(0), TextBytes(100));
        clock.set(Duration::from_secs(30));
        t.note(2, BackendId(0), TextBytes(10));
        clock.set(Duration::from_secs(61));
        assert_eq!(t.of([BackendId(0)].into_iter()), sizes(&[10]));
        clock.set(Duration::from_secs(95));
        assert_eq!(t.of([BackendId(0)].into_iter()), sizes(&[0]));
        assert_eq!(t.backend_of(1), Some(BackendId(0)));
        clock.set(Duration::from_secs(700));
        assert_eq!(t.backend_of(1), None);
    }
}
