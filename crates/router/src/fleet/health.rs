//! Active health checks on the fleet's own backends: every interval, each backend of the
//! current snapshot is probed in parallel with a GET of the health path (passed on a 200,
//! [`Fetcher`]), and its result recorded on the backend (thresholds of consecutive
//! results, see [`Backend::observe_check`]). A backend gets no request before its first
//! passed check, and a passed check brings back a backend that passive health took out.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use log::{info, warn};
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use tokio::sync::Notify;

use super::fetch::Fetcher;
use super::{Backend, Fleet};

/// Most of a health answer's body read, bytes; beyond it the connection is not reused.
const HEALTH_BODY: usize = 64 << 10;

/// Active health checking.
#[derive(Clone, Debug, PartialEq)]
pub struct HealthSettings {
    /// Time between checks. Default 5 s.
    pub interval: Duration,
    /// Path of the GET. Default `/health`.
    pub path: http::Uri,
    /// Time a check may take. Default 2 s.
    pub timeout: Duration,
    /// Passed checks in a row that make a backend healthy. Default 1.
    pub successes: usize,
    /// Failed checks in a row that make a backend unhealthy. Default 2.
    pub failures: usize,
}

impl Default for HealthSettings {
    fn default() -> Self {
        HealthSettings {
            interval: Duration::from_secs(5),
            path: http::Uri::from_static("/health"),
            timeout: Duration::from_secs(2),
            successes: 1,
            failures: 2,
        }
    }
}

/// The health checker of one fleet, run as a background service.
pub struct HealthChecks {
    fetcher: Fetcher,
    settings: HealthSettings,
    fleet: Arc<Fleet>,
    soon: Notify,
}

impl HealthChecks {
    /// Checks of `fleet` with `settings`.
    pub fn new(settings: HealthSettings, fleet: Arc<Fleet>) -> Self {
        HealthChecks {
            fetcher: Fetcher::new(&fleet),
            settings,
            fleet,
            soon: Notify::new(),
        }
    }

    /// Asks for a round of checks now rather than at the next interval (backends added).
    pub fn check_soon(&self) {
        self.soon.notify_one();
    }

    /// Checks every backend of the current snapshot once, in parallel.
    pub async fn check_all(&self) {
        let snapshot = self.fleet.snapshot();
        let checks = snapshot.backends.iter().map(|b| self.check(b));
        futures_util::future::join_all(checks).await;
        self.fleet.readiness_changed();
    }

    async fn check(&self, backend: &Backend) {
        let (path, timeout) = (&self.settings.path, self.settings.timeout);
        let result = (self.fetcher.get(backend, path, timeout, HEALTH_BODY).await).map(drop);
        let first = backend.awaiting_first_check();
        let (successes, failures) = (self.settings.successes, self.settings.failures);
        let flipped = backend.observe_check(result.is_ok(), successes, failures);
        let url = &backend.worker.url;
        match (&result, flipped) {
            (Err(e), Some(false)) => warn!("backend {url} is unhealthy: {e}"),
            (Ok(()), Some(true)) => info!("backend {url} is healthy again"),
            _ => {}
        }
        if result.is_ok() && backend.restore() {
            info!("backend {url} is back after passing its health check");
        }
        if first && result.is_ok() {
            info!("backend {url} passed its first health check");
        }
    }
}

#[async_trait]
impl BackgroundService for HealthChecks {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            self.check_all().await;
            tokio::select! {
                _ = tokio::time::sleep(self.settings.interval) => {}
                _ = self.soon.notified() => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}
