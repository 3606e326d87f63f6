//! prefix-router: a reverse proxy for LLM inference fleets that sends each request to the
//! backend most likely to hold its prompt prefix in KV cache, without overloading any.
#![deny(unsafe_code)]

pub mod admin;
pub mod config;
pub mod control;
#[cfg(test)]
mod copies;
pub mod demo;
pub mod error;
pub mod fleet;
pub mod lifecycle;
pub mod notify;
pub mod policy;
pub mod proxy;
pub mod replay;
pub mod request;
pub mod server;
pub mod sim;
pub mod stats;
pub mod tree;

/// Stable small integer naming one backend for the router's lifetime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendId(pub u32);
