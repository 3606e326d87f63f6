//! The router's queue for when every ready backend is at its in-flight limit: a request
//! waits here, holding nothing but its place, until a backend frees a slot (every
//! request's end wakes the longest waiter), and is then placed by the policy as the fleet
//! is at that moment (late binding). Bounded in length (`max_queued`) and in wait
//! (`queue_timeout`); a request that leaves (timeout, client gone) frees its place.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

use crate::fleet::Fleet;

/// The queue's length.
#[derive(Default)]
pub struct Queue {
    waiting: AtomicUsize,
}

impl Queue {
    /// Requests waiting now.
    pub fn len(&self) -> usize {
        self.waiting.load(Relaxed)
    }

    /// Whether no request waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A place in the queue, if fewer than `max` wait.
    pub fn join(&self, max: usize) -> Option<Place<'_>> {
        let joined = (self.waiting).fetch_update(Relaxed, Relaxed, |n| (n < max).then_some(n + 1));
        joined.ok().map(|_| Place { queue: self })
    }
}

/// A request's place in the queue; leaving it (drop) frees it.
pub struct Place<'q> {
    queue: &'q Queue,
}

impl Place<'_> {
    /// Waits until `take` finds a slot in `fleet` (looking again whenever a request ends),
    /// or until `deadline` (then `None`).
    pub async fn wait<T>(
        self,
        fleet: &Fleet,
        deadline: Instant,
        take: impl Fn(&Fleet) -> Option<T>,
    ) -> Option<T> {
        loop {
            let freed = fleet.slot_freed();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(slot) = take(fleet) {
                return Some(slot);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, freed).await.is_err() {
                return None;
            }
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.queue.waiting.fetch_sub(1, Relaxed);
    }
}
