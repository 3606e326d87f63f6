//! Discovery: turns the configured workers into backends, resolving host names (each
//! address a backend, as a Kubernetes headless service exposes pods), and publishes the
//! result to the [`Fleet`]. Runtime changes (reloads, worker endpoints) and the periodic
//! re-resolution ([`Resolving`], every `dns_refresh_interval`) call
//! [`Discovery::refresh`]; nothing else changes the fleet.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use log::warn;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use super::{Fleet, HealthChecks, Worker};

/// How discovery runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoverySettings {
    /// Time between two resolutions of the workers' host names. Default 30 s.
    pub dns_interval: Duration,
}

impl Default for DiscoverySettings {
    fn default() -> Self {
        DiscoverySettings {
            dns_interval: Duration::from_secs(30),
        }
    }
}

/// The worker list and the fleet it feeds.
pub struct Discovery {
    fleet: Arc<Fleet>,
    workers: ArcSwap<Vec<Worker>>,
    health: Arc<HealthChecks>,
}

impl Discovery {
    /// Discovery of `workers` into `fleet`; `health` checks new backends at once.
    pub fn new(fleet: Arc<Fleet>, workers: Vec<Worker>, health: Arc<HealthChecks>) -> Self {
        Discovery {
            fleet,
            workers: ArcSwap::from_pointee(workers),
            health,
        }
    }

    /// Replaces the worker list; the next discovery run publishes it.
    pub fn set_workers(&self, workers: Vec<Worker>) {
        self.workers.store(Arc::new(workers));
    }

    /// The configured workers.
    pub fn workers(&self) -> Arc<Vec<Worker>> {
        self.workers.load_full()
    }

    /// Resolves every worker and publishes the fleet (new backends connect within
    /// `connect`, and are checked at once: they get traffic when their first check
    /// passes). A name that fails to resolve keeps the addresses it had, so a DNS hiccup
    /// does not empty the fleet.
    pub async fn refresh(&self, connect: Duration) {
        let workers = self.workers.load_full();
        let previous = self.previous_addresses();
        let mut members = Vec::with_capacity(workers.len());
        for worker in workers.iter() {
            match resolve(worker).await {
                Ok(addrs) => members.extend(addrs.into_iter().map(|a| (worker.clone(), a))),
                Err(e) => {
                    warn!("cannot resolve worker {}: {e}", worker.url);
                    let kept = previous.get(&worker.url).cloned().unwrap_or_default();
                    members.extend(kept.into_iter().map(|a| (worker.clone(), a)));
                }
            }
        }
        if self.fleet.replace(&members, connect) {
            self.health.check_soon();
        }
    }

    /// Resolves every worker with the system's blocking resolver and publishes the fleet:
    /// at start, so that requests accepted before the first asynchronous refresh find the
    /// backends (and wait for their first health checks) instead of an empty fleet.
    pub fn publish_blocking(&self, connect: Duration) {
        use std::net::ToSocketAddrs;
        let workers = self.workers.load_full();
        let mut members = Vec::with_capacity(workers.len());
        for worker in workers.iter() {
            match (worker.host.as_str(), worker.port).to_socket_addrs() {
                Ok(addrs) => {
                    let mut addrs: Vec<SocketAddr> = addrs.collect();
                    addrs.sort();
                    addrs.dedup();
                    members.extend(addrs.into_iter().map(|a| (worker.clone(), a)));
                }
                Err(e) => warn!("cannot resolve worker {}: {e}", worker.url),
            }
        }
        self.fleet.replace(&members, connect);
    }

    fn previous_addresses(&self) -> HashMap<String, Vec<SocketAddr>> {
        let mut map: HashMap<String, Vec<SocketAddr>> = HashMap::new();
        for backend in &self.fleet.snapshot().backends {
            map.entry(backend.worker.url.clone())
                .or_default()
                .push(backend.addr);
        }
        map
    }
}

/// Resolves the workers' names again every `dns_interval` (a background service).
pub struct Resolving {
    /// What is resolved.
    pub discovery: Arc<Discovery>,
    /// How often.
    pub settings: DiscoverySettings,
    /// The connect timeout of new backends now (a reload may change it).
    pub connect: Box<dyn Fn() -> Duration + Send + Sync>,
}

#[async_trait]
impl BackgroundService for Resolving {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.settings.dns_interval);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {}
            }
            self.discovery.refresh((self.connect)()).await;
        }
    }
}

async fn resolve(worker: &Worker) -> std::io::Result<Vec<SocketAddr>> {
    if let Ok(ip) = worker.host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, worker.port)]);
    }
    let mut addrs: Vec<SocketAddr> = tokio::net::lookup_host((worker.host.as_str(), worker.port))
        .await?
        .collect();
    addrs.sort();
    addrs.dedup();
    Ok(addrs)
}
