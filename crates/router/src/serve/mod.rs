//! The serving layer: assembles the Pingora server (the proxy on the data-plane listener,
//! the admin listener, the health checks, the reading of backends' metrics, the [`upkeep`]
//! of the policy's index and tables,
//! the reload triggers, systemd [`notify`]), and runs it, either as the process
//! ([`lifecycle`]) or on threads of its own inside another program ([`embedded`]).

pub mod embedded;
pub mod lifecycle;
pub mod notify;
mod upkeep;

use std::sync::Arc;

use pingora_core::server::Server;
use pingora_core::server::configuration::{Opt, ServerConf};
use pingora_core::services::background::background_service;
use pingora_core::services::listening::Service;
use prefix_router_core::clock::{Clock, Monotonic};
use prefix_router_core::ledger::Ledger;
use prefix_router_core::policy::{Conversations, PolicyParams, Selector};

use crate::admin::Admin;
use crate::config::{Config, Source};
use crate::control::{Control, Triggers};
use crate::fleet::{Discovery, Fleet, HealthChecks, MetricsReader};
use crate::kv_events::Subscribers;
use crate::limits::Current;
use crate::proxy::Router;
use crate::replication::Replication;
use crate::state::{Parts, State};
use crate::stats::Stats;
use crate::tokens::Tokenizers;
use crate::traces::{TraceError, Tracing};
use notify::Readiness;
use prefix_router_tokens::ModelError;
use upkeep::Upkeep;

/// The running parts, for callers that need to look inside (tests, admin).
pub struct Handles {
    /// Shared request state.
    pub state: Arc<State>,
    /// Reloads and worker changes.
    pub control: Arc<Control>,
}

/// Why a checked configuration cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A tokenizer directory cannot be loaded.
    #[error(transparent)]
    Tokenizer(#[from] ModelError),
    /// Traces cannot be exported as configured.
    #[error(transparent)]
    Traces(#[from] TraceError),
}

/// Builds the server for `config` read from `source`; `opt` carries Pingora's own flags
/// (upgrade). Fails on a tokenizer directory that cannot be loaded, or a trace exporter
/// that cannot be built.
pub fn build(
    config: &Config,
    source: Source,
    opt: Option<Opt>,
) -> Result<(Server, Handles), BuildError> {
    let tokenizers = Tokenizers::load(&config.tokens)?;
    let stats = Arc::new(Stats::new());
    let tracing = Tracing::start(&config.traces, stats.trace_counts())?;
    let mut server = Server::new_with_opt_and_conf(opt, server_conf(config));
    server.bootstrap();
    let fleet = Arc::new(Fleet::new());
    let discovery = Arc::new(Discovery::new(Arc::clone(&fleet), config.workers.clone()));
    discovery.publish_blocking(config.live.limits.exchange.connect);
    let upkeep = Upkeep::default();
    let live = Current::new(config.live.clone());
    let params = params(config, &live);
    let state = Arc::new(State::new(Parts {
        fleet: Arc::clone(&fleet),
        selector: selector(config, &params, &upkeep),
        policy_name: config.policy.name,
        ledger: Ledger::new(config.eviction_interval),
        live,
        stats,
        tokenizers,
        tracing,
    }));
    let mut proxy =
        pingora_proxy::http_proxy_service(&server.configuration, Router::new(Arc::clone(&state)));
    proxy.add_tcp(&config.listen);
    let reader = MetricsReader::new(config.metrics.clone(), Arc::clone(&fleet));
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
    server.add_service(background_service("metrics", reader));
    if let (Some(shared), Some(conversations)) = (&config.shared_table, &params.conversations) {
        let replication = Replication::new(
            shared.clone(),
            Arc::clone(conversations),
            Arc::clone(&state.fleet),
            Arc::clone(&state.stats),
            params.seed,
        );
        server.add_service(background_service("shared table", replication));
    }
    if config.kv_events.endpoint.is_some() {
        let subscribers = Subscribers::new(
            config.kv_events.clone(),
            Arc::clone(&state.fleet),
            Arc::clone(&state.records),
        );
        server.add_service(background_service("kv events", subscribers));
    }
    server.add_service(background_service("upkeep", upkeep.run(Arc::clone(&state))));
    server.add_service(background_service("reload", Triggers(Arc::clone(&control))));
    let listeners = vec![config.listen.clone(), config.admin_listen.clone()];
    server.add_service(background_service("notify", Readiness { listeners }));
    Ok((server, Handles { state, control }))
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

/// What the policy is built from; with a shared table, its conversation table is the one
/// replication keeps in step with the other replicas.
fn params(config: &Config, live: &Current) -> PolicyParams {
    let clock: Arc<dyn Clock> = Arc::new(Monotonic::default());
    let shared = config.shared_table.is_some();
    PolicyParams {
        tunables: live.tunables(),
        tree: config.tree.clone(),
        seed: seed(),
        conversations: shared.then(|| Arc::new(Conversations::new(Arc::clone(&clock)))),
        clock,
        calibrate: true,
        session_ttl: config.session_ttl,
    }
}

fn selector(config: &Config, params: &PolicyParams, upkeep: &Upkeep) -> Selector {
    let wake = upkeep.waker();
    (config.policy.build(params)).on_upkeep_due(move || wake.notify_one())
}

/// A seed that differs between router processes, so replicas do not break ties in step.
fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}
