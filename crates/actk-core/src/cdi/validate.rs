//! Validation of CDI spec documents (JSON or YAML): the JSON schema of CNCF
//! container-device-interface (schema/schema.json + defs.json, spec 1.1.0, embedded from
//! `crates/actk-core/schema/`), the fields CDI consumers accept (they reject unknown fields),
//! and SPEC.md's rules as pkg/cdi applies them:
//! - the document is typed by the schema as the reference library reads it ([`super::typed`]:
//!   `name: 0` is a name, `fileMode: 0666` octal, `null` the field's zero value, a key given
//!   twice an error);
//! - `cdiVersion` known and at least what the fields need ([`super::version`]);
//! - `kind` is `vendor/class` with the name syntax of [`super::name`];
//! - at least one device; device names valid and unique; each device has some edits;
//! - env entries are `NAME=value`; device node `type` one of `b c u p`, `permissions` one or
//!   more of `rwm` (empty or absent: `rwm`, SPEC.md; `none` is refused, since runc refuses an
//!   empty access), major/minor inside Linux's 12/20 bits; hook names are OCI hook stages; hook
//!   `timeout` > 0; no string the runtime hands to the kernel holds a NUL byte; net device
//!   names are valid interface names (runc's netDevices rules); an `intelRdt.closID` is a file
//!   name shorter than 4096 bytes without `/` or a newline (not `.`, `..`; `/` alone, the root
//!   group the reference allows, is refused as runc 1.1 refuses it);
//! - paths absolute: device node `path` and `hostPath` (an empty `hostPath` is none), mount
//!   `containerPath`, bind-mount `hostPath`, hook `path` (SPEC.md: "path MUST be absolute").
//!
//! Every error names the file (when there is one) and the JSON pointer of the offending value
//! (`/devices/0/containerEdits/hooks/1/path`).
//!
//! For use (the registry, [`usable_from_text`]) a device that breaks a rule of its own part is
//! left out and named, and the file's other devices stay usable; `actk cdi validate` and the
//! other whole-document readers ([`spec_from_text`], [`spec_from_value`]) refuse the document.

use super::CdiError;
use super::name::{Kind, check_device_name};
use super::spec::{ContainerEdits, Device, Spec};
use super::typed::{self, Ty};
use super::version::{check_device, check_spec_level};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// The CDI JSON schema (top level), from cncf-tags/container-device-interface schema/.
pub const SCHEMA_JSON: &str = include_str!("../../schema/schema.json");
/// The CDI JSON schema definitions the top level refers to as `defs.json`.
pub const DEFS_JSON: &str = include_str!("../../schema/defs.json");

/// The OCI hook stages a CDI hook may name (pkg/cdi validHookNames).
pub const HOOK_NAMES: &[&str] =
    &["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"];

/// Encoding of a spec document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JSON (`.json`).
    Json,
    /// YAML (`.yaml`, `.yml`).
    Yaml,
}

impl Format {
    /// The format a file name implies: `.json` JSON, `.yaml`/`.yml` YAML, else `None`.
    pub fn from_path(path: &Path) -> Option<Format> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => Some(Format::Json),
            Some("yaml") | Some("yml") => Some(Format::Yaml),
            _ => None,
        }
    }
}

fn invalid(file: Option<&Path>, pointer: impl Into<String>, message: impl Into<String>) -> CdiError {
    CdiError::Invalid { file: file.map(Path::to_path_buf), pointer: pointer.into(), message: message.into() }
}

/// Parses a spec document into a JSON value. `format` `None`: JSON when the text starts with
/// `{`, else YAML. A key given twice in one mapping is an error in both. YAML comes back typed
/// by the CDI schema ([`super::typed`]: `name: 0` is the name "0", `fileMode: 0666` is 438), as
/// the reference library reads it; JSON as written (typed later, by [`spec_from_value`]).
/// Errors: [`CdiError::Parse`] with the parser's line and column.
pub fn parse_value(text: &str, file: &Path, format: Option<Format>) -> Result<Value, CdiError> {
    let format = format.unwrap_or(if text.trim_start().starts_with('{') { Format::Json } else { Format::Yaml });
    match format {
        Format::Json => typed::json_value(text).map_err(|e| CdiError::Parse {
            file: file.to_path_buf(),
            format: "JSON",
            message: e.to_string(),
        }),
        #[cfg(feature = "yaml")]
        Format::Yaml => typed::yaml_value(text).map_err(|e| CdiError::Parse {
            file: file.to_path_buf(),
            format: "YAML",
            message: e.to_string(),
        }),
        #[cfg(not(feature = "yaml"))]
        Format::Yaml => Err(CdiError::Parse { file: file.to_path_buf(), format: "YAML", message: NO_YAML.into() }),
    }
}

/// Why a binary built without the `yaml` feature (actk-runtime, actk-hook) rejects a YAML spec.
#[cfg(not(feature = "yaml"))]
pub const NO_YAML: &str = "this binary reads JSON spec files only (YAML support is linked into `actk`, not into \
    the per-container binaries); write the spec as JSON (`actk cdi generate` writes JSON by default)";

#[cfg(feature = "schema")]
fn validator() -> Option<&'static jsonschema::Validator> {
    static VALIDATOR: std::sync::OnceLock<Option<jsonschema::Validator>> = std::sync::OnceLock::new();
    VALIDATOR
        .get_or_init(|| {
            // Both documents are embedded and checked by a unit test; a failure here is a build
            // defect, reported once and treated as "no schema" rather than a panic.
            let build = || -> Result<jsonschema::Validator, String> {
                let schema: Value = serde_json::from_str(SCHEMA_JSON).map_err(|e| e.to_string())?;
                let defs: Value = serde_json::from_str(DEFS_JSON).map_err(|e| e.to_string())?;
                let registry = jsonschema::Registry::new()
                    .add("file:///actk/cdi/defs.json", defs)
                    .and_then(|r| r.prepare())
                    .map_err(|e| e.to_string())?;
                jsonschema::options()
                    .with_base_uri("file:///actk/cdi/schema.json")
                    .with_registry(&registry)
                    .build(&schema)
                    .map_err(|e| e.to_string())
            };
            build().map_err(|e| tracing::error!("embedded CDI JSON schema does not build: {e}")).ok()
        })
        .as_ref()
}

/// Errors of the JSON schema for a document (empty when it conforms). Feature `schema`.
#[cfg(feature = "schema")]
pub fn schema_errors(value: &Value, file: Option<&Path>) -> Vec<CdiError> {
    let Some(v) = validator() else {
        return vec![invalid(file, "", "the embedded CDI JSON schema could not be built (a defect in actk)")];
    };
    v.iter_errors(value)
        .map(|e| invalid(file, e.instance_path().to_string(), format!("{e} (CDI JSON schema)")))
        .collect()
}

/// Fields no CDI version defines, missing required fields and values of the wrong type, with
/// their JSON pointers ([`super::typed::shape_errors`] over the whole document, after typing it
/// by the schema as [`spec_from_value`] does).
pub fn unknown_field_errors(value: &Value, file: Option<&Path>) -> Vec<CdiError> {
    let mut v = value.clone();
    typed::coerce(&mut v, Ty::Obj(typed::SPEC), false);
    let mut out = Vec::new();
    typed::shape_errors(&v, Ty::Obj(typed::SPEC), "", file, &mut out);
    out
}

fn check_edits(e: &ContainerEdits, at: &dyn Fn() -> String, file: Option<&Path>, out: &mut Vec<CdiError>) {
    for (i, env) in e.env.iter().enumerate() {
        if env.find('=').is_none_or(|p| p == 0) {
            out.push(invalid(file, format!("{}/env/{i}", at()), format!("env entry {env:?} is not NAME=value")));
        }
    }
    for (i, n) in e.device_nodes.iter().enumerate() {
        let p = || format!("{}/deviceNodes/{i}", at());
        if !n.path.starts_with('/') {
            out.push(invalid(file, format!("{}/path", p()), format!("device node path {:?} must be absolute", n.path)));
        }
        // An empty hostPath is no hostPath (the reference then uses `path`).
        if let Some(h) = n.host_path.as_deref().filter(|h| !h.is_empty() && !h.starts_with('/')) {
            out.push(invalid(
                file,
                format!("{}/hostPath", p()),
                format!("device node hostPath {h:?} must be absolute"),
            ));
        }
        if let Some(t) = n.node_type.as_deref().filter(|t| !["", "b", "c", "u", "p"].contains(t)) {
            out.push(invalid(
                file,
                format!("{}/type", p()),
                format!("device node type {t:?} is not one of b, c, u, p"),
            ));
        }
        // runc turns the permissions into the device cgroup rule's access and refuses an empty
        // one or any letter outside r, w, m (the container then fails to start).
        // An empty one means rwm (SPEC.md: "Omitted or empty permissions default to 'rwm'").
        if let Some(perm) = n.permissions.as_deref()
            && perm.chars().any(|c| !"rwm".contains(c))
        {
            out.push(invalid(
                file,
                format!("{}/permissions", p()),
                format!(
                    "permissions {perm:?} must be one or more of r, w, m (runc refuses any other access); leave the field out (or empty) for the default rwm"
                ),
            ));
        }
        // Linux device numbers: a 12-bit major and a 20-bit minor (MKDEV); runc makes the node
        // from them, so a negative or larger number can never be the device meant.
        for (field, v, max) in [("major", n.major, 0xfff), ("minor", n.minor, 0xf_ffff)] {
            if let Some(v) = v.filter(|v| *v < 0 || *v > max) {
                out.push(invalid(
                    file,
                    format!("{}/{field}", p()),
                    format!("device node {field} number {v} is outside 0..={max}, the range Linux device numbers have"),
                ));
            }
        }
    }
    for (i, m) in e.mounts.iter().enumerate() {
        let p = || format!("{}/mounts/{i}", at());
        if !m.container_path.starts_with('/') {
            out.push(invalid(
                file,
                format!("{}/containerPath", p()),
                format!("mount containerPath {:?} must be absolute", m.container_path),
            ));
        }
        let is_bind = m.options.iter().any(|o| o == "bind" || o == "rbind")
            || matches!(m.mount_type.as_deref(), None | Some("") | Some("bind"));
        if m.host_path.is_empty() || (is_bind && !m.host_path.starts_with('/')) {
            out.push(invalid(
                file,
                format!("{}/hostPath", p()),
                format!("bind mount hostPath {:?} must be an absolute host path", m.host_path),
            ));
        }
    }
    for (i, h) in e.hooks.iter().enumerate() {
        let p = || format!("{}/hooks/{i}", at());
        if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
            out.push(invalid(
                file,
                format!("{}/hookName", p()),
                format!("hook name {:?} is not one of {}", h.hook_name, HOOK_NAMES.join(", ")),
            ));
        }
        if !h.path.starts_with('/') {
            out.push(invalid(
                file,
                format!("{}/path", p()),
                format!("hook path {:?} must be absolute (SPEC.md)", h.path),
            ));
        }
        for (j, env) in h.env.iter().enumerate() {
            if env.find('=').is_none_or(|x| x == 0) {
                out.push(invalid(
                    file,
                    format!("{}/env/{j}", p()),
                    format!("hook env entry {env:?} is not NAME=value"),
                ));
            }
        }
        if let Some(t) = h.timeout.filter(|t| *t <= 0) {
            out.push(invalid(file, format!("{}/timeout", p()), format!("hook timeout {t} must be greater than zero")));
        }
    }
    if let Some(clos) = e.intel_rdt.as_ref().and_then(|r| r.get("closID"))
        && let Some(why) = match clos.as_str() {
            None => Some("must be a string".to_string()),
            // Empty is runc's default group (named after the container); "/" (the root group,
            // which the reference library allows) is refused as runc 1.1 refuses it.
            Some(c) if c.len() >= 4096 || c == "." || c == ".." || c.contains(['/', '\n', '\0']) => Some(
                "must name a resctrl group: a file name shorter than 4096 bytes, not `.` or `..`, without `/`, a newline or a NUL"
                    .to_string(),
            ),
            Some(_) => None,
        }
    {
        let shown = match clos.as_str() {
            Some(c) if c.len() > 64 => format!("({} bytes)", c.len()),
            _ => clos.to_string(),
        };
        out.push(invalid(file, format!("{}/intelRdt/closID", at()), format!("intelRdt closID {shown} {why} (runc's rule)")));
    }
    for (field, value) in nul_fields(e) {
        out.push(invalid(
            file,
            format!("{}/{field}", at()),
            format!("{value:?} contains a NUL byte; runc passes it to the kernel, which cannot take one"),
        ));
    }
    let mut host_names = HashSet::new();
    let mut names = HashSet::new();
    for (i, nd) in e.net_devices.iter().enumerate() {
        let p = || format!("{}/netDevices/{i}", at());
        let host = nd.get("hostInterfaceName").and_then(Value::as_str).unwrap_or("");
        let name = nd.get("name").and_then(Value::as_str).unwrap_or("");
        if host.is_empty() || name.is_empty() {
            out.push(invalid(file, p(), "net device needs a non-empty hostInterfaceName and name"));
        }
        for (field, v) in [("hostInterfaceName", host), ("name", name)] {
            if !v.is_empty()
                && let Some(why) = check_interface_name(v)
            {
                out.push(invalid(file, format!("{}/{field}", p()), format!("network interface name {v:?} {why}")));
            }
        }
        if !host.is_empty() && !host_names.insert(host.to_string()) {
            out.push(invalid(
                file,
                format!("{}/hostInterfaceName", p()),
                format!("duplicate hostInterfaceName {host:?}"),
            ));
        }
        if !name.is_empty() && !names.insert(name.to_string()) {
            out.push(invalid(file, format!("{}/name", p()), format!("duplicate net device name {name:?}")));
        }
    }
}

/// Why `name` cannot be a Linux network interface name (the kernel's dev_valid_name, as runc
/// checks `linux.netDevices`): at most 15 bytes, not `.` or `..`, no `/`, `:` or whitespace.
/// `None` when it can (an empty name is the caller's business).
fn check_interface_name(name: &str) -> Option<String> {
    if name.len() > 15 {
        return Some(format!("is {} bytes long; the kernel allows at most 15 (IFNAMSIZ)", name.len()));
    }
    if name == "." || name == ".." {
        return Some("is not allowed by the kernel".into());
    }
    if name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace() || c == '\0') {
        return Some("contains '/', ':', a NUL or whitespace, which the kernel refuses".into());
    }
    None
}

/// Strings of `e` that hold a NUL byte, as (JSON pointer suffix, value).
fn nul_fields(e: &ContainerEdits) -> Vec<(String, String)> {
    // The field's pointer is only formatted for a value that has a NUL: a valid spec (every
    // container start loads them all) allocates nothing here.
    let mut out = Vec::new();
    let mut check = |v: &str, field: &dyn Fn() -> String| {
        if v.contains('\0') {
            out.push((field(), v.to_string()));
        }
    };
    for (i, v) in e.env.iter().enumerate() {
        check(v, &|| format!("env/{i}"));
    }
    for (i, n) in e.device_nodes.iter().enumerate() {
        check(&n.path, &|| format!("deviceNodes/{i}/path"));
        if let Some(h) = &n.host_path {
            check(h, &|| format!("deviceNodes/{i}/hostPath"));
        }
    }
    for (i, m) in e.mounts.iter().enumerate() {
        check(&m.host_path, &|| format!("mounts/{i}/hostPath"));
        check(&m.container_path, &|| format!("mounts/{i}/containerPath"));
        for (j, o) in m.options.iter().enumerate() {
            check(o, &|| format!("mounts/{i}/options/{j}"));
        }
    }
    for (i, h) in e.hooks.iter().enumerate() {
        check(&h.path, &|| format!("hooks/{i}/path"));
        for (j, a) in h.args.iter().enumerate() {
            check(a, &|| format!("hooks/{i}/args/{j}"));
        }
        for (j, v) in h.env.iter().enumerate() {
            check(v, &|| format!("hooks/{i}/env/{j}"));
        }
    }
    out
}

/// SPEC.md rules for a parsed spec (see the module docs). Empty when the spec is valid.
pub fn rule_errors(spec: &Spec, file: Option<&Path>) -> Vec<CdiError> {
    let mut out = spec_rule_errors(spec, file);
    let version_known = super::version::version_index(&spec.cdi_version).is_some();
    let dups = duplicate_names(spec.devices.iter().map(|d| d.name.as_str()));
    for (i, d) in spec.devices.iter().enumerate() {
        out.extend(device_rule_errors(&spec.cdi_version, version_known, i, d, dups.contains(&i), file));
    }
    if spec.devices.is_empty() {
        out.push(invalid(file, "/devices", "a CDI spec needs at least one device"));
    }
    out
}

/// The rules of the spec-level part: the declared version against the spec-level fields, the
/// kind, the spec-level edits.
fn spec_rule_errors(spec: &Spec, file: Option<&Path>) -> Vec<CdiError> {
    let mut out = Vec::new();
    if let Err(e) = check_spec_level(spec) {
        out.push(invalid(file, "/cdiVersion", e.to_string()));
    }
    if let Err(e) = Kind::parse(&spec.kind) {
        out.push(invalid(file, "/kind", e.to_string()));
    }
    check_edits(&spec.container_edits, &|| "/containerEdits".to_string(), file, &mut out);
    out
}

/// The rules of device `i` (its place in the document's `devices`): its name (`duplicate`: the
/// name is also another device's), its edits, and the declared version against its fields.
fn device_rule_errors(
    cdi_version: &str,
    version_known: bool,
    i: usize,
    d: &Device,
    duplicate: bool,
    file: Option<&Path>,
) -> Vec<CdiError> {
    let mut out = Vec::new();
    if version_known && let Err(e) = check_device(cdi_version, i, d) {
        out.push(invalid(file, "/cdiVersion", e.to_string()));
    }
    if let Err(e) = check_device_name(&d.name, &d.name) {
        out.push(invalid(file, format!("/devices/{i}/name"), e.to_string()));
    }
    if duplicate {
        out.push(invalid(
            file,
            format!("/devices/{i}/name"),
            format!("device name {:?} appears more than once", d.name),
        ));
    }
    if d.container_edits.is_empty() {
        out.push(invalid(
            file,
            format!("/devices/{i}/containerEdits"),
            format!("device {:?} has no container edits", d.name),
        ));
    }
    // The pointer is formatted only for an error (issue 31: one string per device of a spec
    // that every container start reads).
    check_edits(&d.container_edits, &|| format!("/devices/{i}/containerEdits"), file, &mut out);
    out
}

/// Positions of the names that occur more than once.
fn duplicate_names<'a>(names: impl Iterator<Item = &'a str>) -> HashSet<usize> {
    let names: Vec<&str> = names.collect();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for n in &names {
        *seen.entry(n).or_default() += 1;
    }
    names.iter().enumerate().filter(|(_, n)| seen[*n] > 1).map(|(i, _)| i).collect()
}

/// Empty optional strings are absent: the reference library's Go fields are plain strings, where
/// "" means "not given" (`hostPath`, `type`, `permissions`: rwm, a mount's `type`).
fn normalize(spec: &mut Spec) {
    normalize_edits(&mut spec.container_edits);
    for d in &mut spec.devices {
        normalize_edits(&mut d.container_edits);
    }
}

/// [`normalize`] for one set of edits.
fn normalize_edits(e: &mut ContainerEdits) {
    for n in &mut e.device_nodes {
        for f in [&mut n.host_path, &mut n.node_type, &mut n.permissions] {
            if f.as_deref() == Some("") {
                *f = None;
            }
        }
    }
    for m in &mut e.mounts {
        if m.mount_type.as_deref() == Some("") {
            m.mount_type = None;
        }
    }
}

/// A spec file read for use, with the devices that were refused left out (per-device
/// isolation: one device's bad edit does not take the file's other devices with it).
#[derive(Debug)]
pub struct UsableSpec {
    /// The spec with its usable devices, in document order.
    pub spec: Spec,
    /// The devices left out, with why.
    pub refused: Vec<RefusedDevice>,
}

/// A device of a spec file that was left out.
#[derive(Debug)]
pub struct RefusedDevice {
    /// Its place in the document's `devices`.
    pub index: usize,
    /// Its name, when it has one that is a string.
    pub name: Option<String>,
    /// What is wrong with it (file and JSON pointer in each).
    pub errors: Vec<CdiError>,
}

impl RefusedDevice {
    /// `"gpu0" (devices[3])`, or `devices[3]` for a device without a usable name.
    pub fn label(&self) -> String {
        match &self.name {
            Some(n) => format!("{n:?} (devices[{}])", self.index),
            None => format!("devices[{}]", self.index),
        }
    }
}

/// The rules over typed devices whose document positions are `positions`; devices already
/// refused while typing come in `refused`. Spec-level problems refuse the whole file (with every
/// device's errors, for a complete report); device problems refuse that device.
fn check_rules(
    mut spec: Spec,
    positions: Vec<usize>,
    mut refused: Vec<RefusedDevice>,
    file: Option<&Path>,
) -> Result<UsableSpec, Vec<CdiError>> {
    normalize(&mut spec);
    let mut file_errors = spec_rule_errors(&spec, file);
    let version_known = super::version::version_index(&spec.cdi_version).is_some();
    let dups = duplicate_names(spec.devices.iter().map(|d| d.name.as_str()));
    let given = positions.len() + refused.len();
    let devices = std::mem::take(&mut spec.devices);
    for (k, (d, i)) in devices.into_iter().zip(positions).enumerate() {
        let errors = device_rule_errors(&spec.cdi_version, version_known, i, &d, dups.contains(&k), file);
        if errors.is_empty() {
            spec.devices.push(d);
        } else {
            refused.push(RefusedDevice { index: i, name: Some(d.name), errors });
        }
    }
    refused.sort_by_key(|r| r.index);
    if spec.devices.is_empty() {
        let why = if given == 0 {
            "a CDI spec needs at least one device".to_string()
        } else {
            format!("none of its {given} device(s) is usable")
        };
        file_errors.push(invalid(file, "/devices", why));
    }
    if file_errors.is_empty() {
        Ok(UsableSpec { spec, refused })
    } else {
        file_errors.extend(refused.into_iter().flat_map(|r| r.errors));
        Err(file_errors)
    }
}

/// Types a JSON value as the schema says ([`super::typed`]), checks fields, then SPEC.md's
/// rules, device by device: a device with an unknown field, a wrong type or a broken rule is
/// left out and named ([`UsableSpec::refused`]); a problem outside the devices refuses the
/// whole document. No JSON schema: this is the registry's path (actk-runtime and actk-hook
/// load it on container starts); [`validate_value`] (feature `schema`) adds the schema.
pub fn usable_from_value(mut value: Value, file: Option<&Path>) -> Result<UsableSpec, Vec<CdiError>> {
    typed::coerce(&mut value, Ty::Obj(typed::SPEC), false);
    let devices = match value.get_mut("devices") {
        Some(Value::Array(a)) => std::mem::take(a),
        _ => Vec::new(),
    };
    let mut file_errors = Vec::new();
    typed::shape_errors(&value, Ty::Obj(typed::SPEC), "", file, &mut file_errors);
    let mut refused = Vec::new();
    let mut typed_devices = Vec::new();
    let mut positions = Vec::new();
    for (i, d) in devices.into_iter().enumerate() {
        let at = format!("/devices/{i}");
        let name = d.get("name").and_then(Value::as_str).map(str::to_string);
        let mut errors = Vec::new();
        typed::shape_errors(&d, Ty::Obj(typed::DEVICE), &at, file, &mut errors);
        if errors.is_empty() {
            match serde_json::from_value::<Device>(d) {
                Ok(dev) => {
                    typed_devices.push(dev);
                    positions.push(i);
                    continue;
                }
                Err(e) => errors.push(invalid(file, at, e.to_string())),
            }
        }
        refused.push(RefusedDevice { index: i, name, errors });
    }
    if file_errors.is_empty() {
        match serde_json::from_value::<Spec>(value) {
            Ok(mut spec) => {
                spec.devices = typed_devices;
                return check_rules(spec, positions, refused, file);
            }
            Err(e) => file_errors.push(invalid(file, "", e.to_string())),
        }
    }
    file_errors.extend(refused.into_iter().flat_map(|r| r.errors));
    Err(file_errors)
}

/// [`usable_from_value`] for a document that must be valid as a whole (`actk cdi validate`,
/// tests): a refused device is an error of the document.
pub fn spec_from_value(value: Value, file: Option<&Path>) -> Result<Spec, Vec<CdiError>> {
    whole(usable_from_value(value, file))
}

fn whole(u: Result<UsableSpec, Vec<CdiError>>) -> Result<Spec, Vec<CdiError>> {
    let u = u?;
    if u.refused.is_empty() { Ok(u.spec) } else { Err(u.refused.into_iter().flat_map(|r| r.errors).collect()) }
}

/// [`spec_from_value`] plus the CDI JSON schema (the `actk cdi validate` path). Feature `schema`.
/// The schema judges the document as written (a JSON number where it says string is refused
/// here, though the registry reads it as the reference library does).
#[cfg(feature = "schema")]
pub fn validate_value(value: Value, file: Option<&Path>) -> Result<Spec, Vec<CdiError>> {
    let mut errors = schema_errors(&value, file);
    match spec_from_value(value, file) {
        Ok(spec) if errors.is_empty() => return Ok(spec),
        Ok(_) => {}
        Err(more) => {
            // What the schema already named at the same place is said once.
            let named: HashSet<String> = errors
                .iter()
                .filter_map(|e| match e {
                    CdiError::Invalid { pointer, .. } => Some(pointer.clone()),
                    _ => None,
                })
                .collect();
            errors.extend(
                more.into_iter().filter(|e| !matches!(e, CdiError::Invalid { pointer, .. } if named.contains(pointer))),
            );
        }
    }
    Err(errors)
}

/// Reads, parses and checks one spec file (format from the extension, else sniffed), without
/// the JSON schema (see [`spec_from_value`]). Errors name the file and the JSON pointer.
pub fn read_spec_file(path: &Path) -> Result<Spec, Vec<CdiError>> {
    let text =
        std::fs::read_to_string(path).map_err(|source| vec![CdiError::Io { path: path.to_path_buf(), source }])?;
    spec_from_text(&text, path)
}

/// Whether any edits of `spec` hold `intelRdt` or `netDevices`, whose keys only the field check
/// of [`usable_from_value`] looks at.
fn has_free_form_edits(spec: &Spec) -> bool {
    std::iter::once(&spec.container_edits)
        .chain(spec.devices.iter().map(|d| &d.container_edits))
        .any(|e| e.intel_rdt.is_some() || !e.net_devices.is_empty())
}

#[cfg(feature = "schema")]
fn read_value(path: &Path) -> Result<Value, Vec<CdiError>> {
    let text =
        std::fs::read_to_string(path).map_err(|source| vec![CdiError::Io { path: path.to_path_buf(), source }])?;
    parse_value(&text, path, Format::from_path(path)).map_err(|e| vec![e])
}

/// Parses and checks a spec file's text for use (format from `path`'s extension, else
/// sniffed), leaving refused devices out ([`usable_from_value`]); `path` names the file in
/// errors. The registry reads every spec file this way.
pub fn usable_from_text(text: &str, path: &Path) -> Result<UsableSpec, Vec<CdiError>> {
    // Fast path for the common case, a valid JSON spec: straight into the typed model, whose
    // `deny_unknown_fields` rejects what the field check would (the free-form `intelRdt` and
    // `netDevices` aside, which go the long way). Anything it rejects is read again the long
    // way, which types it by the schema and names the JSON pointer of each problem.
    // (A container start loads every spec on the node this way: the long way built the whole
    // file as a JSON tree first, half of loading a 64-GPU spec.)
    if Format::from_path(path) != Some(Format::Yaml)
        && let Some(spec) = typed_json(text)
        && !has_free_form_edits(&spec)
    {
        let positions = (0..spec.devices.len()).collect();
        return check_rules(spec, positions, Vec::new(), Some(path));
    }
    let value = parse_value(text, path, Format::from_path(path)).map_err(|e| vec![e])?;
    usable_from_value(value, Some(path))
}

/// The JSON text straight into the typed model, objects only where the model has structs.
fn typed_json(text: &str) -> Option<Spec> {
    let mut de = serde_json::Deserializer::from_str(text);
    let spec = super::spec::object::<_, Spec>(&mut de).ok()?;
    de.end().ok()?;
    Some(spec)
}

/// A spec file read for a container start (issue 31): the spec-level part parsed and checked,
/// each device kept as its JSON text with only its name read, and parsed and checked when a
/// start names it ([`LazyDevice::device`]). A start that names 8 devices of a 256-device spec
/// then builds and checks 8 devices, not 256.
///
/// What a named device gets is what the whole-file reading ([`usable_from_text`]) gives it:
/// the same fields, types, SPEC.md rules and version check, with the same JSON pointers. What
/// is not looked at: the devices nobody named, beyond their names. A defect inside one of them
/// (a bad edit, an unknown field, a key given twice) therefore neither refuses the start nor
/// is reported by it; `actk cdi validate` and `actk cdi list` read every device and report it.
#[derive(Debug, Clone)]
pub struct LazySpec {
    /// The spec-level part, checked; `devices` is empty (they are in [`LazySpec::devices`]).
    pub spec: Spec,
    /// The devices in document order, names unique.
    pub devices: Vec<LazyDevice>,
}

/// One device of a [`LazySpec`]: its name, its place in `devices` and where its text is in the
/// file's text, which the devices share (no copy of each device's text, no allocation per
/// device for an unescaped name: issue 31).
#[derive(Debug, Clone)]
pub struct LazyDevice {
    name: LazyName,
    index: usize,
    text: std::sync::Arc<str>,
    span: std::ops::Range<usize>,
    parsed: std::sync::OnceLock<Result<Device, String>>,
}

/// A device's name: where it is in the file's text when written without escapes, else read.
#[derive(Debug, Clone)]
enum LazyName {
    Span(std::ops::Range<usize>),
    Owned(String),
}

impl LazyDevice {
    /// The device name as written (the value of its JSON string `name`).
    pub fn name(&self) -> &str {
        match &self.name {
            LazyName::Span(r) => &self.text[r.clone()],
            LazyName::Owned(n) => n,
        }
    }

    /// The device, parsed and checked on first use as [`usable_from_text`] checks a device of
    /// the file (`cdi_version`: the spec's declared version; `file` names the file in errors).
    /// Errors: why it was refused, as one line naming the file and JSON pointers.
    pub fn device(&self, cdi_version: &str, file: &Path) -> Result<&Device, &str> {
        self.parsed
            .get_or_init(|| parse_device(&self.text[self.span.clone()], self.index, cdi_version, file))
            .as_ref()
            .map_err(|e| e.as_str())
    }

    /// The container edits of the device [`LazyDevice::device`] parsed, moved out (empty when
    /// it was not parsed or was refused, or was taken before).
    pub fn take_edits(&mut self) -> ContainerEdits {
        match self.parsed.get_mut() {
            Some(Ok(d)) => std::mem::take(&mut d.container_edits),
            _ => Default::default(),
        }
    }
}

/// One device's text into a checked [`Device`]: the typed model straight from the text when it
/// fits, else typed by the schema first (as [`usable_from_value`] types each device), then the
/// SPEC.md rules of [`device_rule_errors`]. Error: `FILE: error; error`.
fn parse_device(raw: &str, i: usize, cdi_version: &str, file: &Path) -> Result<Device, String> {
    let f = Some(file);
    let fast = || -> Option<Device> {
        let mut de = serde_json::Deserializer::from_str(raw);
        let d = super::spec::object::<_, Device>(&mut de).ok()?;
        de.end().ok()?;
        let e = &d.container_edits;
        (e.intel_rdt.is_none() && e.net_devices.is_empty()).then_some(d)
    };
    let typed = match fast() {
        Some(d) => Ok(d),
        None => {
            let at = format!("/devices/{i}");
            match typed::json_value(raw) {
                // The whole-file reading refuses the file for this (its parser reads every
                // device); here it is this device's defect.
                Err(e) => Err(vec![CdiError::Parse {
                    file: file.to_path_buf(),
                    format: "JSON",
                    message: format!("{at}: {e}"),
                }]),
                Ok(mut v) => {
                    typed::coerce(&mut v, Ty::Obj(typed::DEVICE), false);
                    let mut errors = Vec::new();
                    typed::shape_errors(&v, Ty::Obj(typed::DEVICE), &at, f, &mut errors);
                    if errors.is_empty() {
                        serde_json::from_value::<Device>(v).map_err(|e| vec![invalid(f, at, e.to_string())])
                    } else {
                        Err(errors)
                    }
                }
            }
        }
    };
    let checked = typed.and_then(|mut d| {
        normalize_edits(&mut d.container_edits);
        let version_known = super::version::version_index(cdi_version).is_some();
        let errors = device_rule_errors(cdi_version, version_known, i, &d, false, f);
        if errors.is_empty() { Ok(d) } else { Err(errors) }
    });
    checked.map_err(|errors| {
        let msg: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        format!("{}: {}", file.display(), msg.join("; "))
    })
}

/// The spec-level part of a JSON spec, read from the text [`super::scan::split_devices`] leaves
/// when it takes the devices out, for [`lazy_from_text`].
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LazyTop {
    cdi_version: String,
    kind: String,
    #[serde(default, deserialize_with = "super::spec::unique_keys")]
    annotations: std::collections::BTreeMap<String, String>,
    #[serde(default, deserialize_with = "super::spec::object")]
    container_edits: ContainerEdits,
}

/// A device's `name` when the device is an object whose `name` is a JSON string: read from
/// the text when the object starts with it without escapes (as `actk cdi generate`, nvidia-ctk
/// and most writers put it), else by reading the object's keys, where a `name` given twice or
/// not as a string gives `None`. (Read from the text, a second `name` further on is not seen:
/// that is a key given twice inside the device, refused when the device is named.)
fn device_name(raw: &str) -> Option<Cow<'_, str>> {
    if let Some(n) = super::scan::leading_name(raw) {
        return Some(Cow::Borrowed(n));
    }
    struct Name;
    impl<'de> serde::de::Visitor<'de> for Name {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a device object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut name = None;
            while let Some(is_name) = map.next_key_seed(IsName)? {
                if is_name {
                    if name.is_some() {
                        return Ok(None);
                    }
                    match map.next_value::<Value>()? {
                        Value::String(s) => name = Some(s),
                        _ => return Ok(None),
                    }
                } else {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
            Ok(name)
        }
    }
    /// Whether a key is `name`, without allocating the key.
    struct IsName;
    impl<'de> serde::de::DeserializeSeed<'de> for IsName {
        type Value = bool;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_str(self)
        }
    }
    impl<'de> serde::de::Visitor<'de> for IsName {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a key")
        }
        fn visit_str<E>(self, v: &str) -> Result<bool, E> {
            Ok(v == "name")
        }
    }
    let mut de = serde_json::Deserializer::from_str(raw);
    serde::Deserializer::deserialize_map(&mut de, Name).ok().flatten().map(Cow::Owned)
}

/// A JSON spec file's text read for a container start ([`LazySpec`]), or `None` when the file
/// must be read whole by [`usable_from_text`]: not JSON by its name, a spec-level part that
/// does not parse into the typed model or breaks a rule (the whole reading gives the full
/// report), free-form spec-level edits, no devices, a device that is not an object with a
/// string `name`, or a name given to two devices (the whole reading refuses both by rule).
pub fn lazy_from_text(text: &str, path: &Path) -> Option<LazySpec> {
    if Format::from_path(path) == Some(Format::Yaml) {
        return None;
    }
    // The devices a start does not name are only checked as JSON, by the scanner: serde_json's
    // own skipping cost most of a start's growth with the node (issue 31).
    let split = super::scan::split_devices(text)?;
    let mut de = serde_json::Deserializer::from_str(&split.rest);
    let top = super::spec::object::<_, LazyTop>(&mut de).ok()?;
    de.end().ok()?;
    if split.devices.is_empty()
        || top.container_edits.intel_rdt.is_some()
        || !top.container_edits.net_devices.is_empty()
    {
        return None;
    }
    // One copy of the file's text shared by its devices; each device is a span of it.
    let shared: std::sync::Arc<str> = std::sync::Arc::from(text);
    let at = |s: &str| s.as_ptr() as usize - text.as_ptr() as usize;
    let mut devices = Vec::with_capacity(split.devices.len());
    for (index, raw) in split.devices.into_iter().enumerate() {
        let name = match device_name(raw)? {
            Cow::Borrowed(n) => LazyName::Span(at(n)..at(n) + n.len()),
            Cow::Owned(n) => LazyName::Owned(n),
        };
        let span = at(raw)..at(raw) + raw.len();
        devices.push(LazyDevice { name, index, text: shared.clone(), span, parsed: std::sync::OnceLock::new() });
    }
    // foldhash, not the default SipHash: one insert per device of every spec at each start.
    let mut names: HashSet<&str, foldhash::fast::RandomState> =
        HashSet::with_capacity_and_hasher(devices.len(), Default::default());
    if !devices.iter().all(|d| names.insert(d.name())) {
        return None;
    }
    let mut spec = Spec {
        cdi_version: top.cdi_version,
        kind: top.kind,
        annotations: top.annotations,
        devices: Vec::new(),
        container_edits: top.container_edits,
    };
    normalize_edits(&mut spec.container_edits);
    if !spec_rule_errors(&spec, Some(path)).is_empty() {
        return None;
    }
    Some(LazySpec { spec, devices })
}

/// [`usable_from_text`] for a file that must be valid as a whole: a refused device is an error.
pub fn spec_from_text(text: &str, path: &Path) -> Result<Spec, Vec<CdiError>> {
    whole(usable_from_text(text, path))
}

/// Validates a spec file fully: schema, fields and SPEC.md rules (`actk cdi validate`).
/// Feature `schema`.
#[cfg(feature = "schema")]
pub fn validate_file(path: &Path) -> Result<Spec, Vec<CdiError>> {
    validate_value(read_value(path)?, Some(path))
}

/// Validates an in-memory spec (as generated) against the schema and the rules. Feature `schema`.
#[cfg(feature = "schema")]
pub fn validate_spec(spec: &Spec) -> Result<(), Vec<CdiError>> {
    let value = serde_json::to_value(spec).map_err(|e| vec![invalid(None, "", e.to_string())])?;
    validate_value(value, None).map(|_| ())
}

/// A file path for messages when a spec has none.
pub fn display_file(file: &Option<PathBuf>) -> String {
    file.as_ref().map(|f| f.display().to_string()).unwrap_or_else(|| "<spec>".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn good() -> Value {
        json!({
            "cdiVersion": "0.5.0",
            "kind": "nvidia.com/gpu",
            "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]}}],
            "containerEdits": {
                "env": ["A=b"],
                "mounts": [{"hostPath": "/usr/lib/libcuda.so.1", "containerPath": "/usr/lib/libcuda.so.1", "options": ["ro", "bind"]}],
                "hooks": [{"hookName": "createContainer", "path": "/usr/bin/hook", "env": ["PATH=/bin"]}]
            }
        })
    }

    fn errors_of(v: Value) -> Vec<String> {
        match validate_value(v, Some(Path::new("/etc/cdi/x.json"))) {
            Ok(_) => vec![],
            Err(e) => e.iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn embedded_schema_builds_and_accepts_a_good_spec() {
        assert!(validator().is_some());
        assert_eq!(errors_of(good()), Vec::<String>::new());
    }

    #[test]
    fn schema_errors_name_file_and_pointer() {
        let mut v = good();
        v["devices"][0]["containerEdits"]["deviceNodes"][0]["major"] = json!("195");
        let errs = errors_of(v);
        assert!(
            errs.iter().any(|e| e.starts_with("/etc/cdi/x.json: /devices/0/containerEdits/deviceNodes/0/major: ")),
            "{errs:?}"
        );
        let mut v = good();
        v.as_object_mut().unwrap().remove("kind");
        let errs = errors_of(v);
        assert!(errs.iter().any(|e| e.contains("\"kind\" is a required property")), "{errs:?}");
    }

    #[test]
    fn unknown_fields_are_named() {
        let mut v = good();
        v["containerEdits"]["hooks"][0]["argv"] = json!(["x"]);
        v["containerEdits"]["intelRdt"] = json!({"closID": "a", "enableCMT": true});
        let errs = errors_of(v);
        assert!(errs.iter().any(|e| e.contains("/containerEdits/hooks/0/argv: unknown field \"argv\"")), "{errs:?}");
        assert!(errs.iter().any(|e| e.contains("/containerEdits/intelRdt/enableCMT: unknown field")), "{errs:?}");
    }

    #[test]
    fn spec_rules_are_checked() {
        type Case = (fn(&mut Value), &'static str);
        let cases: Vec<Case> = vec![
            (
                |v| v["containerEdits"]["hooks"][0]["path"] = json!("hook"),
                "/containerEdits/hooks/0/path: hook path \"hook\" must be absolute",
            ),
            (|v| v["containerEdits"]["hooks"][0]["hookName"] = json!("preStart"), "/containerEdits/hooks/0/hookName"),
            (|v| v["containerEdits"]["env"][0] = json!("=x"), "/containerEdits/env/0"),
            (
                |v| v["containerEdits"]["mounts"][0]["containerPath"] = json!("usr/lib"),
                "/containerEdits/mounts/0/containerPath",
            ),
            (
                |v| v["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] = json!("dev/nvidia0"),
                "/devices/0/containerEdits/deviceNodes/0/path",
            ),
            (
                |v| v["devices"][0]["containerEdits"]["deviceNodes"][0]["type"] = json!("x"),
                "/devices/0/containerEdits/deviceNodes/0/type",
            ),
            (|v| v["devices"][0]["name"] = json!("a/b"), "/devices/0/name"),
            (|v| v["devices"] = json!([]), "/devices: a CDI spec needs at least one device"),
            (
                |v| {
                    let d = v["devices"][0].clone();
                    v["devices"].as_array_mut().unwrap().push(d);
                },
                "/devices/1/name: device name \"0\" appears more than once",
            ),
            (
                |v| v["devices"][0]["containerEdits"] = json!({}),
                "/devices/0/containerEdits: device \"0\" has no container edits",
            ),
            (|v| v["kind"] = json!("nvidia"), "/kind"),
            (
                |v| v["cdiVersion"] = json!("0.4.0"),
                "/cdiVersion: spec declares cdiVersion 0.4.0 but uses a device name starting with a digit",
            ),
            (|v| v["cdiVersion"] = json!("9.9.9"), "/cdiVersion: unknown cdiVersion"),
        ];
        for (edit, expected) in cases {
            let mut v = good();
            edit(&mut v);
            let errs = errors_of(v);
            assert!(errs.iter().any(|e| e.contains(expected)), "expected {expected:?} in {errs:?}");
        }
    }

    /// Issue 13 item 4: what runc refuses at container start is refused here, naming the field:
    /// an empty (or non-rwm) device access, device numbers Linux cannot have, NUL bytes, bad net
    /// device names and intelRdt group names.
    #[test]
    fn item4_validate_rejects_what_runc_rejects() {
        type Case = (fn(&mut Value), &'static str);
        let cases: Vec<Case> = vec![
            (
                |v| v["devices"][0]["containerEdits"]["deviceNodes"][0]["permissions"] = json!("none"),
                "/devices/0/containerEdits/deviceNodes/0/permissions",
            ),
            (
                |v| v["devices"][0]["containerEdits"]["deviceNodes"][0]["permissions"] = json!("rwx"),
                "/devices/0/containerEdits/deviceNodes/0/permissions",
            ),
            (
                |v| v["devices"][0]["containerEdits"]["deviceNodes"][0]["major"] = json!(-1),
                "/devices/0/containerEdits/deviceNodes/0/major: device node major number -1 is outside 0..=4095",
            ),
            (
                |v| v["devices"][0]["containerEdits"]["deviceNodes"][0]["minor"] = json!(1 << 20),
                "/devices/0/containerEdits/deviceNodes/0/minor",
            ),
            (|v| v["containerEdits"]["env"][0] = json!("A=b\0c"), "/containerEdits/env/0: \"A=b\\0c\" contains a NUL"),
            (|v| v["containerEdits"]["hooks"][0]["args"] = json!(["hook", "a\0"]), "/containerEdits/hooks/0/args/1"),
            (
                |v| v["containerEdits"]["mounts"][0]["options"] = json!(["ro", "bind\0"]),
                "/containerEdits/mounts/0/options/1",
            ),
            (
                |v| v["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] = json!("/dev/x\0"),
                "/devices/0/containerEdits/deviceNodes/0/hostPath: \"/dev/x\\0\" contains a NUL",
            ),
            (
                |v| {
                    v["cdiVersion"] = json!("1.1.0");
                    v["containerEdits"]["netDevices"] =
                        json!([{"hostInterfaceName": "eth0", "name": "a-very-long-name0"}]);
                },
                "/containerEdits/netDevices/0/name: network interface name \"a-very-long-name0\" is 17 bytes",
            ),
            (
                |v| {
                    v["cdiVersion"] = json!("1.1.0");
                    v["containerEdits"]["netDevices"] = json!([{"hostInterfaceName": "eth/0", "name": "net1"}]);
                },
                "/containerEdits/netDevices/0/hostInterfaceName",
            ),
            (
                |v| {
                    v["cdiVersion"] = json!("1.1.0");
                    v["containerEdits"]["intelRdt"] = json!({"closID": ".."});
                },
                "/containerEdits/intelRdt/closID",
            ),
            // Issue 25 item 9: the reference library's closID rules (a newline, 4096 bytes).
            (
                |v| {
                    v["cdiVersion"] = json!("1.1.0");
                    v["containerEdits"]["intelRdt"] = json!({"closID": "a\nb"});
                },
                "/containerEdits/intelRdt/closID: intelRdt closID \"a\\nb\" must name a resctrl group",
            ),
            (
                |v| {
                    v["cdiVersion"] = json!("1.1.0");
                    v["containerEdits"]["intelRdt"] = json!({"closID": "x".repeat(4096)});
                },
                "/containerEdits/intelRdt/closID: intelRdt closID (4096 bytes) must name",
            ),
        ];
        for (edit, expected) in cases {
            let mut v = good();
            edit(&mut v);
            let errs = errors_of(v.clone());
            assert!(errs.iter().any(|e| e.contains(expected)), "expected {expected:?} in {errs:?}");
            // The runtime's registry (no schema) refuses it too, so the spec is never applied.
            let fast = spec_from_value(v, Some(Path::new("/etc/cdi/x.json"))).err().unwrap_or_default();
            assert!(fast.iter().any(|e| e.to_string().contains(expected)), "without schema: {fast:?}");
        }
        // The good spec, with every 1.1 edit, stays valid.
        let mut v = good();
        v["cdiVersion"] = json!("1.1.0");
        v["containerEdits"]["netDevices"] = json!([{"hostInterfaceName": "eth1", "name": "net1"}]);
        v["containerEdits"]["intelRdt"] = json!({"closID": "gpu-jobs", "l3CacheSchema": "L3:0=ff"});
        assert_eq!(errors_of(v), Vec::<String>::new());
    }

    #[test]
    fn f06_additional_gids_with_cdi_version_0_5_0_is_rejected() {
        let mut v = good();
        v["devices"][0]["containerEdits"]["additionalGids"] = json!([44]);
        let errs = errors_of(v);
        assert!(
            errs.iter()
                .any(|e| e.contains("/cdiVersion") && e.contains("uses additionalGids") && e.contains(">= 0.7.0")),
            "{errs:?}"
        );
    }

    #[test]
    fn yaml_and_json_parse_to_the_same_spec() {
        let json_text = serde_json::to_string_pretty(&good()).unwrap();
        let yaml_text = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n  - name: \"0\"\n    containerEdits:\n      deviceNodes:\n        - path: /dev/nvidia0\n          type: c\n          major: 195\n          minor: 0\ncontainerEdits:\n  env: [\"A=b\"]\n  mounts:\n    - hostPath: /usr/lib/libcuda.so.1\n      containerPath: /usr/lib/libcuda.so.1\n      options: [ro, bind]\n  hooks:\n    - hookName: createContainer\n      path: /usr/bin/hook\n      env: [\"PATH=/bin\"]\n";
        let a = validate_value(parse_value(&json_text, Path::new("a.json"), None).unwrap(), None).unwrap();
        let b = validate_value(parse_value(yaml_text, Path::new("a.yaml"), Some(Format::Yaml)).unwrap(), None).unwrap();
        assert_eq!(a, b);
        let err = parse_value("{\"kind\": ", Path::new("/x/bad.json"), None).unwrap_err().to_string();
        assert!(err.starts_with("/x/bad.json: cannot parse CDI spec as JSON") && err.contains("line 1"), "{err}");
    }

    fn usable(text: &str, name: &str) -> Result<UsableSpec, Vec<String>> {
        usable_from_text(text, Path::new(name)).map_err(|e| e.iter().map(|e| e.to_string()).collect())
    }

    /// Issue 25 item 6: null is the field's zero value and an empty `permissions` means rwm
    /// (SPEC.md), as the reference library reads them; in JSON (fast path or not) and YAML.
    #[test]
    fn item6_nulls_are_empty_and_empty_permissions_are_rwm() {
        let json = r#"{"cdiVersion": "0.5.0", "kind": "vendor.com/dev", "annotations": null, "containerEdits": null,
            "devices": [{"name": "a", "containerEdits": {"env": ["A=1"], "mounts": null, "hooks": null,
              "deviceNodes": [{"path": "/dev/a", "type": "c", "major": 1, "minor": 3, "permissions": "", "hostPath": null}]}}]}"#;
        let yaml = "cdiVersion: 0.5.0\nkind: vendor.com/dev\ncontainerEdits: ~\ndevices:\n- name: a\n  containerEdits:\n    env: [A=1]\n    mounts: ~\n    hooks:\n    deviceNodes:\n    - {path: /dev/a, type: c, major: 1, minor: 3, permissions: \"\", hostPath: ~}\n";
        for (text, file) in [(json, "/etc/cdi/a.json"), (yaml, "/etc/cdi/a.yaml")] {
            let u = usable(text, file).unwrap();
            assert!(u.refused.is_empty());
            let n = &u.spec.devices[0].container_edits.device_nodes[0];
            assert_eq!((n.permissions.as_deref(), n.host_path.as_deref()), (None, None), "{file}");
            assert!(u.spec.container_edits.is_empty() && u.spec.devices[0].container_edits.mounts.is_empty());
        }
    }

    /// Issue 25 item 6: a device whose edits are refused is left out by name; the file's other
    /// devices stay usable. Spec-level problems still refuse the file.
    #[test]
    fn item6_a_refused_device_does_not_take_the_others_down() {
        let text = r#"{"cdiVersion": "0.5.0", "kind": "vendor.com/dev", "devices": [
            {"name": "good", "containerEdits": {"env": ["A=1"]}},
            {"name": "badperm", "containerEdits": {"deviceNodes": [{"path": "/dev/x", "permissions": "rwx"}]}},
            {"name": "unknownfield", "containerEdits": {"env": ["A=1"], "bogus": 1}},
            {"name": "wrongtype", "containerEdits": {"deviceNodes": [{"path": "/dev/x", "major": "one"}]}},
            {"name": "newer", "containerEdits": {"additionalGids": [44]}},
            {"name": "twice", "containerEdits": {"env": ["A=1"]}},
            {"name": "twice", "containerEdits": {"env": ["A=2"]}},
            {"name": "also-good", "containerEdits": {"env": ["B=1"]}}
        ]}"#;
        let u = usable(text, "/etc/cdi/v.json").unwrap();
        let names: Vec<&str> = u.spec.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["good", "also-good"]);
        let refused: Vec<String> = u.refused.iter().map(|r| r.label()).collect();
        assert_eq!(
            refused,
            [
                "\"badperm\" (devices[1])",
                "\"unknownfield\" (devices[2])",
                "\"wrongtype\" (devices[3])",
                "\"newer\" (devices[4])",
                "\"twice\" (devices[5])",
                "\"twice\" (devices[6])"
            ]
        );
        let why = |i: usize| u.refused[i].errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ");
        assert!(why(0).contains("/devices/1/containerEdits/deviceNodes/0/permissions"), "{}", why(0));
        assert!(why(1).contains("/devices/2/containerEdits/bogus: unknown field"), "{}", why(1));
        assert!(why(2).contains("/devices/3/containerEdits/deviceNodes/0/major: expected an integer"), "{}", why(2));
        assert!(why(3).contains("uses additionalGids") && why(3).contains(">= 0.7.0"), "{}", why(3));
        assert!(why(4).contains("appears more than once"), "{}", why(4));
        // As a whole document (actk cdi validate) it is invalid, naming every device's problem.
        let whole = spec_from_text(text, Path::new("/etc/cdi/v.json")).unwrap_err();
        assert_eq!(whole.len(), u.refused.iter().map(|r| r.errors.len()).sum::<usize>());
        // A spec-level problem refuses the file; with every device refused, so does that.
        let bad_kind = text.replace("vendor.com/dev", "vendor");
        assert!(usable(&bad_kind, "/etc/cdi/v.json").unwrap_err().iter().any(|e| e.contains("/kind")));
        let none =
            r#"{"cdiVersion": "0.5.0", "kind": "vendor.com/dev", "devices": [{"name": "x", "containerEdits": {}}]}"#;
        let e = usable(none, "/etc/cdi/n.json").unwrap_err();
        assert!(e.iter().any(|e| e.contains("/devices: none of its 1 device(s) is usable")), "{e:?}");
    }

    /// Issue 25 item 7: YAML is typed by the schema as the reference library (yaml.v3 into the
    /// typed structs) reads it: a scalar in a string field is its text, integers resolve with
    /// YAML 1.1 octal (`0666` is 438, `010` is 8); JSON numbers in string fields likewise.
    #[test]
    fn item7_yaml_scalars_are_typed_by_the_field() {
        let yaml = "cdiVersion: 0.5.0\nkind: vendor.com/dev\ndevices:\n- name: 0\n  containerEdits:\n    deviceNodes:\n    - {path: /dev/x, type: c, major: 010, minor: 0x10, fileMode: 0666, uid: 1_000, gid: 0o17}\n    additionalGids: []\n- name: y\n  containerEdits: {env: [A=1]}\n- name: True\n  containerEdits:\n    env: [A=1]\n    hooks: [{hookName: prestart, path: /bin/h, timeout: 08}]\n";
        let u = usable(yaml, "/etc/cdi/t.yaml").unwrap();
        assert!(u.refused.is_empty(), "{:?}", u.refused);
        let names: Vec<&str> = u.spec.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["0", "y", "True"]);
        let n = &u.spec.devices[0].container_edits.device_nodes[0];
        assert_eq!(
            (n.major, n.minor, n.file_mode, n.uid, n.gid),
            (Some(8), Some(16), Some(0o666), Some(1000), Some(15))
        );
        assert_eq!(u.spec.devices[2].container_edits.hooks[0].timeout, Some(8));
        let json = r#"{"cdiVersion": "0.5.0", "kind": "vendor.com/dev", "devices": [{"name": 0, "containerEdits": {"env": ["A=1"]}}]}"#;
        assert_eq!(usable(json, "/etc/cdi/t.json").unwrap().spec.devices[0].name, "0");
        // What yaml.v3 refuses is refused: a boolean or non-number in an integer field.
        let bad = yaml.replace("major: 010", "major: true");
        let e = usable(&bad, "/etc/cdi/t.yaml").unwrap().refused;
        assert!(
            e[0].errors[0].to_string().contains("major: expected an integer (int64), found a string \"true\""),
            "{e:?}"
        );
    }

    /// Issue 25 item 9: a key given twice is refused, in JSON as in YAML, at any depth.
    #[test]
    fn item9_keys_given_twice_are_refused() {
        for (text, file) in [
            (
                r#"{"cdiVersion": "0.5.0", "kind": "v.com/d", "annotations": {"a": "1", "a": "2"}, "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}]}"#,
                "/etc/cdi/d.json",
            ),
            (
                r#"{"cdiVersion": "1.1.0", "kind": "v.com/d", "devices": [{"name": "a", "containerEdits": {"intelRdt": {"closID": "x", "closID": "y"}}}]}"#,
                "/etc/cdi/d.json",
            ),
            (r#"{"cdiVersion": "0.5.0", "kind": "v.com/d", "kind": "v.com/d", "devices": []}"#, "/etc/cdi/d.json"),
            (
                "cdiVersion: 0.5.0\nkind: v.com/d\ndevices:\n- name: a\n  name: b\n  containerEdits: {env: [A=1]}\n",
                "/etc/cdi/d.yaml",
            ),
        ] {
            let e = usable(text, file).unwrap_err();
            assert!(e.len() == 1 && e[0].contains(file) && e[0].contains("cannot parse CDI spec"), "{e:?}");
        }
    }
}
