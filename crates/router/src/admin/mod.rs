//! The admin listener, separate from the data plane and bound to 127.0.0.1 by default:
//! `/metrics` (Prometheus text), `/stats` and `/workers` (JSON), the peers' worker endpoints
//! (`/list_workers`, `POST /add_worker?url=`, `POST /remove_worker?url=`), `POST /reload`,
//! `POST /route` (what the router would do with a request: [`explain`]) and `/health`. With a token configured, every request needs `Authorization: Bearer`.

mod explain;
mod view;

use std::sync::Arc;

use async_trait::async_trait;
use http::{Method, Response, StatusCode};
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;
use serde_json::{Value, json};

use crate::control::Control;
use bytes::Bytes;

use crate::endpoints::{AdminEndpoint, ENDPOINTS};
use crate::error::{RouterError, error_body};
use crate::fleet::FleetGauges;
use crate::state::State;

fn endpoint(method: &Method, path: &str) -> Option<AdminEndpoint> {
    let found = ENDPOINTS.iter().find(|(m, p, _)| m == method && *p == path);
    found.map(|&(_, _, endpoint)| endpoint)
}

/// The admin application.
pub struct Admin {
    state: Arc<State>,
    control: Arc<Control>,
    token: Option<String>,
    gauges: FleetGauges,
}

impl Admin {
    /// Admin over `state` and `control`; `token`, when given, is required as a bearer token.
    /// The fleet's `gauges` are set before each scrape.
    pub fn new(
        state: Arc<State>,
        control: Arc<Control>,
        token: Option<String>,
        gauges: FleetGauges,
    ) -> Self {
        Admin {
            state,
            control,
            token,
            gauges,
        }
    }

    fn authorized(&self, session: &ServerSession) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let header = session.get_header_bytes(http::header::AUTHORIZATION);
        let given = header.strip_prefix(b"Bearer ").unwrap_or_default();
        constant_time_eq(given, token.as_bytes())
    }

    async fn route(&self, method: &Method, path: &str, query: Option<&str>) -> Response<Vec<u8>> {
        if (method, path) == (&Method::GET, "/health") {
            return text(StatusCode::OK, "text/plain", b"ok".to_vec());
        }
        let Some(endpoint) = endpoint(method, path) else {
            let message = format!("{method} {path} is not an admin endpoint");
            return failure(StatusCode::NOT_FOUND, &message, "not_found");
        };
        let url = query.and_then(|q| param(q, "url"));
        match endpoint {
            AdminEndpoint::Metrics => self.metrics(),
            AdminEndpoint::Stats => json_ok(&view::stats(&self.state)),
            AdminEndpoint::Workers => json_ok(&view::workers(&self.state)),
            AdminEndpoint::ListWorkers => {
                json_ok(&json!({"urls": self.control.worker_urls().await}))
            }
            AdminEndpoint::AddWorker => {
                let role = query.and_then(|q| param(q, "role"));
                self.change(url, WorkerChange::Add(role)).await
            }
            AdminEndpoint::RemoveWorker => self.change(url, WorkerChange::Remove).await,
            AdminEndpoint::Route => failure(StatusCode::BAD_REQUEST, "no body", "invalid_request"),
            AdminEndpoint::Reload => match self.control.reload().await {
                Ok(()) => {
                    json_ok(&json!({"reloaded": true, "generation": self.state.stats.generation()}))
                }
                Err(e) => failure(StatusCode::BAD_REQUEST, &e.to_string(), "reload_failed"),
            },
        }
    }

    /// `POST /route?path=`: reads the body (up to `max_body_bytes`) and explains it.
    async fn explain(&self, session: &mut ServerSession, query: Option<&str>) -> Response<Vec<u8>> {
        let path = query.and_then(|q| param(q, "path"));
        let path = path.as_deref().unwrap_or("/v1/chat/completions");
        let limit = self.state.live().limits.max_body_bytes;
        let explained = match read_body(session, limit).await {
            Ok(body) => {
                let headers = &session.req_header().headers;
                explain::explain(&self.state, path, headers, body).await
            }
            Err(e) => Err(e),
        };
        match explained {
            Ok(value) => json_ok(&value),
            Err(e) => {
                let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
                text(status, "application/json", e.body().to_vec())
            }
        }
    }

    fn metrics(&self) -> Response<Vec<u8>> {
        view::refresh_gauges(&self.state, &self.gauges);
        let body = self.state.stats.render();
        text(StatusCode::OK, "text/plain; version=0.0.4", body)
    }

    async fn change(&self, url: Option<String>, change: WorkerChange) -> Response<Vec<u8>> {
        let Some(url) = url else {
            return failure(
                StatusCode::BAD_REQUEST,
                "missing ?url= parameter",
                "missing_url",
            );
        };
        let result = match change {
            WorkerChange::Add(role) => self.control.add_worker(&url, role.as_deref()).await,
            WorkerChange::Remove => self.control.remove_worker(&url).await,
        };
        match result {
            Ok(()) => json_ok(&json!({"ok": true, "urls": self.control.worker_urls().await})),
            Err(e) => failure(StatusCode::BAD_REQUEST, &e.to_string(), "invalid_worker"),
        }
    }
}

/// A change of the worker list.
enum WorkerChange {
    /// With a role (`prefill`, `decode` or `both`, the default).
    Add(Option<String>),
    Remove,
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        if !self.authorized(session) {
            return failure(
                StatusCode::UNAUTHORIZED,
                "admin token required",
                "unauthorized",
            );
        }
        let head = session.req_header();
        let (method, path) = (head.method.clone(), head.uri.path().to_string());
        let query = head.uri.query().map(str::to_string);
        if endpoint(&method, &path) == Some(AdminEndpoint::Route) {
            return self.explain(session, query.as_deref()).await;
        }
        self.route(&method, &path, query.as_deref()).await
    }
}

/// Query parameter `name`, percent-decoded.
fn param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key == name).then(|| percent_decode(value))
    })
}

/// The whole request body, refused past `limit` bytes.
async fn read_body(session: &mut ServerSession, limit: usize) -> Result<Bytes, RouterError> {
    let mut body = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) if body.len() + chunk.len() > limit => {
                return Err(RouterError::BodyTooLarge { limit });
            }
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => return Ok(Bytes::from(body)),
            Err(e) => return Err(RouterError::Malformed(e.to_string())),
        }
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn text(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, value);
    }
    resp
}

fn json_ok(value: &Value) -> Response<Vec<u8>> {
    text(
        StatusCode::OK,
        "application/json",
        value.to_string().into_bytes(),
    )
}

fn failure(status: StatusCode, message: &str, code: &str) -> Response<Vec<u8>> {
    let body = error_body(message, "invalid_request_error", code).to_vec();
    text(status, "application/json", body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_parameter_is_decoded() {
        assert_eq!(
            param("x=1&url=http%3A%2F%2F10.0.0.1%3A8000", "url").as_deref(),
            Some("http://10.0.0.1:8000")
        );
        assert_eq!(
            param("url=http://a:1", "url").as_deref(),
            Some("http://a:1")
        );
        assert_eq!(param("other=1", "url"), None);
    }

    #[test]
    fn tokens_compare_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
    }
}
