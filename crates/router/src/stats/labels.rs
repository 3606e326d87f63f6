//! The closed label sets of the router's own metrics.

use super::label_set;

label_set! {
    /// Why an attempt was retried.
    pub enum RetryReason {
        /// The request never reached the backend.
        ConnectFailure => "connect_failure",
        /// The backend answered nothing: closed or timed out before a response head.
        Reset => "reset",
        /// The backend answered 5xx.
        Status => "5xx",
    }
}

label_set! {
    /// How a config reload went.
    pub(super) enum Reload {
        /// Applied.
        Ok => "ok",
        /// Refused.
        Failed => "failed",
    }
}

label_set! {
    /// How a chat or completions request of a disaggregated fleet went.
    pub enum Split {
        /// In two legs: prefilled on a prefill instance, decoded on a decode instance.
        Legs => "split",
        /// Whole, to a decode instance that lacked at most `max_local_prefill_length` of
        /// its prompt tokens.
        Local => "local",
    }
}
