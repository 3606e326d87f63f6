//! The closed label sets of the router's own metrics.

use super::Label;

/// Why an attempt was retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryReason {
    /// The request never reached the backend.
    ConnectFailure,
    /// The backend answered nothing: closed or timed out before a response head.
    Reset,
    /// The backend answered 5xx.
    Status,
}

impl Label for RetryReason {
    const ALL: &'static [Self] = &[
        RetryReason::ConnectFailure,
        RetryReason::Reset,
        RetryReason::Status,
    ];
    fn label(self) -> &'static str {
        match self {
            RetryReason::ConnectFailure => "connect_failure",
            RetryReason::Reset => "reset",
            RetryReason::Status => "5xx",
        }
    }
}

/// How a config reload went.
#[derive(Clone, Copy)]
pub(super) enum Reload {
    /// Applied.
    Ok,
    /// Refused.
    Failed,
}

impl Label for Reload {
    const ALL: &'static [Self] = &[Reload::Ok, Reload::Failed];
    fn label(self) -> &'static str {
        match self {
            Reload::Ok => "ok",
            Reload::Failed => "failed",
        }
    }
}
