//! The paths each listener owns, below both: the admin listener serves the admin
//! endpoints, and the data plane answers 404 to their paths instead of forwarding them.
//! The data plane answers its own probes ([`Probe`]) itself, forwarding nothing.

use http::Method;

/// An admin endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminEndpoint {
    /// `GET /metrics`.
    Metrics,
    /// `GET /stats`.
    Stats,
    /// `GET /workers`.
    Workers,
    /// `GET /list_workers`.
    ListWorkers,
    /// `POST /add_worker`.
    AddWorker,
    /// `POST /remove_worker`.
    RemoveWorker,
    /// `POST /reload`.
    Reload,
    /// `POST /route`.
    Route,
}

/// What the data plane answers itself: the router's own health, for load balancers and
/// orchestrators pointed at the data port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// `/health`, `/healthz`, `/readiness`, `/readyz`: 200 while the router can route (a
    /// backend is ready and it is not draining), else 503.
    Ready,
    /// `/liveness`, `/livez`: 200 while the process answers.
    Live,
}

/// The probe a `GET` or `HEAD` of `path` asks for, if any.
pub fn probe(method: &Method, path: &str) -> Option<Probe> {
    if method != Method::GET && method != Method::HEAD {
        return None;
    }
    match path {
        "/health" | "/healthz" | "/readiness" | "/readyz" => Some(Probe::Ready),
        "/liveness" | "/livez" => Some(Probe::Live),
        _ => None,
    }
}

/// Every admin endpoint, declared once: the admin listener serves these and the data plane
/// answers 404 to their paths (`/health` is both listeners' own and is not listed).
pub const ENDPOINTS: [(Method, &str, AdminEndpoint); 8] = [
    (Method::GET, "/metrics", AdminEndpoint::Metrics),
    (Method::GET, "/stats", AdminEndpoint::Stats),
    (Method::GET, "/workers", AdminEndpoint::Workers),
    (Method::GET, "/list_workers", AdminEndpoint::ListWorkers),
    (Method::POST, "/add_worker", AdminEndpoint::AddWorker),
    (Method::POST, "/remove_worker", AdminEndpoint::RemoveWorker),
    (Method::POST, "/reload", AdminEndpoint::Reload),
    (Method::POST, "/route", AdminEndpoint::Route),
];

/// Whether `path` is an admin endpoint's (whatever the method).
pub fn is_admin(path: &str) -> bool {
    ENDPOINTS.iter().any(|(_, p, _)| *p == path)
}
