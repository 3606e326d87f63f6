//! Preemption before the first byte. A request the reserve is kept for stops requests
//! it outranks that have no answer yet ([`Preemptions::stop`]): their connections close
//! (the engine aborts them, their slot and prefill compute free) and they go back to the
//! router's queue, to be placed again, by the policy, when a slot opens. Their clients
//! see only the delay, or, if the queue is full, 503 `overloaded` with `Retry-After` and
//! nothing sent: nothing accepted is lost. A request is stopped at most once for another
//! ([`Stopped::Outranked`]), besides being taken back once from an engine's queue
//! ([`Stopped::TakenBack`]).
//!
//! It stops them for one of two needs ([`Victims`]):
//! - **Prefill.** Engines split their prefill compute among the requests prefilling at
//!   once, so a light tenant's request placed beside a heavy tenant's fresh ones
//!   prefills at a fraction of the speed it would alone, however many slots the reserve
//!   kept for it. Where it is placed (or, waiting, where it would go), it stops every
//!   request of its own priority there whose tenant is at or over its fair share. Not a
//!   lower priority's: where engines are bound by sequences, the work those do again
//!   and the cache they churn cost `high` more than sharing the prefill does.
//! - **A slot.** For want of one it stops the last placed request of the lowest priority
//!   below its own: on any backend when the queue is full of requests it may not shed
//!   (rather than be shed itself), or when it would wait in the queue
//!   ([`super::home`]); at its conversation's home when that is full, taking the slot,
//!   rather than move and compute its context again elsewhere.
//!
//! Only with a tenants file: the table holds the requests in flight that have not
//! answered yet, each until its first response byte. Whether a tenant is at or over its
//! fair share is asked of the caller (a function, so that this table knows nothing of
//! shares), outside the table's lock, and stops are called once a request is out of the
//! table and the lock released.

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

/// A request that may stop those it outranks: its tenant and priority.
#[derive(Clone, Copy, Debug)]
pub struct Claimant<'a> {
    /// Its tenant.
    pub tenant: &'a str,
    /// Its priority.
    pub priority: Priority,
}

/// Which of the requests with no answer yet that a request outranks it stops, for which
/// need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Victims {
    /// On this backend, where it is placed (or would go), every request of its priority
    /// of another tenant at or over its fair share: they share its prefill.
    Sharing(BackendId),
    /// The last placed request of the lowest priority below its own, on this backend
    /// (`None`: any): for the slot it frees.
    Below(Option<BackendId>),
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

    /// Stops the `victims` a request `by` outranks; how many. Whether a tenant at a
    /// priority is below its fair share is asked of `light`, with the table's lock
    /// released.
    pub fn stop(
        &self,
        by: Claimant,
        victims: Victims,
        light: impl Fn(&str, Priority) -> bool,
    ) -> usize {
        let stopped = match victims {
            Victims::Sharing(backend) => {
                let sharing = self.sharing(backend, by, light);
                self.remove(|f| sharing.contains(&f.serial))
            }
            Victims::Below(on) => {
                let mut flights = self.flights.lock();
                let newest = lowest_below(&flights, by.priority, on);
                newest.map(|i| flights.swap_remove(i)).into_iter().collect()
            }
        };
        stop_all(stopped, Stopped::Outranked)
    }

    /// How many requests [`Self::stop`] would stop now, stopping none.
    pub fn outranked(
        &self,
        by: Claimant,
        victims: Victims,
        light: impl Fn(&str, Priority) -> bool,
    ) -> usize {
        match victims {
            Victims::Sharing(backend) => self.sharing(backend, by, light).len(),
            Victims::Below(on) => {
                usize::from(lowest_below(&self.flights.lock(), by.priority, on).is_some())
            }
        }
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

    /// The serials of the requests on `backend` that `by` stops as [`Victims::Sharing`];
    /// `light` is asked with the table's lock released.
    fn sharing(
        &self,
        backend: BackendId,
        by: Claimant,
        light: impl Fn(&str, Priority) -> bool,
    ) -> Vec<u64> {
        let contested: Vec<(u64, TenantId)> = (self.flights.lock().iter())
            .filter(|f| f.contested_by(backend, by))
            .map(|f| (f.serial, f.tenant.clone()))
            .collect();
        let outranked = contested
            .into_iter()
            .filter(|(_, t)| !light(t, by.priority));
        outranked.map(|(serial, _)| serial).collect()
    }
}

/// The position among `flights` of the last placed at the lowest priority below
/// `priority`, on `on` (`None`: any backend).
fn lowest_below(flights: &[Flight], priority: Priority, on: Option<BackendId>) -> Option<usize> {
    (flights.iter().enumerate())
        .filter(|(_, f)| f.below(priority, on))
        .min_by_key(|(_, f)| (f.priority, Reverse(f.serial)))
        .map(|(i, _)| i)
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

    /// Whether a request `by` on `backend` contests this one: it is there, at `by`'s
    /// priority, of another tenant. It outranks it when this one's
    /// tenant is at or over its share.
    fn contested_by(&self, backend: BackendId, by: Claimant) -> bool {
        self.backend == backend && self.priority == by.priority && *self.tenant != *by.tenant
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

    /// A claimant of `tenant` at `priority`.
    fn by(tenant: &str, priority: Priority) -> Claimant<'_> {
        Claimant { tenant, priority }
    }

    #[test]
    fn a_request_stops_those_sharing_its_backend_that_it_outranks_once() {
        // b is below its fair share, a over it.
        let is_light = |tenant: &str, _: Priority| tenant == "b";
        let preemptions = Preemptions::default();
        let (one, two) = (BackendId(1), BackendId(2));
        let (_heavy, heavy) = enter(&preemptions, one, Priority::Normal, "a");
        let (_elsewhere, elsewhere) = enter(&preemptions, two, Priority::Normal, "a");
        let (light_guard, light) = enter(&preemptions, one, Priority::Normal, "b");
        let (low_guard, low) = enter(&preemptions, one, Priority::Low, "a");
        let b = by("b", Priority::Normal);
        let sharing = |backend| Victims::Sharing(backend);
        assert_eq!(preemptions.outranked(b, sharing(one), is_light), 1);
        assert_eq!(preemptions.stop(b, sharing(one), is_light), 1);
        assert_eq!(stops(&heavy), 1);
        assert_eq!(
            preemptions.stop(b, sharing(one), is_light),
            0,
            "each once; b's own, another priority's, and another backend's stay"
        );
        let high = by("b", Priority::High);
        assert_eq!(
            preemptions.stop(high, sharing(one), is_light),
            0,
            "a higher priority shares no prefill it stops"
        );
        let a = by("a", Priority::Normal);
        assert_eq!(preemptions.stop(a, sharing(two), is_light), 0);
        assert_eq!(preemptions.stop(b, sharing(two), is_light), 1);
        assert_eq!((stops(&heavy), stops(&elsewhere)), (1, 1));
        assert_eq!((stops(&light), stops(&low)), (0, 0));
        drop((light_guard, low_guard));
        assert!(preemptions.flights.lock().is_empty());
    }

    #[test]
    fn a_request_stops_the_last_placed_of_the_lowest_priority_below_it_there_or_anywhere() {
        let nobody = |_: &str, _: Priority| false;
        let preemptions = Preemptions::default();
        let (one, two, three) = (BackendId(1), BackendId(2), BackendId(3));
        let (_first, first_low) = enter(&preemptions, one, Priority::Low, "a");
        let (_normal, normal) = enter(&preemptions, one, Priority::Normal, "a");
        let (_last, last_low) = enter(&preemptions, two, Priority::Low, "a");
        let below = |on| Victims::Below(on);
        let (low, high) = (by("a", Priority::Low), by("a", Priority::High));
        assert_eq!(
            preemptions.stop(low, below(None), nobody),
            0,
            "nothing is below low"
        );
        assert_eq!(preemptions.outranked(low, below(None), nobody), 0);
        let normal_by = by("a", Priority::Normal);
        assert_eq!(
            preemptions.outranked(normal_by, below(Some(one)), nobody),
            1
        );
        assert_eq!(
            preemptions.outranked(normal_by, below(Some(three)), nobody),
            0
        );
        assert_eq!(
            preemptions.stop(high, below(Some(three)), nobody),
            0,
            "none on three"
        );
        // On one backend: the lowest there, although a later one is elsewhere.
        assert_eq!(preemptions.stop(high, below(Some(one)), nobody), 1);
        assert_eq!((stops(&first_low), stops(&last_low)), (1, 0));
        assert_eq!(preemptions.stop(high, below(None), nobody), 1);
        assert_eq!(stops(&last_low), 1);
        assert_eq!(
            preemptions.stop(normal_by, below(None), nobody),
            0,
            "normal stops no normal"
        );
        assert_eq!(preemptions.stop(high, below(None), nobody), 1);
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
