//! One attempt to have a backend answer a request, as the dispatch loop sees it: send the
//! request and wait for the backend's response head, or learn that the client left. The
//! transport ([`Upstream`](super::relay::Upstream)) is the real one; the dispatch loop's
//! unit tests drive the loop with a fake.

use async_trait::async_trait;

use crate::error::RouterError;
use crate::fleet::Backend;

/// Where an attempt failed, which decides whether another backend may be tried.
#[derive(Debug)]
pub enum Failure {
    /// Nothing reached the backend, or a reused connection failed before any answer (the
    /// backend had closed it): safe to try another backend.
    Retryable(RouterError),
    /// The backend may have the request, or the client has part of the response.
    Final(RouterError),
}

impl Failure {
    /// The error, whichever kind.
    pub fn error(&self) -> &RouterError {
        match self {
            Failure::Retryable(e) | Failure::Final(e) => e,
        }
    }

    /// The error, whichever kind.
    pub fn into_error(self) -> RouterError {
        match self {
            Failure::Retryable(e) | Failure::Final(e) => e,
        }
    }
}

/// A request that can be sent to backends until one answers.
#[async_trait]
pub trait Exchange: Send {
    /// A backend's answer: its response head, ready to be relayed.
    type Answer: Send;

    /// Sends the request to `backend` and waits for its final response head. Once a head
    /// arrived no retry can need the request's body: the exchange drops it then.
    async fn send(&mut self, backend: &Backend) -> Result<Self::Answer, Failure>;

    /// Resolves when the client has gone away (never, while it stays).
    async fn client_gone(&mut self) -> RouterError;
}
