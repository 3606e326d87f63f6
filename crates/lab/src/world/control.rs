//! Flow control in the lab, with a tenants file naming every flow's tenant at weight 1:
//! the proxy's dispatch (`crates/router/src/proxy/dispatch.rs`) over the core's flow
//! bookkeeping ([`prefix_router_core::flow`]), in virtual time and on the first router
//! replica. A request counts in its flow's share from its arrival to its end; it waits in
//! the router's queue while no backend is open to it under its cap, or while others wait
//! ahead of it that it may not pass; a full queue sheds (503), as does a wait past the
//! router's default `queue_timeout`; a request the reserve is kept for stays at its
//! conversation's home, stops the requests it outranks where it is placed, and makes room
//! while it waits; a stopped request leaves its engine and is admitted again; after each
//! read of the engines' load, what an engine queues past its hold is taken back. Where
//! the proxy wakes a waiter on a freed slot, the lab looks at the queue after every event.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use prefix_router_core::flow::{
    self, AtHome, Key, Order, Share, Shares, Stoppable, Stopped, order,
};
use prefix_router_core::ledger::Cap;

use super::{Flowing, Placement, Want, World, seconds};
use crate::scenario::Flows;

/// The router's default `queue_timeout`, seconds.
const QUEUE_TIMEOUT: f64 = 30.0;

/// The router's flow control.
pub(super) struct LabControl<'w> {
    shares: &'w Shares,
    order: Order<Pending<'w>>,
    max_queued: usize,
    /// Slots of each held backend left free for an arrival (`standing_slots`).
    standing: usize,
    /// Placed requests stopped (their numbers at the engines, and why), not yet taken off.
    stopped: Arc<Mutex<Vec<(u64, Stopped)>>>,
    /// Each waiting request's place in the order, by its number.
    waiting: HashMap<u64, Key>,
    next: u64,
}

/// A request between its arrival and its placement.
pub(super) struct Pending<'w> {
    number: u64,
    want: Want,
    /// When its client sent it.
    sent: f64,
    share: Share<'w>,
    /// Whether it was stopped for a request outranking it (it is not stopped so again).
    preempted: bool,
}

impl<'w> LabControl<'w> {
    /// Flow control over `shares`, with the queue bound and standing slots of `flows`.
    pub(super) fn new(shares: &'w Shares, flows: &Flows) -> Self {
        LabControl {
            shares,
            order: Order::default(),
            max_queued: flows.max_queued,
            standing: flows.standing_slots,
            stopped: Arc::default(),
            waiting: HashMap::new(),
            next: 0,
        }
    }
}

impl<'w> World<'w> {
    /// A client sent `want` at `now`: it counts in its flow's share and is admitted.
    pub(super) fn arrive(&mut self, now: f64, want: Want) {
        let Some(control) = self.control.as_mut() else {
            return;
        };
        let (tenant, priority) = self.parties[want.party].identity();
        control.next += 1;
        let pending = Pending {
            number: control.next,
            want,
            sent: now,
            share: control.shares.enter(tenant, 1, priority),
            preempted: false,
        };
        self.admit(now, pending);
    }

    /// Places `pending` at once if a backend is open to it and none waits ahead that it
    /// may not pass (`dispatch::wait`), else it waits in the queue.
    fn admit(&mut self, now: f64, pending: Pending<'w>) {
        let cap = self.cap(&pending);
        let router = &self.routers[0];
        let held = router.limit() > 0 || router.holds();
        let waits = held && (!router.open(cap) || !self.passes(now, &pending));
        if waits {
            self.join(now, pending);
        } else {
            self.place_flow(now, pending);
        }
    }

    /// What `pending` may take of a backend now (`Ticket::cap`).
    fn cap(&self, pending: &Pending) -> Cap {
        let (tenant, priority) = self.parties[pending.want.party].identity();
        let limit = self.routers[0].limit();
        match &self.control {
            Some(c) => Cap {
                tokens: usize::try_from(self.prompt_tokens(pending)).unwrap_or(usize::MAX),
                ..c.shares.cap(tenant, priority, limit, c.standing)
            },
            None => Cap::from(limit),
        }
    }

    /// `pending`'s prompt tokens (its cost in the queue's order).
    fn prompt_tokens(&self, pending: &Pending) -> u64 {
        let want = pending.want;
        let turns = self.parties[want.party].plan.sessions()[want.session].turns();
        turns[want.turn].prompt_tokens()
    }

    /// Whether `pending` goes ahead of the waiters (`Ticket::passes`): none waits, or the
    /// reserve is kept for it and none waiting first is of a higher priority.
    fn passes(&self, now: f64, pending: &Pending) -> bool {
        let Some(control) = &self.control else {
            return true;
        };
        let Some(first) = control.order.first(seconds(now)) else {
            return true;
        };
        let priority = self.parties[pending.want.party].identity().1;
        self.cap(pending).kept() && first.0.0 <= priority
    }

    /// `pending` waits in the queue: a full one sheds its last waiter of a lower priority
    /// (or of the tenant with the most), or waits past its bound for a lower priority's
    /// request (`Shares::past_bound`, as `dispatch::displaced`), or sheds `pending`
    /// itself; a waiter the reserve is kept for makes room.
    fn join(&mut self, now: f64, pending: Pending<'w>) {
        let cost = self.prompt_tokens(&pending);
        let Some(control) = self.control.as_mut() else {
            return;
        };
        let (tenant, priority) = self.parties[pending.want.party].identity();
        let ticket = order::QueueTicket {
            priority,
            tenant,
            weight: 1,
            cost,
        };
        let promoted = seconds(now + QUEUE_TIMEOUT / 2.0);
        let number = pending.number;
        let joined = match control
            .order
            .join(control.max_queued, &ticket, promoted, pending)
        {
            Err(pending) if control.order.len() >= control.max_queued => {
                let bound = control.shares.past_bound(priority, control.max_queued);
                control.order.join(bound, &ticket, promoted, pending)
            }
            joined => joined,
        };
        match joined {
            Ok((key, shed)) => {
                control.waiting.insert(number, key);
                self.at(
                    now + QUEUE_TIMEOUT,
                    super::Event::Expire { pending: number },
                );
                if let Some(flow::Shed(last)) = shed {
                    self.shed(now, last);
                }
                self.make_room(number);
            }
            Err(pending) => self.shed(now, pending),
        }
    }

    /// A waiter the reserve is kept for stops a lower priority's request, and the requests
    /// it outranks where it would go.
    fn make_room(&self, number: u64) {
        let Some(control) = &self.control else {
            return;
        };
        let Some(pending) = (control.waiting.get(&number)).and_then(|&k| control.order.get(k))
        else {
            return;
        };
        let (tenant, priority) = self.parties[pending.want.party].identity();
        let cap = control.shares.cap(tenant, priority, 0, 0);
        if !cap.kept() {
            return;
        }
        let router = &self.routers[0];
        let shares = control.shares;
        let preempt = |backend| shares.preempt(backend, tenant, priority);
        let displace = || shares.displace(priority, None);
        self.asking(pending.want, |asked| {
            let unbounded = || router.unbounded(asked, cap);
            let size = router.size(asked);
            flow::make_room(cap, &router.accounts(), size, unbounded, preempt, displace);
        });
    }

    /// Places `pending` now: at its conversation's home if it stays there
    /// (`dispatch::reclaim_home`), else where the policy chooses under its cap.
    fn place_flow(&mut self, now: f64, pending: Pending<'w>) {
        let cap = self.cap(&pending);
        let (only, cap) = self.reclaim_home(&pending, cap);
        let (want, sent) = (pending.want, pending.sent);
        let flowing = Flowing {
            cap: Some(cap),
            only,
            pending: Some(pending),
        };
        self.dispatch(now, want, sent, 0, flowing);
    }

    /// Where a request the reserve is kept for stays home, and under what cap.
    fn reclaim_home(&self, pending: &Pending, cap: Cap) -> (Option<usize>, Cap) {
        let Some(control) = &self.control else {
            return (None, cap);
        };
        let (_, priority) = self.parties[pending.want.party].identity();
        let router = &self.routers[0];
        let accounts = router.accounts();
        let shares = control.shares;
        let outranks = |on| shares.any_below(priority, on);
        let at = self.asking(pending.want, |asked| {
            flow::at_home(cap, &accounts, outranks, || router.unbounded(asked, cap))
        });
        match at {
            Some(AtHome::Stop(i)) if shares.displace(priority, Some(accounts[i].id)) => {
                (Some(i), Cap { over: 1, ..cap })
            }
            Some(AtHome::PastCeiling(i)) => (Some(i), cap.at_home()),
            _ => (None, cap),
        }
    }

    /// Flow control's part of a placement on `placement`'s backend under `cap`, as the
    /// engine gets request `id`: a request the reserve is kept for stops those there it
    /// outranks; another, unless stopped once, may be stopped until its answer.
    pub(super) fn flow_placed(
        &mut self,
        pending: Pending<'w>,
        placement: Option<&Placement>,
        cap: Cap,
        id: u64,
    ) -> (Option<Share<'w>>, Option<Stoppable<'w>>) {
        let (Some(control), Some(placement)) = (&self.control, placement) else {
            return (Some(pending.share), None);
        };
        let (tenant, priority) = self.parties[pending.want.party].identity();
        let backend = self.routers[0].accounts()[placement.backend].id;
        let shares = control.shares;
        if cap.kept() {
            shares.preempt(backend, tenant, priority);
        }
        let stopped = Arc::clone(&control.stopped);
        let stop = Box::new(move |why| stopped.lock().push((id, why)));
        let preemptible = (!pending.preempted && !cap.kept())
            .then(|| shares.preemptible(backend, tenant, priority, stop));
        (Some(pending.share), preemptible)
    }

    /// No backend was open to a request when placed on `replica` (a request the reserve
    /// is kept for took the slot): with flow control (`pending`) it waits again; without,
    /// the router's 503.
    pub(super) fn unplaced(
        &mut self,
        now: f64,
        (want, sent, replica): (Want, f64, usize),
        pending: Option<Pending<'w>>,
    ) {
        match pending {
            Some(pending) => self.join(now, pending),
            None => self.refused(now, sent, want, None, replica, 503),
        }
    }

    /// After a read of the engines' load, with standing slots: the requests an engine
    /// queues past its hold wait in the router's queue instead, as many as it has room
    /// for (`flow::take_back`).
    pub(super) fn take_back(&self) {
        let Some(control) = &self.control else {
            return;
        };
        let room = control.max_queued.saturating_sub(control.order.len());
        let accounts = self.routers[0].accounts();
        let accounts = accounts.iter().map(|a| &***a);
        flow::take_back(control.shares, accounts, room, control.standing);
    }

    /// Takes the stopped requests off their engines and admits them again, and places the
    /// waiters first in order while a backend is open to them, until neither changes.
    pub(super) fn settle(&mut self, now: f64) {
        loop {
            let Some(control) = &self.control else {
                return;
            };
            let stopped = std::mem::take(&mut *control.stopped.lock());
            let stopping = !stopped.is_empty();
            for (id, why) in stopped {
                self.stop(now, id, why);
            }
            if !self.place_waiters(now) && !stopping {
                return;
            }
        }
    }

    /// Request `id` was stopped before its answer: its engine aborts it, its seat frees,
    /// and it is admitted again as it was sent.
    fn stop(&mut self, now: f64, id: u64, why: Stopped) {
        let Some(mut live) = self.live.remove(&id) else {
            return;
        };
        let (Some(placement), Some(share)) = (live.placement.take(), live.share.take()) else {
            return;
        };
        let engine = &mut self.engines[placement.backend];
        engine.advance(now);
        engine.abort(id);
        drop(placement);
        self.parties[live.want.party].preempted += 1;
        let Some(control) = self.control.as_mut() else {
            return;
        };
        control.next += 1;
        let pending = Pending {
            number: control.next,
            want: live.want,
            sent: live.sent,
            share,
            preempted: why == Stopped::Outranked,
        };
        self.admit(now, pending);
    }

    /// Places the waiters first in order while a backend is open to them; whether any.
    fn place_waiters(&mut self, now: f64) -> bool {
        let mut placed = false;
        loop {
            let Some(control) = &self.control else {
                return placed;
            };
            let Some(key) = control.order.first(seconds(now)) else {
                return placed;
            };
            let Some(pending) = control.order.get(key) else {
                return placed;
            };
            if !self.routers[0].open(self.cap(pending)) {
                return placed;
            }
            let Some(control) = self.control.as_mut() else {
                return placed;
            };
            let Some(pending) = control.order.leave(key, seconds(now)) else {
                return placed;
            };
            control.waiting.remove(&pending.number);
            self.place_flow(now, pending);
            placed = true;
        }
    }

    /// The request waiting as `number` waited its longest: 503, if it still waits.
    pub(super) fn expire(&mut self, now: f64, number: u64) {
        let Some(control) = self.control.as_mut() else {
            return;
        };
        let Some(key) = control.waiting.remove(&number) else {
            return;
        };
        if let Some(pending) = control.order.leave(key, seconds(now)) {
            self.shed(now, pending);
        }
    }

    /// The router answers `pending` 503 (`overloaded`) without placing it.
    fn shed(&mut self, now: f64, pending: Pending<'w>) {
        if let Some(control) = self.control.as_mut() {
            control.waiting.remove(&pending.number);
        }
        let (want, sent) = (pending.want, pending.sent);
        drop(pending);
        self.refused(now, sent, want, None, 0, 503);
    }
}
