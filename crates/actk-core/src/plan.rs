//! Planning: from a container's OCI runtime spec (config.json) to the CDI container edits that
//! serve its requests. Used by actk-runtime (on `create`) and actk-hook.
//!
//! Steps:
//! 1. [`crate::request::collect`] reads `process.env` and `annotations`. Nothing requested: an
//!    empty [`Plan`] at once, with no file read and no discovery (the common container start).
//! 2. Each vendor request is served
//!    - through the CDI specs in the spec directories when a spec file of that kind exists
//!      (the admin's `actk cdi generate` output, or another vendor's specs): index `i` names the
//!      CDI device `kind=i`, a UUID `kind=UUID`, `all` `kind=all`; the spec's edits are used as
//!      they are (capabilities do not narrow a spec: it says what its devices need);
//!    - else generated in memory from discovery of the host root
//!      ([`crate::cdi::generate::edits_for`] with the requested capabilities).
//!
//!    `none` and core requests always use discovery (no CDI name means "driver only"; cores need
//!    each device's core count).
//! 3. Fully qualified CDI names (annotations `cdi.k8s.io/*`, or names in a selection variable)
//!    always go through the spec directories.
//! 4. Device nodes without major/minor (allowed by CDI) get them from the host node (stat).
//!
//! Spec directories are read by [`crate::cdi::registry::Registry`] (CDI SPEC.md rules: a later
//! directory wins). A malformed spec file does not stop other requests: it is named in the
//! error when a requested name is then missing, and in the plan's warnings otherwise.

use crate::cdi::name::QualifiedName;
use crate::cdi::registry::Registry;
use crate::cdi::spec::{ContainerEdits, Hook};
use crate::inventory::Inventory;
use crate::profile::Profile;
use crate::request::{self, CdiNameRequest, DeviceRef, RequestError, Selection, VendorRequest};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What planning needs besides the spec. Cheap to build: nothing here is read until a request needs it.
#[derive(Debug, Clone, Default)]
pub struct PlanContext {
    /// Vendor profiles (built-in plus user profiles), in order.
    pub profiles: Vec<Profile>,
    /// Host root for discovery (`/`).
    pub root: PathBuf,
    /// CDI spec directories, increasing priority.
    pub spec_dirs: Vec<PathBuf>,
    /// Default capabilities per profile name (config `[nvidia] default_capabilities`).
    pub default_capabilities: BTreeMap<String, Vec<String>>,
    /// An inventory to use instead of discovering `root` (tests; callers that already discovered,
    /// such as the NRI plugin, which keeps one in memory).
    pub inventory: Option<Inventory>,
    /// Spec files already loaded from `spec_dirs`, used instead of reading them (a long-running
    /// caller that reloads them when they change: the NRI plugin).
    pub registry: Option<std::sync::Arc<Registry>>,
}

impl PlanContext {
    /// The context the configuration file describes: profiles from `profiles_dir` (plus the
    /// built-ins), the host `root`, `spec_dirs`, and `[nvidia] default_capabilities`. Shared by
    /// actk-runtime and actk-hook so that both plan from the same inputs. Errors: a malformed
    /// profile file (named with its line).
    pub fn from_config(config: &crate::config::Config) -> Result<PlanContext, crate::profile::ProfileError> {
        let profiles = crate::profile::load(Some(&config.profiles_dir))?;
        let mut default_capabilities = BTreeMap::new();
        if let Some(c) = &config.nvidia.default_capabilities {
            default_capabilities.insert("nvidia".to_string(), c.clone());
        }
        Ok(PlanContext {
            profiles,
            root: config.root.clone(),
            spec_dirs: config.spec_dirs.clone(),
            default_capabilities,
            inventory: None,
            registry: None,
        })
    }
}

/// Options of [`plan_with`] (kept apart from [`PlanContext`] so that adding one does not change
/// every caller's struct literal).
#[derive(Debug, Clone, Default)]
pub struct PlanOptions {
    /// Absolute path of actk-hook: generated edits then get a createContainer hook
    /// `actk-hook update-ldcache --folder DIR...` for the directories of the mounted driver
    /// libraries, so the container's ld.so.cache finds them (`dlopen("libcuda.so.1")`).
    /// `None`: no such hook (actk-hook, which injects into a live container, refreshes the cache itself).
    pub ldcache_hook: Option<String>,
}

/// The edits that serve a container's requests, and what they serve (for logs and annotations).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// All edits, de-duplicated.
    pub edits: ContainerEdits,
    /// One entry per request served.
    pub served: Vec<Served>,
    /// Non-fatal notes (e.g. `all` on a node without such devices; skipped malformed spec files).
    pub warnings: Vec<String>,
}

/// One request served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// CDI kind (`nvidia.com/gpu`).
    pub kind: String,
    /// Variable or `annotation KEY` that asked.
    pub source: String,
    /// Device names served (`1`, `3`, or CDI device names); empty for driver-only.
    pub devices: Vec<String>,
    /// True when served from a CDI spec file, false when generated from discovery.
    pub from_spec: bool,
}

/// Why a container's requests cannot be served. The message is what the user sees.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A bad or unsatisfiable selection variable or annotation.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// A qualified CDI name no spec defines.
    #[error("{source_name}: {known}")]
    UnknownCdiDevice {
        /// `NVIDIA_VISIBLE_DEVICES` or `annotation cdi.k8s.io/...`.
        source_name: String,
        /// The qualified name.
        name: String,
        /// The registry's message: what the spec directories define (and which files could not be used).
        known: String,
    },
    /// A device node without numbers whose host node cannot be read.
    #[error("device node {path}: cannot read the host node {host_path}: {message}")]
    DeviceNode {
        /// Container path.
        path: String,
        /// Host path that was stat'ed.
        host_path: String,
        /// OS error.
        message: String,
    },
}

impl Plan {
    /// True when nothing is to be changed.
    pub fn is_empty(&self) -> bool {
        self.served.is_empty() && self.edits.is_empty()
    }

    /// Whether an NVIDIA request was served, so Docker's `--gpus` hook must not inject again.
    /// (That hook is NVIDIA's by definition, hence the fixed kind.)
    pub fn serves_nvidia(&self) -> bool {
        self.served.iter().any(|s| s.kind == "nvidia.com/gpu")
    }

    /// One line for logs and the `io.actk.applied` annotation:
    /// `nvidia.com/gpu=1,3 (NVIDIA_VISIBLE_DEVICES, generated); example.com/accel=0 (annotation cdi.k8s.io/x, spec)`.
    pub fn summary(&self) -> String {
        self.served
            .iter()
            .map(|s| {
                let devs = if s.devices.is_empty() { "none".to_string() } else { s.devices.join(",") };
                format!("{}={} ({}, {})", s.kind, devs, s.source, if s.from_spec { "spec" } else { "generated" })
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Plans the edits for `config_json` (a whole OCI runtime spec) with default [`PlanOptions`].
/// See the module docs.
pub fn plan(config_json: &Value, ctx: &PlanContext) -> Result<Plan, PlanError> {
    plan_with(config_json, ctx, &PlanOptions::default())
}

/// [`plan`] with options (actk-runtime asks for the ld.so.cache hook).
pub fn plan_with(config_json: &Value, ctx: &PlanContext, opts: &PlanOptions) -> Result<Plan, PlanError> {
    let env: Vec<String> = config_json
        .pointer("/process/env")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    let annotations: BTreeMap<String, String> = config_json
        .get("annotations")
        .and_then(Value::as_object)
        .map(|o| o.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect())
        .unwrap_or_default();
    let req = request::collect(&env, &annotations, &ctx.profiles, &ctx.default_capabilities)?;
    if req.vendors.is_empty() && req.cdi_names.is_empty() {
        return Ok(Plan::default());
    }

    let mut state = State { ctx, registry: None, inventory: None, capabilities: BTreeMap::new() };
    for vr in &req.vendors {
        state.capabilities.insert(vr.profile.clone(), vr.capabilities.clone());
    }
    let mut plan = Plan::default();
    let mut cdi_requests: Vec<CdiNameRequest> = Vec::new();

    for vr in &req.vendors {
        let use_specs =
            matches!(vr.selection, Selection::All | Selection::Devices(_)) && state.registry().has_kind(&vr.kind);
        if use_specs {
            let names = spec_names_for(vr, state.registry())?;
            plan.served.push(Served {
                kind: vr.kind.clone(),
                source: vr.variable.clone(),
                devices: names.clone(),
                from_spec: true,
            });
            cdi_requests.extend(
                names.iter().map(|n| CdiNameRequest { name: format!("{}={n}", vr.kind), source: vr.variable.clone() }),
            );
        } else {
            let profile = ctx.profiles.iter().find(|p| p.name == vr.profile);
            let inventory = state.inventory();
            let vendor = inventory.vendor(&vr.profile);
            let indexes = vr.resolve(vendor)?;
            // A listed device whose node discovery could not use (removed since the last look, or
            // its driver gone) would otherwise start the container silently without it.
            if let (Some(v), Selection::Devices(_)) = (vendor, &vr.selection)
                && let Some(d) = v.devices.iter().find(|d| indexes.contains(&d.index) && d.nodes.is_empty())
            {
                let seen: Vec<String> = inventory
                    .warnings
                    .iter()
                    .filter(|w| d.pci_bus_id.as_deref().is_some_and(|b| w.message.contains(b)))
                    .map(|w| w.to_string())
                    .collect();
                let why = if seen.is_empty() { String::new() } else { format!(": {}", seen.join("; ")) };
                return Err(PlanError::Request(RequestError {
                    variable: vr.variable.clone(),
                    value: vr.value.clone(),
                    problem: format!("device {} has no usable device node{why}", d.index),
                }));
            }
            match (profile, vendor) {
                (Some(p), Some(v)) => {
                    let mut edits = crate::cdi::generate::edits_for(p, v, &indexes, &vr.capabilities);
                    if let Some(hook) = &opts.ldcache_hook {
                        edits.hooks.extend(ldcache_hook(hook, v, &edits));
                    }
                    plan.edits.append(&edits);
                }
                _ => plan.warnings.push(format!(
                    "{}={}: this node has no {} devices; nothing injected",
                    vr.variable, vr.value, vr.kind
                )),
            }
            plan.served.push(Served {
                kind: vr.kind.clone(),
                source: vr.variable.clone(),
                devices: indexes.iter().map(u32::to_string).collect(),
                from_spec: false,
            });
        }
    }

    // Explicit names, after the names derived from variables (both through the spec directories).
    for n in &req.cdi_names {
        if !cdi_requests.iter().any(|c| c.name == n.name) {
            cdi_requests.push(n.clone());
        }
    }
    if !cdi_requests.is_empty() {
        let reg = state.registry();
        resolve_names(reg, &cdi_requests, &mut plan.edits)?;
        plan.warnings.extend(reg.errors().iter().map(|e| format!("CDI spec {} skipped: {e}", e.path.display())));
        for n in &req.cdi_names {
            if let Some((kind, dev)) = n.name.split_once('=') {
                plan.served.push(Served {
                    kind: kind.into(),
                    source: n.source.clone(),
                    devices: vec![dev.into()],
                    from_spec: true,
                });
            }
        }
    }

    crate::cdi::generate::dedup(&mut plan.edits);
    fill_device_numbers(&mut plan.edits)?;
    Ok(plan)
}

/// The createContainer hook that adds the directories of the driver libraries mounted by `edits`
/// to the container's ld.so.cache (the same shape `actk cdi generate` writes into specs).
fn ldcache_hook(hook: &str, vendor: &crate::inventory::VendorInventory, edits: &ContainerEdits) -> Option<Hook> {
    use crate::inventory::HostFileKind;
    let mut dirs: Vec<&str> = vendor
        .host_files
        .iter()
        .filter(|f| {
            f.kind == HostFileKind::Library && edits.mounts.iter().any(|m| m.container_path == f.container_path)
        })
        .filter_map(|f| f.container_path.rsplit_once('/').map(|(d, _)| if d.is_empty() { "/" } else { d }))
        .collect();
    dirs.sort_unstable();
    dirs.dedup();
    if dirs.is_empty() {
        return None;
    }
    let mut args = vec![hook.rsplit('/').next().unwrap_or(hook).to_string(), "update-ldcache".to_string()];
    for d in dirs {
        args.push("--folder".into());
        args.push(d.to_string());
    }
    Some(Hook {
        hook_name: "createContainer".into(),
        path: hook.to_string(),
        args,
        env: crate::cdi::generate::HOOK_ENV.iter().map(|s| s.to_string()).collect(),
        timeout: None,
    })
}

/// Lazily loaded inputs: spec files and the inventory are read at most once, and only if needed.
struct State<'a> {
    ctx: &'a PlanContext,
    registry: Option<Registry>,
    inventory: Option<Inventory>,
    /// Requested capabilities per profile name (only vendors with a request).
    capabilities: BTreeMap<String, Vec<String>>,
}

/// The profiles to discover with for one container start: every profile keeps its devices (so
/// driver claims between profiles stay the same), but host files are looked up only for the
/// capabilities this container asked for (plus `base`). Looking up every library of every
/// capability of every vendor was most of the cost of a container start.
fn profiles_for_request(profiles: &[Profile], requested: &BTreeMap<String, Vec<String>>) -> Vec<Profile> {
    profiles
        .iter()
        .map(|p| {
            let mut p = p.clone();
            match requested.get(&p.name) {
                Some(caps) if caps.iter().any(|c| c == "all") => {}
                Some(caps) => p.capabilities.retain(|name, _| name == "base" || caps.contains(name)),
                None => p.capabilities.clear(),
            }
            p
        })
        .collect()
}

impl<'a> State<'a> {
    fn registry(&mut self) -> &Registry {
        let ctx: &'a PlanContext = self.ctx;
        if let Some(r) = &ctx.registry {
            return r;
        }
        self.registry.get_or_insert_with(|| Registry::load(&ctx.spec_dirs))
    }

    fn inventory(&mut self) -> &Inventory {
        let ctx: &'a PlanContext = self.ctx;
        if let Some(i) = &ctx.inventory {
            return i;
        }
        let caps = &self.capabilities;
        self.inventory
            .get_or_insert_with(|| crate::discover::discover(&ctx.root, &profiles_for_request(&ctx.profiles, caps)))
    }
}

/// CDI device names (within the kind) for a vendor request served by spec files.
fn spec_names_for(vr: &VendorRequest, reg: &Registry) -> Result<Vec<String>, PlanError> {
    let known = kind_device_names(reg, &vr.kind);
    let unknown = |what: String| -> PlanError {
        RequestError {
            variable: vr.variable.clone(),
            value: vr.value.clone(),
            problem: format!("{what}; the CDI specs on this node define {} {}", vr.kind, compact_names(&known)),
        }
        .into()
    };
    let mut out: Vec<String> = Vec::new();
    let mut push = |n: String| {
        if !out.contains(&n) {
            out.push(n);
        }
    };
    match &vr.selection {
        Selection::All => {
            if !known.iter().any(|k| k == "all") {
                return Err(unknown("no device named \"all\"".into()));
            }
            push("all".into());
        }
        Selection::Devices(refs) => {
            for r in refs {
                let (name, what) = match r {
                    DeviceRef::Index(i) => (i.to_string(), format!("no such device {i}")),
                    DeviceRef::Uuid(u) => (u.clone(), format!("no device has the id {u:?}")),
                    DeviceRef::Mig(m) => (
                        m.clone(),
                        format!("{m:?} is a MIG device; MIG is not supported yet and no CDI spec defines it"),
                    ),
                };
                match known.iter().find(|k| k.eq_ignore_ascii_case(&name)) {
                    Some(k) => push(k.clone()),
                    None => return Err(unknown(what)),
                }
            }
        }
        // Callers send these through discovery.
        Selection::DriverOnly | Selection::Cores(_) => {}
    }
    Ok(out)
}

/// Names as a list: numeric ones ascending (`0,1,2`), then the others.
fn compact_names(names: &[String]) -> String {
    let nums: Vec<u32> = names.iter().filter_map(|n| n.parse().ok()).collect();
    let mut parts = Vec::new();
    if !nums.is_empty() {
        parts.push(request::list_indexes(&nums));
    }
    parts.extend(names.iter().filter(|n| n.parse::<u32>().is_err()).cloned());
    if parts.is_empty() { "no devices".into() } else { parts.join(", ") }
}

/// Device names (within `kind`) that the registry defines, in its order.
fn kind_device_names(reg: &Registry, kind: &str) -> Vec<String> {
    reg.names_of_kind(kind)
}

/// Appends the edits for qualified names through the registry to `out` (de-duplicated later,
/// once, by the caller). Each name is checked alone first, without building edits, so that an
/// unknown one is reported with the variable or annotation that asked for it; then every name
/// is resolved once.
fn resolve_names(reg: &Registry, names: &[CdiNameRequest], out: &mut ContainerEdits) -> Result<(), PlanError> {
    let mut qualified = Vec::new();
    for req in names {
        let q = QualifiedName::parse(&req.name).map_err(|e| RequestError {
            variable: req.source.clone(),
            value: req.name.clone(),
            problem: e.to_string(),
        })?;
        if let Err(e) = reg.check(&q) {
            let mut known = e.to_string();
            for bad in reg.errors() {
                known.push_str(&format!("; {} could not be used: {bad}", bad.path.display()));
            }
            return Err(PlanError::UnknownCdiDevice { source_name: req.source.clone(), name: req.name.clone(), known });
        }
        qualified.push(q);
    }
    reg.resolve_into(&qualified, out).map_err(|e| PlanError::UnknownCdiDevice {
        source_name: "CDI".into(),
        name: String::new(),
        known: e.to_string(),
    })
}

/// Fills `type`, `major`, `minor` of device nodes that lack them from the host node
/// (`hostPath`, else `path`), as CDI SPEC.md allows specs to omit them.
fn fill_device_numbers(edits: &mut ContainerEdits) -> Result<(), PlanError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    for n in &mut edits.device_nodes {
        if n.major.is_some() && n.minor.is_some() || n.node_type.as_deref() == Some("p") {
            continue;
        }
        let host = n.host_path.clone().unwrap_or_else(|| n.path.clone());
        let md = std::fs::metadata(&host).map_err(|e| PlanError::DeviceNode {
            path: n.path.clone(),
            host_path: host.clone(),
            message: e.to_string(),
        })?;
        let ft = md.file_type();
        let t = if ft.is_char_device() {
            "c"
        } else if ft.is_block_device() {
            "b"
        } else {
            return Err(PlanError::DeviceNode {
                path: n.path.clone(),
                host_path: host,
                message: "not a device node".into(),
            });
        };
        let rdev = md.rdev();
        n.node_type.get_or_insert_with(|| t.to_string());
        n.major = Some(i64::from(libc::major(rdev)));
        n.minor = Some(i64::from(libc::minor(rdev)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{Device, DeviceNode, VendorInventory};
    use crate::profile::Selection as ProfileSelection;
    use serde_json::json;
    use std::path::Path;

    fn nvidia_profile() -> Profile {
        Profile {
            name: "nvidia".into(),
            kind: "nvidia.com/gpu".into(),
            selection: ProfileSelection {
                env: vec!["NVIDIA_VISIBLE_DEVICES".into()],
                capabilities_env: Some("NVIDIA_DRIVER_CAPABILITIES".into()),
                default_capabilities: vec!["utility".into(), "compute".into()],
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn node(path: &str, minor: u32) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            host_path: path.into(),
            node_type: 'c',
            major: 195,
            minor,
            file_mode: Some(0o666),
        }
    }

    fn inventory(n: u32) -> Inventory {
        Inventory {
            root: "/".into(),
            vendors: vec![VendorInventory {
                profile: "nvidia".into(),
                kind: "nvidia.com/gpu".into(),
                devices: (0..n)
                    .map(|i| Device {
                        index: i,
                        nodes: vec![node(&format!("/dev/nvidia{i}"), i)],
                        ..Default::default()
                    })
                    .collect(),
                shared_nodes: vec![node("/dev/nvidiactl", 255)],
                ..Default::default()
            }],
            warnings: vec![],
        }
    }

    fn ctx(spec_dir: Option<&Path>) -> PlanContext {
        PlanContext {
            profiles: vec![nvidia_profile()],
            root: "/nonexistent".into(),
            spec_dirs: spec_dir.into_iter().map(Path::to_path_buf).collect(),
            inventory: Some(inventory(4)),
            ..Default::default()
        }
    }

    fn spec(env: &[&str]) -> Value {
        json!({"process": {"env": env}, "annotations": {}})
    }

    fn paths(p: &Plan) -> Vec<&str> {
        p.edits.device_nodes.iter().map(|n| n.path.as_str()).collect()
    }

    #[test]
    fn nothing_requested_reads_nothing() {
        // A spec dir that cannot be read would fail if it were touched.
        let c = PlanContext { spec_dirs: vec!["/proc/self/mem/x".into()], ..ctx(None) };
        assert!(plan(&spec(&["PATH=/bin"]), &c).unwrap().is_empty());
        assert!(
            plan(&spec(&["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=void"]), &c).unwrap().is_empty(),
            "F01"
        );
    }

    #[test]
    fn generated_from_discovery_without_spec_files() {
        let p = plan(&spec(&["NVIDIA_VISIBLE_DEVICES=1,3"]), &ctx(None)).unwrap();
        assert_eq!(paths(&p), vec!["/dev/nvidiactl", "/dev/nvidia1", "/dev/nvidia3"]);
        assert!(p.serves_nvidia());
        assert_eq!(p.summary(), "nvidia.com/gpu=1,3 (NVIDIA_VISIBLE_DEVICES, generated)");
        let p = plan(&spec(&["NVIDIA_VISIBLE_DEVICES=none"]), &ctx(None)).unwrap();
        assert_eq!(paths(&p), vec!["/dev/nvidiactl"]);
        assert!(p.edits.hooks.is_empty(), "no ldcache hook without a hook path");
        let e = plan(&spec(&["NVIDIA_VISIBLE_DEVICES=7"]), &ctx(None)).unwrap_err().to_string();
        assert_eq!(e, "NVIDIA_VISIBLE_DEVICES=7: no such device 7; this node has nvidia.com/gpu 0,1,2,3");
    }

    #[test]
    fn ldcache_hook_for_mounted_library_directories() {
        use crate::inventory::{HostFile, HostFileKind};
        let mut c = ctx(None);
        let lib = |cap: &str, path: &str, kind| HostFile {
            capability: cap.into(),
            kind,
            host_path: path.into(),
            container_path: path.into(),
        };
        c.inventory.as_mut().unwrap().vendors[0].host_files = vec![
            lib("compute", "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", HostFileKind::Library),
            lib("utility", "/usr/bin/nvidia-smi", HostFileKind::Binary),
            lib("video", "/opt/video/libnvcuvid.so.580.95.05", HostFileKind::Library),
        ];
        c.profiles[0].capabilities =
            ["compute", "utility", "video"].iter().map(|k| (k.to_string(), Default::default())).collect();
        let opts = PlanOptions { ldcache_hook: Some("/usr/bin/actk-hook".into()) };
        let p = plan_with(&spec(&["NVIDIA_VISIBLE_DEVICES=0"]), &c, &opts).unwrap();
        assert_eq!(p.edits.hooks.len(), 1, "{:?}", p.edits.hooks);
        let h = &p.edits.hooks[0];
        assert_eq!((h.hook_name.as_str(), h.path.as_str()), ("createContainer", "/usr/bin/actk-hook"));
        assert_eq!(
            h.args,
            ["actk-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"],
            "video was not asked for"
        );
        assert!(!h.env.is_empty());
    }

    fn write_spec(dir: &Path) {
        let s = json!({
            "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
            "devices": [
                {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/null", "hostPath": "/dev/null"}]}},
                {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/zero", "type": "c", "major": 1, "minor": 5}]}}
            ],
            "containerEdits": {"env": ["FROM_SPEC=1"]}
        });
        std::fs::write(dir.join("nvidia.json"), s.to_string()).unwrap();
        std::fs::write(dir.join("broken.json"), "{").unwrap();
    }

    #[test]
    fn spec_files_serve_their_kind_and_explicit_names() {
        let d = tempfile::tempdir().unwrap();
        write_spec(d.path());
        let p = plan(&spec(&["NVIDIA_VISIBLE_DEVICES=0"]), &ctx(Some(d.path()))).unwrap();
        assert_eq!(paths(&p), vec!["/dev/null"]);
        let n = &p.edits.device_nodes[0];
        assert_eq!(
            (n.node_type.as_deref(), n.major, n.minor),
            (Some("c"), Some(1), Some(3)),
            "numbers from the host node"
        );
        assert_eq!(p.edits.env, vec!["FROM_SPEC=1"]);
        assert!(p.served[0].from_spec);

        let e = plan(&spec(&["NVIDIA_VISIBLE_DEVICES=2"]), &ctx(Some(d.path()))).unwrap_err().to_string();
        assert_eq!(
            e,
            "NVIDIA_VISIBLE_DEVICES=2: no such device 2; the CDI specs on this node define nvidia.com/gpu 0, all"
        );

        let mut s = spec(&[]);
        s["annotations"] = json!({"cdi.k8s.io/x": "nvidia.com/gpu=all"});
        assert_eq!(paths(&plan(&s, &ctx(Some(d.path()))).unwrap()), vec!["/dev/zero"]);
        s["annotations"] = json!({"cdi.k8s.io/x": "example.com/accel=0"});
        let e = plan(&s, &ctx(Some(d.path()))).unwrap_err().to_string();
        assert!(e.starts_with("annotation cdi.k8s.io/x: ") && e.contains("example.com/accel=0"), "{e}");
        assert!(e.contains("broken.json could not be used"), "{e}");
    }
}
