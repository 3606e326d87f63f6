//! The placement ledger: what the router knows of each backend from its own placements,
//! kept the same way wherever placement happens (the proxy in real time, the lab in
//! virtual time).
//!
//! Per backend an [`Account`], made of its parts: its load (requests in flight, their
//! pending prefill and prompt tokens), what it published (KV capacity, block size,
//! running and waiting), its hold (requests it takes before more wait in the router), its
//! reserve (slots and KV kept for the requests flow control keeps them for) and its KV
//! guard (backends kept for light flows' conversations). A [`Seat`] is one placed
//! request: it counts from [`place`] until it drops, its prefill until
//! [`Seat::answered`]. [`UpkeepSchedule`] runs the selector's index and tables' upkeep on its
//! schedule.
//!
//! Synchronous and lock-free on the request path (atomics), but for a light flow's
//! request where a tenants file is set (a lock per backend: [`protect_kv`]); no I/O, no
//! clock of its own.

mod account;
mod cap;
mod hold;
mod kv_guard;
mod load;
mod place;
mod publication;
mod reserve;
mod seat;
mod steer;
mod upkeep;

pub use account::{Account, Room};
pub use cap::{Cap, Claim, Kept};
pub use hold::share_holds;
pub use kv_guard::{HOME_READS, protect_kv};
pub use place::{Placing, decide, open, place, unbounded};
pub use reserve::{BANDS, KEPT_READS};
pub use seat::{Report, Seat};
pub use upkeep::{EVICTION_INTERVAL, UpkeepSchedule};

#[cfg(test)]
mod tests;
