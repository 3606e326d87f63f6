//! The serving layer: assembles the Pingora server (the proxy on the data-plane listener,
//! [`admin`] on its own listener, the health checks, the [`upkeep`] of the prefix index, the
//! reload [`control`] triggers, systemd [`notify`]), and runs it, either as the process
//! ([`lifecycle`]) or on threads of its own inside another program ([`embedded`]).

pub mod admin;
pub mod control;
pub mod embedded;
pub mod lifecycle;
pub mod notify;
mod upkeep;

use std::path::PathBuf;
use std::sync::Arc;

use pingora_core::server::Server;
use pingora_core::server::configuration::{Opt, ServerConf};
use pingora_core::services::background::background_service;
use pingora_core::services::listening::Service;
use prefix_router_core::clock::{Clock, Monotonic};
use prefix_router_core::policy::{PolicyParams, Selector, SharedTunables};

use crate::config::{Config, Settings};
use crate::fleet::{Discovery, Fleet, HealthChecks};
use crate::proxy::{Budget, Router};
use crate::state::State;
use crate::stats::Stats;
use admin::Admin;
use control::{Control, Triggers};
use notify::Readiness;
use upkeep::Upkeep;

/// The running parts, for callers that need to look inside (tests, admin).
pub struct Handles {
    /// Shared request state.
    pub state: Arc<State>,
    /// Reloads and worker changes.
    pub control: Arc<Control>,
}

/// Where the configuration came from, so that it can be read again on reload.
#[derive(Clone, Debug, Default)]
pub struct Source {
    /// The config file, if any.
    pub file: Option<PathBuf>,
    /// Flags laid over the file.
    pub flags: Settings,
}

/// Builds the server for `config` read from `source`; `opt` carries Pingora's own flags
/// (upgrade).
pub fn build(config: &Config, source: Source, opt: Option<Opt>) -> (Server, Handles) {
    let mut server = Server::new_with_opt_and_conf(opt, server_conf(config));
    server.bootstrap();
    let fleet = Arc::new(Fleet::new(config.connect_timeout));
    let discovery = Arc::new(Discovery::new(Arc::clone(&fleet), config.workers.clone()));
    discovery.publish_blocking();
    let upkeep = Upkeep::new(config.eviction_interval);
    let state = Arc::new(State::new(
        Arc::clone(&fleet),
        selector(config, &upkeep),
        config.policy.name,
        config.limits.clone(),
        Budget::new(config.max_buffered_bytes),
        Arc::new(Stats::new()),
    ));
    let mut proxy =
        pingora_proxy::http_proxy_service(&server.configuration, Router::new(Arc::clone(&state)));
    proxy.add_tcp(&config.listen);
    let health = background_service("health", HealthChecks::new(config.health.clone(), fleet));
    let control = Arc::new(Control::new(
        config.clone(),
        source,
        discovery,
        health.task(),
        Arc::clone(&state),
    ));
    let mut admin = Service::new(
        "admin".to_string(),
        Admin::new(
            Arc::clone(&state),
            Arc::clone(&control),
            config.admin_token.clone(),
        ),
    );
    admin.add_tcp(&config.admin_listen);
    server.add_service(proxy);
    server.add_service(admin);
    server.add_service(health);
    server.add_service(background_service("upkeep", upkeep.run(Arc::clone(&state))));
    server.add_service(background_service("reload", Triggers(Arc::clone(&control))));
    let listeners = vec![config.listen.clone(), config.admin_listen.clone()];
    server.add_service(background_service("notify", Readiness { listeners }));
    (server, Handles { state, control })
}

fn server_conf(config: &Config) -> ServerConf {
    let mut conf = ServerConf {
        threads: config.threads,
        grace_period_seconds: Some(config.grace_period.as_secs()),
        graceful_shutdown_timeout_seconds: Some(config.shutdown_timeout.as_secs()),
        upgrade_sock: config.upgrade_socket.clone(),
        ..ServerConf::default()
    };
    conf.upstream_keepalive_pool_size = 1024;
    conf
}

fn selector(config: &Config, upkeep: &Upkeep) -> Selector {
    let clock: Arc<dyn Clock> = Arc::new(Monotonic::default());
    let params = PolicyParams {
        tunables: SharedTunables::new(config.tunables),
        tree: config.tree.clone(),
        seed: seed(),
        clock: Arc::clone(&clock),
        calibrate: true,
    };
    let policy = config.policy.build(&params);
    let wake = upkeep.waker();
    Selector::with_clock(policy, params.tunables, config.session_ttl, clock)
        .on_upkeep_due(move || wake.notify_one())
}

/// A seed that differs between router processes, so replicas do not break ties in step.
fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}
