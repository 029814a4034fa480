//! `actk`: the command-line tool. One file per subcommand under `commands/`, each thin over
//! actk-core.

/// `print!` to stdout that returns the write error instead of panicking: with `?`, a closed
/// pipe (`actk list | head -1`) ends the command, and [`main`] ends it quietly.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `println!` counterpart of [`out!`].
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

mod commands;

use clap::{Parser, Subcommand};

/// actk: one toolkit to give containers the host's accelerators (NVIDIA, AWS Neuron, AMD,
/// Intel Gaudi, DRM accel) through CDI, an OCI runtime shim, an OCI hook and a device plugin.
#[derive(Parser, Debug)]
#[command(name = "actk", version = actk_version::LONG, about, long_about = None)]
struct Cli {
    /// Log level (error, warn, info, debug, trace); also ACTK_LOG.
    #[arg(long, global = true, env = "ACTK_LOG", default_value = "warn")]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List accelerator devices, one line each (like `nvidia-smi -L` / `neuron-ls`).
    List(commands::list::Args),
    /// Driver versions, CDI kinds, and what a request for each device would inject.
    Info(commands::info::Args),
    /// Generate, list and validate CDI specs.
    #[command(subcommand)]
    Cdi(commands::cdi::Command),
    /// Register actk-runtime with a container engine.
    #[command(subcommand)]
    Runtime(commands::runtime::Command),
    /// Show the configuration file.
    #[command(subcommand)]
    Config(commands::config::Command),
    /// Set a Kubernetes node up for actk-runtime (the Helm chart's node setup), or undo it.
    #[command(subcommand)]
    Node(commands::node::Command),
    /// Host setup: /dev/char links for systemd hosts.
    #[command(subcommand)]
    System(commands::system::Command),
    /// Which pod, container or plain container holds each device (kubelet PodResources and the
    /// OCI runtimes' state), for every vendor.
    Who(commands::who::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Colour only on a terminal: the chart's generator and node setup logs must be plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command {
        Command::List(a) => commands::list::run(a),
        Command::Info(a) => commands::info::run(a),
        Command::Cdi(c) => commands::cdi::run(c),
        Command::Runtime(c) => commands::runtime::run(c),
        Command::Config(c) => commands::config::run(c),
        Command::Node(c) => commands::node::run(c),
        Command::System(c) => commands::system::run(c),
        Command::Who(a) => commands::who::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // The reader went away (`actk list | head -1`): what it wanted was written; say nothing,
        // as ls or grep end on SIGPIPE without a word.
        Err(e) if is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("actk: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Whether an error comes from writing to a closed pipe (an io error, or serde_json's wrapping of one).
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == BrokenPipe)
            || c.downcast_ref::<serde_json::Error>().and_then(serde_json::Error::io_error_kind) == Some(BrokenPipe)
    })
}
