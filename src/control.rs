//! Changes while serving: reloading the config file (SIGHUP, a change of the file, or admin
//! `POST /reload`), adding and removing workers, and resolving worker names again. Each
//! change is checked first and applied as new immutable snapshots swapped in; a change that
//! fails leaves everything as it was. Changes are serialized by one lock.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use log::{error, info, warn};
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use pingora_load_balancing::LoadBalancer;
use pingora_load_balancing::selection::RoundRobin;
use tokio::sync::Mutex;

use crate::config::{Config, ConfigError, Settings, Worker};
use crate::fleet::FleetDiscovery;
use crate::proxy::State;
use crate::stats::Stats;

/// How often worker host names are resolved again, and the config file checked for change.
const REFRESH_INTERVAL: Duration = Duration::from_secs(30);
const FILE_POLL: Duration = Duration::from_secs(2);

/// Why a runtime change was refused.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The new configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// There is no config file to reload.
    #[error("the router was started without --config; there is nothing to reload")]
    NoFile,
    /// The worker to remove is not in the list.
    #[error("worker {0} is not in the list")]
    UnknownWorker(String),
}

/// The one place runtime changes go through.
pub struct Control {
    file: Option<PathBuf>,
    flags: Settings,
    current: Mutex<Config>,
    discovery: Arc<FleetDiscovery>,
    balancer: Arc<LoadBalancer<RoundRobin>>,
    state: Arc<State>,
    stats: Arc<Stats>,
    loaded: std::sync::Mutex<Option<SystemTime>>,
}

impl Control {
    /// Control over a router started with `config`, read from `file` with `flags` on top.
    pub fn new(
        config: Config,
        file: Option<PathBuf>,
        flags: Settings,
        discovery: Arc<FleetDiscovery>,
        balancer: Arc<LoadBalancer<RoundRobin>>,
        state: Arc<State>,
    ) -> Self {
        let stats = Arc::clone(&state.stats);
        let control = Control {
            file,
            flags,
            current: Mutex::new(config),
            discovery,
            balancer,
            state,
            stats,
            loaded: std::sync::Mutex::new(None),
        };
        control.note_loaded();
        control
    }

    /// Reads the config file again and applies what can change while serving (nothing, and
    /// no new generation, when it did not change).
    pub async fn reload(&self) -> Result<(), ControlError> {
        let result = self.reload_file().await;
        let label = if result.is_ok() { "ok" } else { "failed" };
        self.stats.reloads.with_label_values(&[label]).inc();
        match &result {
            Ok(()) => info!(
                "configuration reloaded (generation {})",
                self.stats.generation.get()
            ),
            Err(e) => error!("configuration reload refused, keeping the old one: {e}"),
        }
        result
    }

    async fn reload_file(&self) -> Result<(), ControlError> {
        let file = self.file.as_deref().ok_or(ControlError::NoFile)?;
        self.note_loaded();
        let new = Config::load(Some(file), self.flags.clone())?;
        let mut current = self.current.lock().await;
        if new == *current {
            return Ok(());
        }
        for option in new.restart_only_changes(&current) {
            warn!("`{option}` changed in the config file; it takes effect after a restart");
        }
        self.state.apply(&new);
        self.apply_workers(new.workers.clone()).await;
        *current = new;
        self.stats.generation.inc();
        Ok(())
    }

    /// Adds a worker by URL (peers' `POST /add_worker?url=`).
    pub async fn add_worker(&self, url: &str) -> Result<(), ControlError> {
        let worker = Worker::parse(url).map_err(|reason| ConfigError::Invalid {
            option: "url",
            reason,
        })?;
        let mut current = self.current.lock().await;
        if !current
            .workers
            .iter()
            .any(|w| (&w.host, w.port) == (&worker.host, worker.port))
        {
            current.workers.push(worker);
        }
        self.apply_workers(current.workers.clone()).await;
        Ok(())
    }

    /// Removes a worker by URL (peers' `POST /remove_worker?url=`). When this returns, the
    /// worker gets no new request; requests already on it finish.
    pub async fn remove_worker(&self, url: &str) -> Result<(), ControlError> {
        let worker = Worker::parse(url).map_err(|reason| ConfigError::Invalid {
            option: "url",
            reason,
        })?;
        let mut current = self.current.lock().await;
        let before = current.workers.len();
        current
            .workers
            .retain(|w| (&w.host, w.port) != (&worker.host, worker.port));
        if current.workers.len() == before {
            return Err(ControlError::UnknownWorker(url.to_string()));
        }
        self.apply_workers(current.workers.clone()).await;
        Ok(())
    }

    /// The configured worker URLs.
    pub async fn worker_urls(&self) -> Vec<String> {
        self.current
            .lock()
            .await
            .workers
            .iter()
            .map(|w| w.url.clone())
            .collect()
    }

    /// Resolves worker names again.
    pub async fn refresh(&self) {
        let current = self.current.lock().await;
        self.apply_workers(current.workers.clone()).await;
    }

    /// Publishes `workers` as the fleet before returning, then checks new backends' health
    /// at once in the background (they get traffic when their first check passes).
    async fn apply_workers(&self, workers: Vec<Worker>) {
        self.discovery.set_workers(workers);
        if let Err(e) = self.balancer.update().await {
            error!("applying the worker list failed: {e}");
        }
        let balancer = Arc::clone(&self.balancer);
        tokio::spawn(async move { balancer.backends().run_health_check(true).await });
    }

    fn file_mtime(&self) -> Option<SystemTime> {
        let file = self.file.as_deref()?;
        std::fs::metadata(file).and_then(|m| m.modified()).ok()
    }

    /// Remembers the file's modification time as read.
    fn note_loaded(&self) {
        if let Ok(mut loaded) = self.loaded.lock() {
            *loaded = self.file_mtime();
        }
    }

    /// Whether the file changed since it was last read.
    fn file_changed(&self) -> bool {
        let now = self.file_mtime();
        now.is_some() && self.loaded.lock().is_ok_and(|loaded| *loaded != now)
    }
}

/// Runs reloads on SIGHUP and on a change of the config file, and resolves worker names
/// again every 30 s.
pub struct Triggers(pub Arc<Control>);

#[async_trait]
impl BackgroundService for Triggers {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let control = &self.0;
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        {
            Ok(signal) => Some(signal),
            Err(e) => {
                error!("cannot listen for SIGHUP: {e}");
                None
            }
        };
        let mut poll = tokio::time::interval(FILE_POLL);
        let mut refresh = tokio::time::interval(REFRESH_INTERVAL);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                Some(()) = async { hangup.as_mut()?.recv().await } => {
                    let _ = control.reload().await;
                }
                _ = poll.tick() => {
                    if control.file_changed() {
                        let _ = control.reload().await;
                    }
                }
                _ = refresh.tick() => control.refresh().await,
            }
        }
    }
}
