//! Integration tests: one binary (every test binary re-links Pingora), real router, real
//! backends, real HTTP on loopback.

mod support;

mod agents;

mod bodies;
mod corpus;
mod demo;
mod disaggregation;
mod engine_priority;
mod epp;
mod errors;
mod faults;
mod health;
mod holds;
mod kv_events;
mod lab;
mod messages;
mod models;
mod ops;
mod outliers;
mod overload;
mod replay;
mod replicas;
mod responses;
mod routing;
mod security;
mod sim;
mod sim_events;
mod soak;
mod streaming;
mod tenants;
mod tls;
mod tokens;
mod traces;
mod upgrade;
mod vllm;
