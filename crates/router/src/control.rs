//! Changes while serving: reloading the config file and the listeners' certificates
//! (SIGHUP, a change of the file, or admin `POST /reload`), adding and removing workers. Each
//! change is checked first and applied as new immutable snapshots swapped in; a change that
//! fails leaves everything as it was. Changes are serialized by one lock.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use log::{error, info, warn};
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use tokio::sync::Mutex;

use crate::config::{Config, ConfigError, Settings, Source};
use crate::fleet::{Discovery, Role, Worker, WorkerError};
use crate::state::State;
use crate::stats::Stats;
use crate::tls::Certificates;

/// How often the config file is checked for change.
const FILE_POLL: Duration = Duration::from_secs(2);

/// Why a runtime change was refused.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The new configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The worker URL is invalid.
    #[error("invalid worker URL {0}")]
    Worker(#[from] WorkerError),
    /// There is no config file to reload.
    #[error("the router was started without --config; there is nothing to reload")]
    NoFile,
    /// A worker's role that is none of `prefill`, `decode` and `both`.
    #[error("unknown role {0}: prefill, decode or both")]
    UnknownRole(String),
    /// The worker to remove is not in the list.
    #[error("worker {0} is not in the list")]
    UnknownWorker(String),
}

/// The one place runtime changes go through.
pub struct Control {
    file: Option<PathBuf>,
    flags: Settings,
    current: Mutex<Config>,
    discovery: Arc<Discovery>,
    state: Arc<State>,
    stats: Arc<Stats>,
    loaded: std::sync::Mutex<Option<SystemTime>>,
    certificates: Certificates,
}

impl Control {
    /// Control over a router started with `config`, read from `source`.
    pub fn new(
        config: Config,
        source: Source,
        discovery: Arc<Discovery>,
        state: Arc<State>,
        certificates: Certificates,
    ) -> Self {
        let stats = Arc::clone(&state.stats);
        let control = Control {
            file: source.file,
            flags: source.flags,
            current: Mutex::new(config),
            discovery,
            state,
            stats,
            loaded: std::sync::Mutex::new(None),
            certificates,
        };
        control.note_loaded();
        control
    }

    /// Reads the listeners' certificates and the config file again, and applies what can
    /// change while serving (nothing, and no new generation, when the file did not
    /// change). A certificate that cannot be read keeps the old one serving. Without a
    /// config file, a router with certificates reloads only those.
    pub async fn reload(&self) -> Result<(), ControlError> {
        match self.certificates.reload() {
            Ok(()) if self.certificates.any() => info!("certificates reloaded"),
            Ok(()) => {}
            Err(e) => error!("certificate reload refused, keeping the old one: {e}"),
        }
        if self.file.is_none() && self.certificates.any() {
            return Ok(());
        }
        let result = self.reload_file().await;
        self.stats.reload(result.is_ok());
        match &result {
            Ok(()) => info!(
                "configuration reloaded (generation {})",
                self.stats.generation()
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
        self.state.swap_live(new.live.clone());
        *current = new;
        self.apply_workers(&current).await;
        self.stats.next_generation();
        Ok(())
    }

    /// Adds a worker by URL (peers' `POST /add_worker?url=`), with a role (`&role=`; `both`
    /// by default); a worker listed already takes the role.
    pub async fn add_worker(&self, url: &str, role: Option<&str>) -> Result<(), ControlError> {
        let unknown = |name: &str| ControlError::UnknownRole(name.to_string());
        let role = role.map_or(Ok(Role::Both), |r| Role::named(r).ok_or_else(|| unknown(r)))?;
        let worker = Worker {
            role,
            ..Worker::parse(url)?
        };
        let mut current = self.current.lock().await;
        match current.workers.iter_mut().find(|w| w.same_place(&worker)) {
            Some(listed) => listed.role = role,
            None => current.workers.push(worker),
        }
        self.apply_workers(&current).await;
        Ok(())
    }

    /// Removes a worker by URL (peers' `POST /remove_worker?url=`). When this returns, the
    /// worker gets no new request; requests already on it finish.
    pub async fn remove_worker(&self, url: &str) -> Result<(), ControlError> {
        let worker = Worker::parse(url)?;
        let mut current = self.current.lock().await;
        let before = current.workers.len();
        current.workers.retain(|w| !w.same_place(&worker));
        if current.workers.len() == before {
            return Err(ControlError::UnknownWorker(url.to_string()));
        }
        self.apply_workers(&current).await;
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

    /// Publishes `config`'s workers as the fleet before returning.
    async fn apply_workers(&self, config: &Config) {
        self.discovery.set_workers(config.workers.clone());
        let connect = config.live.limits.exchange.connect;
        self.discovery.refresh(connect).await;
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

/// Runs reloads on SIGHUP and on a change of the config file.
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
            }
        }
    }
}
