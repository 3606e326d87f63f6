//! Configuration: the file and the flags merged into raw [`Settings`], then checked once into
//! a typed [`Config`] with every default applied. Nothing downstream re-parses or falls back:
//! an unknown policy, a bad URL or a negative threshold is an error naming its option.

mod settings;

use std::path::Path;
use std::time::Duration;

use http::HeaderName;
use prefix_router_core::policy::{self, Balance, PolicyChoice, Tunables};
use prefix_router_core::request::{SessionHeaders, blocks};
use prefix_router_core::tree::TreeConfig;

pub use settings::Settings;

use crate::fleet::{HealthSettings, Worker};
use crate::proxy::{ExchangeTimeouts, Limits};

/// A configuration that cannot be used, naming the option at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {cause}")]
    Read { path: String, cause: std::io::Error },
    /// The config file is not valid TOML of the expected keys.
    #[error("invalid config file {path}: {cause}")]
    Parse {
        path: String,
        cause: Box<toml::de::Error>,
    },
    /// An option has a value the router cannot use.
    #[error("invalid `{option}`: {reason}")]
    Invalid {
        option: &'static str,
        reason: String,
    },
}

/// The router's whole configuration, checked: each part's own settings type, built here.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `host:port` of the data plane. Default `0.0.0.0:8080`.
    pub listen: String,
    /// `host:port` of the admin listener. Default `127.0.0.1:8081`.
    pub admin_listen: String,
    /// Bearer token the admin listener requires, read from `admin_token_file`. Default none.
    pub admin_token: Option<String>,
    /// Socket for graceful upgrades. Default `/tmp/prefix-router-upgrade.sock`.
    pub upgrade_socket: String,
    /// Backends. May be empty (every request then gets 503).
    pub workers: Vec<Worker>,
    /// Time to connect to a backend. Default 5 s.
    pub connect_timeout: Duration,
    /// Health checks.
    pub health: HealthSettings,
    /// The routing policy. Default `kv_aware` ([`policy::DEFAULT`]).
    pub policy: PolicyChoice,
    /// The policy's reloadable parameters (match threshold, imbalance bounds).
    pub tunables: Tunables,
    /// The prefix index's budget and sharding.
    pub tree: TreeConfig,
    /// Time between prefix-tree evictions. Default 120 s.
    pub eviction_interval: Duration,
    /// Idle time after which a session forgets its backend. Default 30 min.
    pub session_ttl: Duration,
    /// What each request may take and do: body size, timeouts, retries, session headers,
    /// admission to the fleet.
    pub limits: Limits,
    /// Bytes of request bodies held at most, summed over requests. Default 1 GiB.
    pub max_buffered_bytes: usize,
    /// Data plane worker threads. Default: the number of CPUs.
    pub threads: usize,
    /// Longest drain of in-flight requests after SIGTERM or an upgrade; the process exits
    /// as soon as none is left. Default 60 s.
    pub grace_period: Duration,
    /// Time runtimes get to stop after the drain. Default 5 s.
    pub shutdown_timeout: Duration,
}

impl Config {
    /// Options that differ from `old` but only take effect after a restart.
    pub fn restart_only_changes(&self, old: &Config) -> Vec<&'static str> {
        let checks = [
            ("host/port", self.listen != old.listen),
            (
                "admin_host/admin_port",
                self.admin_listen != old.admin_listen,
            ),
            ("admin_token_file", self.admin_token != old.admin_token),
            ("upgrade_socket", self.upgrade_socket != old.upgrade_socket),
            ("policy", self.policy != old.policy),
            ("max_tree_size", self.tree != old.tree),
            (
                "eviction_interval",
                self.eviction_interval != old.eviction_interval,
            ),
            ("session_ttl", self.session_ttl != old.session_ttl),
            ("health_check_*", self.health != old.health),
            ("threads", self.threads != old.threads),
            ("grace_period", self.grace_period != old.grace_period),
            (
                "shutdown_timeout",
                self.shutdown_timeout != old.shutdown_timeout,
            ),
        ];
        checks
            .iter()
            .filter(|(_, changed)| *changed)
            .map(|(name, _)| *name)
            .collect()
    }

    /// Reads `file` (if any), lays `flags` over it, and checks the result.
    pub fn load(file: Option<&Path>, flags: Settings) -> Result<Config, ConfigError> {
        let base = match file {
            Some(path) => read_file(path)?,
            None => Settings::default(),
        };
        Config::from_settings(base.overlay(flags))
    }

    /// Applies defaults to `s` and checks every value.
    pub fn from_settings(s: Settings) -> Result<Config, ConfigError> {
        let host = s.host.clone().unwrap_or_else(|| "0.0.0.0".into());
        let workers = Worker::parse_all(s.worker_urls.as_deref().unwrap_or_default())
            .map_err(|e| invalid("worker_urls", e.to_string()))?;
        Ok(Config {
            listen: format!("{host}:{}", s.port.unwrap_or(8080)),
            admin_listen: format!(
                "{}:{}",
                s.admin_host.as_deref().unwrap_or("127.0.0.1"),
                s.admin_port.unwrap_or(8081)
            ),
            admin_token: token(s.admin_token_file.as_deref())?,
            upgrade_socket: s
                .upgrade_socket
                .clone()
                .unwrap_or_else(|| "/tmp/prefix-router-upgrade.sock".into()),
            workers,
            connect_timeout: seconds("connect_timeout", s.connect_timeout, 5.0)?,
            health: health(&s)?,
            policy: policy::choose(s.policy.as_deref().unwrap_or(policy::DEFAULT))
                .map_err(|e| invalid("policy", e.to_string()))?,
            tunables: tunables(&s)?,
            tree: tree(&s)?,
            eviction_interval: seconds("eviction_interval", s.eviction_interval, 120.0)?,
            session_ttl: seconds("session_ttl", s.session_ttl, 1800.0)?,
            limits: limits(&s)?,
            max_buffered_bytes: positive(
                "max_buffered_bytes",
                s.max_buffered_bytes.unwrap_or(1 << 30),
            )?,
            threads: positive("threads", s.threads.unwrap_or_else(cpus))?,
            grace_period: seconds_or_zero("grace_period", s.grace_period, 60.0)?,
            shutdown_timeout: seconds("shutdown_timeout", s.shutdown_timeout, 5.0)?,
        })
    }
}

fn tunables(s: &Settings) -> Result<Tunables, ConfigError> {
    let defaults = Tunables::default();
    Ok(Tunables {
        cache_threshold: ratio(
            "cache_threshold",
            s.cache_threshold.unwrap_or(defaults.cache_threshold),
        )?,
        balance: Balance {
            abs: s.balance_abs_threshold.unwrap_or(defaults.balance.abs),
            rel: at_least_one(
                "balance_rel_threshold",
                s.balance_rel_threshold.unwrap_or(defaults.balance.rel),
            )?,
        },
    })
}

fn tree(s: &Settings) -> Result<TreeConfig, ConfigError> {
    let defaults = TreeConfig::default();
    let tokens = s
        .max_tree_size
        .unwrap_or(blocks::tokens(defaults.max_bytes_per_backend));
    let key_bytes = blocks::key_bytes(positive("max_tree_size", tokens)?);
    if key_bytes == 0 {
        return Err(invalid(
            "max_tree_size",
            format!("{tokens} tokens is less than one block"),
        ));
    }
    Ok(TreeConfig {
        max_bytes_per_backend: key_bytes,
        ..defaults
    })
}

fn limits(s: &Settings) -> Result<Limits, ConfigError> {
    Ok(Limits {
        max_body_bytes: positive("max_body_bytes", s.max_body_bytes.unwrap_or(32 << 20))?,
        client_read: seconds("client_read_timeout", s.client_read_timeout, 60.0)?,
        client_body: seconds("client_body_timeout", s.client_body_timeout, 300.0)?,
        retries: s.retries.unwrap_or(2),
        passive_failures: s.passive_failures.unwrap_or(3),
        session_headers: session_headers(s.session_headers.as_deref())?,
        exchange: ExchangeTimeouts {
            first_byte: seconds(
                "upstream_first_byte_timeout",
                s.upstream_first_byte_timeout,
                600.0,
            )?,
            idle: seconds("upstream_idle_timeout", s.upstream_idle_timeout, 120.0)?,
            write: seconds("upstream_write_timeout", s.upstream_write_timeout, 60.0)?,
            pool_idle: seconds("pool_idle_timeout", s.pool_idle_timeout, 60.0)?,
        },
        admission_timeout: seconds("admission_timeout", s.admission_timeout, 10.0)?,
        max_inflight_per_backend: s.max_inflight_per_backend.unwrap_or(0),
        max_queued: s.max_queued.unwrap_or(1024),
        queue_timeout: seconds("queue_timeout", s.queue_timeout, 30.0)?,
    })
}

fn read_file(path: &Path) -> Result<Settings, ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
        path: shown.clone(),
        cause,
    })?;
    toml::from_str(&text).map_err(|cause| ConfigError::Parse {
        path: shown,
        cause: Box::new(cause),
    })
}

fn token(file: Option<&Path>) -> Result<Option<String>, ConfigError> {
    let Some(file) = file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(file).map_err(|cause| ConfigError::Read {
        path: file.display().to_string(),
        cause,
    })?;
    match text.trim() {
        "" => Err(invalid("admin_token_file", "the file is empty".into())),
        token => Ok(Some(token.to_string())),
    }
}

fn health(s: &Settings) -> Result<HealthSettings, ConfigError> {
    let path = s.health_check_path.as_deref().unwrap_or("/health");
    let uri = match path.starts_with('/') {
        true => http::Uri::try_from(path).ok(),
        false => None,
    };
    Ok(HealthSettings {
        interval: seconds("health_check_interval", s.health_check_interval, 5.0)?,
        path: uri.ok_or_else(|| invalid("health_check_path", format!("`{path}` is not a path")))?,
        timeout: seconds("health_check_timeout", s.health_check_timeout, 2.0)?,
        successes: positive(
            "health_check_successes",
            s.health_check_successes.unwrap_or(1),
        )?,
        failures: positive(
            "health_check_failures",
            s.health_check_failures.unwrap_or(2),
        )?,
    })
}

fn session_headers(names: Option<&[String]>) -> Result<SessionHeaders, ConfigError> {
    let Some(names) = names else {
        return Ok(SessionHeaders::default());
    };
    let parsed: Result<Vec<HeaderName>, ConfigError> = names
        .iter()
        .map(|n| {
            HeaderName::try_from(n.as_str())
                .map_err(|_| invalid("session_headers", format!("`{n}` is not a header name")))
        })
        .collect();
    Ok(SessionHeaders::new(parsed?))
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn invalid(option: &'static str, reason: String) -> ConfigError {
    ConfigError::Invalid { option, reason }
}

fn ratio(option: &'static str, value: f64) -> Result<f64, ConfigError> {
    match (0.0..=1.0).contains(&value) {
        true => Ok(value),
        false => Err(invalid(option, format!("{value} is not between 0 and 1"))),
    }
}

fn at_least_one(option: &'static str, value: f64) -> Result<f64, ConfigError> {
    match value.is_finite() && value >= 1.0 {
        true => Ok(value),
        false => Err(invalid(
            option,
            format!("{value} is not a finite number >= 1"),
        )),
    }
}

fn positive(option: &'static str, value: usize) -> Result<usize, ConfigError> {
    match value > 0 {
        true => Ok(value),
        false => Err(invalid(option, "must be greater than 0".into())),
    }
}

fn seconds(
    option: &'static str,
    value: Option<f64>,
    default: f64,
) -> Result<Duration, ConfigError> {
    let secs = value.unwrap_or(default);
    match secs > 0.0 {
        true => seconds_or_zero(option, Some(secs), default),
        false => Err(invalid(
            option,
            format!("{secs} is not a positive number of seconds"),
        )),
    }
}

fn seconds_or_zero(
    option: &'static str,
    value: Option<f64>,
    default: f64,
) -> Result<Duration, ConfigError> {
    let secs = value.unwrap_or(default);
    Duration::try_from_secs_f64(secs)
        .map_err(|_| invalid(option, format!("{secs} is not a number of seconds >= 0")))
}

#[cfg(test)]
mod tests;
