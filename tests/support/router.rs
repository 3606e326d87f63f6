//! The real router, started in-process on a loopback port from the OS, with the real Pingora
//! server, health checks and policies. Stopped (fast shutdown) when dropped.

use std::net::TcpListener;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use pingora_core::server::{RunArgs, ShutdownSignal, ShutdownSignalWatch};
use prefix_router::config::{Config, Settings};
use prefix_router::proxy::State;
use prefix_router::server::{self, Handles};
use tokio::sync::oneshot;

use super::upstream::Upstream;

/// A running router.
pub struct TestRouter {
    pub url: String,
    pub handles: Handles,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

struct StopSignal(Mutex<Option<oneshot::Receiver<()>>>);

#[async_trait]
impl ShutdownSignalWatch for StopSignal {
    async fn recv(&self) -> ShutdownSignal {
        let stop = self.0.lock().take();
        if let Some(stop) = stop {
            let _ = stop.await;
        }
        ShutdownSignal::FastShutdown
    }
}

/// Settings a test starts from: fast health checks, the given backends.
pub fn settings(upstreams: &[&Upstream]) -> Settings {
    Settings {
        worker_urls: Some(upstreams.iter().map(|u| u.url()).collect()),
        health_check_interval: Some(0.2),
        health_check_timeout: Some(1.0),
        health_check_failures: Some(1),
        threads: Some(2),
        grace_period: Some(0.0),
        ..Settings::default()
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

impl TestRouter {
    /// Starts a router with `settings` (host and port are chosen here) and waits until it
    /// accepts connections and `ready` backends passed their health check.
    pub fn start(mut settings: Settings, ready: usize) -> TestRouter {
        let port = free_port();
        settings.host = Some("127.0.0.1".into());
        settings.port = Some(port);
        let config = Config::from_settings(settings).expect("valid test config");
        let (server, handles) = server::build(&config, None);
        let (stop, stopped) = oneshot::channel();
        let signal = Box::new(StopSignal(Mutex::new(Some(stopped))));
        let thread = std::thread::spawn(move || server.run(RunArgs { shutdown_signal: signal }));
        let router = TestRouter {
            url: format!("http://127.0.0.1:{port}"),
            handles,
            stop: Some(stop),
            thread: Some(thread),
        };
        router.wait_ready(port, ready);
        router
    }

    fn wait_ready(&self, port: u16, ready: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let listening = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
            if listening && self.ready_backends() >= ready {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("router did not become ready with {ready} backends");
    }

    /// Shared request state (fleet, selector).
    pub fn state(&self) -> &Arc<State> {
        &self.handles.state
    }

    /// Backends that passed their health check.
    pub fn ready_backends(&self) -> usize {
        self.state().fleet.ready(&[]).candidates.len()
    }

    /// Requests in flight over all backends.
    pub fn inflight(&self) -> usize {
        self.state().fleet.snapshot().backends.iter().map(|b| b.load()).sum()
    }

    /// Waits (bounded) until `check` holds.
    pub fn wait_until(&self, what: &str, check: impl Fn(&TestRouter) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !check(self) {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TestRouter {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
