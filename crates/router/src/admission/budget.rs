//! The budget for buffered request bytes: every routed body is read whole before a backend
//! is chosen, so the sum of what is held must be bounded. A body's bytes count from the
//! first one read until the router no longer needs them: until its backend's response
//! head arrives (before that, a retry may resend it). A request that would cross the
//! budget is not read further (the client is held by TCP backpressure) until bytes are
//! freed, for at most `admission_timeout`; then it gets 503 `overloaded`.
//!
//! Large bodies cannot starve small ones: bodies over [`SMALL`] may use all but a reserve
//! of the budget (an eighth), which only bodies of at most [`SMALL`] can take.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

/// Bodies up to this size may use the reserve, bytes.
pub const SMALL: usize = 1 << 20;

/// Why bytes were not granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exhausted;

#[derive(Default)]
struct Used {
    /// Bytes held by all bodies.
    all: usize,
    /// Bytes held by bodies over `SMALL`.
    large: usize,
}

/// The budget, shared by every request.
pub struct Budget {
    limit: Box<dyn Fn() -> usize + Send + Sync>,
    used: Mutex<Used>,
    freed: Notify,
    waiting: AtomicUsize,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Self> {
        Budget::reading(move || limit)
    }

    /// A budget of whatever `limit` returns when a body asks for bytes (the current
    /// snapshot's limit: a reload changes it for bodies that ask from then on).
    pub fn reading(limit: impl Fn() -> usize + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Budget {
            limit: Box::new(limit),
            used: Mutex::new(Used::default()),
            freed: Notify::new(),
            waiting: AtomicUsize::new(0),
        })
    }

    /// Wakes the bodies waiting for bytes to look again (the limit may have changed).
    pub fn wake(&self) {
        self.freed.notify_waiters();
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.used.lock().all
    }

    /// Requests waiting for bytes now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Relaxed)
    }

    /// Takes `bytes` more for a body that will then hold `total` bytes, if they fit now.
    fn try_take(&self, bytes: usize, total: usize) -> bool {
        let limit = (self.limit)();
        let mut used = self.used.lock();
        let large = total > SMALL;
        let cap = if large { limit - limit / 8 } else { limit };
        let now_large = if large {
            used.large + bytes + small_part(total, bytes)
        } else {
            0
        };
        if used.all + bytes > limit || (large && now_large > cap) {
            return false;
        }
        used.all += bytes;
        if large {
            used.large = now_large;
        }
        true
    }

    fn give(&self, bytes: usize, total: usize) {
        let mut used = self.used.lock();
        used.all = used.all.saturating_sub(bytes);
        if total > SMALL {
            used.large = used.large.saturating_sub(bytes);
        }
        drop(used);
        self.freed.notify_waiters();
    }
}

/// When a body crosses [`SMALL`] while it grows, the part it held as a small body moves
/// to the large count with this grant.
fn small_part(total: usize, bytes: usize) -> usize {
    let before = total - bytes;
    if before <= SMALL { before } else { 0 }
}

/// The bytes one body holds; they go back to the budget when it drops.
pub struct Permit {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Permit {
    /// A permit holding nothing yet.
    pub fn new(budget: &Arc<Budget>) -> Self {
        Permit {
            budget: Arc::clone(budget),
            bytes: 0,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `more` bytes besides those held, waiting for them until `deadline`.
    pub async fn grow(&mut self, more: usize, deadline: Instant) -> Result<(), Exhausted> {
        let total = self.bytes + more;
        if self.budget.try_take(more, total) {
            self.bytes = total;
            return Ok(());
        }
        self.budget.waiting.fetch_add(1, Relaxed);
        let waited = self.wait(more, total, deadline).await;
        self.budget.waiting.fetch_sub(1, Relaxed);
        waited
    }

    async fn wait(
        &mut self,
        more: usize,
        total: usize,
        deadline: Instant,
    ) -> Result<(), Exhausted> {
        loop {
            let freed = self.budget.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.budget.try_take(more, total) {
                self.bytes = total;
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, freed).await.is_err() {
                return Err(Exhausted);
            }
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.give(self.bytes, self.bytes);
        }
    }
}

/// How long a request may wait for bytes.
pub fn deadline(timeout: Duration) -> Instant {
    Instant::now() + timeout
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(50)
    }

    #[tokio::test]
    async fn large_bodies_leave_the_reserve_to_small_ones() {
        let budget = Budget::new(80 << 20);
        let mut large = Permit::new(&budget);
        assert!(large.grow(70 << 20, soon()).await.is_ok());
        let mut more = Permit::new(&budget);
        assert_eq!(
            more.grow(2 << 20, soon()).await,
            Err(Exhausted),
            "past the large pool"
        );
        let mut small = Permit::new(&budget);
        assert!(
            small.grow(1 << 10, soon()).await.is_ok(),
            "the reserve is for small bodies"
        );
        assert_eq!(budget.held(), (70 << 20) + (1 << 10));
        drop((large, small));
        assert_eq!(budget.held(), 0);
        assert!(more.grow(2 << 20, soon()).await.is_ok());
    }

    #[tokio::test]
    async fn a_waiting_body_gets_the_bytes_freed_and_gives_up_at_its_deadline() {
        let budget = Budget::new(10 << 20);
        let mut first = Permit::new(&budget);
        first.grow(8 << 20, soon()).await.unwrap();
        let waiter = {
            let budget = Arc::clone(&budget);
            tokio::spawn(async move {
                let mut p = Permit::new(&budget);
                let got = p
                    .grow(1 << 19, Instant::now() + Duration::from_secs(5))
                    .await;
                let got = got.and(
                    p.grow(2 << 20, Instant::now() + Duration::from_secs(5))
                        .await,
                );
                (got, p.bytes())
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(budget.waiting(), 1);
        drop(first);
        assert_eq!(waiter.await.unwrap(), (Ok(()), (1 << 19) + (2 << 20)));
        assert_eq!(budget.held(), 0);
        let mut large = Permit::new(&budget);
        large.grow(8 << 20, soon()).await.unwrap();
        let mut small = Permit::new(&budget);
        small.grow(1 << 20, soon()).await.unwrap();
        let mut other = Permit::new(&budget);
        other.grow(1 << 20, soon()).await.unwrap();
        assert_eq!(budget.held(), 10 << 20);
        let started = Instant::now();
        assert_eq!(Permit::new(&budget).grow(1, soon()).await, Err(Exhausted));
        assert!(started.elapsed() >= Duration::from_millis(40));
        assert_eq!(budget.waiting(), 0);
    }
}
