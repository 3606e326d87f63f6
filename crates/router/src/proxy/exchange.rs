//! One attempt to have a backend answer a request, as the dispatch loop sees it: send the
//! request and wait for the backend's response head, or learn that the client left. The
//! transport ([`Upstream`](super::relay::Upstream)) is the real one; the dispatch loop's
//! unit tests drive the loop with a fake.

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::error::RouterError;
use crate::fleet::{Backend, Ended, Leg};

/// Where an attempt failed, which decides whether another backend may be tried.
#[derive(Debug)]
pub enum Failure {
    /// Nothing reached the backend, or a reused connection failed before any answer (the
    /// backend had closed it): always safe to try another backend (`connect-failure`).
    Unsent(RouterError),
    /// The request was sent and the backend answered nothing: the connection closed or
    /// timed out before a response head. Another backend may be tried when the request
    /// can be replayed (`reset`).
    Unanswered(RouterError),
    /// The client has part of the response, or left.
    Final(RouterError),
    /// Stopped before its answer by a request that outranks it
    /// ([`crate::tenants::preempt`]): placed again once a slot opens.
    Preempted,
}

impl Failure {
    /// The error, whichever kind.
    pub fn error(&self) -> &RouterError {
        match self {
            Failure::Unsent(e) | Failure::Unanswered(e) | Failure::Final(e) => e,
            Failure::Preempted => &RouterError::Preempted,
        }
    }

    /// The error, whichever kind.
    pub fn into_error(self) -> RouterError {
        match self {
            Failure::Unsent(e) | Failure::Unanswered(e) | Failure::Final(e) => e,
            Failure::Preempted => RouterError::Preempted,
        }
    }
}

/// A request that can be sent to backends until one answers.
#[async_trait]
pub trait Exchange: Send {
    /// A backend's answer: its response head, ready to be relayed.
    type Answer: Send;

    /// Sends the request to `backend` and waits for its final response head; with a
    /// `stop` signal, also for the first body byte of a success, and fails with
    /// [`Failure::Preempted`] when `stop` is notified first.
    async fn send(
        &mut self,
        backend: &Backend,
        stop: Option<&Notify>,
    ) -> Result<Self::Answer, Failure>;

    /// Resolves when the client has gone away (never, while it stays).
    async fn client_gone(&mut self) -> RouterError;

    /// Whether the request has no effect a second attempt could repeat (the routed
    /// inference endpoints, GET and HEAD): only then is an answered-nothing or a 5xx
    /// attempt tried again.
    fn replayable(&self) -> bool;

    /// What an answer says of its backend's health, from its status.
    fn ended(answer: &Self::Answer) -> Ended;

    /// The leg of a request it carries: only backends whose role serves it are tried.
    fn leg(&self) -> Leg {
        Leg::Whole
    }

    /// The addresses the request may go to, when the front end narrows the fleet (an
    /// Envoy gateway's subset hint); `None`: any backend.
    fn subset(&self) -> Option<Arc<[SocketAddr]>> {
        None
    }
}
