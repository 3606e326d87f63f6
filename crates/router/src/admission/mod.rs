//! Holding requests back when the router or the fleet is full: the [`Budget`] of request
//! body bytes held (a body waits for room before it is read further), and the [`Queue`]
//! of requests waiting for a backend below its in-flight limit. Both are bounded in
//! length and in wait; what cannot wait is shed with 503 `overloaded` ([`ShedReason`]). The
//! [`RetryBudget`] holds retries back the same way.

pub mod budget;
mod metrics;
mod queue;
mod retry;

pub use budget::{Budget, Permit};
pub use metrics::{AdmissionMetrics, ShedReason};
pub use queue::{Bounds, Left, Place, Queue};
pub use retry::{RetryBudget, Retrying};
