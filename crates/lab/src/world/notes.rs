//! The router replicas of a lab run and their shared conversation table: each note a
//! replica makes reaches the others `note_delay` later, in the order they were made.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prefix_router_core::clock::{Clock, Manual};
use prefix_router_core::policy::{Conversations, Note};

use super::seconds;
use crate::router::{LabRouter, RouterSetup};

/// The router replicas of `setup`, on one virtual clock, each with a conversation table of
/// its own; when the setup shares the table, every note a replica makes reaches the others
/// `note_delay` later ([`Notes`]).
pub(super) fn routers(
    setup: &RouterSetup,
    backends: &[String],
    clock: &Manual,
) -> (Vec<LabRouter>, Notes) {
    let mut notes = Notes {
        delay: seconds(setup.note_delay),
        ..Notes::default()
    };
    let routers = (0..setup.replicas.max(1))
        .map(|r| {
            let table = setup.shared_table.then(|| {
                let table = Arc::new(Conversations::new(Arc::new(clock.clone())));
                let (sent, clock) = (Arc::clone(&notes.sent), clock.clone());
                table.on_note(move |note| sent.lock().push((clock.now(), r, note)));
                table
            });
            notes.tables.push(table.clone());
            notes.merged.push(0);
            LabRouter::new(setup, backends, r, clock, table)
        })
        .collect();
    (routers, notes)
}

/// The replicas' notes in the order they were made, with when and by which replica, and
/// how far each replica has merged them: the shared table's publish and subscribe.
#[derive(Default)]
pub(super) struct Notes {
    sent: Arc<Mutex<Vec<(Duration, usize, Note)>>>,
    tables: Vec<Option<Arc<Conversations>>>,
    merged: Vec<usize>,
    /// How long a note takes to reach the other replicas.
    delay: Duration,
}

impl Notes {
    /// Replica `replica` merges the other replicas' notes made at least `delay` before `now`.
    pub(super) fn deliver(&mut self, replica: usize, now: Duration) {
        let delay = self.delay;
        let Some(Some(table)) = self.tables.get(replica) else {
            return;
        };
        let sent = self.sent.lock();
        let due = (sent[self.merged[replica]..].iter())
            .take_while(|(at, _, _)| *at + delay <= now)
            .collect::<Vec<_>>();
        for (_, from, note) in &due {
            if *from != replica {
                table.merge(*note);
            }
        }
        self.merged[replica] += due.len();
    }
}

#[cfg(test)]
mod tests {
    use prefix_router_core::BackendId;
    use prefix_router_core::units::TextBytes;

    use super::*;

    /// Two replicas' tables fed by one list of notes, as `routers` wires them.
    fn two_replicas(delay: Duration) -> (Notes, Manual) {
        let clock = Manual::default();
        let mut notes = Notes {
            delay,
            ..Notes::default()
        };
        for r in 0..2 {
            let table = Arc::new(Conversations::new(Arc::new(clock.clone())));
            let (sent, at) = (Arc::clone(&notes.sent), clock.clone());
            table.on_note(move |note| sent.lock().push((at.now(), r, note)));
            notes.tables.push(Some(table));
            notes.merged.push(0);
        }
        (notes, clock)
    }

    fn note(conversation: u128, backend: u32) -> Note {
        Note {
            conversation,
            backend: BackendId(backend),
            bytes: TextBytes(100),
            shared: TextBytes(0),
            origin: 0,
        }
    }

    #[test]
    fn a_note_reaches_the_other_replica_after_the_delay_and_never_its_maker() {
        let (mut notes, clock) = two_replicas(Duration::from_millis(2));
        notes.sent.lock().push((Duration::ZERO, 0, note(7, 1)));
        let home = |notes: &Notes, r: usize| {
            let table = notes.tables[r].as_ref().unwrap();
            table.home_of(7).map(|(b, _)| b)
        };
        notes.deliver(1, Duration::from_millis(1));
        assert_eq!(home(&notes, 1), None, "delivered before the delay");
        assert_eq!(notes.merged[1], 0);
        clock.set(Duration::from_millis(2));
        notes.deliver(1, Duration::from_millis(2));
        assert_eq!(home(&notes, 1), Some(BackendId(1)));
        notes.deliver(0, Duration::from_millis(2));
        assert_eq!(home(&notes, 0), None, "a replica merged its own note");
        assert_eq!(notes.merged, vec![1, 1]);
    }

    #[test]
    fn notes_are_delivered_in_the_order_they_were_made() {
        let (mut notes, _) = two_replicas(Duration::ZERO);
        let sent = [(0, note(7, 0)), (1, note(8, 1)), (0, note(7, 1))];
        for (i, (from, n)) in sent.into_iter().enumerate() {
            notes
                .sent
                .lock()
                .push((Duration::from_millis(i as u64), from, n));
        }
        notes.deliver(1, Duration::from_millis(1));
        assert_eq!(notes.merged[1], 2, "the third note is not due yet");
        notes.deliver(1, Duration::from_millis(5));
        let table = notes.tables[1].as_ref().unwrap();
        assert_eq!(table.home_of(7).map(|(b, _)| b), Some(BackendId(1)));
    }
}
