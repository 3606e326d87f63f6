//! Preemption before the first byte, on the router's tasks: a request registered in the
//! shares' table ([`prefix_router_core::flow::preempt`], where the rules live) is stopped
//! through a [`Notify`] its exchange waits on beside the backend's answer; its connection
//! then closes, the engine aborts it, and it goes back to the router's queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use prefix_router_core::BackendId;
use prefix_router_core::flow::{Gate, Stoppable, Stopped};
use prefix_router_core::ledger::Cap;
use tokio::sync::Notify;

/// A registered request: stopped when [`Preemptible::stop`] resolves; unregistered when
/// dropped.
#[derive(Debug)]
pub struct Preemptible<'p> {
    _registered: Stoppable<'p>,
    stop: Arc<Notify>,
    taken_back: Arc<AtomicBool>,
}

impl<'p> Preemptible<'p> {
    /// `gate`'s request placed on `backend` under `cap` ([`Gate::placed`]): registered if
    /// it may be stopped (not the once it was already, `once`).
    pub fn placed(gate: &Gate<'p>, cap: Cap, backend: BackendId, once: bool) -> Option<Self> {
        let stop = Arc::new(Notify::new());
        let taken_back = Arc::new(AtomicBool::new(false));
        let (notify, taken) = (Arc::clone(&stop), Arc::clone(&taken_back));
        let stopper = move || -> prefix_router_core::flow::preempt::Stop {
            Box::new(move |why| {
                taken.store(why == Stopped::TakenBack, Relaxed);
                notify.notify_one();
            })
        };
        Some(Preemptible {
            _registered: gate.placed(cap, backend, once, stopper)?,
            stop,
            taken_back,
        })
    }

    /// Whether it was stopped to be taken back from its engine's queue (it may be
    /// stopped once more for a request that outranks it), not for such a request.
    pub fn taken_back(&self) -> bool {
        self.taken_back.load(Relaxed)
    }

    /// What resolves when the request is stopped (at once if it was already).
    pub fn stop(&self) -> &Notify {
        &self.stop
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenants::{Priority, Shares};
    use prefix_router_core::flow::order::QueueTicket;
    use prefix_router_core::flow::{FlowControl, TenantId, Victims};

    #[tokio::test]
    async fn a_stopped_request_is_woken_even_when_stopped_before_it_waits() {
        let shares = Shares::default();
        let a = TenantId::new("a");
        let _a: Vec<_> = (0..6)
            .map(|_| shares.enter(&a, 1, Priority::Normal))
            .collect();
        let _b = shares.enter(&TenantId::new("b"), 1, Priority::Normal);
        let gate = Gate {
            flow: QueueTicket {
                tenant: &a,
                ..QueueTicket::default()
            },
            control: &shares,
            ..Gate::default()
        };
        let heavy = Preemptible::placed(&gate, gate.cap(0), BackendId(1), false).unwrap();
        let b = TenantId::new("b");
        let light = QueueTicket {
            tenant: &b,
            ..QueueTicket::default()
        };
        assert_eq!(
            FlowControl::stop(&shares, &light, Victims::Sharing(BackendId(1))),
            1
        );
        heavy.stop().notified().await;
    }
}
