//! A router running inside another program, on threads of its own, stopped when dropped:
//! for the demo, and for tests that look inside it. The command line runs the server on the
//! main thread instead ([`super::lifecycle::run`]).

use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::server::{RunArgs, ShutdownSignal, ShutdownSignalWatch};
use tokio::sync::oneshot;

use super::BuildError;
use super::lifecycle::{Drained, watch_phases};
use super::{Handles, build};
use crate::config::Config;
use crate::config::Source;

/// A router running in this process.
pub struct Embedded {
    /// Base URL of the data plane (of the endpoint picker's gRPC server, in that mode).
    pub url: String,
    /// Address of the admin listener.
    admin: String,
    /// The running parts.
    pub handles: Handles,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Stops the server when the sender is dropped or fires.
struct StopSignal(parking_lot::Mutex<Option<oneshot::Receiver<()>>>);

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

impl Embedded {
    /// Starts the router for `config` (listening on `config.boot.listen`) on a thread of its own.
    pub fn start(config: &Config) -> Result<Embedded, BuildError> {
        Embedded::start_from(config, Source::default())
    }

    /// Like [`Embedded::start`], for a `config` read from `source` (so that it can reload).
    pub fn start_from(config: &Config, source: Source) -> Result<Embedded, BuildError> {
        let (server, handles) = build(config, source, None)?;
        watch_phases(&server, handles.state.clone(), Drained::Wait);
        let (stop, stopped) = oneshot::channel();
        let signal = Box::new(StopSignal(parking_lot::Mutex::new(Some(stopped))));
        let thread = std::thread::spawn(move || {
            server.run(RunArgs {
                shutdown_signal: signal,
            })
        });
        Ok(Embedded {
            url: format!(
                "http://{}",
                config
                    .boot
                    .epp_listen
                    .as_ref()
                    .unwrap_or(&config.boot.listen)
            ),
            admin: config.boot.admin_listen.to_string(),
            handles,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Waits (up to `timeout`) until both listeners accept and `backends` passed their
    /// first health check; returns whether they did. Blocks the calling thread (the wait
    /// itself runs on a thread of its own, so the caller may be inside an async runtime).
    pub fn wait_ready(&self, backends: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        // Each listener is bound when its service's thread gets to it: try until it accepts.
        for addr in [self.url.trim_start_matches("http://"), &self.admin] {
            while std::net::TcpStream::connect(addr).is_err() {
                if Instant::now() >= deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let fleet = &self.handles.state.fleet;
        let left = deadline.saturating_duration_since(Instant::now());
        let enough = |f: &crate::fleet::Fleet| f.ready(&[]).accounts().len() >= backends;
        let wait = || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            runtime.is_ok_and(|r| r.block_on(fleet.wait_until(left, enough)))
        };
        std::thread::scope(|s| s.spawn(wait).join().unwrap_or(false))
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.handles.state.tracing.shutdown();
    }
}
