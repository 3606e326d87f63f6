//! Flow control's bookkeeping, shared by the router and the lab: the tenants' and
//! priorities' fair shares of the fleet and the reserve kept for light flows
//! ([`share`]), the requests a request outranking them may stop before their answer
//! ([`preempt`]), the order of the router's queue ([`order`]), and where a request the
//! reserve is kept for stays when its home is full ([`home`]), and what an engine queues
//! past its hold, taken back to the router's queue ([`excess`]); and one request's way
//! through all of it, the same for every front end ([`gate`]). Time comes from a
//! [`crate::clock::Clock`]; waking and stopping are the caller's (the router's tasks, the
//! lab's events).

pub mod excess;
pub mod gate;
pub mod home;
pub mod order;
pub mod preempt;
pub mod share;
pub mod tenant;

pub use excess::{after_read, take_back};
pub use gate::{FlowControl, Gate, NO_FLOW_CONTROL, NoFlowControl, Wait, placed};
pub use home::{AtHome, at_home, make_room};
pub use order::{Bounds, Key, Order, Shed};
pub use preempt::{Claimant, Preemptions, Stoppable, Stopped, Victims};
pub use share::{ACTIVE_AFTER, Share, Shares};
pub use tenant::TenantId;

/// A request's priority (`x-priority`), lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Shed first, served last.
    Low,
    /// The default.
    Normal,
    /// Served first.
    High,
}

impl Priority {
    /// Every priority, lowest first.
    pub const ALL: [Priority; 3] = [Priority::Low, Priority::Normal, Priority::High];

    /// The priority an `x-priority` value (or a tenants file's `max_priority`) names.
    pub fn parse(value: &[u8]) -> Option<Priority> {
        match value.trim_ascii() {
            b"high" => Some(Priority::High),
            b"normal" => Some(Priority::Normal),
            b"low" => Some(Priority::Low),
            _ => None,
        }
    }

    /// Its value as vLLM's request `priority` (lower first; 0 is vLLM's default): `high`
    /// -1, `normal` 0, `low` 1.
    pub fn vllm(self) -> i64 {
        match self {
            Priority::Low => 1,
            Priority::Normal => 0,
            Priority::High => -1,
        }
    }

    /// Its name in headers, files and metric labels.
    pub fn label(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
        }
    }
}
