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

use prefix_router_core::BackendId;
use prefix_router_core::clock::{Clock, Monotonic};
use prefix_router_core::flow::{Key, Order, Shed, TenantId, order};
use prefix_router_core::ledger::Cap;

pub use prefix_router_core::flow::Bounds;

use crate::fleet::Fleet;
use crate::tenants::preempt::Preemptible;
use crate::tenants::{Priority, Shares};

/// Where a request stands in the queue's order and among the flows.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ticket<'t> {
    /// What the queue's order weighs: its priority, tenant, tenant's weight and cost.
    pub flow: order::QueueTicket<'t>,
    /// The tenants' fair shares (with a tenants file).
    pub shares: Option<&'t Shares>,
    /// Slots of each held backend it leaves free for an arrival (`standing_slots`).
    pub standing: usize,
    /// Not counted in its tenant's share (`POST /route` asks about a request that has
    /// not arrived): weighed as if it were.
    pub arriving: bool,
}

impl<'t> Ticket<'t> {
    /// What it may take of a backend under the in-flight `limit` (0: none), with the
    /// reserve its tenant's share asks, as it stands now, and its cost as its prompt.
    pub fn cap(&self, limit: usize) -> Cap {
        let (tenant, priority, standing) = (self.flow.tenant, self.flow.priority, self.standing);
        let cap = |s: &Shares| Cap {
            tokens: usize::try_from(self.flow.cost).unwrap_or(usize::MAX),
            ..match self.arriving {
                true => s.cap_arriving(tenant, self.flow.weight, priority, limit, standing),
                false => s.cap(tenant, priority, limit, standing),
            }
        };
        self.shares.map_or(Cap::from(limit), cap)
    }

    /// Placed on `backend` under `cap`, a request the reserve is not kept for may be
    /// stopped, until its answer, by one that outranks it ([`crate::tenants::preempt`]).
    pub fn preemptible(&self, cap: Cap, backend: BackendId) -> Option<Preemptible<'t>> {
        let shares = self.shares.filter(|_| !cap.kept())?;
        Some(Preemptible::enter(
            shares,
            backend,
            self.flow.tenant,
            self.flow.priority,
        ))
    }

    /// Placed on `backend` under `cap`, a request the reserve is kept for stops those
    /// there that it outranks and that have no answer yet; returns how many.
    pub fn preempt(&self, cap: Cap, backend: BackendId) -> usize {
        let shares = self.shares.filter(|_| cap.kept());
        shares.map_or(0, |s| {
            s.preempt(backend, self.flow.tenant, self.flow.priority)
        })
    }

    /// Stops the last placed request with no answer yet at the lowest priority below its
    /// own (with a tenants file), on `on`: for want of a place in a full queue, on any
    /// backend (`None`); for want of a slot at its conversation's home, there. Whether
    /// there was one.
    pub fn displace(&self, on: Option<BackendId>) -> bool {
        self.shares
            .is_some_and(|s| s.displace(self.flow.priority, on))
    }

    /// The bound it may wait past in a queue full at `bound` of waiters it may not shed
    /// ([`Shares::past_bound`], with a tenants file; else `bound`).
    pub fn past_bound(&self, bound: usize) -> usize {
        self.shares
            .map_or(bound, |s| s.past_bound(self.flow.priority, bound))
    }

    /// Whether [`Self::displace`] on `on` would find a request to stop: one of a lower
    /// priority, with no answer yet, is in flight there.
    pub fn outranks_any(&self, on: Option<BackendId>) -> bool {
        self.shares
            .is_some_and(|s| s.any_below(self.flow.priority, on))
    }

    /// How many requests [`Self::preempt`] would stop on `backend` now (`POST /route`).
    pub fn outranked(&self, cap: Cap, backend: BackendId) -> usize {
        let shares = self.shares.filter(|_| cap.kept());
        shares.map_or(0, |s| {
            s.outranked(backend, self.flow.tenant, self.flow.priority)
        })
    }

    /// Whether it may pass the waiters of `queue` to a slot open for it: the reserve is
    /// kept for it ([`Shares::light`]), and no waiter has a higher priority.
    pub fn passes(&self, queue: &Queue) -> bool {
        self.cap(0).kept()
            && queue
                .first_priority()
                .is_none_or(|p| p <= self.flow.priority)
    }
}

#[derive(Default)]
struct Waiter {
    wake: Notify,
    shed: AtomicBool,
}

/// The queue.
#[derive(Default)]
pub struct Queue {
    waiting: AtomicUsize,
    order: Mutex<Order<Arc<Waiter>>>,
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

    /// A place for `ticket`, if fewer than `bounds` allow wait (or a waiter can be shed
    /// for it when the whole queue is full; never when its tenant's or its priority's
    /// bound is); after `promote_after` it goes first whatever its priority.
    pub fn join(
        &self,
        bounds: impl Into<Bounds>,
        ticket: Ticket,
        promote_after: Duration,
    ) -> Option<Place<'_>> {
        let waiter = Arc::new(Waiter::default());
        let promoted = self.clock.now() + promote_after;
        let payload = Arc::clone(&waiter);
        let joined = (self.order.lock()).join(bounds, &ticket.flow, promoted, payload);
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
    waiter: Arc<Waiter>,
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

    fn ticket(priority: Priority) -> Ticket<'static> {
        Ticket {
            flow: order::QueueTicket {
                priority,
                ..Default::default()
            },
            ..Ticket::default()
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
