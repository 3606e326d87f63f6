//! TLS on both sides, with certificates made here by Debian's `openssl` and a real TLS
//! client (`curl`): a client over TLS (HTTP/1.1 and HTTP/2) through the router to an
//! `https://` backend (a second router serving TLS, its admin listener with a certificate
//! of its own) verified with a CA file, the bytes the last upstream received equal to
//! what the client sent; a backend whose certificate
//! the router cannot verify never gets a request; a backend's own self-signed certificate
//! (marked as a CA, as `openssl req -x509` makes it) pinned in the CA file is trusted, and
//! another one is not; a certificate swapped on SIGHUP while a
//! stream is open; failed handshakes (a TCP probe, plain HTTP) logged below errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use prefix_router::config::Settings;

use crate::support::*;

/// A CA and a leaf it signed for `localhost` and 127.0.0.1, in `dir`, named `name`:
/// `{name}-ca.pem`, `{name}.pem` and `{name}.key`.
pub fn certificates(dir: &Path, name: &str) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output();
        let out = out.expect("openssl (Debian's openssl package) runs");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    let (ca, leaf) = (format!("{name}-ca"), name.to_string());
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut args = vec!["req", "-x509", "-days", "2", "-subj", "/CN=test CA"];
    args.extend(ec);
    let (ca_key, ca_pem) = (format!("{ca}.key"), format!("{ca}.pem"));
    args.extend(["-keyout", &ca_key, "-out", &ca_pem]);
    run(&args);
    let (key, csr, pem) = (
        format!("{leaf}.key"),
        format!("{leaf}.csr"),
        format!("{leaf}.pem"),
    );
    let mut args = vec!["req", "-new", "-subj", "/CN=localhost"];
    args.extend(ec);
    args.extend(["-keyout", &key, "-out", &csr]);
    run(&args);
    let ext = format!("{leaf}.ext");
    std::fs::write(
        dir.join(&ext),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca_pem,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &ext,
        "-out",
        &pem,
    ]);
}

/// A self-signed certificate for `localhost` and 127.0.0.1 made by the most common recipe,
/// in `dir`: `{name}.pem` and `{name}.key`. openssl's default extensions mark it CA:TRUE
/// (checked here), which WebPKI refuses as an end entity.
fn self_signed(dir: &Path, name: &str) {
    let (pem, key) = (format!("{name}.pem"), format!("{name}.key"));
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=localhost", "-addext"])
        .args(["subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .args(["-keyout", &key, "-out", &pem])
        .current_dir(dir)
        .output()
        .expect("openssl (Debian's openssl package) runs");
    assert!(out.status.success(), "openssl req: {out:?}");
    let text = Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in", &pem])
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("CA:TRUE"), "marked as a CA: {text}");
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = scratch_dir(&format!("tls-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `curl` over TLS trusting `ca`, with `args`; its output, and whether it succeeded.
fn curl(ca: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(ca)
        .args(args)
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (
        out.status.success(),
        text + &String::from_utf8_lossy(&out.stderr),
    )
}

/// The status of a completion sent through `router` in plain HTTP.
async fn completion(router: &TestRouter) -> u16 {
    let url = format!("{}/v1/completions", router.url);
    let body = r#"{"model":"m","prompt":"x"}"#;
    let answer = reqwest::Client::new().post(url).body(body).send().await;
    answer.unwrap().status().as_u16()
}

fn https(url: &str) -> String {
    url.replace("http://", "https://")
}

fn tls_settings(dir: &Path, name: &str) -> Settings {
    Settings {
        tls_cert_file: Some(dir.join(format!("{name}.pem"))),
        tls_key_file: Some(dir.join(format!("{name}.key"))),
        ..Settings::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_over_tls_reaches_an_https_backend_verified_with_a_ca_file() {
    let dir = temp_dir("both");
    certificates(&dir, "server");
    let ca = dir.join("server-ca.pem");
    let upstream = TestUpstream::start("last").await;
    certificates(&dir, "admin");
    let backend = TestRouter::start(
        Settings {
            admin_tls_cert_file: Some(dir.join("admin.pem")),
            admin_tls_key_file: Some(dir.join("admin.key")),
            ..settings(&[&upstream]).overlay(tls_settings(&dir, "server"))
        },
        1,
    );
    let metrics = format!("{}/metrics", https(&backend.admin_url));
    let (ok, out) = curl(&dir.join("admin-ca.pem"), &[&metrics]);
    assert!(
        ok && out.contains("prefix_router_"),
        "the admin listener's own certificate: {out}"
    );
    assert!(!curl(&ca, &[&metrics]).0, "not the data listener's");
    let front = TestRouter::start(
        Settings {
            worker_urls: Some(vec![https(&backend.url)]),
            upstream_ca_file: Some(ca.clone()),
            ..settings(&[]).overlay(tls_settings(&dir, "server"))
        },
        1,
    );
    let body = r#"{"model":"m","messages":[{"role":"user","content":"over TLS \u00e9"}]}"#;
    let url = format!("{}/v1/chat/completions", https(&front.url));
    for (version, expected) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let (ok, out) = curl(
            &ca,
            &[
                version,
                "-w",
                "\n%{http_code} %{http_version}",
                "-H",
                "content-type: application/json",
                "--data-binary",
                body,
                &url,
            ],
        );
        assert!(ok, "curl {version}: {out}");
        assert!(
            out.ends_with(&format!("200 {expected}")),
            "{version}: {out}"
        );
    }
    let received = upstream.received();
    let chats: Vec<_> = received
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .collect();
    assert_eq!(chats.len(), 2, "both requests went through both routers");
    assert!(
        chats.iter().all(|r| r.body == body.as_bytes()),
        "byte for byte"
    );
    let (ok, out) = curl(&dir.join("missing.pem"), &[&url]);
    assert!(
        !ok,
        "a client that cannot verify the listener is refused: {out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backend_whose_certificate_cannot_be_verified_gets_nothing_unless_insecure() {
    let dir = temp_dir("verify");
    certificates(&dir, "server");
    let upstream = TestUpstream::start("last").await;
    let backend = TestRouter::start(
        settings(&[&upstream]).overlay(tls_settings(&dir, "server")),
        1,
    );
    let unverified = TestRouter::start(
        Settings {
            worker_urls: Some(vec![https(&backend.url)]),
            ..settings(&[])
        },
        0,
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        unverified.ready_backends(),
        0,
        "the system's roots do not hold the test CA"
    );
    assert_eq!(completion(&unverified).await, 503);
    let insecure = TestRouter::start(
        Settings {
            worker_urls: Some(vec![https(&backend.url)]),
            upstream_tls_insecure: Some(true),
            ..settings(&[])
        },
        1,
    );
    assert_eq!(completion(&insecure).await, 200);
    assert_eq!(
        upstream.count(),
        1,
        "only the insecure router's request arrived"
    );
}

/// The completions `upstream` received.
fn completions(upstream: &TestUpstream) -> Vec<ReceivedRequest> {
    let received = upstream.received().into_iter();
    received.filter(|r| r.path == "/v1/completions").collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backends_self_signed_ca_certificate_pinned_in_the_ca_file_is_trusted() {
    let dir = temp_dir("pinned");
    self_signed(&dir, "backend");
    let upstream = TestUpstream::start("last").await;
    let backend = TestRouter::start(
        settings(&[&upstream]).overlay(tls_settings(&dir, "backend")),
        1,
    );
    let front = TestRouter::start(
        Settings {
            worker_urls: Some(vec![https(&backend.url)]),
            upstream_ca_file: Some(dir.join("backend.pem")),
            ..settings(&[])
        },
        1,
    );
    assert_eq!(completion(&front).await, 200);
    let received = completions(&upstream);
    assert_eq!(
        received.len(),
        1,
        "the completion went through both routers"
    );
    assert_eq!(received[0].body, r#"{"model":"m","prompt":"x"}"#.as_bytes());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_self_signed_certificate_other_than_the_pinned_one_gets_nothing() {
    let dir = temp_dir("pinned-other");
    self_signed(&dir, "backend");
    self_signed(&dir, "other");
    let upstream = TestUpstream::start("last").await;
    let backend = TestRouter::start(
        settings(&[&upstream]).overlay(tls_settings(&dir, "backend")),
        1,
    );
    let front = TestRouter::start(
        Settings {
            worker_urls: Some(vec![https(&backend.url)]),
            upstream_ca_file: Some(dir.join("other.pem")),
            ..settings(&[])
        },
        0,
    );
    front
        .wait_until("the first health check failed", |r| {
            !r.state().fleet.awaiting_first_check()
        })
        .await;
    assert_eq!(front.ready_backends(), 0, "the same name, not the same key");
    assert_eq!(completion(&front).await, 503);
    assert!(completions(&upstream).is_empty(), "no request reached it");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_certificate_swapped_on_sighup_serves_new_handshakes_while_a_stream_goes_on() {
    let dir = temp_dir("sighup");
    certificates(&dir, "old");
    certificates(&dir, "new");
    let (old_ca, new_ca) = (dir.join("old-ca.pem"), dir.join("new-ca.pem"));
    for ext in ["pem", "key"] {
        std::fs::copy(
            dir.join(format!("old.{ext}")),
            dir.join(format!("served.{ext}")),
        )
        .unwrap();
    }
    let upstream = TestUpstream::start("trickle").await;
    upstream.set_reply(UpstreamReply::Trickle {
        chunks: 30,
        every: Duration::from_millis(100),
    });
    let (mut command, url, _) = router_binary();
    command.args([
        "--worker-urls",
        &upstream.url(),
        "--health-check-interval",
        "0.2",
    ]);
    command.arg("--tls-cert-file").arg(dir.join("served.pem"));
    command.arg("--tls-key-file").arg(dir.join("served.key"));
    let log = std::fs::File::create(dir.join("router.log")).unwrap();
    let router = TlsRouterProcess(command.stderr(log).spawn().unwrap());
    let health = format!("{}/health", https(&url));
    wait_for("the router to serve the old certificate", || {
        curl(&old_ca, &[&health]).0
    });
    let stream = Command::new("curl")
        .args(["-sS", "-N", "--max-time", "20", "--cacert"])
        .arg(&old_ca)
        .args(["-H", "content-type: application/json", "--data-binary"])
        .arg(r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
        .arg(format!("{}/v1/chat/completions", https(&url)))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the stream to start", || upstream.count() == 1);
    for ext in ["pem", "key"] {
        std::fs::copy(
            dir.join(format!("new.{ext}")),
            dir.join(format!("served.{ext}")),
        )
        .unwrap();
    }
    let status = Command::new("kill")
        .args(["-s", "HUP", &router.0.id().to_string()])
        .status();
    assert!(status.unwrap().success());
    wait_for("new handshakes to get the new certificate", || {
        curl(&new_ca, &[&health]).0
    });
    assert!(
        !curl(&old_ca, &[&health]).0,
        "the old CA no longer verifies the listener"
    );
    let out = stream.wait_with_output().unwrap();
    let events = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the open stream finished: {events}");
    assert_eq!(
        events.matches("data:").count(),
        31,
        "30 chunks and [DONE]: {events}"
    );
    // A TCP probe and a plain-HTTP client on the TLS port cost no request: not errors.
    drop(std::net::TcpStream::connect(url.trim_start_matches("http://")).unwrap());
    assert!(!curl(&new_ca, &[&url]).0, "plain HTTP on the TLS port");
    wait_for("the router to serve again", || curl(&new_ca, &[&health]).0);
    let log = std::fs::read_to_string(dir.join("router.log")).unwrap();
    assert!(log.contains("certificates reloaded"), "{log}");
    assert!(!log.contains("ERROR"), "{log}");
}

/// Polls `check` for up to 10 s.
fn wait_for(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child process killed when dropped.
struct TlsRouterProcess(std::process::Child);

impl Drop for TlsRouterProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
