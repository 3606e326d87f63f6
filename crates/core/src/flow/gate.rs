//! One request's way through flow control, the same for every front end (the proxy, the
//! endpoint picker, the lab): what it may take of a backend ([`Gate::cap`]), whether it
//! waits ([`Gate::wait`]), how far past a full queue's bound it may wait
//! ([`Gate::past_bound`]), the room it makes while it waits ([`Gate::make_room`]), whether
//! it stays at its conversation's home ([`Gate::reclaim_home`]), and what its placement
//! stops and registers ([`Gate::placed`]). The front ends keep only their own waiting and
//! waking. Without a tenants file the gate's [`FlowControl`] is [`NO_FLOW_CONTROL`], which
//! keeps nothing and stops nothing.

use std::sync::Arc;

use super::home::{self, AtHome};
use super::order::QueueTicket;
use super::preempt::{Claimant, Stop, Stoppable, Victims};
use super::{Priority, Share, Shares};
use crate::BackendId;
use crate::ledger::{self, Account, Cap};
use crate::policy::Decision;
use crate::units::TextBytes;

/// The flow control a request is weighed by: a tenants file's [`Shares`], or
/// [`NoFlowControl`].
pub trait FlowControl: Send + Sync {
    /// Counts a request of `ticket`'s tenant at its priority until the share drops;
    /// `None` where nothing is counted.
    fn enter(&self, ticket: &QueueTicket) -> Option<Share<'_>>;

    /// After a read of every one of `accounts`' published load ([`super::after_read`]),
    /// `room` left in the queue, with `standing` slots; how many requests were taken
    /// back to the queue.
    fn after_read(&self, accounts: &[&Account], room: usize, standing: usize) -> usize;

    /// What a request of `ticket`'s tenant at its priority may take under the in-flight
    /// `limit`, leaving `standing` slots; weighed as if counted when `arriving`.
    fn cap(&self, ticket: &QueueTicket, arriving: bool, limit: usize, standing: usize) -> Cap;

    /// Registers a request placed on `backend` as one an outranking request may stop
    /// (`stop` is called when it is), until the guard drops; `None` where nothing stops.
    fn preemptible(
        &self,
        backend: BackendId,
        ticket: &QueueTicket,
        stop: Stop,
    ) -> Option<Stoppable<'_>>;

    /// Stops the `victims` a request of `ticket` outranks ([`Victims`]); how many.
    fn stop(&self, ticket: &QueueTicket, victims: Victims) -> usize;

    /// How many requests [`Self::stop`] would stop now, stopping none.
    fn outranked(&self, ticket: &QueueTicket, victims: Victims) -> usize;

    /// The bound a request of `ticket` may wait past in a queue full at `bound` of
    /// waiters it may not shed ([`Gate::past_bound`]).
    fn past_bound(&self, ticket: &QueueTicket, bound: usize) -> usize;
}

impl FlowControl for Shares {
    fn enter(&self, ticket: &QueueTicket) -> Option<Share<'_>> {
        Some(Shares::enter(
            self,
            ticket.tenant,
            ticket.weight,
            ticket.priority,
        ))
    }

    fn after_read(&self, accounts: &[&Account], room: usize, standing: usize) -> usize {
        super::after_read(self, accounts, room, standing)
    }

    fn cap(&self, ticket: &QueueTicket, arriving: bool, limit: usize, standing: usize) -> Cap {
        let (tenant, priority) = (&**ticket.tenant, ticket.priority);
        match arriving {
            true => self.cap_arriving(tenant, ticket.weight, priority, limit, standing),
            false => Shares::cap(self, tenant, priority, limit, standing),
        }
    }

    fn preemptible(
        &self,
        backend: BackendId,
        ticket: &QueueTicket,
        stop: Stop,
    ) -> Option<Stoppable<'_>> {
        let (tenant, priority) = (ticket.tenant, ticket.priority);
        Some((self.preemptions).enter(backend, tenant, priority, stop))
    }

    fn stop(&self, ticket: &QueueTicket, victims: Victims) -> usize {
        let light = |tenant: &str, priority| self.light(tenant, priority);
        (self.preemptions).stop(claimant(ticket), victims, light)
    }

    fn outranked(&self, ticket: &QueueTicket, victims: Victims) -> usize {
        let light = |tenant: &str, priority| self.light(tenant, priority);
        (self.preemptions).outranked(claimant(ticket), victims, light)
    }

    fn past_bound(&self, ticket: &QueueTicket, bound: usize) -> usize {
        if FlowControl::stop(self, ticket, Victims::Below(None)) > 0 {
            usize::MAX
        } else if ticket.priority == Priority::High {
            bound.saturating_add(self.held_below(ticket.priority))
        } else {
            bound
        }
    }
}

/// A request of `ticket` as the preemption table weighs it.
fn claimant<'t>(ticket: &QueueTicket<'t>) -> Claimant<'t> {
    Claimant {
        tenant: ticket.tenant,
        priority: ticket.priority,
    }
}

/// No flow control (no tenants file): every request takes what the in-flight limit
/// allows, no reserve is kept, nothing is stopped, and a full queue's bound is its bound.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoFlowControl;

/// The flow control of a router without a tenants file.
pub static NO_FLOW_CONTROL: NoFlowControl = NoFlowControl;

impl FlowControl for NoFlowControl {
    fn enter(&self, _: &QueueTicket) -> Option<Share<'_>> {
        None
    }

    fn after_read(&self, _: &[&Account], _: usize, _: usize) -> usize {
        0
    }

    fn cap(&self, _: &QueueTicket, _: bool, limit: usize, _: usize) -> Cap {
        Cap::from(limit)
    }

    fn preemptible(&self, _: BackendId, _: &QueueTicket, _: Stop) -> Option<Stoppable<'_>> {
        None
    }

    fn stop(&self, _: &QueueTicket, _: Victims) -> usize {
        0
    }

    fn outranked(&self, _: &QueueTicket, _: Victims) -> usize {
        0
    }

    fn past_bound(&self, _: &QueueTicket, bound: usize) -> usize {
        bound
    }
}

/// Why a request would wait before it is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// No backend is open for it (each at its in-flight limit or hold, or its free slots
    /// kept in reserve for others).
    Full,
    /// Requests wait ahead of it in the queue.
    Behind,
}

impl Wait {
    /// Its name in `POST /route`.
    pub fn label(self) -> &'static str {
        match self {
            Wait::Full => "full",
            Wait::Behind => "behind",
        }
    }
}

/// A request at flow control's gate: where it stands in the queue's order and among the
/// flows.
#[derive(Clone, Copy)]
pub struct Gate<'t> {
    /// What the queue's order weighs: its priority, tenant, tenant's weight and cost.
    pub flow: QueueTicket<'t>,
    /// The flow control it is weighed by.
    pub control: &'t dyn FlowControl,
    /// Slots of each held backend it leaves free for an arrival (`standing_slots`).
    pub standing: usize,
    /// Not counted in its tenant's share (`POST /route` asks about a request that has
    /// not arrived): weighed as if it were.
    pub arriving: bool,
}

impl Default for Gate<'_> {
    /// A request of no tenant at `normal`, without flow control.
    fn default() -> Self {
        Gate {
            flow: QueueTicket::default(),
            control: &NO_FLOW_CONTROL,
            standing: 0,
            arriving: false,
        }
    }
}

impl std::fmt::Debug for Gate<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("flow", &self.flow).finish()
    }
}

impl<'t> Gate<'t> {
    /// What it may take of a backend under the in-flight `limit` (0: none), as its flow
    /// stands now, its cost as its prompt tokens.
    pub fn cap(&self, limit: usize) -> Cap {
        let cap = (self.control).cap(&self.flow, self.arriving, limit, self.standing);
        Cap {
            tokens: self.flow.cost,
            ..cap
        }
    }

    /// Whether it may pass the waiters, the first of which is at `first` (`None`: none
    /// waits): the reserve is kept for it, and none waiting has a higher priority.
    pub fn passes(&self, first: Option<Priority>) -> bool {
        first.is_none_or(|p| self.cap(0).kept() && p <= self.flow.priority)
    }

    /// Why it would wait before being placed on one of `accounts` under the in-flight
    /// `limit`, the first waiter at `first`; `None` when it goes at once. Nothing waits
    /// without a limit or a learnt hold.
    pub fn wait(
        &self,
        accounts: &[&Arc<Account>],
        limit: usize,
        first: Option<Priority>,
    ) -> Option<Wait> {
        let held = accounts.iter().any(|a| a.hold().is_some());
        if limit == 0 && !held {
            None
        } else if !ledger::open(accounts, self.cap(limit)) {
            Some(Wait::Full)
        } else if !self.passes(first) {
            Some(Wait::Behind)
        } else {
            None
        }
    }

    /// The bound it may wait past in a queue full at `bound` of waiters it may not shed:
    /// none once it stopped the last placed request with no answer yet at the lowest
    /// priority below its own ([`Victims::Below`], which, sent back to the queue, gets
    /// 503); else, for `high`, `bound` plus the requests held below it, all answered, each
    /// freeing a slot it goes to first, so that a burst of `high` is not shed while the
    /// floods below it run. Not for `normal` against `low`: the `normal` requests that
    /// waited so took the slots `high` arrived at. Without flow control, `bound`.
    pub fn past_bound(&self, bound: usize) -> usize {
        self.control.past_bound(&self.flow, bound)
    }

    /// Whether a lower priority's request with no answer yet is in flight on `on`
    /// (`None`: any backend).
    pub fn outranks_any(&self, on: Option<BackendId>) -> bool {
        self.control.outranked(&self.flow, Victims::Below(on)) > 0
    }

    /// How many requests its placement on `backend` under `cap` would stop now.
    pub fn outranked(&self, cap: Cap, backend: BackendId) -> usize {
        match cap.kept() {
            true => (self.control).outranked(&self.flow, Victims::Sharing(backend)),
            false => 0,
        }
    }

    /// While it waits, a request the reserve is kept for makes room where it would go
    /// ([`home::make_room`]); `unbounded` is where the policy would place it if every one
    /// of `accounts` had room, `size` its routing text.
    pub fn make_room(
        &self,
        accounts: &[&Arc<Account>],
        size: TextBytes,
        unbounded: impl FnOnce(Cap) -> Option<(usize, Decision)>,
    ) {
        let cap = self.cap(0);
        let stop = |victims| self.control.stop(&self.flow, victims);
        home::make_room(cap, accounts, size, || unbounded(cap), stop);
    }

    /// Where a request the reserve is kept for, under `cap`, stays at its conversation's
    /// home among `accounts` that is not open to it ([`home::at_home`]): the home's
    /// position and the cap that lets it in (one slot over, having stopped a lower
    /// priority there; or past the ceiling); `None` to place it as the policy says.
    pub fn reclaim_home(
        &self,
        accounts: &[&Arc<Account>],
        cap: Cap,
        unbounded: impl FnOnce() -> Option<(usize, Decision)>,
    ) -> Option<(usize, Cap)> {
        match self.at_home(accounts, cap, unbounded)? {
            AtHome::Stop(i) => {
                let home = accounts.get(i)?.id;
                let stopped = self.control.stop(&self.flow, Victims::Below(Some(home)));
                (stopped > 0).then_some((i, Cap { over: 1, ..cap }))
            }
            AtHome::PastCeiling(i) => Some((i, cap.at_home())),
        }
    }

    /// How it would stay home ([`home::at_home`]), without stopping anything.
    pub fn at_home(
        &self,
        accounts: &[&Arc<Account>],
        cap: Cap,
        unbounded: impl FnOnce() -> Option<(usize, Decision)>,
    ) -> Option<AtHome> {
        home::at_home(cap, accounts, |on| self.outranks_any(on), unbounded)
    }

    /// Placed on `backend` under `cap`: a request the reserve is kept for stops those
    /// there it outranks that have no answer yet; another is registered as one such a
    /// request may stop until its answer (`stop` is called when it is), unless it was
    /// stopped so `once` already.
    pub fn placed(
        &self,
        cap: Cap,
        backend: BackendId,
        once: bool,
        stop: impl FnOnce() -> Stop,
    ) -> Option<Stoppable<'t>> {
        placed(self.control, &self.flow, cap, backend, once, stop)
    }
}

/// [`Gate::placed`] for a request of `flow` weighed by `control`, where the registration
/// must outlive the ticket (the lab's).
pub fn placed<'c>(
    control: &'c dyn FlowControl,
    flow: &QueueTicket,
    cap: Cap,
    backend: BackendId,
    once: bool,
    stop: impl FnOnce() -> Stop,
) -> Option<Stoppable<'c>> {
    if cap.kept() {
        control.stop(flow, Victims::Sharing(backend));
        return None;
    }
    (!once).then(|| control.preemptible(backend, flow, stop()))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::TenantId;
    use crate::ledger::Claim;
    use crate::units::Tokens;

    #[test]
    fn without_flow_control_a_request_takes_its_limit_and_stops_nothing() {
        let gate = Gate::default();
        let cap = gate.cap(3);
        assert_eq!(
            (cap.limit, cap.claim, cap.tokens),
            (3, Claim::default(), Tokens(1)),
            "its cost"
        );
        assert!(gate.passes(None) && !gate.passes(Some(Priority::Low)));
        assert_eq!(gate.past_bound(7), 7);
        let stop = || -> Stop { Box::new(|_| panic!("nothing is stopped")) };
        assert!(
            gate.placed(gate.cap(0), BackendId(0), false, stop)
                .is_none()
        );
        let accounts = [Arc::new(Account::new(BackendId(0), 0))];
        let refs: Vec<_> = accounts.iter().collect();
        assert_eq!(
            gate.wait(&refs, 0, None),
            None,
            "no limit, no hold: never waits"
        );
    }

    #[test]
    fn with_shares_a_light_request_stops_an_outranked_one_where_it_is_placed() {
        let shares = Shares::default();
        let (a, b) = (TenantId::new("a"), TenantId::new("b"));
        let _heavy: Vec<_> = (0..6)
            .map(|_| shares.enter(&a, 1, Priority::Normal))
            .collect();
        let _light = shares.enter(&b, 1, Priority::Normal);
        let gate = |tenant| Gate {
            flow: QueueTicket {
                tenant,
                ..QueueTicket::default()
            },
            control: &shares,
            standing: 0,
            arriving: false,
        };
        let stopped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&stopped);
        let stop = move || -> Stop {
            Box::new(move |_| {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            })
        };
        let (heavy, light) = (gate(&a), gate(&b));
        let registered = heavy.placed(heavy.cap(0), BackendId(1), false, stop.clone());
        assert!(registered.is_some(), "a heavy request may be stopped");
        assert!(
            heavy
                .placed(heavy.cap(0), BackendId(1), true, stop)
                .is_none(),
            "but once"
        );
        assert!(light.cap(0).kept());
        assert!(
            light
                .placed(light.cap(0), BackendId(1), false, || unreachable!())
                .is_none()
        );
        assert_eq!(stopped.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}
