//! Security: admin endpoints behind a token and off the data plane, the upstream host not
//! chosen by clients, hop-by-hop headers dropped, request ids, and secrets kept out of logs.

use std::time::Duration;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_need_the_token() {
    let up = TestUpstream::start("a").await;
    let dir = scratch_dir("token");
    let token_file = dir.join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let mut s = settings(&[&up]);
    s.admin_token_file = Some(token_file);
    let router = TestRouter::start(s, 1);
    let get = |token: Option<&str>| {
        let request = client().get(format!("{}/metrics", router.admin_url));
        let request = match token {
            Some(t) => request.header("authorization", format!("Bearer {t}")),
            None => request,
        };
        request.send()
    };
    assert_eq!(get(None).await.unwrap().status(), 401);
    assert_eq!(get(Some("wrong")).await.unwrap().status(), 401);
    assert_eq!(get(Some("s3cret-token")).await.unwrap().status(), 200);
    let reload = client()
        .post(format!(
            "{}/add_worker?url=http://10.1.1.1:1",
            router.admin_url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(reload.status(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_cannot_choose_the_upstream_or_pass_hop_by_hop_headers() {
    let up = TestUpstream::start("a").await;
    let router = TestRouter::start(settings(&[&up]), 1);
    let resp = client()
        .post(format!("{}/v1/chat/completions", router.url))
        .header("host", "evil.example:80")
        .header("x-forwarded-host", "evil.example")
        .header("connection", "keep-alive, x-secret-hop")
        .header("x-secret-hop", "1")
        .header("keep-alive", "timeout=5")
        .header("te", "trailers")
        .header("proxy-connection", "keep-alive")
        .json(&chat(&[("user", "hi".into())]))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let received = &up.received()[0];
    assert_eq!(received.headers["host"], up.addr.to_string());
    for hop in [
        "connection",
        "x-secret-hop",
        "keep-alive",
        "te",
        "proxy-connection",
    ] {
        assert!(received.headers.get(hop).is_none(), "{hop} was forwarded");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_made_when_absent_and_kept_when_given() {
    let up = TestUpstream::start("a").await;
    let router = TestRouter::start(settings(&[&up]), 1);
    let body = chat(&[("user", "hi".into())]);
    let made = client()
        .post(format!("{}/v1/chat/completions", router.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    let id = made.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(id.len(), 32);
    assert_eq!(up.received()[0].headers["x-request-id"], id.as_str());
    let given = client()
        .post(format!("{}/v1/chat/completions", router.url))
        .header("x-request-id", "trace-123")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(given.headers()["x-request-id"], "trace-123");
    assert_eq!(up.received()[1].headers["x-request-id"], "trace-123");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_the_logs_nor_the_metrics() {
    let up = TestUpstream::start("a").await;
    // A tenant whose key is the first secret, so that the tenant paths run too; the file
    // holds its hash only.
    let dir = scratch_dir("secrets");
    let tenants = dir.join("tenants.toml");
    let hash = sha256_entry("sk-very-secret-1");
    std::fs::write(&tenants, format!("[tenants.acme]\nkeys = [\"{hash}\"]\n")).unwrap();
    let (mut command, url, admin) = router_binary();
    let mut child = command
        .args([
            "--worker-urls",
            &up.url(),
            "--health-check-interval",
            "0.2",
            "--threads",
            "1",
            "--tenants-file",
            tenants.to_str().unwrap(),
        ])
        .env("RUST_LOG", "trace")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let log = Log::read(child.stderr.take().unwrap());
    let mut ok = false;
    for _ in 0..200 {
        let sent = client()
            .post(format!("{url}/v1/chat/completions"))
            .header("authorization", "Bearer sk-very-secret-1")
            .header("x-api-key", "sk-very-secret-2")
            .json(&chat(&[("user", "hi".into())]))
            .send()
            .await;
        if sent.is_ok_and(|r| r.status() == 200) {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok, "the router never answered");
    // An unknown key is refused, and not repeated either.
    let refused = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("authorization", "Bearer sk-very-secret-3")
        .json(&chat(&[("user", "hi".into())]))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let body = refused.text().await.unwrap();
    assert!(!body.contains("sk-very-secret"), "the 401 repeats the key");
    let metrics = metrics_text(&admin).await;
    assert!(
        metrics
            .contains("prefix_router_tenant_requests_total{priority=\"normal\",tenant=\"acme\"} 1")
    );
    assert!(
        !metrics.contains("sk-very-secret"),
        "a secret reached the metrics"
    );
    // The access log line is written after the response is sent.
    let logged = log.wait_for("POST /v1/chat/completions", Duration::from_secs(10));
    let _ = child.kill();
    let _ = child.wait();
    let logs = log.text();
    assert!(logged, "the request was not logged at all");
    assert!(
        !logs.contains("sk-very-secret"),
        "a secret reached the logs"
    );
    assert_eq!(
        up.received().last().unwrap().headers["authorization"],
        "Bearer sk-very-secret-1"
    );
}
