//! The release actk-runtime and actk-hook, as scripts/build-release.sh builds them (static musl
//! with dlmalloc, or static glibc when the musl target is missing; `make test` builds them with
//! `--shims-only` before the tests), with the real runc. Every other end-to-end test runs the
//! debug build, which is dynamically linked; these two differ in what a static program lacks:
//! std learns argv from its own `main` wrapper (left out of actk-runtime), and a static musl
//! program cannot dlopen, so NVML is read by the `actk` next to it.
//!
//! The binaries are copied into a directory of their own with the debug `actk`, as
//! `actk node setup` and target/dist install them side by side.

use actk_testsupport::engines::{self, ActkConfig, Bundle, require_root, skip_or_fail, text, unique_name};
use actk_testsupport::fixture;
use actk_testsupport::nvml_double::State;
use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

/// The directory build-release.sh wrote the shims to: the musl target's when built, else the
/// glibc one's (what the script falls back to).
fn release_dir() -> Option<PathBuf> {
    let t = engines::target_dir();
    ["x86_64-unknown-linux-musl", "x86_64-unknown-linux-gnu", "aarch64-unknown-linux-musl", "aarch64-unknown-linux-gnu"]
        .iter()
        .map(|triple| t.join(triple).join("release"))
        .find(|d| d.join("actk-runtime").is_file() && d.join("actk-hook").is_file())
}

/// The shims (and, with `with_actk`, the debug `actk`) copied into a fresh directory.
fn install(with_actk: bool) -> Option<tempfile::TempDir> {
    if !require_root() {
        return None;
    }
    let Some(from) = release_dir() else {
        skip_or_fail("Run scripts/build-release.sh --shims-only.", "the release actk-runtime is not built");
        return None;
    };
    let dir = tempfile::Builder::new().prefix("actk-release-").tempdir().unwrap();
    let mut names = vec![(from.join("actk-runtime"), "actk-runtime"), (from.join("actk-hook"), "actk-hook")];
    if with_actk {
        names.push((engines::bin("actk"), "actk"));
    }
    for (src, name) in names {
        let to = dir.path().join(name);
        std::fs::copy(&src, &to).unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    Some(dir)
}

/// Whether an ELF64 little-endian executable has no program interpreter (no `PT_INTERP`
/// program header, ELF gABI): the kernel runs it without a dynamic loader.
fn is_static(exe: &Path) -> bool {
    let b = std::fs::read(exe).unwrap();
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    assert_eq!(&b[..6], b"\x7fELF\x02\x01", "{} is not a 64-bit little-endian ELF file", exe.display());
    let phoff = u64::from_le_bytes(b[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    const PT_INTERP: u32 = 3;
    !(0..phnum).any(|i| {
        let o = phoff + i * phentsize;
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) == PT_INTERP
    })
}

/// `actk-runtime run` of a busybox bundle that lists its accelerator nodes, with
/// `ACTK_CONFIG=cfg`, or (`None`) as this process's environment has it.
fn run_with(dir: &Path, cfg: Option<&Path>, env: &[&str]) -> Output {
    let list = "for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c \"$f\" ] && echo \"$f\"; done; true";
    let bundle = Bundle::busybox(&["sh", "-c", list], env).expect("bundle");
    let id = unique_name("e2e-release");
    let config: Vec<(&str, &std::ffi::OsStr)> = cfg.map(|c| ("ACTK_CONFIG", c.as_os_str())).into_iter().collect();
    engines::command_output(
        dir.join("actk-runtime"),
        &["run", "--bundle", bundle.path().to_str().unwrap(), id.as_str()],
        &config,
    )
}

fn run(dir: &Path, cfg: &Path, env: &[&str]) -> Output {
    run_with(dir, Some(cfg), env)
}

fn nodes(out: &str) -> BTreeSet<String> {
    out.lines().map(str::trim).filter(|l| l.starts_with("/dev/")).map(String::from).collect()
}

#[test]
fn the_static_runtime_passes_its_arguments_and_injects_the_requested_gpus() {
    let Some(dir) = install(false) else { return };
    let rt = dir.path().join("actk-runtime");
    assert!(is_static(&rt), "{} is dynamically linked", rt.display());
    assert!(!is_static(&engines::bin("actk")), "the debug actk is dynamically linked");
    // `--version` alone: actk's line, then runc's own (argv reached runc unchanged).
    let o = engines::command_output(&rt, &["--version"], &[]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.starts_with("actk-runtime "), "{out}");
    assert!(out.contains("runc version"), "runc did not get --version:\n{out}");

    let Some(fx) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let config = ActkConfig::new(&fx.root).unwrap();
    let cfg = config.write().unwrap();
    let o = run(dir.path(), &cfg, &["NVIDIA_VISIBLE_DEVICES=1,6"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let got = nodes(&out);
    for want in ["/dev/nvidia1", "/dev/nvidia6", "/dev/nvidiactl", "/dev/nvidia-uvm"] {
        assert!(got.contains(want), "no {want} in the container:\n{out}");
    }
    for other in [0, 2, 3, 4, 5, 7] {
        assert!(!got.contains(&format!("/dev/nvidia{other}")), "GPU {other} was not asked for:\n{out}");
    }
}

/// As `actk node setup` installs it: the static runtime with its config `actk.toml` beside
/// it and no ACTK_CONFIG (an engine runs the runtime with its own environment) finds that
/// config (the fixture's root), and injects what it serves.
#[test]
fn the_static_runtime_reads_the_actk_toml_beside_it() {
    if std::env::var_os("ACTK_CONFIG").is_some() {
        skip_or_fail("Unset ACTK_CONFIG.", "ACTK_CONFIG is set in the test's environment");
        return;
    }
    let Some(dir) = install(false) else { return };
    let Some(fx) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let mut config = ActkConfig::new(&fx.root).unwrap();
    // A log file only this config names: no other config (/etc/actk's) can pass for it.
    let log = dir.path().join("actk-runtime.log");
    config.extra = format!("log_file = {:?}\n", log.display().to_string());
    std::fs::write(dir.path().join("actk.toml"), config.toml()).unwrap();
    let o = run_with(dir.path(), None, &["NVIDIA_VISIBLE_DEVICES=3"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let got = nodes(&out);
    assert!(got.contains("/dev/nvidia3") && got.contains("/dev/nvidiactl"), "{out}");
    assert!(!got.contains("/dev/nvidia0"), "only GPU 3 was asked for:\n{out}");
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(logged.contains("nvidia.com/gpu"), "the runtime logs to the file its actk.toml names: {logged:?}");
}

#[test]
fn the_static_runtime_reads_nvml_through_actk_for_a_mig_device() {
    let Some(dir) = install(true) else { return };
    let Some(fx) = fixture::prepare("nvidia-dgx-a100").unwrap() else { return };
    let state = State::of(&fx.root).unwrap();
    let config = ActkConfig::new(&fx.root).unwrap();
    let cfg = config.write().unwrap();
    let mig = state.migs(2)[0];
    let env = format!("NVIDIA_VISIBLE_DEVICES={}", mig.get("uuid"));
    let o = run(dir.path(), &cfg, &[&env]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{env}: {out}\n{err}");
    let got = nodes(&out);
    assert!(got.contains("/dev/nvidia2"), "no parent GPU node:\n{out}");
    assert_eq!(got.iter().filter(|n| n.starts_with("/dev/nvidia-caps/")).count(), 2, "GI and CI caps:\n{out}");
    for other in [0, 1, 3, 4, 5, 6, 7] {
        assert!(!got.contains(&format!("/dev/nvidia{other}")), "GPU {other} was not asked for:\n{out}");
    }

    // Without the `actk` beside it, a static musl runtime cannot read NVML: the container is not
    // started, and the message says what to install or use instead.
    std::fs::remove_file(dir.path().join("actk")).unwrap();
    let o = run(dir.path(), &cfg, &[&env]);
    let (out, err) = text(&o);
    if actk_is_musl(&dir.path().join("actk-runtime")) {
        assert!(!o.status.success(), "{out}\n{err}");
        assert!(err.contains("statically linked") && err.contains("actk cdi generate"), "{err}");
    } else {
        // glibc's static dlopen loads the fixture's NVML double itself.
        assert!(o.status.success(), "{out}\n{err}");
    }
}

/// Whether the executable carries musl's C library (its version string).
fn actk_is_musl(exe: &Path) -> bool {
    let bytes = std::fs::read(exe).unwrap();
    !bytes.windows(5).any(|w| w == b"GLIBC")
}

/// The release build run from inside a cargo test, as the cluster harness builds the image
/// (scripts/k8s/actk-image.sh → scripts/build-release.sh), finds nothing to do after the same
/// build from a shell. Cargo's test environment (CARGO_MANIFEST_DIR and friends) must not reach
/// the build scripts: ring's reads CARGO_MANIFEST_DIR, and a changed value rebuilt ring, rustls,
/// kube and every binary above them (ten minutes of stop 38's CI run;
/// scripts/lib/cargo-outside-test.sh). The first call, with the variables removed as a shell
/// would have them, brings the build up to date; the second, with this test's own environment,
/// must compile nothing.
#[test]
fn release_build_from_a_cargo_test_reuses_the_shells_build() {
    if !engines::target_dir().join("release").join("actk").is_file() {
        skip_or_fail("Run scripts/build-release.sh.", "the release actk is not built");
        return;
    }
    assert!(
        std::env::var_os("CARGO_MANIFEST_DIR").is_some(),
        "cargo test sets CARGO_MANIFEST_DIR; without it this test checks nothing"
    );
    let script = engines::workspace_root().join("scripts/build-release.sh");
    let run = |as_a_shell: bool| -> Output {
        // The whole build, as `make test` and the image run it: `--cli-only` selects other
        // packages, so Cargo would unify other features and build the CLI again for that alone.
        let mut cmd = std::process::Command::new(&script);
        if as_a_shell {
            for (k, _) in std::env::vars_os() {
                let k = k.to_string_lossy().into_owned();
                if k == "OUT_DIR"
                    || (k.starts_with("CARGO_") && k != "CARGO_HOME" && !k.starts_with("CARGO_TARGET_DIR"))
                {
                    cmd.env_remove(&k);
                }
            }
        }
        cmd.output().expect("running scripts/build-release.sh")
    };
    let first = run(true);
    assert!(first.status.success(), "build-release.sh as a shell runs it: {:?}", text(&first));
    let second = run(false);
    assert!(second.status.success(), "build-release.sh from the test: {:?}", text(&second));
    let compiled: Vec<&str> = std::str::from_utf8(&second.stderr)
        .unwrap_or("")
        .lines()
        .filter(|l| l.trim_start().starts_with("Compiling "))
        .collect();
    assert!(compiled.is_empty(), "the build from a cargo test compiled again what a shell's had built: {compiled:?}");
}

/// A symbol name without the hashes of its build, as scripts/lib/hot-text-link.sh matches a
/// listed name that this build spells otherwise: legacy mangling's trailing `17h<16 hex>E` is
/// dropped, v0's crate disambiguators `Cs<base62>_` become `Cs_`.
fn without_hashes(name: &str) -> String {
    let mut s = name;
    if let Some(cut) = s.len().checked_sub(20)
        && s.is_char_boundary(cut)
    {
        let tail = &s[cut..];
        if tail.starts_with("17h") && tail.ends_with('E') && tail[3..19].bytes().all(|b| b.is_ascii_hexdigit()) {
            s = &s[..cut];
        }
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("Cs") {
        out.push_str(&rest[..i + 2]);
        let after = &rest[i + 2..];
        let n = after.bytes().take_while(u8::is_ascii_alphanumeric).count();
        if n > 0 && after.as_bytes().get(n) == Some(&b'_') {
            rest = &after[n..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The Rust functions a container start runs (crates/actk-runtime/hot-text.txt) lie together in
/// the release actk-runtime, as scripts/lib/hot-text-link.sh links it (issue 31): a create then
/// faults in about 15 64 KiB windows of text instead of 38 (docs/performance.md). Reads the
/// binary's symbol table (`nm`): at least 90 % of the listed functions must be there, found as
/// written or without their build's hashes, and the span from the first to the end of the last
/// must be no more than 1.2 times their total size plus 64 KiB (packed: 1.00; the same
/// functions where a plain link puts them: 3.3). Fails when the list has gone stale (functions
/// renamed or gone: run scripts/hot-text.sh) or the link stopped ordering.
#[test]
fn the_release_runtime_packs_the_functions_a_start_runs() {
    let Some(dir) = release_dir() else {
        skip_or_fail("Run scripts/build-release.sh --shims-only.", "the release actk-runtime is not built");
        return;
    };
    let exe = dir.join("actk-runtime");
    let nm = std::process::Command::new("nm").arg("-S").arg("--defined-only").arg(&exe).output().expect("running nm");
    assert!(nm.status.success(), "nm {}: {:?}", exe.display(), text(&nm));
    // "ADDRESS SIZE TYPE NAME" for the functions (text symbols, weak ones included).
    let mut at: std::collections::HashMap<String, (u64, u64)> = std::collections::HashMap::new();
    let mut by_key: std::collections::HashMap<String, Vec<String>> = std::collections::HashMap::new();
    for line in String::from_utf8_lossy(&nm.stdout).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 4 || !matches!(f[2], "t" | "T" | "w" | "W") {
            continue;
        }
        let (Ok(addr), Ok(size)) = (u64::from_str_radix(f[0], 16), u64::from_str_radix(f[1], 16)) else { continue };
        at.insert(f[3].to_string(), (addr, size));
        by_key.entry(without_hashes(f[3])).or_default().push(f[3].to_string());
    }
    let list = std::fs::read_to_string(engines::workspace_root().join("crates/actk-runtime/hot-text.txt")).unwrap();
    // Rust's functions only (legacy `_ZN` and v0 `_R` mangling): the C library's differ between
    // the musl build the list comes from and the glibc fallback (glibc's memcpy is an IFUNC, most
    // of musl's start-up has no glibc twin), and the link matches them by name only.
    let listed: Vec<&str> =
        list.lines().map(str::trim).filter(|l| l.starts_with("_ZN") || l.starts_with("_R")).collect();
    assert!(
        listed.len() > 100,
        "hot-text.txt lists {} Rust functions: regenerate it (scripts/hot-text.sh)",
        listed.len()
    );
    let mut placed: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    let mut missing = Vec::new();
    for name in &listed {
        let names = match at.get(*name) {
            Some(_) => vec![name.to_string()],
            None => by_key.get(&without_hashes(name)).cloned().unwrap_or_default(),
        };
        if names.is_empty() {
            missing.push(*name);
        }
        for n in names {
            let (addr, size) = at[&n];
            placed.insert(addr, size);
        }
    }
    assert!(
        missing.len() * 10 <= listed.len(),
        "{} of the {} functions in hot-text.txt are not in {} (run scripts/hot-text.sh): {:?}",
        missing.len(),
        listed.len(),
        exe.display(),
        &missing[..missing.len().min(10)]
    );
    let first = *placed.keys().next().unwrap();
    let end = placed.iter().map(|(a, s)| a + s).max().unwrap();
    let total: u64 = placed.values().sum();
    assert!(
        (end - first) as f64 <= 1.2 * total as f64 + 65536.0,
        "the {} functions a start runs ({total} bytes) span {} bytes of {}: not packed (is it linked by scripts/lib/hot-text-link.sh?)",
        placed.len(),
        end - first,
        exe.display()
    );
}

#[test]
fn hashes_are_left_out_as_the_linker_matches_names() {
    assert_eq!(without_hashes("_ZN9actk_core4plan9plan_with17h2fa75e689b44afacE"), "_ZN9actk_core4plan9plan_with");
    assert_eq!(
        without_hashes("_RNvMs_NtNtNtNtCsaz6eC2DG7lh_3std3sys7process4unix6commonNtB4_7Command8setup_io"),
        "_RNvMs_NtNtNtNtCs_3std3sys7process4unix6commonNtB4_7Command8setup_io"
    );
    assert_eq!(without_hashes("memcpy"), "memcpy");
    assert_eq!(without_hashes("_ZN4core3fmt5write17hE"), "_ZN4core3fmt5write17hE");
}
