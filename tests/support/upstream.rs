//! A real HTTP backend for tests, on 127.0.0.1 with a port from the OS. It records every
//! request it receives (method, path, headers, body) and answers as the test sets it up:
//! JSON, an SSE stream that can be held open, or an error status. `/health` answers 200
//! while healthy, 503 otherwise; `/metrics`, `/props` and `/v1/models` answer 404 unless
//! the test gives them pages (or models).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc, watch};

/// A request as the backend received it.
#[derive(Clone, Debug)]
pub struct ReceivedRequest {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// When it arrived.
    pub at: std::time::Instant,
}

/// How the backend answers non-health requests.
#[derive(Clone)]
pub enum UpstreamReply {
    /// `{"backend": name, "bytes": body length}` with status 200.
    Json,
    /// An SSE stream of `chunks` events; after the first, waits for the gate.
    Sse { chunks: usize, gate: Arc<Notify> },
    /// An empty response with this status.
    Status(u16),
    /// Waits this long before answering JSON.
    Slow(Duration),
    /// Drops the connection without answering.
    Hangup,
    /// JSON to a connection's first request; any later one on it is dropped unanswered, as
    /// by a server closing an idle keep-alive connection just as it is reused.
    OneAConnection,
    /// Never answers.
    Silent,
    /// A chunked body cut after its first chunk (the connection is dropped).
    Cut,
    /// An SSE stream of `chunks` events, one every `every`.
    Trickle { chunks: usize, every: Duration },
    /// JSON with a usage of `prompt` tokens, `cached` of them from the prefix cache.
    Usage { prompt: u64, cached: u64 },
    /// This JSON body with status 200.
    Body(String),
    /// A Responses stream: `response.created` naming `resp_{name}`, then, once the gate
    /// opens, `response.completed`.
    Created { gate: Arc<Notify> },
}

struct UpstreamState {
    name: String,
    connections: std::sync::atomic::AtomicUsize,
    /// Connections being served now.
    open: std::sync::atomic::AtomicUsize,
    received: Mutex<Vec<ReceivedRequest>>,
    inflight: std::sync::atomic::AtomicUsize,
    max_inflight: std::sync::atomic::AtomicUsize,
    healthy: AtomicBool,
    reply: Mutex<UpstreamReply>,
    /// Bodies of `GET /metrics` and `GET /props`, when set.
    pages: Mutex<Option<(String, String)>>,
    /// The `/v1/models` answer; 404 when none.
    models: Mutex<Option<String>>,
}

/// A running test backend; stops when dropped.
pub struct TestUpstream {
    pub addr: SocketAddr,
    shared: Arc<UpstreamState>,
    stop: watch::Sender<bool>,
}

impl TestUpstream {
    /// Starts a backend called `name`.
    pub async fn start(name: &str) -> TestUpstream {
        Self::start_on(name, "127.0.0.1:0".parse().unwrap()).await
    }

    /// Starts a backend called `name` on `addr` (to bring a killed one back on its port).
    pub async fn start_on(name: &str, addr: SocketAddr) -> TestUpstream {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(UpstreamState {
            name: name.to_string(),
            connections: Default::default(),
            open: Default::default(),
            received: Mutex::new(Vec::new()),
            inflight: Default::default(),
            max_inflight: Default::default(),
            healthy: AtomicBool::new(true),
            reply: Mutex::new(UpstreamReply::Json),
            pages: Mutex::new(None),
            models: Mutex::new(None),
        });
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(serve(listener, Arc::clone(&shared), stopped));
        TestUpstream { addr, shared, stop }
    }

    /// Stops listening and drops every open connection (a crashed backend); returns once
    /// every connection is gone, so that what it received is final (bounded: 5 s).
    pub async fn kill(&self) {
        let _ = self.stop.send(true);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while self.shared.open.load(SeqCst) > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "connections still open"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its name, as it reports in JSON replies.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Requests received so far, health checks excluded.
    pub fn received(&self) -> Vec<ReceivedRequest> {
        self.shared.received.lock().clone()
    }

    /// The most requests it had in flight at once (JSON and slow replies).
    pub fn max_inflight(&self) -> usize {
        self.shared.max_inflight.load(SeqCst)
    }

    /// How many requests it received, health checks excluded.
    pub fn count(&self) -> usize {
        self.shared.received.lock().len()
    }

    /// TCP connections accepted so far (health checks included).
    pub fn connections(&self) -> usize {
        self.shared.connections.load(SeqCst)
    }

    /// Makes `/health` pass or fail.
    pub fn set_healthy(&self, healthy: bool) {
        self.shared.healthy.store(healthy, SeqCst);
    }

    /// Changes how it answers.
    pub fn set_reply(&self, reply: UpstreamReply) {
        *self.shared.reply.lock() = reply;
    }

    /// Lists `models` (name and parent, for an adapter) on `/v1/models`, as vLLM does.
    pub fn set_models(&self, models: &[(&str, Option<&str>)]) {
        let data: Vec<serde_json::Value> = (models.iter())
            .map(|(id, parent)| serde_json::json!({"id": id, "object": "model", "parent": parent}))
            .collect();
        let list = serde_json::json!({"object": "list", "data": data}).to_string();
        *self.shared.models.lock() = Some(list);
    }

    /// Serves `metrics` on `/metrics` and `props` on `/props` (an engine describing itself).
    pub fn set_pages(&self, metrics: &str, props: &str) {
        *self.shared.pages.lock() = Some((metrics.to_string(), props.to_string()));
    }
}

impl Drop for TestUpstream {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn serve(
    listener: TcpListener,
    shared: Arc<UpstreamState>,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stopped.changed() => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        shared.connections.fetch_add(1, SeqCst);
        shared.open.fetch_add(1, SeqCst);
        let shared = Arc::clone(&shared);
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            let handler = Arc::clone(&shared);
            let served = Arc::new(AtomicUsize::new(0));
            let service =
                service_fn(move |req| handle(Arc::clone(&handler), req, Arc::clone(&served)));
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = stopped.changed() => {}
            }
            shared.open.fetch_sub(1, SeqCst);
        });
    }
}

type TestBody = BoxBody<Bytes, std::io::Error>;

fn full(bytes: Bytes) -> TestBody {
    Full::new(bytes)
        .map_err(|never: Infallible| match never {})
        .boxed()
}

/// Answers `req`, the connection's request number `served` counts (from 0).
async fn handle(
    shared: Arc<UpstreamState>,
    req: Request<Incoming>,
    served: Arc<AtomicUsize>,
) -> Result<Response<TestBody>, std::io::Error> {
    if req.uri().path() == "/health" {
        let status = if shared.healthy.load(SeqCst) {
            200
        } else {
            503
        };
        return Ok(status_only(status));
    }
    if req.uri().path() == "/v1/models" {
        return Ok(match shared.models.lock().clone() {
            Some(list) => Response::new(full(Bytes::from(list))),
            None => status_only(404),
        });
    }
    let page = match req.uri().path() {
        "/metrics" => Some(0),
        "/props" => Some(1),
        _ => None,
    };
    if let Some(page) = page {
        let pages = shared.pages.lock().clone();
        return Ok(match pages {
            Some((metrics, props)) => {
                let body = if page == 0 { metrics } else { props };
                Response::new(full(Bytes::from(body)))
            }
            None => status_only(404),
        });
    }
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let len = body.len();
    shared.received.lock().push(ReceivedRequest {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        headers: parts.headers,
        body,
        at: std::time::Instant::now(),
    });
    let reply = shared.reply.lock().clone();
    Ok(match reply {
        UpstreamReply::Json => json(&shared.name, len),
        UpstreamReply::Usage { prompt, cached } => {
            let usage = format!(
                r#"{{"backend":"{}","usage":{{"prompt_tokens":{prompt},"completion_tokens":1,"prompt_tokens_details":{{"cached_tokens":{cached}}}}}}}"#,
                shared.name
            );
            Response::new(full(Bytes::from(usage)))
        }
        UpstreamReply::Body(body) => Response::new(full(Bytes::from(body))),
        UpstreamReply::Slow(wait) => {
            let now = shared.inflight.fetch_add(1, SeqCst) + 1;
            shared.max_inflight.fetch_max(now, SeqCst);
            tokio::time::sleep(wait).await;
            shared.inflight.fetch_sub(1, SeqCst);
            json(&shared.name, len)
        }
        UpstreamReply::Status(status) => status_only(status),
        UpstreamReply::Sse { chunks, gate } => sse(chunks, gate),
        UpstreamReply::Hangup => return Err(std::io::Error::other("hang up")),
        UpstreamReply::OneAConnection if served.fetch_add(1, SeqCst) > 0 => {
            return Err(std::io::Error::other("closed while idle"));
        }
        UpstreamReply::OneAConnection => json(&shared.name, len),
        UpstreamReply::Silent => std::future::pending().await,
        UpstreamReply::Cut => cut(),
        UpstreamReply::Trickle { chunks, every } => trickle(chunks, every),
        UpstreamReply::Created { gate } => created(&shared.name, gate),
    })
}

fn json(name: &str, len: usize) -> Response<TestBody> {
    let text = format!(r#"{{"backend":"{name}","bytes":{len}}}"#);
    Response::builder()
        .header("content-type", "application/json")
        .header("x-upstream", name)
        .body(full(Bytes::from(text)))
        .unwrap()
}

fn status_only(status: u16) -> Response<TestBody> {
    let mut resp = Response::new(full(Bytes::new()));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap();
    resp
}

type Frames = mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>;

/// A streamed response whose frames `produce` sends.
fn stream<F>(content_type: &str, produce: impl FnOnce(Frames) -> F) -> Response<TestBody>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(produce(tx));
    let frames =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
    Response::builder()
        .header("content-type", content_type)
        .body(BodyExt::boxed(StreamBody::new(frames)))
        .unwrap()
}

fn event(i: usize) -> Result<Frame<Bytes>, std::io::Error> {
    Ok(Frame::data(Bytes::from(format!(
        "data: {{\"chunk\":{i}}}\n\n"
    ))))
}

fn done() -> Result<Frame<Bytes>, std::io::Error> {
    Ok(Frame::data(Bytes::from_static(b"data: [DONE]\n\n")))
}

fn sse(chunks: usize, gate: Arc<Notify>) -> Response<TestBody> {
    stream("text/event-stream", move |tx| async move {
        for i in 0..chunks {
            if tx.send(event(i)).await.is_err() {
                return;
            }
            if i == 0 {
                gate.notified().await;
            }
        }
        let _ = tx.send(done()).await;
    })
}

fn created(name: &str, gate: Arc<Notify>) -> Response<TestBody> {
    let id = format!("resp_{name}");
    stream("text/event-stream", move |tx| async move {
        let event = |kind: &str| {
            let data = format!(r#"{{"type":"response.{kind}","response":{{"id":"{id}"}}}}"#);
            Ok(Frame::data(Bytes::from(format!(
                "event: response.{kind}\ndata: {data}\n\n"
            ))))
        };
        if tx.send(event("created")).await.is_err() {
            return;
        }
        gate.notified().await;
        let _ = tx.send(event("completed")).await;
    })
}

fn trickle(chunks: usize, every: Duration) -> Response<TestBody> {
    stream("text/event-stream", move |tx| async move {
        for i in 0..chunks {
            if tx.send(event(i)).await.is_err() {
                return;
            }
            tokio::time::sleep(every).await;
        }
        let _ = tx.send(done()).await;
    })
}

fn cut() -> Response<TestBody> {
    stream("text/event-stream", |tx| async move {
        let _ = tx.send(event(0)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = tx.send(Err(std::io::Error::other("backend crashed"))).await;
    })
}
