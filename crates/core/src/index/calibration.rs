//! What backends report of their caches corrects what the index believes. Per backend,
//! the ratio of the cached tokens a backend reported to those its index predicted is
//! smoothed over responses. When it stays low, the backend evicts sooner than the index
//! models (its cache is smaller than the index's budget, or shared with traffic the
//! router does not see): the budget shrinks, so the index forgets what the backend no
//! longer holds. When the ratio recovers, the budget grows back toward its ceiling (the
//! capacity the backend published, else the configured budget).

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::BackendId;
use crate::units::TextBytes;

/// Predictions smaller than this teach nothing.
const MIN_PREDICTED: TextBytes = TextBytes(4096);
/// Responses between two adjustments of a backend's budget.
const EVERY: u32 = 16;
/// Weight of each new ratio in the smoothed one.
const ALPHA: f64 = 0.1;
/// Below this smoothed ratio, the budget shrinks by `SHRINK`; above `HEALTHY`, it grows by
/// `GROW`, never above its ceiling nor below `FLOOR` of it.
const LOW: f64 = 0.8;
const HEALTHY: f64 = 0.95;
const SHRINK: f64 = 0.85;
const GROW: f64 = 1.1;
const FLOOR: f64 = 1.0 / 16.0;

#[derive(Clone, Copy)]
struct CalibrationState {
    ratio: f64,
    scale: f64,
    seen: u32,
}

impl Default for CalibrationState {
    fn default() -> Self {
        CalibrationState {
            ratio: 1.0,
            scale: 1.0,
            seen: 0,
        }
    }
}

/// Per-backend budget scales learned from reported cache hits.
#[derive(Default)]
pub struct Calibration {
    states: Mutex<HashMap<BackendId, CalibrationState>>,
}

impl Calibration {
    /// `backend` reported `delivered` text's worth of cached tokens where its index
    /// predicted `predicted`. Returns its new budget scale (0..=1) when it changed.
    pub fn observe(
        &self,
        backend: BackendId,
        predicted: TextBytes,
        delivered: TextBytes,
    ) -> Option<f64> {
        if predicted < MIN_PREDICTED {
            return None;
        }
        let mut states = self.states.lock();
        let s = states.entry(backend).or_default();
        let ratio = (delivered.0 as f64 / predicted.0 as f64).min(1.5);
        s.ratio += ALPHA * (ratio - s.ratio);
        s.seen += 1;
        if s.seen < EVERY {
            return None;
        }
        s.seen = 0;
        let scale = match s.ratio {
            r if r < LOW => (s.scale * SHRINK).max(FLOOR),
            r if r > HEALTHY => (s.scale * GROW).min(1.0),
            _ => s.scale,
        };
        (scale != s.scale).then(|| {
            s.scale = scale;
            scale
        })
    }

    /// `backend`'s current budget scale (1 until it learned otherwise).
    pub fn scale(&self, backend: BackendId) -> f64 {
        self.states.lock().get(&backend).map_or(1.0, |s| s.scale)
    }

    /// Forgets backends for which `live` is false.
    pub fn retain(&self, live: &dyn Fn(BackendId) -> bool) {
        self.states.lock().retain(|b, _| live(*b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_that_delivers_less_than_predicted_gets_a_smaller_budget_until_it_recovers() {
        let c = Calibration::default();
        let b = BackendId(0);
        let mut scales = Vec::new();
        for _ in 0..200 {
            scales.extend(c.observe(b, TextBytes(100_000), TextBytes(20_000)));
        }
        let low = c.scale(b);
        assert!(low < 0.2, "{scales:?}");
        assert!(low >= FLOOR);
        for _ in 0..400 {
            c.observe(b, TextBytes(100_000), TextBytes(100_000));
        }
        assert_eq!(c.scale(b), 1.0);
        assert_eq!(
            c.observe(b, TextBytes(100), TextBytes(0)),
            None,
            "small predictions teach nothing"
        );
    }
}
