//! Vendor profiles: a vendor is data, not a code fork (DESIGN.md "Vendor profiles").
//!
//! A profile is a TOML document. Built-in profiles ship in the binary (`profiles/*.toml` in
//! this crate); users add or override profiles as `*.toml` files in a directory (default
//! `/etc/actk/profiles.d`). A user file whose `name` equals a built-in replaces it.
//!
//! The struct shape below is the contract between discovery, CDI generation and request
//! parsing; it only ever grows by fields with serde defaults.
//!
//! Entry points: [`builtin`] (the shipped profiles) and [`load`] (built-ins plus a directory of
//! user files, validated; errors name the file and line).

use std::path::{Path, PathBuf};

/// Default directory of user profiles read by [`load`] when no directory is given.
pub const DEFAULT_PROFILES_DIR: &str = "/etc/actk/profiles.d";

/// Discovery implementations a profile may name in `discovery`.
pub const DISCOVERY_KINDS: &[&str] = &["generic", "nvidia", "neuron", "amd", "gaudi"];

/// The built-in profile files as written: (file name, TOML text). Only tests read them; the
/// binaries embed the form build.rs compiled them to ([`BUILTIN_POSTCARD`]).
#[cfg(test)]
const BUILTIN_FILES: &[(&str, &str)] = &[
    ("nvidia.toml", include_str!("../profiles/nvidia.toml")),
    ("neuron.toml", include_str!("../profiles/neuron.toml")),
    ("amd.toml", include_str!("../profiles/amd.toml")),
    ("gaudi.toml", include_str!("../profiles/gaudi.toml")),
    ("accel.toml", include_str!("../profiles/accel.toml")),
    ("imex.toml", include_str!("../profiles/imex.toml")),
];

mod model;
pub use model::{
    CapabilityFiles, ControlNode, DeviceEnv, DeviceTemplate, ForwardCompat, Kubernetes, Profile, Selection,
};

impl Profile {
    /// The capabilities that add device nodes, sorted: every capability a control node is
    /// reserved to (`fabric`, whose NVSwitch nodes configure the node's NVLink fabric). Naming
    /// one (or `all`, which includes it) in the capabilities variable is a request, governed by
    /// the node's trust policy like a selection variable ([`crate::policy`]); every other
    /// capability only adds files.
    pub fn node_capabilities(&self) -> Vec<&str> {
        let mut caps: Vec<&str> =
            self.control_nodes.iter().flat_map(|c| c.capabilities.iter().map(String::as_str)).collect();
        caps.sort_unstable();
        caps.dedup();
        caps
    }

    /// The profile's device variables (`selection.device_env`: `HABANA_VISIBLE_MODULES`) for
    /// devices `indexes` of `vendor`, as `(name, value)` with the devices' attribute values in
    /// the order of `indexes`, comma-separated (`("HABANA_VISIBLE_MODULES", "2,0")`). An entry
    /// some device lacks the attribute of is left out. For answers that name the devices
    /// otherwise (the device plugin's Allocate, the DRA driver's claim specs); planning checks a
    /// value the container set itself.
    pub fn device_env_for(&self, vendor: &crate::inventory::VendorInventory, indexes: &[u32]) -> Vec<(String, String)> {
        if indexes.is_empty() {
            return Vec::new();
        }
        self.selection
            .device_env
            .iter()
            .filter_map(|e| {
                let values: Option<Vec<&str>> = indexes
                    .iter()
                    .map(|i| {
                        vendor.devices.iter().find(|d| d.index == *i)?.attributes.get(&e.attribute).map(|v| v.trim())
                    })
                    .collect();
                Some((e.name.clone(), values?.join(",")))
            })
            .collect()
    }

    /// A copy of this profile with only the capabilities for which `keep` holds (by name); the
    /// others are never copied. A container start discovers with the few capabilities it asks
    /// for, and cloning every profile whole (every library list of every capability) was a few
    /// hundred allocations per start.
    pub fn with_capabilities(&self, keep: impl Fn(&str) -> bool) -> Profile {
        // Destructured so that a field added to Profile must be added here too.
        let Profile {
            name,
            kind,
            description,
            discovery,
            selection,
            devices,
            control_nodes,
            capabilities,
            env,
            kubernetes,
            forward_compat,
        } = self;
        Profile {
            name: name.clone(),
            kind: kind.clone(),
            description: description.clone(),
            discovery: discovery.clone(),
            selection: selection.clone(),
            devices: devices.clone(),
            control_nodes: control_nodes.clone(),
            capabilities: capabilities.iter().filter(|(n, _)| keep(n)).map(|(n, f)| (n.clone(), f.clone())).collect(),
            env: env.clone(),
            kubernetes: kubernetes.clone(),
            forward_compat: forward_compat.clone(),
        }
    }
}

/// Why profiles could not be loaded. Every variant names the file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The profiles directory or a file in it could not be read.
    #[error("cannot read profile {path}: {source}")]
    Io {
        /// The directory or file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not valid TOML or does not have the profile's shape.
    #[error("{file}:{line}:{column}: {message}")]
    Parse {
        /// The profile file.
        file: PathBuf,
        /// 1-based line of the offending text (0 when the parser gave no position).
        line: usize,
        /// 1-based column (character) of the offending text.
        column: usize,
        /// The parser's message: what it found and what it expected.
        message: String,
    },
    /// A file parsed but a value is not acceptable.
    #[error("{file}: profile {profile:?}: `{field}` = {value:?}: {expected}")]
    Invalid {
        /// The profile file.
        file: PathBuf,
        /// The profile's `name`.
        profile: String,
        /// Dotted field path (`selection.env`).
        field: String,
        /// The rejected value.
        value: String,
        /// What is expected instead.
        expected: String,
    },
}

// BUILTIN_POSTCARD: the built-in profile files compiled by build.rs (TOML read at build time).
include!(concat!(env!("OUT_DIR"), "/builtin_profiles.rs"));

/// The built-in profiles, in this order: `nvidia`, `neuron`, `amd`, `gaudi`, `accel`,
/// `nvidia-imex`.
///
/// They are the TOML files under `crates/actk-core/profiles/`, read at build time (build.rs)
/// into the profile model and embedded in postcard's binary form, which a container start
/// decodes without parsing text (a tenth of a start's instructions as JSON; issue 31). A unit
/// test checks that each equals its TOML file parsed and validated, so this never fails at run
/// time.
pub fn builtin() -> Vec<Profile> {
    BUILTIN_POSTCARD
        .iter()
        .filter_map(|(file, bytes)| match postcard::from_bytes::<Profile>(bytes) {
            Ok(p) => Some(p),
            Err(e) => {
                // Unreachable with the shipped files (unit-tested); never take the process down.
                tracing::error!("built-in profile {file} is broken: {e}");
                None
            }
        })
        .collect()
}

/// Built-in profiles plus every `*.toml` file in `dir` (default [`DEFAULT_PROFILES_DIR`]), in
/// file-name order. A user profile whose `name` equals an earlier one replaces it in place;
/// other user profiles are appended. A missing directory is not an error (no user profiles).
///
/// Errors: [`ProfileError::Io`] for an unreadable directory or file, [`ProfileError::Parse`]
/// with file, line and column for malformed TOML or unknown fields, [`ProfileError::Invalid`]
/// for a value that fails [`validate`].
pub fn load(dir: Option<&Path>) -> Result<Vec<Profile>, ProfileError> {
    let mut profiles = builtin();
    let dir = dir.unwrap_or(Path::new(DEFAULT_PROFILES_DIR));
    let entries = match crate::dirlist::list(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(profiles),
        Err(source) => return Err(ProfileError::Io { path: dir.to_path_buf(), source }),
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = dir.join(&entry.name);
        if path.extension().is_some_and(|e| e == "toml") {
            files.push(path);
        }
    }
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|source| ProfileError::Io { path: file.clone(), source })?;
        let profile = parse(&file, &text)?;
        match profiles.iter_mut().find(|p| p.name == profile.name) {
            Some(slot) => *slot = profile,
            None => profiles.push(profile),
        }
    }
    Ok(profiles)
}

/// Parse and [`validate`] one profile document; `file` is only used in error messages.
pub fn parse(file: &Path, text: &str) -> Result<Profile, ProfileError> {
    let profile: Profile = toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((0, 0));
        ProfileError::Parse { file: file.to_path_buf(), line, column, message: e.message().trim().to_string() }
    })?;
    validate(&profile).map_err(|(field, value, expected)| ProfileError::Invalid {
        file: file.to_path_buf(),
        profile: profile.name.clone(),
        field,
        value,
        expected,
    })?;
    Ok(profile)
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// Capacities a profile's `kubernetes.shared_capacity` may name.
pub const SHARED_CAPACITIES: &[&str] = &["memory", "cores", "shares"];

/// Check the values serde cannot: name and kind syntax, env variable names, `discovery`,
/// paths and patterns. Returns `(field, value, expected)` for the first problem.
pub fn validate(p: &Profile) -> Result<(), (String, String, String)> {
    let bad =
        |field: &str, value: &str, expected: &str| Err((field.to_string(), value.to_string(), expected.to_string()));
    let name_ok = !p.name.is_empty()
        && p.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !name_ok {
        return bad("name", &p.name, "a non-empty name of a-z, 0-9, '-' and '_'");
    }
    if let Err(why) = check_kind(&p.kind) {
        return bad("kind", &p.kind, &why);
    }
    if !DISCOVERY_KINDS.contains(&p.discovery.as_str()) {
        return bad("discovery", &p.discovery, &format!("one of {}", DISCOVERY_KINDS.join(", ")));
    }
    if let Some(c) = &p.kubernetes.shared_capacity
        && !SHARED_CAPACITIES.contains(&c.as_str())
    {
        return bad("kubernetes.shared_capacity", c, &format!("one of {}", SHARED_CAPACITIES.join(", ")));
    }
    let s = &p.selection;
    for v in
        s.env.iter().chain(s.capabilities_env.iter()).chain(s.cores_env.iter()).chain(s.logical_core_size_env.iter())
    {
        if !is_env_name(v) {
            return bad("selection", v, "an environment variable name: [A-Za-z_][A-Za-z0-9_]*");
        }
    }
    for d in &s.device_env {
        if !is_env_name(&d.name) {
            return bad("selection.device_env.name", &d.name, "an environment variable name: [A-Za-z_][A-Za-z0-9_]*");
        }
        if d.attribute.is_empty() {
            return bad("selection.device_env.attribute", &d.attribute, "a device attribute name such as module_id");
        }
    }
    for e in &p.env {
        let name = e.split_once('=').map(|(n, _)| n);
        if !name.is_some_and(is_env_name) {
            return bad("env", e, "NAME=value with NAME an environment variable name");
        }
    }
    let d = &p.devices;
    for (field, pat) in
        d.node.iter().map(|n| ("devices.node", n)).chain(d.extra_nodes.iter().map(|n| ("devices.extra_nodes", n)))
    {
        if !pat.starts_with("/dev/") || !pat.contains("{index}") || pat.matches("{index}").count() != 1 {
            return bad(field, pat, "an absolute path under /dev/ containing `{index}` once");
        }
        if pat.rsplit('/').next().is_some_and(|last| !last.contains("{index}")) {
            return bad(field, pat, "`{index}` in the last path component");
        }
    }
    if let Some(sysfs) = &d.sysfs
        && !sysfs.starts_with("/sys/")
    {
        return bad("devices.sysfs", sysfs, "an absolute path under /sys/ (may contain `{index}`)");
    }
    if p.discovery == "generic" && d.node.is_none() {
        return bad("devices.node", "", "a node pattern such as /dev/npu{index} (generic discovery needs one)");
    }
    for (name, rel) in &d.attributes {
        let path = rel.strip_prefix('@').unwrap_or(rel);
        if path.is_empty() || path.starts_with('/') || path.split('/').any(|c| c == "..") {
            return bad(
                &format!("devices.attributes.{name}"),
                rel,
                "a path relative to the sysfs directory, without `..` (prefix `@` for a link's target name)",
            );
        }
    }
    if let Some(fc) = &p.forward_compat {
        if !fc.dir.starts_with('/') || fc.dir.split('/').any(|c| c == "..") {
            return bad("forward_compat.dir", &fc.dir, "an absolute container directory without `..`");
        }
        if fc.library.contains('/') || !fc.library.contains(".so") {
            return bad("forward_compat.library", &fc.library, "a library name such as libcuda.so");
        }
    }
    for c in &p.control_nodes {
        if !c.path.starts_with("/dev/") {
            return bad("control_nodes.path", &c.path, "an absolute path under /dev/");
        }
    }
    for (cap, files) in &p.capabilities {
        if cap.is_empty() || !cap.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return bad("capabilities", cap, "a capability name of letters, digits, '-' and '_'");
        }
        if let Some(arch) = &files.arch
            && !["x86_64", "aarch64", "i386", "compat32"].contains(&arch.as_str())
        {
            return bad(
                &format!("capabilities.{cap}.arch"),
                arch,
                "compat32 (or i386: the 32-bit copies of an x86-64 host), or x86_64 / aarch64 (only on such hosts)",
            );
        }
        for lib in &files.libraries {
            if lib.contains('/') || !lib.contains(".so") {
                return bad(
                    &format!("capabilities.{cap}.libraries"),
                    lib,
                    "a library name without directory or version, like libcuda.so",
                );
            }
        }
        for bin in &files.binaries {
            if bin.is_empty() || bin.contains('/') {
                return bad(
                    &format!("capabilities.{cap}.binaries"),
                    bin,
                    "an executable name without directory, like nvidia-smi",
                );
            }
        }
        for f in files.files.iter().chain(files.firmware.iter()) {
            if !f.starts_with('/') || f.split('/').any(|c| c == "..") {
                return bad(&format!("capabilities.{cap}.files"), f, "an absolute path without `..`");
            }
        }
    }
    Ok(())
}

/// Whether `name` is a portable environment variable name (POSIX: `[A-Za-z_][A-Za-z0-9_]*`).
pub fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Check a CDI kind `vendor/class` (CDI SPEC.md "kind"; the reference parser's rules): vendor
/// starts with a letter, ends with a letter or digit, and has letters, digits, `-`, `_`, `.`
/// between; class the same without `.`. Returns what is wrong.
pub fn check_kind(kind: &str) -> Result<(), String> {
    let Some((vendor, class)) = kind.split_once('/') else {
        return Err("a CDI kind `vendor/class` such as nvidia.com/gpu (no `/` found)".into());
    };
    let seg_ok = |s: &str, extra: &[char]| {
        let first = s.chars().next();
        let last = s.chars().last();
        first.is_some_and(|c| c.is_ascii_alphabetic())
            && last.is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || extra.contains(&c))
    };
    if !seg_ok(vendor, &['.']) {
        return Err(format!(
            "a CDI kind `vendor/class`: vendor {vendor:?} must start with a letter, end with a letter or digit, and hold only letters, digits, '-', '_', '.'"
        ));
    }
    if !seg_ok(class, &[]) {
        return Err(format!(
            "a CDI kind `vendor/class`: class {class:?} must start with a letter, end with a letter or digit, and hold only letters, digits, '-', '_'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 25 item 9: the Gaudi profile's HABANA_VISIBLE_MODULES for given devices, in their
    /// order; nothing when a device lacks the attribute or none is given.
    #[test]
    fn device_env_lists_the_devices_attribute_in_order() {
        use crate::inventory::{Device, VendorInventory};
        let gaudi = builtin().into_iter().find(|p| p.name == "gaudi").unwrap();
        let dev = |i: u32, m: Option<&str>| Device {
            index: i,
            attributes: m.map(|m| [("module_id".to_string(), format!("{m}\n"))].into()).unwrap_or_default(),
            ..Default::default()
        };
        let v =
            VendorInventory { devices: vec![dev(0, Some("3")), dev(1, Some("2")), dev(2, None)], ..Default::default() };
        assert_eq!(gaudi.device_env_for(&v, &[1, 0]), [("HABANA_VISIBLE_MODULES".to_string(), "2,3".to_string())]);
        assert!(gaudi.device_env_for(&v, &[0, 2]).is_empty(), "device 2 has no module_id");
        assert!(gaudi.device_env_for(&v, &[]).is_empty());
        let nvidia = builtin().into_iter().find(|p| p.name == "nvidia").unwrap();
        assert!(nvidia.device_env_for(&v, &[0]).is_empty());
    }

    #[test]
    fn builtins_parse_validate_and_have_the_documented_kinds() {
        let all = builtin();
        assert_eq!(all.len(), BUILTIN_FILES.len(), "every built-in file must parse and validate");
        for ((file, toml_text), compiled) in BUILTIN_FILES.iter().zip(&all) {
            let from_toml = parse(Path::new(file), toml_text).unwrap();
            assert_eq!(&from_toml, compiled, "{file}: the build-time postcard form must read back as the TOML");
        }
        let kinds: Vec<(&str, &str)> = all.iter().map(|p| (p.name.as_str(), p.kind.as_str())).collect();
        assert_eq!(
            kinds,
            [
                ("nvidia", "nvidia.com/gpu"),
                ("neuron", "aws.amazon.com/neuron"),
                ("amd", "amd.com/gpu"),
                ("gaudi", "habana.ai/gaudi"),
                ("accel", "kernel.org/accel"),
                ("nvidia-imex", "nvidia.com/imex-channel")
            ]
        );
        let nv = &all[0];
        assert_eq!(nv.selection.env, ["NVIDIA_VISIBLE_DEVICES"]);
        assert_eq!(nv.selection.default_capabilities, ["utility", "compute"]);
        for cap in ["utility", "compute", "video", "graphics", "display", "compat32", "ngx", "fabric"] {
            assert!(nv.capabilities.contains_key(cap), "nvidia profile lacks capability {cap}");
        }
        assert!(nv.capabilities["compute"].libraries.contains(&"libcuda.so".to_string()));
        assert!(nv.capabilities["utility"].binaries.contains(&"nvidia-smi".to_string()));
        assert_eq!(nv.capabilities["compat32"].arch.as_deref(), Some("i386"));
        let neuron = &all[1];
        assert_eq!(neuron.capabilities["utility"].binaries, ["neuron-ls", "neuron-top"]);
        assert!(neuron.selection.ranges);
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn missing_dir_gives_builtins_only() {
        let tmp = tempfile::tempdir().unwrap();
        let got = load(Some(&tmp.path().join("absent"))).unwrap();
        assert_eq!(got, builtin());
    }

    #[test]
    fn user_profile_replaces_builtin_of_same_name_and_new_one_is_appended() {
        let tmp = tempfile::tempdir().unwrap();
        write(
            tmp.path(),
            "a.toml",
            "name = \"amd\"\nkind = \"amd.com/gpu\"\ndiscovery = \"amd\"\ndescription = \"mine\"\n",
        );
        write(
            tmp.path(),
            "b.toml",
            "name = \"npu\"\nkind = \"example.com/npu\"\n[devices]\nnode = \"/dev/npu{index}\"\n",
        );
        write(tmp.path(), "notes.txt", "not a profile");
        let got = load(Some(tmp.path())).unwrap();
        let names: Vec<&str> = got.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["nvidia", "neuron", "amd", "gaudi", "accel", "nvidia-imex", "npu"]);
        assert_eq!(got[2].description, "mine");
        assert!(got[2].control_nodes.is_empty(), "the user file replaces the built-in entirely");
    }

    #[test]
    fn malformed_file_error_names_file_line_and_expectation() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), "broken.toml", "name = \"x\"\nkind = \"example.com/x\"\n[devices]\nnode = /dev/x{index}\n");
        let err = load(Some(tmp.path())).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ProfileError::Parse { line: 4, .. }), "{msg}");
        assert!(msg.starts_with(&format!("{}:4:", tmp.path().join("broken.toml").display())), "{msg}");
    }

    #[test]
    fn unknown_field_is_reported_with_its_line() {
        let err = parse(
            Path::new("p.toml"),
            "name = \"x\"\nkind = \"example.com/x\"\n\n[devices]\nnode = \"/dev/x{index}\"\nnodes = 3\n",
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("p.toml:6:"), "{msg}");
        assert!(msg.contains("nodes"), "{msg}");
    }

    #[test]
    fn invalid_values_are_named() {
        let base = "name = \"x\"\n[devices]\nnode = \"/dev/x{index}\"\n";
        let cases = [
            (format!("kind = \"nogpu\"\n{base}"), "kind", "nogpu"),
            (format!("kind = \"example.com/-gpu\"\n{base}"), "kind", "example.com/-gpu"),
            (format!("kind = \"example.com/x\"\ndiscovery = \"magic\"\n{base}"), "discovery", "magic"),
            (format!("kind = \"example.com/x\"\n{base}[selection]\nenv = [\"1BAD\"]\n"), "selection", "1BAD"),
            (format!("kind = \"example.com/x\"\nenv = [\"NOEQUALS\"]\n{base}"), "env", "NOEQUALS"),
            ("name = \"x\"\nkind = \"example.com/x\"\n".to_string(), "devices.node", ""),
            (
                "name = \"x\"\nkind = \"example.com/x\"\n[devices]\nnode = \"/dev/x\"\n".to_string(),
                "devices.node",
                "/dev/x",
            ),
        ];
        for (text, field, value) in cases {
            match parse(Path::new("u.toml"), &text) {
                Err(ProfileError::Invalid { field: f, value: v, file, .. }) => {
                    assert_eq!((f.as_str(), v.as_str()), (field, value), "{text}");
                    assert_eq!(file, Path::new("u.toml"));
                }
                other => panic!("{text}: expected Invalid, got {other:?}"),
            }
        }
    }

    #[test]
    fn kind_rules_follow_cdi() {
        for ok in ["nvidia.com/gpu", "aws.amazon.com/neuron", "vendor_x.io/class-1", "a/b"] {
            assert!(check_kind(ok).is_ok(), "{ok}");
        }
        for bad in ["", "/gpu", "nvidia.com/", "nvidia.com/gpu/x", "1vendor.com/gpu", "vendor.com/g.pu", "vendor-/gpu"]
        {
            assert!(check_kind(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("ab\ncdé\nx", 0), (1, 1));
        assert_eq!(line_col("ab\ncdé\nx", 3), (2, 1));
        assert_eq!(line_col("ab\ncdé\nx", 8), (3, 1));
        assert_eq!(line_col("ab\ncdé\nx", 7), (2, 4));
    }
}
