//! Reading every backend's `/metrics` ([`metrics`](super::metrics)) on an interval (1 s by
//! default): its published load goes to its account for policies to see, its KV capacity
//! sizes its index. llama.cpp's slots and their context are read from its `/props` once,
//! and again after a round it could not be read in. A backend that cannot be read this
//! round has no published load until the next one; its last known capacity stays. With
//! flow control on (a tenants file), each published queue teaches the backend's account
//! where to hold work back in the router ([`Account::learn_hold`]); a backend that never
//! queued takes the hold its peers learned; then flow control hears of the read
//! ([`AfterRead::read`]: it takes back what the engines queue past their holds).
//!
//! The models each backend lists ([`models`](super::models)) are read with its first
//! metrics and then every `models_interval`; not llama.cpp's, which answers any `model`.
//!
//! [`Account::learn_hold`]: prefix_router_core::ledger::Account::learn_hold

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use log::info;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use prefix_router_core::ledger::Account;

use super::fetch::Fetcher;
use super::{Backend, Fleet, Served, metrics};

/// How a router reads its backends' metrics and models.
#[derive(Clone, Debug, PartialEq)]
pub struct ReaderSettings {
    /// Time between two reads of each backend's metrics. Default 1 s.
    pub interval: Duration,
    /// Time one read may take. Default 1 s.
    pub timeout: Duration,
    /// Time between two reads of each backend's `/v1/models`. Default 30 s.
    pub models_interval: Duration,
}

impl Default for ReaderSettings {
    fn default() -> Self {
        ReaderSettings {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            models_interval: Duration::from_secs(30),
        }
    }
}

/// What published a backend's metrics, as far as models go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    /// llama.cpp's server: it answers any `model`, whatever it lists.
    LlamaCpp,
    /// Another (vLLM, SGLang, ...): it serves what it lists.
    Other,
}

/// What the reader asks of flow control after each read.
pub trait AfterRead: Send + Sync {
    /// Whether flow control is on now (a reload may change it): holds are learned.
    fn on(&self) -> bool;

    /// A read of every backend in `accounts` ended, with flow control on, their holds
    /// learned ([`flow::after_read`](prefix_router_core::flow::after_read)).
    fn read(&self, accounts: &[&Account]);
}

/// The reader of one fleet's metrics, run as a background service.
pub struct MetricsReader {
    settings: ReaderSettings,
    fleet: Arc<Fleet>,
    fetcher: Fetcher,
    flow: Arc<dyn AfterRead>,
}

impl MetricsReader {
    /// Reads `fleet`'s backends as `settings` say; holds are learned while `flow` is on.
    pub fn new(settings: ReaderSettings, fleet: Arc<Fleet>, flow: Arc<dyn AfterRead>) -> Self {
        MetricsReader {
            settings,
            fetcher: Fetcher::new(&fleet),
            fleet,
            flow,
        }
    }

    /// Reads every backend of the current snapshot once, in parallel (and its models when
    /// they are due).
    pub async fn read_all(&self) {
        let snapshot = self.fleet.snapshot();
        let reads = snapshot.backends.iter().map(|b| async {
            if self.read(b).await != Some(Engine::LlamaCpp) {
                self.read_models(b).await;
            }
        });
        futures_util::future::join_all(reads).await;
        if self.flow.on() {
            let accounts: Vec<&Account> = snapshot.backends.iter().map(|b| &*b.account).collect();
            self.flow.read(&accounts);
        }
    }

    /// Reads `backend`'s `/v1/models`, when due.
    async fn read_models(&self, backend: &Backend) {
        let now = std::time::Instant::now();
        if !backend.models.due(now, self.settings.models_interval) {
            return;
        }
        let body = metrics::get(&self.fetcher, backend, "/v1/models", self.settings.timeout);
        let Some(served) = body.await.as_deref().and_then(Served::parse) else {
            return;
        };
        let names: Vec<&str> = served.models.iter().map(|m| m.id.as_str()).collect();
        let names = names.join(", ");
        if backend.models.set(served) {
            info!("backend {} serves {names}", backend.worker.url);
        }
    }

    /// Reads `backend`'s metrics; which engine published them, if it could be read.
    async fn read(&self, backend: &Backend) -> Option<Engine> {
        let get = |path| metrics::get(&self.fetcher, backend, path, self.settings.timeout);
        let page = get("/metrics").await.map(|body| metrics::parse(&body));
        let account = &backend.account;
        let Some(page) = page else {
            account.set_published(None);
            // It may come back with other settings: its slots are read again then.
            account.set_sequences(None);
            return None;
        };
        let (capacity, sequences) = match page.capacity {
            Some(tokens) => (Some(tokens), None),
            None if page.llama_cpp => match account.sequences() {
                Some(n) => (account.capacity(), Some(n)),
                None => (get("/props").await.and_then(|body| metrics::props(&body)))
                    .map_or((None, None), |p| (Some(p.capacity), Some(p.sequences))),
            },
            None => (None, None),
        };
        if (capacity, sequences) != (account.capacity(), account.sequences()) {
            let url = &backend.worker.url;
            match (capacity, sequences) {
                (Some(t), Some(n)) => info!("backend {url} has {n} slots of {} KV tokens", t.0 / n),
                (Some(t), None) => info!("backend {url} has {} tokens of KV cache", t.0),
                _ => info!("backend {url} does not publish its KV capacity"),
            }
            account.set_capacity(capacity);
            account.set_sequences(sequences);
        }
        account.set_block(page.block);
        account.set_published(page.load);
        match page.load {
            Some(load) if self.flow.on() => account.learn_hold(load),
            _ => account.forget_hold(),
        }
        Some(if page.llama_cpp {
            Engine::LlamaCpp
        } else {
            Engine::Other
        })
    }
}

#[async_trait]
impl BackgroundService for MetricsReader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.settings.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.read_all().await,
                _ = shutdown.changed() => return,
            }
        }
    }
}
