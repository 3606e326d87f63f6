//! What takes effect only when the router starts: listeners, the policy and its index,
//! health checks, token mode, KV events, traces, replication, threads. A reload that
//! changes any of it is applied to the rest and says which options need a restart.

use std::time::Duration;

use prefix_router_core::policy::{self, PolicyChoice};
use prefix_router_core::tree::TreeConfig;

use crate::fleet::{DiscoverySettings, HealthSettings, ReaderSettings};
use crate::kv_events::KvEventSettings;
use crate::replication::SharedTable;
use crate::tls::TlsConfig;
use crate::tokens::TokenSettings;
use crate::traces::TraceSettings;

/// Defines [`Boot`] from its one list of fields, each with the options (as users name
/// them) that set it, and [`Boot::changes`] over every field.
macro_rules! boot {
    ($($(#[doc = $doc:literal])* $field:ident: $ty:ty => $options:literal,)*) => {
        /// The restart-only part of the configuration.
        #[derive(Clone, Debug, PartialEq)]
        pub struct Boot { $($(#[doc = $doc])* pub $field: $ty,)* }

        impl Boot {
            /// The options whose values differ from `old`'s.
            pub fn changes(&self, old: &Boot) -> Vec<&'static str> {
                let mut changed = Vec::new();
                $(if self.$field != old.$field { changed.push($options); })*
                changed
            }
        }
    };
}

boot! {
    /// `host:port` of the data plane. Default `0.0.0.0:8080`.
    listen: String => "host/port",
    /// `host:port` of the endpoint picker's gRPC server, which then replaces the HTTP data
    /// plane (`grpc_port`). Default none.
    epp_listen: Option<String> => "grpc_port",
    /// `host:port` of the admin listener. Default `127.0.0.1:8081`.
    admin_listen: String => "admin_host/admin_port",
    /// Bearer token the admin listener requires, read from `admin_token_file`. Default none.
    admin_token: Option<String> => "admin_token_file",
    /// TLS of the listeners and of `https://` workers. Default: plain listeners.
    tls: TlsConfig => "tls_*/admin_tls_*/upstream_*",
    /// Socket for graceful upgrades. Default `/tmp/prefix-router-upgrade.sock`.
    upgrade_socket: String => "upgrade_socket",
    /// Health checks.
    health: HealthSettings => "health_check_*",
    /// Resolving the workers' names.
    discovery: DiscoverySettings => "dns_refresh_interval",
    /// Reading backends' metrics (published load, KV capacity) and models.
    metrics: ReaderSettings => "metrics_interval/models_interval",
    /// Where router replicas share their conversation table. Default none.
    shared_table: Option<SharedTable> => "shared_table*",
    /// The routing policy. Default `kv_aware` ([`policy::DEFAULT`]).
    policy: PolicyChoice => "policy",
    /// The prefix index's budget and sharding.
    tree: TreeConfig => "max_tree_size",
    /// Time between full upkeep runs of the index and the policy's tables. Default 120 s.
    eviction_interval: Duration => "eviction_interval",
    /// Idle time after which a session forgets its backend. Default 30 min.
    session_ttl: Duration => "session_ttl",
    /// Data plane worker threads. Default: the number of CPUs.
    threads: usize => "threads",
    /// Longest drain of in-flight requests after SIGTERM or an upgrade; the process exits
    /// as soon as none is left. Default 60 s.
    grace_period: Duration => "grace_period",
    /// Time runtimes get to stop after the drain. Default 5 s.
    shutdown_timeout: Duration => "shutdown_timeout",
    /// Token mode: which models' prompts are tokenized. Default none (text mode).
    tokens: TokenSettings => "tokenizer*",
    /// Where backends publish KV events. Default none.
    kv_events: KvEventSettings => "kv_events*",
    /// Trace export. Default off.
    traces: TraceSettings => "otlp_endpoint/trace_*",
}

impl Default for Boot {
    fn default() -> Self {
        Boot {
            listen: "0.0.0.0:8080".into(),
            epp_listen: None,
            admin_listen: "127.0.0.1:8081".into(),
            admin_token: None,
            tls: TlsConfig::default(),
            upgrade_socket: "/tmp/prefix-router-upgrade.sock".into(),
            health: HealthSettings::default(),
            discovery: DiscoverySettings::default(),
            metrics: ReaderSettings::default(),
            shared_table: None,
            policy: policy::choose(policy::DEFAULT).unwrap_or_else(|_| unreachable!()),
            tree: TreeConfig::default(),
            eviction_interval: prefix_router_core::ledger::EVICTION_INTERVAL,
            session_ttl: policy::SESSION_TTL,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            grace_period: Duration::from_secs(60),
            shutdown_timeout: Duration::from_secs(5),
            tokens: TokenSettings::default(),
            kv_events: KvEventSettings::default(),
            traces: TraceSettings::default(),
        }
    }
}
