//! Assembles the Pingora server: the proxy service on the data-plane listener, the admin
//! service on its own listener, the load-balancing background service that runs health
//! checks, the upkeep service that evicts the prefix tree and expires sessions, and the
//! reload triggers.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::server::configuration::{Opt, ServerConf};
use pingora_core::server::{Server, ShutdownWatch};
use pingora_core::services::background::{BackgroundService, background_service};
use pingora_load_balancing::selection::RoundRobin;
use pingora_load_balancing::{Backends, LoadBalancer};

use pingora_core::services::listening::Service;

use crate::admin::Admin;
use crate::config::{Config, Settings};
use crate::control::{Control, Triggers};
use crate::fleet::{Discover, Fleet, FleetDiscovery, ReadyCheck};
use crate::notify::Readiness;
use crate::policy::{PolicyParams, Selector, SharedTunables};
use crate::proxy::{Router, State};
use crate::stats::Stats;
use crate::tree::TreeConfig;

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
    let fleet = Arc::new(Fleet::new(config.timeouts.clone()));
    let discovery = Arc::new(FleetDiscovery::new(
        Arc::clone(&fleet),
        config.workers.clone(),
    ));
    let stats = Arc::new(Stats::new());
    let state = Arc::new(State::new(
        config,
        Arc::clone(&fleet),
        selector(config),
        stats,
    ));
    let mut proxy =
        pingora_proxy::http_proxy_service(&server.configuration, Router::new(Arc::clone(&state)));
    proxy.add_tcp(&config.listen);
    let health = background_service("health", health(config, &fleet, &discovery));
    let control = Arc::new(Control::new(
        config.clone(),
        source.file,
        source.flags,
        discovery,
        health.task(),
        Arc::clone(&state),
    ));
    let admin = Admin::new(
        Arc::clone(&state),
        Arc::clone(&control),
        config.admin_token.clone(),
    );
    let mut admin = Service::new("admin".to_string(), admin);
    admin.add_tcp(&config.admin_listen);
    server.add_service(proxy);
    server.add_service(admin);
    server.add_service(health);
    let upkeep = Upkeep {
        state: Arc::clone(&state),
        interval: config.eviction_interval,
    };
    server.add_service(background_service("upkeep", upkeep));
    server.add_service(background_service("reload", Triggers(Arc::clone(&control))));
    let listeners = vec![config.listen.clone(), config.admin_listen.clone()];
    server.add_service(background_service("notify", Readiness { listeners }));
    watch_phases(&server, Arc::clone(&state));
    (server, Handles { state, control })
}

/// Once the process starts to stop or to hand its listeners over, responses close their
/// connections, so that clients move to the new process instead of reusing old connections.
fn watch_phases(server: &Server, state: Arc<State>) {
    use pingora_core::server::ExecutionPhase;
    let mut phases = server.watch_execution_phase();
    std::thread::spawn(move || {
        while let Ok(phase) = phases.blocking_recv() {
            if matches!(
                phase,
                ExecutionPhase::GracefulUpgradeTransferringFds
                    | ExecutionPhase::GracefulTerminate
                    | ExecutionPhase::ShutdownStarted
            ) {
                state.start_draining();
            }
        }
    });
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

fn selector(config: &Config) -> Selector {
    let params = PolicyParams {
        tunables: SharedTunables::new(config.tunables()),
        tree: TreeConfig {
            max_bytes_per_backend: config.max_tree_size,
            ..TreeConfig::default()
        },
    };
    Selector::new(
        config.policy.build(&params),
        params.tunables,
        config.session_ttl,
    )
}

fn health(
    config: &Config,
    fleet: &Arc<Fleet>,
    discovery: &Arc<FleetDiscovery>,
) -> LoadBalancer<RoundRobin> {
    let mut backends = Backends::new(Box::new(Discover(Arc::clone(discovery))));
    backends.set_health_check(Box::new(ReadyCheck::new(&config.health, Arc::clone(fleet))));
    let mut lb = LoadBalancer::from_backends(backends);
    lb.health_check_frequency = Some(config.health.interval);
    // Discovery runs once at start; after that only `Control` updates, so that updates
    // never overlap (it re-resolves names every 30 s).
    lb.update_frequency = None;
    lb.parallel_health_check = true;
    lb
}

/// Periodic upkeep: prefix-tree eviction and session expiry every `interval`, at once when
/// the tree grew by a tenth of its budget, and within a second of a fleet change (to drop
/// removed backends' entries).
struct Upkeep {
    state: Arc<State>,
    interval: Duration,
}

#[async_trait]
impl BackgroundService for Upkeep {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut last = Instant::now();
        let mut generation = 0;
        loop {
            let grown = tokio::select! {
                _ = tick.tick() => false,
                _ = self.state.selector.upkeep_requested() => true,
                _ = shutdown.changed() => return,
            };
            let snapshot = self.state.fleet.snapshot();
            let evicted = if last.elapsed() >= self.interval || snapshot.generation != generation {
                (last, generation) = (Instant::now(), snapshot.generation);
                let live = |id| snapshot.backends.iter().any(|b| b.id == id);
                self.state.selector.maintain(&live)
            } else if grown {
                self.state.selector.trim_tree()
            } else {
                0
            };
            self.state.stats.evicted_bytes.inc_by(evicted as u64);
        }
    }
}

/// A router running in this process on its own threads, stopped when dropped. For the
/// demo and tests; the command line runs the server on the main thread instead.
pub struct Running {
    /// Base URL of the data plane.
    pub url: String,
    /// The running parts.
    pub handles: Handles,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct StopSignal(parking_lot::Mutex<Option<tokio::sync::oneshot::Receiver<()>>>);

#[async_trait]
impl pingora_core::server::ShutdownSignalWatch for StopSignal {
    async fn recv(&self) -> pingora_core::server::ShutdownSignal {
        let stop = self.0.lock().take();
        if let Some(stop) = stop {
            let _ = stop.await;
        }
        pingora_core::server::ShutdownSignal::FastShutdown
    }
}

impl Running {
    /// Starts the router for `config` (listening on `config.listen`) on a thread of its own.
    pub fn start(config: &Config) -> Running {
        Running::start_from(config, Source::default())
    }

    /// Like [`Running::start`], for a `config` read from `source` (so that it can reload).
    pub fn start_from(config: &Config, source: Source) -> Running {
        let (server, handles) = build(config, source, None);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let signal = Box::new(StopSignal(parking_lot::Mutex::new(Some(stopped))));
        let run = move || {
            server.run(pingora_core::server::RunArgs {
                shutdown_signal: signal,
            })
        };
        let thread = std::thread::spawn(run);
        Running {
            url: format!("http://{}", config.listen),
            handles,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Waits (up to `timeout`) until the listener accepts and `backends` passed their health
    /// check; returns whether it did.
    pub fn wait_ready(&self, backends: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let addr = self.url.trim_start_matches("http://");
        while Instant::now() < deadline {
            let listening = std::net::TcpStream::connect(addr).is_ok();
            if listening && self.handles.state.fleet.ready(&[]).candidates.len() >= backends {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A loopback `host:port` with a port the OS just handed out (bound, then released).
pub fn free_loopback_addr() -> std::io::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.to_string())
}
