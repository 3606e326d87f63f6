//! The demo: simulated vLLM backends and the router in one process on free loopback ports,
//! one replay of the same workload per policy (fresh, cold backends each time), and a
//! side-by-side comparison printed as a table and written as JSON and an SVG chart.
//! It only assembles the simulator, the router and the replay; it measures nothing itself.
//! `--scenario noisy-neighbour` and `--scenario priority` run flow control's scenarios
//! instead ([`flows`]).

pub mod flows;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;

use prefix_router::config::{Config, Settings};
use prefix_router::serve::embedded::Embedded;
use prefix_router_replay::compare::{self, PolicyResult};
use prefix_router_replay::{ReplayArgs, ReplayReport, Synthetic, Workload, replay};
use prefix_router_sim::{SimConfig, SimHandle, start};

/// Options of the `demo` command.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Policies to compare, in order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "round_robin,consistent_hash,cache_aware,prefill_aware,kv_aware"
    )]
    pub policies: Vec<String>,
    /// Simulated backends.
    #[arg(long, default_value_t = 4)]
    pub backends: usize,
    /// Replay this Mooncake trace instead of the built-in agent workload.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Time compression: replay arrivals and every simulated delay are divided by this.
    #[arg(long, default_value_t = 20.0)]
    pub speedup: f64,
    /// Built-in workload: coding-agent sessions.
    #[arg(long, default_value_t = 24)]
    pub sessions: usize,
    /// Built-in workload: new sessions per second, before the speedup.
    #[arg(long, default_value_t = 0.5)]
    pub session_rate: f64,
    /// Stop each replay after this many requests.
    #[arg(long)]
    pub max_requests: Option<usize>,
    /// Send session ids as `x-session-id` (traces that carry them, and the agent workload).
    #[arg(long)]
    pub send_session_header: bool,
    /// KV cache capacity of each simulated backend, in 16-token blocks.
    #[arg(long, default_value_t = SimConfig::default().kv_blocks)]
    pub kv_blocks: usize,
    /// The router's `max_tree_size` [default: the router's; the simulated backends publish
    /// their KV capacity, which sizes their indexes anyway].
    #[arg(long)]
    pub max_tree_size: Option<usize>,
    /// Requests in flight at most.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// Router replicas, requests spread over them in turn (a round-robin balancer); with
    /// more than one they share their conversation table through a `redis-server` the
    /// demo starts.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// With replicas, do not share the conversation table (no `redis-server` needed).
    #[arg(long)]
    pub no_shared_table: bool,
    /// A model's tokenizer directory: the simulated backends render and count with it, and
    /// the router routes in token mode.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The simulated backends publish their KV events and the router follows them (its
    /// exact index); needs --tokenizer.
    #[arg(long, requires = "tokenizer")]
    pub kv_events: bool,
    /// Where to write `demo.json` and `demo.svg` (`flows.json` for a flow scenario).
    #[arg(long, default_value = "demo-results")]
    pub out_dir: PathBuf,
    /// What to show: the policies side by side, or a flow-control scenario.
    #[arg(long, value_enum, default_value_t = DemoScenario::Policies)]
    pub scenario: DemoScenario,
    /// Flow scenarios: requests each simulated backend runs at once (the rest wait in its
    /// queue).
    #[arg(long, default_value_t = 4)]
    pub max_num_seqs: usize,
    /// Flow scenarios: seconds every flow of a run sends for.
    #[arg(long, default_value_t = 30.0)]
    pub scenario_seconds: f64,
}

/// What the demo shows.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DemoScenario {
    /// Each policy on the same workload.
    #[default]
    Policies,
    /// Tenant B alone, then beside tenant A flooding the fleet (a tenants file of equal
    /// weights).
    NoisyNeighbour,
    /// High-priority sessions alone, then beside normal and low floods.
    Priority,
}

/// Runs the comparison, prints it and writes `demo.json` and `demo.svg`.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let print = |line: &str| println!("{line}");
    let flows = match args.scenario {
        DemoScenario::Policies => None,
        DemoScenario::NoisyNeighbour => Some(flows::noisy_neighbour(&args, print).await?),
        DemoScenario::Priority => Some(flows::priority(&args, print).await?),
    };
    if let Some(results) = flows {
        println!("\n{}", flows::table(&results));
        std::fs::create_dir_all(&args.out_dir)?;
        let json = args.out_dir.join("flows.json");
        std::fs::write(&json, serde_json::to_vec_pretty(&results)?)?;
        println!("wrote {}", json.display());
        return Ok(());
    }
    let results = compare(&args, |line| println!("{line}")).await?;
    println!("\n{}", compare::table(&results, args.speedup));
    write_outputs(&args, &results)
}

/// Replays the workload once per policy on fresh backends; `progress` hears what happens.
pub async fn compare(
    args: &DemoArgs,
    progress: impl Fn(&str),
) -> anyhow::Result<Vec<PolicyResult>> {
    let replay_args = replay_args(args);
    let loading = replay_args.clone();
    let workload = tokio::task::spawn_blocking(move || Workload::load(&loading)).await??;
    progress(&format!("workload: {}", workload.describe()));
    progress(&workload.bound_summary());
    if let Some(capacity) = replay_args.bound_capacity {
        let pooled = workload.pooled_bound(capacity);
        let line = format!(
            "with the fleet's KV ({capacity} tokens) pooled into one LRU cache: {:.2}%\n",
            pooled * 100.0
        );
        progress(&line);
    }
    let mut results = Vec::new();
    for policy in &args.policies {
        progress(&format!("running {policy} ..."));
        let report = run_policy(args, policy, &replay_args, &workload).await?;
        results.push(PolicyResult {
            policy: policy.clone(),
            report,
        });
    }
    Ok(results)
}

fn replay_args(args: &DemoArgs) -> ReplayArgs {
    let mut replay = ReplayArgs {
        trace: args.trace.clone(),
        synthetic: args.trace.is_none().then_some(Synthetic::Agent),
        speedup: args.speedup,
        stream: true,
        quiet: true,
        concurrency: args.concurrency,
        max_requests: args.max_requests,
        send_session_header: args.send_session_header,
        sessions: args.sessions,
        session_rate: args.session_rate,
        backends: Some(args.backends),
        bound_capacity: Some(
            (args.backends * args.kv_blocks * SimConfig::default().block_tokens) as u64,
        ),
        ..ReplayArgs::default()
    };
    replay.model = prefix_router_sim::DEFAULT_MODEL.to_string();
    replay
}

async fn run_policy(
    args: &DemoArgs,
    policy: &str,
    replay_args: &ReplayArgs,
    workload: &Workload,
) -> anyhow::Result<ReplayReport> {
    let (sims, events_offset) = start_sims(args).await?;
    let urls: Vec<String> = sims.iter().map(|s| format!("http://{}", s.addr)).collect();
    let redis = (args.replicas > 1 && !args.no_shared_table)
        .then(Redis::start)
        .transpose()?;
    let mut routers = Vec::with_capacity(args.replicas.max(1));
    for _ in 0..args.replicas.max(1) {
        let shared = redis.as_ref().map(|r| r.url.clone());
        let config = router_config(args, policy, &urls, shared, events_offset)?;
        let backends = urls.len();
        let router = tokio::task::spawn_blocking(move || {
            let running = Embedded::start(&config)?;
            anyhow::Ok(
                running
                    .wait_ready(backends, Duration::from_secs(30))
                    .then_some(running),
            )
        })
        .await??
        .context("the router did not become ready")?;
        routers.push(router);
    }
    if let Some(redis) = &redis {
        redis.wait_subscribed(routers.len()).await?;
    }
    let mut run_args = replay_args.clone();
    run_args.url = (routers.iter().map(|r| r.url.as_str()))
        .collect::<Vec<_>>()
        .join(",");
    let report = replay(&run_args, workload).await?;
    tokio::task::spawn_blocking(move || drop(routers)).await?;
    drop(redis);
    for sim in sims {
        sim.shutdown().await;
    }
    Ok(report)
}

/// The simulated backends, and with `--kv-events` the offset from each one's HTTP port
/// to its KV event port (one for all, as the router's endpoint template has it).
async fn start_sims(args: &DemoArgs) -> anyhow::Result<(Vec<SimHandle>, Option<i32>)> {
    let tokenizer = (args.tokenizer.as_deref())
        .map(prefix_router_sim::hf::HfModel::load)
        .transpose()?
        .map(std::sync::Arc::new);
    let mut listeners = Vec::with_capacity(args.backends);
    for _ in 0..args.backends {
        listeners.push(TcpListener::bind("127.0.0.1:0").await?);
    }
    let ports = (listeners.iter())
        .map(|l| Ok(l.local_addr()?.port()))
        .collect::<std::io::Result<Vec<u16>>>()?;
    let offset = args.kv_events.then(|| free_offset(&ports)).transpose()?;
    let mut sims = Vec::with_capacity(args.backends);
    for (i, listener) in listeners.into_iter().enumerate() {
        let kv_events = offset.map(|o| prefix_router_sim::kv_events::KvEventsConfig {
            enable_kv_cache_events: true,
            publisher: "zmq".into(),
            endpoint: format!("tcp://127.0.0.1:{}", i32::from(ports[i]) + o),
            ..Default::default()
        });
        let config = SimConfig {
            kv_blocks: args.kv_blocks,
            time_scale: args.speedup,
            name: format!("backend-{i}"),
            tokenizer: tokenizer.clone(),
            kv_events,
            ..SimConfig::default()
        };
        sims.push(start(config, listener).await?);
    }
    Ok((sims, offset))
}

/// An offset that puts every one of `ports` on a free loopback port.
fn free_offset(ports: &[u16]) -> anyhow::Result<i32> {
    let free = |port: i32| {
        u16::try_from(port)
            .ok()
            .filter(|&p| p > 1024)
            .is_some_and(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
    };
    (1..500)
        .map(|i| i * 89)
        .find(|o| ports.iter().all(|&p| free(i32::from(p) + o)))
        .context("no free loopback ports for the backends' KV events")
}

/// How often the router reads the backends' load, seconds: as often in simulated time as a
/// router at 1x does in real time (once a second, divided by `speedup`), at most 50 times a
/// second. At 1 s a 20x demo would read it every 20 simulated seconds, and place new
/// conversations on load the lab, which reads it every simulated second, never sees.
fn metrics_interval(speedup: f64) -> f64 {
    (1.0 / speedup.max(1.0)).max(0.02)
}

fn router_config(
    args: &DemoArgs,
    policy: &str,
    urls: &[String],
    shared_table: Option<String>,
    events_offset: Option<i32>,
) -> anyhow::Result<Config> {
    let addr = free_loopback_addr()?;
    let (host, port) = addr
        .rsplit_once(':')
        .context("loopback address without port")?;
    let admin = free_loopback_addr()?;
    let (_, admin_port) = admin
        .rsplit_once(':')
        .context("loopback address without port")?;
    let settings = Settings {
        host: Some(host.to_string()),
        port: Some(port.parse()?),
        admin_port: Some(admin_port.parse()?),
        worker_urls: Some(urls.to_vec()),
        policy: Some(policy.to_string()),
        max_tree_size: args.max_tree_size,
        health_check_interval: Some(0.5),
        metrics_interval: Some(metrics_interval(args.speedup)),
        threads: Some(2),
        grace_period: Some(0.0),
        shared_table,
        tokenizer: args.tokenizer.clone(),
        kv_events: events_offset.map(|o| format!("tcp://127.0.0.1:{{port{o:+}}}")),
        ..Settings::default()
    };
    Ok(Config::from_settings(settings)?)
}

fn write_outputs(args: &DemoArgs, results: &[PolicyResult]) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    let json = args.out_dir.join("demo.json");
    std::fs::write(&json, serde_json::to_vec_pretty(results)?)?;
    let svg = args.out_dir.join("demo.svg");
    std::fs::write(&svg, compare::svg(results, args.speedup))?;
    println!("wrote {} and {}", json.display(), svg.display());
    Ok(())
}

/// A `redis-server` on a free loopback port for the replicas' shared table, stopped on drop.
struct Redis {
    child: std::process::Child,
    addr: String,
    url: String,
}

impl Redis {
    fn start() -> anyhow::Result<Redis> {
        let addr = free_loopback_addr()?;
        let port = addr.rsplit_once(':').map_or("", |(_, p)| p).to_string();
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .context(
                "replicas share their table through redis-server, which could not be started \
                 (install it, or pass --no-shared-table)",
            )?;
        Ok(Redis {
            child,
            url: format!("redis://{addr}"),
            addr,
        })
    }

    /// Waits until `n` clients subscribed (the replicas are sharing).
    async fn wait_subscribed(&self, n: usize) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline {
            if self.subscribers().await.is_some_and(|s| s >= n) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!(
            "the router replicas did not subscribe to redis-server at {}",
            self.addr
        )
    }

    /// Clients subscribed to any channel, from `INFO clients`.
    async fn subscribers(&self) -> Option<usize> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(&self.addr).await.ok()?;
        stream
            .write_all(b"PUBSUB NUMSUB prefix-router\r\n")
            .await
            .ok()?;
        let mut reply = vec![0; 256];
        let n = stream.read(&mut reply).await.ok()?;
        let text = String::from_utf8_lossy(&reply[..n]);
        text.lines()
            .rev()
            .find_map(|l| l.strip_prefix(':')?.parse().ok())
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback `host:port` with a port the OS just handed out (bound, then released).
fn free_loopback_addr() -> std::io::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.to_string())
}
