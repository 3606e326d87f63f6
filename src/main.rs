//! The `prefix-router` command: the router itself (the default), plus tools beside it.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use pingora_core::server::configuration::Opt;
use prefix_router::config::{Config, Settings};

#[derive(Parser)]
#[command(name = "prefix-router", version, about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Run the router (the default when no command is given).
    Serve(ServeArgs),
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
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Serve(args)) => serve(args),
        None => serve(cli.serve),
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref(), args.settings).context("invalid configuration")?;
    log::info!(
        "listening on {} with policy {} over {} workers",
        config.listen,
        config.policy.name,
        config.workers.len()
    );
    let opt = Opt {
        upgrade: args.upgrade,
        ..Opt::default()
    };
    let (server, _handles) = prefix_router::server::build(&config, Some(opt));
    server.run_forever()
}
