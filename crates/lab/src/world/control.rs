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
    self, FlowControl, Gate, Key, NO_FLOW_CONTROL, Order, Share, Shares, Stoppable, Stopped, gate,
    order,
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

    /// Places `pending` at once unless it waits ([`Gate::wait`]): no backend is open to it,
    /// or others wait ahead that it may not pass.
    fn admit(&mut self, now: f64, pending: Pending<'w>) {
        let router = &self.routers[0];
        let first = (self.control.as_ref())
            .and_then(|c| c.order.first(seconds(now)))
            .map(|key| key.0.0);
        let wait = self
            .gate(&pending)
            .wait(&router.accounts(), router.limit(), first);
        if wait.is_some() {
            self.join(now, pending);
        } else {
            self.place_flow(now, pending);
        }
    }

    /// `pending` at flow control's gate, as the proxy's `steps::gate` makes it.
    fn gate(&self, pending: &Pending) -> Gate<'_> {
        let (tenant, priority) = self.parties[pending.want.party].identity();
        let control: &dyn FlowControl = match &self.control {
            Some(c) => c.shares,
            None => &NO_FLOW_CONTROL,
        };
        Gate {
            flow: order::QueueTicket {
                priority,
                tenant,
                weight: 1,
                cost: self.prompt_tokens(pending),
            },
            control,
            standing: self.control.as_ref().map_or(0, |c| c.standing),
            arriving: false,
        }
    }

    /// What `pending` may take of a backend now.
    fn cap(&self, pending: &Pending) -> Cap {
        self.gate(pending).cap(self.routers[0].limit())
    }

    /// `pending`'s prompt tokens (its cost in the queue's order).
    fn prompt_tokens(&self, pending: &Pending) -> u64 {
        let want = pending.want;
        let turns = self.parties[want.party].plan.sessions()[want.session].turns();
        turns[want.turn].prompt_tokens()
    }

    /// `pending` waits in the queue: a full one sheds its last waiter of a lower priority
    /// (or of the tenant with the most), or waits past its bound for a lower priority's
    /// request ([`Gate::past_bound`]), or sheds `pending` itself; a waiter the reserve is
    /// kept for makes room.
    fn join(&mut self, now: f64, pending: Pending<'w>) {
        let cost = self.prompt_tokens(&pending);
        let Some(max_queued) = self.control.as_ref().map(|c| c.max_queued) else {
            return;
        };
        let (tenant, priority) = self.parties[pending.want.party].identity();
        let tenant = tenant.clone();
        let ticket = order::QueueTicket {
            priority,
            tenant: &tenant,
            weight: 1,
            cost,
        };
        let promoted = seconds(now + QUEUE_TIMEOUT / 2.0);
        let number = pending.number;
        let joined = match self.queue_join(max_queued, &ticket, promoted, pending) {
            Err(pending) if self.queued() >= max_queued => {
                let bound = self.gate(&pending).past_bound(max_queued);
                self.queue_join(bound, &ticket, promoted, pending)
            }
            joined => joined,
        };
        let Some(control) = self.control.as_mut() else {
            return;
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

    /// `pending` of `ticket` joins the queue within `bound`, promoted at `promoted`.
    fn queue_join(
        &mut self,
        bound: usize,
        ticket: &order::QueueTicket,
        promoted: std::time::Duration,
        pending: Pending<'w>,
    ) -> Result<(Key, Option<flow::Shed<Pending<'w>>>), Pending<'w>> {
        match self.control.as_mut() {
            Some(control) => control.order.join(bound, ticket, promoted, pending),
            None => Err(pending),
        }
    }

    /// Requests waiting in the queue.
    fn queued(&self) -> usize {
        self.control.as_ref().map_or(0, |c| c.order.len())
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
        let gate = self.gate(pending);
        let router = &self.routers[0];
        self.asking(pending.want, |asked| {
            let unbounded = |cap| router.unbounded(asked, cap);
            gate.make_room(&router.accounts(), router.size(asked), unbounded);
        });
    }

    /// Places `pending` now: at its conversation's home if it stays there
    /// ([`Gate::reclaim_home`]), else where the policy chooses under its cap.
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
        let gate = self.gate(pending);
        let router = &self.routers[0];
        let home = self.asking(pending.want, |asked| {
            gate.reclaim_home(&router.accounts(), cap, || router.unbounded(asked, cap))
        });
        home.map_or((None, cap), |(i, cap)| (Some(i), cap))
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
        let backend = self.routers[0].accounts()[placement.backend].id;
        let stopped = Arc::clone(&control.stopped);
        let stop =
            move || -> flow::preempt::Stop { Box::new(move |why| stopped.lock().push((id, why))) };
        let flow = self.gate(&pending).flow;
        let preemptible =
            gate::placed(control.shares, &flow, cap, backend, pending.preempted, stop);
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

    /// After replica `replica`'s read of the engines' load, with flow control: its
    /// steps ([`flow::after_read`]); on the first replica, flow control's, the requests an
    /// engine queues past its hold wait in the router's queue instead, as many as it has
    /// room for.
    pub(super) fn after_read(&self, replica: usize) {
        let Some(control) = &self.control else {
            return;
        };
        let room = control.max_queued.saturating_sub(control.order.len());
        let standing = if replica == 0 { control.standing } else { 0 };
        let accounts = self.routers[replica].accounts();
        let accounts: Vec<_> = accounts.iter().map(|a| &***a).collect();
        flow::after_read(control.shares, &accounts, room, standing);
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
