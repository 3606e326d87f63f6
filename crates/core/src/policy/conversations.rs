//! The conversation table: which backend each conversation was last placed on and by
//! whom (remembered for a time-to-live), and for each backend the routing text of its
//! *live* conversations, those expected back: what its KV must hold for them to keep
//! hitting. A start that several conversations share (a system prompt, as the prefix
//! index saw it) is held once on a backend, so it counts once there, however many of its
//! live conversations begin with it. Bounded in entries; entries leave as time passes
//! (amortized on every note).
//!
//! A conversation is live until it has been idle for [`LIVE_GAPS`] times its own rhythm
//! (the time between its last notes, the longer of the last two nearly), at least
//! [`MIN_LIVE`] and at most [`LIVE_HORIZON`]: a router in front of agents that call tools
//! every second and one in front of people who type for a minute both drop a finished
//! conversation from the sums soon after its last turn, and a demo that runs time 20x
//! faster sees what the fleet it compresses would. A request that an engine refused or
//! that failed holds no KV: [`Conversations::release`] takes its conversation out of the
//! sums at once.
//!
//! Router replicas share it: every placement a replica makes is a [`Note`], handed to a
//! sink (the router publishes it), and the notes of the other replicas are merged in, so
//! that a conversation whose turns reach different replicas has one home.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

use crate::BackendId;
use crate::clock::Clock;
use crate::units::TextBytes;

/// Longest idle time after which a conversation no longer counts in its backend's live
/// text (also the only one for a conversation seen once).
pub const LIVE_HORIZON: Duration = Duration::from_secs(30);

/// A conversation seen more than once stops counting after this many times its rhythm.
pub const LIVE_GAPS: u32 = 4;

/// Shortest idle time after which a conversation stops counting: notes closer together
/// (a retry, requests sent at once) say nothing of its rhythm.
pub const MIN_LIVE: Duration = Duration::from_secs(1);

/// Idle time after which the table forgets a conversation.
pub const CONVERSATION_TTL: Duration = Duration::from_secs(1800);

/// Bound on conversations remembered.
pub const MAX_CONVERSATIONS: usize = 1 << 20;

/// One placement of a conversation, or (with `bytes` 0) its release: the request placed
/// last holds no KV on `backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Note {
    /// The conversation (its session key, or the hash of its anchor).
    pub conversation: u128,
    /// Where it was placed.
    pub backend: BackendId,
    /// Its routing text now; 0 for a release.
    pub bytes: TextBytes,
    /// The start of that text other conversations share (a system prompt), which its
    /// backend holds once however many conversations count it; 0 if none.
    pub shared: TextBytes,
    /// Who placed it: a router replica's id.
    pub origin: u64,
}

#[derive(Clone, Copy)]
struct ConversationEntry {
    backend: BackendId,
    origin: u64,
    bytes: TextBytes,
    shared: TextBytes,
    seen: Duration,
    /// Its rhythm: the time between its last two notes, or half the one before when that
    /// was longer; `None` until it is seen twice.
    gap: Option<Duration>,
    /// When it stops counting in its backend's sum, if it counts.
    live_until: Option<Duration>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<u128, ConversationEntry>,
    /// When each note stops counting in the sums, earliest first; stale when the entry
    /// was seen again since.
    live: BinaryHeap<Reverse<(Duration, u128)>>,
    /// Notes in time order, (when, conversation), to leave the table at the time-to-live;
    /// stale when seen again later.
    kept: VecDeque<(Duration, u128)>,
    /// Live conversations, by backend id.
    per_backend: Vec<Held>,
}

/// A backend's live conversations, as summed: their own text, and the shared starts they
/// count, each once.
#[derive(Clone, Default)]
struct Held {
    conversations: usize,
    whole: TextBytes,
    own: TextBytes,
    /// Shared start -> how many live conversations count it. Keyed by length: two
    /// different prompts of one length are taken for one.
    shared: BTreeMap<TextBytes, usize>,
}

impl Held {
    fn live(&self) -> Live {
        let shared = self.shared.keys().fold(TextBytes(0), |sum, &s| sum + s);
        Live {
            conversations: self.conversations,
            bytes: self.own + shared,
            whole: self.whole,
        }
    }
}

/// A backend's live conversations: what its KV must hold for them to keep hitting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Live {
    /// How many.
    pub conversations: usize,
    /// Their routing text, a start several of them share counted once: what the KV holds
    /// for them.
    pub bytes: TextBytes,
    /// Their routing texts summed, each whole: what they would hold apart.
    pub whole: TextBytes,
}

type Sink = Box<dyn Fn(Note) + Send + Sync>;

/// Conversation -> (backend, origin, size), with per-backend sums of live conversations.
pub struct Conversations {
    inner: Mutex<Inner>,
    horizon: Duration,
    ttl: Duration,
    max: usize,
    clock: Arc<dyn Clock>,
    sink: OnceLock<Sink>,
}

impl Conversations {
    /// A table on `clock` with the default horizon, time-to-live and bound.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Conversations::with(LIVE_HORIZON, CONVERSATION_TTL, MAX_CONVERSATIONS, clock)
    }

    /// A table where a conversation idle for `horizon` on `clock` (or sooner, by its
    /// rhythm) no longer counts in its backend's sum, one idle for `ttl` is forgotten, and
    /// at most `max` are remembered.
    pub fn with(horizon: Duration, ttl: Duration, max: usize, clock: Arc<dyn Clock>) -> Self {
        Conversations {
            inner: Mutex::new(Inner::default()),
            horizon,
            ttl: ttl.max(horizon),
            max,
            clock,
            sink: OnceLock::new(),
        }
    }

    /// Hands every note made here from now on to `sink` too (the replication of the
    /// table to other router replicas). Set once; later calls are ignored.
    pub fn on_note(&self, sink: impl Fn(Note) + Send + Sync + 'static) {
        let _ = self.sink.set(Box::new(sink));
    }

    /// This router placed a conversation, or released it: recorded, and handed to the
    /// sink.
    pub fn note(&self, note: Note) {
        self.merge(note);
        if let Some(sink) = self.sink.get() {
            sink(note);
        }
    }

    /// The request of `conversation` that this router placed last on `backend` holds no
    /// KV there (the engine refused it, or it failed): the conversation stops counting in
    /// the backend's sum until its next placement. Its home stays.
    pub fn release(&self, conversation: u128, backend: BackendId, origin: u64) {
        self.note(Note {
            conversation,
            backend,
            bytes: TextBytes(0),
            shared: TextBytes(0),
            origin,
        });
    }

    /// Another replica placed or released a conversation: recorded.
    pub fn merge(&self, note: Note) {
        let now = self.expire();
        let mut inner = self.inner.lock();
        if note.bytes.0 == 0 {
            inner.release(note.conversation, note.backend);
            return;
        }
        if inner.entries.len() >= self.max && !inner.entries.contains_key(&note.conversation) {
            return;
        }
        let old = inner.entries.get(&note.conversation).copied();
        let gap = old.map(|old| {
            let gap = now.saturating_sub(old.seen);
            old.gap.map_or(gap, |g| gap.max(g / 2))
        });
        let horizon = gap.map_or(self.horizon, |g| {
            (g * LIVE_GAPS).clamp(MIN_LIVE, self.horizon)
        });
        let entry = ConversationEntry {
            backend: note.backend,
            origin: note.origin,
            bytes: note.bytes,
            shared: note.shared.min(note.bytes),
            seen: now,
            gap,
            live_until: Some(now + horizon),
        };
        if let Some(old) = old {
            inner.sub(old);
        }
        inner.entries.insert(note.conversation, entry);
        inner.add(entry);
        inner.live.push(Reverse((now + horizon, note.conversation)));
        inner.kept.push_back((now, note.conversation));
    }

    /// The live conversations on each of `backends`, in that order.
    pub fn held(&self, backends: impl Iterator<Item = BackendId>) -> Vec<Live> {
        self.expire();
        let inner = self.inner.lock();
        backends
            .map(|b| (inner.per_backend.get(b.0 as usize)).map_or_else(Live::default, Held::live))
            .collect()
    }

    /// The backend `conversation` was last placed on and who placed it, if it was seen
    /// within the time-to-live.
    pub fn home_of(&self, conversation: u128) -> Option<(BackendId, u64)> {
        self.expire();
        let inner = self.inner.lock();
        inner
            .entries
            .get(&conversation)
            .map(|e| (e.backend, e.origin))
    }

    /// Lets time pass: sums and table drop what went idle. Returns the time now.
    fn expire(&self) -> Duration {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        inner.expire_live(now);
        inner.expire_kept(now.saturating_sub(self.ttl));
        now
    }

    /// Forgets the conversations of backends for which `live` is false.
    fn retain(&self, live: &dyn Fn(BackendId) -> bool) {
        let mut inner = self.inner.lock();
        let gone: Vec<(u128, ConversationEntry)> = (inner.entries.iter())
            .filter(|(_, e)| !live(e.backend))
            .map(|(k, e)| (*k, *e))
            .collect();
        for (key, entry) in gone {
            inner.entries.remove(&key);
            inner.sub(entry);
        }
    }
}

impl super::Table for Conversations {
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
    fn add(&mut self, e: ConversationEntry) {
        if e.live_until.is_none() {
            return;
        }
        let i = e.backend.0 as usize;
        if self.per_backend.len() <= i {
            self.per_backend.resize(i + 1, Held::default());
        }
        let held = &mut self.per_backend[i];
        held.conversations += 1;
        held.whole += e.bytes;
        held.own += e.bytes.saturating_sub(e.shared);
        if e.shared.0 > 0 {
            *held.shared.entry(e.shared).or_default() += 1;
        }
    }

    fn sub(&mut self, e: ConversationEntry) {
        if e.live_until.is_none() {
            return;
        }
        let Some(held) = self.per_backend.get_mut(e.backend.0 as usize) else {
            return;
        };
        held.conversations = held.conversations.saturating_sub(1);
        held.whole = held.whole.saturating_sub(e.bytes);
        held.own = held.own.saturating_sub(e.bytes.saturating_sub(e.shared));
        if let Some(n) = held.shared.get_mut(&e.shared) {
            *n -= 1;
            if *n == 0 {
                held.shared.remove(&e.shared);
            }
        }
    }

    /// `key` stops counting in its backend's sum, if it was last placed on `backend`.
    fn release(&mut self, key: u128, backend: BackendId) {
        let Some(entry) = self.entries.get(&key).copied() else {
            return;
        };
        if entry.backend == backend {
            self.stop_counting(key, entry);
        }
    }

    fn stop_counting(&mut self, key: u128, entry: ConversationEntry) {
        self.sub(entry);
        let entry = ConversationEntry {
            live_until: None,
            ..entry
        };
        self.entries.insert(key, entry);
    }

    /// Conversations whose live time ended by `now` stop counting in the sums.
    fn expire_live(&mut self, now: Duration) {
        while let Some(&Reverse((at, key))) = self.live.peek().filter(|r| r.0.0 <= now) {
            self.live.pop();
            let Some(entry) = self.entries.get(&key).copied() else {
                continue;
            };
            if entry.live_until == Some(at) {
                self.stop_counting(key, entry);
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
    use crate::policy::Table;

    fn table() -> (Conversations, Manual) {
        let clock = Manual::default();
        let ttl = Duration::from_secs(600);
        let t = Conversations::with(Duration::from_secs(60), ttl, 100, Arc::new(clock.clone()));
        (t, clock)
    }

    fn note(conversation: u128, backend: u32, bytes: usize) -> Note {
        Note {
            conversation,
            backend: BackendId(backend),
            bytes: TextBytes(bytes),
            shared: TextBytes(0),
            origin: 7,
        }
    }

    /// (conversations, bytes) live on each of `backends`.
    fn held(t: &Conversations, backends: &[u32]) -> Vec<(usize, usize)> {
        let held = t.held(backends.iter().map(|&b| BackendId(b)));
        held.iter().map(|h| (h.conversations, h.bytes.0)).collect()
    }

    #[test]
    fn sums_the_latest_size_and_follows_moves() {
        let (t, _) = table();
        t.note(note(1, 0, 100));
        t.note(note(1, 0, 150));
        t.note(note(2, 1, 40));
        assert_eq!(held(&t, &[0, 1]), [(1, 150), (1, 40)]);
        t.merge(note(1, 1, 160));
        assert_eq!(held(&t, &[0, 1]), [(0, 0), (2, 200)]);
        t.sweep(&|b| b != BackendId(1));
        assert_eq!(held(&t, &[1]), [(0, 0)]);
    }

    #[test]
    fn a_start_several_conversations_share_counts_once_per_backend() {
        let (t, _) = table();
        let sharing = |conversation, backend, bytes, shared| Note {
            shared: TextBytes(shared),
            ..note(conversation, backend, bytes)
        };
        // Three conversations over a prompt of 100, two of them on backend 0.
        t.note(sharing(1, 0, 150, 100));
        t.note(sharing(2, 0, 130, 100));
        t.note(sharing(3, 1, 120, 100));
        // Another prompt, of 80, on backend 0 too.
        t.note(sharing(4, 0, 90, 80));
        assert_eq!(held(&t, &[0, 1]), [(3, 50 + 30 + 10 + 100 + 80), (1, 120)]);
        let whole = t.held([BackendId(0)].into_iter())[0].whole;
        assert_eq!(whole, TextBytes(150 + 130 + 90), "each whole");
        // Moved, a conversation takes its share along; the prompt stays while one counts it.
        t.note(sharing(1, 1, 160, 100));
        t.note(sharing(4, 1, 95, 80));
        assert_eq!(held(&t, &[0, 1]), [(1, 130), (3, 60 + 20 + 15 + 100 + 80)]);
    }

    #[test]
    fn idle_conversations_stop_counting() {
        let (t, clock) = table();
        t.note(note(1, 0, 100));
        clock.set(Duration::from_secs(30));
        t.note(note(2, 0, 10));
        clock.set(Duration::from_secs(61));
        assert_eq!(held(&t, &[0]), [(1, 10)]);
        clock.set(Duration::from_secs(95));
        assert_eq!(held(&t, &[0]), [(0, 0)]);
        assert_eq!(t.home_of(1), Some((BackendId(0), 7)));
        clock.set(Duration::from_secs(700));
        assert_eq!(t.home_of(1), None);
    }

    #[test]
    fn local_notes_reach_the_sink_and_merged_ones_do_not() {
        let (t, _) = table();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&sent);
        t.on_note(move |n| seen.lock().push(n.conversation));
        t.note(note(1, 0, 10));
        t.merge(note(2, 0, 10));
        assert_eq!(*sent.lock(), [1]);
        assert_eq!(t.entries(), 2);
    }

    #[test]
    fn a_conversation_counts_for_a_few_of_its_own_turns() {
        let (t, clock) = table();
        for at in [0, 2, 4] {
            clock.set(Duration::from_secs(at));
            t.note(note(1, 0, 100));
        }
        // Every 2 s: live for 4 x 2 s after its last note.
        clock.set(Duration::from_secs(11));
        assert_eq!(held(&t, &[0]), [(1, 100)]);
        clock.set(Duration::from_secs(13));
        assert_eq!(held(&t, &[0]), [(0, 0)]);
        // A slower turn lengthens its rhythm at once; a quicker one shortens it by half.
        clock.set(Duration::from_secs(23));
        t.note(note(1, 0, 100));
        clock.set(Duration::from_secs(24));
        t.note(note(1, 0, 100));
        clock.set(Duration::from_secs(24 + 4 * 19 / 2 - 1));
        assert_eq!(held(&t, &[0]), [(1, 100)]);
        assert_eq!(t.home_of(1), Some((BackendId(0), 7)));
    }

    #[test]
    fn notes_at_once_keep_a_conversation_live_for_a_second() {
        let (t, clock) = table();
        t.note(note(1, 0, 100));
        t.note(note(1, 0, 120));
        clock.set(Duration::from_millis(999));
        assert_eq!(held(&t, &[0]), [(1, 120)]);
        clock.set(Duration::from_millis(1001));
        assert_eq!(held(&t, &[0]), [(0, 0)]);
    }

    #[test]
    fn a_released_conversation_stops_counting_and_keeps_its_home() {
        let (t, _) = table();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&sent);
        t.on_note(move |n| seen.lock().push(n.bytes.0));
        t.note(note(1, 0, 100));
        t.note(note(2, 0, 50));
        // Released on another backend: nothing changes.
        t.release(1, BackendId(1), 7);
        assert_eq!(held(&t, &[0]), [(2, 150)]);
        t.release(1, BackendId(0), 7);
        assert_eq!(held(&t, &[0]), [(1, 50)]);
        assert_eq!(t.home_of(1), Some((BackendId(0), 7)));
        // Its next turn counts again; a replica hears of the release as a note of 0 bytes.
        t.note(note(1, 0, 110));
        assert_eq!(held(&t, &[0]), [(2, 160)]);
        assert_eq!(*sent.lock(), [100, 50, 0, 0, 110]);
        t.merge(note(1, 0, 0));
        assert_eq!(held(&t, &[0]), [(1, 50)]);
    }
}
