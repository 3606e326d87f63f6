//! Worker URLs: `http://host:port` base URLs of backends, checked once. A host may be a name;
//! resolving it is the fleet's job (it re-resolves names over time).

use super::{ConfigError, invalid};

/// One configured backend base URL.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Worker {
    /// The URL as configured, without a trailing slash, e.g. `http://10.0.0.5:8000`.
    pub url: String,
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// Port; 80 when the URL has none.
    pub port: u16,
}

impl Worker {
    /// Parses one base URL. Only `http` is supported; paths other than `/` are refused,
    /// since the router forwards request paths unchanged.
    pub fn parse(url: &str) -> Result<Worker, String> {
        let trimmed = url.trim().trim_end_matches('/');
        let uri: http::Uri = trimmed.parse().map_err(|e| format!("`{url}`: {e}"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(format!(
                    "`{url}`: scheme {other} is not supported, use http"
                ));
            }
            None => return Err(format!("`{url}`: missing http:// scheme")),
        }
        if uri.path() != "/" && !uri.path().is_empty() {
            return Err(format!("`{url}`: a worker URL has no path"));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("`{url}`: missing host"))?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err(format!("`{url}`: missing host"));
        }
        Ok(Worker {
            url: trimmed.to_string(),
            host: host.to_string(),
            port: authority.port_u16().unwrap_or(80),
        })
    }
}

/// Parses every URL, refusing duplicates.
pub fn parse_all(urls: Vec<String>) -> Result<Vec<Worker>, ConfigError> {
    let mut workers: Vec<Worker> = Vec::with_capacity(urls.len());
    for url in &urls {
        let worker = Worker::parse(url).map_err(|reason| invalid("worker_urls", reason))?;
        if workers
            .iter()
            .any(|w| (&w.host, w.port) == (&worker.host, worker.port))
        {
            return Err(invalid("worker_urls", format!("`{url}` is listed twice")));
        }
        workers.push(worker);
    }
    Ok(workers)
}
