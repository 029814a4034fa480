//! Reading runc's command line without changing it: which subcommand, which bundle, which log
//! file. The argv itself is passed on verbatim; this module only looks.
//!
//! runc (1.1) global flags that take a value: `--root`, `--log`, `--log-format`, `--criu`,
//! `--rootless`; crun adds `--log-level`, `--cgroup-manager`. Boolean ones: `--debug`,
//! `--systemd-cgroup`, `--help`, `--version`. For a flag we do not know, we cannot tell whether
//! the next word is its value, so the subcommand is the first word that is one of runc's/crun's
//! subcommand names; an unknown word after an unknown flag is taken as that flag's value (field
//! case F03: `--console-socket /x create ...`). The argv is passed on unchanged either way.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// Global flags (before the subcommand) that take a separate value.
/// (`create` flags that take a value are listed too: some callers put them first.)
const GLOBAL_VALUE_FLAGS: &[&str] = &[
    "--root",
    "--log",
    "--log-format",
    "--criu",
    "--rootless",
    "--log-level",
    "--cgroup-manager",
    "--console-socket",
    "--pidfd-socket",
    "--pid-file",
    "--preserve-fds",
    "--bundle",
    "-b",
];

/// Subcommands of runc 1.1 and crun 1.8.
const SUBCOMMANDS: &[&str] = &[
    "checkpoint",
    "create",
    "delete",
    "events",
    "exec",
    "features",
    "help",
    "init",
    "kill",
    "list",
    "mounts",
    "pause",
    "ps",
    "restore",
    "resume",
    "run",
    "spec",
    "start",
    "state",
    "update",
];

/// Flags of `create`/`run` that take a separate value (so that value is not read as the bundle flag).
const CREATE_VALUE_FLAGS: &[&str] = &["--console-socket", "--pid-file", "--preserve-fds", "--pidfd-socket"];

/// What the shim needs from runc's argv.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Invocation {
    /// The subcommand (`create`, `start`, `state`, ...), if any.
    pub subcommand: Option<String>,
    /// `--bundle`/`-b` of `create`/`run`, as given (relative to the working directory).
    pub bundle: Option<PathBuf>,
    /// `--log FILE`.
    pub log: Option<PathBuf>,
    /// `--log-format` (`text` or `json`).
    pub log_format: Option<String>,
    /// The systemd cgroup driver was asked for (`--systemd-cgroup`, crun's
    /// `--cgroup-manager systemd`): device rules then go through systemd's DeviceAllow.
    pub systemd_cgroup: bool,
    /// Help or the version was asked for (`-h`/`--help` before or after the subcommand,
    /// `--version`/`-v` before it): the low-level runtime prints it and creates nothing, so
    /// the bundle is not read (`runc create -h` works without a config.json).
    pub help: bool,
}

impl Invocation {
    /// True for the subcommands that create a container from a bundle (`create`, `run`), when
    /// they are not asked for their help.
    pub fn creates(&self) -> bool {
        !self.help && matches!(self.subcommand.as_deref(), Some("create" | "run"))
    }
}

/// Whether `arg` asks for help as runc's flag parser (Go's `flag` package, through urfave/cli)
/// reads a boolean flag: `-h`, `--h`, `-help`, `--help`, or any of them `=true` (`=1`, `=t`).
fn is_help(arg: &str) -> bool {
    let name = arg.trim_start_matches('-');
    if arg.len() - name.len() > 2 || name.len() == arg.len() {
        return false;
    }
    let (name, value) = name.split_once('=').map_or((name, None), |(n, v)| (n, Some(v)));
    matches!(name, "h" | "help") && value.is_none_or(|v| matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True"))
}

/// Whether `arg` asks for the version as a global flag (`-v`, `--version`, Go's forms).
fn is_version(arg: &str) -> bool {
    matches!(arg, "-v" | "--v" | "-version" | "--version" | "--version=true" | "-v=true")
}

/// `--name=value` or `--name value` at `args[i]`: returns (value, how many words it used).
fn flag_value<'a>(args: &'a [OsString], i: usize, names: &[&str]) -> Option<(Option<&'a OsStr>, usize)> {
    let a = args[i].to_str()?;
    for n in names {
        if a == *n {
            return Some((args.get(i + 1).map(OsString::as_os_str), 2));
        }
        if let Some(v) = a.strip_prefix(n).and_then(|r| r.strip_prefix('=')) {
            return Some((Some(OsStr::new(v)), 1));
        }
    }
    None
}

/// Parses runc's argv (without argv[0]).
pub fn parse(args: &[OsString]) -> Invocation {
    let mut inv = Invocation::default();
    let mut i = 0;
    while i < args.len() {
        let Some(a) = args[i].to_str() else {
            i += 1;
            continue;
        };
        if a.starts_with('-') {
            if is_help(a) || is_version(a) {
                inv.help = true;
                i += 1;
            } else if let Some((v, used)) = flag_value(args, i, &["--log"]) {
                inv.log = v.map(PathBuf::from);
                i += used;
            } else if let Some((v, used)) = flag_value(args, i, &["--log-format"]) {
                inv.log_format = v.and_then(OsStr::to_str).map(str::to_string);
                i += used;
            } else if let Some((v, used)) = flag_value(args, i, &["--cgroup-manager"]) {
                inv.systemd_cgroup |= v.and_then(OsStr::to_str) == Some("systemd");
                i += used;
            } else if a == "--systemd-cgroup" || a == "--systemd-cgroup=true" {
                inv.systemd_cgroup = true;
                i += 1;
            } else if let Some((_, used)) = flag_value(args, i, GLOBAL_VALUE_FLAGS) {
                i += used;
            } else {
                i += 1;
            }
            continue;
        }
        if SUBCOMMANDS.contains(&a)
            || i == 0
            || !args[i - 1].to_str().is_some_and(|p| p.starts_with('-') && !p.contains('='))
        {
            inv.subcommand = Some(a.to_string());
            i += 1;
            break;
        }
        // The value of an unknown flag before the subcommand.
        i += 1;
    }
    if !inv.creates() {
        return inv;
    }
    // urfave/cli moves a subcommand's flags before its arguments, so `create ID --help` asks
    // for help too; only `--` ends the flags.
    while i < args.len() {
        if args[i].to_str() == Some("--") {
            break;
        }
        if let Some((v, used)) = flag_value(args, i, &["--bundle", "-b"]) {
            inv.bundle = v.map(PathBuf::from);
            i += used;
        } else if let Some((_, used)) = flag_value(args, i, CREATE_VALUE_FLAGS) {
            i += used;
        } else {
            inv.help |= args[i].to_str().is_some_and(is_help);
            i += 1;
        }
    }
    inv
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &[&str]) -> Invocation {
        parse(&v.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn docker_create_call() {
        let inv = p(&[
            "--root",
            "/var/run/docker/runtime-runc/moby",
            "--log",
            "/run/x/log.json",
            "--log-format",
            "json",
            "create",
            "--bundle",
            "/run/b",
            "--pid-file",
            "/run/b/init.pid",
            "abc",
        ]);
        assert_eq!(inv.subcommand.as_deref(), Some("create"));
        assert_eq!(inv.bundle, Some("/run/b".into()));
        assert_eq!(inv.log, Some("/run/x/log.json".into()));
        assert_eq!(inv.log_format.as_deref(), Some("json"));
    }

    #[test]
    fn f04_bundle_forms() {
        assert_eq!(p(&["create", "-b", "/b", "id"]).bundle, Some("/b".into()));
        assert_eq!(p(&["create", "-b=/b", "id"]).bundle, Some("/b".into()));
        assert_eq!(p(&["create", "--bundle=/b", "id"]).bundle, Some("/b".into()));
        assert_eq!(p(&["run", "--bundle", "/b", "id"]).bundle, Some("/b".into()));
        assert_eq!(p(&["create", "id"]).bundle, None);
        // A value of another flag is not mistaken for -b.
        assert_eq!(p(&["create", "--console-socket", "-b", "id"]).bundle, None);
    }

    #[test]
    fn f03_unknown_and_valued_global_flags() {
        let inv = p(&[
            "--systemd-cgroup",
            "--rootless=false",
            "--new-flag",
            "--root",
            "/r",
            "create",
            "--pidfd-socket",
            "/y",
            "-b",
            "/b",
            "x",
        ]);
        assert_eq!(inv.subcommand.as_deref(), Some("create"));
        assert_eq!(inv.bundle, Some("/b".into()));
        assert!(inv.systemd_cgroup);
        assert!(p(&["--cgroup-manager", "systemd", "create", "x"]).systemd_cgroup);
        assert!(!p(&["--cgroup-manager=cgroupfs", "create", "x"]).systemd_cgroup);
        let inv =
            p(&["--console-socket", "/x", "--pidfd-socket", "/y", "--new-valued", "v", "create", "-b", "/b", "x"]);
        assert_eq!((inv.subcommand.as_deref(), inv.bundle), (Some("create"), Some("/b".into())));
        let inv = p(&["--new-bool", "create", "--bundle=/b", "x"]);
        assert_eq!((inv.subcommand.as_deref(), inv.bundle), (Some("create"), Some("/b".into())));
        let inv = p(&["--rootless", "false", "start", "x"]);
        assert_eq!(inv.subcommand.as_deref(), Some("start"));
        assert!(!inv.creates());
        assert_eq!(p(&["--version"]).subcommand, None);
    }

    /// Issue 25 item 5: a subcommand's (or runc's) help is runc's, whatever follows it: the
    /// bundle is not read, so `create -h` works without a config.json, as with runc.
    #[test]
    fn help_and_version_create_nothing() {
        for argv in [
            &["create", "-h"][..],
            &["run", "--help"],
            &["create", "--bundle", "/b", "id", "--help"],
            &["run", "-help"],
            &["create", "--h=true"],
            &["--help", "create"],
            &["--root", "/r", "-h", "run", "x"],
            &["--version", "create", "x"],
        ] {
            let inv = p(argv);
            assert!(inv.help && !inv.creates(), "{argv:?}");
        }
        for argv in [
            &["create", "--help=false", "x"][..],
            &["create", "--pid-file", "-h", "x"],
            &["run", "x", "--", "-h"],
            &["create", "---h", "x"],
        ] {
            assert!(p(argv).creates(), "{argv:?}");
        }
    }
}
