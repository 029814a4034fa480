//! CUDA forward compatibility inside a container, as nvidia-container-toolkit's
//! `nvidia-cdi-hook enable-cuda-compat --host-driver-version V` does (cmd/nvidia-cdi-hook/
//! cudacompat): an image that ships `/usr/local/cuda/compat/libcuda.so.<version>` of a driver
//! newer than the host's gets that directory first in its ld.so.cache, so CUDA runs the newer
//! user-space driver on the older kernel module.
//!
//! Conditions (all, else nothing is done): the compat directory exists in the image, the image
//! has an /etc/ld.so.cache (a glibc image), exactly one regular file `libcuda.so.*.*` is in it
//! (symlinks are ignored), and its driver major version is greater than the host's. Then
//! [`COMPAT_DROP_IN`] is written, listing the directory as the image resolves it; the ld.so.cache
//! refresh ([`crate::ldcache::update`]) puts the directories of `00-compat-*.conf` drop-ins
//! first, so the compat libcuda.so.1 wins over the host's.
//!
//! Everything in the image is reached through [`ContainerRoot`] (openat2 RESOLVE_IN_ROOT): a
//! hostile image's symlinks cannot make this read or write a host file. A drop-in is read only
//! when it is a regular file, checked on the descriptor before it is opened
//! ([`ContainerRoot::open_regular`]: a FIFO raced in never blocks the hook), and the work is
//! bounded (issue 29, finding 3): directory listings and reads count against the run's
//! [`Budget`], at most [`MAX_COMPAT_DIRS`] directories are taken from the drop-ins, and their
//! lines are de-duplicated in linear time.

use crate::budget::{Budget, Notes};
use crate::error::Result;
use crate::root::ContainerRoot;
use rustix::fs::{FileType, Mode, OFlags};
use std::collections::HashSet;
use std::io::Read;

/// The drop-in written into the container (the `00-compat` prefix, as the toolkit's
/// `00-compat-*.conf`, sorts before the other drop-ins).
pub const COMPAT_DROP_IN: &str = "/etc/ld.so.conf.d/00-compat-actk.conf";

/// Where CUDA images keep the forward-compatibility libraries.
pub const DEFAULT_COMPAT_DIR: &str = "/usr/local/cuda/compat";

/// Directories taken from the `00-compat-*.conf` drop-ins, at most (what actk and
/// nvidia-cdi-hook write lists one).
pub const MAX_COMPAT_DIRS: usize = 64;

/// Bytes read of one drop-in, at most.
const MAX_DROP_IN: u64 = 64 * 1024;

/// What [`enable`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompatOutcome {
    /// The compat directory was added: (directory, compat driver version).
    Enabled(String, String),
    /// Nothing to do, and why (no compat libraries, not newer than the host, ...).
    NotNeeded(String),
    /// Needed, but the drop-in could not be written (a read-only /etc): the container starts
    /// with the host's driver libraries first, and why. Callers warn.
    NotWritten(String),
}

/// Applies the rule of the module docs to `root` for a host driver `host_driver`
/// (`580.95.05`), with the compat libraries `library.*.*` (`libcuda.so`) in `dir`.
///
/// Errors: reading the image or writing the drop-in failed (a refusal of an unsafe path included).
pub fn enable(root: &ContainerRoot, host_driver: &str, dir: &str, library: &str) -> Result<CompatOutcome> {
    let not = |why: String| Ok(CompatOutcome::NotNeeded(why));
    let Some(host_major) = major(host_driver) else {
        return not(format!("host driver version {host_driver:?} has no major number"));
    };
    if !root.exists(dir) {
        return not(format!("no {dir} in the image"));
    }
    if !root.exists("/etc/ld.so.cache") {
        return not("the image has no /etc/ld.so.cache (not a glibc image)".into());
    }
    let prefix = format!("{library}.");
    let mut budget = Budget::default();
    let libs: Vec<String> = list_regular_files(root, dir, &mut budget)?
        .into_iter()
        .filter(|n| n.strip_prefix(&prefix).is_some_and(|v| v.matches('.').count() >= 1))
        .collect();
    let [lib] = libs.as_slice() else {
        return not(format!("{} files {library}.*.* in {dir} (one is needed): {libs:?}", libs.len()));
    };
    let version = lib[prefix.len()..].to_string();
    let Some(compat_major) = major(&version) else {
        return not(format!("{dir}/{lib}: no major version"));
    };
    if compat_major <= host_major {
        return not(format!("compat driver {version} is not newer than the host driver {host_driver}"));
    }
    let resolved = resolved_path(root, dir)?;
    let written = root.write_file(
        COMPAT_DROP_IN,
        format!(
            "# Written by actk: CUDA forward compatibility libraries ({lib}, host driver {host_driver}).\n{resolved}\n"
        )
        .as_bytes(),
        0o644,
    );
    match written {
        Ok(()) => Ok(CompatOutcome::Enabled(resolved, version)),
        // The file system said no (a read-only /etc): skipped, as the cache update is.
        Err(crate::error::InjectError::Container { source, .. }) => Ok(CompatOutcome::NotWritten(format!(
            "{COMPAT_DROP_IN} not written ({source}): the image's CUDA forward compatibility libraries ({resolved}, driver {version}) are not used"
        ))),
        Err(e) => Err(e),
    }
}

/// The directories listed in the image's `/etc/ld.so.conf.d/00-compat-*.conf` drop-ins, in
/// file-name order (what [`enable`] and nvidia-cdi-hook write), within a default [`Budget`].
/// Unreadable entries are skipped.
pub fn compat_dirs(root: &ContainerRoot) -> Vec<String> {
    compat_dirs_within(root, &mut Budget::default(), &mut Notes::default())
}

/// [`compat_dirs`] within `budget`, at most [`MAX_COMPAT_DIRS`] of them, each once (linear in
/// the lines read). What is skipped gets a line in `notes`: a drop-in that is not a regular file
/// (never opened), directories past the limit, a spent budget.
pub fn compat_dirs_within(root: &ContainerRoot, budget: &mut Budget, notes: &mut Notes) -> Vec<String> {
    const DIR: &str = "/etc/ld.so.conf.d";
    let Ok(mut entries) = list_entries(root, DIR, budget) else { return Vec::new() };
    if let Some(spent) = budget.spent() {
        notes.push(format!("{DIR}: {spent}; compat drop-ins after the first {} entries are not read", entries.len()));
    }
    entries.retain(|(n, _)| n.starts_with("00-compat-") && n.ends_with(".conf"));
    let mut names = Vec::new();
    for (n, ft) in entries {
        if ft == FileType::RegularFile {
            names.push(n);
        } else if crate::ldcache::is_special(ft) {
            notes.push(format!("{DIR}/{n}: {}, not a regular file: not opened; skipped", crate::root::type_name(ft)));
        }
    }
    let mut out: Vec<String> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    for n in names {
        let path = format!("{DIR}/{n}");
        let text = match read_small(root, &path, budget) {
            Ok(t) => t,
            Err(e @ crate::error::InjectError::NotRegular { file_type, .. })
                if crate::ldcache::is_special(file_type) =>
            {
                notes.push(format!("{e}; skipped"));
                continue;
            }
            Err(_) => continue,
        };
        for l in text.lines().map(str::trim).filter(|l| l.starts_with('/')) {
            if seen.contains(l) {
                continue;
            }
            if out.len() == MAX_COMPAT_DIRS {
                notes.push(format!(
                    "{path}: more than {MAX_COMPAT_DIRS} compat directories in the drop-ins; the rest ignored"
                ));
                return out;
            }
            seen.insert(l.to_string());
            out.push(l.to_string());
        }
        if let Err(spent) = budget.check_time() {
            notes.push(format!("{DIR}: {spent}; compat drop-ins after {n} are not read"));
            break;
        }
    }
    out
}

fn major(version: &str) -> Option<u64> {
    version.split('.').next()?.parse().ok()
}

/// Names of the regular files (not symlinks) in directory `dir` of the root, each entry counted
/// against `budget`: once it is spent, the names found so far.
fn list_regular_files(root: &ContainerRoot, dir: &str, budget: &mut Budget) -> Result<Vec<String>> {
    let all = list_entries(root, dir, budget)?;
    Ok(all.into_iter().filter(|(_, ft)| *ft == FileType::RegularFile).map(|(n, _)| n).collect())
}

/// Names and types (not following symlinks) of the entries of directory `dir` of the root,
/// sorted by name, each entry counted against `budget`: once it is spent, the entries so far.
fn list_entries(root: &ContainerRoot, dir: &str, budget: &mut Budget) -> Result<Vec<(String, FileType)>> {
    let dfd = root.resolve(dir, OFlags::DIRECTORY)?;
    let readable = rustix::fs::openat(&dfd, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| crate::error::InjectError::host("open directory", dir, e))?;
    let mut names = Vec::new();
    let entries = rustix::fs::Dir::read_from(&readable).map_err(|e| crate::error::InjectError::host("read", dir, e))?;
    for entry in entries.flatten() {
        if budget.entry().is_err() {
            break;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        if let Ok(st) = rustix::fs::statat(&dfd, name.as_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            names.push((name, FileType::from_raw_mode(st.st_mode)));
        }
    }
    names.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(names)
}

/// A small text file of the root (at most [`MAX_DROP_IN`] bytes read, counted in `budget`),
/// opened only if it is a regular file, never through a symlink at `path`
/// ([`ContainerRoot::open_regular`]).
fn read_small(root: &ContainerRoot, path: &str, budget: &mut Budget) -> Result<String> {
    let (file, _) = root.open_regular(path, false)?;
    let mut s = Vec::new();
    file.take(MAX_DROP_IN.min(budget.bytes_left()))
        .read_to_end(&mut s)
        .map_err(|e| crate::error::InjectError::host("read", path, e))?;
    let _ = budget.read(s.len() as u64);
    Ok(String::from_utf8_lossy(&s).into_owned())
}

/// `dir` as the image resolves it (its symlinks followed inside the root), so the drop-in names
/// a directory ldconfig finds whatever links lead there.
fn resolved_path(root: &ContainerRoot, dir: &str) -> Result<String> {
    let fd = root.resolve(dir, OFlags::DIRECTORY)?;
    let link = std::fs::read_link(format!("/proc/self/fd/{}", rustix::fd::AsRawFd::as_raw_fd(&fd)))
        .map_err(|e| crate::error::InjectError::host("readlink", dir, e))?;
    let shown_root = std::fs::read_link(format!("/proc/self/fd/{}", rustix::fd::AsRawFd::as_raw_fd(&root.as_fd())))
        .map_err(|e| crate::error::InjectError::host("readlink", root.shown(), e))?;
    Ok(match link.strip_prefix(&shown_root) {
        Ok(rel) => format!("/{}", rel.display()),
        Err(_) => dir.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    fn image(compat: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        std::fs::create_dir_all(r.join("etc/ld.so.conf.d")).unwrap();
        std::fs::write(r.join("etc/ld.so.cache"), b"").unwrap();
        std::fs::create_dir_all(r.join("usr/local/cuda-13.1/compat")).unwrap();
        symlink("cuda-13.1", r.join("usr/local/cuda")).unwrap();
        for f in compat {
            std::fs::write(r.join("usr/local/cuda-13.1/compat").join(f), b"elf").unwrap();
        }
        d
    }

    /// Issue 13 item 6: a CUDA 13.1 image (compat libcuda of driver 590) on a 580 host gets its
    /// compat directory, resolved inside the image, in the drop-in; the same image on a 590 host,
    /// or an image without compat libraries, is left alone.
    #[test]
    fn item6_cuda_compat_libraries_newer_than_the_host_driver_are_enabled() {
        let img = image(&["libcuda.so.590.44.01", "libnvidia-nvvm.so.590.44.01"]);
        symlink("libcuda.so.590.44.01", img.path().join("usr/local/cuda-13.1/compat/libcuda.so.1")).unwrap();
        let root = ContainerRoot::open(img.path()).unwrap();
        assert_eq!(
            enable(&root, "580.95.05", DEFAULT_COMPAT_DIR, "libcuda.so").unwrap(),
            CompatOutcome::Enabled("/usr/local/cuda-13.1/compat".into(), "590.44.01".into())
        );
        let text = std::fs::read_to_string(img.path().join("etc/ld.so.conf.d/00-compat-actk.conf")).unwrap();
        assert_eq!(text.lines().last(), Some("/usr/local/cuda-13.1/compat"));
        assert_eq!(compat_dirs(&root), ["/usr/local/cuda-13.1/compat"]);

        let img2 = image(&["libcuda.so.590.44.01"]);
        let root2 = ContainerRoot::open(img2.path()).unwrap();
        assert!(matches!(
            enable(&root2, "590.48.01", DEFAULT_COMPAT_DIR, "libcuda.so").unwrap(),
            CompatOutcome::NotNeeded(_)
        ));
        assert!(!img2.path().join("etc/ld.so.conf.d/00-compat-actk.conf").exists());
        let img3 = image(&[]);
        let root3 = ContainerRoot::open(img3.path()).unwrap();
        assert!(matches!(
            enable(&root3, "580.95.05", DEFAULT_COMPAT_DIR, "libcuda.so").unwrap(),
            CompatOutcome::NotNeeded(_)
        ));
    }

    /// A hostile image whose compat directory is a symlink to a host directory: it resolves inside
    /// the image (absent there), nothing is read or written outside.
    #[test]
    fn compat_dir_symlinked_to_the_host_stays_inside_the_image() {
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("libcuda.so.999.1.1"), b"host").unwrap();
        let img = image(&[]);
        std::fs::remove_dir(img.path().join("usr/local/cuda-13.1/compat")).unwrap();
        symlink(host.path(), img.path().join("usr/local/cuda-13.1/compat")).unwrap();
        let root = ContainerRoot::open(img.path()).unwrap();
        let out = enable(&root, "580.95.05", DEFAULT_COMPAT_DIR, "libcuda.so").unwrap();
        assert!(matches!(out, CompatOutcome::NotNeeded(_)), "{out:?}");
        assert!(!Path::new(&img.path().join("etc/ld.so.conf.d/00-compat-actk.conf")).exists());
    }

    /// Issue 29, finding 3: 226,000 distinct lines in compat drop-ins (de-duplicated in quadratic
    /// time before: 53-57 s). Now the first MAX_COMPAT_DIRS are taken, each once, with a note.
    #[test]
    fn a_drop_in_flood_gives_at_most_the_limit_with_a_note() {
        let img = image(&[]);
        let d = img.path().join("etc/ld.so.conf.d");
        for (name, body) in actk_testsupport::hostile::compat_drop_in_flood(226_000) {
            std::fs::write(d.join(name), body).unwrap();
        }
        // Duplicates across files count once.
        std::fs::write(d.join("00-compat-a.conf"), "/c/0\n/c/0\n/c/1\n").unwrap();
        let root = ContainerRoot::open(img.path()).unwrap();
        let mut notes = Notes::default();
        let dirs = compat_dirs_within(&root, &mut Budget::default(), &mut notes);
        assert_eq!(dirs.len(), MAX_COMPAT_DIRS);
        assert_eq!(&dirs[..3], ["/c/0", "/c/1", "/c/2"]);
        let notes = notes.finish();
        assert!(
            notes.contains(
                "00-compat-flood-000.conf: more than 64 compat directories in the drop-ins; the rest ignored"
            ),
            "{notes}"
        );
    }

    /// Issue 29, finding 4: a FIFO as a compat drop-in (placed there, or a link to one) is never
    /// opened, so it cannot block the hook; the drop-ins around it are read.
    #[test]
    fn a_fifo_drop_in_never_blocks() {
        use actk_testsupport::hostile::{OpenWatch, node};
        let img = image(&[]);
        let d = img.path().join("etc/ld.so.conf.d");
        node(&d.join("00-compat-fifo.conf"), FileType::Fifo).unwrap();
        symlink("00-compat-fifo.conf", d.join("00-compat-link.conf")).unwrap();
        std::fs::write(d.join("00-compat-z.conf"), "/opt/compat\n").unwrap();
        let watch = OpenWatch::new(&[&d.join("00-compat-fifo.conf")]).unwrap();
        let root = ContainerRoot::open(img.path()).unwrap();
        let mut notes = Notes::default();
        assert_eq!(compat_dirs_within(&root, &mut Budget::default(), &mut notes), ["/opt/compat"]);
        let notes = notes.finish();
        assert!(
            notes.contains("/etc/ld.so.conf.d/00-compat-fifo.conf: a FIFO, not a regular file: not opened; skipped"),
            "{notes}"
        );
        // Read as a listed regular file would be (the race: a FIFO swapped in after the listing).
        let e = read_small(&root, "/etc/ld.so.conf.d/00-compat-fifo.conf", &mut Budget::default()).unwrap_err();
        assert!(e.to_string().contains("is a FIFO, not a regular file: not opened"), "{e}");
        let e = read_small(&root, "/etc/ld.so.conf.d/00-compat-link.conf", &mut Budget::default()).unwrap_err();
        assert!(e.to_string().contains("is a symlink, not a regular file"), "{e}");
        assert_eq!(watch.opened(), Vec::<std::path::PathBuf>::new());
    }
}
