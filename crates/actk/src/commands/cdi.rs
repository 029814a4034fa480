//! `actk cdi` (placeholder until its owner fills it in).
#[derive(clap::Subcommand, Debug)]
pub enum Command { Placeholder }
pub fn run(_c: Command) -> anyhow::Result<()> { anyhow::bail!("actk cdi: not built yet") }
