//! `actk config default` and `actk config show`: the configuration file
//! (/etc/actk/config.toml, `actk.toml` beside the binaries of an installation, or
//! `$ACTK_CONFIG`), see `actk_core::config::Config::path`.

use actk_core::config::{Config, default_toml};

/// `actk config` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Print a commented configuration with every default (a starting /etc/actk/config.toml).
    Default,
    /// Print the effective configuration: the file (ACTK_CONFIG, else actk.toml beside this actk, else /etc/actk/config.toml) over the defaults.
    Show,
}

/// Runs an `actk config` subcommand. Errors: a config file that cannot be read or parsed (`show`).
pub fn run(c: Command) -> anyhow::Result<()> {
    match c {
        Command::Default => out!("{}", default_toml())?,
        Command::Show => {
            let path = Config::path();
            let config = Config::load_default()?;
            let source = if path.exists() {
                format!("{}", path.display())
            } else {
                format!("{} (absent: defaults)", path.display())
            };
            out!("# effective actk configuration from {source}\n{}", config.to_toml())?;
        }
    }
    Ok(())
}
