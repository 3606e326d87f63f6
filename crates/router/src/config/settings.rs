//! Raw settings: every option as it comes from the config file or the command line, all
//! optional and unvalidated. The same struct is both the TOML file's schema and the flags,
//! so an option has one name everywhere (`max_tree_size` in the file, `--max-tree-size` on
//! the command line). Defaults and checks live in [`super::Config`], not here.

use prefix_router_core::policy;
use serde::Deserialize;

/// Defines [`Settings`] from its one list of fields, with `overlay` over every field.
macro_rules! settings {
    (
        $(#[$outer:meta])*
        pub struct Settings { $($(#[$attr:meta])* pub $field:ident: $ty:ty,)* }
    ) => {
        $(#[$outer])*
        pub struct Settings { $($(#[$attr])* pub $field: $ty,)* }

        impl Settings {
            /// These settings with every option that `over` sets replaced by `over`'s value.
            pub fn overlay(self, over: Settings) -> Settings {
                Settings { $($field: over.$field.or(self.$field)),* }
            }
        }
    };
}

settings! {
/// Every option of the router, unvalidated. See `conf/prefix-router.toml` for the defaults.
#[derive(clap::Args, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Address the data plane listens on [default: 0.0.0.0]
    #[arg(long)]
    pub host: Option<String>,
    /// Port the data plane listens on [default: 8080]
    #[arg(long)]
    pub port: Option<u16>,
    /// Serve as the endpoint picker of an Envoy gateway: an ext_proc gRPC server on this port (on --host) instead of the HTTP data plane [default: none; 9002 for `prefix-router epp`]
    #[arg(long)]
    pub grpc_port: Option<u16>,
    /// Address of the admin listener (metrics, stats, reload, workers) [default: 127.0.0.1]
    #[arg(long)]
    pub admin_host: Option<String>,
    /// Port of the admin listener [default: 8081]
    #[arg(long)]
    pub admin_port: Option<u16>,
    /// File holding a bearer token required by every admin request [default: none]
    #[arg(long)]
    pub admin_token_file: Option<std::path::PathBuf>,
    /// PEM certificate chain the data listener (or the endpoint picker's gRPC port) serves TLS with (with --tls-key-file); read again on SIGHUP [default: none, plain HTTP]
    #[arg(long)]
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert-file
    #[arg(long)]
    pub tls_key_file: Option<std::path::PathBuf>,
    /// PEM certificate chain the admin listener serves TLS with (with --admin-tls-key-file) [default: none, plain HTTP]
    #[arg(long)]
    pub admin_tls_cert_file: Option<std::path::PathBuf>,
    /// PEM private key of --admin-tls-cert-file
    #[arg(long)]
    pub admin_tls_key_file: Option<std::path::PathBuf>,
    /// PEM CA certificates that https:// workers' certificates are verified against [default: the system's roots]
    #[arg(long)]
    pub upstream_ca_file: Option<std::path::PathBuf>,
    /// Accept any certificate from https:// workers: for test fleets only [default: false]
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub upstream_tls_insecure: Option<bool>,
    /// Socket the graceful upgrade passes listeners over [default: /tmp/prefix-router-upgrade.sock]
    #[arg(long)]
    pub upgrade_socket: Option<String>,
    /// Backend base URLs, e.g. http://10.0.0.5:8000 (space or comma separated)
    #[arg(long, num_args = 1.., value_delimiter = ',')]
    pub worker_urls: Option<Vec<String>>,
    /// Prefill instances of a disaggregated fleet (repeatable; also in `worker_urls` or `decode` makes it both): a chat or completions request is computed on one, then decoded on a `decode` instance [default: none]
    #[arg(long, num_args = 1.., value_delimiter = ',')]
    pub prefill: Option<Vec<String>>,
    /// Decode instances of a disaggregated fleet (repeatable); they also serve requests that are not disaggregated [default: none]
    #[arg(long, num_args = 1.., value_delimiter = ',')]
    pub decode: Option<Vec<String>>,
    /// In a disaggregated fleet, a request of which the decode instance it would go to lacks at most this many prompt tokens skips the prefill leg: that instance computes them (Dynamo's name) [default: 1000]
    #[arg(long)]
    pub max_local_prefill_length: Option<usize>,
    /// The routing policy [default: kv_aware]
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(policy::names()))]
    pub policy: Option<String>,
    /// Minimum prefix match ratio (0..=1) for cache_aware to follow the match [default: 0.3]
    #[arg(long)]
    pub cache_threshold: Option<f64>,
    /// Imbalance needs max - min in-flight requests above this [default: 64]
    #[arg(long)]
    pub balance_abs_threshold: Option<usize>,
    /// Imbalance needs max in-flight above min times this [default: 1.5]
    #[arg(long)]
    pub balance_rel_threshold: Option<f64>,
    /// Seconds between prefix-tree eviction runs [default: 120]
    #[arg(long)]
    pub eviction_interval: Option<f64>,
    /// Tokens of KV cache the index remembers per backend that does not publish its capacity (vLLM does) [default: 1048576]
    #[arg(long)]
    pub max_tree_size: Option<usize>,
    /// Headers carrying a session id, in order of preference [default: x-session-id,x-claude-code-session-id,session-id,thread-id,x-session-affinity]
    #[arg(long, num_args = 1.., value_delimiter = ',')]
    pub session_headers: Option<Vec<String>>,
    /// Body fields carrying a session id, tried after the headers, in order [default: session_params.session_id,metadata.user_id,prompt_cache_key]
    #[arg(long, num_args = 0.., value_delimiter = ',')]
    pub session_fields: Option<Vec<String>>,
    /// Seconds after which an idle session forgets its backend [default: 1800]
    #[arg(long)]
    pub session_ttl: Option<f64>,
    /// Seconds between active health checks [default: 5]
    #[arg(long)]
    pub health_check_interval: Option<f64>,
    /// Path of the health check GET [default: /health]
    #[arg(long)]
    pub health_check_path: Option<String>,
    /// Seconds a health check may take [default: 2]
    #[arg(long)]
    pub health_check_timeout: Option<f64>,
    /// Consecutive passed checks that make an unhealthy backend healthy [default: 1]
    #[arg(long)]
    pub health_check_successes: Option<usize>,
    /// Consecutive failed checks that make a healthy backend unhealthy [default: 2]
    #[arg(long)]
    pub health_check_failures: Option<usize>,
    /// Seconds between two resolutions of the workers' host names (each address a backend) [default: 30]
    #[arg(long)]
    pub dns_refresh_interval: Option<f64>,
    /// Seconds between two reads of each backend's /metrics (its load and KV capacity) [default: 1]
    #[arg(long)]
    pub metrics_interval: Option<f64>,
    /// Seconds between two reads of each backend's /v1/models (the models and adapters it serves) [default: 30]
    #[arg(long)]
    pub models_interval: Option<f64>,
    /// Redis or Valkey server (redis://host:port) through which router replicas share their conversation table [default: none]
    #[arg(long)]
    pub shared_table: Option<String>,
    /// Channel of the shared table; replicas of one fleet use the same [default: prefix-router]
    #[arg(long)]
    pub shared_table_channel: Option<String>,
    /// Largest accepted request body in bytes [default: 33554432]
    #[arg(long)]
    pub max_body_bytes: Option<usize>,
    /// Request body bytes held at most, over all requests; beyond, bodies wait (TCP backpressure) [default: 1073741824]
    #[arg(long)]
    pub max_buffered_bytes: Option<usize>,
    /// Seconds a body may wait for buffer room before 503 overloaded [default: 10]
    #[arg(long)]
    pub admission_timeout: Option<f64>,
    /// Requests in flight per backend at most; beyond, requests wait in the router's queue; 0 disables [default: 0]
    #[arg(long)]
    pub max_inflight_per_backend: Option<usize>,
    /// Requests waiting in the router's queue at most; beyond, 503 overloaded at once [default: 1024]
    #[arg(long)]
    pub max_queued: Option<usize>,
    /// Requests of one tenant (of the tenants file) waiting in the router's queue at most; beyond, 503 overloaded at once; 0: only max_queued [default: 0]
    #[arg(long)]
    pub max_queued_per_tenant: Option<usize>,
    /// Requests of one priority waiting in the router's queue at most; beyond, 503 overloaded at once; 0: only max_queued [default: 0]
    #[arg(long)]
    pub max_queued_per_priority: Option<usize>,
    /// Seconds a request may wait in the router's queue before 503 overloaded [default: 30]
    #[arg(long)]
    pub queue_timeout: Option<f64>,
    /// Other backends tried at most per request, before any byte of an answer reached the client [default: 2]
    #[arg(long)]
    pub retries: Option<usize>,
    /// What is retried on another backend: connect-failure, reset (closed or timed out before any answer), 5xx (500, 502, 504, 503 without retry-after) [default: connect-failure,reset,5xx]
    #[arg(long, num_args = 1.., value_delimiter = ',')]
    pub retry_on: Option<Vec<String>>,
    /// Retries in progress at most, percent of the requests being served (at least 3) [default: 20]
    #[arg(long)]
    pub retry_budget_percent: Option<usize>,
    /// Seconds to establish an upstream connection [default: 5]
    #[arg(long)]
    pub connect_timeout: Option<f64>,
    /// Seconds to wait for a backend's first response body byte [default: 600]
    #[arg(long)]
    pub upstream_first_byte_timeout: Option<f64>,
    /// Seconds a backend may stay silent between response chunks [default: 120]
    #[arg(long)]
    pub upstream_idle_timeout: Option<f64>,
    /// Seconds one write to an upstream may take [default: 60]
    #[arg(long)]
    pub upstream_write_timeout: Option<f64>,
    /// Seconds an idle pooled upstream connection is kept [default: 60]
    #[arg(long)]
    pub pool_idle_timeout: Option<f64>,
    /// Seconds a client may take between reads of its request body [default: 60]
    #[arg(long)]
    pub client_read_timeout: Option<f64>,
    /// Seconds a client may take to send its whole request body [default: 300]
    #[arg(long)]
    pub client_body_timeout: Option<f64>,
    /// TOML file of tenants: the SHA-256 of their API keys, weights, rate limits, priority caps; reloaded with the config [default: none, one tenant]
    #[arg(long)]
    pub tenants_file: Option<std::path::PathBuf>,
    /// Failed exchanges in a row (no connection, reset, timed out) that eject a backend; 0 disables [default: 3]
    #[arg(long)]
    pub passive_failures: Option<usize>,
    /// 5xx answers in a row (500, 502, 504, 503 without retry-after; failed exchanges count too) that eject a backend; 0 disables [default: 5]
    #[arg(long = "consecutive-5xx")]
    pub consecutive_5xx: Option<usize>,
    /// Seconds of a backend's first ejection; each further one is longer by as much [default: 30]
    #[arg(long)]
    pub base_ejection_time: Option<f64>,
    /// Longest ejection, seconds [default: 300]
    #[arg(long)]
    pub max_ejection_time: Option<f64>,
    /// Most of the fleet ejected at once, percent (at least one backend may be, never the last open one) [default: 10]
    #[arg(long)]
    pub max_ejection_percent: Option<usize>,
    /// Worker threads of the data plane [default: number of CPUs]
    #[arg(long)]
    pub threads: Option<usize>,
    /// Longest drain of in-flight requests after SIGTERM or an upgrade, seconds; exits as soon as none is left [default: 60]
    #[arg(long)]
    pub grace_period: Option<f64>,
    /// Seconds runtimes get to stop after the drain [default: 5]
    #[arg(long)]
    pub shutdown_timeout: Option<f64>,
    /// Tokenizer directory (tokenizer.json, tokenizer_config.json) of every model without one in `[tokenizers]`: the router renders and tokenizes prompts as the engine does [default: none, text mode]
    #[arg(long)]
    pub tokenizer: Option<std::path::PathBuf>,
    /// Tokenizer directories by served model name (config file only: a `[tokenizers]` table)
    #[arg(skip)]
    pub tokenizers: Option<std::collections::BTreeMap<String, std::path::PathBuf>>,
    /// Static model pools for backends that do not list their models (config file only: `[[models]]` tables of `name`, `worker_urls` and `aliases`)
    #[arg(skip)]
    pub models: Option<Vec<ModelPool>>,
    /// Bytes the conversations' token cache may hold [default: 268435456]
    #[arg(long)]
    pub token_cache_bytes: Option<usize>,
    /// Each backend's KV event endpoint (vLLM's --kv-events-config), from its address: tcp://{host}:5557, {port}, {port+N}, {port-N} [default: none]
    #[arg(long)]
    pub kv_events: Option<String>,
    /// Each backend's KV event replay endpoint, the same way [default: none]
    #[arg(long)]
    pub kv_events_replay: Option<String>,
    /// The topic backends publish KV events under [default: empty]
    #[arg(long)]
    pub kv_events_topic: Option<String>,
    /// OTLP/HTTP collector traces are exported to, e.g. http://collector:4318 (/v1/traces is appended to a URL without a path) [default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, else no traces]
    #[arg(long)]
    pub otlp_endpoint: Option<String>,
    /// Fraction of new traces sampled (0..=1); a client's traceparent decides for its own trace [default: OTEL_TRACES_SAMPLER_ARG, else 1]
    #[arg(long)]
    pub trace_sample_ratio: Option<f64>,
    /// service.name of the router's spans [default: OTEL_SERVICE_NAME, else prefix-router]
    #[arg(long)]
    pub trace_service_name: Option<String>,
    /// More resource attributes of the router's spans, key=value (comma separated) [default: none, besides OTEL_RESOURCE_ATTRIBUTES]
    #[arg(long, num_args = 1.., value_delimiter = ',')]
    pub trace_resource_attributes: Option<Vec<String>>,
    /// Finished spans waiting for export at most; more are dropped and counted [default: 2048]
    #[arg(long)]
    pub trace_queue_size: Option<usize>,
}
}

/// A static pool of backends serving one model (`[[models]]`): they get requests for
/// `name` and its `aliases` only, whatever they list on `/v1/models`.
#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelPool {
    /// The model's name, as requests give it in `model`.
    pub name: String,
    /// Its backends' base URLs (also allowed in `worker_urls` or other pools).
    pub worker_urls: Vec<String>,
    /// Other names requests may give it (the body is forwarded unchanged).
    #[serde(default)]
    pub aliases: Vec<String>,
}
