//! prefix-router on Pingora: configuration ([`config`]), the backends and their health
//! ([`fleet`]), the proxy and its transport ([`proxy`]), metrics ([`stats`]) and the serving
//! layer ([`serve`]: server assembly, admin listener, runtime changes, lifecycle). Routing
//! decisions come from `prefix-router-core`.
#![deny(unsafe_code)]

pub mod config;
pub mod error;
pub mod fleet;
pub mod proxy;
pub mod serve;
pub mod state;
pub mod stats;
