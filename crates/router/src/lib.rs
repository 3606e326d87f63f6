//! prefix-router on Pingora: configuration ([`config`], parsed once into each part's
//! settings; what a reload may change is one [`limits::LiveLimits`] snapshot), the backends
//! and their health ([`fleet`]), what holds requests back ([`admission`]), the proxy and
//! its transport ([`proxy`]), the endpoint picker of an Envoy gateway in its place
//! ([`epp`]), metrics ([`stats`]), the admin listener ([`admin`]), runtime changes
//! ([`control`]), token mode ([`tokens`]) and the serving layer ([`serve`]: assembly,
//! upkeep, lifecycle). Routing decisions and placement bookkeeping come from
//! `prefix-router-core`.
#![deny(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod config;
pub mod control;
pub mod endpoints;
pub mod epp;
pub mod error;
pub mod fleet;
pub mod kv_events;
pub mod limits;
pub mod proxy;
pub mod replication;
pub mod responses;
pub mod serve;
pub mod state;
pub mod stats;
pub mod tenants;
pub mod tls;
pub mod tokens;
pub mod traces;
