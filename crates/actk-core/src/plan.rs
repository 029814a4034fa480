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
//!    each device's core count). MIG devices (`MIG-<uuid>`, `0:1`, `0:2:0`) are CDI names of
//!    the spec when one exists; discovery loads NVML only for them (an ordinary start does not).
//!    `NVIDIA_MIG_CONFIG_DEVICES` / `NVIDIA_MIG_MONITOR_DEVICES` give the MIG management
//!    capability node to a container with CAP_SYS_ADMIN, and are an error for any other.
//! 3. Fully qualified CDI names (annotations `cdi.k8s.io/*`, or names in a selection variable)
//!    always go through the spec directories.
//! 4. Device nodes without major/minor (allowed by CDI) get them from the host node (stat).
//!
//! Spec directories are read by [`crate::cdi::registry::Registry`] (CDI SPEC.md rules: a later
//! directory wins). A malformed or untrusted spec file does not stop other requests: it is
//! named in the error when a requested name is then missing, and in the plan's warnings otherwise.
//!
//! Before any of this, the node's trust policy ([`crate::policy`], [`PlanContext::policy`])
//! decides which inputs may ask: the device list (mounts under
//! [`crate::policy::DEVICE_LIST_DIR`]), selection variables, `cdi.k8s.io/*` annotations, each
//! trusted always, only for privileged containers, or never. A request from an untrusted input
//! fails the plan with [`PlanError::Refused`] (naming the policy key) or, with
//! `on_refused = "warn"`, is dropped with a warning naming it.

use crate::cdi::name::QualifiedName;
use crate::cdi::registry::Registry;
use crate::cdi::spec::{ContainerEdits, Hook};
use crate::inventory::Inventory;
use crate::policy::{self, Channel, OnRefused, Policy};
use crate::profile::Profile;
use crate::request::{self, CdiNameRequest, DeviceRef, Refused, RequestError, Selection, Sources, VendorRequest};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;

/// What planning needs besides the spec. Cheap to build: nothing here is read until a request needs it.
#[derive(Debug, Clone, Default)]
pub struct PlanContext {
    /// Vendor profiles (built-in plus user profiles), in order.
    pub profiles: Vec<Profile>,
    /// Host root for discovery (`/`): devices, /proc, /sys.
    pub root: PathBuf,
    /// Root of the driver's files when apart from `root` (config `driver_root`); `None`: `root`.
    pub driver_root: Option<PathBuf>,
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
    /// The node's trust policy (config `[policy]`): which inputs may ask for devices. The
    /// default trusts every input (docker/podman hosts).
    pub policy: Policy,
    /// Where the policy comes from, for refusal messages (`/etc/actk/config.toml`); may be empty.
    pub policy_origin: String,
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
            driver_root: config.driver_root.clone(),
            spec_dirs: config.spec_dirs.clone(),
            default_capabilities,
            inventory: None,
            registry: None,
            policy: config.policy.clone(),
            policy_origin: crate::config::Config::path().display().to_string(),
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
    /// The caller ends right after the plan (actk-runtime execs the low-level runtime): what
    /// planning loaded (the CDI registry, the inventory) is left to the end of the process
    /// instead of freed piece by piece (a tenth of a create's instructions; issue 31). A
    /// long-running caller must leave this off: each plan would leak what it loaded.
    pub process_ends: bool,
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
    /// A request from an input the node's trust policy does not trust for this container
    /// (`policy.on_refused = "fail"`). The message names each refused request and the policy key.
    #[error("{message}")]
    Refused {
        /// `NVIDIA_VISIBLE_DEVICES=all: refused by the node's trust policy (policy.env_requests = ...)`.
        message: String,
    },
    /// An `NVIDIA_REQUIRE_*` constraint the host does not meet (or cannot be parsed).
    #[error(transparent)]
    Require(#[from] crate::require::RequireError),
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
    let mounts = config_json.get("mounts").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();

    let privileged = ctx.policy.is_privileged(config_json);
    let trusted = |c: Channel| ctx.policy.trust(c).allows(privileged);
    let (mut list, mut warnings) = request::device_list(mounts);
    let mut refused_list = None;
    if !list.is_empty() && !trusted(Channel::Mount) {
        let value = list.iter().map(|d| format!("{}={}", d.kind, d.name)).collect::<Vec<_>>().join(",");
        let source = format!("device list {}", policy::DEVICE_LIST_DIR);
        refused_list = Some(Refused { source, value: request::shorten(&value), channel: Channel::Mount });
        list.clear();
    }
    let sources = Sources {
        env: &env,
        annotations: &annotations,
        device_list: &list,
        env_trusted: trusted(Channel::Env),
        annotations_trusted: trusted(Channel::Annotation),
    };
    let mut req = request::collect_from(&sources, &ctx.profiles, &ctx.default_capabilities)?;
    req.refused.extend(refused_list);
    crate::bench_stage::reached("requests");
    warnings.append(&mut req.notes);
    if !req.refused.is_empty() {
        let lines: Vec<String> = req.refused.iter().map(|r| refusal(r, ctx)).collect();
        match ctx.policy.on_refused {
            OnRefused::Fail => {
                return Err(PlanError::Refused {
                    message: format!(
                        "{}; only the devices a trusted input grants are served (on a Kubernetes node: the kubelet's allocation, \
                         given as mounts under {}); set policy.on_refused = \"warn\" to start such containers without the refused request",
                        lines.join("; "),
                        policy::DEVICE_LIST_DIR
                    ),
                });
            }
            OnRefused::Warn => warnings.extend(lines.into_iter().map(|l| format!("{l}; request ignored"))),
        }
    }
    warnings.extend(device_env_alone(&env, &req, &ctx.profiles));
    if req.vendors.is_empty() && req.cdi_names.is_empty() && req.mig_capabilities.is_empty() {
        return Ok(Plan { warnings, ..Plan::default() });
    }

    // NVML is loaded for a container start only when it asks for a MIG device by name and no
    // spec file serves the kind (MIG UUIDs and indexes are NVML's).
    let wants_mig = req.vendors.iter().any(
        |v| matches!(&v.selection, Selection::Devices(refs) if refs.iter().any(|r| matches!(r, DeviceRef::Mig(_)))),
    );
    let mut state = State {
        ctx,
        registry: None,
        inventory: None,
        registry_used: false,
        capabilities: BTreeMap::new(),
        nvml: wants_mig,
        only: wanted_devices(&ctx.profiles, &req),
        identity_only: false,
        process_ends: opts.process_ends,
    };
    for vr in &req.vendors {
        state.capabilities.insert(vr.profile.clone(), vr.capabilities.clone());
    }
    let mut plan = Plan { warnings, ..Plan::default() };
    let mut cdi_requests: Vec<CdiNameRequest> = Vec::new();

    for vr in &req.vendors {
        let use_specs =
            matches!(vr.selection, Selection::All | Selection::Devices(_)) && state.registry().has_kind(&vr.kind);
        let profile = ctx.profiles.iter().find(|p| p.name == vr.profile);
        let device_env = profile.map(|p| p.selection.device_env.as_slice()).unwrap_or_default();
        let requirements = match profile {
            Some(p) if p.selection.nvidia_require => crate::require::requirements(&env)?,
            _ => Vec::new(),
        };
        if use_specs {
            let names = spec_names_for(vr, state.registry())?;
            if !requirements.is_empty() {
                let (ctx_root, inv) = (&ctx.root, &mut state);
                check_requirements(
                    &requirements,
                    ctx_root,
                    vr,
                    |s| {
                        let inventory = s.inventory();
                        let vendor = inventory.vendor(&vr.profile);
                        (vendor.cloned(), indexes_of_names(vendor, &names))
                    },
                    inv,
                )?;
            }
            if !device_env.is_empty() {
                // The spec names the devices; their attributes are in the inventory.
                let inventory = state.device_attributes();
                let vendor = inventory.vendor(&vr.profile);
                let indexes = indexes_of_names(vendor, &names);
                let (env_edits, notes) = device_env_edits(device_env, &vr.into(), vendor, &indexes, &env)?;
                plan.edits.env.extend(env_edits);
                plan.warnings.extend(notes);
            }
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
            if !requirements.is_empty() {
                let ctx_root = &ctx.root;
                check_requirements(
                    &requirements,
                    ctx_root,
                    vr,
                    |s| {
                        let inventory = s.inventory();
                        let vendor = inventory.vendor(&vr.profile);
                        let indexes = vr.resolve(vendor).unwrap_or_default();
                        (vendor.cloned(), indexes)
                    },
                    &mut state,
                )?;
            }
            if vr.resolve_all(state.inventory().vendor(&vr.profile)).is_err() {
                state.whole_node();
            }
            let inventory = state.inventory();
            let vendor = inventory.vendor(&vr.profile);
            let resolved = vr.resolve_all(vendor).map_err(|mut e| {
                // A MIG request that found no MIG device because NVML could not be read on
                // this node says why (the warning alone goes only to the log).
                if e.problem.contains("MIG") {
                    let why: Vec<&str> = inventory
                        .warnings
                        .iter()
                        .filter(|w| w.message.ends_with(crate::discover::nvidia::MIG_UNLISTED))
                        .map(|w| w.message.as_str())
                        .collect();
                    if !why.is_empty() {
                        e.problem = format!("{} ({})", e.problem, why.join("; "));
                    }
                }
                e
            })?;
            let indexes = resolved.devices.clone();
            if !device_env.is_empty() && !indexes.is_empty() {
                let (env_edits, notes) = device_env_edits(device_env, &vr.into(), vendor, &indexes, &env)?;
                plan.edits.env.extend(env_edits);
                plan.warnings.extend(notes);
            }
            // A listed device whose node discovery could not use (removed since the last look, or
            // its driver gone) would otherwise start the container silently without it.
            let selected: HashSet<u32> = indexes.iter().copied().chain(resolved.migs.iter().map(|(g, _)| *g)).collect();
            if let (Some(v), Selection::Devices(_)) = (vendor, &vr.selection)
                && let Some(d) = v.devices.iter().find(|d| selected.contains(&d.index) && d.nodes.is_empty())
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
                    edits.append(&crate::cdi::generate::mig_edits(v, &resolved.migs));
                    if let Some(hook) = &opts.ldcache_hook
                        && let Some(refresh) = ldcache_hook(hook, v, &edits)
                    {
                        edits.hooks.extend(crate::cdi::generate::compat_hook(hook, p, v));
                        edits.hooks.push(refresh);
                    }
                    plan.edits.append_owned(edits);
                }
                _ => plan.warnings.push(format!(
                    "{}={}: this node has no {} devices; nothing injected",
                    vr.variable, vr.value, vr.kind
                )),
            }
            plan.served.push(Served {
                kind: vr.kind.clone(),
                source: vr.variable.clone(),
                devices: indexes
                    .iter()
                    .map(u32::to_string)
                    .chain(resolved.migs.iter().map(|(g, m)| format!("{g}:{m}")))
                    .collect(),
                from_spec: false,
            });
        }
    }

    for cap in &req.mig_capabilities {
        let edits = mig_capability_edits(config_json, cap, &mut state)?;
        plan.edits.append(&edits.0);
        plan.served.push(Served {
            kind: NVIDIA_KIND.into(),
            source: cap.variable.clone(),
            devices: vec![format!("{}{}", crate::cdi::generate::MIG_CAPABILITY_PREFIX, cap.capability)],
            from_spec: edits.1,
        });
    }

    // Explicit names, after the names derived from variables (both through the spec directories).
    let mut seen: HashSet<&str> = cdi_requests.iter().map(|c| c.name.as_str()).collect();
    let mut explicit = Vec::new();
    for n in &req.cdi_names {
        if seen.insert(n.name.as_str()) {
            explicit.push(n.clone());
        }
    }
    cdi_requests.extend(explicit);
    if !cdi_requests.is_empty() {
        let qualified = check_names(state.registry(), &cdi_requests)?;
        let resolved = match state.registry.as_mut().filter(|_| opts.process_ends && ctx.registry.is_none()) {
            // Loaded for this start and dropped with it: its edits are moved, not cloned.
            Some(reg) => reg.resolve_into_taking(&qualified, &mut plan.edits),
            None => state.registry().resolve_into(&qualified, &mut plan.edits),
        };
        resolved.map_err(|e| PlanError::UnknownCdiDevice {
            source_name: "CDI".into(),
            name: String::new(),
            known: e.to_string(),
        })?;
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
        // A profile's device variables (HABANA_VISIBLE_MODULES) for its devices asked for by
        // CDI name, as the device plugin and the DRA driver hand Gaudi devices out; a kind a
        // selection variable asked for already has them.
        for p in ctx.profiles.iter().filter(|p| !p.selection.device_env.is_empty()) {
            if req.vendors.iter().any(|v| v.profile == p.name) {
                continue;
            }
            let asked: Vec<&CdiNameRequest> =
                req.cdi_names.iter().filter(|n| n.name.split_once('=').is_some_and(|(k, _)| k == p.kind)).collect();
            let Some(first) = asked.first() else { continue };
            let names: Vec<String> =
                asked.iter().filter_map(|n| n.name.split_once('=')).map(|(_, d)| d.to_string()).collect();
            let value = asked.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(",");
            let asker = Asker { variable: &first.source, value: &value, kind: &p.kind };
            let inventory = state.device_attributes();
            let vendor = inventory.vendor(&p.name);
            let indexes = indexes_of_names(vendor, &names);
            let (env_edits, notes) = device_env_edits(&p.selection.device_env, &asker, vendor, &indexes, &env)?;
            plan.edits.env.extend(env_edits);
            plan.warnings.extend(notes);
        }
    }

    // The registry this start used: loaded here, or handed in by a long-running caller.
    let used = state.registry.as_ref().or(ctx.registry.as_deref().filter(|_| state.registry_used));
    if let Some(reg) = used {
        plan.warnings.extend(reg.errors().iter().map(|e| e.warning()));
    }
    keep_last_mention(&mut plan.edits);
    crate::cdi::generate::dedup(&mut plan.edits);
    fill_device_numbers(&mut plan.edits)?;
    if opts.process_ends {
        std::mem::forget(state);
    }
    Ok(plan)
}

/// The devices a start needs described, per profile ([`crate::discover::DiscoverOptions::only`]):
/// for a profile asked for devices by index only, those indexes; none of a profile nobody asked
/// for; every device (left out of the map) of a profile asked for any other way (`all`, UUIDs,
/// MIG devices, cores, driver files only, MIG management). CDI names count for a profile with
/// device variables, whose values come from the devices the names select.
fn wanted_devices(profiles: &[Profile], req: &request::Request) -> BTreeMap<String, BTreeSet<u32>> {
    let mut only: BTreeMap<String, BTreeSet<u32>> =
        profiles.iter().map(|p| (p.name.clone(), BTreeSet::new())).collect();
    let mut every: HashSet<&str> = HashSet::new();
    for vr in &req.vendors {
        match &vr.selection {
            Selection::Devices(refs) if refs.iter().all(|r| matches!(r, DeviceRef::Index(_))) => {
                let set = only.entry(vr.profile.clone()).or_default();
                set.extend(refs.iter().filter_map(|r| match r {
                    DeviceRef::Index(i) => Some(*i),
                    _ => None,
                }));
            }
            _ => {
                every.insert(&vr.profile);
            }
        }
    }
    // Devices asked for by CDI name whose profile sets device variables (a Gaudi device handed
    // out by the device plugin as `habana.ai/gaudi=3` gets HABANA_VISIBLE_MODULES): their
    // attributes come from discovery, so they are wanted too; a name that is not an index
    // (`all`, a UUID) is matched against every device.
    for n in &req.cdi_names {
        let Some((kind, dev)) = n.name.split_once('=') else { continue };
        for p in profiles.iter().filter(|p| p.kind == kind && !p.selection.device_env.is_empty()) {
            match dev.parse::<u32>() {
                Ok(i) => {
                    only.entry(p.name.clone()).or_default().insert(i);
                }
                Err(_) => {
                    every.insert(&p.name);
                }
            }
        }
    }
    if !req.mig_capabilities.is_empty() {
        every.extend(profiles.iter().filter(|p| p.kind == NVIDIA_KIND).map(|p| p.name.as_str()));
    }
    only.retain(|name, _| !every.contains(name.as_str()));
    only
}

/// A device node or mount that several requested devices name (a control node two GPUs share)
/// is kept once: the last mention, in the last mention's place. That is what the reference
/// library's injection leaves (each edit removes the entry of the same path, then appends), so
/// a container gets the same `linux.devices` and `mounts` from actk as from a CDI-aware engine
/// (found by tests/peers/cdi-oracle: `devices:order`).
fn keep_last_mention(edits: &mut ContainerEdits) {
    fn keep_last_by<T>(list: &mut Vec<T>, key: impl Fn(&T) -> &str) {
        // Borrowed keys, foldhash (issue 31: a String and a SipHash per mount of a start).
        let keep: Vec<bool> = {
            let mut seen: HashSet<&str, foldhash::fast::RandomState> =
                HashSet::with_capacity_and_hasher(list.len(), Default::default());
            list.iter().rev().map(|x| seen.insert(key(x))).collect()
        };
        let mut keep = keep.into_iter().rev();
        list.retain(|_| keep.next().unwrap_or(true));
    }
    keep_last_by(&mut edits.device_nodes, |n| &n.path);
    keep_last_by(&mut edits.mounts, |m| &m.container_path);
}

/// One refused request in words: `NVIDIA_VISIBLE_DEVICES=all: refused by the node's trust
/// policy (policy.env_requests = "privileged" in /etc/actk/config.toml: the container is not
/// privileged (no CAP_SYS_ADMIN in its bounding set))`.
fn refusal(r: &Refused, ctx: &PlanContext) -> String {
    let reason = ctx.policy.reason(r.channel);
    let (key_value, why) = reason.split_once(": ").unwrap_or((reason.as_str(), ""));
    let origin = if ctx.policy_origin.is_empty() { String::new() } else { format!(" in {}", ctx.policy_origin) };
    format!("{}={}: refused by the node's trust policy ({key_value}{origin}: {why})", r.source, r.value)
}

/// Checks the container's `NVIDIA_REQUIRE_*` requirements (see [`crate::require`]) before
/// anything is injected. The driver version comes from /proc/driver/nvidia/version of the host
/// root, the CUDA version from NVML on the running system (else from the driver branch); only
/// when a requirement still fails and names `arch` or `brand` are the selected GPUs looked at
/// (`selected` discovers them), so the usual CUDA image (`cuda>=12.x ...` first) costs one read.
fn check_requirements<'a>(
    reqs: &[crate::require::Requirement],
    root: &std::path::Path,
    vr: &VendorRequest,
    selected: impl FnOnce(&mut State<'a>) -> (Option<crate::inventory::VendorInventory>, Vec<u32>),
    state: &mut State<'a>,
) -> Result<(), PlanError> {
    use crate::require::{GpuProperties, HostProperties, arch_of_model, check, cuda_of_driver, from_nvml};
    let host = crate::discover::HostRoot::new(root);
    let driver = host
        .read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|t| crate::discover::nvidia::parse_version(&t));
    let system = host.is_system_root();
    let nvml_cuda = if system { from_nvml(&[]).and_then(|(c, _)| c) } else { None };
    let cuda = nvml_cuda.or_else(|| driver.as_deref().and_then(cuda_of_driver).map(str::to_string));
    let mut props = HostProperties { driver, cuda, gpus: Vec::new() };
    let first = check(reqs, &props);
    let needs_gpus = reqs.iter().any(|r| r.value.contains("arch") || r.value.contains("brand"));
    if first.is_ok() || !needs_gpus {
        return first.map_err(|e| add_request(e, vr));
    }
    let (vendor, indexes) = selected(state);
    let devices: Vec<&crate::inventory::Device> =
        vendor.as_ref().map(|v| v.devices.iter().filter(|d| indexes.contains(&d.index)).collect()).unwrap_or_default();
    let uuids: Vec<&str> = devices.iter().map(|d| d.uuid.as_deref().unwrap_or("")).collect();
    let nvml = if system { from_nvml(&uuids).map(|(_, g)| g) } else { None };
    props.gpus = devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let (arch, brand) = nvml.as_ref().and_then(|g| g.get(i).cloned()).unwrap_or((None, None));
            GpuProperties {
                index: d.index,
                arch: arch.or_else(|| d.model.as_deref().and_then(arch_of_model).map(str::to_string)),
                brand,
            }
        })
        .collect();
    check(reqs, &props).map_err(|e| add_request(e, vr))
}

/// Says which request a requirement error belongs to.
fn add_request(mut e: crate::require::RequireError, vr: &VendorRequest) -> PlanError {
    e.problem = format!("{} (for {}={})", e.problem, vr.variable, vr.value);
    PlanError::Require(e)
}

/// Device indexes of the CDI device names a spec served (`all`, an index, or a UUID).
fn indexes_of_names(vendor: Option<&crate::inventory::VendorInventory>, names: &[String]) -> Vec<u32> {
    let devices = vendor.map(|v| v.devices.as_slice()).unwrap_or_default();
    let mut out: Vec<u32> = Vec::new();
    // UUIDs indexed once, when a name needs them (issue 31: a scan of the devices per name was
    // quadratic for a pod given every GPU of a node by UUID).
    let mut by_uuid: Option<HashMap<String, u32>> = None;
    for n in names {
        if n == crate::cdi::generate::ALL_DEVICE {
            out.extend(devices.iter().map(|d| d.index));
        } else if let Ok(i) = n.parse::<u32>() {
            out.push(i);
        } else {
            let uuids = by_uuid.get_or_insert_with(|| {
                let mut m = HashMap::with_capacity(devices.len());
                for d in devices {
                    if let Some(u) = &d.uuid {
                        m.entry(u.to_ascii_lowercase()).or_insert(d.index);
                    }
                }
                m
            });
            if let Some(&i) = uuids.get(&n.to_ascii_lowercase()) {
                out.push(i);
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Warnings for a profile's device variable set without a request of that profile
/// (`HABANA_VISIBLE_MODULES` alone): it names modules of the devices something else selects
/// and selects nothing itself, which a user who set it to pick devices must learn.
fn device_env_alone(env: &[String], req: &request::Request, profiles: &[Profile]) -> Vec<String> {
    let mut out = Vec::new();
    for p in profiles {
        let asked = req.vendors.iter().any(|v| v.profile == p.name)
            || req.cdi_names.iter().any(|n| n.name.split_once('=').is_some_and(|(k, _)| k == p.kind));
        if asked {
            continue;
        }
        for e in &p.selection.device_env {
            if let Some(v) = request::env_value(env, &e.name).filter(|v| !v.trim().is_empty()) {
                let by = p.selection.env.first().map(|s| format!("{s} or ")).unwrap_or_default();
                out.push(format!(
                    "{}={v} selects no {} device by itself: {by}a CDI name {}=N selects them, and {} then lists their {} (nothing of {} is given to this container)",
                    e.name, p.kind, p.kind, e.name, e.attribute, p.kind
                ));
            }
        }
    }
    out
}

/// Who asked for the devices of a [`device_env_edits`] call, for its messages: a selection
/// variable and its value, or the CDI names of one kind and where they came from.
struct Asker<'a> {
    variable: &'a str,
    value: &'a str,
    kind: &'a str,
}

impl<'a> From<&'a VendorRequest> for Asker<'a> {
    fn from(vr: &'a VendorRequest) -> Self {
        Asker { variable: &vr.variable, value: &vr.value, kind: &vr.kind }
    }
}

/// The env edits of a profile's `selection.device_env` for the selected devices `indexes`
/// (ascending), and notes for the plan's warnings. A variable the container sets itself is kept
/// when every value in it belongs to a selected device (Habana: HABANA_VISIBLE_MODULES naming a
/// subset of the modules mounted); otherwise the request is refused naming both variables.
fn device_env_edits(
    entries: &[crate::profile::DeviceEnv],
    vr: &Asker<'_>,
    vendor: Option<&crate::inventory::VendorInventory>,
    indexes: &[u32],
    env: &[String],
) -> Result<(Vec<String>, Vec<String>), PlanError> {
    let devices = vendor.map(|v| v.devices.as_slice()).unwrap_or_default();
    // Devices by index, once: a lookup per selected device (issue 31).
    let mut by_index: HashMap<u32, &crate::inventory::Device> = HashMap::with_capacity(devices.len());
    for d in devices {
        by_index.entry(d.index).or_insert(d);
    }
    let (mut edits, mut notes) = (Vec::new(), Vec::new());
    for e in entries {
        let mut values = Vec::new();
        for i in indexes {
            match by_index.get(i).and_then(|d| d.attributes.get(&e.attribute)) {
                Some(v) => values.push(v.trim().to_string()),
                None => {
                    notes.push(format!(
                        "{}: {} device {i} has no {} attribute; {} not set",
                        vr.variable, vr.kind, e.attribute, e.name
                    ));
                    values.clear();
                    break;
                }
            }
        }
        if values.is_empty() {
            continue;
        }
        match request::env_value(env, &e.name) {
            Some(given) if !given.trim().is_empty() => {
                let selected: HashSet<&str> = values.iter().map(String::as_str).collect();
                for item in given.split(',').map(str::trim) {
                    if !selected.contains(item) {
                        return Err(PlanError::Request(RequestError {
                            variable: e.name.clone(),
                            value: given.to_string(),
                            problem: format!(
                                "{} {item:?} is not one of the devices {}={} selects ({} {})",
                                e.attribute,
                                vr.variable,
                                vr.value,
                                e.attribute,
                                values.join(",")
                            ),
                        }));
                    }
                }
            }
            _ => edits.push(format!("{}={}", e.name, values.join(","))),
        }
    }
    Ok((edits, notes))
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
        .filter_map(|f| {
            crate::discover::rsplit_once_byte(&f.container_path, b'/').map(|(d, _)| if d.is_empty() { "/" } else { d })
        })
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
        timeout: Some(crate::cdi::generate::HOOK_TIMEOUT_S),
    })
}

/// The CDI kind of NVIDIA GPUs, whose MIG management capabilities `NVIDIA_MIG_*_DEVICES` ask for.
const NVIDIA_KIND: &str = "nvidia.com/gpu";

/// Whether the container is privileged enough for MIG management: CAP_SYS_ADMIN in its
/// effective set (what `--privileged` gives), as nvidia-container-toolkit requires.
fn has_sys_admin(config_json: &Value) -> bool {
    config_json
        .pointer("/process/capabilities/effective")
        .and_then(Value::as_array)
        .is_some_and(|caps| caps.iter().any(|c| c.as_str() == Some("CAP_SYS_ADMIN")))
}

/// Edits for one MIG management capability request, and whether they came from a spec file.
/// Errors: the container is not privileged, or the node has no such capability.
fn mig_capability_edits(
    config_json: &Value,
    cap: &request::MigCapabilityRequest,
    state: &mut State<'_>,
) -> Result<(ContainerEdits, bool), PlanError> {
    let err = |problem: String| -> PlanError {
        RequestError { variable: cap.variable.clone(), value: cap.value.clone(), problem }.into()
    };
    if !has_sys_admin(config_json) {
        return Err(err(format!(
            "the MIG {} capability is given to privileged containers only (CAP_SYS_ADMIN), as nvidia-container-toolkit does; run the container privileged or unset {}",
            cap.capability, cap.variable
        )));
    }
    let name = format!("{}{}", crate::cdi::generate::MIG_CAPABILITY_PREFIX, cap.capability);
    if state.registry().has_kind(NVIDIA_KIND) {
        let q = QualifiedName::parse(&format!("{NVIDIA_KIND}={name}")).map_err(|e| err(e.to_string()))?;
        return match state.registry().resolve(std::slice::from_ref(&q)) {
            Ok(edits) => Ok((edits, true)),
            Err(e) => Err(err(format!("{e} (regenerate the spec with actk cdi generate on a MIG-capable node)"))),
        };
    }
    let node = state
        .inventory()
        .vendor_by_kind(NVIDIA_KIND)
        .and_then(|v| v.mig_capabilities.get(&cap.capability))
        .cloned()
        .ok_or_else(|| {
            err(format!("this node has no MIG {} capability (no MIG-capable NVIDIA driver)", cap.capability))
        })?;
    let n = crate::cdi::spec::DeviceNode {
        path: node.path.clone(),
        host_path: node.host_path.to_str().filter(|h| *h != node.path).map(str::to_string),
        node_type: Some(node.node_type.to_string()),
        major: Some(i64::from(node.major)),
        minor: Some(i64::from(node.minor)),
        file_mode: node.file_mode,
        ..Default::default()
    };
    Ok((ContainerEdits { device_nodes: vec![n], ..Default::default() }, false))
}

/// Lazily loaded inputs: spec files and the inventory are read at most once, and only if needed.
struct State<'a> {
    ctx: &'a PlanContext,
    registry: Option<Registry>,
    inventory: Option<Inventory>,
    /// Whether [`State::registry`] was asked for (a registry from the context is not loaded
    /// here, so its skipped files are reported only when it was used).
    registry_used: bool,
    /// Requested capabilities per profile name (only vendors with a request).
    capabilities: BTreeMap<String, Vec<String>>,
    /// Whether discovery loads NVML (a MIG device was asked for).
    nvml: bool,
    /// The devices discovery describes ([`crate::discover::DiscoverOptions::only`]): see
    /// [`wanted_devices`]; emptied when a request must be checked against the whole node.
    only: BTreeMap<String, BTreeSet<u32>>,
    /// Whether `inventory` holds the devices' identity alone ([`State::device_attributes`]).
    identity_only: bool,
    /// [`PlanOptions::process_ends`], passed on to discovery.
    process_ends: bool,
}

/// The profiles to discover with for one container start: every profile keeps its devices (so
/// driver claims between profiles stay the same), but host files are looked up only for the
/// capabilities this container asked for (plus `base`). Looking up every library of every
/// capability of every vendor was most of the cost of a container start.
fn profiles_for_request(profiles: &[Profile], requested: &BTreeMap<String, Vec<String>>) -> Vec<Profile> {
    profiles
        .iter()
        .map(|p| {
            let caps = requested.get(&p.name);
            let all = caps.is_some_and(|caps| caps.iter().any(|c| c == "all"));
            p.with_capabilities(|name| all || caps.is_some_and(|caps| name == "base" || caps.iter().any(|c| c == name)))
        })
        .collect()
}

impl<'a> State<'a> {
    /// Makes the next [`State::inventory`] describe every device (a request that did not resolve
    /// against the devices asked for is checked, and its error worded, against the whole node).
    /// Whether anything was left out before.
    fn whole_node(&mut self) -> bool {
        if self.only.is_empty() || self.ctx.inventory.is_some() {
            return false;
        }
        self.only.clear();
        self.inventory = None;
        true
    }

    fn registry(&mut self) -> &Registry {
        let ctx: &'a PlanContext = self.ctx;
        self.registry_used = true;
        if let Some(r) = &ctx.registry {
            return r;
        }
        self.registry.get_or_insert_with(|| {
            let r = Registry::load_for_start(&ctx.spec_dirs);
            crate::bench_stage::reached("registry");
            r
        })
    }

    /// The inventory of the devices the start asked for, with their host files and control
    /// nodes: what serving a request by discovery needs.
    fn inventory(&mut self) -> &Inventory {
        self.inventory_as(false)
    }

    /// The identity of the devices the start asked for and the attributes the profiles' device
    /// variables read, nothing more ([`crate::discover::DiscoverOptions::attributes_only`]):
    /// what a request its spec files serve needs (issue 31: a Gaudi start from a spec file read
    /// every library and control node of the node for HABANA_VISIBLE_MODULES alone). A later
    /// [`State::inventory`] discovers again, in full.
    fn device_attributes(&mut self) -> &Inventory {
        self.inventory_as(true)
    }

    fn inventory_as(&mut self, identity: bool) -> &Inventory {
        let ctx: &'a PlanContext = self.ctx;
        if let Some(i) = &ctx.inventory {
            return i;
        }
        if self.inventory.is_some() && self.identity_only && !identity {
            self.inventory = None;
        }
        if self.inventory.is_none() {
            self.identity_only = identity;
            let attributes_only = identity.then(|| {
                ctx.profiles.iter().flat_map(|p| &p.selection.device_env).map(|e| e.attribute.clone()).collect()
            });
            // A container start needs no topology (see DiscoverOptions::topology).
            let opts = crate::discover::DiscoverOptions {
                nvml: self.nvml,
                topology: false,
                only: self.only.clone(),
                attributes_only,
                process_ends: self.process_ends,
            };
            let i = crate::discover::discover_roots_with(
                &ctx.root,
                ctx.driver_root.as_deref().unwrap_or(&ctx.root),
                &profiles_for_request(&ctx.profiles, &self.capabilities),
                &opts,
            );
            crate::bench_stage::reached("inventory");
            self.inventory = Some(i);
        }
        self.inventory.get_or_insert_with(Inventory::default)
    }
}

/// CDI device names (within the kind) for a vendor request served by spec files.
fn spec_names_for(vr: &VendorRequest, reg: &Registry) -> Result<Vec<String>, PlanError> {
    let unknown = |what: String| -> PlanError {
        let known = kind_device_names(reg, &vr.kind);
        RequestError {
            variable: vr.variable.clone(),
            value: vr.value.clone(),
            problem: format!("{what}; the CDI specs on this node define {} {}", vr.kind, compact_names(&known)),
        }
        .into()
    };
    let mut out: Vec<String> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut push = |n: String| {
        if seen.insert(n.clone()) {
            out.push(n);
        }
    };
    // A name as written is one lookup (issue 31: nothing per device of the node). Only a name
    // not found so builds the case-insensitive map of the kind's names, once (a request may
    // list 24k UUIDs); where two names differ only in case, the first in name order wins.
    let mut by_lower: Option<HashMap<String, String>> = None;
    match &vr.selection {
        Selection::All => {
            if !reg.has_device(&vr.kind, "all") {
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
                        format!("no MIG device {m:?} (CDI names MIG devices GPU:MIG, GPU:GI:CI and MIG-<uuid>)"),
                    ),
                };
                if reg.has_device(&vr.kind, &name) {
                    push(name);
                    continue;
                }
                let by_lower = by_lower.get_or_insert_with(|| {
                    kind_device_names(reg, &vr.kind).into_iter().rev().map(|k| (k.to_ascii_lowercase(), k)).collect()
                });
                match by_lower.get(&name.to_ascii_lowercase()) {
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

/// The qualified names of `names`, each checked alone against the registry, without building
/// edits, so that an unknown one is reported with the variable or annotation that asked for
/// it; the caller then resolves them all at once (and de-duplicates the edits once).
fn check_names(reg: &Registry, names: &[CdiNameRequest]) -> Result<Vec<QualifiedName>, PlanError> {
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
    Ok(qualified)
}

/// Fills `type`, `major`, `minor` of device nodes that lack them from the host node
/// (`hostPath`, else `path`), as CDI SPEC.md allows specs to omit them, and `fileMode` of every
/// node that lacks it (nvidia-ctk writes `path`/`hostPath` only): the container's node then has
/// the host node's mode, as with the reference library, where runc would make it 0666. A node
/// whose numbers are given keeps going when its host node cannot be read (the reference's
/// "minimally specified" node); without numbers that is an error.
fn fill_device_numbers(edits: &mut ContainerEdits) -> Result<(), PlanError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    for n in &mut edits.device_nodes {
        // `major: 0` is no device number: the reference library (Go, where 0 is the unset
        // value) takes both numbers from the host node then, and so does actk.
        if n.major == Some(0) && n.node_type.as_deref() != Some("p") {
            n.major = None;
            n.minor = None;
        }
        let has_numbers = n.major.is_some() && n.minor.is_some() || n.node_type.as_deref() == Some("p");
        if has_numbers && n.file_mode.is_some() {
            continue;
        }
        let host = n.host_path.clone().unwrap_or_else(|| n.path.clone());
        let md = match std::fs::metadata(&host) {
            Ok(md) => md,
            Err(_) if has_numbers => continue,
            Err(e) => {
                return Err(PlanError::DeviceNode { path: n.path.clone(), host_path: host, message: e.to_string() });
            }
        };
        let ft = md.file_type();
        let t = if ft.is_char_device() {
            "c"
        } else if ft.is_block_device() {
            "b"
        } else if ft.is_fifo() {
            "p"
        } else if has_numbers {
            continue;
        } else {
            return Err(PlanError::DeviceNode {
                path: n.path.clone(),
                host_path: host,
                message: "not a device node".into(),
            });
        };
        // A type the spec gives for numbers it leaves to the host must be the host node's: a
        // `b` (or `u`) node with a character device's numbers is another device (the reference
        // library refuses it as "host type mismatch").
        if !has_numbers && let Some(given) = n.node_type.as_deref().filter(|g| *g != t) {
            return Err(PlanError::DeviceNode {
                path: n.path.clone(),
                host_path: host,
                message: format!(
                    "the spec gives type {given:?} without major/minor, and the host node is of type {t:?}: \
                     give the host's type or the device numbers"
                ),
            });
        }
        if n.file_mode.is_none() {
            n.file_mode = Some(md.mode() & 0o7777);
        }
        if has_numbers || t == "p" {
            n.node_type.get_or_insert_with(|| t.to_string());
            continue;
        }
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
                nvidia_require: true,
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
            gid: None,
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
        let opts = PlanOptions { ldcache_hook: Some("/usr/bin/actk-hook".into()), ..Default::default() };
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
        assert_eq!(h.timeout, Some(crate::cdi::generate::HOOK_TIMEOUT_S), "issue 29: the hook carries a timeout");
    }

    fn gaudi_ctx(spec_dir: Option<&Path>) -> PlanContext {
        let profiles = crate::profile::builtin();
        // gaudi2 fixture numbering: accel index -> module_id (OAM slot) 3,2,1,6,7,4,5,0.
        let modules = [3, 2, 1, 6, 7, 4, 5, 0];
        let devices = (0..8u32)
            .map(|i| Device {
                index: i,
                nodes: vec![DeviceNode {
                    path: format!("/dev/accel/accel{i}"),
                    host_path: format!("/dev/accel/accel{i}").into(),
                    node_type: 'c',
                    major: 261,
                    minor: i,
                    file_mode: Some(0o666),
                    gid: None,
                }],
                attributes: [("module_id".to_string(), modules[i as usize].to_string())].into(),
                ..Default::default()
            })
            .collect();
        let inventory = Inventory {
            root: "/".into(),
            vendors: vec![VendorInventory {
                profile: "gaudi".into(),
                kind: "habana.ai/gaudi".into(),
                devices,
                ..Default::default()
            }],
            warnings: vec![],
        };
        PlanContext {
            profiles,
            root: "/nonexistent".into(),
            spec_dirs: spec_dir.into_iter().map(Path::to_path_buf).collect(),
            inventory: Some(inventory),
            ..Default::default()
        }
    }

    /// Issue 13 item 6: HABANA_VISIBLE_MODULES is set to the selected devices' module ids, as
    /// Habana's runtime does; a value the container sets itself is kept when it names modules of
    /// its devices and refused, naming both variables, when it does not. The same through a CDI
    /// spec file of the kind.
    #[test]
    fn item6_habana_visible_modules_is_set_and_read_as_habanas_runtime_does() {
        let c = gaudi_ctx(None);
        let p = plan(&spec(&["HABANA_VISIBLE_DEVICES=1,7"]), &c).unwrap();
        assert_eq!(p.edits.env, vec!["HABANA_VISIBLE_MODULES=2,0"]);
        let p = plan(&spec(&["HABANA_VISIBLE_DEVICES=all"]), &c).unwrap();
        assert_eq!(p.edits.env, vec!["HABANA_VISIBLE_MODULES=3,2,1,6,7,4,5,0"]);
        let p = plan(&spec(&["HABANA_VISIBLE_DEVICES=all", "HABANA_VISIBLE_MODULES=0,1"]), &c).unwrap();
        assert!(p.edits.env.is_empty(), "the container's own narrowing is kept: {:?}", p.edits.env);
        let e = plan(&spec(&["HABANA_VISIBLE_DEVICES=1,7", "HABANA_VISIBLE_MODULES=5"]), &c).unwrap_err();
        assert_eq!(
            e.to_string(),
            "HABANA_VISIBLE_MODULES=5: module_id \"5\" is not one of the devices HABANA_VISIBLE_DEVICES=1,7 selects (module_id 2,0)"
        );
        // Served by a CDI spec file: the module ids still come from the devices it names.
        let d = tempfile::tempdir().unwrap();
        let s = json!({"cdiVersion": "0.5.0", "kind": "habana.ai/gaudi", "devices": [
            {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/null", "type": "c", "major": 1, "minor": 3}]}},
            {"name": "7", "containerEdits": {"deviceNodes": [{"path": "/dev/zero", "type": "c", "major": 1, "minor": 5}]}}]});
        std::fs::write(d.path().join("gaudi.json"), s.to_string()).unwrap();
        let p = plan(&spec(&["HABANA_VISIBLE_DEVICES=7"]), &gaudi_ctx(Some(d.path()))).unwrap();
        assert!(p.served[0].from_spec);
        assert_eq!(p.edits.env, vec!["HABANA_VISIBLE_MODULES=0"]);
    }

    /// Issue 25 item 9: Gaudi devices asked for by CDI name (an annotation, as the device plugin
    /// hands them out; the device list) get HABANA_VISIBLE_MODULES too; the variable alone
    /// selects nothing and says so.
    #[test]
    fn item9_habana_visible_modules_for_cdi_names_and_a_warning_when_alone() {
        let d = tempfile::tempdir().unwrap();
        let s = json!({"cdiVersion": "0.5.0", "kind": "habana.ai/gaudi", "devices": [
            {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/null", "type": "c", "major": 1, "minor": 3}]}},
            {"name": "7", "containerEdits": {"deviceNodes": [{"path": "/dev/zero", "type": "c", "major": 1, "minor": 5}]}}]});
        std::fs::write(d.path().join("gaudi.json"), s.to_string()).unwrap();
        let c = gaudi_ctx(Some(d.path()));
        let by_name = json!({"process": {"env": []}, "annotations": {"cdi.k8s.io/actk_habana.ai_gaudi": "habana.ai/gaudi=1,habana.ai/gaudi=7"}});
        let p = plan(&by_name, &c).unwrap();
        assert_eq!(p.edits.env, vec!["HABANA_VISIBLE_MODULES=2,0"]);
        assert_eq!(paths(&p), vec!["/dev/null", "/dev/zero"]);
        // A value the container sets is still checked against what it was given.
        let mut narrowed = by_name.clone();
        narrowed["process"]["env"] = json!(["HABANA_VISIBLE_MODULES=4"]);
        let e = plan(&narrowed, &c).unwrap_err().to_string();
        assert!(e.starts_with("HABANA_VISIBLE_MODULES=4: module_id \"4\" is not one of the devices"), "{e}");
        let alone = plan(&spec(&["HABANA_VISIBLE_MODULES=0,1"]), &c).unwrap();
        assert!(alone.is_empty(), "nothing selected");
        assert_eq!(alone.warnings.len(), 1);
        assert!(
            alone.warnings[0].starts_with("HABANA_VISIBLE_MODULES=0,1 selects no habana.ai/gaudi device by itself: HABANA_VISIBLE_DEVICES or a CDI name"),
            "{:?}",
            alone.warnings
        );
        assert!(
            plan(&spec(&["HABANA_VISIBLE_DEVICES=1", "HABANA_VISIBLE_MODULES=2"]), &c).unwrap().warnings.is_empty()
        );
    }

    /// Issue 13 item 6: NVIDIA_REQUIRE_* is checked against the host root's driver before any
    /// edit is planned; NVIDIA_DISABLE_REQUIRE=true skips it; arch uses the selected GPUs.
    #[test]
    fn item6_requirements_are_checked_before_anything_is_injected() {
        let root = tempfile::tempdir().unwrap();
        let v = root.path().join("proc/driver/nvidia");
        std::fs::create_dir_all(&v).unwrap();
        std::fs::write(
            v.join("version"),
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U22)\n",
        )
        .unwrap();
        let mut c = ctx(None);
        c.root = root.path().to_path_buf();
        for d in &mut c.inventory.as_mut().unwrap().vendors[0].devices {
            d.model = Some("NVIDIA H100 80GB HBM3".into());
        }
        let e =
            plan(&spec(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"]), &c).unwrap_err().to_string();
        assert!(
            e.starts_with("NVIDIA_REQUIRE_CUDA=cuda>=99.0: unsatisfied condition: cuda>=99.0 (cuda=13.0)")
                && e.ends_with("(for NVIDIA_VISIBLE_DEVICES=0)"),
            "{e}"
        );
        let ok = plan(&spec(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=12.4 driver>=999"]), &c).unwrap();
        assert_eq!(paths(&ok), vec!["/dev/nvidiactl", "/dev/nvidia0"]);
        let off = plan(
            &spec(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=99.0", "NVIDIA_DISABLE_REQUIRE=true"]),
            &c,
        );
        assert!(off.is_ok(), "{off:?}");
        let e =
            plan(&spec(&["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_REQUIRE_ARCH=arch>=10.0"]), &c).unwrap_err().to_string();
        assert!(e.contains("arch>=10.0 (GPU 1 arch=9.0)"), "{e}");
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
        // Issue 25 item 3: and the host node's mode (runc would make it 0666 whatever the host's).
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata("/dev/null").unwrap().permissions());
        assert_eq!(n.file_mode, Some(mode & 0o7777));
        let all = plan(&spec(&["NVIDIA_VISIBLE_DEVICES=all"]), &ctx(Some(d.path()))).unwrap();
        assert_eq!(all.edits.device_nodes[0].file_mode, Some(mode & 0o7777), "numbers given, mode filled");
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

    /// A CRI-shaped config.json as containerd writes it for a pod: the kubelet's mounts (here the
    /// device list of the volume-mounts strategy), the image's env, CAP_SYS_ADMIN absent; for
    /// `privileged: true` CAP_SYS_ADMIN and every device allowed (containerd's
    /// `WithAllDevicesAllowed`).
    fn cri_spec(env: &[&str], listed: &[&str], privileged: bool) -> Value {
        let mut caps = vec!["CAP_CHOWN", "CAP_NET_BIND_SERVICE"];
        let mut devices = vec![json!({"allow": false, "access": "rwm"})];
        if privileged {
            caps.push("CAP_SYS_ADMIN");
            devices = vec![json!({"allow": true, "access": "rwm"})];
        }
        let mut mounts = vec![json!({"destination": "/etc/hosts", "type": "bind",
            "source": "/var/lib/kubelet/pods/0a/etc-hosts", "options": ["rbind", "rprivate", "rw"]})];
        for name in listed {
            mounts.push(json!({"destination": format!("/var/run/actk/devices/nvidia.com/gpu/{name}"),
                "type": "bind", "source": "/dev/null", "options": ["rbind", "rprivate", "ro"]}));
        }
        json!({"process": {"env": env, "capabilities": {"bounding": caps, "effective": caps}},
               "linux": {"resources": {"devices": devices}},
               "mounts": mounts,
               "annotations": {"io.kubernetes.cri.container-type": "container"}})
    }

    fn k8s_ctx() -> PlanContext {
        PlanContext { policy: Policy::kubernetes(), policy_origin: "/etc/actk/config.toml".into(), ..ctx(None) }
    }

    /// Field case F13: the pod was allocated GPU 0 (the device list), its image says
    /// NVIDIA_VISIBLE_DEVICES=all: only GPU 0, and the refusal names the policy key.
    #[test]
    fn f13_allocated_gpu_only_and_env_refusal_names_the_policy() {
        let spec = cri_spec(&["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"], &["0"], false);
        let p = plan(&spec, &k8s_ctx()).unwrap();
        assert_eq!(paths(&p), vec!["/dev/nvidiactl", "/dev/nvidia0"]);
        assert_eq!(p.served[0].source, "device list /var/run/actk/devices/nvidia.com/gpu");
        let w = p.warnings.join("\n");
        assert!(
            w.contains("NVIDIA_VISIBLE_DEVICES=all: refused by the node's trust policy (policy.env_requests = \"privileged\" in /etc/actk/config.toml"),
            "{w}"
        );
        // The same with the default policy (a node set up without the chart): the list still wins.
        let p = plan(&spec, &ctx(None)).unwrap();
        assert_eq!(paths(&p), vec!["/dev/nvidiactl", "/dev/nvidia0"]);
        assert!(p.warnings.iter().any(|w| w.contains("ignored, the device list")), "{:?}", p.warnings);
    }

    #[test]
    fn untrusted_env_and_annotations_grant_nothing() {
        let c = k8s_ctx();
        for env in
            [&["NVIDIA_VISIBLE_DEVICES=all"][..], &["NVIDIA_VISIBLE_DEVICES=none"], &["NVIDIA_VISIBLE_DEVICES=0,1"]]
        {
            let p = plan(&cri_spec(env, &[], false), &c).unwrap();
            assert!(p.is_empty(), "{env:?}: {p:?}");
            assert!(p.warnings.iter().any(|w| w.contains("policy.env_requests")), "{:?}", p.warnings);
        }
        // Not a request at all: nothing refused, nothing said.
        let p = plan(&cri_spec(&["NVIDIA_VISIBLE_DEVICES=void"], &[], false), &c).unwrap();
        assert!(p.is_empty() && p.warnings.is_empty(), "{p:?}");
        // A malformed untrusted value is not parsed: refused, not a syntax error.
        let p = plan(&cri_spec(&["NVIDIA_VISIBLE_DEVICES=0,,x"], &[], false), &c).unwrap();
        assert!(p.is_empty() && p.warnings[0].contains("refused"), "{p:?}");
        let mut spec = cri_spec(&[], &[], false);
        spec["annotations"]["cdi.k8s.io/x"] = json!("nvidia.com/gpu=all");
        let p = plan(&spec, &c).unwrap();
        assert!(p.is_empty(), "{p:?}");
        assert!(p.warnings[0].starts_with("annotation cdi.k8s.io/x=nvidia.com/gpu=all: refused by the node's trust policy (policy.annotation_requests = \"privileged\""), "{:?}", p.warnings);
        // Privileged containers may ask.
        let p = plan(&cri_spec(&["NVIDIA_VISIBLE_DEVICES=all"], &[], true), &c).unwrap();
        assert_eq!(paths(&p).len(), 5, "{p:?}");
    }

    #[test]
    fn on_refused_fail_fails_with_the_policy_key() {
        let mut c = k8s_ctx();
        c.policy.on_refused = OnRefused::Fail;
        let e = plan(&cri_spec(&["NVIDIA_VISIBLE_DEVICES=all"], &["1"], false), &c).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "NVIDIA_VISIBLE_DEVICES=all: refused by the node's trust policy (policy.env_requests = \"privileged\""
            ),
            "{e}"
        );
        assert!(e.contains("policy.on_refused = \"warn\""), "{e}");
        c.policy.env_requests = policy::Trust::Never;
        let e = plan(&cri_spec(&["AWS_NEURON_VISIBLE_DEVICES=ALL"], &[], true), &c);
        // No neuron profile in this context: nothing asked, nothing refused.
        assert!(e.unwrap().is_empty());
        let e = plan(&cri_spec(&["NVIDIA_VISIBLE_DEVICES=0"], &[], true), &c).unwrap_err().to_string();
        assert!(
            e.contains("policy.env_requests = \"never\" in /etc/actk/config.toml: no container may ask this way"),
            "{e}"
        );
    }

    /// A DGX node as discovery sees it for the built-in nvidia profile: 4 GPUs, the control
    /// nodes, the NVSwitch nodes the `fabric` capability adds, and a compute library.
    fn fabric_ctx(spec_dir: Option<&Path>) -> PlanContext {
        use crate::inventory::{HostFile, HostFileKind};
        let mut c = k8s_ctx();
        c.profiles = vec![crate::profile::builtin().into_iter().find(|p| p.name == "nvidia").unwrap()];
        c.spec_dirs = spec_dir.into_iter().map(Path::to_path_buf).collect();
        let v = &mut c.inventory.as_mut().unwrap().vendors[0];
        for (path, minor) in
            [("/dev/nvidia-nvswitchctl", 255), ("/dev/nvidia-nvswitch0", 0), ("/dev/nvidia-nvswitch1", 1)]
        {
            v.shared_nodes.push(DeviceNode {
                path: path.into(),
                host_path: path.into(),
                node_type: 'c',
                major: 507,
                minor,
                file_mode: Some(0o666),
                gid: None,
            });
        }
        v.host_files = vec![HostFile {
            capability: "compute".into(),
            kind: HostFileKind::Library,
            host_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05".into(),
            container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05".into(),
        }];
        c
    }

    fn nvswitch(p: &Plan) -> Vec<&str> {
        paths(p).into_iter().filter(|n| n.starts_with("/dev/nvidia-nvswitch")).collect()
    }

    /// Issue 29 finding 1: a pod allocated GPU 1 that sets NVIDIA_DRIVER_CAPABILITIES=fabric (or
    /// `all`) gets no NVSwitch node on a Kubernetes node, from discovery or from a spec file;
    /// its files stay; the refusal names the policy key and follows on_refused. Where the env is
    /// trusted (docker hosts, a privileged pod) `fabric` adds them as before.
    #[test]
    fn capability_that_adds_nodes_is_an_env_request() {
        let d = tempfile::tempdir().unwrap();
        // The spec `actk cdi generate` writes (no --capabilities: no capability-only node in it).
        let c = fabric_ctx(None);
        let profile = &c.profiles[0];
        let spec_file = crate::cdi::generate::generate(
            profile,
            &c.inventory.as_ref().unwrap().vendors[0],
            &crate::cdi::generate::GenerateOptions::default(),
        )
        .unwrap();
        std::fs::write(d.path().join("nvidia.json"), serde_json::to_string(&spec_file).unwrap()).unwrap();
        for (served, c) in [("discovery", fabric_ctx(None)), ("spec", fabric_ctx(Some(d.path())))] {
            for caps in ["fabric", "compute,fabric", "all", "ALL,utility"] {
                let s = cri_spec(&[&format!("NVIDIA_DRIVER_CAPABILITIES={caps}")], &["1"], false);
                let p = plan(&s, &c).unwrap();
                assert_eq!(nvswitch(&p), Vec::<&str>::new(), "{served}, {caps}: {:?}", paths(&p));
                assert!(
                    paths(&p).contains(&"/dev/nvidia1") && paths(&p).contains(&"/dev/nvidiactl"),
                    "{served}, {caps}"
                );
                let w = p.warnings.join("\n");
                if caps.to_ascii_lowercase().contains("all") {
                    assert!(
                        w.contains("`all` leaves out fabric") && w.contains("policy.env_requests"),
                        "{served}, {caps}: {w}"
                    );
                } else {
                    assert!(
                        w.contains("NVIDIA_DRIVER_CAPABILITIES=fabric: refused by the node's trust policy (policy.env_requests = \"privileged\""),
                        "{served}, {caps}: {w}"
                    );
                }
                if served == "discovery" && caps != "fabric" {
                    assert!(
                        p.edits.mounts.iter().any(|m| m.container_path.ends_with("libcuda.so.580.95.05")),
                        "{caps}: the files of the other capabilities stay"
                    );
                }
            }
        }
        // on_refused = "fail": the container fails naming the key; `all` still starts.
        let mut fail = fabric_ctx(None);
        fail.policy.on_refused = OnRefused::Fail;
        let e = plan(&cri_spec(&["NVIDIA_DRIVER_CAPABILITIES=utility,fabric"], &["1"], false), &fail).unwrap_err();
        assert!(
            e.to_string().starts_with("NVIDIA_DRIVER_CAPABILITIES=fabric: refused by the node's trust policy"),
            "{e}"
        );
        assert!(plan(&cri_spec(&["NVIDIA_DRIVER_CAPABILITIES=all"], &["1"], false), &fail).is_ok());
        // Trusted env: a privileged pod, and a node with the default policy (docker hosts).
        let p = plan(&cri_spec(&["NVIDIA_DRIVER_CAPABILITIES=fabric"], &["1"], true), &fabric_ctx(None)).unwrap();
        assert_eq!(nvswitch(&p).len(), 3, "{:?}", paths(&p));
        let open = PlanContext { policy: Policy::default(), ..fabric_ctx(None) };
        for caps in ["fabric", "all"] {
            let p = plan(&cri_spec(&[&format!("NVIDIA_DRIVER_CAPABILITIES={caps}")], &["1"], false), &open).unwrap();
            assert_eq!(nvswitch(&p).len(), 3, "{caps}: {:?}", paths(&p));
        }
        // capabilities.add: [SYS_ADMIN] without privileged: true: not privileged on this node.
        let mut sys_admin =
            cri_spec(&["NVIDIA_DRIVER_CAPABILITIES=fabric", "NVIDIA_VISIBLE_DEVICES=all"], &["1"], false);
        sys_admin["process"]["capabilities"]["bounding"].as_array_mut().unwrap().push(json!("CAP_SYS_ADMIN"));
        let p = plan(&sys_admin, &fabric_ctx(None)).unwrap();
        assert_eq!(paths(&p), ["/dev/nvidiactl", "/dev/nvidia1"], "{:?}", p.warnings);
        assert!(p.warnings.iter().any(|w| w.contains("privileged_means = \"privileged-flag\"")), "{:?}", p.warnings);
    }

    #[test]
    fn device_list_entries_must_be_dev_null_binds_and_trusted() {
        let c = k8s_ctx();
        let mut spec = cri_spec(&[], &["2"], false);
        // An emptyDir a pod put at the same place: not an entry.
        spec["mounts"].as_array_mut().unwrap().push(json!({"destination": "/var/run/actk/devices/nvidia.com/gpu/all",
            "type": "bind", "source": "/var/lib/kubelet/pods/0a/volumes/kubernetes.io~empty-dir/x", "options": ["rbind"]}));
        let p = plan(&spec, &c).unwrap();
        assert_eq!(paths(&p), vec!["/dev/nvidiactl", "/dev/nvidia2"]);
        assert!(
            p.warnings.iter().any(|w| w.contains("mount /var/run/actk/devices/nvidia.com/gpu/all ignored")),
            "{:?}",
            p.warnings
        );
        let mut c = k8s_ctx();
        c.policy.mount_requests = policy::Trust::Never;
        let p = plan(&cri_spec(&[], &["2"], false), &c).unwrap();
        assert!(p.is_empty(), "{p:?}");
        assert!(p.warnings[0].contains("policy.mount_requests = \"never\""), "{:?}", p.warnings);
        // Unknown device in the list: the error names the list.
        let e = plan(&cri_spec(&[], &["9"], false), &k8s_ctx()).unwrap_err().to_string();
        assert!(e.starts_with("device list /var/run/actk/devices/nvidia.com/gpu=9: no such device 9"), "{e}");
    }

    /// Found by the CDI reference oracle (`devices:order`, hand/shared-node.yaml): a node two
    /// requested devices share is kept once, the later mention in its place, as the reference
    /// library leaves it; the same for mounts.
    #[test]
    fn a_node_named_twice_keeps_its_last_mention() {
        use crate::cdi::spec::{DeviceNode as Node, Mount};
        let node = |p: &str, uid: u32| Node { path: p.into(), uid: Some(uid), ..Default::default() };
        let mount = |p: &str, h: &str| Mount { container_path: p.into(), host_path: h.into(), ..Default::default() };
        let mut e = ContainerEdits {
            device_nodes: vec![node("/dev/zero", 1), node("/dev/null", 1), node("/dev/full", 2), node("/dev/null", 2)],
            mounts: vec![mount("/a", "/x"), mount("/b", "/y"), mount("/a", "/z")],
            ..Default::default()
        };
        keep_last_mention(&mut e);
        let nodes: Vec<_> = e.device_nodes.iter().map(|n| (n.path.as_str(), n.uid)).collect();
        assert_eq!(nodes, [("/dev/zero", Some(1)), ("/dev/full", Some(2)), ("/dev/null", Some(2))]);
        let mounts: Vec<_> = e.mounts.iter().map(|m| (m.container_path.as_str(), m.host_path.as_str())).collect();
        assert_eq!(mounts, [("/b", "/y"), ("/a", "/z")]);
    }

    /// Found by the CDI reference oracle (generated specs): a node whose spec gives a type but
    /// leaves the numbers to the host is refused when the host node is of another type (a `b`
    /// or `u` node with a character device's numbers); with numbers given the host is not asked.
    #[test]
    fn a_given_type_must_match_the_host_node() {
        use crate::cdi::spec::DeviceNode as Node;
        let node = |t: &str, major: Option<i64>| ContainerEdits {
            device_nodes: vec![Node {
                path: "/dev/null".into(),
                node_type: Some(t.into()),
                major,
                minor: major.map(|_| 3),
                ..Default::default()
            }],
            ..Default::default()
        };
        for t in ["b", "u"] {
            let e = fill_device_numbers(&mut node(t, None)).unwrap_err().to_string();
            assert!(e.contains(&format!("type \"{t}\"")) && e.contains("host node is of type \"c\""), "{e}");
        }
        let mut ok = node("c", None);
        fill_device_numbers(&mut ok).unwrap();
        assert_eq!((ok.device_nodes[0].major, ok.device_nodes[0].minor), (Some(1), Some(3)));
        let mut given = node("u", Some(1));
        fill_device_numbers(&mut given).unwrap();
        assert_eq!(given.device_nodes[0].node_type.as_deref(), Some("u"));
        // `major: 0` is unset (gen-147): both numbers come from the host node.
        let mut zero = node("c", Some(0));
        fill_device_numbers(&mut zero).unwrap();
        assert_eq!((zero.device_nodes[0].major, zero.device_nodes[0].minor), (Some(1), Some(3)));
    }
}
