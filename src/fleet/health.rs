//! Active health checks: Pingora's HTTP health check, wrapped so that its verdicts reach
//! our [`Backend`](super::Backend)s. Pingora counts a new backend healthy before it was ever
//! checked; the wrapper records the first passed check, and a backend gets no request
//! before it.

use std::sync::Arc;

use async_trait::async_trait;
use log::info;
use pingora_core::protocols::l4::socket::SocketAddr as PingoraAddr;
use pingora_load_balancing::Backend as LbBackend;
use pingora_load_balancing::health_check::{HealthCheck, HttpHealthCheck};

use super::Fleet;
use crate::config::Health;

/// An HTTP GET health check that reports to the fleet.
pub struct ReadyCheck {
    inner: HttpHealthCheck,
    fleet: Arc<Fleet>,
}

impl ReadyCheck {
    /// A check of `settings.path` with its timeout and thresholds.
    pub fn new(settings: &Health, fleet: Arc<Fleet>) -> Self {
        let mut inner = HttpHealthCheck::new("localhost", false);
        inner.consecutive_success = settings.successes;
        inner.consecutive_failure = settings.failures;
        inner.reuse_connection = true;
        inner.peer_template.options.connection_timeout = Some(settings.timeout);
        inner.peer_template.options.total_connection_timeout = Some(settings.timeout);
        inner.peer_template.options.read_timeout = Some(settings.timeout);
        inner.peer_template.options.write_timeout = Some(settings.timeout);
        match settings.path.parse() {
            Ok(uri) => inner.req.set_uri(uri),
            Err(_) => log::warn!(
                "health check path {} is not a valid URI; using /",
                settings.path
            ),
        }
        ReadyCheck { inner, fleet }
    }

    fn backend(&self, target: &LbBackend) -> Option<Arc<super::Backend>> {
        match &target.addr {
            PingoraAddr::Inet(addr) => self.fleet.find(addr),
            _ => None,
        }
    }
}

#[async_trait]
impl HealthCheck for ReadyCheck {
    async fn check(&self, target: &LbBackend) -> pingora_core::Result<()> {
        let result = self.inner.check(target).await;
        if result.is_ok()
            && let Some(backend) = self.backend(target)
        {
            mark_first_pass(&backend);
        }
        result
    }

    async fn health_status_change(&self, target: &LbBackend, healthy: bool) {
        if let Some(backend) = self.backend(target) {
            backend.set_healthy(healthy);
        }
    }

    fn health_threshold(&self, success: bool) -> usize {
        self.inner.health_threshold(success)
    }
}

fn mark_first_pass(backend: &super::Backend) {
    if !backend.is_ready() && backend.is_healthy() {
        info!(
            "backend {} passed its first health check",
            backend.worker.url
        );
    }
    backend.mark_checked();
    if backend.restore() {
        info!(
            "backend {} is back after passing its health check",
            backend.worker.url
        );
    }
}
