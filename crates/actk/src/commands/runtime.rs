//! `actk runtime configure`: registers actk-runtime with a container engine by editing the
//! engine's own configuration file, keeping every other key, value, comment and (for JSON) key
//! order. One module per engine (`runtime/docker.rs`, ...), each a pure text-to-text edit; this
//! file does the file handling common to all: a `.bak` copy of the original (made once), an
//! atomic write, `--dry-run`, and `--remove`.
//!
//! `--remove` undoes exactly what configure added: it removes the entry (and the default it set),
//! and when the result means the same as the `.bak` original, it writes the original's bytes
//! back, so even formatting is as before (field case F11). A file that did not exist before
//! configure (no `.bak`) is deleted again when nothing else was added to it.
//!
//! `--cdi` also turns on the engine's own CDI support (spec directories from `--cdi-spec-dirs`,
//! default the actk config's `spec_dirs`), so that `docker run --device nvidia.com/gpu=0` and the
//! CRI's CDI devices work with the specs `actk cdi generate` writes; `--cdi-only` does that
//! without registering actk-runtime. `--drop-in FILE` (containerd) puts actk's tables in a file
//! of their own that the main config imports.

mod containerd;
mod crio;
mod docker;
mod podman;

use anyhow::{Context, Result, bail};
use std::io::Write;
use std::path::{Path, PathBuf};

/// `actk runtime` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Register actk-runtime with a container engine (docker, containerd, crio, podman).
    Configure(ConfigureArgs),
}

/// The container engines `configure` knows.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// dockerd: /etc/docker/daemon.json `runtimes`.
    Docker,
    /// containerd's CRI plugin: /etc/containerd/config.toml, a runc-v2 runtime with `BinaryName`.
    Containerd,
    /// CRI-O: a drop-in /etc/crio/crio.conf.d/99-actk.conf.
    Crio,
    /// podman: /etc/containers/containers.conf `[engine.runtimes]`.
    Podman,
}

/// Arguments of `actk runtime configure`.
#[derive(clap::Args, Debug)]
pub struct ConfigureArgs {
    /// The engine to configure.
    #[arg(long, value_enum)]
    pub runtime: Engine,
    /// The engine's config file (default: the engine's standard path).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Runtime name to register (`--name nvidia` keeps `--runtime=nvidia` scripts working).
    #[arg(long, default_value = "actk")]
    pub name: String,
    /// Path of the actk-runtime binary (default: next to this actk, else found on PATH).
    #[arg(long)]
    pub path: Option<PathBuf>,
    /// Also make it the engine's default runtime.
    #[arg(long)]
    pub set_as_default: bool,
    /// Print the resulting file instead of writing it.
    #[arg(long)]
    pub dry_run: bool,
    /// Remove the registration instead (and the default, if configure set it); with `--cdi` or
    /// `--cdi-only` also put the CDI settings back as they were.
    #[arg(long)]
    pub remove: bool,
    /// Also turn on the engine's CDI support (docker: `features.cdi`; containerd: `enable_cdi`
    /// and `cdi_spec_dirs`). CRI-O and podman always read CDI specs.
    #[arg(long)]
    pub cdi: bool,
    /// Only turn on CDI; register no runtime.
    #[arg(long, conflicts_with_all = ["cdi", "set_as_default", "name"])]
    pub cdi_only: bool,
    /// CDI spec directories for the engine (default: the actk config's `spec_dirs`).
    #[arg(long, value_delimiter = ',')]
    pub cdi_spec_dirs: Vec<String>,
    /// containerd: write actk's settings to this drop-in file and add it to the main config's
    /// `imports` (default file when given without a value: /etc/containerd/conf.d/99-actk.toml).
    #[arg(long, num_args = 0..=1, default_missing_value = DEFAULT_DROP_IN)]
    pub drop_in: Option<PathBuf>,
}

/// containerd drop-in written by `--drop-in` without a value.
pub const DEFAULT_DROP_IN: &str = "/etc/containerd/conf.d/99-actk.toml";

/// What an engine module adds: a named runtime at a path, optionally as the default.
pub struct Entry<'a> {
    /// Runtime name (`actk`).
    pub name: &'a str,
    /// Absolute path of actk-runtime.
    pub path: &'a str,
    /// Make it the default runtime.
    pub set_as_default: bool,
}

/// Runs an `actk runtime` subcommand.
pub fn run(c: Command) -> Result<()> {
    match c {
        Command::Configure(a) => configure(&a),
    }
}

fn default_config(engine: Engine) -> &'static str {
    match engine {
        Engine::Docker => "/etc/docker/daemon.json",
        Engine::Containerd => "/etc/containerd/config.toml",
        Engine::Crio => "/etc/crio/crio.conf.d/99-actk.conf",
        Engine::Podman => "/etc/containers/containers.conf",
    }
}

fn reload_hint(engine: Engine) -> &'static str {
    match engine {
        Engine::Docker => "reload dockerd: kill -HUP $(pidof dockerd) (or systemctl reload docker)",
        Engine::Containerd => "restart containerd: systemctl restart containerd",
        Engine::Crio => "restart CRI-O: systemctl restart crio",
        Engine::Podman => "podman reads it on its next run",
    }
}

/// The actk-runtime to register: `--path`, else next to this executable, else on PATH.
fn runtime_path(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = given {
        if !p.is_absolute() {
            bail!(
                "--path {} must be absolute: engines start the runtime from their own working directory",
                p.display()
            );
        }
        return Ok(p.to_path_buf());
    }
    if let Some(sibling) = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join("actk-runtime")))
        && sibling.is_file()
    {
        return Ok(sibling);
    }
    let path = std::env::var("PATH").unwrap_or_default();
    for dir in path.split(':').filter(|d| d.starts_with('/')) {
        let p = Path::new(dir).join("actk-runtime");
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!(
        "actk-runtime not found next to {} nor on PATH={path}; give it with --path",
        std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default()
    )
}

fn backup_path(file: &Path) -> PathBuf {
    let mut s = file.as_os_str().to_owned();
    s.push(".bak");
    PathBuf::from(s)
}

/// Turns CDI on in a file's text with these spec directories.
type AddCdi = fn(&str, &[String]) -> Result<String>;
/// Puts the CDI settings back as the original (`.bak`) had them.
type RemoveCdi = fn(&str, Option<&str>) -> Result<String>;

/// The engine module's functions.
struct Ops {
    add: fn(&str, &Entry<'_>) -> Result<String>,
    remove: fn(&str, &str, Option<&str>) -> Result<String>,
    /// Turn CDI on with these spec dirs; `None`: the engine always reads CDI specs.
    add_cdi: Option<AddCdi>,
    remove_cdi: Option<RemoveCdi>,
    same: fn(&str, &str) -> bool,
    is_empty: fn(&str) -> bool,
}

fn ops(engine: Engine) -> Ops {
    match engine {
        Engine::Docker => Ops {
            add: docker::add,
            remove: docker::remove,
            add_cdi: Some(docker::add_cdi),
            remove_cdi: Some(docker::remove_cdi),
            same: docker::same,
            is_empty: docker::is_empty,
        },
        Engine::Containerd => Ops {
            add: containerd::add,
            remove: containerd::remove,
            add_cdi: Some(containerd::add_cdi),
            remove_cdi: Some(containerd::remove_cdi),
            same: toml_same,
            is_empty: toml_is_empty,
        },
        Engine::Crio => Ops {
            add: crio::add,
            remove: crio::remove,
            add_cdi: None,
            remove_cdi: None,
            same: toml_same,
            is_empty: toml_is_empty,
        },
        Engine::Podman => Ops {
            add: podman::add,
            remove: podman::remove,
            add_cdi: None,
            remove_cdi: None,
            same: toml_same,
            is_empty: toml_is_empty,
        },
    }
}

/// One file's read-modify-write: `edit(current text or "", the .bak original)` gives the new
/// text; `removing` applies the `--remove` rules of the module docs (original bytes back when
/// the meaning is the same; a file configure created is deleted when nothing is left in it).
/// Returns what was done, for the message. The directory is locked meanwhile.
fn edit_file(
    file: &Path,
    ops: &Ops,
    removing: bool,
    dry_run: bool,
    edit: &dyn Fn(&str, Option<&str>) -> Result<String>,
) -> Result<&'static str> {
    // Two configures at once (provisioning scripts) would each read the file, add their entry
    // and rename over the other's result: the read-modify-write holds a lock on the directory.
    let _lock = lock_dir(file)?;
    let current = match std::fs::read_to_string(file) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
    };
    let bak = backup_path(file);
    let original = std::fs::read_to_string(&bak).ok();
    if removing {
        let Some(current) = current else { return Ok("nothing to remove") };
        let edited = edit(&current, original.as_deref()).with_context(|| format!("in {}", file.display()))?;
        // Back to what the `.bak` holds (nothing else changed since configure, and no other
        // name registered by configure is left): the original bytes, formatting and all.
        let restored = original.as_ref().is_some_and(|o| (ops.same)(&edited, o));
        let result = match &original {
            Some(o) if restored => Some(o.clone()),
            Some(_) => Some(edited),
            None if (ops.is_empty)(&edited) => None,
            None => Some(edited),
        };
        if dry_run {
            out!("{}", result.as_deref().unwrap_or(""))?;
            return Ok("printed");
        }
        match result {
            Some(text) => write_atomic(file, &text)?,
            None => std::fs::remove_file(file).with_context(|| format!("cannot remove {}", file.display()))?,
        }
        if restored {
            let _ = std::fs::remove_file(&bak);
        }
        return Ok(if restored { "restored" } else { "edited" });
    }
    let edited = edit(current.as_deref().unwrap_or(""), original.as_deref())
        .with_context(|| format!("in {}", file.display()))?;
    if dry_run {
        out!("{edited}")?;
        return Ok("printed");
    }
    if current.as_deref() == Some(edited.as_str()) {
        return Ok("unchanged");
    }
    if let Some(cur) = &current
        && !bak.exists()
    {
        write_backup(file, &bak, cur)?;
    }
    write_atomic(file, &edited)?;
    Ok("edited")
}

/// The CDI spec directories to give the engine: `--cdi-spec-dirs`, else the actk config's.
fn cdi_dirs(given: &[String]) -> Result<Vec<String>> {
    if !given.is_empty() {
        if let Some(d) = given.iter().find(|d| !d.starts_with('/')) {
            bail!("--cdi-spec-dirs {d}: must be an absolute directory");
        }
        return Ok(given.to_vec());
    }
    let path = actk_core::config::Config::path();
    let config = actk_core::config::Config::load_default()
        .with_context(|| format!("loading the actk config file {} (for its spec_dirs)", path.display()))?;
    config
        .spec_dirs
        .iter()
        .map(|d| d.to_str().map(str::to_string).with_context(|| format!("spec dir {} is not UTF-8", d.display())))
        .collect()
}

fn configure(a: &ConfigureArgs) -> Result<()> {
    if a.name.is_empty() || !a.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        bail!("--name {:?}: use letters, digits, '-', '_' or '.'", a.name);
    }
    let main = a.config.clone().unwrap_or_else(|| PathBuf::from(default_config(a.runtime)));
    let ops = ops(a.runtime);
    let runtime = !a.cdi_only;
    let mut cdi = a.cdi || a.cdi_only;
    if cdi && ops.add_cdi.is_none() {
        eprintln!(
            "actk: {:?} reads CDI specs from /etc/cdi and /var/run/cdi without a setting: nothing to turn on",
            a.runtime
        );
        cdi = false;
        if !runtime {
            return Ok(());
        }
    }
    if a.drop_in.is_some() && a.runtime != Engine::Containerd {
        bail!("--drop-in is for containerd (docker has one daemon.json; CRI-O's file is a drop-in already)");
    }
    // The file actk's settings go to, and (with --drop-in) the main config that imports it.
    let (file, importer) = match &a.drop_in {
        Some(d) if d.is_absolute() => (d.clone(), Some(main.clone())),
        Some(d) => {
            bail!("--drop-in {}: must be absolute (containerd resolves imports from its own directory)", d.display())
        }
        None => (main.clone(), None),
    };
    let drop_in_s = file.to_str().with_context(|| format!("{} is not UTF-8", file.display()))?.to_string();
    // A drop-in uses the main config's table names.
    let version = importer.as_ref().map(|m| containerd::version_of(&std::fs::read_to_string(m).unwrap_or_default()));
    let start = |text: &str| match version {
        Some(v) if text.trim().is_empty() => format!("version = {v}\n"),
        _ => text.to_string(),
    };

    if a.remove {
        let done = edit_file(&file, &ops, true, a.dry_run, &|text, original| {
            let mut t = text.to_string();
            if runtime {
                t = (ops.remove)(&t, &a.name, original)?;
            }
            if let (true, Some(rm)) = (cdi, ops.remove_cdi) {
                t = rm(&t, original)?;
            }
            Ok(t)
        })?;
        if let Some(m) = &importer {
            // The import goes only when the drop-in itself is gone.
            if a.dry_run || !file.exists() {
                edit_file(m, &ops, true, a.dry_run, &|text, original| {
                    containerd::remove_import(text, &drop_in_s, original)
                })?;
            }
        }
        if done == "nothing to remove" {
            outln!("{} does not exist: nothing to remove", file.display())?;
        } else if !a.dry_run {
            let what = match (runtime, cdi) {
                (true, true) => format!("runtime {} and the CDI settings", a.name),
                (true, false) => format!("runtime {}", a.name),
                _ => "the CDI settings".to_string(),
            };
            outln!("removed {what} from {} ({done}); {}", file.display(), reload_hint(a.runtime))?;
        }
        return Ok(());
    }

    let path_s = if runtime {
        let path = runtime_path(a.path.as_deref())?;
        Some(path.to_str().with_context(|| format!("--path {} is not UTF-8", path.display()))?.to_string())
    } else {
        None
    };
    let dirs = if cdi { cdi_dirs(&a.cdi_spec_dirs)? } else { Vec::new() };
    edit_file(&file, &ops, false, a.dry_run, &|text, _| {
        let mut t = start(text);
        if let Some(p) = &path_s {
            t = (ops.add)(&t, &Entry { name: &a.name, path: p, set_as_default: a.set_as_default })?;
        }
        if let (true, Some(add)) = (cdi, ops.add_cdi) {
            t = add(&t, &dirs)?;
        }
        Ok(t)
    })?;
    if let Some(m) = &importer {
        edit_file(m, &ops, false, a.dry_run, &|text, _| containerd::add_import(text, &drop_in_s))?;
    }
    if a.dry_run {
        return Ok(());
    }
    let mut what = Vec::new();
    if let Some(p) = &path_s {
        what.push(format!(
            "registered runtime {} = {p}{}",
            a.name,
            if a.set_as_default { " (default runtime)" } else { "" }
        ));
    }
    if cdi {
        what.push(format!("turned on CDI (spec dirs {})", dirs.join(", ")));
    }
    let imported = importer.map(|m| format!(", imported by {}", m.display())).unwrap_or_default();
    outln!("{} in {}{imported}; {}", what.join(" and "), file.display(), reload_hint(a.runtime))?;
    Ok(())
}

/// An exclusive `flock(2)` on the directory of `file` (released when the handle drops), so that
/// concurrent configures of the same file run one after the other; `None` when the directory does
/// not exist yet (nothing to read, so nothing to lose).
fn lock_dir(file: &Path) -> Result<Option<std::fs::File>> {
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    match std::fs::File::open(dir) {
        Ok(f) => {
            f.lock().with_context(|| format!("cannot lock {}", dir.display()))?;
            Ok(Some(f))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot open {}", dir.display())),
    }
}

/// Writes `text` to `file` atomically (temporary file in the same directory, fsync, rename),
/// keeping the old file's mode and owner; creates the directory when missing (0755 under any
/// umask: engines reading it as another user, rootless podman, must be able to).
fn write_atomic(file: &Path, text: &str) -> Result<()> {
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    actk_core::cdi::write::create_dirs_0755(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let meta = std::fs::metadata(file).ok();
    replace_with(file, text, meta.as_ref())
}

/// Writes the backup `bak` of `file` (whose content is `text`) with the original's mode and
/// owner: an engine config of mode 0600 (it may hold registry credentials) must not gain a 0644
/// copy next to it. Atomic, so a reader never sees a half-written or wider-open backup.
fn write_backup(file: &Path, bak: &Path, text: &str) -> Result<()> {
    let meta = std::fs::metadata(file).with_context(|| format!("cannot stat {}", file.display()))?;
    replace_with(bak, text, Some(&meta)).with_context(|| format!("cannot write the backup {}", bak.display()))
}

/// Puts `text` at `target` through a temporary file in its directory, created 0600 and given
/// `like`'s mode and owner (0644 and the caller's when `None`) before it is renamed into place.
fn replace_with(target: &Path, text: &str, like: Option<&std::fs::Metadata>) -> Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = target.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    // tempfile creates the file 0600: it is never more open than the original while written.
    let mut tmp = tempfile::Builder::new()
        .prefix(".actk-")
        .tempfile_in(dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    tmp.write_all(text.as_bytes())
        .and_then(|_| tmp.as_file().sync_all())
        .with_context(|| format!("cannot write {}", tmp.path().display()))?;
    let mode = like.map(|m| m.mode() & 0o7777).unwrap_or(0o644);
    if let Some(m) = like
        && (m.uid() != rustix::process::geteuid().as_raw() || m.gid() != rustix::process::getegid().as_raw())
    {
        // Only root may give a file away; anyone else keeps owning what they write.
        std::os::unix::fs::fchown(tmp.as_file(), Some(m.uid()), Some(m.gid()))
            .with_context(|| format!("cannot give {} the owner of the original", tmp.path().display()))?;
    }
    // After chown, which clears set-id bits.
    tmp.as_file().set_permissions(std::fs::Permissions::from_mode(mode))?;
    tmp.persist(target).map_err(|e| e.error).with_context(|| format!("cannot replace {}", target.display()))?;
    Ok(())
}

/// Same meaning as TOML (comments and layout aside).
fn toml_same(a: &str, b: &str) -> bool {
    match (a.parse::<toml::Table>(), b.parse::<toml::Table>()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// No key at all (only comments, blank lines, or empty tables).
fn toml_is_empty(text: &str) -> bool {
    fn empty(t: &toml::Table) -> bool {
        t.values().all(|v| v.as_table().is_some_and(empty))
    }
    text.parse::<toml::Table>().is_ok_and(|t| empty(&t))
}

/// Shared TOML helpers for the engine modules (toml_edit keeps comments and layout).
pub(crate) mod tomlx {
    use anyhow::{Result, bail};
    use toml_edit::{DocumentMut, Item, Table};

    /// Parses `text` (empty: an empty document). Errors name line and column.
    pub fn parse(text: &str) -> Result<DocumentMut> {
        text.parse::<DocumentMut>().map_err(|e| anyhow::anyhow!("not valid TOML: {e}"))
    }

    /// The table at `path`, created as implicit (header-less) tables where missing.
    pub fn table_at<'a>(doc: &'a mut DocumentMut, path: &[&str]) -> Result<&'a mut Table> {
        let mut cur = doc.as_table_mut();
        for (i, k) in path.iter().enumerate() {
            let item = cur.entry(k).or_insert_with(|| {
                let mut t = Table::new();
                t.set_implicit(true);
                Item::Table(t)
            });
            if let Some(inline) = item.as_inline_table().cloned() {
                *item = Item::Table(inline.into_table());
            }
            match item.as_table_mut() {
                Some(t) => cur = t,
                None => bail!("{} is not a table", path[..=i].join(".")),
            }
        }
        Ok(cur)
    }

    /// Sets `key` to `item` in `t`, keeping the key's comments and position when it exists.
    pub fn set(t: &mut Table, key: &str, mut item: Item) {
        match t.get_mut(key) {
            Some(slot) => {
                // A value's trailing comment (`enable_cdi = false # off here`) is its decor.
                if let (Some(old), Some(new)) = (slot.as_value(), item.as_value_mut()) {
                    *new.decor_mut() = old.decor().clone();
                }
                *slot = item
            }
            None => {
                t.insert(key, item);
            }
        }
    }

    /// Sets `key` in the table at `path` back to the value the `original` file (the `.bak`) had
    /// there, or removes it when it had none (or there is no original).
    pub fn restore_key(doc: &mut DocumentMut, path: &[&str], key: &str, original: Option<&str>) {
        let prev = original
            .and_then(|o| parse(o).ok())
            .and_then(|mut o| get_table(&mut o, path).and_then(|t| t.get(key).cloned()));
        let Some(t) = get_table(doc, path) else { return };
        match prev {
            Some(p) => set(t, key, p),
            None => {
                t.remove(key);
            }
        }
    }

    /// Undoes `--set-as-default`: when `key` in the table at `path` names `name`, sets it back to
    /// the value the `original` file (the `.bak`) had there, or removes it when it had none.
    pub fn restore_default(doc: &mut DocumentMut, path: &[&str], key: &str, name: &str, original: Option<&str>) {
        let Some(t) = get_table(doc, path) else { return };
        if t.get(key).and_then(|v| v.as_str()) != Some(name) {
            return;
        }
        let prev = original.and_then(|o| parse(o).ok()).and_then(|mut o| {
            get_table(&mut o, path).and_then(|t| t.get(key).and_then(|v| v.as_str()).map(str::to_string))
        });
        match prev.filter(|p| p != name) {
            Some(p) => set(t, key, toml_edit::value(p)),
            None => {
                t.remove(key);
            }
        }
    }

    /// The table at `path` if it exists.
    pub fn get_table<'a>(doc: &'a mut DocumentMut, path: &[&str]) -> Option<&'a mut Table> {
        let mut cur = doc.as_table_mut();
        for k in path {
            cur = cur.get_mut(k)?.as_table_mut()?;
        }
        Some(cur)
    }

    /// Removes tables along `path` (deepest first) that have become empty, down to `keep` levels.
    pub fn prune(doc: &mut DocumentMut, path: &[&str], keep: usize) {
        for depth in (keep..path.len()).rev() {
            let (parent, last) = (&path[..depth], path[depth]);
            let Some(t) = get_table(doc, parent) else { continue };
            if t.get(last).and_then(Item::as_table).is_some_and(|c| c.is_empty()) {
                t.remove(last);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_meaning_and_emptiness() {
        assert!(toml_same("a = 1 # c\n[b]\nx = 2\n", "a=1\n\n[b]\n  x=2\n"));
        assert!(!toml_same("a = 1\n", "a = 2\n"));
        assert!(toml_is_empty("# only a comment\n[x]\n[x.y]\n"));
        assert!(!toml_is_empty("[x]\ny = 1\n"));
    }
}
