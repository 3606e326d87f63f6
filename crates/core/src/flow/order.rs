//! The order of the router's queue: priority first, then a weighted fair share among
//! tenants in tokens (each tenant's requests start at its own virtual time, which
//! advances by a request's estimated tokens over the tenant's weight, never behind the
//! queue's), then first come first served. Against starvation, the earliest waiter goes
//! first whatever its priority once it waited its promotion time. A full queue makes room
//! for a request by shedding the last waiter of a lower priority, or of the tenant with
//! the most waiters in its own priority, if there is one. Each waiter carries the
//! caller's payload (the router's wake-up, the lab's request); waking is the caller's.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::{Priority, TenantId};
use crate::units::Tokens;

/// A waiter's place in the order: highest priority, lowest virtual time, earliest.
pub type Key = (Reverse<Priority>, u64, u64);

/// What the order weighs of a request.
#[derive(Clone, Copy, Debug)]
pub struct QueueTicket<'t> {
    /// Its priority.
    pub priority: Priority,
    /// Its tenant ([`TenantId::none`] without a tenants file).
    pub tenant: &'t TenantId,
    /// Its tenant's weight (at least 1 is counted).
    pub weight: u32,
    /// Its estimated prompt tokens (at least 1 is counted).
    pub cost: Tokens,
}

impl Default for QueueTicket<'_> {
    /// A request of no tenant ("") at `normal`, weight 1, cost 1.
    fn default() -> Self {
        QueueTicket {
            priority: Priority::Normal,
            tenant: TenantId::none(),
            weight: 1,
            cost: Tokens(1),
        }
    }
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

struct Waiter<W> {
    tenant: TenantId,
    /// When it goes first whatever its priority (starvation protection), by the caller's
    /// clock.
    promoted: Duration,
    payload: W,
}

/// The waiters in order, each with a payload `W`.
pub struct Order<W> {
    waiters: BTreeMap<Key, Waiter<W>>,
    /// The waiters' keys by arrival.
    arrivals: BTreeMap<u64, Key>,
    /// Each tenant's virtual time (tokens over weight, scaled).
    tenants: HashMap<TenantId, u64>,
    /// The virtual time of the last request that left first in order.
    now: u64,
    next: u64,
}

impl<W> Default for Order<W> {
    fn default() -> Self {
        Order {
            waiters: BTreeMap::new(),
            arrivals: BTreeMap::new(),
            tenants: HashMap::new(),
            now: 0,
            next: 0,
        }
    }
}

/// A waiter a full queue shed to make room.
pub struct Shed<W>(pub W);

impl<W> Order<W> {
    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.waiters.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// A place for `ticket` carrying `payload`, if fewer than `bounds` allow wait (or a
    /// waiter can be shed for it when the whole queue is full, returned with the place;
    /// never when its tenant's or its priority's bound is); from `promoted` (the caller's
    /// clock) it goes first whatever its priority. `None` gives the payload back.
    pub fn join(
        &mut self,
        bounds: impl Into<Bounds>,
        ticket: &QueueTicket,
        promoted: Duration,
        payload: W,
    ) -> Result<(Key, Option<Shed<W>>), W> {
        let bounds = bounds.into();
        let theirs = || (self.waiters.values()).filter(|w| w.tenant == *ticket.tenant);
        let bounded = bounds.per_tenant > 0 && !ticket.tenant.is_empty();
        if bounded && theirs().count() >= bounds.per_tenant {
            return Err(payload);
        }
        let band = (self.waiters.keys()).filter(|k| k.0.0 == ticket.priority);
        if bounds.per_priority > 0 && band.count() >= bounds.per_priority {
            return Err(payload);
        }
        let mut shed = None;
        if self.waiters.len() >= bounds.all {
            let Some(key) = self.victim(ticket) else {
                return Err(payload);
            };
            shed = self.remove(key).map(Shed);
        }
        let floor = self.now;
        let virtual_time = self.tenants.entry(ticket.tenant.clone()).or_default();
        let start = (*virtual_time).max(floor);
        let cost = u64::try_from(ticket.cost.0.max(1)).unwrap_or(u64::MAX);
        *virtual_time = start + cost.saturating_mul(1024) / u64::from(ticket.weight.max(1));
        self.next += 1;
        let key = (Reverse(ticket.priority), start, self.next);
        let waiter = Waiter {
            tenant: ticket.tenant.clone(),
            promoted,
            payload,
        };
        self.waiters.insert(key, waiter);
        self.arrivals.insert(key.2, key);
        Ok((key, shed))
    }

    /// The key first in order at `now` (the caller's clock): the earliest waiter once
    /// promoted, else the least key.
    pub fn first(&self, now: Duration) -> Option<Key> {
        let oldest = self.arrivals.first_key_value().map(|(_, k)| *k);
        let promoted = |k: &Key| self.waiters.get(k).is_some_and(|w| w.promoted <= now);
        oldest
            .filter(promoted)
            .or_else(|| self.waiters.first_key_value().map(|(k, _)| *k))
    }

    /// The payload of the waiter at `key`.
    pub fn get(&self, key: Key) -> Option<&W> {
        self.waiters.get(&key).map(|w| &w.payload)
    }

    /// The waiter at `key` leaves at `now`, with its payload; when it was first, the
    /// queue's virtual time moves to its own.
    pub fn leave(&mut self, key: Key, now: Duration) -> Option<W> {
        if self.first(now) == Some(key) {
            self.now = self.now.max(key.1);
        }
        self.remove(key)
    }

    /// Requests waiting by priority (lowest first) and by tenant.
    pub fn depths(&self) -> ([usize; 3], HashMap<TenantId, usize>) {
        let mut priorities = [0; 3];
        let mut tenants = HashMap::new();
        for (key, waiter) in &self.waiters {
            priorities[key.0.0 as usize] += 1;
            *tenants.entry(waiter.tenant.clone()).or_default() += 1;
        }
        (priorities, tenants)
    }

    fn remove(&mut self, key: Key) -> Option<W> {
        let waiter = self.waiters.remove(&key)?;
        self.arrivals.remove(&key.2);
        Some(waiter.payload)
    }

    /// The waiter a full queue sheds for `ticket`: the last of a lower priority; else, of
    /// its own priority, the last of the tenant with the most waiters, when that is
    /// another tenant with more than one waiter more than `ticket`'s (of two with as many,
    /// the one whose last waiter is later in order: stable, and no name is always the one
    /// shed). So one tenant cannot fill the queue against the others.
    fn victim(&self, ticket: &QueueTicket) -> Option<Key> {
        let (last, _) = self.waiters.last_key_value()?;
        if last.0.0 != ticket.priority {
            return (last.0.0 < ticket.priority).then_some(*last);
        }
        let mut tenants: HashMap<&TenantId, (usize, Key)> = HashMap::new();
        let band = (self.waiters.iter()).filter(|(k, _)| k.0.0 == ticket.priority);
        for (key, waiter) in band {
            let entry = tenants.entry(&waiter.tenant).or_insert((0, *key));
            *entry = (entry.0 + 1, *key);
        }
        let mine = tenants.get(ticket.tenant).map_or(0, |t| t.0);
        let (tenant, (most, key)) = (tenants.into_iter()).max_by_key(|&(_, t)| t)?;
        (tenant != ticket.tenant && most > mine + 1).then_some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ticket of `tenant` (its id lives as long as the test).
    fn ticket(priority: Priority, tenant: &str, cost: usize) -> QueueTicket<'static> {
        QueueTicket {
            priority,
            tenant: Box::leak(Box::new(TenantId::new(tenant))),
            weight: 1,
            cost: Tokens(cost),
        }
    }

    const LATER: Duration = Duration::from_secs(60);

    /// Joins with the waiter's number as its payload.
    fn join(
        order: &mut Order<u32>,
        bounds: impl Into<Bounds>,
        t: QueueTicket,
        n: u32,
    ) -> Option<Key> {
        order.join(bounds, &t, LATER, n).ok().map(|(key, _)| key)
    }

    fn keys(order: &Order<u32>) -> Vec<Key> {
        order.waiters.keys().copied().collect()
    }

    #[test]
    fn priority_first_then_fair_share_then_arrival() {
        let mut order = Order::default();
        let a1 = join(&mut order, 10, ticket(Priority::Normal, "a", 100), 1).unwrap();
        let a2 = join(&mut order, 10, ticket(Priority::Normal, "a", 100), 2).unwrap();
        let b1 = join(&mut order, 10, ticket(Priority::Normal, "b", 100), 3).unwrap();
        let high = join(&mut order, 10, ticket(Priority::High, "a", 100), 4).unwrap();
        assert_eq!(
            keys(&order),
            vec![high, a1, b1, a2],
            "b's first before a's second"
        );
        assert_eq!(order.get(b1), Some(&3));
        assert_eq!(order.len(), 4);
    }

    #[test]
    fn a_full_queue_sheds_its_last_lower_priority_waiter() {
        let mut order = Order::default();
        join(&mut order, 2, ticket(Priority::Normal, "", 1), 1).unwrap();
        join(&mut order, 2, ticket(Priority::Low, "", 1), 2).unwrap();
        let refused = order.join(2, &ticket(Priority::Low, "", 1), LATER, 3);
        assert!(matches!(refused, Err(3)), "no lower one to shed");
        let joined = order.join(2, &ticket(Priority::High, "", 1), LATER, 4);
        let Ok((_, Some(Shed(shed)))) = joined else {
            panic!("nothing shed");
        };
        assert_eq!(shed, 2, "the low one");
        assert_eq!(order.len(), 2);
    }

    #[test]
    fn a_full_queue_sheds_the_tenant_with_the_most_waiters_for_another() {
        let mut order = Order::default();
        for n in 0..3 {
            join(&mut order, 4, ticket(Priority::Normal, "a", 1), n).unwrap();
        }
        join(&mut order, 4, ticket(Priority::Normal, "b", 1), 10).unwrap();
        assert!(join(&mut order, 4, ticket(Priority::Normal, "a", 1), 3).is_none());
        let joined = order.join(4, &ticket(Priority::Normal, "b", 1), LATER, 11);
        assert!(
            matches!(joined, Ok((_, Some(Shed(2))))),
            "a's last shed for b"
        );
        assert!(
            join(&mut order, 4, ticket(Priority::Normal, "b", 1), 12).is_none(),
            "two each: no one is shed"
        );
    }

    #[test]
    fn of_two_tenants_with_as_many_waiters_the_one_last_in_order_is_shed() {
        for arrivals in [["y", "x", "y", "x"], ["x", "y", "x", "y"]] {
            for _ in 0..32 {
                let mut order = Order::default();
                for (n, tenant) in arrivals.into_iter().enumerate() {
                    join(&mut order, 4, ticket(Priority::Normal, tenant, 1), n as u32).unwrap();
                }
                let joined = order.join(4, &ticket(Priority::Normal, "z", 1), LATER, 9);
                assert!(
                    matches!(joined, Ok((_, Some(Shed(3))))),
                    "{arrivals:?}: the last"
                );
            }
        }
    }

    #[test]
    fn a_waiter_waiting_past_its_promotion_goes_first_and_leaving_first_moves_time() {
        let mut order = Order::default();
        let low = order.join(10, &ticket(Priority::Low, "", 1), Duration::ZERO, 1);
        let (low, _) = low.ok().unwrap();
        let high = join(&mut order, 10, ticket(Priority::High, "", 1), 2).unwrap();
        assert_eq!(order.first(Duration::ZERO), Some(low), "promoted at once");
        assert_eq!(order.leave(low, Duration::ZERO), Some(1));
        assert_eq!(order.first(Duration::ZERO), Some(high));
        assert_eq!(order.leave(high, Duration::ZERO), Some(2));
        assert!(order.is_empty());
    }

    #[test]
    fn a_tenant_and_a_priority_wait_no_more_than_their_bounds() {
        let mut order = Order::default();
        let tenants = Bounds {
            all: 10,
            per_tenant: 2,
            per_priority: 0,
        };
        for n in 0..2 {
            join(&mut order, tenants, ticket(Priority::Normal, "a", 1), n).unwrap();
        }
        assert!(join(&mut order, tenants, ticket(Priority::High, "a", 1), 2).is_none());
        assert!(join(&mut order, tenants, ticket(Priority::Normal, "b", 1), 3).is_some());
        let bands = Bounds {
            all: 10,
            per_tenant: 0,
            per_priority: 2,
        };
        let mut order = Order::default();
        for n in 0..2 {
            join(&mut order, bands, ticket(Priority::Low, "a", 1), n).unwrap();
        }
        let low = join(&mut order, bands, ticket(Priority::Low, "b", 1), 2);
        assert!(low.is_none(), "the low band is full");
        let normal = join(&mut order, bands, ticket(Priority::Normal, "a", 1), 3);
        assert!(normal.is_some(), "another band has room");
    }
}
