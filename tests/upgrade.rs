//! The binary as systemd runs it: the unit accepted, readiness notified, and graceful
//! upgrades (by systemd's reload and by SIGUSR2) that lose no request.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use crate::ops::load;
use crate::support::*;

const BIN: &str = env!("CARGO_BIN_EXE_prefix-router");
const UNIT: &str = include_str!("../systemd/prefix-router.service");

fn exec_start_args(config: &str, upgrade_socket: &str) -> Vec<String> {
    let line = UNIT
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap();
    let mut words = line
        .split_whitespace()
        .skip(1)
        .map(str::to_string)
        .collect::<Vec<_>>();
    for w in &mut words {
        *w = w
            .replace("/etc/prefix-router/prefix-router.toml", config)
            .replace("/run/prefix-router/upgrade.sock", upgrade_socket);
    }
    words
}

#[test]
fn systemd_accepts_the_unit() {
    let dir = scratch_dir("unit");
    let unit = UNIT.replace("/usr/local/bin/prefix-router", BIN);
    let path = dir.join("prefix-router.service");
    std::fs::write(&path, unit).unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .args(["verify", path.to_str().unwrap()])
        .output()
        .expect("systemd-analyze must be installed (make test installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct RouterProcess(std::process::Child);

impl Drop for RouterProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .args(["-s", name, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn router_config(dir: &std::path::Path, workers: &[&TestUpstream]) -> (PathBuf, String, String) {
    let (data, admin) = (
        crate::support::free_loopback_addr().unwrap(),
        crate::support::free_loopback_addr().unwrap(),
    );
    let port = |a: &str| a.rsplit_once(':').unwrap().1.to_string();
    let urls: Vec<String> = workers.iter().map(|u| format!("\"{}\"", u.url())).collect();
    let text = format!(
        "host = \"127.0.0.1\"\nport = {}\nadmin_port = {}\nworker_urls = [{}]\nhealth_check_interval = 0.2\nthreads = 1\ngrace_period = 20\n",
        port(&data),
        port(&admin),
        urls.join(", ")
    );
    let path = dir.join("router.toml");
    std::fs::write(&path, text).unwrap();
    (
        path,
        format!("http://{data}"),
        dir.join("upgrade.sock").display().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_run_as_the_unit_runs_it_notifies_ready() {
    let up = TestUpstream::start("a").await;
    let scratch = socket_dir("notify");
    let dir = scratch.path();
    let (config, url, upgrade) = router_config(dir, &[&up]);
    let socket_path = dir.join("notify.sock");
    let _ = std::fs::remove_file(&socket_path);
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let child = std::process::Command::new(BIN)
        .args(exec_start_args(config.to_str().unwrap(), &upgrade))
        .env("NOTIFY_SOCKET", &socket_path)
        .spawn()
        .unwrap();
    let child = RouterProcess(child);
    let mut buf = [0u8; 256];
    let n = socket.recv(&mut buf).expect("no READY=1 within 30 s");
    let message = String::from_utf8_lossy(&buf[..n]);
    assert!(message.contains("READY=1"), "{message}");
    assert!(
        message.contains(&format!("MAINPID={}", child.0.id())),
        "{message}"
    );
    // Ready means the listener accepts.
    assert!(
        tokio::net::TcpStream::connect(url.trim_start_matches("http://"))
            .await
            .is_ok()
    );
}

async fn wait_serving(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _) = match client()
            .post(format!("{url}/v1/chat/completions"))
            .json(&chat(&[("user", "ping".into())]))
            .send()
            .await
        {
            Ok(r) => (r.status().as_u16(), ()),
            Err(_) => (0, ()),
        };
        if status == 200 {
            return;
        }
        assert!(Instant::now() < deadline, "router never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How an upgrade is started.
#[derive(Clone, Copy, PartialEq)]
enum Trigger {
    /// Start the new binary with `--upgrade`, then SIGQUIT the old one.
    Quit,
    /// SIGUSR2 the old one, which starts the new one itself (the systemd way).
    Usr2,
}

/// A directory for a test's Unix sockets, removed when dropped: under the system's
/// temporary directory, as a socket's path must stay within 108 bytes, which `target/tmp`
/// in a deep checkout may not.
fn socket_dir(name: &str) -> tempfile::TempDir {
    let prefix = format!("prefix-router-{name}-");
    tempfile::Builder::new().prefix(&prefix).tempdir().unwrap()
}

/// A datagram socket standing in for systemd's notify socket.
fn notify_socket(dir: &std::path::Path) -> (PathBuf, std::os::unix::net::UnixDatagram) {
    let path = dir.join("notify.sock");
    let _ = std::fs::remove_file(&path);
    let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    (path, socket)
}

/// The MAINPID of the next READY=1 message.
fn next_ready_pid(socket: &std::os::unix::net::UnixDatagram) -> u32 {
    let mut buf = [0u8; 256];
    loop {
        let n = socket.recv(&mut buf).expect("no READY=1 within 30 s");
        let message = String::from_utf8_lossy(&buf[..n]).to_string();
        if message.contains("READY=1") {
            let pid = message.split("MAINPID=").nth(1).unwrap().trim();
            return pid.parse().unwrap();
        }
    }
}

async fn upgrade_under_load(trigger: Trigger) {
    let (a, b) = (
        TestUpstream::start("a").await,
        TestUpstream::start("b").await,
    );
    let scratch = socket_dir(if trigger == Trigger::Quit {
        "upgrade-quit"
    } else {
        "upgrade-usr2"
    });
    let dir = scratch.path();
    let (config, url, upgrade) = router_config(dir, &[&a, &b]);
    let (notify_path, notify) = notify_socket(dir);
    let args = [
        "--config",
        config.to_str().unwrap(),
        "--upgrade-socket",
        &upgrade,
    ];
    let spawn = |extra: &[&str]| {
        let mut command = std::process::Command::new(BIN);
        command
            .args(args)
            .args(extra)
            .env("NOTIFY_SOCKET", &notify_path);
        RouterProcess(command.spawn().unwrap())
    };
    let mut old = spawn(&[]);
    assert_eq!(next_ready_pid(&notify), old.0.id());
    wait_serving(&url).await;
    let seq = Arc::new(AtomicU64::new(0));
    let traffic = tokio::spawn(load(url.clone(), 4_000, 16, Arc::clone(&seq)));
    while seq.load(SeqCst) < 500 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = match trigger {
        Trigger::Quit => {
            assert!(!std::path::Path::new(&upgrade).exists());
            let new = spawn(&["--upgrade"]);
            // The new process listens on the upgrade socket for the old one's listeners.
            let deadline = Instant::now() + Duration::from_secs(30);
            while !std::path::Path::new(&upgrade).exists() {
                assert!(
                    Instant::now() < deadline,
                    "no upgrade socket from the new process"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            signal(old.0.id(), "QUIT");
            Some(new)
        }
        Trigger::Usr2 => {
            signal(old.0.id(), "USR2");
            None
        }
    };
    let new_pid = tokio::task::spawn_blocking(move || next_ready_pid(&notify))
        .await
        .unwrap();
    assert_ne!(
        new_pid,
        old.0.id(),
        "the new process reports itself as the main one"
    );
    let failed = traffic.await.unwrap();
    assert_eq!(failed, 0, "requests failed across the upgrade");
    assert_eq!(a.count() + b.count(), 4_000 + 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while old.0.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the old process did not exit after draining"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _) = post(
        &url,
        "/v1/chat/completions",
        &chat(&[("user", "after".into())]),
    )
    .await;
    assert_eq!(status, 200, "the new process does not serve");
    signal(new_pid, "KILL");
    drop(started);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_upgrade_under_load_loses_no_request() {
    upgrade_under_load(Trigger::Quit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_started_upgrade_on_sigusr2_loses_no_request() {
    upgrade_under_load(Trigger::Usr2).await;
}
