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
//! hostile image's symlinks cannot make this read or write a host file.

use crate::error::Result;
use crate::root::ContainerRoot;
use rustix::fs::{FileType, Mode, OFlags};
use std::io::Read;

/// The drop-in written into the container (the `00-compat` prefix, as the toolkit's
/// `00-compat-*.conf`, sorts before the other drop-ins).
pub const COMPAT_DROP_IN: &str = "/etc/ld.so.conf.d/00-compat-actk.conf";

/// Where CUDA images keep the forward-compatibility libraries.
pub const DEFAULT_COMPAT_DIR: &str = "/usr/local/cuda/compat";

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
    let libs: Vec<String> = list_regular_files(root, dir)?
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
/// file-name order (what [`enable`] and nvidia-cdi-hook write). Unreadable entries are skipped.
pub fn compat_dirs(root: &ContainerRoot) -> Vec<String> {
    let Ok(mut names) = list_regular_files(root, "/etc/ld.so.conf.d") else { return Vec::new() };
    names.retain(|n| n.starts_with("00-compat-") && n.ends_with(".conf"));
    names.sort();
    let mut out = Vec::new();
    for n in names {
        let Ok(text) = read_small(root, &format!("/etc/ld.so.conf.d/{n}")) else { continue };
        for l in text.lines().map(str::trim).filter(|l| l.starts_with('/')) {
            if !out.iter().any(|o| o == l) {
                out.push(l.to_string());
            }
        }
    }
    out
}

fn major(version: &str) -> Option<u64> {
    version.split('.').next()?.parse().ok()
}

/// Names of the regular files (not symlinks) in directory `dir` of the root.
fn list_regular_files(root: &ContainerRoot, dir: &str) -> Result<Vec<String>> {
    let dfd = root.resolve(dir, OFlags::DIRECTORY)?;
    let readable = rustix::fs::openat(&dfd, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| crate::error::InjectError::host("open directory", dir, e))?;
    let mut names = Vec::new();
    let entries = rustix::fs::Dir::read_from(&readable).map_err(|e| crate::error::InjectError::host("read", dir, e))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        let is_file = rustix::fs::statat(&dfd, name.as_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile);
        if is_file {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// A small text file of the root (at most 64 KiB read), reopened through its resolved fd.
fn read_small(root: &ContainerRoot, path: &str) -> Result<String> {
    let fd = root.resolve(path, OFlags::empty())?;
    let reopen = format!("/proc/self/fd/{}", rustix::fd::AsRawFd::as_raw_fd(&fd));
    let f = rustix::fs::open(reopen.as_str(), OFlags::RDONLY | OFlags::NOCTTY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| crate::error::InjectError::host("open", path, e))?;
    let mut s = String::new();
    std::fs::File::from(f)
        .take(64 * 1024)
        .read_to_string(&mut s)
        .map_err(|e| crate::error::InjectError::host("read", path, e))?;
    Ok(s)
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
}
