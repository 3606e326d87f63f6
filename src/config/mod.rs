//! Configuration: the file and the flags merged into raw [`Settings`], then checked once into
//! a typed [`Config`] with every default applied. Nothing downstream re-parses or falls back:
//! an unknown policy, a bad URL or a negative threshold is an error naming its option.

mod settings;
mod worker;

use std::path::Path;
use std::time::Duration;

use http::HeaderName;

pub use settings::Settings;
pub use worker::Worker;

use crate::policy::{self, PolicyChoice, Tunables};

/// A configuration that cannot be used, naming the option at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// The config file is not valid TOML of the expected keys.
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: String,
        source: Box<toml::de::Error>,
    },
    /// An option has a value the router cannot use.
    #[error("invalid `{option}`: {reason}")]
    Invalid {
        option: &'static str,
        reason: String,
    },
}

/// Balance bounds shared by `cache_aware` and session affinity: the fleet is imbalanced when
/// max in-flight - min in-flight > `abs` and max > min * `rel`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Balance {
    /// Absolute bound in requests. Default 64.
    pub abs: usize,
    /// Relative bound, a factor >= 1. Default 1.5.
    pub rel: f64,
}

/// Active health checking.
#[derive(Clone, Debug, PartialEq)]
pub struct Health {
    /// Time between checks. Default 5 s.
    pub interval: Duration,
    /// Path of the GET. Default `/health`.
    pub path: String,
    /// Time a check may take. Default 2 s.
    pub timeout: Duration,
    /// Passed checks in a row that make a backend healthy. Default 1.
    pub successes: usize,
    /// Failed checks in a row that make a backend unhealthy. Default 2.
    pub failures: usize,
}

/// Timeouts and retries towards backends and clients.
#[derive(Clone, Debug, PartialEq)]
pub struct Timeouts {
    /// Time to connect to a backend. Default 5 s.
    pub connect: Duration,
    /// Wait for a backend's first response body byte (a non-streamed generation sends
    /// nothing until it is done). Default 600 s.
    pub first_byte: Duration,
    /// Silence allowed from a backend between response chunks. Default 120 s.
    pub upstream_idle: Duration,
    /// Time one write to a backend may take. Default 60 s.
    pub upstream_write: Duration,
    /// Time an idle pooled connection is kept. Default 60 s.
    pub pool_idle: Duration,
    /// Silence allowed from a client sending its body. Default 60 s.
    pub client_read: Duration,
    /// Whole time a client may take to send its body (32 MiB at about 110 KB/s). Default 300 s.
    pub client_body: Duration,
}

/// The router's whole configuration, checked.
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
    /// The routing policy. Default `cache_aware`.
    pub policy: PolicyChoice,
    /// Minimum prefix match ratio for `cache_aware` to follow the match. Default 0.3.
    pub cache_threshold: f64,
    /// Imbalance bounds.
    pub balance: Balance,
    /// Time between prefix-tree evictions. Default 120 s.
    pub eviction_interval: Duration,
    /// Bytes of prefix text remembered per backend. Default 4 MiB.
    pub max_tree_size: usize,
    /// Session id headers, in order of preference. Default `x-session-id`.
    pub session_headers: Vec<HeaderName>,
    /// Idle time after which a session forgets its backend. Default 30 min.
    pub session_ttl: Duration,
    /// Health checks.
    pub health: Health,
    /// Largest accepted request body, bytes. Default 32 MiB.
    pub max_body_bytes: usize,
    /// Other backends tried after a failed connection. Default 2.
    pub retries: usize,
    /// Failed exchanges in a row that take a backend out until its next passed health
    /// check; 0 disables. Default 3.
    pub passive_failures: usize,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Data plane worker threads. Default: the number of CPUs.
    pub threads: usize,
    /// Longest drain of in-flight requests after SIGTERM or an upgrade; the process exits
    /// as soon as none is left. Default 60 s.
    pub grace_period: Duration,
    /// Time runtimes get to stop after the drain. Default 5 s.
    pub shutdown_timeout: Duration,
}

impl Config {
    /// The policy parameters a reload may change.
    pub fn tunables(&self) -> Tunables {
        Tunables {
            cache_threshold: self.cache_threshold,
            balance: self.balance,
        }
    }

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
            ("max_tree_size", self.max_tree_size != old.max_tree_size),
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
        let (health, timeouts) = (health(&s)?, timeouts(&s)?);
        let host = s.host.unwrap_or_else(|| "0.0.0.0".into());
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
            workers: worker::parse_all(s.worker_urls.unwrap_or_default())?,
            policy: policy::choose(s.policy.as_deref().unwrap_or("cache_aware"))
                .map_err(|reason| invalid("policy", reason))?,
            cache_threshold: ratio("cache_threshold", s.cache_threshold.unwrap_or(0.3))?,
            balance: Balance {
                abs: s.balance_abs_threshold.unwrap_or(64),
                rel: at_least_one(
                    "balance_rel_threshold",
                    s.balance_rel_threshold.unwrap_or(1.5),
                )?,
            },
            eviction_interval: seconds("eviction_interval", s.eviction_interval, 120.0)?,
            max_tree_size: positive("max_tree_size", s.max_tree_size.unwrap_or(4 << 20))?,
            session_headers: header_names(s.session_headers)?,
            session_ttl: seconds("session_ttl", s.session_ttl, 1800.0)?,
            health,
            max_body_bytes: positive("max_body_bytes", s.max_body_bytes.unwrap_or(32 << 20))?,
            retries: s.retries.unwrap_or(2),
            passive_failures: s.passive_failures.unwrap_or(3),
            timeouts,
            threads: positive("threads", s.threads.unwrap_or_else(cpus))?,
            grace_period: seconds_or_zero("grace_period", s.grace_period, 60.0)?,
            shutdown_timeout: seconds("shutdown_timeout", s.shutdown_timeout, 5.0)?,
        })
    }
}

fn read_file(path: &Path) -> Result<Settings, ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: shown.clone(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: shown,
        source: Box::new(source),
    })
}

fn token(file: Option<&Path>) -> Result<Option<String>, ConfigError> {
    let Some(file) = file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
        path: file.display().to_string(),
        source,
    })?;
    match text.trim() {
        "" => Err(invalid("admin_token_file", "the file is empty".into())),
        token => Ok(Some(token.to_string())),
    }
}

fn health(s: &Settings) -> Result<Health, ConfigError> {
    let path = s
        .health_check_path
        .clone()
        .unwrap_or_else(|| "/health".into());
    if !path.starts_with('/') {
        return Err(invalid("health_check_path", "must start with /".into()));
    }
    Ok(Health {
        interval: seconds("health_check_interval", s.health_check_interval, 5.0)?,
        path,
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

fn timeouts(s: &Settings) -> Result<Timeouts, ConfigError> {
    Ok(Timeouts {
        connect: seconds("connect_timeout", s.connect_timeout, 5.0)?,
        first_byte: seconds(
            "upstream_first_byte_timeout",
            s.upstream_first_byte_timeout,
            600.0,
        )?,
        upstream_idle: seconds("upstream_idle_timeout", s.upstream_idle_timeout, 120.0)?,
        upstream_write: seconds("upstream_write_timeout", s.upstream_write_timeout, 60.0)?,
        pool_idle: seconds("pool_idle_timeout", s.pool_idle_timeout, 60.0)?,
        client_read: seconds("client_read_timeout", s.client_read_timeout, 60.0)?,
        client_body: seconds("client_body_timeout", s.client_body_timeout, 300.0)?,
    })
}

fn header_names(names: Option<Vec<String>>) -> Result<Vec<HeaderName>, ConfigError> {
    let names = names.unwrap_or_else(|| vec!["x-session-id".into()]);
    names
        .iter()
        .map(|n| {
            HeaderName::try_from(n.as_str())
                .map_err(|_| invalid("session_headers", format!("`{n}` is not a header name")))
        })
        .collect()
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
