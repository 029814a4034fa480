//! Root filesystems for the tests (busybox-static, a Debian bookworm minbase) and their import
//! into docker and podman as images.

use super::*;
use anyhow::{Context, Result, anyhow, bail};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The busybox rootfs (built once, cached at `target/actk-e2e/busybox-rootfs`): /bin/busybox
/// from the host's busybox-static, every applet as a symlink at its usual path
/// (`busybox --list-full`), /etc/passwd and /etc/group with root and nobody, and empty /dev,
/// /proc, /sys, /tmp, /root. Treat it as read-only; [`Bundle`] copies it.
pub fn busybox_rootfs() -> Result<PathBuf> {
    let dest = cache_dir().join("busybox-rootfs");
    with_lock("busybox-rootfs", || {
        if dest.join("bin/busybox").is_file() {
            return Ok(dest.clone());
        }
        let busybox = ["/bin/busybox", "/usr/bin/busybox"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.is_file())
            .ok_or_else(|| anyhow!("no /bin/busybox: install busybox-static (scripts/install-deps.sh)"))?;
        // Build in a fresh directory and rename, so a crash never leaves a half rootfs behind.
        let tmp = cache_dir().join(unique_name("busybox-rootfs.tmp"));
        let _ = fs::remove_dir_all(&tmp);
        for d in ["bin", "sbin", "usr/bin", "usr/sbin", "etc", "dev", "proc", "sys", "tmp", "root", "var", "run"] {
            fs::create_dir_all(tmp.join(d))?;
        }
        fs::set_permissions(tmp.join("tmp"), fs::Permissions::from_mode(0o1777))?;
        fs::copy(busybox, tmp.join("bin/busybox")).with_context(|| format!("copying {}", busybox.display()))?;
        fs::set_permissions(tmp.join("bin/busybox"), fs::Permissions::from_mode(0o755))?;
        let list = Command::new(busybox).arg("--list-full").output().context("busybox --list-full")?;
        if !list.status.success() {
            bail!("{} --list-full failed; is it busybox-static?", busybox.display());
        }
        for applet in String::from_utf8_lossy(&list.stdout).lines() {
            let applet = applet.trim().trim_start_matches('/');
            if applet.is_empty() || applet == "bin/busybox" {
                continue;
            }
            let link = tmp.join(applet);
            if let Some(parent) = link.parent() {
                fs::create_dir_all(parent)?;
            }
            if link.symlink_metadata().is_err() {
                std::os::unix::fs::symlink("/bin/busybox", &link)
                    .with_context(|| format!("linking {}", link.display()))?;
            }
        }
        fs::write(
            tmp.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        )?;
        fs::write(tmp.join("etc/group"), "root:x:0:\nvideo:x:44:\nnogroup:x:65534:\n")?;
        let _ = fs::remove_dir_all(&dest);
        fs::rename(&tmp, &dest).with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))?;
        Ok(dest.clone())
    })
}

/// The glibc rootfs (Debian bookworm, `debootstrap --variant=minbase`), for tests that need
/// `ldconfig -p`. Built once into `target/actk-e2e/glibc-rootfs` (minutes; needs the Debian
/// mirror, `$ACTK_DEBIAN_MIRROR` or deb.debian.org).
pub fn glibc_rootfs() -> Result<PathBuf> {
    let dest = cache_dir().join("glibc-rootfs");
    with_lock("glibc-rootfs", || {
        if dest.join("sbin/ldconfig").exists() && dest.join("etc/debian_version").is_file() {
            return Ok(dest.clone());
        }
        if which("debootstrap").is_none() {
            bail!("debootstrap is not installed (scripts/install-deps.sh installs it)");
        }
        let mirror = std::env::var("ACTK_DEBIAN_MIRROR").unwrap_or_else(|_| "http://deb.debian.org/debian".into());
        let tmp = cache_dir().join(unique_name("glibc-rootfs.tmp"));
        let _ = fs::remove_dir_all(&tmp);
        let o = Command::new("debootstrap")
            .args(["--variant=minbase", "bookworm"])
            .arg(&tmp)
            .arg(&mirror)
            .stdin(Stdio::null())
            .output()
            .context("running debootstrap")?;
        if !o.status.success() {
            let (out, err) = text(&o);
            let _ = fs::remove_dir_all(&tmp);
            bail!("debootstrap --variant=minbase bookworm {} {mirror} failed:\n{out}\n{err}", tmp.display());
        }
        let _ = fs::remove_dir_all(&dest);
        fs::rename(&tmp, &dest)?;
        Ok(dest.clone())
    })
}

/// Import `rootfs` into `engine` (`docker` or `podman`) as `image`, once: nothing happens when the
/// image is already there. Serialised by a lock, so parallel tests import it once.
pub fn import_image(engine: &str, rootfs: &Path, image: &str) -> Result<()> {
    with_lock(&format!("import-{engine}"), || {
        let present = Command::new(engine)
            .args(["image", "inspect", image])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if present {
            return Ok(());
        }
        let mut tar = Command::new("tar")
            .arg("-C")
            .arg(rootfs)
            .args(["-c", "."])
            .stdout(Stdio::piped())
            .spawn()
            .context("starting tar")?;
        let tar_out = tar.stdout.take().ok_or_else(|| anyhow!("tar has no stdout"))?;
        let o = Command::new(engine)
            .args(["import", "-", image])
            .stdin(tar_out)
            .output()
            .with_context(|| format!("starting {engine} import"))?;
        let tar_status = tar.wait()?;
        if !tar_status.success() || !o.status.success() {
            let (out, err) = text(&o);
            bail!(
                "tar -C {} -c . | {engine} import - {image} failed ({tar_status}, {}):\n{out}\n{err}",
                rootfs.display(),
                o.status
            );
        }
        Ok(())
    })
}

/// [`BUSYBOX_IMAGE`] in docker, imported when absent. Returns the image name.
pub fn docker_busybox_image() -> Result<&'static str> {
    import_image("docker", &busybox_rootfs()?, BUSYBOX_IMAGE)?;
    Ok(BUSYBOX_IMAGE)
}

/// [`BUSYBOX_IMAGE`] in podman, imported when absent. Returns the image name.
pub fn podman_busybox_image() -> Result<&'static str> {
    import_image("podman", &busybox_rootfs()?, BUSYBOX_IMAGE)?;
    Ok(BUSYBOX_IMAGE)
}

/// [`GLIBC_IMAGE`] in docker, built (debootstrap) and imported when absent.
pub fn docker_glibc_image() -> Result<&'static str> {
    import_image("docker", &glibc_rootfs()?, GLIBC_IMAGE)?;
    Ok(GLIBC_IMAGE)
}

/// [`GLIBC_IMAGE`] in podman, built (debootstrap) and imported when absent.
pub fn podman_glibc_image() -> Result<&'static str> {
    import_image("podman", &glibc_rootfs()?, GLIBC_IMAGE)?;
    Ok(GLIBC_IMAGE)
}

/// Copy a tree with `cp -a` (keeps symlinks, modes and device nodes).
pub fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let o = Command::new("cp").arg("-a").arg(from).arg(to).output().context("running cp -a")?;
    if !o.status.success() {
        bail!("cp -a {} {} failed: {}", from.display(), to.display(), text(&o).1);
    }
    Ok(())
}
