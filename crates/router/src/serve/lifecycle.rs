//! The process's life under signals, for the command line: SIGTERM drains and stops, SIGINT
//! stops at once, SIGQUIT hands the listeners to a new process started with `--upgrade`
//! (Pingora's graceful upgrade), SIGUSR2 starts that new process itself first (for systemd,
//! where the service manager cannot start it). Draining ends as soon as no request is in
//! flight, rather than after the whole grace period. [`watch_phases`] is the one watcher of
//! the server's execution phases, for the process and for an embedded router alike.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use log::{error, info};
use pingora_core::server::{ExecutionPhase, RunArgs, Server, ShutdownSignal, ShutdownSignalWatch};
use tokio::signal::unix::{SignalKind, signal};

use crate::state::State;

/// Runs `server` until a signal stops it, then exits the process.
pub fn run(server: Server, state: Arc<State>) -> ! {
    watch_phases(&server, Arc::clone(&state), Drained::Exit);
    server.run(RunArgs {
        shutdown_signal: Box::new(Signals),
    });
    state.tracing.shutdown();
    std::process::exit(0)
}

/// What to do once the grace period starts and no request is in flight.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Exit the process at once (the command line: why wait out the grace period).
    Exit,
    /// Nothing: the server stops at the end of its grace period (an embedded router).
    Wait,
}

/// Watches the server's phases: once it starts to stop or to hand its listeners over,
/// responses close their connections, so that clients move to the new process instead of
/// reusing old connections; then, as `drained` says.
pub fn watch_phases(server: &Server, state: Arc<State>, drained: Drained) {
    let mut phases = server.watch_execution_phase();
    std::thread::spawn(move || {
        while let Ok(phase) = phases.blocking_recv() {
            match phase {
                ExecutionPhase::GracefulUpgradeTransferringFds
                | ExecutionPhase::GracefulTerminate
                | ExecutionPhase::ShutdownStarted => state.start_draining(),
                ExecutionPhase::ShutdownGracePeriod if drained == Drained::Exit => break,
                _ => {}
            }
        }
        if drained == Drained::Exit {
            while state.active() > 0 {
                std::thread::sleep(Duration::from_millis(50));
            }
            info!("no request in flight; exiting before the end of the grace period");
            state.tracing.shutdown();
            std::process::exit(0)
        }
    });
}

struct Signals;

#[async_trait]
impl ShutdownSignalWatch for Signals {
    async fn recv(&self) -> ShutdownSignal {
        let (Ok(mut quit), Ok(mut term), Ok(mut int), Ok(mut usr2)) = (
            signal(SignalKind::quit()),
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::user_defined2()),
        ) else {
            error!("cannot listen for signals; stopping");
            return ShutdownSignal::FastShutdown;
        };
        loop {
            tokio::select! {
                _ = quit.recv() => return ShutdownSignal::GracefulUpgrade,
                _ = term.recv() => return ShutdownSignal::GracefulTerminate,
                _ = int.recv() => return ShutdownSignal::FastShutdown,
                _ = usr2.recv() => match start_successor() {
                    Ok(pid) => {
                        info!("started process {pid} to take the listeners over");
                        return ShutdownSignal::GracefulUpgrade;
                    }
                    Err(e) => error!("cannot start the upgraded process: {e}"),
                },
            }
        }
    }
}

/// Starts the binary at the path this process was started from (a new build installed
/// there is what an upgrade wants) with the same arguments and `--upgrade`.
fn start_successor() -> std::io::Result<u32> {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    let program = PathBuf::from(args.remove(0));
    let program = if program.is_absolute() {
        program
    } else {
        std::env::current_exe()?
    };
    if !args.iter().any(|a| a == "--upgrade") {
        args.push("--upgrade".into());
    }
    let child = std::process::Command::new(program).args(args).spawn()?;
    Ok(child.id())
}
