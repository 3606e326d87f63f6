//! Worker URLs: `http://host:port` or `https://host:port` base URLs of backends, checked
//! once. A host may be a name;
//! resolving it is discovery's job (it re-resolves names over time). A worker of a static
//! model pool carries the pool's models. A worker of a disaggregated fleet has a [`Role`]:
//! prefill, decode, or both (every worker of a fleet without roles).

use std::sync::Arc;

use super::{Served, ServedModel};

/// One configured backend base URL.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Worker {
    /// The URL as configured, without a trailing slash, e.g. `http://10.0.0.5:8000`.
    pub url: String,
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// Port; 80 (443 for `https`) when the URL has none.
    pub port: u16,
    /// Whether it is reached over TLS (`https://`).
    pub tls: bool,
    /// The models of its static pools (`[[models]]`); `None`: what it lists.
    pub models: Option<Arc<Served>>,
    /// Which legs of a disaggregated request it serves (`prefill`, `decode`).
    pub role: Role,
}

/// Which legs of a request a worker serves, where prefill and decode are disaggregated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Any leg, and whole requests (`worker_urls`, or listed in both `prefill` and `decode`).
    #[default]
    Both,
    /// Prefill legs only (`prefill`).
    Prefill,
    /// Decode legs, and whole requests that are not disaggregated (`decode`).
    Decode,
}

/// One leg of a request, or the whole of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Leg {
    /// A request sent whole to one backend.
    #[default]
    Whole,
    /// The prefill of a disaggregated request: its prompt, computed and handed over.
    Prefill,
    /// The decode of a disaggregated request, after its prefill elsewhere.
    Decode,
}

impl Leg {
    /// Its name in traces; `None` for a whole request.
    pub fn name(self) -> Option<&'static str> {
        match self {
            Leg::Whole => None,
            Leg::Prefill => Some("prefill"),
            Leg::Decode => Some("decode"),
        }
    }
}

impl Role {
    /// Whether a worker of this role serves `leg`.
    pub fn serves(self, leg: Leg) -> bool {
        match self {
            Role::Both => true,
            Role::Prefill => leg == Leg::Prefill,
            Role::Decode => leg != Leg::Prefill,
        }
    }

    /// The role of a worker listed both as `self` and as `other`.
    fn with(self, other: Role) -> Role {
        if self == other { self } else { Role::Both }
    }

    /// The role `name`d so in the config, the admin API and `/workers`.
    pub fn named(name: &str) -> Option<Role> {
        [Role::Both, Role::Prefill, Role::Decode]
            .into_iter()
            .find(|r| r.name() == name)
    }

    /// Its name in the config and in `/workers`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Both => "both",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

impl Worker {
    /// Parses one base URL, `http` or `https`; paths other than `/` are refused,
    /// since the router forwards request paths unchanged.
    pub fn parse(url: &str) -> Result<Worker, WorkerError> {
        let error = |reason: String| WorkerError {
            url: url.to_string(),
            reason,
        };
        let trimmed = url.trim().trim_end_matches('/');
        let uri: http::Uri = trimmed.parse().map_err(|e| error(format!("{e}")))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(other) => {
                return Err(error(format!(
                    "scheme {other} is not supported, use http or https"
                )));
            }
            None => return Err(error("missing http:// or https:// scheme".into())),
        };
        if uri.path() != "/" && !uri.path().is_empty() {
            return Err(error("a worker URL has no path".into()));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| error("missing host".into()))?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err(error("missing host".into()));
        }
        Ok(Worker {
            url: trimmed.to_string(),
            host: host.to_string(),
            port: (authority.port_u16()).unwrap_or(if tls { 443 } else { 80 }),
            tls,
            models: None,
            role: Role::Both,
        })
    }

    /// Whether both name the same host and port.
    pub fn same_place(&self, other: &Worker) -> bool {
        (&self.host, self.port) == (&other.host, other.port)
    }

    /// Parses every URL, refusing duplicates.
    pub fn parse_all(urls: &[String]) -> Result<Vec<Worker>, WorkerError> {
        let mut workers: Vec<Worker> = Vec::with_capacity(urls.len());
        for url in urls {
            let worker = Worker::parse(url)?;
            if workers.iter().any(|w| w.same_place(&worker)) {
                return Err(WorkerError {
                    url: url.clone(),
                    reason: "listed twice".into(),
                });
            }
            workers.push(worker);
        }
        Ok(workers)
    }
}

/// Adds the workers of a static pool serving `names` (a model and its aliases) at `urls`
/// to `workers`: a worker already there serves these names too, as a pool member.
pub fn add_pool(
    workers: &mut Vec<Worker>,
    names: &[String],
    urls: &[String],
) -> Result<(), WorkerError> {
    let models = names.iter().map(|id| ServedModel {
        id: id.clone(),
        parent: None,
    });
    for url in urls {
        let worker = Worker::parse(url)?;
        let index = match workers.iter().position(|w| w.same_place(&worker)) {
            Some(i) => i,
            None => {
                workers.push(worker);
                workers.len() - 1
            }
        };
        let served = &mut workers[index].models;
        let mut all = served.as_ref().map_or_else(Vec::new, |s| s.models.clone());
        all.extend(models.clone());
        *served = Some(Arc::new(Served::new(all)));
    }
    Ok(())
}

/// Adds the workers listed for `role` at `urls` (`prefill`, `decode`) to `workers`: a
/// worker listed for another role too serves both.
pub fn add_role(workers: &mut Vec<Worker>, role: Role, urls: &[String]) -> Result<(), WorkerError> {
    for url in urls {
        let worker = Worker::parse(url)?;
        match workers.iter_mut().find(|w| w.same_place(&worker)) {
            Some(listed) => listed.role = listed.role.with(role),
            None => workers.push(Worker { role, ..worker }),
        }
    }
    Ok(())
}

/// A worker URL the router cannot use.
#[derive(Debug, thiserror::Error)]
#[error("`{url}`: {reason}")]
pub struct WorkerError {
    /// The URL as given.
    pub url: String,
    /// What is wrong with it.
    pub reason: String,
}
