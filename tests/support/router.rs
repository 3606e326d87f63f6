//! The real router, started in-process on a loopback port from the OS, with the real Pingora
//! server, health checks and policies. Stopped (fast shutdown) when dropped.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prefix_router::config::Source;
use prefix_router::config::{Config, Settings};
use prefix_router::control::Control;
use prefix_router::serve::embedded::Embedded;
use prefix_router::state::State;

use super::free_loopback_addr;
use super::upstream::TestUpstream;

/// A running router.
pub struct TestRouter {
    pub url: String,
    pub admin_url: String,
    running: Embedded,
}

/// Settings a test starts from: frequent health checks, the given backends. A check fails
/// at once on a refused connection or a 503, but waits up to 5 s for an answer: on a busy
/// machine (CI runs the held 32 MiB bodies beside other tests) 1 s once took a backend out.
pub fn settings(upstreams: &[&TestUpstream]) -> Settings {
    Settings {
        worker_urls: Some(upstreams.iter().map(|u| u.url()).collect()),
        health_check_interval: Some(0.2),
        health_check_timeout: Some(5.0),
        health_check_failures: Some(1),
        threads: Some(2),
        grace_period: Some(0.0),
        ..Settings::default()
    }
}

impl TestRouter {
    /// Starts a router with `settings` (host and port are chosen here) and waits until it
    /// accepts connections and `ready` backends passed their health check.
    pub fn start(settings: Settings, ready: usize) -> TestRouter {
        Self::start_from(settings, None, ready)
    }

    /// Like [`TestRouter::start`], with `settings` as flags laid over config `file`.
    pub fn start_from(mut settings: Settings, file: Option<PathBuf>, ready: usize) -> TestRouter {
        let addr = free_loopback_addr().unwrap();
        let (host, port) = addr.rsplit_once(':').unwrap();
        settings.host = Some(host.to_string());
        settings.port = Some(port.parse().unwrap());
        let admin = free_loopback_addr().unwrap();
        settings.admin_port = Some(admin.rsplit_once(':').unwrap().1.parse().unwrap());
        let config = Config::load(file.as_deref(), settings.clone()).expect("valid test config");
        let running = Embedded::start_from(
            &config,
            Source {
                file,
                flags: settings,
            },
        )
        .expect("loadable tokenizers");
        assert!(
            running.wait_ready(ready, Duration::from_secs(20)),
            "router not ready"
        );
        TestRouter {
            url: running.url.clone(),
            admin_url: format!("http://{}", config.boot.admin_listen),
            running,
        }
    }

    /// The router's metrics, parsed by a Prometheus text-format parser.
    pub async fn metrics(&self) -> prometheus_parse::Scrape {
        scrape(&self.admin_url).await
    }

    /// `GET path` on the admin listener, as JSON.
    pub async fn admin_json(&self, path: &str) -> serde_json::Value {
        let resp = reqwest::get(format!("{}{path}", self.admin_url)).await;
        resp.unwrap().json().await.unwrap()
    }

    /// Reloads and worker changes.
    pub fn control(&self) -> &Arc<Control> {
        &self.running.handles.control
    }

    /// Shared request state (fleet, selector).
    pub fn state(&self) -> &Arc<State> {
        &self.running.handles.state
    }

    /// Backends that passed their health check.
    pub fn ready_backends(&self) -> usize {
        self.state().fleet.ready(&[]).accounts().len()
    }

    /// Requests in flight over all backends.
    pub fn inflight(&self) -> usize {
        self.state()
            .fleet
            .snapshot()
            .backends
            .iter()
            .map(|b| b.load())
            .sum()
    }

    /// Waits (bounded, without blocking the runtime) until `check` holds.
    pub async fn wait_until(&self, what: &str, check: impl Fn(&TestRouter) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !check(self) {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The router binary as a child process on free loopback ports, listeners set: add worker
/// flags, then spawn. Returns the command, the data plane URL and the admin URL.
pub fn router_binary() -> (std::process::Command, String, String) {
    let free = || free_loopback_addr().unwrap();
    let (data, admin) = (free(), free());
    let port = |addr: &str| addr.rsplit_once(':').unwrap().1.to_string();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_prefix-router"));
    command.args(["--host", "127.0.0.1", "--port", &port(&data)]);
    command.args(["--admin-port", &port(&admin)]);
    (command, format!("http://{data}"), format!("http://{admin}"))
}

/// The metrics of the router whose admin listener is `admin_url`, as text.
pub async fn metrics_text(admin_url: &str) -> String {
    let response = reqwest::get(format!("{admin_url}/metrics")).await.unwrap();
    response.text().await.unwrap()
}

/// The metrics of the router whose admin listener is `admin_url`, parsed by a Prometheus
/// text-format parser.
pub async fn scrape(admin_url: &str) -> prometheus_parse::Scrape {
    let text = metrics_text(admin_url).await;
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap()
}
