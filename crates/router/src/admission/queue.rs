//! The router's queue for when every ready backend is at its in-flight limit: a request
//! waits here, holding nothing but its place, until a backend frees a slot, and is then
//! placed by the policy as the fleet is at that moment (late binding). Bounded in length
//! (`max_queued`) and in wait (`queue_timeout`); a request that leaves (timeout, client
//! gone) frees its place.
//!
//! Order: priority first, then a weighted fair share among tenants in tokens (each
//! tenant's requests start at its own virtual time, which advances by a request's
//! estimated tokens over the tenant's weight, never behind the queue's), then first come
//! first served. Against starvation, the earliest waiter goes first whatever its
//! priority once it waited its promotion time (half the queue timeout). A freed slot wakes one waiter (the fleet wakes the longest); one that is
//! not first in this order passes the wake to the first. A full queue makes room for a
//! request by shedding the last waiter of a lower priority, or of the tenant with the
//! most waiters in its own priority, if there is one.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

use prefix_router_core::BackendId;
use prefix_router_core::ledger::Cap;

use crate::fleet::Fleet;
use crate::tenants::preempt::Preemptible;
use crate::tenants::{Priority, Shares};

impl Order {
    /// The waiter a full queue sheds for `ticket`: the last of a lower priority; else, of
    /// its own priority, the last of the tenant with the most waiters, when that is
    /// another tenant with more than one waiter more than `ticket`'s. So one tenant
    /// cannot fill the queue against the others.
    fn victim(&self, ticket: &Ticket) -> Option<Key> {
        let (last, _) = self.waiters.last_key_value()?;
        if last.0.0 != ticket.priority {
            return (last.0.0 < ticket.priority).then_some(*last);
        }
        let mut tenants: HashMap<&str, (usize, Key)> = HashMap::new();
        let band = (self.waiters.iter()).filter(|(k, _)| k.0.0 == ticket.priority);
        for (key, waiter) in band {
            let entry = tenants.entry(&waiter.tenant).or_insert((0, *key));
            *entry = (entry.0 + 1, *key);
        }
        let mine = tenants.get(ticket.tenant).map_or(0, |t| t.0);
        let (tenant, (most, key)) = tenants.into_iter().max_by_key(|(_, t)| t.0)?;
        (tenant != ticket.tenant && most > mine + 1).then_some(key)
    }

    /// The key first in order: the earliest waiter once promoted, else the least key.
    fn first(&self) -> Option<Key> {
        let oldest = self.arrivals.first_key_value().map(|(_, k)| *k);
        let promoted = |k: &Key| {
            self.waiters
                .get(k)
                .is_some_and(|w| w.promoted <= Instant::now())
        };
        oldest
            .filter(promoted)
            .or_else(|| self.waiters.first_key_value().map(|(k, _)| *k))
    }
}

/// Where a request stands in the queue's order.
#[derive(Clone, Copy, Debug)]
pub struct Ticket<'t> {
    /// Its priority.
    pub priority: Priority,
    /// Its tenant's name ("" without a tenants file).
    pub tenant: &'t str,
    /// Its tenant's weight (at least 1).
    pub weight: u32,
    /// Its estimated prompt tokens (at least 1 is counted).
    pub cost: u64,
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
    /// reserve its tenant's share asks, as it stands now.
    pub fn cap(&self, limit: usize) -> Cap {
        let (tenant, priority, standing) = (self.tenant, self.priority, self.standing);
        let cap = |s: &Shares| match self.arriving {
            true => s.cap_arriving(tenant, self.weight, priority, limit, standing),
            false => s.cap(tenant, priority, limit, standing),
        };
        self.shares.map_or(Cap::from(limit), cap)
    }

    /// Placed on `backend` under `cap`, a request the reserve is not kept for may be
    /// stopped, until its answer, by one that outranks it ([`crate::tenants::preempt`]).
    pub fn preemptible(&self, cap: Cap, backend: BackendId) -> Option<Preemptible<'t>> {
        let shares = self.shares.filter(|_| !cap.kept)?;
        Some(shares.preemptible(backend, self.tenant, self.priority))
    }

    /// Placed on `backend` under `cap`, a request the reserve is kept for stops those
    /// there that it outranks and that have no answer yet; returns how many.
    pub fn preempt(&self, cap: Cap, backend: BackendId) -> usize {
        let shares = self.shares.filter(|_| cap.kept);
        shares.map_or(0, |s| s.preempt(backend, self.tenant, self.priority))
    }

    /// Stops the last placed request with no answer yet at the lowest priority below its
    /// own (with a tenants file), on `on`: for want of a place in a full queue, on any
    /// backend (`None`); for want of a slot at its conversation's home, there. Whether
    /// there was one.
    pub fn displace(&self, on: Option<BackendId>) -> bool {
        self.shares.is_some_and(|s| s.displace(self.priority, on))
    }

    /// Whether [`Self::displace`] on `on` would find a request to stop: one of a lower
    /// priority, with no answer yet, is in flight there.
    pub fn outranks_any(&self, on: Option<BackendId>) -> bool {
        self.shares.is_some_and(|s| s.any_below(self.priority, on))
    }

    /// How many requests [`Self::preempt`] would stop on `backend` now (`POST /route`).
    pub fn outranked(&self, cap: Cap, backend: BackendId) -> usize {
        let shares = self.shares.filter(|_| cap.kept);
        shares.map_or(0, |s| s.outranked(backend, self.tenant, self.priority))
    }

    /// Whether it may pass the waiters of `queue` to a slot open for it: the reserve is
    /// kept for it ([`Shares::light`]), and no waiter has a higher priority.
    pub fn passes(&self, queue: &Queue) -> bool {
        self.cap(0).kept && queue.first_priority().is_none_or(|p| p <= self.priority)
    }
}

impl Default for Ticket<'_> {
    fn default() -> Self {
        Ticket {
            priority: Priority::Normal,
            tenant: "",
            weight: 1,
            cost: 1,
            shares: None,
            standing: 0,
            arriving: false,
        }
    }
}

/// The order: highest priority, lowest virtual time, earliest.
type Key = (Reverse<Priority>, u64, u64);

struct Waiter {
    wake: Notify,
    shed: AtomicBool,
    tenant: String,
    /// When it goes first whatever its priority (starvation protection).
    promoted: Instant,
}

#[derive(Default)]
struct Order {
    waiters: BTreeMap<Key, Arc<Waiter>>,
    /// The waiters' keys by arrival.
    arrivals: BTreeMap<u64, Key>,
    /// Each tenant's virtual time (tokens over weight, scaled).
    tenants: HashMap<String, u64>,
    /// The virtual time of the last request that left first in order.
    now: u64,
    next: u64,
}

/// The queue.
#[derive(Default)]
pub struct Queue {
    waiting: AtomicUsize,
    order: Mutex<Order>,
}

/// How many may wait.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Requests at most.
    pub all: usize,
    /// Requests of one tenant at most (0: only `all`).
    pub per_tenant: usize,
    /// Requests of one priority at most (0: only `all`).
    pub per_priority: usize,
}

impl From<usize> for Bounds {
    fn from(all: usize) -> Self {
        Bounds {
            all,
            per_tenant: 0,
            per_priority: 0,
        }
    }
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
    pub fn depths(&self) -> ([usize; 3], HashMap<String, usize>) {
        let order = self.order.lock();
        let mut priorities = [0; 3];
        let mut tenants = HashMap::new();
        for (key, waiter) in &order.waiters {
            priorities[key.0.0 as usize] += 1;
            *tenants.entry(waiter.tenant.clone()).or_default() += 1;
        }
        (priorities, tenants)
    }

    /// The priority of the waiter first in order.
    pub fn first_priority(&self) -> Option<Priority> {
        self.order.lock().first().map(|k| k.0.0)
    }

    /// Whether no request waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A place for `ticket`, if fewer than `bounds` allow wait (or a waiter can be shed
    /// for it, [`Order::victim`], when the whole queue is full; never when its tenant's or
    /// its priority's bound is); after `promote_after` it goes first whatever its
    /// priority.
    pub fn join(
        &self,
        bounds: impl Into<Bounds>,
        ticket: Ticket,
        promote_after: Duration,
    ) -> Option<Place<'_>> {
        let bounds = bounds.into();
        let mut order = self.order.lock();
        let theirs = |o: &Order| {
            (o.waiters.values())
                .filter(|w| w.tenant == ticket.tenant)
                .count()
        };
        let bounded = bounds.per_tenant > 0 && !ticket.tenant.is_empty();
        if bounded && theirs(&order) >= bounds.per_tenant {
            return None;
        }
        let band = |o: &Order| {
            (o.waiters.keys())
                .filter(|k| k.0.0 == ticket.priority)
                .count()
        };
        if bounds.per_priority > 0 && band(&order) >= bounds.per_priority {
            return None;
        }
        if order.waiters.len() >= bounds.all {
            let key = order.victim(&ticket)?;
            if let Some(last) = order.waiters.remove(&key) {
                last.shed.store(true, Relaxed);
                last.wake.notify_one();
            }
            order.arrivals.remove(&key.2);
            self.waiting.fetch_sub(1, Relaxed);
        }
        let floor = order.now;
        let virtual_time = order.tenants.entry(ticket.tenant.to_string()).or_default();
        let start = (*virtual_time).max(floor);
        *virtual_time = start + ticket.cost.max(1) * 1024 / u64::from(ticket.weight.max(1));
        order.next += 1;
        let key = (Reverse(ticket.priority), start, order.next);
        let waiter = Arc::new(Waiter {
            wake: Notify::new(),
            shed: AtomicBool::new(false),
            tenant: ticket.tenant.to_string(),
            promoted: Instant::now() + promote_after,
        });
        order.waiters.insert(key, Arc::clone(&waiter));
        order.arrivals.insert(key.2, key);
        self.waiting.fetch_add(1, Relaxed);
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
        self.queue.order.lock().first() == Some(self.key)
    }
}

impl Queue {
    /// Wakes the waiter first in order.
    fn wake_first(&self) {
        let order = self.order.lock();
        if let Some(first) = order.first().and_then(|k| order.waiters.get(&k)) {
            first.wake.notify_one();
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut order = self.queue.order.lock();
        let was_first = order.first() == Some(self.key);
        if order.waiters.remove(&self.key).is_some() {
            order.arrivals.remove(&self.key.2);
            self.queue.waiting.fetch_sub(1, Relaxed);
        }
        if was_first {
            order.now = order.now.max(self.key.1);
            // The next one looks at once: more than one slot may be free.
            if let Some(next) = order.first().and_then(|k| order.waiters.get(&k)) {
                next.wake.notify_one();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(priority: Priority, tenant: &str, cost: u64) -> Ticket<'_> {
        Ticket {
            priority,
            tenant,
            cost,
            ..Ticket::default()
        }
    }

    const LATER: Duration = Duration::from_secs(60);

    fn order(queue: &Queue) -> Vec<Key> {
        queue.order.lock().waiters.keys().copied().collect()
    }

    #[test]
    fn priority_first_then_fair_share_then_arrival() {
        let queue = Queue::default();
        let a1 = queue
            .join(10, ticket(Priority::Normal, "a", 100), LATER)
            .unwrap();
        let a2 = queue
            .join(10, ticket(Priority::Normal, "a", 100), LATER)
            .unwrap();
        let b1 = queue
            .join(10, ticket(Priority::Normal, "b", 100), LATER)
            .unwrap();
        let high = queue
            .join(10, ticket(Priority::High, "a", 100), LATER)
            .unwrap();
        let keys = order(&queue);
        assert_eq!(keys[0], high.key, "high first");
        assert_eq!(keys[1], a1.key);
        assert_eq!(keys[2], b1.key, "b's first request before a's second");
        assert_eq!(keys[3], a2.key);
        assert_eq!(queue.len(), 4);
    }

    #[test]
    fn a_full_queue_sheds_its_last_lower_priority_waiter() {
        let queue = Queue::default();
        let normal = queue
            .join(2, ticket(Priority::Normal, "", 1), LATER)
            .unwrap();
        let low = queue.join(2, ticket(Priority::Low, "", 1), LATER).unwrap();
        assert!(
            queue.join(2, ticket(Priority::Low, "", 1), LATER).is_none(),
            "no lower one to shed"
        );
        let high = queue.join(2, ticket(Priority::High, "", 1), LATER).unwrap();
        assert!(low.waiter.shed.load(Relaxed));
        assert!(!normal.waiter.shed.load(Relaxed));
        assert_eq!(queue.len(), 2);
        drop((low, normal, high));
        assert!(queue.is_empty());
    }

    #[test]
    fn a_full_queue_sheds_the_tenant_with_the_most_waiters_for_another() {
        let queue = Queue::default();
        let a: Vec<_> = (0..3)
            .map(|_| {
                queue
                    .join(4, ticket(Priority::Normal, "a", 1), LATER)
                    .unwrap()
            })
            .collect();
        let _b = queue
            .join(4, ticket(Priority::Normal, "b", 1), LATER)
            .unwrap();
        assert!(
            queue
                .join(4, ticket(Priority::Normal, "a", 1), LATER)
                .is_none()
        );
        let _b2 = queue
            .join(4, ticket(Priority::Normal, "b", 1), LATER)
            .unwrap();
        assert!(a[2].waiter.shed.load(Relaxed), "a's last shed for b");
        assert!(!a[1].waiter.shed.load(Relaxed));
        assert!(
            queue
                .join(4, ticket(Priority::Normal, "b", 1), LATER)
                .is_none(),
            "two each: no one is shed"
        );
    }

    #[test]
    fn a_waiter_waiting_past_its_promotion_goes_first() {
        let queue = Queue::default();
        let low = (queue.join(10, ticket(Priority::Low, "", 1), Duration::ZERO)).unwrap();
        let high = queue
            .join(10, ticket(Priority::High, "", 1), LATER)
            .unwrap();
        assert!(low.first(), "promoted at once");
        assert!(!high.first());
        assert_eq!(queue.first_priority(), Some(Priority::Low));
        drop(low);
        assert!(high.first());
    }

    #[test]
    fn a_tenant_waits_no_more_than_its_bound() {
        let queue = Queue::default();
        let bounds = Bounds {
            all: 10,
            per_tenant: 2,
            per_priority: 0,
        };
        let _a: Vec<_> = (0..2)
            .map(|_| {
                queue
                    .join(bounds, ticket(Priority::Normal, "a", 1), LATER)
                    .unwrap()
            })
            .collect();
        assert!(
            queue
                .join(bounds, ticket(Priority::High, "a", 1), LATER)
                .is_none()
        );
        assert!(
            queue
                .join(bounds, ticket(Priority::Normal, "b", 1), LATER)
                .is_some()
        );
    }

    #[test]
    fn a_priority_waits_no_more_than_its_bound() {
        let queue = Queue::default();
        let bounds = Bounds {
            all: 10,
            per_tenant: 0,
            per_priority: 2,
        };
        let join = |priority, tenant| queue.join(bounds, ticket(priority, tenant, 1), LATER);
        let _low: Vec<_> = (0..2).map(|_| join(Priority::Low, "a").unwrap()).collect();
        assert!(join(Priority::Low, "b").is_none(), "the low band is full");
        assert!(
            join(Priority::Normal, "a").is_some(),
            "another band has room"
        );
    }
}
