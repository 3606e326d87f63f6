//! Fair shares of the fleet among tenants and priorities, kept so that a light tenant or
//! a higher priority finds room at once: a tenant's share of the requests the router
//! holds (in flight or waiting) is its weight over the weights of the active tenants.
//! While some active tenant is below its share, or a priority is active, a tenant at or
//! over its own share, and every lower priority, keeps a reserve of each held backend
//! free (an eighth of its slots, at least one: [`Cap`]); the requests it is kept for pass
//! the router's queue when a slot is open for them. The reserve is kept under what a
//! backend ran when it last queued: a hold that grew since is probing for room. A backend
//! with no learned hold has room, and no reserve.
//!
//! Without a reserve a light tenant's request waits for the next slot to free anywhere,
//! and then takes it wherever it freed, usually away from its cached prefix. A tenant is
//! active from its first request until a while after its last one ended
//! ([`Shares::set_active_after`], [`ACTIVE_AFTER`] by default), so the reserve outlives an
//! agent's pause between turns; so is a priority. Tenants come only from the tenants
//! file, so the table is bounded by it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;
use smallvec::SmallVec;

use super::preempt::Preemptions;
use super::{Priority, TenantId};
use crate::clock::{Clock, Monotonic};
use crate::ledger::{Cap, Claim, Kept};

/// How long a tenant counts as active after its last request ended, by default (the
/// tenants file's `active_after`).
pub const ACTIVE_AFTER: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct HeldFlow {
    weight: u32,
    held: usize,
    /// When its last request ended (or its first arrived), by the shares' clock.
    last: Duration,
}

impl HeldFlow {
    fn new(weight: u32, now: Duration) -> Self {
        HeldFlow {
            weight,
            held: 0,
            last: now,
        }
    }

    fn active(&self, now: Duration, after: Duration) -> bool {
        self.held > 0 || now.saturating_sub(self.last) < after
    }

    fn left(&mut self, now: Duration) {
        self.held = self.held.saturating_sub(1);
        self.last = now;
    }
}

#[derive(Debug, Default)]
struct HeldFlows {
    tenants: HashMap<TenantId, HeldFlow>,
    /// By priority, lowest first; never idle until first used.
    bands: [Option<HeldFlow>; 3],
}

/// Where a request stands against the other active flows.
#[derive(Debug, Default)]
struct Standing {
    /// Its tenant is below its share, and another tenant is active.
    light: bool,
    /// Another tenant is below its share.
    other_light: bool,
    /// A higher priority is active.
    higher: bool,
    /// A lower priority is active.
    lower: bool,
}

impl Standing {
    /// Whether the reserve is kept for it: no higher priority is active, and its tenant
    /// is below its share or a lower priority is active.
    fn kept_for(&self) -> bool {
        !self.higher && (self.light || self.lower)
    }

    /// What it may take under the in-flight `limit`, leaving `standing` slots: kept for
    /// only against a lower priority while a higher one may still arrive, it leaves
    /// them too; a light flow's (its tenant below its share, or `high`) leaves none.
    fn cap(&self, limit: usize, standing: usize, priority: Priority) -> Cap {
        let claim = if self.kept_for() {
            let light = self.light || priority == Priority::High;
            Claim::Kept(Kept {
                band: priority as usize,
                standing: if light { 0 } else { standing },
                light: light.then_some(0),
                home: false,
            })
        } else if self.higher || self.other_light {
            Claim::Leaves
        } else {
            Claim::Open { standing }
        };
        Cap {
            limit,
            claim,
            ..Cap::default()
        }
    }
}

/// The tenants' and priorities' requests held by the router.
pub struct Shares {
    flows: Mutex<HeldFlows>,
    /// The requests in flight that a request outranking them may stop.
    pub(super) preemptions: Preemptions,
    clock: Arc<dyn Clock>,
    /// How long a flow counts as active after its last request ended, in nanoseconds.
    active_after: AtomicU64,
}

impl Default for Shares {
    /// Shares on the process's monotonic clock.
    fn default() -> Self {
        Shares::new(Arc::new(Monotonic::default()))
    }
}

impl std::fmt::Debug for Shares {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shares")
            .field("flows", &self.flows)
            .finish()
    }
}

impl Shares {
    /// Shares whose flows count as active by `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Shares {
            flows: Mutex::default(),
            preemptions: Preemptions::default(),
            clock,
            active_after: AtomicU64::new(nanos(ACTIVE_AFTER)),
        }
    }

    /// Counts a tenant (and a priority) as active for `after` past its last request's
    /// end, from now on.
    pub fn set_active_after(&self, after: Duration) {
        self.active_after.store(nanos(after), Relaxed);
    }

    fn active_after(&self) -> Duration {
        Duration::from_nanos(self.active_after.load(Relaxed))
    }

    /// Counts a request of `tenant` (of `weight`) at `priority` until the returned share
    /// drops.
    pub fn enter(&self, tenant: &TenantId, weight: u32, priority: Priority) -> Share<'_> {
        let (now, after) = (self.clock.now(), self.active_after());
        let mut flows = self.flows.lock();
        (flows.tenants).retain(|name, f| name == tenant || f.active(now, after));
        let flow = (flows.tenants)
            .entry(tenant.clone())
            .or_insert(HeldFlow::new(weight, now));
        flow.weight = weight.max(1);
        flow.held += 1;
        let band = flows.bands[priority as usize].get_or_insert(HeldFlow::new(1, now));
        band.held += 1;
        Share {
            shares: self,
            tenant: tenant.clone(),
            priority,
        }
    }

    /// Where a request of `tenant` at `priority` stands; `arriving` (its tenant's
    /// weight) when it is not counted yet, weighed as if it were.
    fn standing(&self, tenant: &str, priority: Priority, arriving: Option<u32>) -> Standing {
        let (now, after) = (self.clock.now(), self.active_after());
        let flows = self.flows.lock();
        let mut active: SmallVec<[(&str, u64, u64); 8]> = (flows.tenants.iter())
            .filter(|(_, f)| f.active(now, after))
            .map(|(name, f)| (&**name, u64::from(f.weight), f.held as u64))
            .collect();
        if let Some(weight) = arriving {
            match active.iter_mut().find(|(name, ..)| *name == tenant) {
                Some((_, _, held)) => *held += 1,
                None => active.push((tenant, u64::from(weight.max(1)), 1)),
            }
        }
        let weights: u64 = active.iter().map(|&(_, w, _)| w).sum();
        let held: u64 = active.iter().map(|&(_, _, h)| h).sum();
        let below = |(_, w, h): (&str, u64, u64)| h * weights < held * w;
        let band_active =
            |i: usize| (flows.bands[i].as_ref()).is_some_and(|f| f.active(now, after));
        let mine = priority as usize;
        let mut standing = Standing {
            higher: (mine + 1..flows.bands.len()).any(band_active),
            lower: (0..mine).any(band_active),
            ..Standing::default()
        };
        for &flow in &active {
            if flow.0 == tenant {
                standing.light = below(flow);
            } else {
                standing.other_light |= below(flow);
            }
        }
        standing
    }

    /// Requests held now (in flight or waiting) at priorities below `priority`.
    pub(super) fn held_below(&self, priority: Priority) -> usize {
        let flows = self.flows.lock();
        let below = &flows.bands[..priority as usize];
        below.iter().flatten().map(|band| band.held).sum()
    }

    /// Each known tenant's requests held now (in flight or waiting).
    pub fn held(&self) -> Vec<(TenantId, usize)> {
        let flows = self.flows.lock();
        (flows.tenants.iter())
            .map(|(name, f)| (name.clone(), f.held))
            .collect()
    }

    /// Whether the reserve is kept for a request of `tenant` at `priority`: no higher
    /// priority is active, and its tenant is below its share or a lower priority is
    /// active.
    pub fn light(&self, tenant: &str, priority: Priority) -> bool {
        self.standing(tenant, priority, None).kept_for()
    }

    /// What a request of `tenant` at `priority` may take of a backend under the in-flight
    /// `limit`: less the reserve while it is not [`Self::light`] and a higher priority or
    /// another tenant below its share is active, else less `standing` slots (the file's
    /// `standing_slots`); counted among those the reserve is kept for while it is.
    pub fn cap(&self, tenant: &str, priority: Priority, limit: usize, standing: usize) -> Cap {
        self.standing(tenant, priority, None)
            .cap(limit, standing, priority)
    }

    /// [`Self::cap`] for a request of `tenant` (of `weight`) not counted yet, as if it
    /// were (`POST /route`).
    pub fn cap_arriving(
        &self,
        tenant: &str,
        weight: u32,
        priority: Priority,
        limit: usize,
        standing: usize,
    ) -> Cap {
        (self.standing(tenant, priority, Some(weight))).cap(limit, standing, priority)
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// A request counted in its tenant's share and its priority; dropping it ends the count.
#[derive(Debug)]
pub struct Share<'s> {
    shares: &'s Shares,
    tenant: TenantId,
    priority: Priority,
}

impl Drop for Share<'_> {
    fn drop(&mut self) {
        let now = self.shares.clock.now();
        let mut flows = self.shares.flows.lock();
        if let Some(flow) = flows.tenants.get_mut(&self.tenant) {
            flow.left(now);
        }
        if let Some(band) = &mut flows.bands[self.priority as usize] {
            band.left(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::{FlowControl, order::QueueTicket};

    #[test]
    fn a_tenant_over_its_share_keeps_a_slot_for_one_below() {
        let shares = Shares::default();
        let _a: Vec<_> = (0..6)
            .map(|_| shares.enter(&TenantId::new("a"), 1, Priority::Normal))
            .collect();
        assert_eq!(
            shares.cap("a", Priority::Normal, 0, 0),
            Cap::default(),
            "alone, no reserve"
        );
        assert!(!shares.light("a", Priority::Normal));
        assert_eq!(shares.cap("a", Priority::Normal, 0, 1).standing(), 1);
        assert!(
            !shares.cap("b", Priority::Normal, 0, 0).kept(),
            "b is not active"
        );
        assert!(
            shares.cap_arriving("b", 1, Priority::Normal, 0, 0).kept(),
            "as if its request had arrived"
        );
        assert!(!shares.cap_arriving("a", 1, Priority::Normal, 0, 0).kept());
        let b = shares.enter(&TenantId::new("b"), 1, Priority::Normal);
        assert!(
            shares.light("b", Priority::Normal),
            "1 of 7 held, below half"
        );
        assert!(!shares.cap("b", Priority::Normal, 0, 0).leaves());
        assert!(shares.cap("b", Priority::Normal, 0, 0).kept());
        assert_eq!(
            shares.cap("b", Priority::Normal, 0, 1).standing(),
            0,
            "kept for"
        );
        assert!(shares.cap("a", Priority::Normal, 0, 0).leaves());
        drop(b);
        assert!(
            shares.cap("a", Priority::Normal, 0, 0).leaves(),
            "b stays active between its requests"
        );
    }

    #[test]
    fn weights_set_the_share() {
        let shares = Shares::default();
        let a: Vec<_> = (0..3)
            .map(|_| shares.enter(&TenantId::new("a"), 1, Priority::Normal))
            .collect();
        let _b: Vec<_> = (0..5)
            .map(|_| shares.enter(&TenantId::new("b"), 3, Priority::Normal))
            .collect();
        assert!(
            shares.light("b", Priority::Normal),
            "5 of 8 is below three quarters"
        );
        assert!(shares.cap("a", Priority::Normal, 0, 0).leaves());
        drop(a);
        assert!(!shares.light("b", Priority::Normal));
    }

    #[test]
    fn a_lower_priority_keeps_a_slot_for_a_higher_one() {
        let shares = Shares::default();
        let _normal: Vec<_> = (0..6)
            .map(|_| shares.enter(&TenantId::new("a"), 1, Priority::Normal))
            .collect();
        assert!(!shares.cap("a", Priority::Normal, 0, 0).leaves());
        let _high = shares.enter(&TenantId::new("a"), 1, Priority::High);
        assert!(shares.light("a", Priority::High));
        assert!(!shares.cap("a", Priority::High, 0, 0).leaves());
        assert!(!shares.light("a", Priority::Normal));
        assert!(shares.cap("a", Priority::Normal, 0, 0).leaves());
        let _low = shares.enter(&TenantId::new("a"), 1, Priority::Low);
        assert!(shares.cap("a", Priority::Low, 0, 0).leaves());
        let ticket = |priority| QueueTicket {
            priority,
            ..QueueTicket::default()
        };
        let past = |priority| FlowControl::past_bound(&shares, &ticket(priority), 4);
        assert_eq!(past(Priority::High), 11, "7 below, none to stop");
        assert_eq!(past(Priority::Normal), 4, "high only");
        assert_eq!(past(Priority::Low), 4);
        assert!(
            shares.cap("a", Priority::High, 0, 0).light(),
            "the KV kept for light flows is kept for high"
        );
        assert!(!shares.cap("a", Priority::Normal, 0, 0).light());
    }

    #[test]
    fn standing_slots_are_left_for_a_higher_priority_not_yet_active() {
        let shares = Shares::default();
        let _low = shares.enter(&TenantId::new("a"), 1, Priority::Low);
        let _normal = shares.enter(&TenantId::new("a"), 1, Priority::Normal);
        let normal = shares.cap("a", Priority::Normal, 0, 1);
        assert!(normal.kept(), "kept against low");
        assert_eq!(normal.standing(), 1, "and still leaves a slot for high");
        assert_eq!(shares.cap("a", Priority::High, 0, 1).standing(), 0);
        let _b = shares.enter(&TenantId::new("b"), 1, Priority::Normal);
        let _more: Vec<_> = (0..4)
            .map(|_| shares.enter(&TenantId::new("a"), 1, Priority::Normal))
            .collect();
        assert!(shares.light("b", Priority::Normal));
        assert_eq!(
            shares.cap("b", Priority::Normal, 0, 1).standing(),
            0,
            "a light tenant takes the slots left for it"
        );
    }

    #[test]
    fn a_tenant_stays_active_for_the_time_set_after_its_last_request() {
        let clock = crate::clock::Manual::default();
        let shares = Shares::new(Arc::new(clock.clone()));
        let _heavy: Vec<_> = (0..6)
            .map(|_| shares.enter(&TenantId::new("a"), 1, Priority::Normal))
            .collect();
        drop(shares.enter(&TenantId::new("b"), 1, Priority::Normal));
        clock.set(ACTIVE_AFTER - Duration::from_millis(1));
        assert!(
            shares.cap("a", Priority::Normal, 0, 0).leaves(),
            "b is active"
        );
        clock.set(ACTIVE_AFTER);
        assert!(
            !shares.cap("a", Priority::Normal, 0, 0).leaves(),
            "b is idle"
        );
        shares.set_active_after(Duration::from_secs(30));
        assert!(
            shares.cap("a", Priority::Normal, 0, 0).leaves(),
            "active for 30 s"
        );
        clock.set(Duration::from_secs(30));
        assert!(!shares.cap("a", Priority::Normal, 0, 0).leaves());
    }
}
