//! The router's queue for when every ready backend is at its in-flight limit: a request
//! waits here, holding nothing but its place, until a backend frees a slot, and is then
//! placed by the policy as the fleet is at that moment (late binding). Bounded in length
//! (`max_queued`) and in wait (`queue_timeout`); a request that leaves (timeout, client
//! gone) frees its place. The order, the bounds and whom a full queue sheds are the core's
//! [`Order`]; here, on tokio: a freed slot wakes one waiter (the fleet wakes the longest);
//! one that is not first in order passes the wake to the first, and one that leaves first
//! wakes the next (more than one slot may be free). Promotion after half the queue
//! timeout.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

use prefix_router_core::clock::{Clock, Monotonic};
use prefix_router_core::flow::{Gate, Key, Order, Priority, Shed, TenantId};

pub use prefix_router_core::flow::Bounds;

use crate::fleet::Fleet;

#[derive(Default)]
struct QueueWaiter {
    wake: Notify,
    shed: AtomicBool,
}

/// The queue.
#[derive(Default)]
pub struct Queue {
    waiting: AtomicUsize,
    order: Mutex<Order<Arc<QueueWaiter>>>,
    clock: Monotonic,
}

/// Why a wait ended without a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Left {
    /// The deadline passed.
    TimedOut,
    /// A request of a higher priority took its place.
    Shed,
}

impl Queue {
    /// Requests waiting now.
    pub fn len(&self) -> usize {
        self.waiting.load(Relaxed)
    }

    /// Requests waiting now by priority (lowest first) and by tenant.
    pub fn depths(&self) -> ([usize; 3], std::collections::HashMap<TenantId, usize>) {
        self.order.lock().depths()
    }

    /// The priority of the waiter first in order.
    pub fn first_priority(&self) -> Option<Priority> {
        self.first().map(|k| k.0.0)
    }

    /// Whether no request waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn first(&self) -> Option<Key> {
        self.order.lock().first(self.clock.now())
    }

    /// A place for `gate`'s request, if fewer than `bounds` allow wait (or a waiter can be
    /// shed for it when the whole queue is full; never when its tenant's or its
    /// priority's bound is); after `promote_after` it goes first whatever its priority.
    pub fn join(
        &self,
        bounds: impl Into<Bounds>,
        gate: Gate,
        promote_after: Duration,
    ) -> Option<Place<'_>> {
        let waiter = Arc::new(QueueWaiter::default());
        let promoted = self.clock.now() + promote_after;
        let payload = Arc::clone(&waiter);
        let joined = (self.order.lock()).join(bounds, &gate.flow, promoted, payload);
        let (key, shed) = joined.ok()?;
        if let Some(Shed(last)) = shed {
            last.shed.store(true, Relaxed);
            last.wake.notify_one();
        } else {
            self.waiting.fetch_add(1, Relaxed);
        }
        Some(Place {
            queue: self,
            key,
            waiter,
        })
    }
}

/// A request's place in the queue; leaving it (drop) frees it.
pub struct Place<'q> {
    queue: &'q Queue,
    key: Key,
    waiter: Arc<QueueWaiter>,
}

impl Place<'_> {
    /// Waits until this place is first in order and `take` finds a slot in `fleet`
    /// (looking again whenever a request ends), or until `deadline`, or until it is shed.
    pub async fn wait<T>(
        &self,
        fleet: &Fleet,
        deadline: Instant,
        take: impl Fn(&Fleet) -> Option<T>,
    ) -> Result<T, Left> {
        loop {
            let freed = fleet.slot_freed();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let woken = self.waiter.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.waiter.shed.load(Relaxed) {
                return Err(Left::Shed);
            }
            if let Some(slot) = self.first().then(|| take(fleet)).flatten() {
                return Ok(slot);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let wake = async {
                tokio::select! {
                    _ = freed => true,
                    _ = woken => false,
                }
            };
            match tokio::time::timeout(left, wake).await {
                Err(_) => return Err(Left::TimedOut),
                Ok(true) if !self.first() => self.queue.wake_first(),
                Ok(_) => {}
            }
        }
    }

    fn first(&self) -> bool {
        self.queue.first() == Some(self.key)
    }
}

impl Queue {
    /// Wakes the waiter first in order.
    fn wake_first(&self) {
        let order = self.order.lock();
        let first = order.first(self.clock.now()).and_then(|k| order.get(k));
        if let Some(first) = first {
            first.wake.notify_one();
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let now = self.queue.clock.now();
        let mut order = self.queue.order.lock();
        let was_first = order.first(now) == Some(self.key);
        if order.leave(self.key, now).is_some() {
            self.queue.waiting.fetch_sub(1, Relaxed);
        }
        if was_first {
            // The next one looks at once: more than one slot may be free.
            if let Some(next) = order.first(now).and_then(|k| order.get(k)) {
                next.wake.notify_one();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(priority: Priority) -> Gate<'static> {
        Gate {
            flow: prefix_router_core::flow::order::QueueTicket {
                priority,
                ..Default::default()
            },
            ..Gate::default()
        }
    }

    const LATER: Duration = Duration::from_secs(60);

    #[test]
    fn a_shed_waiter_is_told_and_the_count_follows_the_places() {
        let queue = Queue::default();
        let normal = queue.join(2, ticket(Priority::Normal), LATER).unwrap();
        let low = queue.join(2, ticket(Priority::Low), LATER).unwrap();
        assert!(queue.join(2, ticket(Priority::Low), LATER).is_none());
        let high = queue.join(2, ticket(Priority::High), LATER).unwrap();
        assert!(low.waiter.shed.load(Relaxed));
        assert!(!normal.waiter.shed.load(Relaxed));
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.depths().0, [0, 1, 1]);
        assert!(high.first(), "high first");
        drop((low, normal, high));
        assert!(queue.is_empty());
    }

    #[test]
    fn a_waiter_waiting_past_its_promotion_goes_first() {
        let queue = Queue::default();
        let low = (queue.join(10, ticket(Priority::Low), Duration::ZERO)).unwrap();
        let high = queue.join(10, ticket(Priority::High), LATER).unwrap();
        assert!(low.first(), "promoted at once");
        assert_eq!(queue.first_priority(), Some(Priority::Low));
        drop(low);
        assert!(high.first());
    }
}
