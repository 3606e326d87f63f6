//! The session table: which backend last served each session, forgotten after an idle TTL.
//! Sharded so that concurrent requests rarely share a lock; bounded in entries so that
//! clients minting ids cannot grow it without limit (beyond the bound, new sessions are
//! simply not remembered and their requests are placed by the policy).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::BackendId;
use crate::clock::Clock;
use crate::request::SessionKey;

const SHARDS: usize = 64;

/// Default bound on remembered sessions.
pub const MAX_SESSIONS: usize = 1 << 20;

/// Idle time after which a session forgets its backend, by default (`session_ttl`).
pub const SESSION_TTL: Duration = Duration::from_secs(1800);

#[derive(Clone, Copy)]
struct SessionEntry {
    backend: BackendId,
    /// When it was last used, on `clock`.
    seen: Duration,
}

/// Session key -> backend, with expiry.
pub struct Sessions {
    shards: Vec<Mutex<HashMap<SessionKey, SessionEntry>>>,
    ttl: Duration,
    per_shard: usize,
    clock: Arc<dyn Clock>,
}

impl Sessions {
    /// A table forgetting sessions idle for `ttl` on `clock`, holding at most `max` of them.
    pub fn new(ttl: Duration, max: usize, clock: Arc<dyn Clock>) -> Self {
        Sessions {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            ttl,
            per_shard: max.div_ceil(SHARDS),
            clock,
        }
    }

    fn fresh(&self, entry: &SessionEntry) -> bool {
        self.clock.now().saturating_sub(entry.seen) < self.ttl
    }

    fn shard(&self, key: SessionKey) -> &Mutex<HashMap<SessionKey, SessionEntry>> {
        &self.shards[(key.0 as usize) % SHARDS]
    }

    /// The backend that last served `key`, if the session is not expired.
    pub fn get(&self, key: SessionKey) -> Option<BackendId> {
        let entry = *self.shard(key).lock().get(&key)?;
        self.fresh(&entry).then_some(entry.backend)
    }

    /// Records that `backend` serves `key` now.
    pub fn set(&self, key: SessionKey, backend: BackendId) {
        let mut shard = self.shard(key).lock();
        if shard.len() >= self.per_shard && !shard.contains_key(&key) {
            return;
        }
        shard.insert(
            key,
            SessionEntry {
                backend,
                seen: self.clock.now(),
            },
        );
    }

    /// Drops expired sessions and those of backends for which `live` is false.
    pub fn sweep(&self, live: &dyn Fn(BackendId) -> bool) {
        for shard in &self.shards {
            shard.lock().retain(|_, e| self.fresh(e) && live(e.backend));
        }
    }

    /// Sessions remembered.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether no session is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl super::Table for Sessions {
    fn name(&self) -> &'static str {
        "sessions"
    }

    fn entries(&self) -> usize {
        Sessions::len(self)
    }

    fn sweep(&self, live: &dyn Fn(BackendId) -> bool) {
        Sessions::sweep(self, live);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::clock::Manual;

    fn table(ttl: Duration, max: usize) -> (Sessions, Manual) {
        let clock = Manual::default();
        (Sessions::new(ttl, max, Arc::new(clock.clone())), clock)
    }

    #[test]
    fn remembers_until_ttl_and_sweeps_dead_backends() {
        let (table, clock) = table(Duration::from_secs(60), 100);
        let key = SessionKey::of(b"s");
        table.set(key, BackendId(3));
        assert_eq!(table.get(key), Some(BackendId(3)));
        table.sweep(&|b| b != BackendId(3));
        assert_eq!(table.get(key), None);
        table.set(key, BackendId(1));
        clock.set(Duration::from_secs(59));
        assert_eq!(table.get(key), Some(BackendId(1)));
        clock.set(Duration::from_secs(60));
        assert_eq!(table.get(key), None);
        table.sweep(&|_| true);
        assert!(table.is_empty());
    }

    #[test]
    fn bounded() {
        let (table, _) = table(Duration::from_secs(60), SHARDS);
        for i in 0..10_000u32 {
            table.set(SessionKey::of(&i.to_le_bytes()), BackendId(0));
        }
        assert!(table.len() <= SHARDS);
    }
}
