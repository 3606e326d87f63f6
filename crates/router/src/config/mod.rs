//! Configuration: the file and the flags merged into raw [`Settings`], then checked once into
//! a typed [`Config`] with every default applied. Nothing downstream re-parses or falls back:
//! an unknown policy, a bad URL or a negative threshold is an error naming its option.

mod boot;
mod settings;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use prefix_router_core::policy::{self, Balance, Tunables};
use prefix_router_core::request::{SessionField, SessionSources};
use prefix_router_core::tree::TreeConfig;
use prefix_router_core::units::Tokens;

pub use boot::Boot;
pub use settings::{ModelPool, Settings};

use crate::fleet::{
    DiscoverySettings, HealthSettings, OutlierSettings, ReaderSettings, Role, Worker, add_pool,
    add_role,
};
use crate::kv_events::KvEventSettings;
use crate::limits::{ExchangeTimeouts, Limits, LiveLimits, RetryOn, RetrySettings};
use crate::replication::SharedTable;
use crate::tenants::Tenants;
use crate::tls::{CertFiles, TlsConfig, UpstreamTls};
use crate::tokens::TokenSettings;
use crate::traces::TraceSettings;

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

/// Where the configuration came from, so that it can be read again on reload.
#[derive(Clone, Debug, Default)]
pub struct Source {
    /// The config file, if any.
    pub file: Option<PathBuf>,
    /// Flags laid over the file.
    pub flags: Settings,
}

/// The router's whole configuration, checked: each part's own settings type, built here
/// from the part's own defaults.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    /// What takes effect only at start.
    pub boot: Boot,
    /// Backends. May be empty (every request then gets 503). A reload applies them.
    pub workers: Vec<Worker>,
    /// What a reload may change while serving: the limits of each request and the
    /// policy's tunables.
    pub live: LiveLimits,
}

impl Config {
    /// Options that differ from `old` but only take effect after a restart.
    pub fn restart_only_changes(&self, old: &Config) -> Vec<&'static str> {
        self.boot.changes(&old.boot)
    }

    /// Reads `file` (if any), lays `flags` over it, and checks the result.
    pub fn load(file: Option<&Path>, flags: Settings) -> Result<Config, ConfigError> {
        let base = match file {
            Some(path) => read_file(path)?,
            None => Settings::default(),
        };
        Config::from_settings(base.overlay(flags))
    }

    /// The defaults, with every option `s` sets checked and laid over them.
    pub fn from_settings(s: Settings) -> Result<Config, ConfigError> {
        let d = Config::default();
        Ok(Config {
            boot: boot(&s, d.boot)?,
            workers: workers(&s)?,
            live: LiveLimits {
                limits: limits(&s, d.live.limits)?,
                tunables: tunables(&s, d.live.tunables)?,
                tenants: Arc::new(match &s.tenants_file {
                    Some(path) => {
                        Tenants::load(path).map_err(|e| invalid("tenants_file", e.to_string()))?
                    }
                    None => Tenants::default(),
                }),
            },
        })
    }
}

/// The workers of `worker_urls`, `prefill` and `decode`, and of the static model pools
/// (`[[models]]`).
fn workers(s: &Settings) -> Result<Vec<Worker>, ConfigError> {
    let urls = s.worker_urls.as_deref().unwrap_or_default();
    let mut workers = Worker::parse_all(urls).map_err(|e| invalid("worker_urls", e.to_string()))?;
    for (key, role, urls) in [
        ("prefill", Role::Prefill, &s.prefill),
        ("decode", Role::Decode, &s.decode),
    ] {
        let urls = urls.as_deref().unwrap_or_default();
        add_role(&mut workers, role, urls).map_err(|e| invalid(key, e.to_string()))?;
    }
    for pool in s.models.iter().flatten() {
        let bad = |why: String| invalid("models", format!("model `{}`: {why}", pool.name));
        if pool.name.is_empty() || pool.worker_urls.is_empty() {
            return Err(bad("a pool needs a name and worker_urls".into()));
        }
        let names: Vec<String> = std::iter::once(&pool.name)
            .chain(&pool.aliases)
            .cloned()
            .collect();
        add_pool(&mut workers, &names, &pool.worker_urls).map_err(|e| bad(e.to_string()))?;
    }
    Ok(workers)
}

fn boot(s: &Settings, d: Boot) -> Result<Boot, ConfigError> {
    let (host, port) = (s.host.as_deref(), s.port);
    let (admin_host, admin_port) = (s.admin_host.as_deref(), s.admin_port);
    let policy = s.policy.as_deref().map(policy::choose).transpose();
    Ok(Boot {
        listen: address(&d.listen, host, port),
        epp_listen: (s.grpc_port).map(|p| address(&d.listen, host, Some(p))),
        admin_listen: address(&d.admin_listen, admin_host, admin_port),
        admin_token: token(s.admin_token_file.as_deref())?,
        tls: tls(s)?,
        upgrade_socket: s.upgrade_socket.clone().unwrap_or(d.upgrade_socket),
        health: health(s, d.health)?,
        discovery: DiscoverySettings {
            dns_interval: seconds("dns_refresh_interval", s.dns_refresh_interval)?
                .unwrap_or(d.discovery.dns_interval),
        },
        metrics: ReaderSettings {
            interval: seconds("metrics_interval", s.metrics_interval)?
                .unwrap_or(d.metrics.interval),
            models_interval: seconds("models_interval", s.models_interval)?
                .unwrap_or(d.metrics.models_interval),
            ..d.metrics
        },
        shared_table: shared_table(s)?,
        policy: policy
            .map_err(|e| invalid("policy", e.to_string()))?
            .unwrap_or(d.policy),
        tree: tree(s, d.tree)?,
        eviction_interval: seconds("eviction_interval", s.eviction_interval)?
            .unwrap_or(d.eviction_interval),
        session_ttl: seconds("session_ttl", s.session_ttl)?.unwrap_or(d.session_ttl),
        threads: positive("threads", s.threads)?.unwrap_or(d.threads),
        grace_period: seconds_or_zero("grace_period", s.grace_period)?.unwrap_or(d.grace_period),
        shutdown_timeout: seconds("shutdown_timeout", s.shutdown_timeout)?
            .unwrap_or(d.shutdown_timeout),
        tokens: TokenSettings {
            default: s.tokenizer.clone(),
            models: s.tokenizers.clone().unwrap_or_default(),
            cache_bytes: s.token_cache_bytes.unwrap_or(d.tokens.cache_bytes),
        },
        kv_events: KvEventSettings {
            endpoint: s.kv_events.clone(),
            replay: s.kv_events_replay.clone(),
            topic: s.kv_events_topic.clone().unwrap_or_default(),
        },
        traces: traces(s, d.traces)?,
    })
}

/// `default` (`host:port`) with the host and port given replaced.
fn address(default: &str, host: Option<&str>, port: Option<u16>) -> String {
    let (default_host, default_port) = default.rsplit_once(':').unwrap_or((default, ""));
    let port = port.map_or_else(|| default_port.to_string(), |p| p.to_string());
    format!("{}:{port}", host.unwrap_or(default_host))
}

/// Most spans the trace queue may hold (its slots are allocated at start, ~0.5 KB each).
const MAX_TRACE_QUEUE: usize = 1 << 20;

fn traces(s: &Settings, d: TraceSettings) -> Result<TraceSettings, ConfigError> {
    if let Some(endpoint) = &s.otlp_endpoint {
        let parsed: Result<http::Uri, _> = endpoint.parse();
        if !parsed.is_ok_and(|u| u.scheme_str() == Some("http") && u.host().is_some()) {
            let reason = format!("{endpoint} is not an http:// URL (no TLS to collectors)");
            return Err(invalid("otlp_endpoint", reason));
        }
    }
    let pair = |kv: &String| match kv.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(invalid(
            "trace_resource_attributes",
            format!("{kv} is not key=value"),
        )),
    };
    let resource = s.trace_resource_attributes.iter().flatten().map(pair);
    Ok(TraceSettings {
        endpoint: s.otlp_endpoint.clone(),
        sample_ratio: (s.trace_sample_ratio.map(|r| ratio("trace_sample_ratio", r))).transpose()?,
        service_name: s.trace_service_name.clone(),
        resource: resource.collect::<Result<_, _>>()?,
        queue: match positive("trace_queue_size", s.trace_queue_size)? {
            Some(n) if n > MAX_TRACE_QUEUE => {
                let reason = format!("{n} is more than {MAX_TRACE_QUEUE} spans");
                return Err(invalid("trace_queue_size", reason));
            }
            n => n.unwrap_or(d.queue),
        },
        ..d
    })
}

fn tunables(s: &Settings, d: Tunables) -> Result<Tunables, ConfigError> {
    let rel = s
        .balance_rel_threshold
        .map(|r| at_least_one("balance_rel_threshold", r));
    Ok(Tunables {
        cache_threshold: (s.cache_threshold.map(|t| ratio("cache_threshold", t)))
            .transpose()?
            .unwrap_or(d.cache_threshold),
        balance: Balance {
            abs: s.balance_abs_threshold.unwrap_or(d.balance.abs),
            rel: rel.transpose()?.unwrap_or(d.balance.rel),
        },
    })
}

fn tree(s: &Settings, d: TreeConfig) -> Result<TreeConfig, ConfigError> {
    let Some(tokens) = positive("max_tree_size", s.max_tree_size)? else {
        return Ok(d);
    };
    let budget = Tokens(tokens).keys();
    if budget.0 == 0 {
        return Err(invalid(
            "max_tree_size",
            format!("{tokens} tokens is less than one block"),
        ));
    }
    Ok(TreeConfig { budget, ..d })
}

fn limits(s: &Settings, d: Limits) -> Result<Limits, ConfigError> {
    let seconds = |option, value, default| Ok(seconds(option, value)?.unwrap_or(default));
    let e = d.exchange;
    Ok(Limits {
        max_body_bytes: positive("max_body_bytes", s.max_body_bytes)?.unwrap_or(d.max_body_bytes),
        max_buffered_bytes: positive("max_buffered_bytes", s.max_buffered_bytes)?
            .unwrap_or(d.max_buffered_bytes),
        client_read: seconds("client_read_timeout", s.client_read_timeout, d.client_read)?,
        client_body: seconds("client_body_timeout", s.client_body_timeout, d.client_body)?,
        retry: retry(s, d.retry)?,
        outlier: outlier(s, d.outlier)?,
        sessions: sessions(s, d.sessions)?,
        exchange: ExchangeTimeouts {
            connect: seconds("connect_timeout", s.connect_timeout, e.connect)?,
            first_byte: seconds(
                "upstream_first_byte_timeout",
                s.upstream_first_byte_timeout,
                e.first_byte,
            )?,
            idle: seconds("upstream_idle_timeout", s.upstream_idle_timeout, e.idle)?,
            write: seconds("upstream_write_timeout", s.upstream_write_timeout, e.write)?,
            pool_idle: seconds("pool_idle_timeout", s.pool_idle_timeout, e.pool_idle)?,
        },
        admission_timeout: seconds(
            "admission_timeout",
            s.admission_timeout,
            d.admission_timeout,
        )?,
        max_inflight_per_backend: s
            .max_inflight_per_backend
            .unwrap_or(d.max_inflight_per_backend),
        max_queued: s.max_queued.unwrap_or(d.max_queued),
        max_queued_per_tenant: (s.max_queued_per_tenant).unwrap_or(d.max_queued_per_tenant),
        max_queued_per_priority: (s.max_queued_per_priority).unwrap_or(d.max_queued_per_priority),
        queue_timeout: seconds("queue_timeout", s.queue_timeout, d.queue_timeout)?,
        max_local_prefill_length: (s.max_local_prefill_length)
            .unwrap_or(d.max_local_prefill_length),
    })
}

fn retry(s: &Settings, d: RetrySettings) -> Result<RetrySettings, ConfigError> {
    let on = match &s.retry_on {
        Some(names) => RetryOn::parse(names.iter().map(String::as_str)).map_err(|name| {
            let known = RetryOn::NAMES.join(", ");
            invalid("retry_on", format!("`{name}` is not one of {known}"))
        })?,
        None => d.on,
    };
    Ok(RetrySettings {
        max: s.retries.unwrap_or(d.max),
        on,
        budget_percent: s.retry_budget_percent.unwrap_or(d.budget_percent),
        ..d
    })
}

fn outlier(s: &Settings, d: OutlierSettings) -> Result<OutlierSettings, ConfigError> {
    let percent = s.max_ejection_percent.unwrap_or(d.max_ejection_percent);
    if percent > 100 {
        let reason = format!("{percent} is more than 100");
        return Err(invalid("max_ejection_percent", reason));
    }
    Ok(OutlierSettings {
        consecutive_5xx: s.consecutive_5xx.unwrap_or(d.consecutive_5xx),
        consecutive_failures: s.passive_failures.unwrap_or(d.consecutive_failures),
        base_ejection: seconds("base_ejection_time", s.base_ejection_time)?
            .unwrap_or(d.base_ejection),
        max_ejection: seconds("max_ejection_time", s.max_ejection_time)?.unwrap_or(d.max_ejection),
        max_ejection_percent: percent,
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

/// The listeners' certificate pairs (each file given with its pair) and the upstreams'
/// CA file, checked readable here so that the error names the option.
fn tls(s: &Settings) -> Result<TlsConfig, ConfigError> {
    let pair =
        |cert: &Option<PathBuf>, key: &Option<PathBuf>, names: [&'static str; 2]| match (cert, key)
        {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => {
                readable(names[0], cert)?;
                readable(names[1], key)?;
                Ok(Some(CertFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                }))
            }
            (Some(_), None) => Err(invalid(names[1], format!("{} needs it", names[0]))),
            (None, Some(_)) => Err(invalid(names[0], format!("{} needs it", names[1]))),
        };
    if let Some(ca) = &s.upstream_ca_file {
        readable("upstream_ca_file", ca)?;
    }
    Ok(TlsConfig {
        listener: pair(
            &s.tls_cert_file,
            &s.tls_key_file,
            ["tls_cert_file", "tls_key_file"],
        )?,
        admin: pair(
            &s.admin_tls_cert_file,
            &s.admin_tls_key_file,
            ["admin_tls_cert_file", "admin_tls_key_file"],
        )?,
        upstream: UpstreamTls {
            ca_file: s.upstream_ca_file.clone(),
            insecure: s.upstream_tls_insecure.unwrap_or(false),
        },
    })
}

fn readable(option: &'static str, path: &Path) -> Result<(), ConfigError> {
    let reason = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| invalid(option, reason(e)))
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

fn health(s: &Settings, d: HealthSettings) -> Result<HealthSettings, ConfigError> {
    let path = match s.health_check_path.as_deref() {
        Some(path) => (path
            .starts_with('/')
            .then(|| http::Uri::try_from(path).ok()))
        .flatten()
        .ok_or_else(|| invalid("health_check_path", format!("`{path}` is not a path")))?,
        None => d.path,
    };
    Ok(HealthSettings {
        interval: seconds("health_check_interval", s.health_check_interval)?.unwrap_or(d.interval),
        path,
        timeout: seconds("health_check_timeout", s.health_check_timeout)?.unwrap_or(d.timeout),
        successes: positive("health_check_successes", s.health_check_successes)?
            .unwrap_or(d.successes),
        failures: positive("health_check_failures", s.health_check_failures)?.unwrap_or(d.failures),
    })
}

fn shared_table(s: &Settings) -> Result<Option<SharedTable>, ConfigError> {
    let Some(url) = s.shared_table.as_deref() else {
        return Ok(None);
    };
    let address = url
        .strip_prefix("redis://")
        .unwrap_or(url)
        .trim_end_matches('/');
    let valid = (address.rsplit_once(':')).is_some_and(|(host, port)| {
        !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok_and(|p| p > 0)
    });
    if !valid {
        return Err(invalid(
            "shared_table",
            format!("`{url}` is not redis://host:port"),
        ));
    }
    let channel = s
        .shared_table_channel
        .clone()
        .unwrap_or_else(|| "prefix-router".into());
    if channel.is_empty() {
        return Err(invalid("shared_table_channel", "must not be empty".into()));
    }
    Ok(Some(SharedTable {
        address: address.to_string(),
        channel,
    }))
}

/// `session_headers` and `session_fields`, each the default's when not given.
fn sessions(s: &Settings, d: SessionSources) -> Result<SessionSources, ConfigError> {
    let headers = match s.session_headers.as_deref() {
        None => d.headers().to_vec(),
        Some(names) => (names.iter())
            .map(|n| {
                HeaderName::try_from(n.as_str())
                    .map_err(|_| invalid("session_headers", format!("`{n}` is not a header name")))
            })
            .collect::<Result<_, _>>()?,
    };
    let fields = match s.session_fields.as_deref() {
        None => d.fields().to_vec(),
        Some(names) => (names.iter())
            .map(|n| {
                SessionField::parse(n).ok_or_else(|| {
                    let known = SessionField::ALL.map(SessionField::name).join(", ");
                    invalid("session_fields", format!("`{n}` is not one of {known}"))
                })
            })
            .collect::<Result<_, _>>()?,
    };
    Ok(SessionSources::new(headers, fields))
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

/// `value`, if given, checked to be above 0.
fn positive(option: &'static str, value: Option<usize>) -> Result<Option<usize>, ConfigError> {
    match value {
        Some(0) => Err(invalid(option, "must be greater than 0".into())),
        value => Ok(value),
    }
}

/// `value`, if given, as a positive duration.
fn seconds(option: &'static str, value: Option<f64>) -> Result<Option<Duration>, ConfigError> {
    match value {
        Some(secs) if secs <= 0.0 || secs.is_nan() => Err(invalid(
            option,
            format!("{secs} is not a positive number of seconds"),
        )),
        value => seconds_or_zero(option, value),
    }
}

/// `value`, if given, as a duration of zero or more.
fn seconds_or_zero(
    option: &'static str,
    value: Option<f64>,
) -> Result<Option<Duration>, ConfigError> {
    let Some(secs) = value else {
        return Ok(None);
    };
    Duration::try_from_secs_f64(secs)
        .map(Some)
        .map_err(|_| invalid(option, format!("{secs} is not a number of seconds >= 0")))
}

#[cfg(test)]
mod tests;
