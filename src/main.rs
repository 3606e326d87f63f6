//! The `prefix-router` command: the router itself (the default), plus tools beside it.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use pingora_core::server::configuration::Opt;
use prefix_router::config::{Config, Settings};
use prefix_router::serve;

/// jemalloc instead of glibc's malloc: at two data-plane threads, glibc's malloc, free and
/// arena lock were a sixth of the router's CPU on small requests, and memory under load is
/// lower with jemalloc (docs/BENCHMARKS.md has the cost per request).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "prefix-router",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once at start
enum Command {
    /// Run the router (the default when no command is given).
    Serve(ServeArgs),
    /// Run as the endpoint picker of an Envoy gateway (Gateway API Inference Extension):
    /// an ext_proc gRPC server on --grpc-port (default 9002) instead of the HTTP data plane.
    Epp(ServeArgs),
    /// Run simulated vLLM backends.
    Sim(prefix_router_sim::SimArgs),
    /// Replay a trace or a synthetic workload against an OpenAI-compatible URL.
    Replay(prefix_router_replay::ReplayArgs),
    /// Compare policies on simulated backends, all in this process.
    Demo(prefix_router_demo::DemoArgs),
    /// Compare policies in virtual time: deterministic, no sockets (scenarios, sweeps).
    Lab(prefix_router_lab::LabArgs),
    /// Render and tokenize request bodies as the engine would (one JSON body per line on
    /// stdin, one JSON answer per line on stdout): for checking a model's template.
    Tokenize(TokenizeArgs),
}

#[derive(Args)]
struct TokenizeArgs {
    /// The model's tokenizer directory (tokenizer.json, tokenizer_config.json).
    #[arg(long)]
    tokenizer: PathBuf,
    /// The endpoint the bodies are for: chat, completions or responses.
    #[arg(long, default_value = "chat")]
    endpoint: String,
}

#[derive(Args)]
struct ServeArgs {
    /// TOML config file; flags override its values.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Take the listening sockets over from a running instance (graceful upgrade).
    #[arg(long)]
    upgrade: bool,
    #[command(flatten)]
    settings: Settings,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let quiet = matches!(cli.command, Some(Command::Demo(_) | Command::Lab(_)));
    let level = if quiet {
        "warn"
    } else {
        "info,pingora_core=warn,pingora_proxy=warn,rustls=error"
    };
    let logger =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).build();
    log::set_max_level(logger.filter());
    log::set_boxed_logger(Box::new(Redacting(logger)))?;
    match cli.command {
        Some(Command::Serve(args)) => serve(args, false),
        Some(Command::Epp(args)) => serve(args, true),
        Some(Command::Sim(args)) => runtime()?.block_on(prefix_router_sim::run(args)),
        Some(Command::Replay(args)) => runtime()?.block_on(prefix_router_replay::run(args)),
        Some(Command::Demo(args)) => runtime()?.block_on(prefix_router_demo::run(args)),
        Some(Command::Lab(args)) => Ok(prefix_router_lab::run(&args)?),
        Some(Command::Tokenize(args)) => tokenize(&args),
        None => serve(cli.serve, false),
    }
}

/// A runtime for the tools beside the router (the router runs Pingora's own runtimes).
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// Drops Pingora's trace-level HTTP records, which print raw headers (Authorization, API
/// keys), whatever `RUST_LOG` asks for. Two of Pingora's errors that cost no request are
/// logged at debug level instead: a downstream TLS handshake that failed (a TCP probe or
/// a scanner on a TLS listener: one line each time), and a pooled upstream connection that
/// could not be taken back (a new one is opened).
struct Redacting(env_logger::Logger);

/// Pingora's error records that cost no request, by target and message start.
const ROUTINE: [(&str, &str); 2] = [
    (
        "pingora_core::services::listening",
        "Downstream handshake error",
    ),
    (
        "pingora_core::connectors",
        "failed to acquire reusable stream",
    ),
];

fn routine(record: &log::Record) -> bool {
    record.level() == log::Level::Error
        && ROUTINE.iter().any(|(target, start)| {
            record.target() == *target && record.args().to_string().starts_with(start)
        })
}

impl log::Log for Redacting {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        let raw_headers =
            metadata.level() == log::Level::Trace && metadata.target().starts_with("pingora");
        !raw_headers && self.0.enabled(metadata)
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        if !routine(record) {
            return self.0.log(record);
        }
        let demoted = log::Record::builder()
            .args(*record.args())
            .level(log::Level::Debug)
            .target(record.target())
            .build();
        if self.0.enabled(demoted.metadata()) {
            self.0.log(&demoted);
        }
    }

    fn flush(&self) {
        self.0.flush();
    }
}

/// The `tokenize` command: `{"ids": [...]}` or `{"error": ..., "reason": ...}` per body.
fn tokenize(args: &TokenizeArgs) -> anyhow::Result<()> {
    use std::io::{BufRead, Write};
    let model = prefix_router_tokens::Model::load(&args.tokenizer)?;
    let endpoint = prefix_router_core::request::Endpoint::from_path(&format!(
        "/v1/{}",
        match args.endpoint.as_str() {
            "chat" => "chat/completions",
            other => other,
        }
    ))
    .context("--endpoint must be chat, completions or responses")?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let answer = model
            .renderer()
            .prompt(endpoint, line.as_bytes())
            .and_then(|prompt| model.ids(&prompt));
        let json = match answer {
            Ok(ids) => serde_json::json!({ "ids": ids }),
            Err(e) => serde_json::json!({ "error": e.to_string(), "reason": e.label() }),
        };
        writeln!(out, "{json}")?;
    }
    Ok(())
}

/// The gRPC port of `prefix-router epp` when neither the flags nor the config file set it.
const EPP_PORT: u16 = 9002;

/// Runs the router; `picker`: as an endpoint picker, on [`EPP_PORT`] unless set.
fn serve(mut args: ServeArgs, picker: bool) -> anyhow::Result<()> {
    let mut config = Config::load(args.config.as_deref(), args.settings.clone())
        .context("invalid configuration")?;
    if picker && config.boot.epp_listen.is_none() {
        args.settings.grpc_port = Some(EPP_PORT);
        config = Config::load(args.config.as_deref(), args.settings.clone())
            .context("invalid configuration")?;
    }
    let plane = match &config.boot.epp_listen {
        Some(grpc) => format!("as an endpoint picker (ext_proc gRPC) on {grpc}"),
        None => format!("on {}", config.boot.listen),
    };
    log::info!(
        "listening {plane} with policy {} over {} workers",
        config.boot.policy.name,
        config.workers.len()
    );
    let opt = Opt {
        upgrade: args.upgrade,
        ..Opt::default()
    };
    let source = prefix_router::config::Source {
        file: args.config,
        flags: args.settings,
    };
    let (server, handles) =
        serve::build(&config, source, Some(opt)).context("invalid configuration")?;
    serve::lifecycle::run(server, handles.state)
}
