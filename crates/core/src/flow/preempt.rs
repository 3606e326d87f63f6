//! Preemption before the first byte. Engines split their prefill compute among the
//! requests prefilling at once, so a light tenant's request placed beside a heavy
//! tenant's fresh ones prefills at a fraction of the speed it would alone, however many
//! slots the reserve kept for it. When such a request (one the reserve is kept for) is
//! placed, the requests on its backend that it outranks and that have no answer yet are
//! stopped: their connections close (the engine aborts them, its slot and prefill compute
//! free) and they go back to the router's queue, to be placed again, by the policy, when
//! a slot opens. Their clients see only the delay, or, if the queue is full, 503
//! `overloaded` with `Retry-After` and nothing sent: nothing accepted is lost. A request
//! is stopped at most once for another ([`Stopped::Outranked`]), besides being taken
//! back once from an engine's queue ([`Stopped::TakenBack`]).
//!
//! It outranks another tenant's request at its own priority whose tenant is at or over
//! its fair share. A higher priority stops no lower one where it is placed: the work a
//! stopped `normal` or `low` request does again, and the cache it churns, cost `high`
//! more than sharing the prefill does. It stops the last placed request of the lowest priority below
//! its own ([`Preemptions::displace`]) only for want of a slot: on any backend when the
//! queue is full of requests it may not shed (rather than be shed itself), or when the
//! reserve is kept for it and it would wait in the queue (rather than wait for a lower
//! priority's request to end; [`super::home::make_room`]); at its conversation's home
//! when that is full, taking the slot, rather than move and compute its context again
//! elsewhere. Only with a tenants file: the table holds the requests in flight
//! that have not answered yet, each until its first response byte. Whether a tenant is at
//! or over its fair share is asked of the caller (a function, so that this table knows
//! nothing of shares), outside the table's lock, and stops are called once a request is
//! out of the table and the lock released.

use std::cmp::Reverse;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use super::{Priority, TenantId};
use crate::BackendId;

/// What stops a request: called once, when it is, with why (the router closes its
/// connection, the lab aborts it at its engine).
pub type Stop = Box<dyn Fn(Stopped) + Send + Sync>;

/// Why a request was stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// For a request that outranks it: placed again, it is not stopped again.
    Outranked,
    /// Taken back from its engine's queue ([`super::excess`]): placed again, it may
    /// still be stopped once for a request that outranks it.
    TakenBack,
}

/// A request in flight, not answered yet, that a request outranking it may stop.
struct Flight {
    serial: u64,
    backend: BackendId,
    tenant: TenantId,
    priority: Priority,
    stop: Stop,
}

impl std::fmt::Debug for Flight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Flight {
            serial,
            backend,
            tenant,
            priority,
            ..
        } = self;
        write!(f, "#{serial} on {backend:?} of {tenant:?} at {priority:?}")
    }
}

/// The requests that may be stopped, by backend.
#[derive(Debug, Default)]
pub struct Preemptions {
    flights: Mutex<Vec<Flight>>,
    serial: AtomicU64,
}

impl Preemptions {
    /// Registers a request of `tenant` at `priority` placed on `backend`, stopped by
    /// `stop`, until the returned guard drops (its answer arrived, or it ended).
    pub fn enter(
        &self,
        backend: BackendId,
        tenant: &TenantId,
        priority: Priority,
        stop: Stop,
    ) -> Stoppable<'_> {
        let serial = self.serial.fetch_add(1, Relaxed);
        self.flights.lock().push(Flight {
            serial,
            backend,
            tenant: tenant.clone(),
            priority,
            stop,
        });
        Stoppable {
            preemptions: self,
            serial,
        }
    }

    /// Stops the requests on `backend` that a request of `tenant` at `priority`
    /// outranks, their tenants weighed by `light` (whether a tenant at a priority is below
    /// its fair share) now; returns how many.
    pub fn preempt(
        &self,
        backend: BackendId,
        tenant: &str,
        priority: Priority,
        light: impl Fn(&str, Priority) -> bool,
    ) -> usize {
        let outranked = self.outranked_serials(backend, tenant, priority, light);
        stop_all(
            self.remove(|f| outranked.contains(&f.serial)),
            Stopped::Outranked,
        )
    }

    /// Stops, on `on` (`None`: any backend), the last placed of the requests with no
    /// answer yet at the lowest priority below `priority`; whether there was one.
    pub fn displace(&self, priority: Priority, on: Option<BackendId>) -> bool {
        let mut flights = self.flights.lock();
        let lowest = (flights.iter().enumerate())
            .filter(|(_, f)| f.below(priority, on))
            .min_by_key(|(_, f)| (f.priority, Reverse(f.serial)))
            .map(|(i, _)| i);
        let Some(i) = lowest else {
            return false;
        };
        let flight = flights.swap_remove(i);
        drop(flights);
        stop_all(vec![flight], Stopped::Outranked) == 1
    }

    /// Stops the last `n` placed requests with no answer yet on `backend`, whatever their
    /// priority; how many there were.
    pub fn take_back(&self, backend: BackendId, n: usize) -> usize {
        let mut last: Vec<u64> = (self.flights.lock().iter())
            .filter(|f| f.backend == backend)
            .map(|f| f.serial)
            .collect();
        last.sort_unstable_by_key(|&serial| Reverse(serial));
        last.truncate(n);
        stop_all(
            self.remove(|f| last.contains(&f.serial)),
            Stopped::TakenBack,
        )
    }

    /// Takes the flights `which` picks out of the table, in their order.
    fn remove(&self, which: impl Fn(&Flight) -> bool) -> Vec<Flight> {
        let mut flights = self.flights.lock();
        let mut taken = Vec::new();
        let mut kept = Vec::with_capacity(flights.len());
        for flight in flights.drain(..) {
            match which(&flight) {
                true => taken.push(flight),
                false => kept.push(flight),
            }
        }
        *flights = kept;
        taken
    }

    /// The serials of the requests on `backend` a request of `tenant` at `priority`
    /// outranks; `light` is asked with the table's lock released.
    fn outranked_serials(
        &self,
        backend: BackendId,
        tenant: &str,
        priority: Priority,
        light: impl Fn(&str, Priority) -> bool,
    ) -> Vec<u64> {
        let contested: Vec<(u64, TenantId)> = (self.flights.lock().iter())
            .filter(|f| f.contested_by(backend, tenant, priority))
            .map(|f| (f.serial, f.tenant.clone()))
            .collect();
        let outranked = contested.into_iter().filter(|(_, t)| !light(t, priority));
        outranked.map(|(serial, _)| serial).collect()
    }

    /// Whether a request with no answer yet at a priority below `priority` is in flight
    /// on `on` (`None`: any backend): whether [`Self::displace`] would stop one.
    pub fn any_below(&self, priority: Priority, on: Option<BackendId>) -> bool {
        self.flights.lock().iter().any(|f| f.below(priority, on))
    }

    /// How many requests on `backend` a request of `tenant` at `priority` outranks now
    /// (what [`Self::preempt`] would stop), stopping none.
    pub fn outranked(
        &self,
        backend: BackendId,
        tenant: &str,
        priority: Priority,
        light: impl Fn(&str, Priority) -> bool,
    ) -> usize {
        (self.outranked_serials(backend, tenant, priority, light)).len()
    }
}

/// Calls each of `flights`' stops with `why`, in order; how many.
fn stop_all(flights: Vec<Flight>, why: Stopped) -> usize {
    flights.iter().for_each(|f| (f.stop)(why));
    flights.len()
}

impl Flight {
    /// Whether it is below `priority`, on `on` (`None`: any backend).
    fn below(&self, priority: Priority, on: Option<BackendId>) -> bool {
        self.priority < priority && on.is_none_or(|b| b == self.backend)
    }

    /// Whether a request of `tenant` at `priority` on `backend` contests this one: it is
    /// there, at the same priority, of another tenant. It outranks it when this one's
    /// tenant is at or over its share.
    fn contested_by(&self, backend: BackendId, tenant: &str, priority: Priority) -> bool {
        self.backend == backend && self.priority == priority && *self.tenant != *tenant
    }
}

/// A registered request; unregistered when dropped.
#[derive(Debug)]
pub struct Stoppable<'p> {
    preemptions: &'p Preemptions,
    serial: u64,
}

impl Drop for Stoppable<'_> {
    fn drop(&mut self) {
        let mut flights = self.preemptions.flights.lock();
        if let Some(i) = flights.iter().position(|f| f.serial == self.serial) {
            flights.swap_remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    use super::*;

    /// A stop that counts its calls.
    fn counted() -> (Arc<AtomicUsize>, Stop) {
        let calls = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&calls);
        (calls, Box::new(move |_| _ = count.fetch_add(1, Relaxed)))
    }

    /// Registers a request, with the count of its stops.
    fn enter<'p>(
        preemptions: &'p Preemptions,
        backend: BackendId,
        priority: Priority,
        tenant: &str,
    ) -> (Stoppable<'p>, Arc<AtomicUsize>) {
        let (calls, stop) = counted();
        let tenant = TenantId::new(tenant);
        (preemptions.enter(backend, &tenant, priority, stop), calls)
    }

    fn stops(calls: &AtomicUsize) -> usize {
        calls.load(Relaxed)
    }

    #[test]
    fn a_request_stops_only_those_it_outranks_on_its_backend_once() {
        // b is below its fair share, a over it.
        let is_light = |tenant: &str, _: Priority| tenant == "b";
        let preemptions = Preemptions::default();
        let (one, two) = (BackendId(1), BackendId(2));
        let (_heavy, heavy) = enter(&preemptions, one, Priority::Normal, "a");
        let (_elsewhere, elsewhere) = enter(&preemptions, two, Priority::Normal, "a");
        let (light_guard, light) = enter(&preemptions, one, Priority::Normal, "b");
        let (low_guard, low) = enter(&preemptions, one, Priority::Low, "a");
        assert_eq!(preemptions.preempt(one, "b", Priority::Normal, is_light), 1);
        assert_eq!(stops(&heavy), 1);
        assert_eq!(
            preemptions.preempt(one, "b", Priority::Normal, is_light),
            0,
            "each once; b's own, another priority's, and another backend's stay"
        );
        assert_eq!(
            preemptions.preempt(one, "b", Priority::High, is_light),
            0,
            "a higher priority stops no lower one"
        );
        assert_eq!(preemptions.preempt(two, "a", Priority::Normal, is_light), 0);
        assert_eq!(preemptions.preempt(two, "b", Priority::Normal, is_light), 1);
        assert_eq!((stops(&heavy), stops(&elsewhere)), (1, 1));
        assert_eq!((stops(&light), stops(&low)), (0, 0));
        drop((light_guard, low_guard));
        assert!(preemptions.flights.lock().is_empty());
    }

    #[test]
    fn displacing_stops_the_last_placed_of_the_lowest_priority_there_or_anywhere() {
        let preemptions = Preemptions::default();
        let (one, two, three) = (BackendId(1), BackendId(2), BackendId(3));
        let (_first, first_low) = enter(&preemptions, one, Priority::Low, "a");
        let (_normal, normal) = enter(&preemptions, one, Priority::Normal, "a");
        let (_last, last_low) = enter(&preemptions, two, Priority::Low, "a");
        assert!(
            !preemptions.displace(Priority::Low, None),
            "nothing is below low"
        );
        assert!(!preemptions.any_below(Priority::Low, None));
        assert!(preemptions.any_below(Priority::Normal, Some(one)));
        assert!(!preemptions.any_below(Priority::Normal, Some(three)));
        assert!(
            !preemptions.displace(Priority::High, Some(three)),
            "none on three"
        );
        // On one backend: the lowest there, although a later one is elsewhere.
        assert!(preemptions.displace(Priority::High, Some(one)));
        assert_eq!((stops(&first_low), stops(&last_low)), (1, 0));
        assert!(preemptions.displace(Priority::High, None));
        assert_eq!(stops(&last_low), 1);
        assert!(
            !preemptions.displace(Priority::Normal, None),
            "normal displaces no normal"
        );
        assert!(preemptions.displace(Priority::High, None));
        assert_eq!(stops(&normal), 1);
        assert!(preemptions.flights.lock().is_empty());
    }

    #[test]
    fn taking_back_stops_the_last_placed_on_a_backend_whatever_their_priority() {
        let preemptions = Preemptions::default();
        let (one, two) = (BackendId(1), BackendId(2));
        let (_first, first) = enter(&preemptions, one, Priority::Low, "a");
        let (_second, second) = enter(&preemptions, one, Priority::High, "b");
        let (_elsewhere, elsewhere) = enter(&preemptions, two, Priority::Low, "a");
        let (_third, third) = enter(&preemptions, one, Priority::Normal, "a");
        assert_eq!(preemptions.take_back(one, 0), 0);
        assert_eq!(preemptions.take_back(one, 2), 2);
        assert_eq!((stops(&first), stops(&second), stops(&third)), (0, 1, 1));
        assert_eq!(preemptions.take_back(one, 5), 1, "only one is left there");
        assert_eq!((stops(&first), stops(&elsewhere)), (1, 0));
        assert_eq!(preemptions.take_back(one, 1), 0, "each once");
    }
}
