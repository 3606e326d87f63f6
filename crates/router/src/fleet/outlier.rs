//! Outlier ejection, as Envoy's outlier detection does it: answers as well as connections
//! count. 5xx answers in a row (500, 502, 504, and 503 without `retry-after`), or failed
//! exchanges in a row (no connection, reset, timed out), eject a backend for a time that
//! grows with each ejection (`base_ejection` times the ejections, at most `max_ejection`).
//! Answers that are the client's fault (4xx) and 429 (load, not sickness) count as
//! answered. When the time is up the backend comes back half-open: its next exchange
//! decides, a success closing it and a failure ejecting it again for longer. A passed
//! active health check ends an ejection for failed exchanges in a row (the backend answers
//! again), not one for 5xx answers (its checks passed all along) nor one for a failure
//! while half-open (its checks pass and its requests do not). The ejection count decays: a
//! backend that stays in for `max_ejection` starts over at `base_ejection`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::stats::label_set;

/// When backends are ejected, and for how long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutlierSettings {
    /// 5xx answers in a row that eject (failed exchanges count too); 0: never. Default 5.
    pub consecutive_5xx: usize,
    /// Failed exchanges in a row that eject; 0: never. Default 3.
    pub consecutive_failures: usize,
    /// Length of the first ejection; each further one is longer by as much. Default 30 s.
    pub base_ejection: Duration,
    /// Longest ejection. Default 300 s.
    pub max_ejection: Duration,
    /// Most of the fleet ejected at once, percent; at least one backend may be, and never
    /// the last one open. Default 10.
    pub max_ejection_percent: usize,
}

impl Default for OutlierSettings {
    fn default() -> Self {
        OutlierSettings {
            consecutive_5xx: 5,
            consecutive_failures: 3,
            base_ejection: Duration::from_secs(30),
            max_ejection: Duration::from_secs(300),
            max_ejection_percent: 10,
        }
    }
}

impl OutlierSettings {
    /// How many of `backends` may be ejected at once.
    pub fn max_ejected(&self, backends: usize) -> usize {
        (backends * self.max_ejection_percent / 100)
            .max(1)
            .min(backends.saturating_sub(1))
    }
}

/// How one exchange with a backend ended, as outlier detection sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// An answer that says nothing against the backend (2xx, 3xx, 4xx, 429, 503 with
    /// `retry-after`).
    Answered,
    /// A 5xx answer that counts against it.
    Sick,
    /// No answer: no connection, reset, timed out.
    Failed,
}

impl Ended {
    /// How an answer of `status` ended; `retry_after` says whether it carried the header.
    pub fn of_status(status: u16, retry_after: bool) -> Ended {
        match status {
            500 | 502 | 504 => Ended::Sick,
            503 if !retry_after => Ended::Sick,
            _ => Ended::Answered,
        }
    }
}

label_set! {
    /// Why a backend was ejected (metrics label).
    pub enum Reason {
        /// 5xx answers in a row (failed exchanges among them), or a 5xx while half-open.
        Answers => "5xx",
        /// Failed exchanges in a row, or a failure while half-open.
        Failures => "failures",
    }
}

/// An ejection just decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ejection {
    /// Why.
    pub reason: Reason,
    /// For how long.
    pub time: Duration,
}

#[derive(Debug, Default)]
struct Streaks {
    answers: usize,
    failures: usize,
    /// Ejections so far (decayed).
    ejections: u32,
    /// Back from an ejection, not yet confirmed by a success.
    half_open: bool,
    /// Whether a passed health check may end the current ejection: one for failed
    /// exchanges in a row, not one for a failure while half-open (a backend that passes
    /// its checks and fails its requests would get one request per check).
    restorable: bool,
    /// When the last ejection ended or will end, ms on [`now_ms`]'s clock.
    ended_at: u64,
}

/// One backend's outlier state.
#[derive(Debug, Default)]
pub struct Outlier {
    /// Ejected until this time, ms on [`now_ms`]'s clock (0: not ejected).
    until: AtomicU64,
    streaks: Mutex<Streaks>,
}

impl Outlier {
    /// Whether the backend is ejected at `now` (ms on [`now_ms`]'s clock).
    pub fn ejected(&self, now: u64) -> bool {
        now < self.until.load(Relaxed)
    }

    /// Whether the backend is ejected now (the clock is read only when it was ejected).
    pub fn ejected_now(&self) -> bool {
        let until = self.until.load(Relaxed);
        until != 0 && now_ms() < until
    }

    /// Records how an exchange ended at `now`; `may_eject` says whether the fleet can spare
    /// the backend. Returns the ejection when this exchange caused one.
    pub fn record(
        &self,
        ended: Ended,
        now: u64,
        settings: &OutlierSettings,
        may_eject: impl FnOnce() -> bool,
    ) -> Option<Ejection> {
        let mut s = self.streaks.lock();
        if ended == Ended::Answered {
            (s.answers, s.failures, s.half_open) = (0, 0, false);
            if now.saturating_sub(s.ended_at) >= millis(settings.max_ejection) {
                s.ejections = 0;
            }
            return None;
        }
        s.answers += 1;
        s.failures += usize::from(ended == Ended::Failed);
        let reached = |streak: usize, threshold: usize| threshold > 0 && streak >= threshold;
        let failures = reached(s.failures, settings.consecutive_failures);
        if !(s.half_open || failures || reached(s.answers, settings.consecutive_5xx)) {
            return None;
        }
        if self.ejected(now) || !may_eject() {
            return None;
        }
        let failed = failures || (s.half_open && ended == Ended::Failed);
        let reason = if failed {
            Reason::Failures
        } else {
            Reason::Answers
        };
        s.restorable = failures && !s.half_open;
        s.ejections += 1;
        let time = (settings.base_ejection * s.ejections).min(settings.max_ejection);
        (s.answers, s.failures, s.half_open) = (0, 0, true);
        s.ended_at = now + millis(time);
        self.until.store(s.ended_at, Relaxed);
        Some(Ejection { reason, time })
    }

    /// A passed active health check: ends an ejection for failed exchanges (half-open);
    /// returns whether it did.
    pub fn restore(&self, now: u64) -> bool {
        let mut s = self.streaks.lock();
        if !self.ejected(now) || !s.restorable {
            return false;
        }
        self.until.store(0, Relaxed);
        s.ended_at = now;
        true
    }
}

/// Milliseconds since the first call, the clock ejections are timed on.
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    millis(START.get_or_init(Instant::now).elapsed()).max(1)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1000;

    fn settings() -> OutlierSettings {
        OutlierSettings::default()
    }

    fn record(o: &Outlier, ended: Ended, now: u64) -> Option<Ejection> {
        o.record(ended, now, &settings(), || true)
    }

    #[test]
    fn five_5xx_in_a_row_eject_for_a_time_that_grows() {
        let o = Outlier::default();
        for _ in 0..4 {
            assert_eq!(record(&o, Ended::Sick, 1), None);
        }
        let first = record(&o, Ended::Sick, 1).unwrap();
        assert_eq!(first.reason, Reason::Answers);
        assert_eq!(first.time, Duration::from_secs(30));
        assert!(o.ejected(1) && o.ejected(30 * S) && !o.ejected(30 * S + 1));
        // Back half-open: one more 5xx ejects again, for twice as long.
        let second = record(&o, Ended::Sick, 31 * S).unwrap();
        assert_eq!(second.time, Duration::from_secs(60));
        assert!(o.ejected(90 * S));
    }

    #[test]
    fn a_success_in_between_starts_over_and_client_faults_never_count() {
        let o = Outlier::default();
        for _ in 0..4 {
            record(&o, Ended::Sick, 1);
        }
        assert_eq!(record(&o, Ended::Answered, 1), None);
        for status in [400, 404, 413, 422, 429] {
            assert_eq!(Ended::of_status(status, false), Ended::Answered);
        }
        assert_eq!(
            Ended::of_status(503, true),
            Ended::Answered,
            "503 with retry-after"
        );
        assert_eq!(Ended::of_status(503, false), Ended::Sick);
        for _ in 0..4 {
            assert_eq!(record(&o, Ended::Sick, 1), None);
        }
    }

    #[test]
    fn failures_eject_sooner_and_a_passed_check_ends_only_their_ejection() {
        let o = Outlier::default();
        record(&o, Ended::Failed, 1);
        record(&o, Ended::Failed, 1);
        let e = record(&o, Ended::Failed, 1).unwrap();
        assert_eq!(e.reason, Reason::Failures);
        assert!(o.restore(2) && !o.ejected(2));
        let o = Outlier::default();
        for _ in 0..5 {
            record(&o, Ended::Sick, 1);
        }
        assert!(!o.restore(2) && o.ejected(2), "its checks passed all along");
        let o = Outlier::default();
        for _ in 0..3 {
            record(&o, Ended::Failed, 1);
        }
        assert!(o.restore(2));
        let again = record(&o, Ended::Failed, 3).unwrap();
        assert_eq!(
            (again.reason, again.time),
            (Reason::Failures, Duration::from_secs(60))
        );
        assert!(
            !o.restore(4),
            "failed while half-open: its checks do not bring it back"
        );
    }

    #[test]
    fn a_half_open_success_closes_and_the_count_decays() {
        let o = Outlier::default();
        for _ in 0..5 {
            record(&o, Ended::Sick, 1);
        }
        assert_eq!(record(&o, Ended::Answered, 31 * S), None);
        for _ in 0..4 {
            assert_eq!(
                record(&o, Ended::Sick, 32 * S),
                None,
                "closed: 5 in a row again"
            );
        }
        assert_eq!(
            record(&o, Ended::Sick, 32 * S).unwrap().time,
            Duration::from_secs(60)
        );
        // In for max_ejection after that ejection ended: the count starts over.
        record(&o, Ended::Answered, 92 * S);
        record(&o, Ended::Answered, 92 * S + 300 * S);
        for _ in 0..4 {
            record(&o, Ended::Sick, 400 * S);
        }
        assert_eq!(
            record(&o, Ended::Sick, 400 * S).unwrap().time,
            Duration::from_secs(30)
        );
    }

    #[test]
    fn the_fleet_keeps_a_share_open() {
        let o = Outlier::default();
        for _ in 0..10 {
            assert_eq!(o.record(Ended::Sick, 1, &settings(), || false), None);
        }
        assert!(!o.ejected(1));
        let s = settings();
        assert_eq!(
            (s.max_ejected(1), s.max_ejected(2), s.max_ejected(3)),
            (0, 1, 1)
        );
        assert_eq!((s.max_ejected(20), s.max_ejected(40)), (2, 4));
    }
}
