//! Property tests of the file parsers actk runs on every container start: the config file
//! (config.rs, /etc/actk/config.toml), oci-hooks(5) hooks.d files (hooksd.rs), vendor profiles
//! (profile.rs, /etc/actk/profiles.d) and the host's ld.so.cache (ldcache.rs).
//!
//! Invariants: any input gives a value or an error; never a panic; every error names the file
//! (and, for profiles, a line inside the file). ld.so.cache: arbitrary bytes and real caches
//! (written by `ldconfig -r`, fuzz/corpus/ldcache) with bytes flipped, truncated or header
//! fields rewritten; whatever parses has entries that lie inside the file.
//!
//! Cases per property: `PROPTEST_CASES` (default 256); counts go to `$ACTK_VERIFY_COUNTS`.

use actk_core::config::Config;
use actk_core::{hooksd, ldcache, profile};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::Value;
use std::path::Path;

mod common;
use common::check;

/// Lines built from pieces of the format, plus anything at all.
fn lines(pieces: Vec<&'static str>) -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec(prop::sample::select(pieces), 0..16).prop_map(|t| t.concat()),
        1 => any::<String>(),
    ]
}

#[test]
fn config_toml_any_text_parses_or_names_the_file() {
    let text = lines(vec![
        "runtimes = [\"runc\", \"crun\"]\n",
        "runtimes = \"runc\"\n",
        "spec_dirs = [\"/etc/cdi\"]\n",
        "hooks_dirs = []\n",
        "root = \"/\"\n",
        "root = 1\n",
        "profiles_dir = \"/p\"\n",
        "log_file = \"/l\"\n",
        "log_level = \"debug\"\n",
        "hook_path = \"/h\"\n",
        "[nvidia]\n",
        "default_capabilities = [\"utility\"]\n",
        "unknown = true\n",
        "[other]\n",
        "# comment\n",
        "\n",
        "= \n",
        "[",
        "\"",
        "'''",
        "\\u0000",
        "\u{feff}",
        "a.b.c = 1\n",
        "[[nvidia]]\n",
    ]);
    check("config.toml", text, |text| {
        let path = Path::new("/etc/actk/config.toml");
        match Config::parse(&text, path) {
            Ok(c) => {
                // What parses renders (actk config show) and parses back to the same config.
                let again = Config::parse(&c.to_toml(), path).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(again, c);
            }
            Err(e) => prop_assert!(e.to_string().starts_with("config file /etc/actk/config.toml: "), "{}", e),
        }
        Ok(())
    });
}

#[test]
fn hooks_d_files_parse_or_name_the_file_and_merging_never_panics() {
    let doc = (
        prop::sample::select(vec!["1.0.0", "1.0", ""]),
        prop::sample::select(vec!["/usr/bin/oci-hook", "relative/hook", ""]),
        prop::collection::vec(prop::sample::select(vec!["prestart", "createRuntime", "poststop", "bogus"]), 0..3),
        prop::collection::vec(prop::sample::select(vec![
            "\"always\": true", "\"always\": false", "\"hasBindMounts\": true", "\"commands\": [\".*sh$\"]",
            "\"commands\": [\"(\"]", "\"annotations\": {\"^com\\\\.example\\\\.\": \".*\"}", "\"annotations\": {\"a\": \"[\"}",
            "\"bogus\": 1",
        ]), 0..3),
    )
        .prop_map(|(v, p, stages, when)| {
            let stages: Vec<String> = stages.iter().map(|s| format!("{s:?}")).collect();
            format!(
                "{{\"version\": \"{v}\", \"hook\": {{\"path\": \"{p}\", \"args\": [\"hook\"]}}, \"when\": {{{}}}, \"stages\": [{}]}}",
                when.join(", "),
                stages.join(", ")
            )
        });
    let text = prop_oneof![3 => doc, 1 => any::<String>(), 1 => "[{}\\[\\]:,\"a-z0-9 ]{0,40}"];
    let spec: Value =
        serde_json::from_str(include_str!("../../e2e/tests/data/realspecs/podman-4.3-run.json")).expect("realspec");
    check("hooks.d", text, |text| {
        let path = Path::new("/etc/containers/oci/hooks.d/fuzz.json");
        match hooksd::parse(&text, path) {
            Ok(hook) => {
                let mut s = spec.clone();
                let once = hooksd::merge(&mut s, std::slice::from_ref(&hook))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let mut twice = s.clone();
                hooksd::merge(&mut twice, std::slice::from_ref(&hook))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(&twice, &s, "merging a hook twice adds it twice");
                prop_assert_eq!(once.is_empty(), !hook.matches(&spec));
            }
            Err(e) => {
                prop_assert!(e.to_string().starts_with("hooks file /etc/containers/oci/hooks.d/fuzz.json: "), "{}", e)
            }
        }
        Ok(())
    });
}

const PROFILES: &[&str] = &[
    include_str!("../profiles/nvidia.toml"),
    include_str!("../profiles/neuron.toml"),
    include_str!("../profiles/amd.toml"),
    include_str!("../profiles/gaudi.toml"),
    include_str!("../profiles/accel.toml"),
    include_str!("../profiles/imex.toml"),
];

/// A built-in profile file with one line removed, replaced or duplicated, or a value changed.
fn mutated_profile() -> impl Strategy<Value = String> {
    let replacement = prop::sample::select(vec![
        "",
        "name = \"BAD NAME\"",
        "kind = \"nvidia.com\"",
        "kind = 3",
        "[selection]",
        "env = [\"1BAD\"]",
        "env = []",
        "discovery = \"quantum\"",
        "node = \"relative\"",
        "node = \"/dev/x{index}\"",
        "[devices]",
        "bogus = 1",
        "[[x]]",
        "ranges = \"yes\"",
        "\"",
        "[capabilities.utility]",
        "libraries = [\"libx.so.*\"]",
        "binaries = [\"../../etc/shadow\"]",
    ]);
    (0..PROFILES.len(), any::<prop::sample::Index>(), 0u8..3, replacement).prop_map(|(which, at, how, r)| {
        let mut lines: Vec<String> = PROFILES[which].lines().map(String::from).collect();
        let i = at.index(lines.len());
        match how {
            0 => {
                lines.remove(i);
            }
            1 => lines[i] = r.to_string(),
            _ => lines.insert(i, r.to_string()),
        }
        lines.join("\n")
    })
}

#[test]
fn profiles_parse_or_name_file_and_line() {
    let text = prop_oneof![4 => mutated_profile(), 1 => any::<String>()];
    check("profiles", text, |text| {
        let file = Path::new("/etc/actk/profiles.d/fuzz.toml");
        if let Err(e) = profile::parse(file, &text) {
            let shown = e.to_string();
            prop_assert!(shown.starts_with("/etc/actk/profiles.d/fuzz.toml"), "{}", shown);
            if let profile::ProfileError::Parse { line, .. } = e {
                let n = text.lines().count().max(1) + 1;
                prop_assert!(line >= 1 && line <= n, "line {} outside the {}-line file: {}", line, n, shown);
            }
        }
        Ok(())
    });
}

/// A real cache written by `ldconfig -r` (4 libraries, one i386).
const REAL_CACHE: &[u8] = include_bytes!("../../../fuzz/corpus/ldcache/real-ldconfig-r.cache");

/// Every entry of a parsed cache names strings that are in the file.
fn entries_inside(bytes: &[u8], entries: &[ldcache::CacheEntry]) -> Result<(), TestCaseError> {
    prop_assert!(entries.len() <= bytes.len() / 12, "{} entries from {} bytes", entries.len(), bytes.len());
    // The first entries suffice (a big host cache would make this quadratic in debug builds).
    for e in entries.iter().take(8) {
        for s in [&e.key, &e.path] {
            let needle: Vec<u8> = s.bytes().chain([0]).collect();
            prop_assert!(bytes.windows(needle.len()).any(|w| w == needle.as_slice()), "{s:?} is not in the file");
        }
    }
    Ok(())
}

#[test]
fn ld_so_cache_arbitrary_bytes_never_panic() {
    let bytes = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        // A valid magic followed by anything: the header and table readers get exercised.
        prop::collection::vec(any::<u8>(), 0..200).prop_map(|b| [b"glibc-ld.so.cache1.1".as_slice(), &b].concat()),
        prop::collection::vec(any::<u8>(), 0..200).prop_map(|b| [b"ld.so-1.7.0\0".as_slice(), &b].concat()),
    ];
    check("ld.so.cache-bytes", bytes, |bytes| {
        if let Ok(entries) = ldcache::parse(&bytes) {
            entries_inside(&bytes, &entries)?;
        }
        Ok(())
    });
}

#[test]
fn ld_so_cache_mutated_real_caches_never_panic() {
    let real = ldcache::parse(REAL_CACHE).expect("the committed real cache parses");
    assert!(real.iter().any(|e| e.key == "libcuda.so.1"), "{real:?}");
    let mut caches = vec![REAL_CACHE.to_vec()];
    // The machine's own cache, when it has one: a big, real-world input.
    if let Ok(host) = std::fs::read("/etc/ld.so.cache") {
        caches.push(host);
    }
    let strategy = (
        0..caches.len(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        prop::option::of(any::<prop::sample::Index>()),
        prop::option::of((prop::sample::select(vec![20usize, 24, 48, 52, 56, 60]), any::<u32>())),
    );
    check("ld.so.cache-mutated", strategy, |(which, flips, cut, field)| {
        let mut bytes = caches[which].clone();
        for (at, b) in flips {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        // Header fields and the first entry's offsets: nlibs, len_strings, flags, key, value.
        if let Some((off, v)) = field
            && off + 4 <= bytes.len()
        {
            bytes[off..off + 4].copy_from_slice(&v.to_le_bytes());
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        if let Ok(entries) = ldcache::parse(&bytes) {
            entries_inside(&bytes, &entries)?;
        }
        Ok(())
    });
}
