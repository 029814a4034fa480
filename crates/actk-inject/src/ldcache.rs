//! Adding the injected library directories to the container's `/etc/ld.so.cache`, written by
//! actk itself: no ldconfig runs, and no path of the container is ever resolved through the
//! host's view.
//!
//! Why not the host's `ldconfig -r <root>` (what this module did before): ldconfig resolves every
//! path it reads or writes (`/etc/ld.so.cache~`, `/var/cache/ldconfig/aux-cache`, `ld.so.conf`
//! and its `include`s, the library directories) by path string after a `chroot`, and the
//! container's tree has mounts that lead back to the host (its `/proc`, whose
//! `/proc/1/root` is the host's root before pivot_root): one symlink in an image let ldconfig
//! create or replace files in host directories, and racing swaps of `/etc` did the same (issue
//! 10, findings 2 and 3). It also ran a host binary as root on files the image chose, and judged
//! its owner through the user namespace of a createContainer hook (issue 13).
//!
//! What happens instead ([`update`]):
//! 1. Each directory to add is opened inside the container root ([`ContainerRoot`], openat2
//!    `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`: symlinks are clamped at the root, `/proc/PID/root`
//!    and other magic links are refused) and scanned as ldconfig scans a directory: `lib*.so*`
//!    and `ld-*.so*` files and symlinks, each read with a bounded ELF reader
//!    ([`actk_core::ldcache::elf`]) for its soname and flags; one entry per soname, the file's
//!    soname path as the entry (`<dir>/<soname>`), a real file preferred to a link.
//! 2. The container's existing cache, if any, is read through the same resolver and kept: the
//!    new entries come first among equals, as ldconfig puts command-line directories first, so
//!    the injected driver libraries win over copies in the image.
//! 3. The merged, sorted cache ([`actk_core::ldcache::write`]) is written to a new file in the
//!    container's `/etc` (created `O_EXCL | O_NOFOLLOW` relative to the resolved directory fd,
//!    mode 0644) and renamed over `ld.so.cache` within that same directory fd. A symlink the image
//!    or a racing process puts at `/etc/ld.so.cache` is replaced, not followed; a swap of `/etc`
//!    after it was resolved changes which directory inside the root gets the file, never which
//!    root.
//!
//! Only regular files of the image are read, and only after their type was checked on an
//! `O_PATH` descriptor ([`ContainerRoot::open_regular`]): a `lib*.so*` or cache file that is a
//! device node, FIFO or socket is skipped with a note, never opened. The work is bounded per run
//! ([`Budget`]: entries looked at, bytes read, CPU and time; the ELF reader's own per-file
//! limit; the cache reader's [`ldcache::Limits`]): a spent bound stops the scan with a note
//! naming the directory, and the cache is written with what was found (issue 29).
//!
//! Nothing else is read or written: no `aux-cache`, no soname links (ldconfig's `-X`), no
//! `ld.so.conf` parsing. The library directories are also listed in a drop-in
//! `/etc/ld.so.conf.d/00-actk.conf`, so an `ldconfig` the container runs later keeps them; when
//! the image makes that path unwritable (a dangling or magic symlink), the cache is still written
//! and the drop-in skipped with a note. An image with neither `/etc/ld.so.conf` nor
//! `/etc/ld.so.cache` has no glibc loader configuration (busybox, musl): nothing is written.
//!
//! Not indexed (the loader still finds such libraries by its own search path): the
//! `glibc-hwcaps` subdirectories of the added directories (existing `glibc-hwcaps` entries of
//! the image's cache are kept). The image's other directories are not re-scanned either: its
//! cache stays as the image built it (an image that installed libraries without running
//! ldconfig keeps that mistake, as it has without actk), where `ldconfig -r` rebuilt it all.

use crate::budget::{Budget, Notes};
use crate::error::{InjectError, Result};
use crate::root::ContainerRoot;
use actk_core::ldcache::{self, Entry, EntryRef, elf, write};
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use std::collections::{HashMap, HashSet};
use std::io::Read;

/// Path of the drop-in written into the container.
pub const DROP_IN: &str = "/etc/ld.so.conf.d/00-actk.conf";

/// The cache file.
pub const CACHE: &str = "/etc/ld.so.cache";

/// Entries added, at most.
const MAX_NEW_ENTRIES: usize = 65_536;
/// Largest existing cache read (a full distribution's cache is a few hundred KB).
const MAX_CACHE_BYTES: u64 = 16 << 20;

/// The generator string recorded in the cache's extension (`ldconfig -p` prints it).
const GENERATOR: &str = concat!("actk ", env!("CARGO_PKG_VERSION"), " (update-ldcache)");

/// What [`update`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LdcacheOutcome {
    /// The image has no glibc loader configuration (`/etc/ld.so.conf`, `/etc/ld.so.cache`).
    NoLoaderConfig,
    /// No library directories to add.
    NothingToDo,
    /// The cache was written; notes about what was skipped (one per line), if any.
    Updated(String),
    /// The container's `/etc` cannot be written (a read-only mount at /etc: a ConfigMap or
    /// read-only volume, a read-only file system): the cache was left as it is, with why. The
    /// libraries are still mounted; only lookups through the cache (`dlopen("libcuda.so.1")`)
    /// miss them. Not an error, so the container starts as it would without actk (NVIDIA's
    /// toolkit skips the update the same way); callers warn.
    NotWritten(String),
}

impl LdcacheOutcome {
    /// The warning a caller shows for [`LdcacheOutcome::NotWritten`] (`None` otherwise): why,
    /// and what the container loses.
    pub fn warning(&self, dirs: &[String]) -> Option<String> {
        match self {
            LdcacheOutcome::NotWritten(why) => Some(format!(
                "the container's {CACHE} was not updated ({why}); the driver libraries are mounted in {} but the loader's cache does not list them: a program that loads them by name needs LD_LIBRARY_PATH={}",
                dirs.join(", "),
                dirs.join(":")
            )),
            _ => None,
        }
    }
}

/// Adds the library directories `dirs` (container paths) to the container's ld.so.cache; see
/// the module docs. The work on the image's files is bounded by a default [`Budget`].
///
/// Errors: [`InjectError::Refused`] / [`InjectError::Container`] naming the path when the
/// container's `/etc` cannot be resolved inside the root (a symlink out of it through a magic
/// link, a dangling one) or the cache cannot be written there; nothing outside the root is read
/// or written either way.
pub fn update(root: &ContainerRoot, dirs: &[String]) -> Result<LdcacheOutcome> {
    update_within(root, dirs, &mut Budget::default())
}

/// [`update`] within `budget`: when a bound is spent, the directories (or the part of one) not
/// yet scanned are left out of the cache, with a note naming them and the bound.
pub fn update_within(root: &ContainerRoot, dirs: &[String], budget: &mut Budget) -> Result<LdcacheOutcome> {
    if dirs.is_empty() {
        return Ok(LdcacheOutcome::NothingToDo);
    }
    if !root.exists("/etc/ld.so.conf") && !root.exists(CACHE) {
        return Ok(LdcacheOutcome::NoLoaderConfig);
    }
    let mut notes = Notes::default();
    // CUDA forward-compat directories (crate::compat) go first: the first entry added for a
    // soname wins the lookup, and the image's newer libcuda.so.1 must win.
    let compat = crate::compat::compat_dirs_within(root, budget, &mut notes);
    let dirs: Vec<String> = compat.iter().chain(dirs.iter().filter(|d| !compat.contains(d))).cloned().collect();
    let dirs = dirs.as_slice();
    let mut added = Vec::new();
    let mut seen_dirs = HashSet::new();
    for d in dirs {
        if let Some(spent) = budget.spent() {
            notes.push(format!("{d}: not indexed: {spent}"));
            continue;
        }
        scan_dir(root, d, &mut seen_dirs, &mut added, &mut notes, budget);
    }
    let bytes = read_cache(root, &mut notes);
    let existing = if bytes.is_empty() {
        Vec::new()
    } else {
        // Borrowed and bounded (issue 29, finding 2): an image's cache costs its size plus the
        // reader's limits, however its entries point into its strings.
        ldcache::parse_borrowed(&bytes, &ldcache::Limits::default()).unwrap_or_else(|e| {
            notes.push(format!("{CACHE}: {e}; its entries are not kept, replaced"));
            Vec::new()
        })
    };
    let new_keys: HashSet<(&str, &str, i32)> =
        added.iter().map(|e| (e.key.as_str(), e.path.as_str(), e.flags)).collect();
    let mut all: Vec<EntryRef<'_>> = added.iter().map(Entry::borrowed).collect();
    all.extend(existing.into_iter().filter(|e| e.hwcaps.is_some() || !new_keys.contains(&(e.key, e.path, e.flags))));
    write::sort(&mut all);
    match write_cache(root, &write::encode(&all, GENERATOR)) {
        Ok(()) => {}
        // The file system said no (EROFS, EACCES, EPERM, ENOSPC): skip, not fail. A resolution
        // the image made unsafe (InjectError::Refused) stays an error.
        Err(InjectError::Container { source, .. }) => return Ok(LdcacheOutcome::NotWritten(source.to_string())),
        Err(e) => return Err(e),
    }

    let mut body = String::from("# Written by actk: driver library directories mounted from the host.\n");
    for d in dirs {
        body.push_str(d);
        body.push('\n');
    }
    if let Err(e) = root.write_file(DROP_IN, body.as_bytes(), 0o644) {
        notes.push(format!("{DROP_IN} not written: {e}"));
    }
    Ok(LdcacheOutcome::Updated(notes.finish()))
}

/// One library of a directory while it is scanned (ldconfig's `dlib_entry`).
struct Dlib {
    name: String,
    soname: String,
    flags: i32,
    is_link: bool,
    osversion: u32,
}

/// Scans directory `dir` of the container (see the module docs) and appends its entries, within
/// `budget` (a spent bound stops the scan with a note naming `dir`).
fn scan_dir(
    root: &ContainerRoot,
    dir: &str,
    seen_dirs: &mut HashSet<(u64, u64)>,
    out: &mut Vec<Entry>,
    notes: &mut Notes,
    budget: &mut Budget,
) {
    let dir = dir.trim_end_matches('/');
    let fd = match root.open_in(if dir.is_empty() { "/" } else { dir }, OFlags::RDONLY | OFlags::DIRECTORY) {
        Ok(fd) => fd,
        Err(e) => {
            notes.push(format!("{dir}: not indexed: {e}"));
            return;
        }
    };
    // The same directory twice (merged /usr: /lib/x86_64-linux-gnu and /usr/lib/...): once, as ldconfig.
    match rustix::fs::fstat(&fd) {
        Ok(st) if !seen_dirs.insert((st.st_dev, st.st_ino)) => return,
        Ok(_) => {}
        Err(e) => {
            notes.push(format!("{dir}: not indexed: {e}"));
            return;
        }
    }
    let mut entries = match rustix::fs::Dir::read_from(&fd) {
        Ok(d) => d,
        Err(e) => {
            notes.push(format!("{dir}: not indexed: {e}"));
            return;
        }
    };
    let mut dlibs: Vec<Dlib> = Vec::new();
    let mut by_soname: HashMap<String, usize> = HashMap::new();
    while let Some(ent) = entries.read() {
        let Ok(ent) = ent else { break };
        if let Err(spent) = budget.entry() {
            notes.push(format!("{dir}: {spent}; the rest of it is not indexed"));
            break;
        }
        let Ok(name) = ent.file_name().to_str().map(str::to_string) else { continue };
        if !is_dso(&name) {
            continue;
        }
        if is_special(ent.file_type()) {
            let e = InjectError::NotRegular {
                path: format!("{dir}/{name}"),
                root: root.shown().to_path_buf(),
                file_type: ent.file_type(),
            };
            notes.push(format!("{e}; skipped"));
            continue;
        }
        if !matches!(ent.file_type(), FileType::Unknown | FileType::Symlink | FileType::RegularFile) {
            continue;
        }
        if name.ends_with(".#prelink#") || name.contains(".#prelink#.") {
            continue;
        }
        let Some((file, len, is_link)) = open_library(root, &fd, dir, &name, notes) else { continue };
        // Each library within what is left of the bytes, and at most elf::MAX_FILE_BYTES.
        let left = budget.bytes_left();
        let (info, used) = elf::library_info_within(&file, len, left.min(elf::MAX_FILE_BYTES));
        if matches!(info, Err(elf::ElfError::Limit)) && left < elf::MAX_FILE_BYTES {
            budget.exhaust_bytes();
        }
        if let Err(spent) = budget.read(used) {
            notes.push(format!("{dir}: {spent}; {name} and the rest of it are not indexed"));
            break;
        }
        let Ok(info) = info else { continue };
        let mut soname = info.soname.unwrap_or_else(|| name.clone());
        // ldconfig: a link is a link only when it is the soname link or the `.so` link for ld(1);
        // any other link is taken for a library file of its own.
        let mut is_link = is_link;
        if is_link
            && name != soname
            && !(name.len() >= 3 && name.ends_with(".so") && soname.as_bytes().starts_with(name.as_bytes()))
        {
            is_link = false;
        }
        if is_link {
            soname = name.clone();
        }
        match by_soname.get(&soname) {
            Some(&i) => {
                let d = &mut dlibs[i];
                if (!is_link && d.is_link)
                    || (is_link == d.is_link && write::libcmp(&d.name, &name) == std::cmp::Ordering::Less)
                {
                    const ELF: i32 = 1;
                    let libc = |f: i32| f == 2 || f == 3;
                    if d.flags != info.flags
                        && ((d.flags == ELF && libc(info.flags)) || (libc(d.flags) && info.flags == ELF))
                    {
                        d.flags = info.flags;
                    }
                    d.name = name;
                    d.is_link = is_link;
                    d.osversion = info.osversion;
                }
            }
            None => {
                by_soname.insert(soname.clone(), dlibs.len());
                dlibs.push(Dlib { name, soname, flags: info.flags, is_link, osversion: info.osversion });
            }
        }
    }
    // ldconfig adds a directory's libraries newest-seen first.
    for d in dlibs.into_iter().rev() {
        if out.len() >= MAX_NEW_ENTRIES {
            notes.push(format!("more than {MAX_NEW_ENTRIES} libraries; the rest not indexed"));
            return;
        }
        out.push(Entry {
            path: format!("{dir}/{}", d.soname),
            key: d.soname,
            flags: d.flags,
            osversion: d.osversion,
            hwcap: 0,
            hwcaps: None,
        });
    }
}

/// `lib*.so*` or `ld-*.so*` (glibc `_dl_is_dso`).
fn is_dso(name: &str) -> bool {
    (name.starts_with("lib") || name.starts_with("ld-")) && name.contains(".so")
}

/// Opens entry `name` of directory `dirfd` (container path `dir`) for reading when it is a
/// regular file, or a symlink to one (resolved inside the root), and only then
/// ([`ContainerRoot::open_regular_at`], [`ContainerRoot::open_regular`]: nothing else is ever
/// opened, issue 29 finding 4). Returns the file, its length and whether `name` is a link.
/// `None` for anything else (a device node, FIFO or socket with a note), a dangling link, or a
/// link out through a magic link.
fn open_library(
    root: &ContainerRoot,
    dirfd: &OwnedFd,
    dir: &str,
    name: &str,
    notes: &mut Notes,
) -> Option<(std::fs::File, u64, bool)> {
    let shown = format!("{dir}/{name}");
    let st = rustix::fs::statat(dirfd, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
    let is_link = FileType::from_raw_mode(st.st_mode) == FileType::Symlink;
    let opened =
        if is_link { root.open_regular(&shown, true) } else { root.open_regular_at(dirfd.as_fd(), name, &shown) };
    match opened {
        Ok((file, len)) => Some((file, len, is_link)),
        Err(e @ InjectError::NotRegular { file_type, .. }) if is_special(file_type) => {
            notes.push(format!("{e}; skipped"));
            None
        }
        Err(_) => None,
    }
}

/// A device node, FIFO or socket: what an image has no business shipping as a library, cache
/// or drop-in, and what actk therefore warns about (directories are skipped silently, as
/// ldconfig skips them).
pub(crate) fn is_special(ft: FileType) -> bool {
    matches!(ft, FileType::CharacterDevice | FileType::BlockDevice | FileType::Fifo | FileType::Socket)
}

/// The bytes of the container's current cache: empty when there is none, or when it is not a
/// regular file of at most [`MAX_CACHE_BYTES`] (with a note; it is never opened then) or
/// cannot be read.
fn read_cache(root: &ContainerRoot, notes: &mut Notes) -> Vec<u8> {
    let (file, len) = match root.open_regular(CACHE, true) {
        Ok(f) => f,
        Err(InjectError::Container { source, .. }) if source.raw_os_error() == Some(libc::ENOENT) => return Vec::new(),
        Err(e) => {
            notes.push(format!("{CACHE}: not read, replaced: {e}"));
            return Vec::new();
        }
    };
    if len > MAX_CACHE_BYTES {
        notes.push(format!("{CACHE}: {len} bytes, more than the {MAX_CACHE_BYTES} read; replaced"));
        return Vec::new();
    }
    let mut bytes = Vec::with_capacity(len as usize);
    if let Err(e) = file.take(MAX_CACHE_BYTES).read_to_end(&mut bytes) {
        notes.push(format!("{CACHE}: not read, replaced: {e}"));
        return Vec::new();
    }
    bytes
}

/// Writes `bytes` as the container's cache: a new file next to it, renamed over it, both through
/// the one resolved `/etc` directory fd (see the module docs).
fn write_cache(root: &ContainerRoot, bytes: &[u8]) -> Result<()> {
    let (etc, name) = root.parent_of(CACHE)?;
    let cerr = |op: &'static str, e: Errno| InjectError::Container {
        op,
        path: CACHE.into(),
        root: root.shown().to_path_buf(),
        source: e.into(),
    };
    for attempt in 0..16u32 {
        let tmp = format!(".ld.so.cache.actk-{}-{attempt}", std::process::id());
        let fd = match rustix::fs::openat(
            &etc,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        ) {
            Ok(fd) => fd,
            // Something (the image, a racing process) holds the name: take another.
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(cerr("create a temporary file for", e)),
        };
        let written = (|| {
            let mut off = 0;
            while off < bytes.len() {
                off += rustix::io::write(&fd, &bytes[off..])?;
            }
            // The umask must not make the cache unreadable for the container's users.
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o644))
        })();
        drop(fd);
        let done = written.and_then(|()| rustix::fs::renameat(&etc, tmp.as_str(), &etc, name));
        if let Err(e) = done {
            let _ = rustix::fs::unlinkat(&etc, tmp.as_str(), AtFlags::empty());
            return Err(cerr("write", e));
        }
        return Ok(());
    }
    Err(InjectError::Refused {
        path: CACHE.into(),
        root: root.shown().to_path_buf(),
        reason: "no temporary file name next to it could be created (a racing process in the container?)".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_without_loader_config_is_left_alone() {
        let base = tempfile::tempdir().unwrap();
        let root = ContainerRoot::open(base.path()).unwrap();
        assert_eq!(update(&root, &["/usr/lib".into()]).unwrap(), LdcacheOutcome::NoLoaderConfig);
        assert!(std::fs::read_dir(base.path()).unwrap().next().is_none());
    }

    use std::os::unix::fs::symlink;
    use std::path::Path;
    use std::process::Command;

    /// A shared library built by gcc at `path` (inside `root`), with `soname` when given.
    fn lib(root: &Path, path: &str, soname: Option<&str>, libc: bool) -> bool {
        let out = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let src = out.with_extension("c");
        std::fs::write(&src, "int actk_probe(void){return 7;}\n").unwrap();
        let mut cc = Command::new("gcc");
        cc.args(["-shared", "-fPIC", "-o"]).arg(&out).arg(&src);
        if !libc {
            cc.arg("-nostdlib");
        }
        if let Some(s) = soname {
            cc.arg(format!("-Wl,-soname,{s}"));
        }
        let ok = cc.status().is_ok_and(|s| s.success());
        let _ = std::fs::remove_file(&src);
        ok
    }

    fn host_ldconfig() -> Option<&'static str> {
        ["/sbin/ldconfig", "/usr/sbin/ldconfig"].into_iter().find(|p| Path::new(p).exists())
    }

    /// The driver directories of the oracle tests: the cases ldconfig's directory scan decides.
    fn driver_dirs(r: &Path) -> bool {
        let ok = lib(r, "/opt/drv/libcuda.so.580.95.05", Some("libcuda.so.1"), false)
            && lib(r, "/opt/drv/libnvidia-ml.so.580.95.05", Some("libnvidia-ml.so.1"), false)
            // A stale older copy with the same soname, and no link: the newer file name wins.
            && lib(r, "/opt/drv/libnvidia-ml.so.535.183.01", Some("libnvidia-ml.so.1"), false)
            && lib(r, "/opt/drv/libnosoname.so.2", None, false)
            && lib(r, "/opt/two/libbar.so.1", Some("libbar.so.1"), false)
            && lib(r, "/opt/two/libneedsc.so.1", Some("libneedsc.so.1"), true);
        if !ok {
            return false;
        }
        let d = r.join("opt/drv");
        symlink("libcuda.so.580.95.05", d.join("libcuda.so.1")).unwrap();
        symlink("libcuda.so.1", d.join("libcuda.so")).unwrap();
        // A link whose name is neither the soname nor its .so: ldconfig takes it for a file.
        symlink("/opt/two/libbar.so.1", d.join("libfoo.so.3")).unwrap();
        symlink("/nonexistent/libx.so.1", d.join("libdangling.so.1")).unwrap();
        std::fs::write(d.join("libjunk.so"), "/* GNU ld script */ GROUP ( libc.so.6 )\n").unwrap();
        std::fs::create_dir_all(d.join("libsub.so.d")).unwrap();
        symlink("/opt/two", d.join("libdirlink.so.1")).unwrap();
        true
    }

    fn entries_of(root: &Path) -> Vec<Entry> {
        ldcache::parse_entries(&std::fs::read(root.join("etc/ld.so.cache")).unwrap()).unwrap()
    }

    fn copy(from: &Path) -> tempfile::TempDir {
        let to = tempfile::tempdir().unwrap();
        let st = Command::new("cp").arg("-a").arg(format!("{}/.", from.display())).arg(to.path()).status().unwrap();
        assert!(st.success());
        to
    }

    /// The cache actk writes for the driver directories holds exactly the entries, in the same
    /// order, that the host's glibc ldconfig (`-X -r ROOT DIR...`, its own directory scan) writes.
    #[test]
    fn added_directories_match_what_glibc_ldconfig_indexes() {
        let Some(ldconfig) = host_ldconfig() else {
            eprintln!("skipping: no ldconfig to compare with");
            return;
        };
        let base = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(base.path().join("etc")).unwrap();
        std::fs::write(base.path().join("etc/ld.so.conf"), "# empty\n").unwrap();
        if !driver_dirs(base.path()) {
            eprintln!("skipping: gcc cannot build the test libraries");
            return;
        }
        let oracle = copy(base.path());
        let st = Command::new(ldconfig).arg("-X").arg("-r").arg(oracle.path()).args(["/opt/drv", "/opt/two"]).status();
        assert!(st.unwrap().success());
        let root = ContainerRoot::open(base.path()).unwrap();
        let out = update(&root, &["/opt/drv".into(), "/opt/two/".into()]).unwrap();
        assert!(matches!(out, LdcacheOutcome::Updated(_)), "{out:?}");
        let want = entries_of(oracle.path());
        assert!(want.iter().any(|e| e.key == "libcuda.so" && e.path == "/opt/drv/libcuda.so"), "{want:?}");
        assert_eq!(entries_of(base.path()), want);
        // The cache is readable by everyone, and nothing but the cache and the drop-in appeared.
        let m = std::fs::metadata(base.path().join("etc/ld.so.cache")).unwrap();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777, 0o644);
        let mut etc: Vec<_> =
            std::fs::read_dir(base.path().join("etc")).unwrap().map(|e| e.unwrap().file_name()).collect();
        etc.sort();
        assert_eq!(etc, ["ld.so.cache", "ld.so.conf", "ld.so.conf.d"]);
        assert!(!base.path().join("var").exists(), "no aux-cache");
        // glibc's own reader takes it, extension included (`ldconfig -p` fails on a malformed one).
        let p = Command::new(ldconfig).arg("-r").arg(base.path()).arg("-p").output().unwrap();
        let listing = String::from_utf8_lossy(&p.stdout);
        assert!(p.status.success(), "{listing}{}", String::from_utf8_lossy(&p.stderr));
        assert!(listing.contains(&format!("{} libs found", want.len())), "{listing}");
        assert!(listing.contains("libcuda.so.1 (libc6,x86-64) => /opt/drv/libcuda.so.1"), "{listing}");
        assert!(listing.contains("Cache generated by: actk"), "{listing}");
        // Running again changes nothing (a restarted container).
        update(&root, &["/opt/drv".into(), "/opt/two".into()]).unwrap();
        assert_eq!(entries_of(base.path()), want);
    }

    /// With the image's own cache (built by ldconfig from its ld.so.conf and system directories),
    /// the result is what ldconfig writes with the driver directories on its command line: the
    /// image's entries kept, the driver's first among equal sonames.
    #[test]
    fn merged_with_the_images_cache_as_ldconfig_would_write_it() {
        let Some(ldconfig) = host_ldconfig() else {
            eprintln!("skipping: no ldconfig to compare with");
            return;
        };
        let base = tempfile::tempdir().unwrap();
        let r = base.path();
        std::fs::create_dir_all(r.join("etc")).unwrap();
        std::fs::write(r.join("etc/ld.so.conf"), "/usr/local/lib\n").unwrap();
        let ok = lib(r, "/usr/local/lib/libimage.so.4.1", Some("libimage.so.4"), true)
            // The image's own stub of a driver library, in a system directory.
            && lib(r, "/usr/lib/x86_64-linux-gnu/libcuda.so.1", Some("libcuda.so.1"), false)
            && driver_dirs(r);
        if !ok {
            eprintln!("skipping: gcc cannot build the test libraries");
            return;
        }
        let oracle = copy(r);
        // The image as built: ldconfig run inside it.
        assert!(Command::new(ldconfig).arg("-X").arg("-r").arg(r).status().unwrap().success());
        let image = entries_of(r);
        assert!(image.iter().any(|e| e.key == "libimage.so.4"), "{image:?}");
        assert!(
            Command::new(ldconfig).arg("-X").arg("-r").arg(oracle.path()).arg("/opt/drv").status().unwrap().success()
        );
        let root = ContainerRoot::open(r).unwrap();
        update(&root, &["/opt/drv".into()]).unwrap();
        let got = entries_of(r);
        assert_eq!(got, entries_of(oracle.path()));
        let cuda: Vec<&str> = got.iter().filter(|e| e.key == "libcuda.so.1").map(|e| e.path.as_str()).collect();
        assert_eq!(cuda, ["/opt/drv/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"]);
    }

    fn glibc_image() -> tempfile::TempDir {
        let base = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(base.path().join("etc")).unwrap();
        std::fs::write(base.path().join("etc/ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n").unwrap();
        base
    }

    fn notes_of(out: LdcacheOutcome) -> String {
        match out {
            LdcacheOutcome::Updated(n) => n,
            other => panic!("{other:?}"),
        }
    }

    /// Issue 29, finding 2: the image's cache is 349k entries naming one 8 MB string. It is
    /// refused by the bounded reader with a note, and the cache is written with the added
    /// directories (the container still starts with its driver libraries).
    #[test]
    fn an_amplifying_image_cache_is_replaced_with_a_note() {
        let base = glibc_image();
        let r = base.path();
        std::fs::write(r.join("etc/ld.so.cache"), actk_testsupport::hostile::amplifying_cache(349_000, 8 << 20))
            .unwrap();
        if !lib(r, "/opt/drv/libcuda.so.580.95.05", Some("libcuda.so.1"), false) {
            eprintln!("skipping: gcc cannot build the test library");
            return;
        }
        let root = ContainerRoot::open(r).unwrap();
        let notes = notes_of(update(&root, &["/opt/drv".into()]).unwrap());
        assert!(notes.contains("/etc/ld.so.cache: ld.so.cache goes past a limit of the reader: entries"), "{notes}");
        let got = entries_of(r);
        assert_eq!(got.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), ["/opt/drv/libcuda.so.1"]);
    }

    /// Issue 29, finding 4: a `lib*.so*` that is a device node (`c 1 11`), a FIFO, a link to
    /// either, and a cache file that is a device node are skipped with a note, never opened; the
    /// real library next to them is indexed and the cache written.
    #[test]
    fn device_nodes_and_fifos_among_libraries_and_as_the_cache_are_never_opened() {
        use actk_testsupport::hostile::{OpenWatch, node};
        let base = glibc_image();
        let r = base.path();
        if !lib(r, "/opt/drv/libcuda.so.580.95.05", Some("libcuda.so.1"), false) {
            eprintln!("skipping: gcc cannot build the test library");
            return;
        }
        let d = r.join("opt/drv");
        node(&d.join("libkmsg.so.1"), FileType::CharacterDevice).unwrap();
        node(&d.join("libfifo.so.1"), FileType::Fifo).unwrap();
        symlink("libkmsg.so.1", d.join("liblink.so.1")).unwrap();
        node(&r.join("etc/ld.so.cache"), FileType::CharacterDevice).unwrap();
        let watch =
            OpenWatch::new(&[&d.join("libkmsg.so.1"), &d.join("libfifo.so.1"), &r.join("etc/ld.so.cache")]).unwrap();
        let root = ContainerRoot::open(r).unwrap();
        let notes = notes_of(update(&root, &["/opt/drv".into()]).unwrap());
        assert_eq!(watch.opened(), Vec::<std::path::PathBuf>::new(), "a node was opened: {notes}");
        for want in [
            "\"/opt/drv/libkmsg.so.1\" inside",
            "\"/opt/drv/libfifo.so.1\" inside",
            "\"/opt/drv/liblink.so.1\" inside",
            "is a character device, not a regular file: not opened; skipped",
            "is a FIFO, not a regular file: not opened; skipped",
            "/etc/ld.so.cache: not read, replaced: container path \"/etc/ld.so.cache\"",
        ] {
            assert!(notes.contains(want), "{want:?} not in:\n{notes}");
        }
        let got = entries_of(r);
        assert_eq!(got.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["libcuda.so.1"]);
        assert!(std::fs::symlink_metadata(r.join("etc/ld.so.cache")).unwrap().is_file(), "the node is replaced");
    }

    /// Issue 29, finding 3: 1,000 links to one crafted library (254 notes of 64 KiB, 4000
    /// DT_NEEDED) in an added directory. Each costs at most the per-file limit, the run's byte
    /// budget stops the scan with a note naming the directory and the bound, the directories
    /// after it are named too, and the cache is still written. A budget of 50 entries stops a
    /// directory the same way.
    #[test]
    fn an_elf_flood_stops_at_the_run_budget_naming_the_directory() {
        use crate::budget::{Budget, BudgetLimits};
        let base = glibc_image();
        let r = base.path();
        actk_testsupport::hostile::plant(r, actk_testsupport::hostile::Class::ElfFlood, "/opt/flood", 1000).unwrap();
        if !lib(r, "/opt/drv/libcuda.so.580.95.05", Some("libcuda.so.1"), false) {
            eprintln!("skipping: gcc cannot build the test library");
            return;
        }
        let root = ContainerRoot::open(r).unwrap();
        let mut budget = Budget::default();
        let notes = notes_of(update_within(&root, &["/opt/flood".into(), "/opt/drv".into()], &mut budget).unwrap());
        assert!(notes.contains("/opt/flood: the budget of 67108864 bytes read per start is spent;"), "{notes}");
        assert!(notes.contains("/opt/drv: not indexed: the budget of 67108864 bytes"), "{notes}");
        assert!(r.join("etc/ld.so.cache").is_file());

        let base = glibc_image();
        let r = base.path();
        if !lib(r, "/opt/drv/libcuda.so.580.95.05", Some("libcuda.so.1"), false) {
            return;
        }
        for i in 0..100 {
            std::fs::write(r.join(format!("opt/drv/notalib{i}")), b"").unwrap();
        }
        let root = ContainerRoot::open(r).unwrap();
        let mut budget = Budget::new(BudgetLimits { entries: 50, ..BudgetLimits::default() });
        let notes = notes_of(update_within(&root, &["/opt/drv".into()], &mut budget).unwrap());
        assert!(
            notes.contains(
                "/opt/drv: the budget of 50 directory entries per start is spent; the rest of it is not indexed"
            ),
            "{notes}"
        );
    }
}
