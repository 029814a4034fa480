//! `actk cdi`: generate CDI specs from discovery, list the qualified device names of the spec
//! directories, validate spec files (CNCF container-device-interface SPEC.md).

use actk_core::cdi::generate::{GenerateOptions, generate_all};
use actk_core::cdi::validate::{Format, validate_file, validate_spec};
use actk_core::cdi::write::{to_file_text, to_text, write_spec, write_spec_in_dir};
use actk_core::cdi::{DeviceNameStrategy, Registry};
use actk_core::config::Config;
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

/// `actk cdi` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Generate one CDI spec per kind from the devices found on the host.
    Generate(Box<GenerateArgs>),
    /// List the qualified CDI device names defined in the spec directories, one per line.
    List(ListArgs),
    /// Validate CDI spec files (JSON schema and SPEC.md rules); exit 1 when any is invalid.
    Validate(ValidateArgs),
    /// Remove the spec files `actk cdi generate --output DIR` writes (`<vendor>-<class>.json`
    /// or `.yaml` of every profile's kind), and nothing else: what the OS package runs before
    /// actk is removed, so that no spec names an actk-hook that is gone.
    Clean(CleanArgs),
}

/// Output encoding of `actk cdi generate`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatArg {
    /// JSON (default).
    Json,
    /// YAML.
    Yaml,
}

/// `--device-name-strategy` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrategyArg {
    /// `vendor/class=0`, `=1`, ...
    Index,
    /// `vendor/class=GPU-…` (devices without a UUID get no entry).
    Uuid,
    /// Both names for each device.
    Both,
}

/// Arguments of `actk cdi generate`.
#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// Host root to discover devices under (a driver container's root, or a fixture);
    /// default: `root` of the config file (ACTK_CONFIG, actk.toml beside actk, /etc/actk/config.toml), else `/`.
    #[arg(long, env = "ACTK_ROOT")]
    pub root: Option<PathBuf>,
    /// Where the driver's libraries, tools and firmware are when apart from --root (GPU
    /// Operator: `--root / --driver-root /run/nvidia/driver`); default: `driver_root` of the
    /// config file, else --root.
    #[arg(long, env = "ACTK_DRIVER_ROOT")]
    pub driver_root: Option<PathBuf>,
    /// Only this vendor: a profile name (`nvidia`) or a CDI kind (`nvidia.com/gpu`).
    #[arg(long)]
    pub vendor: Option<String>,
    /// Write here instead of stdout: a FILE (`.json`/`.yaml`; one kind only) or a DIR (one
    /// `<vendor>-<class>.<ext>` file per kind; created when missing). JSON files are compact,
    /// as the CDI library writes them (stdout is indented; `actk cdi list` or jq reads either).
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Output format; default: from the output file's extension, else json.
    #[arg(long, value_enum)]
    pub format: Option<FormatArg>,
    /// How devices are named in the spec.
    #[arg(long, value_enum, default_value = "both")]
    pub device_name_strategy: StrategyArg,
    /// Directory of user vendor profiles (`*.toml`) added to the built-in ones; default:
    /// `profiles_dir` of the config file, else /etc/actk/profiles.d.
    #[arg(long, env = "ACTK_PROFILES_DIR")]
    pub profiles_dir: Option<PathBuf>,
    /// Only the host files of these capabilities (comma separated, e.g. `utility,compute`);
    /// default: every capability whose files exist on the host. Control nodes reserved to a
    /// capability (NVIDIA's NVSwitch nodes: `fabric`) are in the spec only when it is named here
    /// (or `all`).
    #[arg(long, value_delimiter = ',')]
    pub capabilities: Option<Vec<String>>,
    /// Absolute path of an executable added as a createContainer hook that refreshes the
    /// container's ld.so.cache (`<exe> update-ldcache --folder DIR...`), so that a glibc image
    /// finds the mounted driver libraries (`dlopen("libcuda.so.1")`). Default: `hook_path` of
    /// the config file, else the `actk-hook` installed next to `actk` when there is one;
    /// `none`: no hook.
    #[arg(long)]
    pub ldcache_hook: Option<String>,
    /// Also give a container the group of each device node only that group may open (an AMD
    /// render node, 0660 root:render) as an additional GID, for engines that make such a node
    /// root's rather than the container user's. Raises the spec to cdiVersion 0.7.0, which
    /// podman 4.3 and containerd 1.7 do not read.
    #[arg(long)]
    pub additional_gids: bool,
    /// Where the node's `/` is mounted for this process (the CDI generator in a pod: `/host`):
    /// removed from the front of every host path written into a spec, so the specs name paths
    /// as the node's runtime sees them. The `--ldcache-hook` path (a node path) is checked for
    /// under it, and left out while it does not exist there.
    #[arg(long)]
    pub host_mount: Option<PathBuf>,
    /// Keep running: discover and generate again every SECONDS, rewrite a spec only when it
    /// changed (a device appeared or went, a driver upgrade), remove the spec of a kind that is
    /// gone, and remove every spec this process wrote on SIGTERM or SIGINT. Needs a directory
    /// as `--output`.
    #[arg(long, value_name = "SECONDS")]
    pub watch: Option<u64>,
    /// With `--output DIR`: also remove the spec file of every profile's kind that has no
    /// devices now (its driver removed, its last device gone), as `generate` would have named
    /// it (`<vendor>-<class>.json` or `.yaml`) and only when the file's `kind` is that kind.
    /// What a one-shot refresh needs (the OS package's actk-cdi-refresh.service); `--watch`
    /// always removes what it wrote.
    #[arg(long)]
    pub prune: bool,
    /// With `--watch`: who writes these specs (the Helm chart passes its release name). The
    /// files are named `<OWNER>.<vendor>-<class>.json`, and a kind that another file in the
    /// directory defines already (another release, another tool) is not written while that file
    /// is there: two specs of one kind in one directory make its devices unresolvable, and one
    /// installation's removal must not take the other's spec.
    #[arg(long, requires = "watch", value_parser = owner_name)]
    pub owner: Option<String>,
}

/// Arguments of `actk cdi clean`.
#[derive(clap::Args, Debug)]
pub struct CleanArgs {
    /// The directory `generate --output` wrote to.
    #[arg(long, short, default_value = "/var/run/cdi")]
    pub output: PathBuf,
    /// Directory of user vendor profiles (`*.toml`) whose kinds count too; default:
    /// `profiles_dir` of the config file, else /etc/actk/profiles.d.
    #[arg(long, env = "ACTK_PROFILES_DIR")]
    pub profiles_dir: Option<PathBuf>,
}

/// `--owner`: a name that can be part of a file name.
fn owner_name(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
        && !s.starts_with('-');
    if ok { Ok(s.to_string()) } else { Err(format!("{s:?}: letters, digits, - and _ (a Helm release name)")) }
}

/// Arguments of `actk cdi list`.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Spec directory, repeatable, in priority order (later wins); default: `spec_dirs` of the
    /// config file, else /etc/cdi and /var/run/cdi.
    #[arg(long = "spec-dir")]
    pub spec_dirs: Vec<PathBuf>,
}

/// Arguments of `actk cdi validate`.
#[derive(clap::Args, Debug)]
pub struct ValidateArgs {
    /// Spec files (`.json` or `.yaml`).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Runs an `actk cdi` subcommand.
pub fn run(c: Command) -> anyhow::Result<()> {
    match c {
        Command::Generate(a) => generate(*a),
        Command::List(a) => list(a),
        Command::Validate(a) => validate(a),
        Command::Clean(a) => clean(a),
    }
}

/// Where `--output` points: a single file or a directory.
enum Output {
    Stdout,
    File(PathBuf),
    Dir(PathBuf),
}

fn output_kind(path: Option<&Path>) -> Output {
    match path {
        None => Output::Stdout,
        Some(p) if p.is_dir() => Output::Dir(p.to_path_buf()),
        Some(p) if Format::from_path(p).is_some() => Output::File(p.to_path_buf()),
        Some(p) => Output::Dir(p.to_path_buf()),
    }
}

/// The ld.so.cache hook for generated specs: `--ldcache-hook` (`none` = no hook), else the
/// config's `hook_path`, else `actk-hook` next to this executable; `None` when none exists.
/// With `host_mount`, a given path is a node path that must exist under it.
fn ldcache_hook(arg: Option<&str>, host_mount: Option<&Path>) -> anyhow::Result<Option<String>> {
    match arg {
        Some("none") => return Ok(None),
        Some(p) if !p.starts_with('/') => {
            bail!("--ldcache-hook {p}: must be an absolute path (engines run hooks by path) or `none`")
        }
        Some(p) => {
            if let Some(m) = host_mount
                && !m.join(p.trim_start_matches('/')).is_file()
            {
                // Once per process: `--watch` asks again at every pass.
                static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        "ld.so.cache hook {p} is not on the node yet; specs are written without it until it is"
                    );
                }
                return Ok(None);
            }
            return Ok(Some(p.to_string()));
        }
        None => {}
    }
    let candidate = match config()?.hook_path {
        Some(p) => p,
        None => match std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join("actk-hook"))) {
            Some(p) => p,
            None => return Ok(None),
        },
    };
    let executable = std::fs::metadata(&candidate)
        .is_ok_and(|m| m.is_file() && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0);
    Ok(if executable && candidate.is_absolute() { candidate.to_str().map(str::to_string) } else { None })
}

fn config() -> anyhow::Result<Config> {
    let path = Config::path();
    Config::load_default().with_context(|| format!("loading the actk config file {}", path.display()))
}

/// One discovery and generation pass: the specs of the host as the options ask (devices under
/// `root`, driver files under `--driver-root`, default `root`).
fn discover_and_generate(
    a: &GenerateArgs,
    root: &Path,
    profiles: &[actk_core::profile::Profile],
) -> anyhow::Result<(Vec<actk_core::cdi::Spec>, Vec<String>)> {
    let driver_root = a.driver_root.clone().unwrap_or_else(|| root.to_path_buf());
    let mut inventory = actk_core::discover::discover_roots(root, &driver_root, profiles);
    if let Some(m) = &a.host_mount {
        inventory.strip_host_mount(m);
    }
    let opts = GenerateOptions {
        device_name_strategy: match a.device_name_strategy {
            StrategyArg::Index => DeviceNameStrategy::Index,
            StrategyArg::Uuid => DeviceNameStrategy::Uuid,
            StrategyArg::Both => DeviceNameStrategy::Both,
        },
        capabilities: a.capabilities.clone(),
        ldcache_hook: ldcache_hook(a.ldcache_hook.as_deref(), a.host_mount.as_deref())?,
        additional_gids: a.additional_gids,
    };
    let specs = generate_all(profiles, &inventory, a.vendor.as_deref(), &opts)?;
    for spec in &specs {
        if let Err(errors) = validate_spec(spec) {
            let msgs: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            bail!("generated spec for {} is invalid (a defect in actk): {}", spec.kind, msgs.join("; "));
        }
    }
    let found = inventory.vendors.iter().map(|v| v.kind.clone()).collect();
    // Once per distinct set: `--watch` asks every few seconds and a node that stays broken
    // must not fill the log.
    static LAST: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let warnings: Vec<String> = inventory.warnings.iter().map(|w| w.to_string()).collect();
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if *last != warnings {
        for w in &warnings {
            tracing::warn!("{w}");
        }
        *last = warnings;
    }
    Ok((specs, found))
}

fn generate(mut a: GenerateArgs) -> anyhow::Result<()> {
    if a.root.is_none() || a.profiles_dir.is_none() || a.driver_root.is_none() {
        let c = config()?;
        if a.root.is_none() && a.driver_root.is_none() {
            a.driver_root = c.driver_root.clone();
        }
        a.root.get_or_insert(c.root);
        a.profiles_dir.get_or_insert(c.profiles_dir);
    }
    let root = a.root.clone().unwrap_or_else(|| PathBuf::from("/"));
    if !root.is_dir() {
        bail!(
            "host root {} does not exist or is not a directory (--root / ACTK_ROOT / root in the config file)",
            root.display()
        );
    }
    let profiles = actk_core::profile::load(a.profiles_dir.as_deref()).context("loading vendor profiles")?;
    if let Some(secs) = a.watch {
        return watch(&a, &root, &profiles, secs);
    }
    let (specs, found) = discover_and_generate(&a, &root, &profiles)?;
    if a.prune {
        match output_kind(a.output.as_deref()) {
            Output::Dir(dir) => {
                let kept: Vec<&str> = specs.iter().map(|s| s.kind.as_str()).collect();
                for (path, kind) in generated_files(&dir, &profiles) {
                    if !kept.contains(&kind.as_str()) {
                        std::fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
                        outln!("removed {} ({kind}: no devices now)", path.display())?;
                    }
                }
            }
            _ => bail!("--prune needs --output DIR (the directory whose stale specs it removes)"),
        }
    }
    if specs.is_empty() {
        match &a.vendor {
            Some(v) => bail!(
                "no devices of vendor {v:?} under {} (found: {}); --vendor takes a profile name such as nvidia or a kind such as nvidia.com/gpu",
                root.display(),
                if found.is_empty() { "none".to_string() } else { found.join(", ") }
            ),
            None => {
                eprintln!("actk: no accelerator devices found under {}; no CDI spec generated", root.display());
                return Ok(());
            }
        }
    }
    let output = output_kind(a.output.as_deref());
    let format = match (a.format, &output) {
        (Some(FormatArg::Json), _) => Format::Json,
        (Some(FormatArg::Yaml), _) => Format::Yaml,
        (None, Output::File(p)) => Format::from_path(p).unwrap_or(Format::Json),
        (None, _) => Format::Json,
    };
    match output {
        Output::Stdout => {
            for (i, spec) in specs.iter().enumerate() {
                if format == Format::Yaml && i > 0 {
                    outln!("---")?;
                }
                out!("{}", to_text(spec, format)?)?;
            }
        }
        Output::File(path) => {
            if specs.len() > 1 {
                let kinds: Vec<&str> = specs.iter().map(|s| s.kind.as_str()).collect();
                bail!(
                    "{} kinds were found ({}), but --output {} is one file; give a directory to --output (one file per kind) or choose one with --vendor",
                    specs.len(),
                    kinds.join(", "),
                    path.display()
                );
            }
            write_spec(&specs[0], &path, format)?;
            outln!(
                "wrote {} ({}, {} devices, cdiVersion {})",
                path.display(),
                specs[0].kind,
                specs[0].devices.len(),
                specs[0].cdi_version
            )?;
        }
        Output::Dir(dir) => {
            for spec in &specs {
                let path = write_spec_in_dir(spec, &dir, format)?;
                outln!(
                    "wrote {} ({}, {} devices, cdiVersion {})",
                    path.display(),
                    spec.kind,
                    spec.devices.len(),
                    spec.cdi_version
                )?;
            }
        }
    }
    Ok(())
}

/// `--watch`: generate every `secs` seconds into the `--output` directory until SIGTERM/SIGINT,
/// writing a file only when its text changed; then remove what was written.
fn watch(a: &GenerateArgs, root: &Path, profiles: &[actk_core::profile::Profile], secs: u64) -> anyhow::Result<()> {
    let dir = match output_kind(a.output.as_deref()) {
        Output::Dir(d) => d,
        _ => bail!("--watch needs --output DIR (a directory: one spec file per kind)"),
    };
    if secs == 0 {
        bail!("--watch {secs}: give the interval in seconds, at least 1");
    }
    let format = match a.format {
        Some(FormatArg::Yaml) => Format::Yaml,
        _ => Format::Json,
    };
    let stop = super::Stop::install()?;
    // The files this process wrote, with the inode it wrote (writes are atomic renames, so a
    // file another generator wrote since has another inode). During a rolling update the old
    // generator stops after the new one started: it must not remove the new one's spec, nor
    // write it back while the new one keeps it (a file with this text is left as it is).
    let mut written: std::collections::BTreeMap<PathBuf, u64> = Default::default();
    let inode = |p: &Path| std::fs::metadata(p).ok().map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    let remove_own = |p: &Path, ino: u64| inode(p) == Some(ino) && std::fs::remove_file(p).is_ok();
    let mut first = true;
    let mut last_error = String::new();
    let mut yielded: std::collections::BTreeMap<String, PathBuf> = Default::default();
    let mut taken_over: std::collections::BTreeSet<PathBuf> = Default::default();
    println!("watching {} every {secs} s; specs go to {}", root.display(), dir.display());
    loop {
        match discover_and_generate(a, root, profiles) {
            Ok((specs, _)) => {
                last_error.clear();
                let mut now = std::collections::BTreeMap::new();
                // Who else defines each kind in the directory (other file names).
                let others = other_specs(&dir);
                for spec in &specs {
                    let name = actk_core::cdi::write::default_file_name(spec, format);
                    let path = match &a.owner {
                        Some(o) => dir.join(format!("{o}.{name}")),
                        None => dir.join(name),
                    };
                    if let Some(other) = others.iter().find(|(k, p)| *k == spec.kind && *p != path).map(|(_, p)| p) {
                        // Another file has the kind: it was first, unless it is this process's
                        // own (then both appeared at once and the smaller path keeps it).
                        let ours = written.get(&path).is_some_and(|i| inode(&path) == Some(*i));
                        if !ours || other < &path {
                            if ours && remove_own(&path, written[&path]) {
                                println!("removed {} ({} defines {} too)", path.display(), other.display(), spec.kind);
                            }
                            if yielded.get(&spec.kind) != Some(other) {
                                eprintln!(
                                    "actk: cdi generate: {} defines {} already (another installation or tool): {} is not \
                                     written while it is there",
                                    other.display(),
                                    spec.kind,
                                    path.display()
                                );
                                yielded.insert(spec.kind.clone(), other.clone());
                            }
                            continue;
                        }
                    }
                    yielded.remove(&spec.kind);
                    // A file this process wrote that has another inode now was written since by
                    // another generator: in a rolling update, the new pod's. It is that one's: not
                    // written back here (with this process's older view of the node, another root
                    // or config), nor removed at exit. Before, the old generator rewrote it on its
                    // next pass and removed it when it stopped, and the node had no spec until the
                    // new one's next pass (a cluster test's pod failed Allocate in that gap).
                    // It stays that one's while it exists; once gone, this process writes again.
                    let current = inode(&path);
                    let theirs = current.is_some()
                        && (taken_over.contains(&path)
                            || (!first && written.get(&path).is_some_and(|i| current != Some(*i))));
                    if theirs {
                        if taken_over.insert(path.clone()) {
                            println!("{} was written by another generator since: left to it", path.display());
                        }
                        continue;
                    }
                    taken_over.remove(&path);
                    let text = to_file_text(spec, format)?;
                    // The first pass always writes, so the file is this process's own even when
                    // a previous generator left the same content.
                    if first || std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                        write_spec(spec, &path, format)?;
                        println!(
                            "wrote {} ({}, {} devices, cdiVersion {})",
                            path.display(),
                            spec.kind,
                            spec.devices.len(),
                            spec.cdi_version
                        );
                        if let Some(i) = inode(&path) {
                            now.insert(path, i);
                        }
                    } else if let Some(i) = written.get(&path).filter(|i| inode(&path) == Some(**i)) {
                        now.insert(path, *i);
                    }
                }
                for (gone, ino) in &written {
                    if !now.contains_key(gone) && remove_own(gone, *ino) {
                        println!("removed {} (its devices are gone)", gone.display());
                    }
                }
                written = now;
                first = false;
            }
            Err(e) => {
                // Logged once per distinct error: a driver half-way through an upgrade must not
                // flood the log, nor stop the refresh.
                let msg = format!("{e:#}");
                if msg != last_error {
                    eprintln!("actk: cdi generate: {msg}; trying again every {secs} s");
                    last_error = msg;
                }
            }
        }
        if stop.wait(std::time::Duration::from_secs(secs)) {
            break;
        }
    }
    for (p, ino) in &written {
        if remove_own(p, *ino) {
            println!("removed {}", p.display());
        } else {
            println!("left {}: another generator wrote it since", p.display());
        }
    }
    Ok(())
}

/// The spec files in `dir` that `generate --output DIR` writes for one of `profiles`' kinds:
/// `(path, kind)` for each default file name (JSON and YAML) that exists and whose `kind` is the
/// profile's. A file of that name that is not a readable spec of that kind is someone else's:
/// left out, with a warning.
fn generated_files(dir: &Path, profiles: &[actk_core::profile::Profile]) -> Vec<(PathBuf, String)> {
    let mut kinds: Vec<&str> = profiles.iter().map(|p| p.kind.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let mut found = Vec::new();
    for kind in kinds {
        for ext in ["json", "yaml"] {
            let path = dir.join(format!("{}.{ext}", kind.replace('/', "-")));
            if !path.exists() {
                continue;
            }
            match validate_file(&path) {
                Ok(spec) if spec.kind == kind => found.push((path, kind.to_string())),
                Ok(spec) => {
                    tracing::warn!("left {}: its kind is {}, not {kind}", path.display(), spec.kind)
                }
                Err(_) => tracing::warn!("left {}: not a valid CDI spec of {kind}", path.display()),
            }
        }
    }
    found
}

fn clean(a: CleanArgs) -> anyhow::Result<()> {
    let dir = match a.profiles_dir {
        Some(d) => d,
        None => config()?.profiles_dir,
    };
    let profiles = actk_core::profile::load(Some(&dir)).context("loading vendor profiles")?;
    for (path, kind) in generated_files(&a.output, &profiles) {
        std::fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
        outln!("removed {} ({kind})", path.display())?;
    }
    Ok(())
}

/// The kind of every valid spec file in `dir`, with its path (invalid ones are skipped, as the
/// runtime skips them).
fn other_specs(dir: &Path) -> Vec<(String, PathBuf)> {
    let reg = Registry::load(&[dir]);
    let mut out: Vec<(String, PathBuf)> = reg.specs().iter().map(|l| (l.spec.kind.clone(), l.path.clone())).collect();
    out.sort();
    out
}

fn list(a: ListArgs) -> anyhow::Result<()> {
    let dirs: Vec<PathBuf> = if a.spec_dirs.is_empty() { config()?.spec_dirs } else { a.spec_dirs };
    let registry = Registry::load(&dirs);
    for e in registry.errors() {
        eprintln!("actk: warning: skipped {}: {e}", e.path.display());
    }
    for name in registry.device_names() {
        outln!("{name}")?;
    }
    Ok(())
}

fn validate(a: ValidateArgs) -> anyhow::Result<()> {
    let mut bad = 0;
    for file in &a.files {
        match validate_file(file) {
            Ok(spec) => outln!(
                "{}: valid ({}, {} devices, cdiVersion {})",
                file.display(),
                spec.kind,
                spec.devices.len(),
                spec.cdi_version
            )?,
            Err(errors) => {
                bad += 1;
                for e in errors {
                    eprintln!("{e}");
                }
            }
        }
    }
    if bad > 0 {
        bail!("{bad} of {} CDI spec files are invalid", a.files.len());
    }
    Ok(())
}
