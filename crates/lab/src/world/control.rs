//! Each router replica's admission in the lab, as the proxy's dispatch
//! (`crates/router/src/proxy/dispatch.rs`) runs it: every decision is core's
//! [`Gate`]'s, in virtual time. A request counts in its flow's share (with a tenants file)
//! from its arrival to its end; it waits in the replica's queue while no backend is open
//! to it under its cap, or while others wait ahead of it that it may not pass; a full
//! queue sheds (503), as does a wait past the router's default `queue_timeout`, with or
//! without a tenants file; a request the reserve is kept for stays at its conversation's
//! home, stops the requests it outranks where it is placed, and makes room while it
//! waits; a stopped request leaves its engine and is admitted again; after each read of
//! the engines' load, flow control's steps run ([`flow::after_read`]). Where the proxy
//! wakes a waiter on a freed slot, the lab looks at the queues after every event.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use prefix_router_core::flow::{
    self, FlowControl, Gate, Key, Order, Share, Stoppable, Stopped, gate, order,
};
use prefix_router_core::ledger::Cap;
use prefix_router_core::units::Tokens;

use super::{Flowing, Placement, Want, World, seconds};
use crate::scenario::Flows;

/// The router's default `queue_timeout`, seconds.
const QUEUE_TIMEOUT: f64 = 30.0;

/// The router's default `max_queued`.
const MAX_QUEUED: usize = 1024;

/// One router replica's admission.
pub(super) struct LabControl<'w> {
    /// Its flow control: the tenants' shares, or none without a tenants file.
    flow: &'w dyn FlowControl,
    order: Order<Pending<'w>>,
    max_queued: usize,
    /// Slots of each held backend left free for an arrival (`standing_slots`).
    standing: usize,
    /// Placed requests stopped (their numbers at the engines, and why), not yet taken off.
    stopped: Arc<Mutex<Vec<(u64, Stopped)>>>,
    /// Each waiting request's place in the order, by its number.
    waiting: HashMap<u64, Key>,
}

/// A request between its arrival and its placement.
pub(super) struct Pending<'w> {
    number: u64,
    want: Want,
    /// When its client sent it.
    sent: f64,
    /// The router replica it was sent to.
    replica: usize,
    share: Option<Share<'w>>,
    /// Whether it was stopped for a request outranking it (it is not stopped so again).
    preempted: bool,
}

impl<'w> LabControl<'w> {
    /// Admission under `flow`, with the queue bound and standing slots of `flows` (with a
    /// tenants file), else the router's defaults.
    pub(super) fn new(flow: &'w dyn FlowControl, flows: Option<&Flows>) -> Self {
        LabControl {
            flow,
            order: Order::default(),
            max_queued: flows.map_or(MAX_QUEUED, |f| f.max_queued),
            standing: flows.map_or(0, |f| f.standing_slots),
            stopped: Arc::default(),
            waiting: HashMap::new(),
        }
    }
}

impl<'w> World<'w> {
    /// A client sent `want` at `now` to the next router replica in turn: it counts in its
    /// flow's share and is admitted.
    pub(super) fn arrive(&mut self, now: f64, want: Want) {
        let replica = self.next_replica;
        self.next_replica = (replica + 1) % self.routers.len();
        let pending = self.pending(want, now, replica, None, false);
        self.admit(now, pending);
    }

    /// A new pending request, counted in its flow's `share` (a new count if none).
    fn pending(
        &mut self,
        want: Want,
        sent: f64,
        replica: usize,
        share: Option<Share<'w>>,
        preempted: bool,
    ) -> Pending<'w> {
        self.pending_serial += 1;
        let (tenant, priority) = self.parties[want.party].identity();
        let ticket = order::QueueTicket {
            priority,
            tenant,
            weight: 1,
            cost: Tokens(0),
        };
        let flow = self.control[replica].flow;
        Pending {
            number: self.pending_serial,
            want,
            sent,
            replica,
            share: share.or_else(|| flow.enter(&ticket)),
            preempted,
        }
    }

    /// Places `pending` at once unless it waits ([`Gate::wait`]): no backend is open to it,
    /// or others wait ahead that it may not pass.
    fn admit(&mut self, now: f64, pending: Pending<'w>) {
        let router = &self.routers[pending.replica];
        let first = (self.control[pending.replica].order.first(seconds(now))).map(|key| key.0.0);
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
        let control = &self.control[pending.replica];
        Gate {
            flow: order::QueueTicket {
                priority,
                tenant,
                weight: 1,
                cost: self.prompt_tokens(pending),
            },
            control: control.flow,
            standing: control.standing,
            arriving: false,
        }
    }

    /// What `pending` may take of a backend now.
    fn cap(&self, pending: &Pending) -> Cap {
        self.gate(pending)
            .cap(self.routers[pending.replica].limit())
    }

    /// `pending`'s prompt tokens (its cost in the queue's order).
    fn prompt_tokens(&self, pending: &Pending) -> Tokens {
        let want = pending.want;
        let turns = self.parties[want.party].plan.sessions()[want.session].turns();
        Tokens(usize::try_from(turns[want.turn].prompt_tokens()).unwrap_or(usize::MAX))
    }

    /// `pending` waits in its replica's queue: a full one sheds its last waiter of a lower
    /// priority (or of the tenant with the most), or waits past its bound for a lower
    /// priority's request ([`Gate::past_bound`]), or sheds `pending` itself; a waiter the
    /// reserve is kept for makes room.
    fn join(&mut self, now: f64, pending: Pending<'w>) {
        let (replica, number) = (pending.replica, pending.number);
        let gate = self.gate(&pending);
        let (flow, max_queued) = (gate.flow, self.control[replica].max_queued);
        let tenant = flow.tenant.clone();
        let ticket = order::QueueTicket {
            tenant: &tenant,
            ..flow
        };
        let promoted = seconds(now + QUEUE_TIMEOUT / 2.0);
        let control = &mut self.control[replica];
        let joined = match control.order.join(max_queued, &ticket, promoted, pending) {
            Err(pending) if control.order.len() >= max_queued => {
                let bound = self.gate(&pending).past_bound(max_queued);
                let order = &mut self.control[replica].order;
                order.join(bound, &ticket, promoted, pending)
            }
            joined => joined,
        };
        match joined {
            Ok((key, shed)) => {
                self.control[replica].waiting.insert(number, key);
                let expire = super::WorldEvent::Expire {
                    replica,
                    pending: number,
                };
                self.at(now + QUEUE_TIMEOUT, expire);
                if let Some(flow::Shed(last)) = shed {
                    self.shed(now, last);
                }
                self.make_room(replica, number);
            }
            Err(pending) => self.shed(now, pending),
        }
    }

    /// A waiter the reserve is kept for stops a lower priority's request, and the requests
    /// it outranks where it would go ([`Gate::make_room`]).
    fn make_room(&self, replica: usize, number: u64) {
        let control = &self.control[replica];
        let waiter = (control.waiting.get(&number)).and_then(|&k| control.order.get(k));
        let Some(pending) = waiter else {
            return;
        };
        let gate = self.gate(pending);
        let router = &self.routers[replica];
        self.asking(pending.want, |asked| {
            let unbounded = |cap| router.unbounded(asked, cap);
            gate.make_room(&router.accounts(), router.size(asked), unbounded);
        });
    }

    /// Places `pending` now: at its conversation's home if it stays there
    /// ([`Gate::reclaim_home`]), else where the policy chooses under its cap.
    fn place_flow(&mut self, now: f64, pending: Pending<'w>) {
        let cap = self.cap(&pending);
        let gate = self.gate(&pending);
        let router = &self.routers[pending.replica];
        let home = self.asking(pending.want, |asked| {
            gate.reclaim_home(&router.accounts(), cap, || router.unbounded(asked, cap))
        });
        let (only, cap) = home.map_or((None, cap), |(i, cap)| (Some(i), cap));
        let (want, sent, replica) = (pending.want, pending.sent, pending.replica);
        let flowing = Flowing { cap, only, pending };
        self.dispatch(now, want, sent, replica, flowing);
    }

    /// Flow control's part of a placement on `placement`'s backend under `cap`, as the
    /// engine gets request `id` ([`Gate::placed`]): a request the reserve is kept for
    /// stops those there it outranks; another, unless stopped once, may be stopped until
    /// its answer.
    pub(super) fn flow_placed(
        &mut self,
        pending: Pending<'w>,
        placement: Option<&Placement>,
        cap: Cap,
        id: u64,
    ) -> (Option<Share<'w>>, Option<Stoppable<'w>>) {
        let Some(placement) = placement else {
            return (pending.share, None);
        };
        let control = &self.control[pending.replica];
        let backend = self.routers[pending.replica].accounts()[placement.backend].id;
        let stopped = Arc::clone(&control.stopped);
        let stop =
            move || -> flow::preempt::Stop { Box::new(move |why| stopped.lock().push((id, why))) };
        let flow = self.gate(&pending).flow;
        let preemptible = gate::placed(control.flow, &flow, cap, backend, pending.preempted, stop);
        (pending.share, preemptible)
    }

    /// No backend was open to `pending` when placed (a request the reserve is kept for
    /// took the slot): it waits again.
    pub(super) fn unplaced(&mut self, now: f64, pending: Pending<'w>) {
        self.join(now, pending);
    }

    /// After replica `replica`'s read of the engines' load: flow control's steps
    /// ([`flow::after_read`]), what an engine queues past its hold taken back to the
    /// replica's queue as far as it has room.
    pub(super) fn after_read(&self, replica: usize) {
        let control = &self.control[replica];
        let room = control.max_queued.saturating_sub(control.order.len());
        let accounts = self.routers[replica].accounts();
        let accounts: Vec<_> = accounts.iter().map(|a| &***a).collect();
        control.flow.after_read(&accounts, room, control.standing);
    }

    /// Takes the stopped requests off their engines and admits them again, and places the
    /// waiters first in order while a backend is open to them, until neither changes.
    pub(super) fn settle(&mut self, now: f64) {
        for replica in 0..self.control.len() {
            loop {
                let stopped = std::mem::take(&mut *self.control[replica].stopped.lock());
                let stopping = !stopped.is_empty();
                for (id, why) in stopped {
                    self.stop(now, id, why);
                }
                if !self.place_waiters(now, replica) && !stopping {
                    break;
                }
            }
        }
    }

    /// Request `id` was stopped before its answer: its engine aborts it, its seat frees,
    /// and it is admitted again as it was sent.
    fn stop(&mut self, now: f64, id: u64, why: Stopped) {
        let Some(mut live) = self.live.remove(&id) else {
            return;
        };
        let Some(placement) = live.placement.take() else {
            return;
        };
        let engine = &mut self.engines[placement.backend];
        engine.advance(now);
        engine.abort(id);
        drop(placement);
        self.parties[live.want.party].preempted += 1;
        let outranked = why == Stopped::Outranked;
        let pending = self.pending(live.want, live.sent, live.replica, live.share, outranked);
        self.admit(now, pending);
    }

    /// Places the waiters of `replica` first in order while a backend is open to them;
    /// whether any.
    fn place_waiters(&mut self, now: f64, replica: usize) -> bool {
        let mut placed = false;
        loop {
            let order = &self.control[replica].order;
            let Some(key) = order.first(seconds(now)) else {
                return placed;
            };
            let Some(pending) = order.get(key) else {
                return placed;
            };
            if !self.routers[replica].open(self.cap(pending)) {
                return placed;
            }
            let control = &mut self.control[replica];
            let Some(pending) = control.order.leave(key, seconds(now)) else {
                return placed;
            };
            control.waiting.remove(&pending.number);
            self.place_flow(now, pending);
            placed = true;
        }
    }

    /// The request waiting as `number` in `replica`'s queue waited its longest: 503, if it
    /// still waits.
    pub(super) fn expire(&mut self, now: f64, replica: usize, number: u64) {
        let control = &mut self.control[replica];
        let Some(key) = control.waiting.remove(&number) else {
            return;
        };
        if let Some(pending) = control.order.leave(key, seconds(now)) {
            self.shed(now, pending);
        }
    }

    /// The router answers `pending` 503 (`overloaded`) without placing it.
    fn shed(&mut self, now: f64, pending: Pending<'w>) {
        self.control[pending.replica]
            .waiting
            .remove(&pending.number);
        let (want, sent, replica) = (pending.want, pending.sent, pending.replica);
        drop(pending);
        self.refused(now, sent, want, None, replica, 503);
    }
}
