//! The router's core: what a request offers routing ([`request`]: routing text, session key,
//! model), which backend was sent which prefix ([`tree`]), and who decides ([`policy`]: one
//! trait, a file per policy, session affinity on top).
//!
//! Pure and synchronous: no sockets, no async runtime, no clocks but the one a caller passes
//! in. The router crate runs it behind Pingora; the lab runs it in virtual time. Each part
//! owns its settings type ([`policy::Balance`], [`tree::TreeConfig`]) with its defaults.
#![deny(unsafe_code)]

pub mod clock;
#[cfg(test)]
mod copies;
pub mod policy;
pub mod request;
pub mod tree;

/// Bytes of routing text per token of a backend's KV cache, to size the index and weigh
/// capacities in the routing text's unit (measured 3.98-4.13 on the lab's workloads:
/// routing text bytes routed over prompt tokens the backends reported).
pub const TEXT_BYTES_PER_TOKEN: usize = 4;

/// Stable small integer naming one backend for the router's lifetime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendId(pub u32);
