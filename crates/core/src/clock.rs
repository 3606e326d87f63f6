//! Where time comes from: the monotonic clock in the router, virtual time in the lab. Only
//! the policies' tables read time (idle TTLs, the live horizon of conversations); the
//! prefix index orders by a logical tick.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// A source of the current time, as a duration since an origin of its own.
pub trait Clock: Send + Sync {
    /// Time since the clock's origin.
    fn now(&self) -> Duration;
}

/// The process's monotonic clock, from when it was made.
pub struct Monotonic(Instant);

impl Default for Monotonic {
    fn default() -> Self {
        Monotonic(Instant::now())
    }
}

impl Clock for Monotonic {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// A clock that moves only when told: the lab's virtual time. Clones share the time.
#[derive(Clone, Default)]
pub struct Manual(Arc<AtomicU64>);

impl Manual {
    /// Sets the time (never moves it back).
    pub fn set(&self, now: Duration) {
        let micros = u64::try_from(now.as_micros()).unwrap_or(u64::MAX);
        self.0.fetch_max(micros, Relaxed);
    }
}

impl Clock for Manual {
    fn now(&self) -> Duration {
        Duration::from_micros(self.0.load(Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_time_moves_forward_only() {
        let clock = Manual::default();
        let shared = clock.clone();
        clock.set(Duration::from_secs(5));
        clock.set(Duration::from_secs(2));
        assert_eq!(shared.now(), Duration::from_secs(5));
    }
}
