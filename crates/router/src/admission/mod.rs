//! Holding requests back when the router or the fleet is full: the [`Budget`] of request
//! body bytes held (a body waits for room before it is read further), and the [`Queue`]
//! of requests waiting for a backend below its in-flight limit. Both are bounded in
//! length and in wait; what cannot wait is shed with 503 `overloaded`.

pub mod budget;
mod queue;

pub use budget::{Budget, Permit};
pub use queue::{Place, Queue};
