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
use prefix_router_core::ledger::UpkeepSchedule;
use prefix_router_core::policy::{Conversations, PolicyParams, Selector};

use crate::admin::Admin;
use crate::admission::AdmissionMetrics;
use crate::config::{Config, Source};
use crate::control::{Control, Triggers};
use crate::epp::Epp;
use crate::fleet::{
    AfterRead, Discovery, Fleet, FleetGauges, HealthChecks, MetricsReader, Resolving,
};
use crate::kv_events::{KvEventMetrics, Records, Subscribers};
use crate::limits::Current;
use crate::proxy::Router;
use crate::replication::{Replication, ReplicationMetrics, Tables};
use crate::state::{Parts, State};
use crate::stats::{Registry, Stats};
use crate::tenants::Tenancy;
use crate::tls::{Certificate, Certificates, TlsError};
use crate::tokens::{TokenMetrics, Tokenizers};
use crate::traces::{Counts, TraceError, Tracing};
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
    /// A certificate, key or CA file cannot be used.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// Builds the server for `config` read from `source`; `opt` carries Pingora's own flags
/// (upgrade). Fails on a tokenizer directory that cannot be loaded, a trace exporter
/// that cannot be built, or TLS files that cannot be used.
pub fn build(
    config: &Config,
    source: Source,
    opt: Option<Opt>,
) -> Result<(Server, Handles), BuildError> {
    let metrics = PartMetrics::new(&Registry::new(), config.boot.policy.name);
    let tokenizers = Tokenizers::load(&config.boot.tokens, metrics.tokens)?;
    let tracing = Tracing::start(&config.boot.traces, metrics.traces)?;
    let mut server = Server::new_with_opt_and_conf(opt, server_conf(config));
    server.bootstrap();
    let fleet = Arc::new(Fleet::with_tls(config.boot.tls.upstream.clone()));
    let health = HealthChecks::new(config.boot.health.clone(), Arc::clone(&fleet));
    let health = background_service("health", health);
    let discovery = Discovery::new(Arc::clone(&fleet), config.workers.clone(), health.task());
    let discovery = Arc::new(discovery);
    discovery.publish_blocking(config.live.limits.exchange.connect);
    let upkeep = Upkeep::default();
    let live = Current::new(config.live.clone());
    let params = params(config, &live);
    let resolving = Resolving {
        discovery: Arc::clone(&discovery),
        settings: config.boot.discovery.clone(),
        connect: Box::new({
            let live = live.clone();
            move || live.get().limits.exchange.connect
        }),
    };
    let state = Arc::new(State::new(Parts {
        fleet: Arc::clone(&fleet),
        selector: selector(config, &params, &upkeep),
        policy_name: config.boot.policy.name,
        upkeep: UpkeepSchedule::new(config.boot.eviction_interval),
        live,
        stats: Arc::new(metrics.stats),
        admission: metrics.admission,
        tokenizers,
        records: Arc::new(Records::new(metrics.kv_events)),
        tenancy: metrics.tenancy,
        tracing,
        response_ttl: config.boot.session_ttl,
    }));
    let certificates = Certificates::load(&config.boot.tls)?;
    let data_plane = match &config.boot.epp_listen {
        Some(grpc) => {
            let certificate = certificates.listener.clone();
            let epp = Epp::new(Arc::clone(&state), grpc.clone(), certificate);
            let mut epp = background_service("endpoint picker", epp);
            epp.threads = Some(config.boot.threads);
            server.add_service(epp);
            grpc.clone()
        }
        None => {
            let router = Router::new(Arc::clone(&state));
            let mut proxy = pingora_proxy::http_proxy_service(&server.configuration, router);
            let certificate = certificates.listener.as_ref();
            listen(&mut proxy, &config.boot.listen, certificate);
            server.add_service(proxy);
            config.boot.listen.clone()
        }
    };
    let reader = MetricsReader::new(
        config.boot.metrics.clone(),
        Arc::clone(&fleet),
        Arc::clone(&state) as Arc<dyn AfterRead>,
    );
    let control = Arc::new(Control::new(
        config.clone(),
        source,
        Arc::clone(&discovery),
        Arc::clone(&state),
        certificates.clone(),
    ));
    let mut admin = Service::new(
        "admin".to_string(),
        Admin::new(
            Arc::clone(&state),
            Arc::clone(&control),
            config.boot.admin_token.clone(),
            metrics.fleet,
        ),
    );
    listen(
        &mut admin,
        &config.boot.admin_listen,
        certificates.admin.as_ref(),
    );
    server.add_service(admin);
    server.add_service(health);
    server.add_service(background_service("dns", resolving));
    server.add_service(background_service("metrics", reader));
    if let Some(shared) = &config.boot.shared_table {
        let tables = Tables {
            conversations: params.conversations.clone(),
            responses: Arc::clone(&state.responses),
        };
        let replication = Replication::new(
            shared.clone(),
            tables,
            Arc::clone(&state.fleet),
            metrics.replication,
            params.seed,
        );
        server.add_service(background_service("shared table", replication));
    }
    if config.boot.kv_events.endpoint.is_some() {
        let subscribers = Subscribers::new(
            config.boot.kv_events.clone(),
            Arc::clone(&state.fleet),
            Arc::clone(&state.records),
        );
        server.add_service(background_service("kv events", subscribers));
    }
    server.add_service(background_service("upkeep", upkeep.run(Arc::clone(&state))));
    server.add_service(background_service("reload", Triggers(Arc::clone(&control))));
    let listeners = vec![data_plane, config.boot.admin_listen.clone()];
    server.add_service(background_service("notify", Readiness { listeners }));
    Ok((server, Handles { state, control }))
}

/// Every part's metrics, registered in one registry.
struct PartMetrics {
    stats: Stats,
    admission: AdmissionMetrics,
    fleet: FleetGauges,
    kv_events: KvEventMetrics,
    replication: ReplicationMetrics,
    tokens: TokenMetrics,
    traces: Counts,
    tenancy: Tenancy,
}

impl PartMetrics {
    fn new(registry: &Registry, policy: &'static str) -> Self {
        PartMetrics {
            stats: Stats::new(registry, policy),
            admission: AdmissionMetrics::new(registry),
            fleet: FleetGauges::new(registry),
            kv_events: KvEventMetrics::new(registry),
            replication: ReplicationMetrics::new(registry),
            tokens: TokenMetrics::new(registry),
            traces: Counts::new(registry),
            tenancy: Tenancy::new(registry),
        }
    }
}

/// Listens on `addr`, over TLS with `certificate`.
fn listen<A>(service: &mut Service<A>, addr: &str, certificate: Option<&Arc<Certificate>>) {
    match certificate {
        Some(certificate) => service.add_tls_with_settings(addr, None, certificate.listener()),
        None => service.add_tcp(addr),
    }
}

fn server_conf(config: &Config) -> ServerConf {
    let mut conf = ServerConf {
        threads: config.boot.threads,
        grace_period_seconds: Some(config.boot.grace_period.as_secs()),
        graceful_shutdown_timeout_seconds: Some(config.boot.shutdown_timeout.as_secs()),
        upgrade_sock: config.boot.upgrade_socket.clone(),
        ..ServerConf::default()
    };
    conf.upstream_keepalive_pool_size = 1024;
    conf
}

/// What the policy is built from; with a shared table, its conversation table is the one
/// replication keeps in step with the other replicas.
fn params(config: &Config, live: &Current) -> PolicyParams {
    let clock: Arc<dyn Clock> = Arc::new(Monotonic::default());
    let shared = config.boot.shared_table.is_some();
    PolicyParams {
        tunables: live.tunables(),
        tree: config.boot.tree.clone(),
        seed: seed(),
        conversations: shared.then(|| Arc::new(Conversations::new(Arc::clone(&clock)))),
        clock,
        calibrate: true,
        session_ttl: config.boot.session_ttl,
    }
}

fn selector(config: &Config, params: &PolicyParams, upkeep: &Upkeep) -> Selector {
    let wake = upkeep.waker();
    (config.boot.policy.build(params)).on_upkeep_due(move || wake.notify_one())
}

/// A seed that differs between router processes, so replicas do not break ties in step.
fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}

#[cfg(test)]
mod tests;
