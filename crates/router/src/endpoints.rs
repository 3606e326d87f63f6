//! The paths each listener owns, below both: the admin listener serves the admin
//! endpoints, and the data plane answers 404 to their paths instead of forwarding them.

use http::Method;

/// An admin endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
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

/// Every admin endpoint, declared once: the admin listener serves these and the data plane
/// answers 404 to their paths (`/health` is both listeners' own and is not listed).
pub const ENDPOINTS: [(Method, &str, Endpoint); 8] = [
    (Method::GET, "/metrics", Endpoint::Metrics),
    (Method::GET, "/stats", Endpoint::Stats),
    (Method::GET, "/workers", Endpoint::Workers),
    (Method::GET, "/list_workers", Endpoint::ListWorkers),
    (Method::POST, "/add_worker", Endpoint::AddWorker),
    (Method::POST, "/remove_worker", Endpoint::RemoveWorker),
    (Method::POST, "/reload", Endpoint::Reload),
    (Method::POST, "/route", Endpoint::Route),
];

/// Whether `path` is an admin endpoint's (whatever the method).
pub fn is_admin(path: &str) -> bool {
    ENDPOINTS.iter().any(|(_, p, _)| *p == path)
}
