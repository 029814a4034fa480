//! Validation of CDI spec documents (JSON or YAML): the JSON schema of CNCF
//! container-device-interface (schema/schema.json + defs.json, spec 1.1.0, embedded from
//! `crates/actk-core/schema/`), the fields CDI consumers accept (they reject unknown fields),
//! and SPEC.md's rules as pkg/cdi applies them:
//! - `cdiVersion` known and at least what the fields need ([`super::version`]);
//! - `kind` is `vendor/class` with the name syntax of [`super::name`];
//! - at least one device; device names valid and unique; each device has some edits;
//! - env entries are `NAME=value`; device node `type` one of `b c u p`, `permissions` one or
//!   more of `rwm` (runc refuses an empty access), major/minor inside Linux's 12/20 bits; hook
//!   names are OCI hook stages; hook `timeout` > 0; no string the runtime hands to the kernel
//!   holds a NUL byte; net device names are valid interface names (runc's netDevices rules);
//! - paths absolute: device node `path` and `hostPath`, mount `containerPath`, bind-mount
//!   `hostPath`, hook `path` (SPEC.md: "path MUST be absolute").
//!
//! Every error names the file (when there is one) and the JSON pointer of the offending value
//! (`/devices/0/containerEdits/hooks/1/path`).

use super::CdiError;
use super::name::{Kind, check_device_name};
use super::spec::{ContainerEdits, Spec};
use super::version::check_declared;
use serde_json::Value;
use std::collections::HashSet;
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
/// `{`, else YAML. Errors: [`CdiError::Parse`] with the parser's line and column.
pub fn parse_value(text: &str, file: &Path, format: Option<Format>) -> Result<Value, CdiError> {
    let format = format.unwrap_or(if text.trim_start().starts_with('{') { Format::Json } else { Format::Yaml });
    match format {
        Format::Json => serde_json::from_str(text).map_err(|e| CdiError::Parse {
            file: file.to_path_buf(),
            format: "JSON",
            message: e.to_string(),
        }),
        #[cfg(feature = "yaml")]
        Format::Yaml => serde_saphyr::from_str(text).map_err(|e| CdiError::Parse {
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

const SPEC_KEYS: &[&str] = &["cdiVersion", "kind", "annotations", "devices", "containerEdits"];
const DEVICE_KEYS: &[&str] = &["name", "annotations", "containerEdits"];
const EDITS_KEYS: &[&str] = &["env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids", "netDevices"];
const NODE_KEYS: &[&str] = &["path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"];
const MOUNT_KEYS: &[&str] = &["hostPath", "containerPath", "type", "options"];
const HOOK_KEYS: &[&str] = &["hookName", "path", "args", "env", "timeout"];
const RDT_KEYS: &[&str] = &["closID", "l3CacheSchema", "memBwSchema", "schemata", "enableMonitoring"];
const NET_KEYS: &[&str] = &["hostInterfaceName", "name"];

fn unknown_keys(value: &Value, allowed: &[&str], pointer: &str, file: Option<&Path>, out: &mut Vec<CdiError>) {
    if let Some(obj) = value.as_object() {
        for k in obj.keys().filter(|k| !allowed.contains(&k.as_str())) {
            out.push(invalid(
                file,
                format!("{pointer}/{}", k.replace('~', "~0").replace('/', "~1")),
                format!(
                    "unknown field {k:?} (CDI consumers such as podman reject unknown fields; known here: {})",
                    allowed.join(", ")
                ),
            ));
        }
    }
}

fn unknown_edit_keys(edits: &Value, pointer: &str, file: Option<&Path>, out: &mut Vec<CdiError>) {
    unknown_keys(edits, EDITS_KEYS, pointer, file, out);
    if let Some(rdt) = edits.get("intelRdt") {
        unknown_keys(rdt, RDT_KEYS, &format!("{pointer}/intelRdt"), file, out);
    }
    for (field, keys) in
        [("deviceNodes", NODE_KEYS), ("mounts", MOUNT_KEYS), ("hooks", HOOK_KEYS), ("netDevices", NET_KEYS)]
    {
        if let Some(items) = edits.get(field).and_then(Value::as_array) {
            for (i, item) in items.iter().enumerate() {
                unknown_keys(item, keys, &format!("{pointer}/{field}/{i}"), file, out);
            }
        }
    }
}

/// Fields no CDI version defines, with their JSON pointers.
pub fn unknown_field_errors(value: &Value, file: Option<&Path>) -> Vec<CdiError> {
    let mut out = Vec::new();
    unknown_keys(value, SPEC_KEYS, "", file, &mut out);
    if let Some(e) = value.get("containerEdits") {
        unknown_edit_keys(e, "/containerEdits", file, &mut out);
    }
    if let Some(devs) = value.get("devices").and_then(Value::as_array) {
        for (i, d) in devs.iter().enumerate() {
            unknown_keys(d, DEVICE_KEYS, &format!("/devices/{i}"), file, &mut out);
            if let Some(e) = d.get("containerEdits") {
                unknown_edit_keys(e, &format!("/devices/{i}/containerEdits"), file, &mut out);
            }
        }
    }
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
        if let Some(h) = n.host_path.as_deref().filter(|h| !h.starts_with('/')) {
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
        if let Some(perm) = n.permissions.as_deref()
            && (perm.is_empty() || perm.chars().any(|c| !"rwm".contains(c)))
        {
            out.push(invalid(
                file,
                format!("{}/permissions", p()),
                format!(
                    "permissions {perm:?} must be one or more of r, w, m (runc refuses an empty or other access); leave the field out for the default rwm"
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
            Some(c) if c.is_empty() || c == "." || c == ".." || c.contains('/') || c.contains('\0') => {
                Some("must name a resctrl group: a file name, not empty, `.`, `..` or one with `/`".to_string())
            }
            Some(_) => None,
        }
    {
        out.push(invalid(
            file,
            format!("{}/intelRdt/closID", at()),
            format!("intelRdt closID {clos} {why} (runc's rule)"),
        ));
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
    let mut out = Vec::new();
    if let Err(e) = check_declared(spec) {
        out.push(invalid(file, "/cdiVersion", e.to_string()));
    }
    if let Err(e) = Kind::parse(&spec.kind) {
        out.push(invalid(file, "/kind", e.to_string()));
    }
    if spec.devices.is_empty() {
        out.push(invalid(file, "/devices", "a CDI spec needs at least one device"));
    }
    check_edits(&spec.container_edits, &|| "/containerEdits".to_string(), file, &mut out);
    let mut seen = HashSet::new();
    for (i, d) in spec.devices.iter().enumerate() {
        if let Err(e) = check_device_name(&d.name, &d.name) {
            out.push(invalid(file, format!("/devices/{i}/name"), e.to_string()));
        }
        if !seen.insert(d.name.as_str()) {
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
        // The pointer is formatted only for an error (issue 31: one string per device of a
        // spec that every container start reads).
        check_edits(&d.container_edits, &|| format!("/devices/{i}/containerEdits"), file, &mut out);
    }
    out
}

/// Turns a JSON value into a [`Spec`], checking fields first so errors carry pointers, then
/// SPEC.md's rules. No JSON schema: this is the fast path of the registry, which actk-runtime
/// and actk-hook load on container starts; [`validate_value`] (feature `schema`) adds the schema.
pub fn spec_from_value(value: Value, file: Option<&Path>) -> Result<Spec, Vec<CdiError>> {
    let errors = unknown_field_errors(&value, file);
    if !errors.is_empty() {
        return Err(errors);
    }
    typed_spec(value, file)
}

fn typed_spec(value: Value, file: Option<&Path>) -> Result<Spec, Vec<CdiError>> {
    let spec: Spec = serde_json::from_value(value).map_err(|e| vec![invalid(file, "", e.to_string())])?;
    let errors = rule_errors(&spec, file);
    if errors.is_empty() { Ok(spec) } else { Err(errors) }
}

/// [`spec_from_value`] plus the CDI JSON schema (the `actk cdi validate` path). Feature `schema`.
#[cfg(feature = "schema")]
pub fn validate_value(value: Value, file: Option<&Path>) -> Result<Spec, Vec<CdiError>> {
    let mut errors = schema_errors(&value, file);
    errors.extend(unknown_field_errors(&value, file));
    if !errors.is_empty() {
        return Err(errors);
    }
    typed_spec(value, file)
}

/// Reads, parses and checks one spec file (format from the extension, else sniffed), without
/// the JSON schema (see [`spec_from_value`]). Errors name the file and the JSON pointer.
pub fn read_spec_file(path: &Path) -> Result<Spec, Vec<CdiError>> {
    let text =
        std::fs::read_to_string(path).map_err(|source| vec![CdiError::Io { path: path.to_path_buf(), source }])?;
    spec_from_text(&text, path)
}

/// Whether any edits of `spec` hold `intelRdt` or `netDevices`, whose keys only the field check
/// of [`unknown_field_errors`] looks at.
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

/// Parses and checks a spec file's text (format from `path`'s extension, else sniffed), as
/// [`read_spec_file`] does after reading it; `path` names the file in errors.
pub fn spec_from_text(text: &str, path: &Path) -> Result<Spec, Vec<CdiError>> {
    // Fast path for the common case, a valid JSON spec: straight into the typed model, whose
    // `deny_unknown_fields` rejects what the field check would (the free-form `intelRdt` and
    // `netDevices` aside, which go the long way). Anything it rejects is read again the long
    // way, which names the JSON pointer of each problem; the verdict is the same either way.
    // (A container start loads every spec on the node this way: the long way built the whole
    // file as a JSON tree first, half of loading a 64-GPU spec.)
    if Format::from_path(path) != Some(Format::Yaml)
        && let Ok(spec) = serde_json::from_str::<Spec>(text)
        && !has_free_form_edits(&spec)
    {
        let errors = rule_errors(&spec, Some(path));
        return if errors.is_empty() { Ok(spec) } else { Err(errors) };
    }
    let value = parse_value(text, path, Format::from_path(path)).map_err(|e| vec![e])?;
    spec_from_value(value, Some(path))
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
                |v| v["devices"][0]["containerEdits"]["deviceNodes"][0]["permissions"] = json!(""),
                "/devices/0/containerEdits/deviceNodes/0/permissions: permissions \"\" must be one or more of r, w, m",
            ),
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
}
