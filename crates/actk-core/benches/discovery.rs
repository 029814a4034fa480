//! Discovery + CDI generation cost on real node layouts: the DGX H100 fixture (8 GPUs) and a
//! synthetic 64-GPU host built at setup time from a prepared copy of the same fixture.
//!
//! What one iteration measures: discovery over the root followed by
//! `cdi::generate::generate_all` with default options, i.e. what `actk cdi generate --root R`
//! does minus writing the file. Profiles are loaded once, outside the timed loop. The 8/64 GPU
//! pair reads procfs/sysfs only (NVML off: the 64-GPU host is synthetic and the NVML double
//! knows 8 GPUs); a third measurement adds NVML (the fixture's test double: MIG devices, NVLink)
//! on the DGX A100 with 17 MIG devices, and the bench prints its cost next to the 8-GPU one.
//!
//! Targets (issue 2): under 10 ms for 8 GPUs; 64 devices under 2x the 8-device cost. After the
//! Criterion run the bench prints both medians and their ratio (read back from Criterion's
//! `estimates.json`), so `cargo bench -p actk-core --bench discovery` alone gives the figures.
//!
//! Needs root (fixtures are prepared with mknod by fixtures/prepare.sh); otherwise it prints
//! why and measures nothing.

use actk_core::cdi::generate::{GenerateOptions, generate_all};
use actk_core::discover::{DiscoverOptions, discover_with};
use actk_core::profile::{self, Profile};
use criterion::Criterion;
use std::fs;
use std::hint::black_box;
use std::path::{Path, PathBuf};

const GROUP: &str = "discover_generate";
const ID_8: &str = "dgx-h100-8gpu";
const ID_64: &str = "synthetic-64gpu";
const ID_MIG: &str = "dgx-a100-8gpu-17mig-nvml";
/// GPUs on the synthetic host: the DGX's 8, repeated over 8 PCI domains.
const SYNTHETIC_GPUS: u32 = 64;

/// Turn a prepared DGX H100 root into a 64-GPU host: for PCI domains 0001..0007, a copy of each
/// of the 8 GPUs at the same bus number (as on a multi-segment host), with its own procfs
/// `information` (UUID, Bus Location, Device Minor), PCI sysfs entry (numa_node) and
/// /dev/nvidiaN node (195:N). The layout is otherwise the DGX's: same driver, libraries,
/// control nodes. Errors name the path that failed.
fn extend_to_64(root: &Path) -> Result<(), String> {
    let gpus_dir = root.join("proc/driver/nvidia/gpus");
    let mut originals: Vec<String> = fs::read_dir(&gpus_dir)
        .map_err(|e| format!("{}: {e}", gpus_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    originals.sort();
    if originals.len() != 8 {
        return Err(format!("{}: expected the DGX's 8 GPUs, found {}", gpus_dir.display(), originals.len()));
    }
    let mut minor = originals.len() as u32;
    for domain in 1..SYNTHETIC_GPUS / 8 {
        for bdf in &originals {
            let new_bdf = format!("{domain:04x}{}", &bdf[4..]);
            let info_path = gpus_dir.join(bdf).join("information");
            let info = fs::read_to_string(&info_path).map_err(|e| format!("{}: {e}", info_path.display()))?;
            let info: String = info
                .lines()
                .map(|l| match l.split_once(':') {
                    Some(("GPU UUID", _)) => format!("GPU UUID: \t GPU-5e7e7e7e-0000-4000-8000-{:012x}", minor),
                    Some(("Bus Location", _)) => format!("Bus Location: \t {new_bdf}"),
                    Some(("Device Minor", _)) => format!("Device Minor: \t {minor}"),
                    _ => l.to_string(),
                })
                .map(|l| l + "\n")
                .collect();
            let dir = gpus_dir.join(&new_bdf);
            fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            fs::write(dir.join("information"), info).map_err(|e| format!("{}: {e}", dir.display()))?;

            let numa_src = root.join("sys/bus/pci/devices").join(bdf).join("numa_node");
            let numa = fs::read_to_string(&numa_src).map_err(|e| format!("{}: {e}", numa_src.display()))?;
            let pci_dir = root.join(format!("sys/devices/pci{domain:04x}:00/{new_bdf}"));
            fs::create_dir_all(&pci_dir).map_err(|e| format!("{}: {e}", pci_dir.display()))?;
            fs::write(pci_dir.join("numa_node"), numa).map_err(|e| format!("{}: {e}", pci_dir.display()))?;
            let link = root.join("sys/bus/pci/devices").join(&new_bdf);
            std::os::unix::fs::symlink(format!("../../../devices/pci{domain:04x}:00/{new_bdf}"), &link)
                .map_err(|e| format!("{}: {e}", link.display()))?;

            use rustix::fs::{CWD, FileType, Mode, makedev, mknodat};
            let node = root.join(format!("dev/nvidia{minor}"));
            mknodat(CWD, &node, FileType::CharacterDevice, Mode::from_raw_mode(0o666), makedev(195, minor))
                .map_err(|e| format!("mknod {}: {e}", node.display()))?;
            minor += 1;
        }
    }
    Ok(())
}

/// One iteration: discovery plus every CDI spec; returns the device count (checked in setup).
/// Never inlined, so that `valgrind --tool=callgrind --toggle-collect=*discover_and_generate*`
/// can count the instructions of one iteration.
#[inline(never)]
fn discover_and_generate(root: &Path, profiles: &[Profile], opts: &GenerateOptions) -> usize {
    discover_generate_with(root, profiles, opts, false)
}

/// The same with NVML read (`nvml`) or not; returns whole devices plus MIG devices. Never
/// inlined either (`--toggle-collect=*discover_generate_with*` counts all three measurements).
#[inline(never)]
fn discover_generate_with(root: &Path, profiles: &[Profile], opts: &GenerateOptions, nvml: bool) -> usize {
    let inv = discover_with(root, profiles, &DiscoverOptions { nvml, ..Default::default() });
    let specs = generate_all(profiles, &inv, None, opts).unwrap_or_default();
    black_box(&specs);
    inv.vendors.iter().map(|v| v.devices.len()).sum::<usize>() + inv.mig_devices().count()
}

/// Where Criterion writes its results: $CRITERION_HOME, else $CARGO_TARGET_DIR/criterion, else
/// the workspace's target/criterion (this crate is crates/actk-core).
fn output_dir() -> PathBuf {
    if let Some(h) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(h);
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(t).join("criterion");
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/criterion")
}

/// Median (ns) of benchmark `id` from Criterion's `new/estimates.json`; `None` if it did not run.
fn median_ns(out: &Path, id: &str) -> Option<f64> {
    let text = fs::read_to_string(out.join(GROUP).join(id).join("new/estimates.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["median"]["point_estimate"].as_f64()
}

fn main() {
    let out = output_dir();
    let mut c = Criterion::default().output_directory(&out).configure_from_args();
    let profiles = profile::builtin();
    let opts = GenerateOptions::default();

    let prepare = |name: &str| match actk_testsupport::fixture::prepare(name) {
        Ok(Some(f)) => Some(f),
        Ok(None) => None, // prepare() said why (not root)
        Err(e) => {
            eprintln!("discovery bench: preparing fixture {name}: {e:#}");
            None
        }
    };
    let (Some(dgx), Some(big), Some(a100)) =
        (prepare("nvidia-dgx-h100"), prepare("nvidia-dgx-h100"), prepare("nvidia-dgx-a100"))
    else {
        eprintln!("discovery bench: fixtures unavailable; nothing measured");
        return;
    };
    if let Err(e) = extend_to_64(&big.root) {
        eprintln!("discovery bench: building the synthetic 64-GPU host: {e}");
        std::process::exit(1);
    }
    // A bench that silently measured an empty host would be worthless: check the counts first.
    for (root, want) in [(&dgx.root, 8), (&big.root, SYNTHETIC_GPUS as usize)] {
        let got = discover_and_generate(root, &profiles, &opts);
        if got != want {
            eprintln!("discovery bench: {} has {got} devices, expected {want}", root.display());
            std::process::exit(1);
        }
    }
    if discover_generate_with(&a100.root, &profiles, &opts, true) != 8 + 17 {
        eprintln!("discovery bench: the DGX A100's NVML double did not give 8 GPUs and 17 MIG devices");
        std::process::exit(1);
    }

    {
        let mut g = c.benchmark_group(GROUP);
        g.bench_function(ID_8, |b| b.iter(|| discover_and_generate(black_box(&dgx.root), &profiles, &opts)));
        g.bench_function(ID_64, |b| b.iter(|| discover_and_generate(black_box(&big.root), &profiles, &opts)));
        g.bench_function(ID_MIG, |b| b.iter(|| discover_generate_with(black_box(&a100.root), &profiles, &opts, true)));
        g.finish();
    }
    c.final_summary();

    if let (Some(m8), Some(m64)) = (median_ns(&out, ID_8), median_ns(&out, ID_64)) {
        let ratio = m64 / m8;
        println!(
            "discovery+generate medians: 8 GPUs {:.3} ms (target < 10 ms: {}), 64 GPUs {:.3} ms; ratio 64/8 = {ratio:.2}x (target < 2x: {})",
            m8 / 1e6,
            if m8 < 10e6 { "met" } else { "MISSED" },
            m64 / 1e6,
            if ratio < 2.0 { "met" } else { "MISSED" },
        );
        if let Some(mig) = median_ns(&out, ID_MIG) {
            println!(
                "with NVML (DGX A100, 8 GPUs + 17 MIG devices through the test double): {:.3} ms = {:.2}x the procfs-only 8 GPUs",
                mig / 1e6,
                mig / m8
            );
        }
    }
}
