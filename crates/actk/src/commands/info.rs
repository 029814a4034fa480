//! `actk info` (placeholder until its owner fills it in).
#[derive(clap::Args, Debug)]
pub struct Args {}
pub fn run(_a: Args) -> anyhow::Result<()> { anyhow::bail!("actk info: not built yet") }
