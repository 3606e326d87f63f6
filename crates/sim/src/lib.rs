//! A simulated vLLM backend: an OpenAI-compatible server that models one vLLM
//! instance's prefix cache, scheduling and timing, without a GPU.
//!
//! For: evaluating prefix-aware routing on one machine. Each instance renders
//! requests with its *own* chat template ([`template`]), keeps a vLLM-style
//! automatic prefix cache ([`cache`]), schedules and times requests like vLLM
//! ([`engine`]), and reports `usage.prompt_tokens_details.cached_tokens` and vLLM's
//! `/metrics`, so a routing mistake shows up as lost cache hits and slower
//! time-to-first-token. It speaks vLLM's KV-connector handoff: a request whose
//! `kv_transfer_params` ask for a remote decode answers with the parameters naming its
//! blocks, and one that names a remote prefill's blocks loads them instead of computing
//! them.
//! Not for: generating meaningful text (outputs are a fixed phrase), modelling
//! GPU-level effects (decode slowing with batch size, preemption), or sharing code with
//! the router's request parsing. Chunked-prefill steps are modelled when
//! `max_num_batched_tokens` is set.
//!
//! Start instances in-process with [`start`] (tests bind `127.0.0.1:0`), or from
//! the command line with [`run`] (`sim --count 4 --base-port 8001 --time-scale 60`).
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use prefix_router_sim::{SimConfig, start};
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let sim = start(SimConfig { time_scale: 100.0, ..SimConfig::default() }, listener).await?;
//! println!("POST http://{}/v1/chat/completions", sim.addr);
//! println!("cached so far: {}", sim.stats().cached_tokens);
//! sim.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod batch;
pub mod cache;
mod driver;
pub mod engine;
pub mod error;
mod generate;
pub mod hf;
mod http;
mod instance;
pub mod kv_events;
pub mod metrics;
mod openai;
pub mod template;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use anyhow::Context as _;
use hyper::header::HeaderValue;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use error::{ApiError, SimConfigError};
pub use generate::prepare;
pub use metrics::SimStats;

/// Default model name reported by `/v1/models` and in responses.
pub const DEFAULT_MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// One simulated instance's settings. Defaults model Llama-3.1-8B on one H100.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Model name served (default [`DEFAULT_MODEL`]).
    pub model: String,
    /// KV cache capacity in blocks (default 26 250, i.e. 420 000 tokens).
    pub kv_blocks: usize,
    /// Tokens per KV block (default 16, as vLLM).
    pub block_tokens: usize,
    /// Bytes of rendered prompt per token (default 4).
    pub bytes_per_token: usize,
    /// Prefill throughput shared by concurrent prefills, tokens per second (default 30 000).
    pub prefill_tokens_per_s: f64,
    /// The prompt position, tokens, at which attending to the context doubles a
    /// prefilled token's cost (default 0: none; every token costs the same).
    pub attention_tokens: f64,
    /// Fixed latency per request before its prefill, milliseconds (default 20).
    pub prefill_overhead_ms: f64,
    /// Interval between output tokens after the first, milliseconds (default 7); with
    /// `max_num_batched_tokens`, the time of an engine step that prefills nothing.
    pub decode_ms_per_token: f64,
    /// Most tokens one engine step computes, as vLLM's `--max-num-batched-tokens`: every
    /// step decodes a token of each running request and prefills chunks of the others, so
    /// a long prefill slows the decodes beside it (default 0: prefills share the
    /// throughput continuously and decode keeps its own pace).
    pub max_num_batched_tokens: usize,
    /// Time to load one KV block a remote prefill computed, for a disaggregated request's
    /// decode leg, milliseconds (default 0.1).
    pub kv_transfer_ms_per_block: f64,
    /// Most requests running at once; the rest wait (default 256).
    pub max_num_seqs: usize,
    /// The order the waiting requests are admitted in (default first come, first served).
    pub scheduling_policy: engine::Scheduling,
    /// Every delay is divided by this (default 1; 60 replays an hour in a minute).
    pub time_scale: f64,
    /// Longest prompt plus output accepted, tokens (default 131 072).
    pub max_model_len: usize,
    /// Where the model ends its answers of its own accord (finish reason `stop`), tokens,
    /// when the request allows more; default none: every answer runs to the length the
    /// request asks for (finish reason `length`). Agents ask for 32 000 and continue an
    /// answer cut at that length.
    pub answer_tokens: Option<usize>,
    /// Instance name: `system_fingerprint` and the `x-sim-instance` header (default "sim").
    pub name: String,
    /// A real model's chat template and tokenizer (`--tokenizer DIR`); default none: the
    /// built-in template at `bytes_per_token` bytes a token.
    pub tokenizer: Option<std::sync::Arc<hf::HfModel>>,
    /// Where to publish KV events, as vLLM's `--kv-events-config` (this instance's own
    /// endpoints); default none.
    pub kv_events: Option<kv_events::KvEventsConfig>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            model: DEFAULT_MODEL.to_owned(),
            kv_blocks: 26_250,
            block_tokens: 16,
            bytes_per_token: 4,
            prefill_tokens_per_s: 30_000.0,
            attention_tokens: 0.0,
            prefill_overhead_ms: 20.0,
            decode_ms_per_token: 7.0,
            max_num_batched_tokens: 0,
            kv_transfer_ms_per_block: 0.1,
            max_num_seqs: 256,
            scheduling_policy: engine::Scheduling::Fcfs,
            time_scale: 1.0,
            max_model_len: 131_072,
            answer_tokens: None,
            name: "sim".to_owned(),
            tokenizer: None,
            kv_events: None,
        }
    }
}

impl SimConfig {
    /// Checks that every size is at least 1 and every rate or delay is usable.
    pub fn validate(&self) -> Result<(), SimConfigError> {
        let counts = [
            ("kv_blocks", self.kv_blocks),
            ("block_tokens", self.block_tokens),
            ("bytes_per_token", self.bytes_per_token),
            ("max_num_seqs", self.max_num_seqs),
            ("max_model_len", self.max_model_len),
        ];
        if let Some((name, _)) = counts.iter().find(|(_, value)| *value == 0) {
            return Err(SimConfigError::Zero(name));
        }
        let positive = [
            ("prefill_tokens_per_s", self.prefill_tokens_per_s),
            ("time_scale", self.time_scale),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| !(v.is_finite() && *v > 0.0)) {
            return Err(SimConfigError::NotPositive(name));
        }
        let delays = [
            ("attention_tokens", self.attention_tokens),
            ("prefill_overhead_ms", self.prefill_overhead_ms),
            ("decode_ms_per_token", self.decode_ms_per_token),
            ("kv_transfer_ms_per_block", self.kv_transfer_ms_per_block),
        ];
        if let Some((name, _)) = delays.iter().find(|(_, v)| !(v.is_finite() && *v >= 0.0)) {
            return Err(SimConfigError::Negative(name));
        }
        Ok(())
    }

    /// The engine's timing and scheduling parameters, in simulated seconds.
    pub fn timing(&self) -> engine::Timing {
        engine::Timing {
            prefill_tokens_per_s: self.prefill_tokens_per_s,
            attention_tokens: self.attention_tokens,
            prefill_overhead_s: self.prefill_overhead_ms / 1000.0,
            decode_s_per_token: self.decode_ms_per_token / 1000.0,
            max_num_batched_tokens: self.max_num_batched_tokens,
            transfer_s_per_block: self.kv_transfer_ms_per_block / 1000.0,
            max_num_seqs: self.max_num_seqs,
            block_tokens: self.block_tokens,
            scheduling: self.scheduling_policy,
        }
    }
}

/// A running instance. Dropping it or calling [`SimHandle::shutdown`] stops it
/// (the listener closes, open connections and requests are dropped).
#[derive(Debug)]
pub struct SimHandle {
    /// The address the instance listens on.
    pub addr: SocketAddr,
    name: String,
    metrics: Arc<metrics::Metrics>,
    server: JoinHandle<()>,
    engine: JoinHandle<()>,
    publisher: Option<JoinHandle<()>>,
}

impl SimHandle {
    /// The instance name (its `system_fingerprint`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Counters since start: requests, prompt and cached tokens, gauges.
    pub fn stats(&self) -> SimStats {
        self.metrics.snapshot()
    }

    /// Stops the instance and waits until its tasks have ended.
    pub async fn shutdown(mut self) {
        self.server.abort();
        self.engine.abort();
        let _ = (&mut self.server).await;
        let _ = (&mut self.engine).await;
        if let Some(publisher) = self.publisher.take() {
            publisher.abort();
            let _ = publisher.await;
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.server.abort();
        self.engine.abort();
        if let Some(publisher) = &self.publisher {
            publisher.abort();
        }
    }
}

/// Starts one instance on an already bound listener (tests bind `127.0.0.1:0`), and its
/// KV event publisher when configured. Fails with `InvalidInput` if `config` does not
/// validate, and when the publisher's sockets cannot be bound.
pub async fn start(config: SimConfig, listener: TcpListener) -> std::io::Result<SimHandle> {
    config.validate()?;
    let addr = listener.local_addr()?;
    let metrics = Arc::new(metrics::Metrics::default());
    let mut core = engine::EngineCore::new(config.timing(), config.kv_blocks);
    let clock = driver::SimClock::new(config.time_scale);
    let (publisher, publishing) = match config.kv_events.as_ref().filter(|k| k.publishes()) {
        Some(events) => {
            let (publisher, task) = kv_events::bind(events, config.block_tokens)
                .await
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::AddrInUse, e.to_string()))?;
            core.publish_changes();
            (Some(publisher), Some(task))
        }
        None => (None, None),
    };
    let (engine_handle, engine) = driver::spawn(core, metrics.clone(), clock, publisher);
    let name = config.name.clone();
    let shared = Arc::new(instance::Shared {
        instance_header: HeaderValue::from_str(&config.name).ok(),
        config,
        engine: engine_handle,
        metrics: metrics.clone(),
        next_number: AtomicU64::new(0),
    });
    let server = tokio::spawn(http::serve(listener, shared));
    Ok(SimHandle {
        addr,
        name,
        metrics,
        server,
        engine,
        publisher: publishing,
    })
}

/// The `sim` subcommand: start `--count` instances on consecutive ports.
#[derive(clap::Args, Debug, Clone)]
pub struct SimArgs {
    /// Number of instances to start (at least 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub count: u16,
    /// Port of the first instance; the others follow (0: any free ports).
    #[arg(long, default_value_t = 8001)]
    pub base_port: u16,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Model name served.
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// KV cache capacity per instance, in blocks.
    #[arg(long, default_value_t = 26_250)]
    pub kv_blocks: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_tokens: usize,
    /// Bytes of rendered prompt per token.
    #[arg(long, default_value_t = 4)]
    pub bytes_per_token: usize,
    /// Prefill throughput shared by concurrent prefills, tokens per second.
    #[arg(long, default_value_t = 30_000.0)]
    pub prefill_tokens_per_s: f64,
    /// The prompt position, tokens, at which attending to the context doubles a
    /// prefilled token's cost; 0: none, every token costs the same.
    #[arg(long, default_value_t = 0.0)]
    pub attention_tokens: f64,
    /// Fixed latency per request before its prefill, milliseconds.
    #[arg(long, default_value_t = 20.0)]
    pub prefill_overhead_ms: f64,
    /// Interval between output tokens, milliseconds; with --max-num-batched-tokens, the
    /// time of an engine step that prefills nothing.
    #[arg(long, default_value_t = 7.0)]
    pub decode_ms_per_token: f64,
    /// Most tokens one engine step computes, as vLLM's: every step decodes a token of each
    /// running request and prefills chunks of the others in admission order; 0: prefills
    /// share the throughput continuously and decode keeps its own pace.
    #[arg(long, default_value_t = 0)]
    pub max_num_batched_tokens: usize,
    /// Time to load one KV block a remote prefill computed (the decode leg of a
    /// disaggregated request, whose `kv_transfer_params` name the blocks), milliseconds.
    #[arg(long, default_value_t = 0.1)]
    pub kv_transfer_ms_per_block: f64,
    /// Most requests running at once per instance.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// The order waiting requests are admitted in, as vLLM's: `priority` admits the
    /// lowest `priority` (body field or `X-Vllm-Priority` header) first.
    #[arg(long, value_enum, default_value = "fcfs")]
    pub scheduling_policy: engine::Scheduling,
    /// Divides every delay (60: an hour of trace in a minute).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Longest prompt plus output accepted, tokens.
    #[arg(long, default_value_t = 131_072)]
    pub max_model_len: usize,
    /// Answers end of their own accord (finish reason `stop`) after this many tokens when
    /// the request allows more [default: every answer runs to its requested length]
    #[arg(long)]
    pub answer_tokens: Option<usize>,
    /// Name prefix: instance names are `{name}-{port}`.
    #[arg(long, default_value = "sim")]
    pub name: String,
    /// A model's tokenizer directory (tokenizer.json, tokenizer_config.json): prompts are
    /// rendered with its chat template and counted with its tokenizer, as vLLM does
    /// [default: the built-in template, --bytes-per-token bytes a token]
    #[arg(long)]
    pub tokenizer: Option<std::path::PathBuf>,
    /// Publish KV events as vLLM does, with vLLM's JSON (`enable_kv_cache_events`,
    /// `publisher`, `endpoint`, `replay_endpoint`, `buffer_steps`, `topic`); instance i
    /// binds the endpoints' ports + i. Token ids are --tokenizer's, else the built-in
    /// tokenizer's (the rendered prompt's 4-byte words) [default: none]
    #[arg(long)]
    pub kv_events_config: Option<String>,
}

impl SimArgs {
    /// The settings of the instance listening on `port`.
    pub fn config(&self, port: u16) -> SimConfig {
        SimConfig {
            model: self.model.clone(),
            kv_blocks: self.kv_blocks,
            block_tokens: self.block_tokens,
            bytes_per_token: self.bytes_per_token,
            prefill_tokens_per_s: self.prefill_tokens_per_s,
            attention_tokens: self.attention_tokens,
            prefill_overhead_ms: self.prefill_overhead_ms,
            decode_ms_per_token: self.decode_ms_per_token,
            max_num_batched_tokens: self.max_num_batched_tokens,
            kv_transfer_ms_per_block: self.kv_transfer_ms_per_block,
            max_num_seqs: self.max_num_seqs,
            scheduling_policy: self.scheduling_policy,
            time_scale: self.time_scale,
            max_model_len: self.max_model_len,
            answer_tokens: self.answer_tokens,
            name: format!("{}-{port}", self.name),
            tokenizer: None,
            kv_events: None,
        }
    }
}

/// Runs `args.count` instances until Ctrl-C.
pub async fn run(args: SimArgs) -> anyhow::Result<()> {
    SimConfig {
        name: args.name.clone(),
        ..args.config(0)
    }
    .validate()?;
    let tokenizer = (args.tokenizer.as_deref())
        .map(hf::HfModel::load)
        .transpose()?
        .map(std::sync::Arc::new);
    let kv_events = (args.kv_events_config.as_deref())
        .map(kv_events::KvEventsConfig::parse)
        .transpose()?;
    let mut handles = Vec::with_capacity(usize::from(args.count));
    for i in 0..args.count {
        let port = match args.base_port {
            0 => 0,
            base => base
                .checked_add(i)
                .context("--base-port + --count exceeds 65535")?,
        };
        let listener = TcpListener::bind((args.host.as_str(), port))
            .await
            .with_context(|| format!("binding {}:{port}", args.host))?;
        let bound = listener.local_addr()?;
        let config = SimConfig {
            tokenizer: tokenizer.clone(),
            kv_events: kv_events.as_ref().map(|k| k.for_instance(i)).transpose()?,
            ..args.config(bound.port())
        };
        let handle = start(config, listener).await?;
        log::info!("sim instance {} listening on http://{bound}", handle.name());
        handles.push(handle);
    }
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    log::info!("sim: shutting down {} instance(s)", handles.len());
    for handle in handles {
        handle.shutdown().await;
    }
    Ok(())
}
