//! Tenants: who a request is for, from the SHA-256 of its API key (`Authorization: Bearer`,
//! else `x-api-key`) looked up in the tenants file, and how much it may ask for: its
//! priority cap (`x-priority` is clamped to it) and its rate limits ([`rate`]). The file
//! holds only hashes, never keys; tenants come only from the file, so every label and
//! every table is bounded by it. With no file every request is one tenant and nothing
//! changes.

pub mod preempt;
pub mod rate;
mod tenancy;

pub use prefix_router_core::flow::{Priority, Share, Shares};
pub use tenancy::{Charge, Tenancy};

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use http::HeaderMap;
use prefix_router_core::flow::{ACTIVE_AFTER, TenantId};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::stats::Label;

impl Label for Priority {
    const ALL: &'static [Self] = &Priority::ALL;
    fn label(self) -> &'static str {
        Priority::label(self)
    }
}

/// One tenant of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    /// Its name in the file (`[tenants.NAME]`): the metrics' label.
    pub name: TenantId,
    /// Its fair share against the other tenants. Default 1.
    pub weight: u32,
    /// Prompt and completion tokens a minute at most; 0: no limit. Default 0.
    pub tokens_per_minute: u64,
    /// Requests a minute at most; 0: no limit. Default 0.
    pub requests_per_minute: u64,
    /// The highest `x-priority` honoured. Default `normal`.
    pub max_priority: Priority,
    /// Slots of each held backend its requests leave free for a light flow or a higher
    /// priority to arrive at, while none is active: the file's `standing_slots`, the same
    /// for every tenant. Default 0.
    pub standing_slots: usize,
    /// Whether its requests carry their priority to the engine, as vLLM's
    /// `X-Vllm-Priority` header: the file's `engine_priority`, the same for every tenant.
    /// Default true.
    pub engine_priority: bool,
}

/// The tenants of the file, by the SHA-256 of their keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tenants {
    tenants: Vec<Tenant>,
    by_key: HashMap<[u8; 32], usize>,
    /// The tenant of requests without a key (`[tenants.default]`).
    default: Option<usize>,
    /// Whether a file is configured.
    configured: bool,
    /// The file's `standing_slots`.
    standing_slots: usize,
    /// The file's `active_after` (`None`: not set).
    active_after: Option<Duration>,
}

/// Why a request's tenant is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Its key is in no tenant's list, or it has none and there is no default tenant.
    UnknownKey,
    /// Its `x-priority` is not `high`, `normal` or `low`.
    BadPriority,
}

/// Who a request is for.
#[derive(Clone, Copy, Debug)]
pub struct Identity<'t> {
    /// Its tenant; `None` without a tenants file.
    pub tenant: Option<&'t Tenant>,
    /// Its priority, clamped to the tenant's cap.
    pub priority: Priority,
}

/// A tenants file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TenantsError(String);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    standing_slots: usize,
    #[serde(default = "yes")]
    engine_priority: bool,
    /// Seconds.
    active_after: Option<f64>,
    #[serde(default)]
    tenants: BTreeMap<String, TenantEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    #[serde(default)]
    keys: Vec<String>,
    weight: Option<u32>,
    tokens_per_minute: Option<u64>,
    requests_per_minute: Option<u64>,
    max_priority: Option<String>,
}

fn yes() -> bool {
    true
}

impl Tenants {
    /// Reads and checks the tenants file at `path`.
    pub fn load(path: &Path) -> Result<Tenants, TenantsError> {
        let shown = path.display();
        let text = std::fs::read_to_string(path)
            .map_err(|e| TenantsError(format!("cannot read {shown}: {e}")))?;
        Tenants::parse(&text).map_err(|e| TenantsError(format!("{shown}: {}", e.0)))
    }

    /// The tenants of a file's `text`.
    pub fn parse(text: &str) -> Result<Tenants, TenantsError> {
        let file: File = toml::from_str(text).map_err(|e| TenantsError(e.to_string()))?;
        let active_after = match file.active_after {
            Some(secs) => Some(Duration::try_from_secs_f64(secs).map_err(|_| {
                TenantsError(format!(
                    "active_after {secs} is not a number of seconds (0 or more)"
                ))
            })?),
            None => None,
        };
        let mut tenants = Tenants {
            configured: true,
            standing_slots: file.standing_slots,
            active_after,
            ..Tenants::default()
        };
        for (name, entry) in file.tenants {
            let index = tenants.tenants.len();
            for (i, key) in entry.keys.iter().enumerate() {
                // The entry is not repeated: it could be a key pasted by mistake.
                let hash = digest(key).ok_or_else(|| {
                    TenantsError(format!(
                        "tenant {name}: key {} is not sha256:<64 hex digits>",
                        i + 1
                    ))
                })?;
                if tenants.by_key.insert(hash, index).is_some() {
                    return Err(TenantsError(format!(
                        "tenant {name}: a key is listed twice"
                    )));
                }
            }
            if name == "default" {
                tenants.default = Some(index);
            }
            let weight = entry.weight.unwrap_or(1);
            if weight == 0 {
                return Err(TenantsError(format!(
                    "tenant {name}: weight must be at least 1"
                )));
            }
            let max_priority = match entry.max_priority {
                None => Priority::Normal,
                Some(asked) => Priority::parse(asked.as_bytes()).ok_or_else(|| {
                    TenantsError(format!(
                        "tenant {name}: max_priority {asked:?} is not high, normal or low"
                    ))
                })?,
            };
            tenants.tenants.push(Tenant {
                name: TenantId::new(&name),
                weight,
                tokens_per_minute: entry.tokens_per_minute.unwrap_or(0),
                requests_per_minute: entry.requests_per_minute.unwrap_or(0),
                max_priority,
                standing_slots: file.standing_slots,
                engine_priority: file.engine_priority,
            });
        }
        Ok(tenants)
    }

    /// Whether a tenants file is configured (flow control is on).
    pub fn configured(&self) -> bool {
        self.configured
    }

    /// The file's `standing_slots` (0 without a file).
    pub fn standing_slots(&self) -> usize {
        self.standing_slots
    }

    /// How long a tenant counts as active after its last request ended: the file's
    /// `active_after`, default [`ACTIVE_AFTER`] (5 s).
    pub fn active_after(&self) -> Duration {
        self.active_after.unwrap_or(ACTIVE_AFTER)
    }

    /// Every tenant, in the file's order of names.
    pub fn all(&self) -> &[Tenant] {
        &self.tenants
    }

    /// Who a request with `headers` is for.
    pub fn identify(&self, headers: &HeaderMap) -> Result<Identity<'_>, Refused> {
        let asked = match headers.get("x-priority") {
            Some(value) => Priority::parse(value.as_bytes()).ok_or(Refused::BadPriority)?,
            None => Priority::Normal,
        };
        if !self.configured {
            return Ok(Identity {
                tenant: None,
                priority: asked,
            });
        }
        let index = match api_key(headers) {
            Some(key) => self.by_key.get(&sha256(key)).copied(),
            None => self.default,
        };
        let tenant = index.map(|i| &self.tenants[i]).ok_or(Refused::UnknownKey)?;
        Ok(Identity {
            tenant: Some(tenant),
            priority: asked.min(tenant.max_priority),
        })
    }
}

/// The API key a request carries: its bearer token, else its `x-api-key`.
fn api_key(headers: &HeaderMap) -> Option<&[u8]> {
    let bearer = headers.get(http::header::AUTHORIZATION).and_then(|v| {
        let v = v.as_bytes();
        let scheme = v.get(..7)?;
        scheme
            .eq_ignore_ascii_case(b"bearer ")
            .then(|| v[7..].trim_ascii())
    });
    bearer.or_else(|| headers.get("x-api-key").map(|v| v.as_bytes().trim_ascii()))
}

fn sha256(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

/// The hash a `sha256:<hex>` entry names.
fn digest(entry: &str) -> Option<[u8; 32]> {
    let hex = entry.strip_prefix("sha256:")?;
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests;
