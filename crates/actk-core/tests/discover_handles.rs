//! What one discovery pass leaves open (issue 31: `DiscoverOptions::process_ends`). A pass keeps
//! directory handles of the root while it runs; a caller that goes on running (the DRA driver,
//! the device plugin, `actk` itself) must find every one of them closed after the pass, on
//! every fixture. A caller that ends right after (actk-runtime's create, which execs the
//! low-level runtime) may leave them open for the exec to close, and only then: each one it
//! leaves is close-on-exec, and the inventory is the same either way.
//!
//! Its own test binary, with one test: the count of the process's open descriptors is only
//! meaningful while no other test opens files beside it.

use actk_core::discover::{DiscoverOptions, discover_roots_with};
use actk_core::profile;

/// The process's open descriptors (from /proc/self/fd, less the one reading it), with
/// whether each is close-on-exec.
fn open_fds() -> Vec<(i32, bool)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd") {
        let fd: i32 = e.unwrap().file_name().to_str().unwrap().parse().unwrap();
        let Ok(info) = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")) else { continue };
        // fdinfo's "flags:" is octal; O_CLOEXEC is 02000000.
        let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).map(str::trim).unwrap_or("0");
        let flags = u64::from_str_radix(flags, 8).unwrap();
        out.push((fd, flags & 0o2000000 != 0));
    }
    out.sort();
    out
}

#[test]
fn a_pass_closes_its_handles_unless_the_process_ends() {
    let profiles = profile::builtin();
    let opts = DiscoverOptions { nvml: false, topology: false, ..Default::default() };
    let ends = DiscoverOptions { process_ends: true, ..opts.clone() };

    // First, under a small soft RLIMIT_NOFILE (before the passes below leave handles open): a
    // root keeps at most half of it (64 at least), and a pass that kept more than an eighth of
    // that (the DGX pass keeps about 25) closes them even when the process ends, so that the
    // up to three passes of a create cannot take the limit.
    if let Some(f) = actk_testsupport::fixture::prepare("nvidia-dgx-h100").expect("fixture") {
        use rustix::process::{Resource, getrlimit, setrlimit};
        let was = getrlimit(Resource::Nofile);
        setrlimit(Resource::Nofile, rustix::process::Rlimit { current: Some(128), maximum: was.maximum })
            .expect("lower RLIMIT_NOFILE");
        let before = open_fds();
        let inv = discover_roots_with(&f.root, &f.root, &profiles, &ends);
        let left = open_fds();
        setrlimit(Resource::Nofile, was).expect("restore RLIMIT_NOFILE");
        assert!(!inv.vendors.is_empty());
        assert_eq!(left, before, "a pass under a small limit left its handles open");
    }

    let mut ran = 0;
    for name in actk_testsupport::fixture::ALL {
        let Some(f) = actk_testsupport::fixture::prepare(name).expect("fixture") else {
            println!("skipping: fixtures need root for mknod");
            return;
        };
        // Without topology, as a container start discovers.
        let before = open_fds();
        let kept = discover_roots_with(&f.root, &f.root, &profiles, &opts);
        assert_eq!(open_fds(), before, "{name}: a pass left descriptors open");

        let left = discover_roots_with(&f.root, &f.root, &profiles, &ends);
        assert_eq!(format!("{left:?}"), format!("{kept:?}"), "{name}: the inventory differs");
        let after = open_fds();
        let new: Vec<&(i32, bool)> = after.iter().filter(|fd| !before.contains(fd)).collect();
        if !kept.vendors.is_empty() {
            assert!(!new.is_empty(), "{name}: process_ends closed every handle (nothing to test)");
            ran += 1;
        }
        assert!(new.iter().all(|(_, cloexec)| *cloexec), "{name}: a handle left open is not close-on-exec: {new:?}");
        // They stay open: the next fixture counts from what is open then.

        // The driver files in a root of their own (here the same tree by another path, as a
        // driver container's root is mounted at /run/nvidia/driver): its handles too.
        let tmp = tempfile::tempdir().unwrap();
        let driver = tmp.path().join("driver");
        std::os::unix::fs::symlink(&f.root, &driver).unwrap();
        let before = open_fds();
        let kept = discover_roots_with(&f.root, &driver, &profiles, &opts);
        assert_eq!(open_fds(), before, "{name}: a pass with a driver root left descriptors open");
        let left = discover_roots_with(&f.root, &driver, &profiles, &ends);
        assert_eq!(format!("{left:?}"), format!("{kept:?}"), "{name}: the inventory with a driver root differs");
        let new: Vec<(i32, bool)> = open_fds().into_iter().filter(|fd| !before.contains(fd)).collect();
        assert!(new.iter().all(|(_, cloexec)| *cloexec), "{name}: a handle left open is not close-on-exec: {new:?}");
    }
    assert!(ran > 1, "fewer than two fixtures with devices");
}
