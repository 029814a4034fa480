//! Requests: which devices a container asks for, read from its environment and annotations
//! (DESIGN.md "Compatibility contracts").
//!
//! Two steps, so that the common container start (nothing requested) costs nothing:
//! 1. [`collect`] reads `process.env` and `annotations` of the OCI runtime spec, with only the
//!    profiles as context (no discovery): it returns an empty [`Request`] when no selection
//!    variable is set, and rejects what is wrong whatever the host has (`3-1`, `0,,1`, `0-`, an
//!    unknown capability).
//! 2. [`VendorRequest::resolve`] maps the selection onto what discovery found, rejecting devices
//!    the node does not have, with the devices that exist in the message.
//!
//! Which variable belongs to which vendor comes from each profile's `selection` table, so a user
//! profile's variable works like the built-in ones.
//!
//! Semantics of a device variable's value (the same for every vendor):
//! | value | meaning |
//! |---|---|
//! | unset, `void`, empty | nothing requested for this vendor |
//! | `none` | no devices, but the vendor's control nodes and driver files (as nvidia-container-toolkit: a container can run nvidia-smi-less CUDA tools that only need the driver) |
//! | `all` (any case: Neuron documents `ALL`) | every device of the vendor (zero devices on a node without any: not an error) |
//! | `0,2` | device indexes |
//! | `0-3` | a range, only for profiles with `selection.ranges` (Neuron); `3-1`, `0-` are errors |
//! | `GPU-8f6a...` | a device UUID (serial), exact or a unique prefix, case-insensitive |
//! | `MIG-<uuid>`, `0:1` (GPU:MIG index), `0:2:0` (GPU:GI:CI), `MIG-GPU-<uuid>/<gi>/<ci>` | MIG devices (NVIDIA), as nvidia-container-toolkit accepts them: the parent GPU's node and the instance's capability nodes. Served from a CDI spec when one names them, else from discovery with NVML (loaded only for such a request) |
//! | `vendor.com/class=name` | a fully qualified CDI device name, resolved through the CDI registry |
//!
//! Duplicates: when a variable appears several times in `process.env`, the LAST one wins (Docker
//! appends its own values after the image's; field case F01).
//!
//! Answers per resource: a container that asks the device plugin for two resources of one vendor
//! (`nvidia.com/mig-1g.10gb` and `nvidia.com/mig-2g.20gb`) gets two answers for the one selection
//! variable, and the kubelet keeps only one of them. The plugin's `envvar` strategy therefore also
//! writes each answer to a variable of its own, [`per_resource_variable`]
//! (`NVIDIA_VISIBLE_DEVICES_ACTK_NVIDIA_COM_MIG_1G_10GB`), and the selection is the union of the
//! selection variable and every such variable of it (issue 28 item 10). They are env like the
//! selection variable, under the same trust policy key (`env_requests`): they widen nothing a
//! container could not already ask for with the selection variable itself.
//!
//! Who may ask: [`collect_from`] takes a [`Sources`] that says which inputs the node's trust
//! policy ([`crate::policy`]) trusts for this container. A selection variable or annotation from
//! an untrusted input is not parsed; it is listed in [`Request::refused`]. The device list
//! (mounts under [`crate::policy::DEVICE_LIST_DIR`], [`device_list`]) is the kubelet's allocation:
//! for a vendor it lists, it is the selection, and that vendor's selection variable is ignored.
//!
//! Bounded work: a value longer than [`MAX_VALUE_BYTES`] is refused before it is parsed, one
//! value selects at most 65536 entries, and de-duplication uses hash sets, so the cost of a
//! request is linear in its size (`cargo bench -p actk-core --bench request` prints it per KB).

use crate::cdi::name::QualifiedName;
use crate::inventory::VendorInventory;
use crate::policy::{Channel, DEVICE_LIST_DIR, DEVICE_LIST_SOURCE};
use crate::profile::Profile;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Annotation key prefix whose values are comma-separated qualified CDI names (CDI SPEC.md,
/// "cdi.k8s.io/" annotations as kubelet and CRI runtimes use them).
pub const CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// Longest value of one selection variable, capabilities variable or `cdi.k8s.io/` annotation
/// that is parsed (1 MiB). The value comes from the image or the pod and is parsed at every
/// container start (and every kubelet retry): the limit bounds that work. A legitimate request
/// is a few KB (64 GPU UUIDs are 2.6 KB); the kernel refuses a single environment string over
/// 128 KiB at exec anyway.
pub const MAX_VALUE_BYTES: usize = 1 << 20;

/// Everything a container asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Request {
    /// One entry per vendor whose selection variable is set to something other than `void`/empty,
    /// or that the device list names.
    pub vendors: Vec<VendorRequest>,
    /// Fully qualified CDI names, from annotations, a selection variable or the device list, in order.
    pub cdi_names: Vec<CdiNameRequest>,
    /// Requests from inputs the trust policy does not trust for this container (not parsed).
    pub refused: Vec<Refused>,
    /// Notes about inputs that were set but are not requests (a selection variable of a vendor
    /// the device list serves, a mount under the device list directory that is not an entry).
    pub notes: Vec<String>,
    /// NVIDIA MIG management capabilities asked for (`NVIDIA_MIG_CONFIG_DEVICES`,
    /// `NVIDIA_MIG_MONITOR_DEVICES`), served to privileged containers only.
    pub mig_capabilities: Vec<MigCapabilityRequest>,
}

/// A request the trust policy refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The variable, `annotation KEY` or `mount PATH` that asked.
    pub source: String,
    /// Its value, shortened to at most a few hundred bytes for messages.
    pub value: String,
    /// The input it came through (names the policy key).
    pub channel: Channel,
}

/// The inputs of one container and how far the trust policy trusts each (for [`collect_from`]).
#[derive(Debug, Clone, Copy)]
pub struct Sources<'a> {
    /// `process.env` (`NAME=value` strings).
    pub env: &'a [String],
    /// `annotations`.
    pub annotations: &'a BTreeMap<String, String>,
    /// The device list (already checked against the policy's `mount_requests`).
    pub device_list: &'a [ListedDevice],
    /// Whether selection variables are requests (policy `env_requests` for this container).
    pub env_trusted: bool,
    /// Whether `cdi.k8s.io/` annotations are requests (policy `annotation_requests`).
    pub annotations_trusted: bool,
}

/// One device of the device list: a mount of `/dev/null` at
/// `/var/run/actk/devices/<vendor>/<class>/<name>`, meaning the CDI device `<vendor>/<class>=<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedDevice {
    /// CDI kind (`nvidia.com/gpu`).
    pub kind: String,
    /// CDI device name within the kind (`0`, `GPU-...`, `all`).
    pub name: String,
}

/// The device list of an OCI runtime spec's `mounts` (runtime-spec config.md "Mounts"): every
/// bind mount whose destination is `DEVICE_LIST_DIR/<vendor>/<class>/<name>` and whose source is
/// `/dev/null`, in mount order, without duplicates. Mounts under the directory that are not
/// entries (another source, a malformed path, an invalid CDI name) are ignored with a note.
pub fn device_list(mounts: &[Value]) -> (Vec<ListedDevice>, Vec<String>) {
    let mut list = Vec::new();
    let mut notes = Vec::new();
    let mut seen = HashSet::new();
    for m in mounts {
        let Some(dest) = m.get("destination").and_then(Value::as_str) else { continue };
        let comps: Vec<&str> = dest.split('/').filter(|c| !c.is_empty()).collect();
        let dir: Vec<&str> = DEVICE_LIST_DIR.split('/').filter(|c| !c.is_empty()).collect();
        if comps.len() <= dir.len() || comps[..dir.len()] != dir[..] {
            continue;
        }
        let rest = &comps[dir.len()..];
        let source = m.get("source").and_then(Value::as_str).unwrap_or("");
        let bind = m.get("type").and_then(Value::as_str) == Some("bind")
            || m.get("options")
                .and_then(Value::as_array)
                .is_some_and(|o| o.iter().any(|x| x == "bind" || x == "rbind"));
        let ignore = |why: String| format!("mount {dest} ignored: {why}");
        if source != DEVICE_LIST_SOURCE || !bind {
            notes.push(ignore(format!(
                "a device list entry is a bind mount of {DEVICE_LIST_SOURCE} (the device plugin's volume-mounts strategy), this one mounts {source:?}"
            )));
            continue;
        }
        let [vendor, class, name] = rest else {
            notes.push(ignore(format!("expected {DEVICE_LIST_DIR}/<vendor>/<class>/<device>")));
            continue;
        };
        let qualified = format!("{vendor}/{class}={name}");
        if let Err(e) = QualifiedName::parse(&qualified) {
            notes.push(ignore(e.to_string()));
            continue;
        }
        if list.len() >= MAX_SELECTED {
            notes.push(ignore(format!("the device list has more than {MAX_SELECTED} entries")));
            break;
        }
        if seen.insert(qualified) {
            list.push(ListedDevice { kind: format!("{vendor}/{class}"), name: name.to_string() });
        }
    }
    (list, notes)
}

/// The env variables of NVIDIA's MIG management capabilities and the capability each grants
/// (nvidia-container-toolkit: `config` lets a privileged container create and destroy MIG
/// instances, `monitor` lets it watch all of them).
pub const MIG_CAPABILITY_ENV: &[(&str, &str)] =
    &[("NVIDIA_MIG_CONFIG_DEVICES", "config"), ("NVIDIA_MIG_MONITOR_DEVICES", "monitor")];

/// One MIG management capability request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigCapabilityRequest {
    /// `NVIDIA_MIG_CONFIG_DEVICES` or `NVIDIA_MIG_MONITOR_DEVICES`.
    pub variable: String,
    /// Its value (`all`, or GPU indexes: the capability is node-wide either way).
    pub value: String,
    /// `config` or `monitor`.
    pub capability: String,
}

/// A fully qualified CDI device name and where it was asked for (for error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiNameRequest {
    /// `vendor.com/class=name`.
    pub name: String,
    /// `NVIDIA_VISIBLE_DEVICES` or `annotation cdi.k8s.io/foo`.
    pub source: String,
}

/// The request for one vendor profile.
#[derive(Debug, Clone, PartialEq)]
pub struct VendorRequest {
    /// Profile name (`nvidia`).
    pub profile: String,
    /// CDI kind (`nvidia.com/gpu`).
    pub kind: String,
    /// The variable that selected the devices (`NVIDIA_VISIBLE_DEVICES`, or the cores variable).
    pub variable: String,
    /// Its value as given.
    pub value: String,
    /// What was selected.
    pub selection: Selection,
    /// Driver capabilities, validated, in the order given, without duplicates.
    pub capabilities: Vec<String>,
    /// Physical cores per core of the cores variable (the profile's `logical_core_size_env`,
    /// e.g. `NEURON_LOGICAL_NC_CONFIG=2`); 1 when unset.
    pub logical_core_size: u32,
}

/// What a device variable selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// `none`: no devices, only the vendor's control nodes and driver files.
    DriverOnly,
    /// `all`.
    All,
    /// Listed devices, in the order given (duplicates removed at resolution).
    Devices(Vec<DeviceRef>),
    /// Cores (`NEURON_RT_VISIBLE_CORES`): the devices holding them are selected.
    Cores(Vec<u32>),
}

/// One listed device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceRef {
    /// A device index (nvidia-smi index, neuron-ls id).
    Index(u32),
    /// A UUID or serial (or a prefix of one).
    Uuid(String),
    /// A MIG device (`MIG-...` or `gpu:instance`).
    Mig(String),
}

/// A request that cannot be served. Displays as `VARIABLE=value: problem`, e.g.
/// `NVIDIA_VISIBLE_DEVICES=7: no such device 7; this node has nvidia.com/gpu 0-1`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={}: {problem}", shorten(.value))]
pub struct RequestError {
    /// Variable or `annotation KEY`.
    pub variable: String,
    /// The value as given.
    pub value: String,
    /// What is wrong and what would be right.
    pub problem: String,
}

/// `value` for messages: as is up to 256 bytes, else its first 64 characters and its length
/// (a refused 1 MB value must not become a 1 MB log line).
pub fn shorten(value: &str) -> String {
    if value.len() <= 256 {
        return value.to_string();
    }
    let cut = (0..=64).rev().find(|&i| value.is_char_boundary(i)).unwrap_or(0);
    format!("{}... ({} bytes)", &value[..cut], value.len())
}

/// Refuses a value over [`MAX_VALUE_BYTES`] before any parsing.
fn check_size(var: &str, value: &str) -> Result<(), RequestError> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(err(
            var,
            value,
            format!(
                "the value is {} bytes; a request may be at most {MAX_VALUE_BYTES} bytes (1 MiB): list fewer devices or use `all`",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// Capability vocabulary of the NVIDIA driver (nvidia-container-toolkit's
/// NVIDIA_DRIVER_CAPABILITIES); accepted for any profile that has a capabilities variable, on
/// top of the capability names the profile itself lists.
pub const DRIVER_CAPABILITIES: &[&str] = &["compute", "utility", "graphics", "video", "display", "compat32", "ngx"];

/// What sits between a selection variable and a resource's suffix in [`per_resource_variable`].
pub const PER_RESOURCE_INFIX: &str = "_ACTK_";

/// The variable holding the device plugin's answer for `resource` under selection variable
/// `var`: `var` + [`PER_RESOURCE_INFIX`] + the resource name in upper case with every other
/// character `_` (`NVIDIA_VISIBLE_DEVICES`, `nvidia.com/mig-1g.10gb` ->
/// `NVIDIA_VISIBLE_DEVICES_ACTK_NVIDIA_COM_MIG_1G_10GB`). See the module docs.
pub fn per_resource_variable(var: &str, resource: &str) -> String {
    let suffix: String =
        resource.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    format!("{var}{PER_RESOURCE_INFIX}{suffix}")
}

/// The per-resource variables of selection variable `var` in `env` ([`per_resource_variable`]),
/// by name (the last entry of a name wins, as for every variable).
fn per_resource_values<'a>(env: &'a [String], var: &str) -> BTreeMap<&'a str, &'a str> {
    let prefix = format!("{var}{PER_RESOURCE_INFIX}");
    let mut out = BTreeMap::new();
    for e in env {
        if let Some((name, value)) = e.split_once('=')
            && name.len() > prefix.len()
            && name.starts_with(&prefix)
        {
            out.insert(name, value);
        }
    }
    out
}

/// The union of a selection variable's value and its per-resource answers: `all` when one is
/// `all`, else every listed entry (duplicates are removed at resolution), `none` when every one
/// that asks is `none`, empty when none asks.
fn merge_answers<'a>(base: Option<&'a str>, answers: impl Iterator<Item = &'a str>) -> String {
    let parts: Vec<&str> = base.into_iter().chain(answers).map(str::trim).filter(|v| asks(v)).collect();
    if parts.iter().any(|p| p.eq_ignore_ascii_case("all")) {
        return "all".into();
    }
    let lists: Vec<&str> = parts.iter().copied().filter(|p| !p.eq_ignore_ascii_case("none")).collect();
    match (lists.is_empty(), parts.is_empty()) {
        (false, _) => lists.join(","),
        (true, false) => "none".into(),
        (true, true) => String::new(),
    }
}

/// The value of `name` in an OCI `process.env` list (`NAME=value` strings): the LAST entry wins.
pub fn env_value<'a>(env: &'a [String], name: &str) -> Option<&'a str> {
    env.iter().rev().find_map(|e| e.strip_prefix(name).and_then(|rest| rest.strip_prefix('=')))
}

/// Collects the requests of one container from its env (`NAME=value`) and annotations, both
/// trusted and without a device list: [`collect_from`] with [`Sources`] that trust everything.
///
/// `default_capabilities` overrides a profile's default capabilities, keyed by profile name
/// (from the config file's `[nvidia] default_capabilities`). Returns an empty request, doing no
/// work beyond string comparisons, when nothing is requested. Errors: syntax errors in a
/// selection or capabilities variable, or a `cdi.k8s.io/` annotation that is not a qualified name.
pub fn collect(
    env: &[String],
    annotations: &BTreeMap<String, String>,
    profiles: &[Profile],
    default_capabilities: &BTreeMap<String, Vec<String>>,
) -> Result<Request, RequestError> {
    let sources = Sources { env, annotations, device_list: &[], env_trusted: true, annotations_trusted: true };
    collect_from(&sources, profiles, default_capabilities)
}

/// Collects the requests of one container from `sources` (see the module docs for who may ask).
///
/// Per vendor profile: the device list entries of its kind, when there are any, are the
/// selection (its selection variable is then ignored with a note, its cores variable left to
/// the vendor runtime); otherwise its selection variable (or cores variable) when the env is
/// trusted, or a [`Refused`] entry when it is not. Capabilities always come from the env: they
/// choose driver files for devices a trusted input granted; a capability that adds device nodes
/// (`fabric`) is an env request, refused (its files kept) when the env is not trusted.
/// Device list entries of kinds without a profile become CDI names.
///
/// Errors: as [`collect`], plus a value over [`MAX_VALUE_BYTES`]; values from untrusted inputs
/// are not parsed and cause no error.
pub fn collect_from(
    sources: &Sources<'_>,
    profiles: &[Profile],
    default_capabilities: &BTreeMap<String, Vec<String>>,
) -> Result<Request, RequestError> {
    let env = sources.env;
    let mut req = Request::default();
    let mut names = NameSet::default();
    for profile in profiles {
        let sel = &profile.selection;
        let devices_var = sel.env.iter().find_map(|v| env_value(env, v).map(|val| (v.as_str(), val)));
        // The device plugin's answers per resource (module docs), merged into the first variable.
        let answers = sel.env.first().map(|v| (v.as_str(), per_resource_values(env, v)));
        let merged: String;
        let devices_var = match answers.filter(|(_, a)| !a.is_empty()) {
            None => devices_var,
            Some((var, a)) => {
                // No note: this is every envvar allocation's normal case, not worth a warning.
                merged = merge_answers(devices_var.map(|(_, v)| v), a.values().copied());
                Some((var, merged.as_str()))
            }
        };
        let cores_var = sel.cores_env.as_deref().and_then(|v| env_value(env, v).map(|val| (v, val)));
        let listed: Vec<&ListedDevice> = sources.device_list.iter().filter(|d| d.kind == profile.kind).collect();
        if !listed.is_empty() {
            if let Some((var, val)) = devices_var.filter(|(_, v)| asks(v)) {
                if sources.env_trusted {
                    req.notes.push(format!(
                        "{var}={}: ignored, the device list ({DEVICE_LIST_DIR}/{}) is this container's allocation",
                        shorten(val),
                        profile.kind
                    ));
                } else {
                    req.refused.push(Refused { source: var.into(), value: shorten(val), channel: Channel::Env });
                }
            }
            let value = listed.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(",");
            let variable = format!("device list {DEVICE_LIST_DIR}/{}", profile.kind);
            let selection = if listed.iter().any(|d| d.name.eq_ignore_ascii_case("all")) {
                Selection::All
            } else {
                Selection::Devices(listed.iter().map(|d| listed_ref(&d.name)).collect())
            };
            let capabilities = capabilities_with(profile, env, default_capabilities, sources.env_trusted, &mut req)?;
            req.vendors.push(VendorRequest {
                profile: profile.name.clone(),
                kind: profile.kind.clone(),
                variable,
                value,
                selection,
                capabilities,
                // The device list names whole devices, never cores.
                logical_core_size: 1,
            });
            continue;
        }
        if !sources.env_trusted {
            // Not parsed: an untrusted value must neither cost work nor fail the container by its syntax.
            // The cores variable asks only when the devices variable is unset (as below).
            let asked = match devices_var {
                Some((var, val)) => asks(val).then_some((var, val)),
                None => cores_var.filter(|(_, v)| !v.trim().is_empty()),
            };
            if let Some((var, val)) = asked {
                req.refused.push(Refused { source: var.into(), value: shorten(val), channel: Channel::Env });
            }
            continue;
        }
        let (variable, value, selection) = match (devices_var, cores_var) {
            (Some((var, val)), _) => match parse_devices(var, val, sel.ranges, &mut names)? {
                Some(s) => (var, val, s),
                None => continue,
            },
            // The cores variable selects devices only when the devices variable is unset; it stays
            // in the env either way, for the vendor runtime to read.
            (None, Some((var, val))) => match parse_cores(var, val)? {
                Some(s) => (var, val, s),
                None => continue,
            },
            (None, None) => continue,
        };
        if let Selection::Devices(d) = &selection
            && d.is_empty()
        {
            // Only CDI names were listed: they go through the registry, no vendor request.
            continue;
        }
        let capabilities = capabilities(profile, env, default_capabilities)?;
        let logical_core_size =
            match sel.logical_core_size_env.as_deref().and_then(|v| env_value(env, v).map(|val| (v, val))) {
                None => 1,
                Some((var, val)) => match val.trim().parse::<u32>() {
                    Ok(n @ 1..=8) => n,
                    _ => return Err(err(var, val, "physical cores per logical core: 1, 2 (Trainium2), up to 8")),
                },
            };
        req.vendors.push(VendorRequest {
            logical_core_size,
            profile: profile.name.clone(),
            kind: profile.kind.clone(),
            variable: variable.to_string(),
            value: value.to_string(),
            selection,
            capabilities,
        });
    }
    for d in sources.device_list {
        if !profiles.iter().any(|p| p.kind == d.kind) {
            let source = format!("device list {DEVICE_LIST_DIR}/{}", d.kind);
            names.push(&format!("{}={}", d.kind, d.name), &source);
        }
    }
    if profiles.iter().any(|p| p.discovery == "nvidia") {
        for (var, cap) in MIG_CAPABILITY_ENV {
            let Some(v) = env_value(env, var) else { continue };
            let t = v.trim();
            if t.is_empty() || t.eq_ignore_ascii_case("void") || t.eq_ignore_ascii_case("none") {
                continue;
            }
            if !sources.env_trusted {
                req.refused.push(Refused { source: var.to_string(), value: shorten(v), channel: Channel::Env });
                continue;
            }
            req.mig_capabilities.push(MigCapabilityRequest {
                variable: var.to_string(),
                value: v.to_string(),
                capability: cap.to_string(),
            });
        }
    }
    for (key, value) in sources.annotations {
        if !key.starts_with(CDI_ANNOTATION_PREFIX) {
            continue;
        }
        let source = format!("annotation {key}");
        if !sources.annotations_trusted {
            if !value.trim().is_empty() {
                req.refused.push(Refused { source, value: shorten(value), channel: Channel::Annotation });
            }
            continue;
        }
        check_size(&source, value)?;
        for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if let Err(problem) = check_qualified(item) {
                return Err(RequestError { variable: source, value: value.clone(), problem });
            }
            names.push(item, &source);
            check_count(&source, value, names.list.len())?;
        }
    }
    req.cdi_names = names.list;
    Ok(req)
}

/// Whether a selection variable's value asks for something (not unset, empty or `void`).
fn asks(value: &str) -> bool {
    let v = value.trim();
    !v.is_empty() && !v.eq_ignore_ascii_case("void")
}

/// A device list name as a device reference: digits are an index, anything else a UUID/serial.
fn listed_ref(name: &str) -> DeviceRef {
    match name.parse::<u32>() {
        Ok(i) if name.bytes().all(|b| b.is_ascii_digit()) => DeviceRef::Index(i),
        _ => DeviceRef::Uuid(name.to_string()),
    }
}

/// Qualified names in request order without duplicates, de-duplicated through a hash set (a
/// linear search per name made 80k names cost 36 s).
#[derive(Default)]
struct NameSet {
    list: Vec<CdiNameRequest>,
    seen: HashSet<String>,
}

impl NameSet {
    fn push(&mut self, name: &str, source: &str) {
        if !self.seen.contains(name) {
            self.seen.insert(name.to_string());
            self.list.push(CdiNameRequest { name: name.to_string(), source: source.to_string() });
        }
    }
}

/// Checks a qualified CDI name with the CDI SPEC.md syntax rules; `Err` is the problem text.
fn check_qualified(item: &str) -> Result<(), String> {
    QualifiedName::parse(item).map(|_| ()).map_err(|e| e.to_string())
}

fn err(variable: &str, value: &str, problem: impl Into<String>) -> RequestError {
    RequestError { variable: variable.to_string(), value: value.to_string(), problem: problem.into() }
}

/// Parses a device variable. `Ok(None)`: nothing requested (`void`, empty).
fn parse_devices(var: &str, value: &str, ranges: bool, names: &mut NameSet) -> Result<Option<Selection>, RequestError> {
    check_size(var, value)?;
    let v = value.trim();
    if v.is_empty() || v.eq_ignore_ascii_case("void") {
        return Ok(None);
    }
    if v.eq_ignore_ascii_case("none") {
        return Ok(Some(Selection::DriverOnly));
    }
    if v.eq_ignore_ascii_case("all") {
        return Ok(Some(Selection::All));
    }
    let mut refs = Vec::new();
    for item in v.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(err(var, value, "empty entry in the list; separate device ids with single commas"));
        }
        if item.contains('=') {
            check_qualified(item).map_err(|problem| err(var, value, problem))?;
            names.push(item, var);
            check_count(var, value, names.list.len())?;
        } else if item.bytes().all(|b| b.is_ascii_digit()) {
            refs.push(DeviceRef::Index(parse_index(var, value, item)?));
        } else if item.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("mig")) || is_mig_pair(item) {
            refs.push(DeviceRef::Mig(item.to_string()));
        } else if let Some((a, b)) = item.split_once('-').filter(|(a, _)| a.bytes().all(|c| c.is_ascii_digit())) {
            if !ranges {
                return Err(err(
                    var,
                    value,
                    format!("{item:?}: ranges are not accepted for {var}; list the indexes (0,1,2)"),
                ));
            }
            for i in parse_range(var, value, a, b)? {
                refs.push(DeviceRef::Index(i));
            }
        } else {
            // Anything else is a UUID/serial; resolution rejects it when no device has it.
            refs.push(DeviceRef::Uuid(item.to_string()));
        }
        check_count(var, value, refs.len())?;
    }
    Ok(Some(Selection::Devices(refs)))
}

/// `GPU:MIG` (`0:1`) or `GPU:GI:CI` (`0:2:0`): two or three colon-separated numbers.
fn is_mig_pair(item: &str) -> bool {
    let parts: Vec<&str> = item.split(':').collect();
    (2..=3).contains(&parts.len()) && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
}

fn parse_index(var: &str, value: &str, item: &str) -> Result<u32, RequestError> {
    item.parse::<u32>().map_err(|_| err(var, value, format!("{item:?} is not a device index")))
}

fn parse_range(var: &str, value: &str, a: &str, b: &str) -> Result<std::ops::RangeInclusive<u32>, RequestError> {
    let item = format!("{a}-{b}");
    if a.is_empty() || b.is_empty() || !b.bytes().all(|c| c.is_ascii_digit()) {
        return Err(err(var, value, format!("{item:?} is not a range; write FIRST-LAST, e.g. 0-3")));
    }
    let (lo, hi) = (parse_index(var, value, a)?, parse_index(var, value, b)?);
    if lo > hi {
        return Err(err(var, value, format!("range {item:?} runs backwards; write {hi}-{lo}")));
    }
    check_count(var, value, (hi - lo) as usize + 1)?;
    Ok(lo..=hi)
}

/// Most entries one variable may select. The value comes from the container image: without a
/// bound, `0-4294967295` would expand into billions of entries (minutes and tens of GiB on
/// every container start). No node has this many devices or cores.
const MAX_SELECTED: usize = 65536;

fn check_count(var: &str, value: &str, n: usize) -> Result<(), RequestError> {
    if n > MAX_SELECTED {
        return Err(err(var, value, format!("selects {n} or more entries; no node has more than {MAX_SELECTED}")));
    }
    Ok(())
}

/// Parses a cores variable (`0-3`, `0,2`, ranges always accepted). `Ok(None)`: empty.
fn parse_cores(var: &str, value: &str) -> Result<Option<Selection>, RequestError> {
    check_size(var, value)?;
    let v = value.trim();
    if v.is_empty() {
        return Ok(None);
    }
    let mut cores = Vec::new();
    for item in v.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(err(var, value, "empty entry in the list; separate core ids with single commas"));
        }
        match item.split_once('-') {
            Some((a, b)) => cores.extend(parse_range(var, value, a, b)?),
            None if item.bytes().all(|b| b.is_ascii_digit()) => cores.push(parse_index(var, value, item)?),
            None => return Err(err(var, value, format!("{item:?} is not a core index"))),
        }
        check_count(var, value, cores.len())?;
    }
    Ok(Some(Selection::Cores(cores)))
}

/// Capabilities of a profile's request ([`capabilities_with`] for a container whose env
/// requests are trusted).
fn capabilities(
    profile: &Profile,
    env: &[String],
    overrides: &BTreeMap<String, Vec<String>>,
) -> Result<Vec<String>, RequestError> {
    capabilities_with(profile, env, overrides, true, &mut Request::default())
}

/// Capabilities of a profile's request: the capabilities variable (last duplicate wins), else the
/// config override, else the profile default; a profile without a capabilities variable gets its
/// defaults, or every capability it lists when it has no defaults.
///
/// Capabilities that add device nodes ([`Profile::node_capabilities`]) are a request of the
/// env: when `env_trusted` is false, one the variable names is left out and listed in
/// `req.refused` (its nodes are refused as a selection variable would be), and `all` means every
/// other capability, with a note naming what it left out. Capabilities that only add files stay.
/// The config override and the profile's defaults are the admin's, never refused.
fn capabilities_with(
    profile: &Profile,
    env: &[String],
    overrides: &BTreeMap<String, Vec<String>>,
    env_trusted: bool,
    req: &mut Request,
) -> Result<Vec<String>, RequestError> {
    let sel = &profile.selection;
    let known: Vec<String> = {
        let mut k: Vec<String> = profile.capabilities.keys().filter(|c| c.as_str() != "base").cloned().collect();
        if sel.capabilities_env.is_some() {
            k.extend(DRIVER_CAPABILITIES.iter().map(|s| s.to_string()));
        }
        k.extend(sel.default_capabilities.iter().cloned());
        k.sort();
        k.dedup();
        k
    };
    let defaults = || -> Vec<String> {
        if let Some(o) = overrides.get(&profile.name) {
            return o.clone();
        }
        if !sel.default_capabilities.is_empty() || sel.capabilities_env.is_some() {
            return sel.default_capabilities.clone();
        }
        known.clone()
    };
    let Some(var) = sel.capabilities_env.as_deref() else {
        return Ok(defaults());
    };
    let value = match env_value(env, var) {
        Some(v) if !v.trim().is_empty() => v,
        // Unset or empty: the default set (as nvidia-container-toolkit treats an empty value).
        _ => return Ok(defaults()),
    };
    check_size(var, value)?;
    let mut caps: Vec<String> = Vec::new();
    let mut all = false;
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if item.eq_ignore_ascii_case("all") {
            all = true;
            continue;
        }
        if !known.iter().any(|k| k == item) {
            return Err(err(var, value, format!("unknown capability {item:?}; known: {}, all", known.join(", "))));
        }
        if !caps.iter().any(|c| c == item) {
            caps.push(item.to_string());
        }
    }
    if all {
        caps = known;
    }
    if env_trusted {
        return Ok(caps);
    }
    let nodes = profile.node_capabilities();
    let (untrusted, kept): (Vec<String>, Vec<String>) = caps.into_iter().partition(|c| nodes.contains(&c.as_str()));
    if !untrusted.is_empty() {
        let left_out = untrusted.join(",");
        if all {
            req.notes.push(format!(
                "{var}={}: `all` leaves out {left_out}, which adds device nodes: policy.env_requests does not trust this container's env to ask for them",
                shorten(value)
            ));
        } else {
            req.refused.push(Refused { source: var.to_string(), value: left_out, channel: Channel::Env });
        }
    }
    Ok(kept)
}

/// What a vendor request selects on a node ([`VendorRequest::resolve_all`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    /// Whole devices by index, ascending.
    pub devices: Vec<u32>,
    /// MIG devices as (GPU index, MIG index), ascending.
    pub migs: Vec<(u32, u32)>,
}

/// The MIG devices of a node for error messages: `MIG devices on this node: 0:0-3, 1:0-6` (with
/// `actk list` named for their UUIDs), or that there are none.
fn mig_summary(vendor: Option<&VendorInventory>) -> String {
    let Some(v) = vendor else { return "this node has no MIG devices".into() };
    let parts: Vec<String> = v
        .devices
        .iter()
        .filter_map(|d| {
            let m = d.mig.as_ref().filter(|m| m.enabled && !m.devices.is_empty())?;
            let idx: Vec<u32> = m.devices.iter().map(|x| x.index).collect();
            Some(format!("{}:{}", d.index, format_indexes(&idx)))
        })
        .collect();
    if parts.is_empty() {
        "this node has no MIG devices".into()
    } else {
        format!("MIG devices on this node: {} (GPU:MIG; `actk list` shows their UUIDs)", parts.join(", "))
    }
}

/// Every index, ascending, comma-separated (`0,1,2,3`), or `none`: the form error messages use
/// for "the devices that exist", so that each index can be read (and matched) on its own.
pub fn list_indexes(indexes: &[u32]) -> String {
    let mut v = indexes.to_vec();
    v.sort_unstable();
    v.dedup();
    if v.is_empty() {
        return "none".into();
    }
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Device indexes as a short list: `0-7`, `0,2,5-6`, or `none`.
pub fn format_indexes(indexes: &[u32]) -> String {
    let mut v = indexes.to_vec();
    v.sort_unstable();
    v.dedup();
    if v.is_empty() {
        return "none".into();
    }
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(if j == i { v[i].to_string() } else { format!("{}-{}", v[i], v[j]) });
        i = j + 1;
    }
    parts.join(",")
}

impl VendorRequest {
    fn err(&self, problem: impl Into<String>) -> RequestError {
        err(&self.variable, &self.value, problem)
    }

    fn available(&self, vendor: Option<&VendorInventory>) -> String {
        let idx: Vec<u32> = vendor.map(|v| v.devices.iter().map(|d| d.index).collect()).unwrap_or_default();
        if idx.is_empty() {
            format!("this node has no {} devices", self.kind)
        } else {
            format!("this node has {} {}", self.kind, list_indexes(&idx))
        }
    }

    /// Maps the selection onto discovered devices: the selected device indexes, ascending and
    /// without duplicates (`DriverOnly` gives none; `All` gives every device, possibly none).
    /// Errors as [`VendorRequest::resolve_all`]; a selection of MIG devices is an error here
    /// (they are not whole devices: use `resolve_all`).
    pub fn resolve(&self, vendor: Option<&VendorInventory>) -> Result<Vec<u32>, RequestError> {
        let r = self.resolve_all(vendor)?;
        if let Some((g, m)) = r.migs.first() {
            return Err(self.err(format!("{g}:{m} is a MIG device, not a whole device")));
        }
        Ok(r.devices)
    }

    /// Maps the selection onto discovered devices and MIG devices (both ascending, without
    /// duplicates). Errors name the variable, the value, and what exists: an index or UUID the
    /// node lacks, an ambiguous UUID prefix, a core beyond the cores the devices have, a MIG id
    /// no MIG device has, a MIG request on a GPU without MIG (or with MIG off).
    pub fn resolve_all(&self, vendor: Option<&VendorInventory>) -> Result<Resolved, RequestError> {
        let devices = vendor.map(|v| v.devices.as_slice()).unwrap_or(&[]);
        let mut out = Vec::new();
        let mut migs = Vec::new();
        match &self.selection {
            Selection::DriverOnly => {}
            Selection::All => out.extend(devices.iter().map(|d| d.index)),
            Selection::Devices(refs) => {
                // Built once per request, not per listed device: a 1 MB value lists 24k UUIDs.
                let indexes: HashSet<u32> = devices.iter().map(|d| d.index).collect();
                let uuids: Vec<(u32, String)> = devices
                    .iter()
                    .filter_map(|d| d.uuid.as_ref().map(|id| (d.index, id.to_ascii_lowercase())))
                    .collect();
                let exact: HashMap<&str, u32> = uuids.iter().map(|(i, id)| (id.as_str(), *i)).collect();
                for r in refs {
                    match r {
                        DeviceRef::Index(i) => {
                            if !indexes.contains(i) {
                                return Err(self.err(format!("no such device {i}; {}", self.available(vendor))));
                            }
                            out.push(*i);
                        }
                        DeviceRef::Uuid(u) => out.push(self.resolve_uuid(u, &uuids, &exact, vendor)?),
                        DeviceRef::Mig(m) => migs.push(self.resolve_mig(m, vendor)?),
                    }
                }
            }
            Selection::Cores(cores) => {
                let mut first = 0u32;
                let mut spans = Vec::new();
                let lnc = self.logical_core_size.max(1);
                for d in devices {
                    let physical = d.cores.ok_or_else(|| {
                        self.err(format!(
                            "device {} does not report its core count, so cores cannot be mapped to devices",
                            d.index
                        ))
                    })?;
                    if physical % lnc != 0 {
                        return Err(self.err(format!(
                            "device {} has {physical} cores, which do not group into logical cores of {lnc}",
                            d.index
                        )));
                    }
                    let n = physical / lnc;
                    spans.push((first, first + n, d.index));
                    first += n;
                }
                for c in cores {
                    match spans.iter().find(|(lo, hi, _)| c >= lo && c < hi) {
                        Some((_, _, idx)) => out.push(*idx),
                        None => {
                            let have = if first == 0 { "none".to_string() } else { format!("0-{}", first - 1) };
                            return Err(self.err(format!(
                                "no such core {c}; this node has cores {have} on {} {}",
                                self.kind,
                                list_indexes(&devices.iter().map(|d| d.index).collect::<Vec<_>>())
                            )));
                        }
                    }
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        migs.sort_unstable();
        migs.dedup();
        Ok(Resolved { devices: out, migs })
    }

    /// A MIG device `(GPU index, MIG index)` from `MIG-<uuid>` (exact or a unique prefix, any
    /// case), the pre-R470 `MIG-GPU-<uuid>/<gi>/<ci>`, `<gpu>:<mig>` or `<gpu>:<gi>:<ci>`.
    fn resolve_mig(&self, m: &str, vendor: Option<&VendorInventory>) -> Result<(u32, u32), RequestError> {
        let devices = vendor.map(|v| v.devices.as_slice()).unwrap_or(&[]);
        let all: Vec<(&crate::inventory::Device, &crate::inventory::MigDevice)> =
            vendor.map(|v| v.mig_devices().collect()).unwrap_or_default();
        let existing = || mig_summary(vendor);
        if is_mig_pair(m) {
            let n: Vec<u32> = m.split(':').filter_map(|p| p.parse().ok()).collect();
            if n.len() != m.split(':').count() {
                return Err(self.err(format!("{m:?} is not a MIG device id; write GPU:MIG such as 0:1")));
            }
            let gpu = n[0];
            let Some(d) = devices.iter().find(|d| d.index == gpu) else {
                return Err(self.err(format!("{m:?}: no such GPU {gpu}; {}", self.available(vendor))));
            };
            let mig = self.mig_of(d, m, vendor)?;
            let found = match n[..] {
                [_, idx] => mig.devices.iter().find(|x| x.index == idx),
                [_, gi, ci] => mig.devices.iter().find(|x| x.gpu_instance == gi && x.compute_instance == ci),
                _ => None,
            };
            return match found {
                Some(x) => Ok((gpu, x.index)),
                None => Err(self.err(format!(
                    "{m:?}: GPU {gpu} has no such MIG device; it has {}",
                    mig.devices
                        .iter()
                        .map(|x| format!(
                            "{gpu}:{} ({}, GI {} CI {})",
                            x.index, x.profile, x.gpu_instance, x.compute_instance
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))),
            };
        }
        // MIG-GPU-<uuid>/<gi>/<ci> (the form before R470, still accepted by NVML).
        if let Some(rest) =
            m.get(4..).filter(|r| m[..4].eq_ignore_ascii_case("mig-") && r.to_ascii_lowercase().starts_with("gpu-"))
            && let Some((gpu_uuid, gi_ci)) = rest.split_once('/')
        {
            let uuids: Vec<(u32, String)> =
                devices.iter().filter_map(|d| d.uuid.as_ref().map(|id| (d.index, id.to_ascii_lowercase()))).collect();
            let exact: HashMap<&str, u32> = uuids.iter().map(|(i, id)| (id.as_str(), *i)).collect();
            let gpu = self.resolve_uuid(gpu_uuid, &uuids, &exact, vendor)?;
            let d = devices.iter().find(|d| d.index == gpu).expect("resolved");
            let mig = self.mig_of(d, m, vendor)?;
            let ids: Vec<Option<u32>> = gi_ci.split('/').map(|p| p.parse().ok()).collect();
            let [Some(gi), Some(ci)] = ids[..] else {
                return Err(self.err(format!("{m:?} is not MIG-GPU-<uuid>/<gi>/<ci>")));
            };
            return match mig.devices.iter().find(|x| x.gpu_instance == gi && x.compute_instance == ci) {
                Some(x) => Ok((gpu, x.index)),
                None => Err(self.err(format!(
                    "{m:?}: GPU {gpu} has no GPU instance {gi} with compute instance {ci}; {}",
                    existing()
                ))),
            };
        }
        let lower = m.to_ascii_lowercase();
        if let Some((d, x)) = all.iter().find(|(_, x)| x.uuid.to_ascii_lowercase() == lower) {
            return Ok((d.index, x.index));
        }
        let prefixed: Vec<(u32, u32)> = all
            .iter()
            .filter(|(_, x)| x.uuid.to_ascii_lowercase().starts_with(&lower))
            .map(|(d, x)| (d.index, x.index))
            .collect();
        match prefixed.as_slice() {
            [one] => Ok(*one),
            [] => Err(self.err(format!("no MIG device has the id {m:?}; {}", existing()))),
            many => Err(self.err(format!(
                "{m:?} is a prefix of the UUIDs of MIG devices {}; give more of the UUID",
                many.iter().map(|(g, x)| format!("{g}:{x}")).collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    /// The MIG state of GPU `d` when MIG is on; errors say why a MIG device cannot be on it.
    fn mig_of<'a>(
        &self,
        d: &'a crate::inventory::Device,
        m: &str,
        vendor: Option<&VendorInventory>,
    ) -> Result<&'a crate::inventory::Mig, RequestError> {
        let name = d.model.as_deref().map(|n| format!(" ({n})")).unwrap_or_default();
        match &d.mig {
            Some(mig) if mig.enabled => Ok(mig),
            Some(_) => Err(self.err(format!("{m:?}: GPU {}{name} has MIG disabled; {}", d.index, mig_summary(vendor)))),
            None => Err(self.err(format!(
                "{m:?}: GPU {}{name} does not support MIG (or NVML could not be read on this node); {}",
                d.index,
                mig_summary(vendor)
            ))),
        }
    }

    fn resolve_uuid(
        &self,
        u: &str,
        uuids: &[(u32, String)],
        exact: &HashMap<&str, u32>,
        vendor: Option<&VendorInventory>,
    ) -> Result<u32, RequestError> {
        let lower = u.to_ascii_lowercase();
        if let Some(i) = exact.get(lower.as_str()) {
            return Ok(*i);
        }
        let prefixed: Vec<u32> = uuids.iter().filter(|(_, id)| id.starts_with(&lower)).map(|(i, _)| *i).collect();
        match prefixed.as_slice() {
            [one] => Ok(*one),
            [] => Err(self.err(format!("no device has the id {u:?}; {}", self.available(vendor)))),
            many => Err(self
                .err(format!("{u:?} is a prefix of the ids of devices {}; give more of the id", format_indexes(many)))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::Device;
    use crate::profile::{CapabilityFiles, Selection as ProfileSelection};

    fn nvidia() -> Profile {
        let mut caps = BTreeMap::new();
        for c in ["base", "utility", "compute", "video"] {
            caps.insert(c.to_string(), CapabilityFiles::default());
        }
        Profile {
            name: "nvidia".into(),
            kind: "nvidia.com/gpu".into(),
            discovery: "nvidia".into(),
            selection: ProfileSelection {
                env: vec!["NVIDIA_VISIBLE_DEVICES".into()],
                capabilities_env: Some("NVIDIA_DRIVER_CAPABILITIES".into()),
                default_capabilities: vec!["utility".into(), "compute".into()],
                ..Default::default()
            },
            capabilities: caps,
            ..Default::default()
        }
    }

    fn neuron() -> Profile {
        Profile {
            name: "neuron".into(),
            kind: "aws.amazon.com/neuron".into(),
            selection: ProfileSelection {
                env: vec!["AWS_NEURON_VISIBLE_DEVICES".into()],
                cores_env: Some("NEURON_RT_VISIBLE_CORES".into()),
                ranges: true,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn inv(kind: &str, n: u32, cores: Option<u32>) -> VendorInventory {
        VendorInventory {
            kind: kind.into(),
            devices: (0..n)
                .map(|i| Device { index: i, uuid: Some(format!("GPU-{i}{i}aa0000-1111")), cores, ..Default::default() })
                .collect(),
            ..Default::default()
        }
    }

    fn env(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn req(e: &[&str]) -> Result<Request, RequestError> {
        collect(&env(e), &BTreeMap::new(), &[nvidia(), neuron()], &BTreeMap::new())
    }

    fn nv_indexes(e: &[&str], n: u32) -> Result<Vec<u32>, RequestError> {
        let r = req(e)?;
        let v = r.vendors.iter().find(|v| v.profile == "nvidia").expect("an nvidia request");
        v.resolve(Some(&inv("nvidia.com/gpu", n, None)))
    }

    fn neuron_indexes(value: &str) -> Result<Vec<u32>, RequestError> {
        let r = req(&[&format!("AWS_NEURON_VISIBLE_DEVICES={value}")])?;
        r.vendors[0].resolve(Some(&inv("aws.amazon.com/neuron", 12, Some(2))))
    }

    #[test]
    fn f01_last_duplicate_wins_void_after_all() {
        let r = req(&["NVIDIA_VISIBLE_DEVICES=all", "PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"]).unwrap();
        assert_eq!(r, Request::default(), "void after all must request nothing");
        let r = req(&["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES=1"]).unwrap();
        assert_eq!(r.vendors[0].selection, Selection::Devices(vec![DeviceRef::Index(1)]));
    }

    #[test]
    fn unset_void_and_empty_request_nothing() {
        for e in [
            &[][..],
            &["NVIDIA_VISIBLE_DEVICES=void"][..],
            &["NVIDIA_VISIBLE_DEVICES="][..],
            &["NVIDIA_VISIBLE_DEVICES= "][..],
        ] {
            assert_eq!(req(e).unwrap(), Request::default(), "{e:?}");
        }
        // A variable whose name only starts like the selection variable is not it.
        assert_eq!(req(&["NVIDIA_VISIBLE_DEVICES_X=1"]).unwrap(), Request::default());
    }

    /// Issue 28 item 10: the device plugin answers each resource in a variable of its own; the
    /// selection is the union with the selection variable (of which the kubelet kept one answer),
    /// under the same trust as the selection variable.
    #[test]
    fn answers_per_resource_compose() {
        let mig1 = per_resource_variable("NVIDIA_VISIBLE_DEVICES", "nvidia.com/mig-1g.10gb");
        assert_eq!(mig1, "NVIDIA_VISIBLE_DEVICES_ACTK_NVIDIA_COM_MIG_1G_10GB");
        let mig2 = per_resource_variable("NVIDIA_VISIBLE_DEVICES", "nvidia.com/mig-2g.20gb");
        let r = req(&["NVIDIA_VISIBLE_DEVICES=MIG-b", &format!("{mig1}=MIG-a"), &format!("{mig2}=MIG-b")]).unwrap();
        assert_eq!(
            r.vendors[0].selection,
            Selection::Devices(vec![
                DeviceRef::Mig("MIG-b".into()),
                DeviceRef::Mig("MIG-a".into()),
                DeviceRef::Mig("MIG-b".into())
            ])
        );
        assert_eq!(r.vendors[0].variable, "NVIDIA_VISIBLE_DEVICES");
        // `all` anywhere is all; `none` adds nothing to a list; void answers ask nothing.
        let r = req(&[&format!("{mig1}=1"), &format!("{mig2}=all")]).unwrap();
        assert_eq!(r.vendors[0].selection, Selection::All);
        let r = req(&["NVIDIA_VISIBLE_DEVICES=none", &format!("{mig1}=2"), &format!("{mig2}=void")]).unwrap();
        assert_eq!(r.vendors[0].selection, Selection::Devices(vec![DeviceRef::Index(2)]));
        assert_eq!(req(&[&format!("{mig1}=void")]).unwrap(), Request::default());
        // The last entry of a name wins, as for every variable.
        let r = req(&[&format!("{mig1}=1"), &format!("{mig1}=3")]).unwrap();
        assert_eq!(r.vendors[0].selection, Selection::Devices(vec![DeviceRef::Index(3)]));
        // Neuron: two answers of AWS_NEURON_VISIBLE_DEVICES (neuron and neurondevice).
        let dev = per_resource_variable("AWS_NEURON_VISIBLE_DEVICES", "aws.amazon.com/neurondevice");
        let r = req(&["AWS_NEURON_VISIBLE_DEVICES=0", &format!("{dev}=4-5")]).unwrap();
        assert_eq!(r.vendors[0].resolve(Some(&inv("aws.amazon.com/neuron", 12, Some(2)))).unwrap(), vec![0, 4, 5]);
        // Untrusted env: refused like the selection variable, not parsed.
        let e = env(&[&format!("{mig1}=0,,x")]);
        let sources = Sources {
            env: &e,
            annotations: &BTreeMap::new(),
            device_list: &[],
            env_trusted: false,
            annotations_trusted: false,
        };
        let r = collect_from(&sources, &[nvidia()], &BTreeMap::new()).unwrap();
        assert!(r.vendors.is_empty());
        assert_eq!(r.refused.len(), 1, "{:?}", r.refused);
        assert_eq!(r.refused[0].channel, Channel::Env);
    }

    #[test]
    fn none_is_driver_only() {
        let r = req(&["NVIDIA_VISIBLE_DEVICES=none"]).unwrap();
        assert_eq!(r.vendors[0].selection, Selection::DriverOnly);
        assert_eq!(r.vendors[0].resolve(Some(&inv("nvidia.com/gpu", 2, None))).unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn all_indexes_and_uuids() {
        assert_eq!(nv_indexes(&["NVIDIA_VISIBLE_DEVICES=all"], 8).unwrap(), (0..8).collect::<Vec<_>>());
        assert_eq!(nv_indexes(&["NVIDIA_VISIBLE_DEVICES=3,1,3"], 8).unwrap(), vec![1, 3]);
        assert_eq!(nv_indexes(&["NVIDIA_VISIBLE_DEVICES=GPU-22aa0000-1111"], 8).unwrap(), vec![2]);
        assert_eq!(nv_indexes(&["NVIDIA_VISIBLE_DEVICES=gpu-55AA"], 8).unwrap(), vec![5], "unique prefix, any case");
        let e = nv_indexes(&["NVIDIA_VISIBLE_DEVICES=GPU-"], 8).unwrap_err().to_string();
        assert!(e.contains("prefix of the ids of devices 0-7"), "{e}");
        // `all` on a node without such devices selects nothing rather than failing.
        assert_eq!(nv_indexes(&["NVIDIA_VISIBLE_DEVICES=all"], 0).unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn unknown_device_names_variable_value_and_existing_devices() {
        let e = nv_indexes(&["NVIDIA_VISIBLE_DEVICES=7"], 2).unwrap_err().to_string();
        assert_eq!(e, "NVIDIA_VISIBLE_DEVICES=7: no such device 7; this node has nvidia.com/gpu 0,1");
        let e = nv_indexes(&["NVIDIA_VISIBLE_DEVICES=banana"], 2).unwrap_err().to_string();
        assert_eq!(
            e,
            "NVIDIA_VISIBLE_DEVICES=banana: no device has the id \"banana\"; this node has nvidia.com/gpu 0,1"
        );
        let e = req(&["NVIDIA_VISIBLE_DEVICES=0,,banana"]).unwrap_err().to_string();
        assert!(e.starts_with("NVIDIA_VISIBLE_DEVICES=0,,banana: empty entry"), "{e}");
        let e = req(&["NVIDIA_VISIBLE_DEVICES=99999999999"]).unwrap_err().to_string();
        assert!(e.contains("not a device index"), "{e}");
    }

    /// A node like the DGX A100 fixture: GPU 0 with MIG devices 0 (GI 2 CI 0) and 1 (GI 3 CI
    /// 0), GPU 1 MIG-capable but off, GPU 2 without MIG.
    fn mig_inv() -> VendorInventory {
        use crate::inventory::{Mig, MigDevice};
        let mut v = inv("nvidia.com/gpu", 3, None);
        let mig = |index, gi, uuid: &str, profile: &str| MigDevice {
            index,
            gpu_instance: gi,
            uuid: uuid.into(),
            profile: profile.into(),
            ..Default::default()
        };
        v.devices[0].mig = Some(Mig {
            enabled: true,
            devices: vec![
                mig(0, 2, "MIG-04e85a7c-8a74-584e-9f3f-bd495ea55d15", "3g.40gb"),
                mig(1, 3, "MIG-2ee5e993-14d2-5064-8132-0a3049d40754", "2g.20gb"),
            ],
        });
        v.devices[1].mig = Some(Mig { enabled: false, devices: vec![] });
        v.devices[1].model = Some("NVIDIA A100-SXM4-80GB".into());
        v
    }

    fn nv_resolve(value: &str) -> Result<Resolved, RequestError> {
        let r = req(&[&format!("NVIDIA_VISIBLE_DEVICES={value}")])?;
        r.vendors[0].resolve_all(Some(&mig_inv()))
    }

    #[test]
    fn mig_devices_by_uuid_index_pair_gi_ci_and_legacy_form() {
        let want = Resolved { devices: vec![], migs: vec![(0, 1)] };
        assert_eq!(nv_resolve("MIG-2ee5e993-14d2-5064-8132-0a3049d40754").unwrap(), want);
        assert_eq!(nv_resolve("mig-2EE5E993").unwrap(), want, "unique prefix, any case");
        assert_eq!(nv_resolve("0:1").unwrap(), want);
        assert_eq!(nv_resolve("0:3:0").unwrap(), want, "GPU:GI:CI");
        assert_eq!(nv_resolve("MIG-GPU-00aa0000-1111/3/0").unwrap(), want, "MIG-GPU-<uuid>/<gi>/<ci>");
        let both = nv_resolve("2,0:0,0:1,0:0").unwrap();
        assert_eq!(both, Resolved { devices: vec![2], migs: vec![(0, 0), (0, 1)] });
    }

    #[test]
    fn bad_mig_requests_name_the_value_and_what_exists() {
        let e = nv_resolve("MIG-deadbeef").unwrap_err().to_string();
        assert_eq!(
            e,
            "NVIDIA_VISIBLE_DEVICES=MIG-deadbeef: no MIG device has the id \"MIG-deadbeef\"; MIG devices on this node: 0:0-1 (GPU:MIG; `actk list` shows their UUIDs)"
        );
        let e = nv_resolve("1:0").unwrap_err().to_string();
        assert!(e.contains("GPU 1 (NVIDIA A100-SXM4-80GB) has MIG disabled") && e.contains("0:0-1"), "{e}");
        let e = nv_resolve("2:0").unwrap_err().to_string();
        assert!(e.contains("GPU 2 does not support MIG"), "{e}");
        let e = nv_resolve("0:7").unwrap_err().to_string();
        assert!(
            e.contains("GPU 0 has no such MIG device; it has 0:0 (3g.40gb, GI 2 CI 0), 0:1 (2g.20gb, GI 3 CI 0)"),
            "{e}"
        );
        let e = nv_resolve("9:0").unwrap_err().to_string();
        assert!(e.contains("no such GPU 9; this node has nvidia.com/gpu 0,1,2"), "{e}");
        // A node without MIG at all (or whose NVML was not read).
        let r = req(&["NVIDIA_VISIBLE_DEVICES=MIG-6f3a1c0e-0000"]).unwrap();
        let e = r.vendors[0].resolve_all(Some(&inv("nvidia.com/gpu", 2, None))).unwrap_err().to_string();
        assert!(e.ends_with("; this node has no MIG devices"), "{e}");
        // resolve() is for whole devices only.
        let r = req(&["NVIDIA_VISIBLE_DEVICES=0:1"]).unwrap();
        assert!(r.vendors[0].resolve(Some(&mig_inv())).unwrap_err().to_string().contains("is a MIG device"));
    }

    #[test]
    fn mig_capability_variables() {
        let r = req(&["NVIDIA_MIG_CONFIG_DEVICES=all", "NVIDIA_MIG_MONITOR_DEVICES=void"]).unwrap();
        assert_eq!(r.mig_capabilities.len(), 1);
        assert_eq!(
            (r.mig_capabilities[0].variable.as_str(), r.mig_capabilities[0].capability.as_str()),
            ("NVIDIA_MIG_CONFIG_DEVICES", "config")
        );
        assert!(req(&["NVIDIA_MIG_MONITOR_DEVICES="]).unwrap().mig_capabilities.is_empty());
    }

    #[test]
    fn nvidia_does_not_take_ranges() {
        let e = req(&["NVIDIA_VISIBLE_DEVICES=0-3"]).unwrap_err().to_string();
        assert!(e.contains("ranges are not accepted"), "{e}");
    }

    #[test]
    fn cdi_names_in_variables_and_annotations() {
        let mut ann = BTreeMap::new();
        ann.insert("cdi.k8s.io/test".to_string(), "example.com/accel=0, nvidia.com/gpu=1".to_string());
        ann.insert("other".to_string(), "x".to_string());
        let r = collect(
            &env(&["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1,nvidia.com/gpu=all"]),
            &ann,
            &[nvidia()],
            &BTreeMap::new(),
        )
        .unwrap();
        assert!(r.vendors.is_empty(), "only CDI names were listed");
        let names: Vec<_> = r.cdi_names.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, vec!["nvidia.com/gpu=1", "nvidia.com/gpu=all", "example.com/accel=0"]);
        ann.insert("cdi.k8s.io/bad".to_string(), "gpu0".to_string());
        let e = collect(&[], &ann, &[nvidia()], &BTreeMap::new()).unwrap_err().to_string();
        assert!(e.starts_with("annotation cdi.k8s.io/bad=gpu0:") && e.contains("gpu0"), "{e}");
    }

    #[test]
    fn capabilities_default_list_all_and_unknown() {
        let caps = |e: &[&str]| req(e).map(|r| r.vendors[0].capabilities.clone());
        assert_eq!(caps(&["NVIDIA_VISIBLE_DEVICES=0"]).unwrap(), vec!["utility", "compute"]);
        assert_eq!(
            caps(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES="]).unwrap(),
            vec!["utility", "compute"]
        );
        assert_eq!(
            caps(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=video,compute,video"]).unwrap(),
            vec!["video", "compute"]
        );
        let all = caps(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,all"]).unwrap();
        for c in DRIVER_CAPABILITIES {
            assert!(all.iter().any(|a| a == c), "{c} missing from all: {all:?}");
        }
        assert!(!all.iter().any(|a| a == "base"));
        let e = caps(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,warp"]).unwrap_err().to_string();
        assert!(e.starts_with("NVIDIA_DRIVER_CAPABILITIES=compute,warp: unknown capability \"warp\""), "{e}");
        // Config override of the default.
        let mut o = BTreeMap::new();
        o.insert("nvidia".to_string(), vec!["utility".to_string()]);
        let r = collect(&env(&["NVIDIA_VISIBLE_DEVICES=0"]), &BTreeMap::new(), &[nvidia()], &o).unwrap();
        assert_eq!(r.vendors[0].capabilities, vec!["utility"]);
    }

    #[test]
    fn f08_neuron_lists_ranges_and_all_on_12_devices() {
        assert_eq!(neuron_indexes("0-3").unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(neuron_indexes("0,1,2,3").unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(neuron_indexes("ALL").unwrap(), (0..12).collect::<Vec<_>>());
        assert_eq!(neuron_indexes("all").unwrap(), (0..12).collect::<Vec<_>>());
        assert_eq!(neuron_indexes("0-1,4,6-7").unwrap(), vec![0, 1, 4, 6, 7]);
        let e = neuron_indexes("3-1").unwrap_err().to_string();
        assert!(e.starts_with("AWS_NEURON_VISIBLE_DEVICES=3-1: range \"3-1\" runs backwards"), "{e}");
        let e = neuron_indexes("0-").unwrap_err().to_string();
        assert!(e.starts_with("AWS_NEURON_VISIBLE_DEVICES=0-: \"0-\" is not a range"), "{e}");
        let e = neuron_indexes("64").unwrap_err().to_string();
        assert_eq!(
            e,
            "AWS_NEURON_VISIBLE_DEVICES=64: no such device 64; this node has aws.amazon.com/neuron 0,1,2,3,4,5,6,7,8,9,10,11"
        );
    }

    #[test]
    fn neuron_cores_select_the_devices_holding_them() {
        let r = req(&["NEURON_RT_VISIBLE_CORES=2-5"]).unwrap();
        let v = &r.vendors[0];
        assert_eq!(v.variable, "NEURON_RT_VISIBLE_CORES");
        assert_eq!(v.resolve(Some(&inv("aws.amazon.com/neuron", 12, Some(2)))).unwrap(), vec![1, 2]);
        assert_eq!(v.resolve(Some(&inv("aws.amazon.com/neuron", 12, Some(8)))).unwrap(), vec![0]);
        let r = req(&["NEURON_RT_VISIBLE_CORES=24"]).unwrap();
        let e = r.vendors[0].resolve(Some(&inv("aws.amazon.com/neuron", 12, Some(2)))).unwrap_err().to_string();
        assert!(e.contains("no such core 24; this node has cores 0-23"), "{e}");
        // The devices variable wins over the cores variable for device selection.
        let r = req(&["NEURON_RT_VISIBLE_CORES=0", "AWS_NEURON_VISIBLE_DEVICES=5"]).unwrap();
        assert_eq!(r.vendors[0].selection, Selection::Devices(vec![DeviceRef::Index(5)]));
    }

    #[test]
    fn logical_core_size_groups_physical_cores() {
        let mut p = neuron();
        p.selection.logical_core_size_env = Some("NEURON_LOGICAL_NC_CONFIG".into());
        let trn2 = inv("aws.amazon.com/neuron", 4, Some(8));
        let r = |e: &[&str]| collect(&env(e), &BTreeMap::new(), std::slice::from_ref(&p), &BTreeMap::new());
        // LNC=2: 4 logical cores per device, so cores 4-7 are device 1.
        let v = &r(&["NEURON_RT_VISIBLE_CORES=4-7", "NEURON_LOGICAL_NC_CONFIG=2"]).unwrap().vendors[0];
        assert_eq!(v.resolve(Some(&trn2)).unwrap(), vec![1]);
        let v = &r(&["NEURON_RT_VISIBLE_CORES=4-7"]).unwrap().vendors[0];
        assert_eq!(v.resolve(Some(&trn2)).unwrap(), vec![0], "LNC=1: 8 cores per device");
        let e = r(&["NEURON_RT_VISIBLE_CORES=0", "NEURON_LOGICAL_NC_CONFIG=two"]).unwrap_err().to_string();
        assert!(e.starts_with("NEURON_LOGICAL_NC_CONFIG=two: physical cores per logical core"), "{e}");
        let v = &r(&["NEURON_RT_VISIBLE_CORES=0", "NEURON_LOGICAL_NC_CONFIG=3"]).unwrap().vendors[0];
        assert!(v.resolve(Some(&trn2)).unwrap_err().to_string().contains("do not group into logical cores of 3"));
    }

    #[test]
    fn user_profile_variable_works() {
        let p = Profile {
            name: "acme".into(),
            kind: "acme.com/npu".into(),
            selection: ProfileSelection { env: vec!["ACME_VISIBLE_NPUS".into()], ranges: true, ..Default::default() },
            ..Default::default()
        };
        let r = collect(&env(&["ACME_VISIBLE_NPUS=1-2"]), &BTreeMap::new(), &[p], &BTreeMap::new()).unwrap();
        assert_eq!(r.vendors[0].kind, "acme.com/npu");
        assert_eq!(r.vendors[0].resolve(Some(&inv("acme.com/npu", 4, None))).unwrap(), vec![1, 2]);
    }

    #[test]
    fn builtin_profiles_map_every_documented_variable() {
        let profiles = crate::profile::builtin();
        let e = env(&[
            "NVIDIA_VISIBLE_DEVICES=0",
            "AWS_NEURON_VISIBLE_DEVICES=0-1",
            "AMD_VISIBLE_DEVICES=all",
            "HABANA_VISIBLE_DEVICES=1,2",
        ]);
        let r = collect(&e, &BTreeMap::new(), &profiles, &BTreeMap::new()).unwrap();
        let kinds: Vec<&str> = r.vendors.iter().map(|v| v.kind.as_str()).collect();
        assert_eq!(kinds, ["nvidia.com/gpu", "aws.amazon.com/neuron", "amd.com/gpu", "habana.ai/gaudi"]);
        assert_eq!(r.vendors[0].capabilities, ["utility", "compute"]);
        assert_eq!(r.vendors[1].selection, Selection::Devices(vec![DeviceRef::Index(0), DeviceRef::Index(1)]));
        assert_eq!(r.vendors[2].selection, Selection::All);
        let r = collect(&env(&["NEURON_RT_VISIBLE_CORES=0-3"]), &BTreeMap::new(), &profiles, &BTreeMap::new()).unwrap();
        assert_eq!(r.vendors[0].selection, Selection::Cores(vec![0, 1, 2, 3]));
    }

    /// Issue 13 item 6: AMD_VISIBLE_DEVICES takes ranges as AMD's container runtime does.
    #[test]
    fn item6_amd_ranges_are_accepted_as_amds_runtime_does() {
        let profiles = crate::profile::builtin();
        let amd = |v: &str| {
            let r =
                collect(&env(&[&format!("AMD_VISIBLE_DEVICES={v}")]), &BTreeMap::new(), &profiles, &BTreeMap::new())?;
            r.vendors[0].resolve(Some(&inv("amd.com/gpu", 8, None)))
        };
        assert_eq!(amd("0-3").unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(amd("0,2-3,7").unwrap(), vec![0, 2, 3, 7]);
        let e = amd("3-1").unwrap_err().to_string();
        assert!(e.starts_with("AMD_VISIBLE_DEVICES=3-1: range \"3-1\" runs backwards"), "{e}");
        let e = amd("6-9").unwrap_err().to_string();
        assert!(e.contains("no such device 8; this node has amd.com/gpu 0,1,2,3,4,5,6,7"), "{e}");
    }

    #[test]
    fn format_indexes_compacts_runs() {
        assert_eq!(format_indexes(&[3, 0, 1, 2, 7, 5]), "0-3,5,7");
        assert_eq!(format_indexes(&[]), "none");
        assert_eq!(list_indexes(&[3, 1, 0, 1]), "0,1,3");
    }

    #[test]
    fn oversized_values_are_refused_before_parsing_and_messages_stay_short() {
        let big = format!("NVIDIA_VISIBLE_DEVICES={}", "0,".repeat(MAX_VALUE_BYTES / 2 + 1));
        let e = req(&[&big]).unwrap_err().to_string();
        assert!(e.starts_with("NVIDIA_VISIBLE_DEVICES=0,0,0,"), "{e}");
        assert!(e.contains(&format!("({} bytes)", MAX_VALUE_BYTES + 2)), "{e}");
        assert!(e.contains("at most 1048576 bytes (1 MiB)"), "{e}");
        assert!(e.len() < 400, "the message must not carry the value: {} bytes", e.len());
        let mut ann = BTreeMap::new();
        ann.insert("cdi.k8s.io/x".to_string(), "nvidia.com/gpu=0,".repeat(70_000));
        let e = collect(&[], &ann, &[nvidia()], &BTreeMap::new()).unwrap_err().to_string();
        assert!(e.starts_with("annotation cdi.k8s.io/x=") && e.contains("bytes"), "{e}");
    }

    #[test]
    fn many_names_are_deduplicated_and_bounded() {
        // Finding 4 of issue 10: 80k CDI names in one variable (under 1 MB). Distinct ones stop at the entry
        // limit; repeated ones collapse to one (hash-set de-duplication).
        let distinct: Vec<String> = (0..80_000).map(|i| format!("x.io/g={i}")).collect();
        let e = req(&[&format!("NVIDIA_VISIBLE_DEVICES={}", distinct.join(","))]).unwrap_err().to_string();
        assert!(e.contains("selects 65537 or more entries"), "{e}");
        let same = vec!["nvidia.com/gpu=0"; 50_000].join(",");
        let r = req(&[&format!("NVIDIA_VISIBLE_DEVICES={same}")]).unwrap();
        assert_eq!(r.cdi_names.len(), 1);
    }

    #[test]
    fn device_list_from_mounts() {
        let m = |dest: &str, source: &str| serde_json::json!({"destination": dest, "type": "bind", "source": source, "options": ["rbind", "ro"]});
        let mounts = vec![
            m("/var/run/actk/devices/nvidia.com/gpu/0", "/dev/null"),
            m("/var/run/actk/devices/nvidia.com/gpu/GPU-8f6a", "/dev/null"),
            m("/var/run/actk/devices/nvidia.com/gpu/0", "/dev/null"),
            m("/var/run/actk/devices/aws.amazon.com/neuron/3", "/dev/null"),
            m("/var/run/actk/devices/nvidia.com/gpu/all", "/tmp/emptydir"),
            m("/var/run/actk/devices/nvidia.com/0", "/dev/null"),
            m("/var/run/actk/devices/bad vendor/gpu/0", "/dev/null"),
            m("/var/run/actk/devicesX/nvidia.com/gpu/1", "/dev/null"),
            m("/etc/hosts", "/var/lib/kubelet/x"),
        ];
        let (list, notes) = device_list(&mounts);
        let got: Vec<String> = list.iter().map(|d| format!("{}={}", d.kind, d.name)).collect();
        assert_eq!(got, ["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-8f6a", "aws.amazon.com/neuron=3"]);
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes[0].contains("/tmp/emptydir"), "{notes:?}");
        // As a request: the kind's profile serves it, with the list named as the source.
        let sources = Sources {
            env: &[],
            annotations: &BTreeMap::new(),
            device_list: &list,
            env_trusted: false,
            annotations_trusted: false,
        };
        let r = collect_from(&sources, &[nvidia(), neuron()], &BTreeMap::new()).unwrap();
        assert_eq!(
            r.vendors[0].selection,
            Selection::Devices(vec![DeviceRef::Index(0), DeviceRef::Uuid("GPU-8f6a".into())])
        );
        assert_eq!(r.vendors[0].variable, "device list /var/run/actk/devices/nvidia.com/gpu");
        assert_eq!(r.vendors[0].capabilities, ["utility", "compute"]);
        assert_eq!(r.vendors[1].selection, Selection::Devices(vec![DeviceRef::Index(3)]));
        // A kind without a profile becomes a CDI name.
        let r = collect_from(&sources, &[neuron()], &BTreeMap::new()).unwrap();
        let names: Vec<&str> = r.cdi_names.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-8f6a"]);
    }

    #[test]
    fn untrusted_env_is_refused_unparsed_and_capabilities_still_apply_to_the_list() {
        let list = [ListedDevice { kind: "aws.amazon.com/neuron".into(), name: "1".into() }];
        let e = env(&[
            "AWS_NEURON_VISIBLE_DEVICES=ALL",
            "NEURON_RT_VISIBLE_CORES=2-3",
            "NVIDIA_VISIBLE_DEVICES=0,,1",
            "NVIDIA_DRIVER_CAPABILITIES=all",
        ]);
        let sources = Sources {
            env: &e,
            annotations: &BTreeMap::new(),
            device_list: &list,
            env_trusted: false,
            annotations_trusted: true,
        };
        let r = collect_from(&sources, &[nvidia(), neuron()], &BTreeMap::new()).unwrap();
        let refused: Vec<(&str, &str)> = r.refused.iter().map(|x| (x.source.as_str(), x.value.as_str())).collect();
        assert_eq!(refused, [("NVIDIA_VISIBLE_DEVICES", "0,,1"), ("AWS_NEURON_VISIBLE_DEVICES", "ALL")]);
        // The cores variable of a listed vendor is the vendor runtime's business, not a request.
        assert_eq!(r.vendors.len(), 1);
        assert_eq!(r.vendors[0].selection, Selection::Devices(vec![DeviceRef::Index(1)]));
        // Cores alone, untrusted: refused.
        let e = env(&["NEURON_RT_VISIBLE_CORES=0-1"]);
        let sources = Sources {
            env: &e,
            annotations: &BTreeMap::new(),
            device_list: &[],
            env_trusted: false,
            annotations_trusted: true,
        };
        let r = collect_from(&sources, &[neuron()], &BTreeMap::new()).unwrap();
        assert_eq!(r.refused[0].source, "NEURON_RT_VISIBLE_CORES");
        assert!(r.vendors.is_empty());
    }
}
