//! Fixture host roots: copies of real node layouts (fixtures/<name>/ in the repository) made
//! into a scratch directory with what git cannot store: device nodes (mknod, needs root), real
//! ELF driver libraries built with gcc, and an ld.so.cache written by `ldconfig -r`.
//!
//! The work is done by `fixtures/prepare.sh NAME DEST` so that the same trees can be made by
//! hand (see fixtures/README.md); this module runs it into a [`tempfile::TempDir`].
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! let Some(f) = actk_testsupport::fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
//! assert!(f.root.join("dev/nvidia0").exists());
//! # Ok(()) }
//! ```

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;
use tempfile::TempDir;

/// Every fixture in fixtures/, in the order they were built (the heterogeneous and empty hosts
/// are included). Tests that must hold for every real layout iterate over this.
pub const ALL: &[&str] = &[
    "nvidia-dgx-h100",
    "nvidia-gh200",
    "nvidia-dgx-a100",
    "nvidia-h200-nvl",
    "hetero-nvidia-neuron",
    "aws-inf2-48xlarge",
    "aws-trn1-32xlarge",
    "amd-mi300x",
    "amd-mi300x-cpx",
    "gaudi2",
    "empty",
];

/// Exit status of prepare.sh when it is not run as root (it cannot mknod).
const EXIT_NEEDS_ROOT: i32 = 3;

/// A prepared fixture host root; the directory is removed when this is dropped.
#[derive(Debug)]
pub struct Fixture {
    /// The host root: pass it as `--root` (contains dev/, proc/, sys/, etc/, usr/).
    pub root: PathBuf,
    _dir: TempDir,
}

impl Fixture {
    /// `rel` (a path as seen on the host, leading `/` allowed) under this fixture's root.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }
}

/// The repository's fixtures/ directory, found from this crate's `CARGO_MANIFEST_DIR`
/// (crates/actk-testsupport -> ../../fixtures).
pub fn fixtures_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .and_then(Path::parent)
        .map(|repo| repo.join("fixtures"))
        .unwrap_or_else(|| manifest.join("../../fixtures"))
}

/// Prepare fixture `name` (a directory under [`fixtures_dir`]) in a fresh temporary directory.
///
/// Returns `Ok(None)` after printing `skipping: fixture NAME needs root for mknod` to stderr
/// when not running as root, so a test can write
/// `let Some(f) = prepare("x")? else { return Ok(()) };`.
///
/// Errors: an unknown fixture name, or prepare.sh failing (its stderr is in the message).
pub fn prepare(name: &str) -> Result<Option<Fixture>> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("actk-fixture-{name}-"))
        .tempdir()
        .context("creating a temporary directory for a fixture root")?;
    let root = dir.path().join("root");
    if !prepare_at(name, &root)? {
        eprintln!("skipping: fixture {name} needs root for mknod");
        return Ok(None);
    }
    Ok(Some(Fixture { root, _dir: dir }))
}

/// Run `fixtures/prepare.sh name dest` (for benches and tests that keep their own directory).
///
/// Returns `Ok(false)` when prepare.sh reports that it needs root (exit status 3), `Ok(true)`
/// when `dest` is ready. Errors name the fixture and carry prepare.sh's stderr.
pub fn prepare_at(name: &str, dest: &Path) -> Result<bool> {
    let fixtures = fixtures_dir();
    if name.is_empty() || name.contains('/') || !fixtures.join(name).join("root").is_dir() {
        bail!("unknown fixture {name:?}: no directory {}/{name}/root (known: {})", fixtures.display(), ALL.join(", "));
    }
    let script = fixtures.join("prepare.sh");
    let out = Command::new("sh")
        .arg(&script)
        .arg(name)
        .arg(dest)
        .output()
        .with_context(|| format!("running {} {name} {}", script.display(), dest.display()))?;
    match out.status.code() {
        Some(0) => Ok(true),
        Some(EXIT_NEEDS_ROOT) => Ok(false),
        _ => bail!(
            "{} {name} {} failed ({}): {}",
            script.display(),
            dest.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

    /// Major and minor of a device number as the kernel encodes st_rdev (glibc's gnu_dev_major
    /// and gnu_dev_minor).
    fn major_minor(rdev: u64) -> (u64, u64) {
        let major = ((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0x0000_0fff);
        let minor = ((rdev >> 12) & 0xffff_ff00) | (rdev & 0x0000_00ff);
        (major, minor)
    }

    fn char_dev(f: &Fixture, rel: &str) -> (u64, u64, u32) {
        let p = f.path(rel);
        let md = std::fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(md.file_type().is_char_device(), "{} is not a character device", p.display());
        let (ma, mi) = major_minor(md.rdev());
        (ma, mi, md.permissions().mode() & 0o7777)
    }

    /// Major registered for `name` in the fixture's proc/devices (character section).
    fn proc_major(f: &Fixture, name: &str) -> u64 {
        let text = std::fs::read_to_string(f.path("proc/devices")).expect("proc/devices");
        let chars = text.split("\nBlock devices:").next().unwrap_or("");
        chars
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                Some((it.next()?.parse::<u64>().ok()?, it.next()?))
            })
            .find(|(_, n)| *n == name)
            .map(|(m, _)| m)
            .unwrap_or_else(|| panic!("no {name:?} in proc/devices"))
    }

    /// Library names the fixture's ld.so.cache lists, read back with the host's ldconfig.
    fn cached_libs(f: &Fixture) -> BTreeSet<String> {
        let out =
            Command::new("ldconfig").arg("-p").arg("-C").arg(f.path("etc/ld.so.cache")).output().expect("ldconfig -p");
        assert!(out.status.success(), "ldconfig -p failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .filter(|n| n.contains(".so"))
            .collect()
    }

    fn read(f: &Fixture, rel: &str) -> String {
        std::fs::read_to_string(f.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    /// Every sysfs/procfs symlink stays inside the root (discovery must never need to leave it).
    fn assert_links_inside(f: &Fixture) {
        let root = std::fs::canonicalize(&f.root).expect("root");
        let mut stack = vec![f.root.clone()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).expect("read_dir") {
                let e = e.expect("entry");
                let ft = e.file_type().expect("file type");
                if ft.is_symlink() {
                    let target = std::fs::read_link(e.path()).expect("readlink");
                    assert!(target.is_relative(), "{} -> {} is absolute", e.path().display(), target.display());
                    let resolved = std::fs::canonicalize(e.path())
                        .unwrap_or_else(|err| panic!("dangling link {}: {err}", e.path().display()));
                    assert!(resolved.starts_with(&root), "{} leaves the root", e.path().display());
                } else if ft.is_dir() {
                    stack.push(e.path());
                }
            }
        }
    }

    #[test]
    fn unknown_fixture_is_an_error_naming_it() {
        let err = prepare("no-such-host").expect_err("must fail").to_string();
        assert!(err.contains("no-such-host") && err.contains("nvidia-dgx-h100"), "{err}");
    }

    #[test]
    fn fixtures_dir_holds_prepare_sh() {
        assert!(fixtures_dir().join("prepare.sh").is_file(), "{}", fixtures_dir().display());
    }

    #[test]
    fn nvidia_dgx_h100() -> Result<()> {
        let Some(f) = prepare("nvidia-dgx-h100")? else {
            return Ok(());
        };
        for i in 0..8 {
            assert_eq!(char_dev(&f, &format!("dev/nvidia{i}")), (195, i, 0o666));
        }
        assert_eq!(char_dev(&f, "dev/nvidiactl"), (195, 255, 0o666));
        assert_eq!(char_dev(&f, "dev/nvidia-modeset"), (195, 254, 0o666));
        let uvm = proc_major(&f, "nvidia-uvm");
        assert_eq!(char_dev(&f, "dev/nvidia-uvm"), (uvm, 0, 0o666));
        assert_eq!(char_dev(&f, "dev/nvidia-uvm-tools"), (uvm, 1, 0o666));
        let caps = proc_major(&f, "nvidia-caps");
        assert_eq!(char_dev(&f, "dev/nvidia-caps/nvidia-cap1"), (caps, 1, 0o400));
        assert_eq!(char_dev(&f, "dev/nvidia-caps/nvidia-cap2"), (caps, 2, 0o444));

        let gpus = std::fs::read_dir(f.path("proc/driver/nvidia/gpus"))?.count();
        assert_eq!(gpus, 8);
        let info = read(&f, "proc/driver/nvidia/gpus/0000:9d:00.0/information");
        assert!(info.contains("Model: \t\t NVIDIA H100 80GB HBM3\n"), "{info}");
        assert!(info.contains("Bus Location: \t 0000:9d:00.0\n"), "{info}");
        assert!(info.contains("Device Minor: \t 4\n"), "{info}");
        let uuid = info.lines().find_map(|l| l.strip_prefix("GPU UUID: \t ")).expect("uuid line");
        let groups: Vec<usize> = uuid.trim_start_matches("GPU-").split('-').map(str::len).collect();
        assert!(uuid.starts_with("GPU-") && groups == [8, 4, 4, 4, 12], "{uuid}");
        assert!(
            read(&f, "proc/driver/nvidia/version")
                .starts_with("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build")
        );
        assert_eq!(read(&f, "sys/bus/pci/devices/0000:9d:00.0/numa_node"), "1\n");
        assert_eq!(read(&f, "sys/bus/pci/devices/0000:1b:00.0/vendor"), "0x10de\n");

        let libs = cached_libs(&f);
        for soname in ["libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1", "libGLX_nvidia.so.0"] {
            assert!(libs.contains(soname), "{soname} missing from ld.so.cache: {libs:?}");
        }
        // ldconfig keeps the soname link on the 580 file although a 535 file is still present.
        let ml = std::fs::read_link(f.path("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"))?;
        assert_eq!(ml, Path::new("libnvidia-ml.so.580.95.05"));
        assert!(f.path("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.183.01").is_file());
        let elf = std::fs::read(f.path("usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"))?;
        assert_eq!(&elf[..4], b"\x7fELF");
        assert!(f.path("usr/bin/nvidia-smi").metadata()?.permissions().mode() & 0o111 != 0);
        assert!(f.path("lib/firmware/nvidia/580.95.05/gsp_ga10x.bin").is_file());
        assert_links_inside(&f);
        Ok(())
    }

    /// Checks shared by every Neuron fixture; returns the `neuron` major.
    fn assert_neuron_devices(f: &Fixture, count: u32, device_name: &str) -> u64 {
        let major = proc_major(f, "neuron");
        let class = f.path("sys/class/neuron_device");
        assert_eq!(std::fs::read_dir(&class).expect("class dir").count(), count as usize);
        for i in 0..count {
            assert_eq!(char_dev(f, &format!("dev/neuron{i}")), (major, u64::from(i), 0o666));
            let dev = format!("sys/class/neuron_device/neuron{i}");
            assert_eq!(read(f, &format!("{dev}/core_count")), "2", "core_count has no newline");
            assert_eq!(read(f, &format!("{dev}/dev")), format!("{major}:{i}\n"));
            assert_eq!(read(f, &format!("{dev}/info/architecture/device_name")), format!("{device_name}\n"));
            let serial = read(f, &format!("{dev}/info/serial_number"));
            assert!(serial.len() == 17 && serial.trim_end().chars().all(|c| c.is_ascii_hexdigit()), "{serial:?}");
            // As the driver creates it: no parent, so no link to the PCI function.
            assert!(!f.path(&format!("{dev}/device")).exists());
        }
        assert_eq!(read(f, "sys/module/neuron/version"), "2.24.7.0\n");
        major
    }

    /// `connected_devices` of neuronN parsed as the driver prints it ("a, b, c\n").
    fn neuron_links(f: &Fixture, i: u32) -> Vec<u32> {
        read(f, &format!("sys/class/neuron_device/neuron{i}/connected_devices"))
            .trim_end()
            .split(", ")
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().expect("number"))
            .collect()
    }

    #[test]
    fn aws_inf2_48xlarge() -> Result<()> {
        let Some(f) = prepare("aws-inf2-48xlarge")? else {
            return Ok(());
        };
        assert_neuron_devices(&f, 12, "Inferentia2");
        assert_eq!(neuron_links(&f, 0), [11, 1]);
        assert_eq!(neuron_links(&f, 5), [4, 6]);
        assert_eq!(neuron_links(&f, 11), [10, 0]);
        // The ring is symmetric: every link has its way back.
        for i in 0..12 {
            for j in neuron_links(&f, i) {
                assert!(neuron_links(&f, j).contains(&i), "{i} -> {j} has no way back");
            }
        }
        assert_eq!(read(&f, "sys/bus/pci/devices/0000:80:1e.0/device"), "0x7264\n");
        assert!(f.path("sys/bus/pci/drivers/neuron/0000:20:1d.0").exists());
        assert!(f.path("opt/aws/neuron/bin/neuron-ls").is_file());
        assert_links_inside(&f);
        Ok(())
    }

    #[test]
    fn aws_trn1_32xlarge() -> Result<()> {
        let Some(f) = prepare("aws-trn1-32xlarge")? else {
            return Ok(());
        };
        assert_neuron_devices(&f, 16, "Trainium1");
        assert_eq!(neuron_links(&f, 0), [12, 3, 4, 1]);
        // A 4x4 torus: four distinct neighbours each, and the relation is symmetric.
        for i in 0..16 {
            let links = neuron_links(&f, i);
            assert_eq!(links.iter().collect::<BTreeSet<_>>().len(), 4, "neuron{i}: {links:?}");
            for j in links {
                assert!(neuron_links(&f, j).contains(&i), "{i} -> {j} has no way back");
            }
        }
        assert_eq!(read(&f, "sys/bus/pci/devices/0000:a0:1b.0/numa_node"), "1\n");
        assert_links_inside(&f);
        Ok(())
    }

    #[test]
    fn hetero_nvidia_neuron() -> Result<()> {
        let Some(f) = prepare("hetero-nvidia-neuron")? else {
            return Ok(());
        };
        assert_neuron_devices(&f, 2, "Inferentia2");
        assert_eq!(read(&f, "sys/class/neuron_device/neuron0/connected_devices"), "\n");
        // Device Minor is not bus order here: the first GPU by bus id is /dev/nvidia1.
        let info = read(&f, "proc/driver/nvidia/gpus/0000:00:1b.0/information");
        assert!(info.contains("Device Minor: \t 1\n"), "{info}");
        assert_eq!(char_dev(&f, "dev/nvidia1"), (195, 1, 0o666));
        assert_eq!(char_dev(&f, "dev/nvidia0"), (195, 0, 0o666));
        assert!(!f.path("dev/nvidia2").exists());
        let majors = [proc_major(&f, "nvidia-uvm"), proc_major(&f, "nvidia-caps"), proc_major(&f, "neuron")];
        assert_eq!(majors.iter().collect::<BTreeSet<_>>().len(), 3, "{majors:?}");
        assert_eq!(read(&f, "sys/bus/pci/devices/0000:00:1c.0/numa_node"), "-1\n");
        assert!(cached_libs(&f).contains("libcuda.so.1"));
        assert_links_inside(&f);
        Ok(())
    }

    /// `properties` of a KFD topology node as name -> value.
    fn kfd_props(f: &Fixture, rel: &str) -> std::collections::BTreeMap<String, u64> {
        read(f, rel)
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    }

    #[test]
    fn amd_mi300x() -> Result<()> {
        let Some(f) = prepare("amd-mi300x")? else {
            return Ok(());
        };
        let kfd = proc_major(&f, "kfd");
        assert_eq!(char_dev(&f, "dev/kfd"), (kfd, 0, 0o660)); // root:render 0660, as Ubuntu makes it (fixtures/generate.py)
        let nodes = "sys/class/kfd/kfd/topology/nodes";
        let count = std::fs::read_dir(f.path(nodes))?.count();
        assert_eq!(count, 10, "2 CPU nodes + 8 GPU nodes");
        let mut render_minors = Vec::new();
        for n in 0..count {
            let p = kfd_props(&f, &format!("{nodes}/{n}/properties"));
            if p["simd_count"] == 0 {
                assert!(n < 2, "CPU nodes come first");
                continue;
            }
            assert_eq!((p["vendor_id"], p["device_id"], p["gfx_target_version"]), (0x1002, 0x74a1, 90402));
            let minor = p["drm_render_minor"];
            assert_eq!(char_dev(&f, &format!("dev/dri/renderD{minor}")), (226, minor, 0o660));
            // location_id is bus << 8 | devfn; the render node's device link leads to that bus.
            let bus = p["location_id"] >> 8;
            let pci = std::fs::canonicalize(f.path(&format!("sys/class/drm/renderD{minor}/device")))?;
            assert!(pci.ends_with(format!("0000:{bus:02x}:00.0")), "{}", pci.display());
            // XGMI to each of the 7 other GPUs.
            let links = p["io_links_count"];
            let xgmi = (0..links)
                .filter(|l| kfd_props(&f, &format!("{nodes}/{n}/io_links/{l}/properties"))["type"] == 11)
                .count();
            assert_eq!(xgmi, 7, "node {n}");
            render_minors.push(minor);
        }
        assert_eq!(render_minors, (128..136).collect::<Vec<_>>());
        // card0 is the BMC's VGA, so the first MI300X is card1.
        assert_eq!(read(&f, "sys/class/drm/card0/device/vendor"), "0x1a03\n");
        assert_eq!(read(&f, "sys/class/drm/card1/device/device"), "0x74a1\n");
        assert_links_inside(&f);
        Ok(())
    }

    #[test]
    fn gaudi2() -> Result<()> {
        let Some(f) = prepare("gaudi2")? else {
            return Ok(());
        };
        let text = read(&f, "proc/devices");
        let accel_majors: Vec<u64> = text
            .lines()
            .filter(|l| l.trim_end().ends_with(" accel"))
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect();
        assert_eq!(accel_majors.len(), 2, "{text}");
        assert!(accel_majors.contains(&261));
        let ctrl = accel_majors.iter().copied().find(|m| *m != 261).expect("control major");
        let mut modules = BTreeSet::new();
        for i in 0..8u64 {
            assert_eq!(char_dev(&f, &format!("dev/accel/accel{i}")), (261, i, 0o666));
            assert_eq!(char_dev(&f, &format!("dev/accel/accel_controlD{i}")), (ctrl, i, 0o666));
            let dev = format!("sys/class/accel/accel{i}/device");
            assert_eq!(read(&f, &format!("{dev}/device_type")), "GAUDI2\n");
            let bdf = read(&f, &format!("{dev}/pci_addr"));
            let linked = std::fs::canonicalize(f.path(&dev))?;
            assert!(linked.ends_with(bdf.trim_end()), "{bdf:?} vs {}", linked.display());
            modules.insert(read(&f, &format!("{dev}/module_id")).trim_end().parse::<u32>()?);
        }
        assert_eq!(modules, (0..8).collect(), "module ids are a permutation of 0..8");
        assert_eq!(read(&f, "sys/class/accel/accel7/device/pci_addr"), "0000:4d:00.0\n");
        assert!(!f.path("sys/class/accel/accel_controlD0/device").exists());
        assert_links_inside(&f);
        Ok(())
    }

    #[test]
    fn empty_host_has_no_accelerator() -> Result<()> {
        let Some(f) = prepare("empty")? else {
            return Ok(());
        };
        assert_eq!(char_dev(&f, "dev/null"), (1, 3, 0o666));
        let text = read(&f, "proc/devices");
        for vendor in ["nvidia", "neuron", "kfd", "accel", "habanalabs"] {
            assert!(!text.lines().any(|l| l.ends_with(&format!(" {vendor}"))), "{vendor} in {text}");
        }
        let devs: Vec<String> = std::fs::read_dir(f.path("dev"))?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?;
        assert!(devs.iter().all(|d| !d.starts_with("nvidia") && !d.starts_with("neuron") && d != "kfd"), "{devs:?}");
        assert!(f.path("etc/ld.so.cache").is_file());
        assert_links_inside(&f);
        Ok(())
    }

    /// Every fixture in ALL has the files prepare.sh and discovery rely on.
    #[test]
    fn every_fixture_is_complete() {
        for name in ALL {
            let dir = fixtures_dir().join(name);
            for file in ["root/proc/devices", "root/etc/ld.so.conf", "nodes.tsv", "libs.tsv", "SOURCES.md"] {
                assert!(dir.join(file).is_file(), "{name}: {file} missing");
            }
        }
    }

    #[test]
    fn prepare_is_idempotent() -> Result<()> {
        let Some(f) = prepare("nvidia-dgx-h100")? else {
            return Ok(());
        };
        assert!(prepare_at("nvidia-dgx-h100", &f.root)?);
        assert_eq!(char_dev(&f, "dev/nvidia7"), (195, 7, 0o666));
        assert!(cached_libs(&f).contains("libcuda.so.1"));
        Ok(())
    }
}
