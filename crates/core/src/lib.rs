//! The router's core: what a request offers routing ([`request`]: routing text, session key,
//! model), which backend was sent which prefix ([`index`], over the radix trees of
//! [`tree`]), who decides ([`policy`]: one trait, a file per policy, session affinity as a
//! wrapper), and the bookkeeping of every placement ([`ledger`]: load per backend, the
//! in-flight limit, the upkeep schedule). Sizes carry their [`units`].
//!
//! Pure and synchronous: no sockets, no async runtime, no clocks but the one a caller passes
//! in. The router crate runs it behind Pingora; the lab runs the same calls in virtual
//! time. Each part owns its settings type ([`policy::Balance`], [`tree::TreeConfig`]) with
//! its defaults.
#![deny(unsafe_code)]

pub mod clock;
#[cfg(test)]
mod copies;
pub mod density;
pub mod events;
pub mod flow;
pub mod index;
pub mod ledger;
pub mod policy;
pub mod request;
pub mod tree;
pub mod units;

/// Stable small integer naming one backend for the router's lifetime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendId(pub u32);
