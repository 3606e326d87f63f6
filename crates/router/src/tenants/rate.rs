//! Per-tenant rate limits over a sliding minute: what a tenant was served in the last 60
//! one-second slots, requests and tokens, against its `requests_per_minute` and
//! `tokens_per_minute`. A request is admitted when its estimated prompt fits; when its
//! answer reports usage, the prompt and completion tokens it really cost replace the
//! estimate. A sliding window, not a bucket that starts full: over any minute a tenant is
//! served its limit, not twice it. State is one window of 60 slots per tenant of the file.

use std::collections::HashMap;

use parking_lot::Mutex;
use prefix_router_core::flow::TenantId;

use super::Tenant;

/// Seconds in the window.
const WINDOW: u64 = 60;

/// Which limit refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `requests_per_minute`.
    Requests,
    /// `tokens_per_minute`.
    Tokens,
}

/// One limit's state, as OpenAI's `x-ratelimit-*` headers say it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Headroom {
    /// The limit a minute (0: none).
    pub limit: u64,
    /// What is left of it now.
    pub remaining: u64,
    /// Seconds until the whole limit is available again.
    pub reset: u64,
}

/// What the limits say of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// `None` when admitted, else the limit that refused it.
    pub refused: Option<Limit>,
    /// Seconds until it would fit (0 when admitted).
    pub retry_after: u64,
    /// Requests.
    pub requests: Headroom,
    /// Tokens.
    pub tokens: Headroom,
}

/// Requests and tokens served in one second.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    second: u64,
    requests: u64,
    tokens: i64,
}

/// One tenant's last minute.
#[derive(Debug)]
struct Window([Slot; WINDOW as usize]);

impl Window {
    fn slot(&mut self, now: u64) -> &mut Slot {
        let slot = &mut self.0[(now % WINDOW) as usize];
        if slot.second != now {
            *slot = Slot {
                second: now,
                ..Slot::default()
            };
        }
        slot
    }

    /// The live slots (within the minute before `now`), oldest first.
    fn live(&self, now: u64) -> Vec<Slot> {
        let mut live: Vec<Slot> = (self.0.iter())
            .filter(|s| s.second + WINDOW > now && s.second <= now)
            .copied()
            .collect();
        live.sort_by_key(|s| s.second);
        live
    }
}

/// Seconds until `used + wanted` fits `limit` as the oldest slots expire; `amount` reads a
/// slot's use.
fn wait(
    live: &[Slot],
    now: u64,
    used: u64,
    wanted: u64,
    limit: u64,
    amount: fn(&Slot) -> u64,
) -> u64 {
    let mut left = used;
    for slot in live {
        if left + wanted <= limit {
            break;
        }
        left = left.saturating_sub(amount(slot));
        if left + wanted <= limit || left == 0 {
            return slot.second + WINDOW - now;
        }
    }
    0
}

/// Every tenant's window.
#[derive(Debug, Default)]
pub struct RateLimits {
    windows: Mutex<HashMap<TenantId, Window>>,
}

impl RateLimits {
    /// Admits a request of `tenant` estimated at `tokens` at second `now` (and counts it),
    /// or says which limit refuses it and for how long. A request larger than the whole
    /// token limit is admitted when the window is empty.
    pub fn admit(&self, tenant: &Tenant, tokens: u64, now: u64) -> Verdict {
        let (rpm, tpm) = (tenant.requests_per_minute, tenant.tokens_per_minute);
        let mut windows = self.windows.lock();
        let window = (windows.entry(tenant.name.clone()))
            .or_insert_with(|| Window([Slot::default(); WINDOW as usize]));
        let live = window.live(now);
        let requests: u64 = live.iter().map(|s| s.requests).sum();
        let used: i64 = live.iter().map(|s| s.tokens).sum();
        let used = used.max(0) as u64;
        let by_requests = rpm > 0 && requests + 1 > rpm;
        let by_tokens = tpm > 0 && used > 0 && used + tokens > tpm;
        let reset = |limit: u64, amount: fn(&Slot) -> u64| {
            if limit == 0 {
                0
            } else {
                wait(
                    &live,
                    now,
                    live.iter().map(amount).sum(),
                    limit,
                    limit,
                    amount,
                )
            }
        };
        let request_count: fn(&Slot) -> u64 = |s| s.requests;
        let token_count: fn(&Slot) -> u64 = |s| s.tokens.max(0) as u64;
        let refused = match (by_requests, by_tokens) {
            (true, _) => Some(Limit::Requests),
            (false, true) => Some(Limit::Tokens),
            _ => None,
        };
        let retry_after = match refused {
            Some(Limit::Requests) => wait(&live, now, requests, 1, rpm, request_count),
            Some(Limit::Tokens) => wait(&live, now, used, tokens.min(tpm), tpm, token_count),
            None => 0,
        };
        let (after_requests, after_tokens) = match refused {
            None => (requests + 1, used + tokens),
            Some(_) => (requests, used),
        };
        let verdict = Verdict {
            refused,
            retry_after: retry_after.max(u64::from(refused.is_some())),
            requests: Headroom {
                limit: rpm,
                remaining: rpm.saturating_sub(after_requests),
                reset: reset(rpm, request_count),
            },
            tokens: Headroom {
                limit: tpm,
                remaining: tpm.saturating_sub(after_tokens),
                reset: reset(tpm, token_count),
            },
        };
        if refused.is_none() {
            let slot = window.slot(now);
            slot.requests += 1;
            slot.tokens += tokens as i64;
        }
        verdict
    }

    /// A request of `tenant` admitted at an estimate of `estimated` tokens really cost
    /// `actual`: the difference is counted at second `now`.
    pub fn settle(&self, tenant: &str, estimated: u64, actual: u64, now: u64) {
        if let Some(window) = self.windows.lock().get_mut(tenant) {
            window.slot(now).tokens += actual as i64 - estimated as i64;
        }
    }

    /// Forgets the tenants not in `names` (after a reload of the file).
    pub fn keep(&self, names: &[&str]) {
        self.windows
            .lock()
            .retain(|name, _| names.contains(&name.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenants::Priority;

    fn tenant(rpm: u64, tpm: u64) -> Tenant {
        Tenant {
            name: TenantId::new("acme"),
            weight: 1,
            tokens_per_minute: tpm,
            requests_per_minute: rpm,
            max_priority: Priority::Normal,
            standing_slots: 0,
            engine_priority: true,
        }
    }

    #[test]
    fn requests_per_minute_hold_over_a_sliding_minute() {
        let limits = RateLimits::default();
        let t = tenant(3, 0);
        for now in [0, 10, 20] {
            assert_eq!(limits.admit(&t, 0, now).refused, None);
        }
        let refused = limits.admit(&t, 0, 30);
        assert_eq!(refused.refused, Some(Limit::Requests));
        assert_eq!(
            refused.retry_after, 30,
            "the request at 0 leaves the window at 60"
        );
        assert_eq!(refused.requests.remaining, 0);
        assert_eq!(limits.admit(&t, 0, 60).refused, None);
    }

    #[test]
    fn tokens_count_the_estimate_then_what_the_answer_reported() {
        let limits = RateLimits::default();
        let t = tenant(0, 1000);
        let first = limits.admit(&t, 400, 0);
        assert_eq!((first.refused, first.tokens.remaining), (None, 600));
        limits.settle("acme", 400, 700, 1);
        let refused = limits.admit(&t, 400, 2);
        assert_eq!(refused.refused, Some(Limit::Tokens));
        assert_eq!(
            refused.retry_after, 58,
            "the estimate's slot at 0 leaves at 60"
        );
        assert_eq!(limits.admit(&t, 400, 60).refused, None);
    }

    #[test]
    fn over_a_minute_a_tenant_is_served_its_limit_not_twice_it() {
        let limits = RateLimits::default();
        let t = tenant(0, 10_000);
        let served: u64 = (0..60)
            .flat_map(|second| std::iter::repeat_n(second, 10))
            .filter(|now| limits.admit(&t, 300, *now).refused.is_none())
            .map(|_| 300)
            .sum();
        assert!(served <= 10_000 + 300, "{served}");
        assert!(served >= 9_600, "{served}");
    }

    #[test]
    fn a_request_larger_than_the_limit_passes_alone() {
        let limits = RateLimits::default();
        assert_eq!(limits.admit(&tenant(0, 100), 500, 0).refused, None);
        assert_eq!(
            limits.admit(&tenant(0, 100), 1, 1).refused,
            Some(Limit::Tokens)
        );
    }
}
