//! inject() against a live process in its own mount namespace (`unshare -m` running `sleep`),
//! standing in for a container: mounts land in that namespace only, read-only, nosuid, nodev.

use actk_core::cdi::{CdiDeviceNode, CdiMount, ContainerEdits};
use actk_inject::{Options, Target, inject};
use std::path::Path;
use std::process::{Child, Command};

struct Ns(Child);
impl Drop for Ns {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn root_and_unshare() -> bool {
    let root = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0).unwrap_or(false);
    root && Command::new("unshare").arg("--help").output().is_ok()
}

#[test]
fn bind_mounts_land_read_only_in_the_target_namespace_only() {
    if !root_and_unshare() {
        eprintln!("skipping: needs root and unshare(1)");
        return;
    }
    let host = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(host.path().join("usr/lib")).unwrap();
    std::fs::write(host.path().join("usr/lib/libdemo.so.1"), b"ELF-ish").unwrap();
    std::fs::create_dir_all(host.path().join("usr/share/demo")).unwrap();
    std::fs::write(host.path().join("usr/share/demo/data"), b"d").unwrap();
    let rootfs = tempfile::tempdir().unwrap();

    let ns = Ns(Command::new("unshare").args(["-m", "--propagation", "private", "sleep", "60"]).spawn().unwrap());
    let pid = ns.0.id() as i32;
    // Wait until the child is in its new namespace.
    let own = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    for _ in 0..200 {
        if std::fs::read_link(format!("/proc/{pid}/ns/mnt")).map(|l| l != own).unwrap_or(false) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let edits = ContainerEdits {
        device_nodes: vec![CdiDeviceNode {
            path: "/dev/demo0".into(),
            node_type: Some("c".into()),
            major: Some(1),
            minor: Some(3),
            ..Default::default()
        }],
        mounts: vec![
            CdiMount {
                host_path: host.path().join("usr/lib/libdemo.so.1").to_string_lossy().into(),
                container_path: "/usr/lib/x86_64-linux-gnu/libdemo.so.1".into(),
                mount_type: Some("bind".into()),
                options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
            },
            CdiMount {
                host_path: host.path().join("usr/share/demo").to_string_lossy().into(),
                container_path: "/usr/share/demo".into(),
                mount_type: Some("bind".into()),
                options: vec![],
            },
        ],
        ..Default::default()
    };
    let target = Target::for_pid(pid, rootfs.path()).unwrap();
    let opts = Options { host_root: host.path().to_path_buf(), cgroup: false, ldcache: false, ..Options::default() };
    let report = inject(&target, &edits, &opts).unwrap();
    assert_eq!(report.mounts.len(), 2);

    let theirs = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let lib_target = rootfs.path().join("usr/lib/x86_64-linux-gnu/libdemo.so.1");
    let line = theirs
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(lib_target.to_str().unwrap()))
        .expect("mount in the target namespace");
    let opts_field = line.split(' ').nth(5).unwrap();
    for o in ["ro", "nosuid", "nodev"] {
        assert!(opts_field.split(',').any(|x| x == o), "{o} missing: {line}");
    }
    assert!(theirs.contains(rootfs.path().join("usr/share/demo").to_str().unwrap()), "directory mount missing");
    let ours = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!ours.contains(rootfs.path().to_str().unwrap()), "a mount leaked into the caller's namespace");
    // Inside the namespace the file is the host's, and read-only.
    let seen = std::fs::read(format!("/proc/{pid}/root{}", lib_target.display())).unwrap();
    assert_eq!(seen, b"ELF-ish");
    let w = std::fs::OpenOptions::new().write(true).open(format!("/proc/{pid}/root{}", lib_target.display()));
    assert_eq!(w.unwrap_err().raw_os_error(), Some(libc_erofs()));
    // Outside, the target is the empty file actk created.
    assert_eq!(std::fs::read(&lib_target).unwrap(), b"");
    assert!(Path::new(&rootfs.path().join("dev/demo0")).exists());
}

fn libc_erofs() -> i32 {
    30 // EROFS
}
