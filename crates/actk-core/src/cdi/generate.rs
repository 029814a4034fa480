//! CDI spec generation: from a vendor profile and what discovery found for it, one CDI spec per
//! kind (CNCF container-device-interface SPEC.md).
//!
//! Shape of a generated spec:
//! - one device per inventory device, named by index (`0`, `1`, ...) and/or by UUID
//!   (`GPU-…`), per [`DeviceNameStrategy`]; its edits are that device's nodes;
//! - a device `all` whose edits are every device's nodes;
//! - spec-level edits (applied once when any device of the kind is requested): the shared /
//!   control nodes, the host files (driver libraries, tools, firmware) as read-only bind
//!   mounts, the profile's env, and optional hooks (each with an absolute path and an explicit
//!   env);
//! - `cdiVersion` = the minimum its fields need ([`super::version::minimum_version`]).
//!
//! Choices that keep the version low and podman 4.3 (CDI 0.5.x) happy: no annotations (0.6.0);
//! mounts carry `bind` in `options` and no `type` (runc and crun treat a mount with a `bind`
//! option as a bind mount whatever its type, and `type` would only raise nothing or need 0.4.0);
//! `hostPath` only when the host path differs from the container path (a non-`/` host root),
//! which needs 0.5.0 — as do index names, which start with a digit.
//!
//! Device nodes keep the host node's mode (`fileMode`) and, when it is not root's, its group
//! (`gid`), for every vendor: an AMD render node is 0660 root:render on Ubuntu, and a node made
//! root:root in the container could not be opened by a non-root user even with `--group-add`
//! (nvidia-container-toolkit writes the GID for the same reason). The uid stays unset: actk and
//! the reference library (container-device-interface 1.1) then give the node to the
//! container's user, who opens a 0660 node as its owner. For engines that do not (older CDI
//! libraries make it root's), [`GenerateOptions::additional_gids`] also gives the container
//! process the group of each node only its group may open (its bits allow what the others' do
//! not), as an additional GID; that needs cdiVersion 0.7.0, which podman 4.3 and containerd
//! 1.7 (CDI 0.5.x) do not read, so it is asked for (the DRA driver's claim specs, read by
//! containerd 2 and CRI-O, and `actk cdi generate --additional-gids`), not the default.

use super::CdiError;
use super::name::check_device_name;
use super::spec::{ContainerEdits, Device as CdiDevice, DeviceNode as CdiDeviceNode, Hook, Mount, Spec};
use super::version::minimum_version;
use crate::inventory::{DeviceNode, HostFile, Inventory, VendorInventory};
use crate::profile::Profile;
use std::collections::HashSet;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// Name of the device that stands for every device of a kind.
pub const ALL_DEVICE: &str = "all";

/// Prefix of the devices of NVIDIA's MIG management capabilities (`mig-config`, `mig-monitor`).
pub const MIG_CAPABILITY_PREFIX: &str = "mig-";

/// Mount options of every host file: read-only bind mount, no setuid, no device nodes.
pub const HOST_FILE_MOUNT_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "bind"];

/// The env given to hooks actk writes into specs: a minimal, explicit PATH only.
pub const HOOK_ENV: &[&str] = &["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"];

/// The `timeout` (seconds, OCI runtime-spec "POSIX-platform Hooks") of every hook actk writes
/// into specs and edits (issue 29, finding 3): the runtime kills a hook still running then and
/// fails the start. Such a hook takes milliseconds; its scan of image files stops itself well
/// before (actk-inject's per-run budget: 2 s of CPU, 10 s in all), so only a hook stuck outside
/// that scan (blocked I/O) ever meets it. actk-hook arms the same limit on itself when its
/// caller gives none (`docker run --gpus`).
pub const HOOK_TIMEOUT_S: i64 = 30;

/// How per-device entries are named (`--device-name-strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceNameStrategy {
    /// By index as the vendor tools number devices: `nvidia.com/gpu=0`.
    Index,
    /// By UUID / serial: `nvidia.com/gpu=GPU-8e6b…` (devices without one get no entry).
    Uuid,
    /// Both names for each device (default).
    #[default]
    Both,
}

impl FromStr for DeviceNameStrategy {
    type Err = String;
    /// Parses `index`, `uuid` or `both`; the error names the value and the choices.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "index" => Ok(DeviceNameStrategy::Index),
            "uuid" => Ok(DeviceNameStrategy::Uuid),
            "both" => Ok(DeviceNameStrategy::Both),
            other => Err(format!("unknown device name strategy {other:?}: use index, uuid or both")),
        }
    }
}

impl fmt::Display for DeviceNameStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceNameStrategy::Index => "index",
            DeviceNameStrategy::Uuid => "uuid",
            DeviceNameStrategy::Both => "both",
        })
    }
}

/// Options of [`generate`].
#[derive(Debug, Clone, Default)]
pub struct GenerateOptions {
    /// How per-device entries are named.
    pub device_name_strategy: DeviceNameStrategy,
    /// Capabilities whose host files go into the spec. `None` (default): every capability whose
    /// files exist on the host, as nvidia-ctk does; `Some(list)`: those (plus `base`; `all`
    /// means every one).
    pub capabilities: Option<Vec<String>>,
    /// Absolute host path of an executable to run as a `createContainer` hook that refreshes the
    /// container's ld.so.cache for the mounted library directories, invoked as
    /// `<basename> update-ldcache --folder DIR...` with env [`HOOK_ENV`]. `None`: no hook.
    pub ldcache_hook: Option<String>,
    /// Give the container process the group of each device node that only its group may open,
    /// as an additional GID (see the module docs; needs cdiVersion 0.7.0, which CDI 0.5.x
    /// engines such as podman 4.3 and containerd 1.7 do not read).
    pub additional_gids: bool,
}

/// Whether capability `cap` is selected by `selection` (`None` = every capability).
fn capability_selected(cap: &str, selection: Option<&[String]>) -> bool {
    match selection {
        None => true,
        Some(list) => cap == "base" || list.iter().any(|c| c == "all" || c == cap),
    }
}

/// Matches a container path against a control node pattern (`*` allowed in the last component).
fn path_matches(pattern: &str, path: &str) -> bool {
    if !pattern.contains('*') {
        return pattern == path;
    }
    let (pdir, pbase) = pattern.rsplit_once('/').unwrap_or(("", pattern));
    let (dir, base) = path.rsplit_once('/').unwrap_or(("", path));
    if pdir != dir {
        return false;
    }
    let parts: Vec<&str> = pbase.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if base.len() < first.len() + last.len() || !base.starts_with(first) || !base.ends_with(last) {
        return false;
    }
    let mut rest = &base[first.len()..base.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// Whether a shared node is wanted for the capability selection: a node whose profile control
/// node lists capabilities is taken only when one of them is explicitly selected. Without a
/// selection (a spec for every request, `actk cdi generate` with no `--capabilities`) such nodes
/// are left out: they grant more than using the GPUs (NVSwitch nodes configure the fabric), and a
/// spec-level node would reach every container that asks for any device of the kind.
fn shared_node_selected(profile: &Profile, node: &DeviceNode, selection: Option<&[String]>) -> bool {
    match profile.control_nodes.iter().find(|c| path_matches(&c.path, &node.path)) {
        Some(c) if !c.capabilities.is_empty() => {
            selection.is_some() && c.capabilities.iter().any(|cap| capability_selected(cap, selection))
        }
        _ => true,
    }
}

/// Whether the shared node at container path `path` is one of `profile`'s control nodes reserved
/// to capabilities (`/dev/nvidia-nvswitch*` for `fabric`): a node that using the vendor's
/// devices does not need, which only a capability that adds nodes brings
/// ([`Profile::node_capabilities`]).
pub fn reserved_to_capabilities(profile: &Profile, path: &str) -> bool {
    profile.control_nodes.iter().find(|c| path_matches(&c.path, path)).is_some_and(|c| !c.capabilities.is_empty())
}

fn path_str<'a>(kind: &str, p: &'a Path) -> Result<&'a str, CdiError> {
    p.to_str().ok_or_else(|| CdiError::Generate {
        kind: kind.to_string(),
        message: format!("host path {} is not UTF-8; CDI specs hold UTF-8 strings", p.display()),
    })
}

/// The CDI device node for an inventory node: `hostPath` only when it differs from `path`; the
/// host node's mode, and its group unless that is root's.
fn cdi_node(kind: &str, n: &DeviceNode) -> Result<CdiDeviceNode, CdiError> {
    let host = path_str(kind, &n.host_path)?;
    Ok(CdiDeviceNode {
        path: n.path.clone(),
        host_path: (host != n.path).then(|| host.to_string()),
        node_type: Some(n.node_type.to_string()),
        major: Some(i64::from(n.major)),
        minor: Some(i64::from(n.minor)),
        file_mode: n.file_mode,
        gid: n.gid.filter(|g| *g != 0),
        ..Default::default()
    })
}

/// The group a process needs to open node `n`: its gid when that is not root's and the group's
/// permission bits allow something the others' do not (`None` when the mode is not known to
/// need it: a 0666 node opens for anyone).
pub fn group_needed(n: &DeviceNode) -> Option<u32> {
    let gid = n.gid.filter(|g| *g != 0)?;
    match n.file_mode {
        Some(m) if (m >> 3) & 0o7 & !m & 0o7 == 0 => None,
        _ => Some(gid),
    }
}

/// Adds node `n` to `edits`, with its group as an additional GID when only the group grants
/// access ([`group_needed`]) and `gids` is true.
fn add_node(edits: &mut ContainerEdits, kind: &str, n: &DeviceNode, gids: bool) -> Result<(), CdiError> {
    edits.device_nodes.push(cdi_node(kind, n)?);
    if gids && let Some(g) = group_needed(n).filter(|g| !edits.additional_gids.contains(g)) {
        edits.additional_gids.push(g);
    }
    Ok(())
}

/// The CDI mount for a host file: a read-only bind mount.
fn cdi_mount(kind: &str, f: &HostFile) -> Result<Mount, CdiError> {
    Ok(Mount {
        host_path: path_str(kind, &f.host_path)?.to_string(),
        container_path: f.container_path.clone(),
        mount_type: None,
        options: HOST_FILE_MOUNT_OPTIONS.iter().map(|s| s.to_string()).collect(),
    })
}

/// Spec-level (shared) edits for a capability selection: shared nodes, host file mounts,
/// profile env, and the ld.so.cache hook when asked for.
fn shared_edits(
    profile: &Profile,
    vendor: &VendorInventory,
    selection: Option<&[String]>,
    ldcache_hook: Option<&str>,
    gids: bool,
) -> Result<ContainerEdits, CdiError> {
    let kind = vendor.kind.as_str();
    let mut edits = ContainerEdits { env: profile.env.clone(), ..Default::default() };
    for n in vendor.shared_nodes.iter().filter(|n| shared_node_selected(profile, n, selection)) {
        add_node(&mut edits, kind, n, gids)?;
    }
    let files: Vec<&HostFile> =
        vendor.host_files.iter().filter(|f| capability_selected(&f.capability, selection)).collect();
    for f in &files {
        edits.mounts.push(cdi_mount(kind, f)?);
    }
    if let Some(hook) = ldcache_hook {
        if !hook.starts_with('/') {
            return Err(CdiError::Generate {
                kind: kind.to_string(),
                message: format!(
                    "ld.so.cache hook path {hook:?} is not absolute; give the full path of the executable"
                ),
            });
        }
        let mut dirs: Vec<&str> = files
            .iter()
            .filter(|f| f.kind == crate::inventory::HostFileKind::Library)
            .filter_map(|f| f.container_path.rsplit_once('/').map(|(d, _)| if d.is_empty() { "/" } else { d }))
            .collect();
        dirs.sort_unstable();
        dirs.dedup();
        if !dirs.is_empty() {
            // Before the cache refresh: it must see the compat drop-in.
            edits.hooks.extend(compat_hook(hook, profile, vendor));
            let argv0 = hook.rsplit('/').next().unwrap_or(hook).to_string();
            let mut args = vec![argv0, "update-ldcache".to_string()];
            for d in dirs {
                args.push("--folder".into());
                args.push(d.to_string());
            }
            edits.hooks.push(Hook {
                hook_name: "createContainer".into(),
                path: hook.to_string(),
                args,
                env: HOOK_ENV.iter().map(|s| s.to_string()).collect(),
                timeout: Some(HOOK_TIMEOUT_S),
            });
        }
    }
    Ok(edits)
}

/// The createContainer hook `actk-hook enable-cuda-compat --host-driver-version V --compat-dir
/// DIR --library LIB` for a profile with `forward_compat` and a known driver version (as
/// nvidia-ctk writes `nvidia-cdi-hook enable-cuda-compat --host-driver-version V`); it must run
/// before the ld.so.cache refresh.
pub fn compat_hook(hook: &str, profile: &Profile, vendor: &VendorInventory) -> Option<Hook> {
    let fc = profile.forward_compat.as_ref()?;
    let version = vendor.driver_version.as_deref()?;
    let argv0 = hook.rsplit('/').next().unwrap_or(hook).to_string();
    Some(Hook {
        hook_name: "createContainer".into(),
        path: hook.to_string(),
        args: vec![
            argv0,
            "enable-cuda-compat".into(),
            "--host-driver-version".into(),
            version.to_string(),
            "--compat-dir".into(),
            fc.dir.clone(),
            "--library".into(),
            fc.library.clone(),
        ],
        env: HOOK_ENV.iter().map(|s| s.to_string()).collect(),
        timeout: Some(HOOK_TIMEOUT_S),
    })
}

/// Generates the CDI spec of one vendor (one kind).
///
/// Errors: [`CdiError::Generate`] when the vendor has no devices (a spec needs at least one),
/// the profile's kind differs from the inventory's, a host path is not UTF-8, or the ld.so.cache
/// hook path is not absolute.
pub fn generate(profile: &Profile, vendor: &VendorInventory, opts: &GenerateOptions) -> Result<Spec, CdiError> {
    let kind = vendor.kind.as_str();
    if profile.kind != vendor.kind {
        return Err(CdiError::Generate {
            kind: kind.to_string(),
            message: format!(
                "profile {:?} has kind {:?}, but the inventory is for {kind:?}",
                profile.name, profile.kind
            ),
        });
    }
    if vendor.devices.is_empty() {
        return Err(CdiError::Generate {
            kind: kind.to_string(),
            message: "no devices were found; a CDI spec needs at least one".into(),
        });
    }
    let mut devices = Vec::new();
    let mut names = HashSet::new();
    let mut all = ContainerEdits::default();
    for d in &vendor.devices {
        if d.nodes.is_empty() {
            // Discovery keeps a device whose node is gone (it warned, naming the node); an entry
            // without edits would make the whole spec invalid, so only this device is left out.
            tracing::warn!("{kind} device {}: no usable device node; left out of the spec", d.index);
            continue;
        }
        let gids = opts.additional_gids;
        let mut edits = ContainerEdits::default();
        for n in &d.nodes {
            add_node(&mut edits, kind, n, gids)?;
        }
        all.append(&edits);
        let mut wanted = Vec::new();
        if matches!(opts.device_name_strategy, DeviceNameStrategy::Index | DeviceNameStrategy::Both) {
            wanted.push(d.index.to_string());
        }
        if matches!(opts.device_name_strategy, DeviceNameStrategy::Uuid | DeviceNameStrategy::Both) {
            match d.uuid.as_deref() {
                Some(u) if check_device_name(u, u).is_ok() => wanted.push(u.to_string()),
                Some(u) => tracing::warn!(
                    "{kind} device {}: UUID {u:?} is not a valid CDI device name; no entry by UUID",
                    d.index
                ),
                None => tracing::debug!("{kind} device {} has no UUID; no entry by UUID", d.index),
            }
        }
        for name in wanted {
            if name != ALL_DEVICE && names.insert(name.clone()) {
                devices.push(CdiDevice { name, container_edits: edits.clone(), ..Default::default() });
            }
        }
        for m in d.mig.iter().filter(|m| m.enabled).flat_map(|m| &m.devices) {
            let mut edits = edits.clone();
            for n in &m.nodes {
                add_node(&mut edits, kind, n, gids)?;
            }
            all.append(&edits);
            let mut wanted = Vec::new();
            if matches!(opts.device_name_strategy, DeviceNameStrategy::Index | DeviceNameStrategy::Both) {
                // `GPU:MIG` as nvidia-ctk names them (NVIDIA_VISIBLE_DEVICES=0:1), and `GPU:GI:CI`.
                wanted.push(format!("{}:{}", d.index, m.index));
                wanted.push(format!("{}:{}:{}", d.index, m.gpu_instance, m.compute_instance));
            }
            if matches!(opts.device_name_strategy, DeviceNameStrategy::Uuid | DeviceNameStrategy::Both)
                && check_device_name(&m.uuid, &m.uuid).is_ok()
            {
                wanted.push(m.uuid.clone());
            }
            for name in wanted {
                if names.insert(name.clone()) {
                    devices.push(CdiDevice { name, container_edits: edits.clone(), ..Default::default() });
                }
            }
        }
    }
    if devices.is_empty() {
        return Err(CdiError::Generate {
            kind: kind.to_string(),
            message: format!(
                "no device has a name under the {} strategy (no UUIDs?); use index or both",
                opts.device_name_strategy
            ),
        });
    }
    dedup(&mut all);
    devices.push(CdiDevice { name: ALL_DEVICE.into(), container_edits: all, ..Default::default() });
    // MIG management (`NVIDIA_MIG_CONFIG_DEVICES`, `NVIDIA_MIG_MONITOR_DEVICES`): not in `all`.
    for (name, node) in &vendor.mig_capabilities {
        let mut container_edits = ContainerEdits::default();
        add_node(&mut container_edits, kind, node, opts.additional_gids)?;
        devices.push(CdiDevice {
            name: format!("{MIG_CAPABILITY_PREFIX}{name}"),
            container_edits,
            ..Default::default()
        });
    }
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: kind.to_string(),
        devices,
        container_edits: shared_edits(
            profile,
            vendor,
            opts.capabilities.as_deref(),
            opts.ldcache_hook.as_deref(),
            opts.additional_gids,
        )?,
        ..Default::default()
    };
    spec.cdi_version = minimum_version(&spec).to_string();
    Ok(spec)
}

/// Generates one spec per vendor of the inventory, pairing each vendor with the profile of the
/// same name (`vendor_filter`: only vendors whose profile name or kind equals it).
///
/// Errors: [`CdiError::Generate`] when a vendor has no profile in `profiles`, or from [`generate`].
pub fn generate_all(
    profiles: &[Profile],
    inventory: &Inventory,
    vendor_filter: Option<&str>,
    opts: &GenerateOptions,
) -> Result<Vec<Spec>, CdiError> {
    let mut specs = Vec::new();
    for v in &inventory.vendors {
        if vendor_filter.is_some_and(|f| f != v.profile && f != v.kind) {
            continue;
        }
        let Some(p) = profiles.iter().find(|p| p.name == v.profile) else {
            return Err(CdiError::Generate {
                kind: v.kind.clone(),
                message: format!("no profile named {:?} is loaded", v.profile),
            });
        };
        specs.push(generate(p, v, opts)?);
    }
    Ok(specs)
}

/// Container edits for a selection of devices of one vendor: the shared edits for the given
/// capabilities (`base` files always; `all` selects every capability; an empty list selects
/// `base` only) plus the nodes of each device whose index is in `device_indexes`, de-duplicated
/// (a node, mount or env entry appears once). The runtime shim uses this for env requests.
///
/// Indexes not in the inventory are ignored: callers check requests against the inventory
/// first so that they can name the bad value. Nodes whose host path is not UTF-8 are skipped
/// with a warning.
pub fn edits_for(
    profile: &Profile,
    vendor: &VendorInventory,
    device_indexes: &[u32],
    capabilities: &[String],
) -> ContainerEdits {
    // No additional GIDs here: these edits are applied by actk (actk-runtime, actk-hook, the
    // NRI plugin, the device plugin's device specs), which give a node the container's user
    // when the edit names none (crate::edits), and NRI cannot carry them.
    let mut edits = match shared_edits(profile, vendor, Some(capabilities), None, false) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!("{e}");
            ContainerEdits { env: profile.env.clone(), ..Default::default() }
        }
    };
    // The devices of each index, found once (issue 31: a scan of the devices per selected
    // index was quadratic in the devices of a node asked for all of them).
    let mut by_index: std::collections::HashMap<u32, Vec<&crate::inventory::Device>> =
        std::collections::HashMap::with_capacity(vendor.devices.len());
    for d in &vendor.devices {
        by_index.entry(d.index).or_default().push(d);
    }
    for idx in device_indexes {
        for d in by_index.get(idx).into_iter().flatten() {
            for n in &d.nodes {
                if let Err(e) = add_node(&mut edits, &vendor.kind, n, false) {
                    tracing::warn!("{e}");
                }
            }
        }
    }
    dedup(&mut edits);
    edits
}

/// Device nodes of MIG devices `(GPU index, MIG index)` of `vendor`: each parent GPU's nodes and
/// the capability nodes of the instance (what nvidia-container-toolkit injects for a MIG
/// device). Pairs not in the inventory are ignored (callers resolve requests first).
pub fn mig_edits(vendor: &VendorInventory, migs: &[(u32, u32)]) -> ContainerEdits {
    let mut edits = ContainerEdits::default();
    for (gpu, mig) in migs {
        let Some(d) = vendor.devices.iter().find(|d| d.index == *gpu) else { continue };
        let Some(m) = d.mig.iter().flat_map(|m| &m.devices).find(|m| m.index == *mig) else { continue };
        for n in d.nodes.iter().chain(&m.nodes) {
            if let Err(e) = add_node(&mut edits, &vendor.kind, n, false) {
                tracing::warn!("{e}");
            }
        }
    }
    dedup(&mut edits);
    edits
}

/// Removes repeated entries, keeping the first of each: env by whole entry, device nodes by
/// container path, mounts by container path, hooks and GIDs by value.
pub fn dedup(edits: &mut ContainerEdits) {
    keep_first_by(&mut edits.env, |e| e);
    keep_first_by(&mut edits.device_nodes, |n| &n.path);
    keep_first_by(&mut edits.mounts, |m| &m.container_path);
    let mut hooks: Vec<Hook> = Vec::new();
    for h in std::mem::take(&mut edits.hooks) {
        if !hooks.contains(&h) {
            hooks.push(h);
        }
    }
    edits.hooks = hooks;
    let mut seen = HashSet::new();
    edits.additional_gids.retain(|g| seen.insert(*g));
}

/// Keeps the first element of `list` for each `key`, in order. The keys are borrowed (a start's
/// dozens of mounts were each copied into the set).
fn keep_first_by<T>(list: &mut Vec<T>, key: impl Fn(&T) -> &String) {
    let keep: Vec<bool> = {
        let mut seen: HashSet<&str, foldhash::fast::RandomState> =
            HashSet::with_capacity_and_hasher(list.len(), Default::default());
        list.iter().map(|x| seen.insert(key(x).as_str())).collect()
    };
    let mut keep = keep.into_iter();
    list.retain(|_| keep.next().unwrap_or(true));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{Device, HostFileKind};
    use crate::profile::ControlNode;
    use std::path::PathBuf;

    fn node(root: &str, path: &str, major: u32, minor: u32) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            host_path: PathBuf::from(format!("{root}{path}")),
            node_type: 'c',
            major,
            minor,
            file_mode: Some(0o666),
            gid: None,
        }
    }

    fn nvidia(root: &str) -> (Profile, VendorInventory) {
        let profile = Profile {
            name: "nvidia".into(),
            kind: "nvidia.com/gpu".into(),
            control_nodes: vec![
                ControlNode { path: "/dev/nvidiactl".into(), capabilities: vec![] },
                ControlNode { path: "/dev/nvidia-modeset".into(), capabilities: vec!["display".into()] },
            ],
            ..Default::default()
        };
        let devices = (0..2)
            .map(|i| Device {
                index: i,
                uuid: Some(format!("GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd")),
                nodes: vec![node(root, &format!("/dev/nvidia{i}"), 195, i)],
                ..Default::default()
            })
            .collect();
        let lib = |cap: &str, name: &str| HostFile {
            capability: cap.into(),
            kind: HostFileKind::Library,
            host_path: PathBuf::from(format!("{root}/usr/lib/x86_64-linux-gnu/{name}")),
            container_path: format!("/usr/lib/x86_64-linux-gnu/{name}"),
        };
        let vendor = VendorInventory {
            profile: "nvidia".into(),
            kind: "nvidia.com/gpu".into(),
            driver_version: Some("580.95.05".into()),
            devices,
            shared_nodes: vec![node(root, "/dev/nvidiactl", 195, 255), node(root, "/dev/nvidia-modeset", 195, 254)],
            host_files: vec![
                lib("utility", "libnvidia-ml.so.580.95.05"),
                lib("compute", "libcuda.so.580.95.05"),
                lib("graphics", "libnvidia-glcore.so.580.95.05"),
            ],
            ..Default::default()
        };
        (profile, vendor)
    }

    #[test]
    fn generates_index_uuid_and_all_entries_with_shared_edits() {
        let (p, v) = nvidia("/fx");
        let spec = generate(&p, &v, &GenerateOptions { additional_gids: true, ..Default::default() }).unwrap();
        let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            ["0", "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd", "1", "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd", "all"]
        );
        assert_eq!(spec.cdi_version, "0.5.0");
        let d1 = &spec.devices[2].container_edits.device_nodes;
        assert_eq!(d1.len(), 1);
        assert_eq!(
            (d1[0].path.as_str(), d1[0].host_path.as_deref(), d1[0].major, d1[0].minor),
            ("/dev/nvidia1", Some("/fx/dev/nvidia1"), Some(195), Some(1))
        );
        assert_eq!(d1[0].node_type.as_deref(), Some("c"));
        assert_eq!(d1[0].file_mode, Some(0o666));
        assert_eq!(spec.devices[4].container_edits.device_nodes.len(), 2);
        let shared = &spec.container_edits;
        // A control node reserved to a capability is in a spec only when that capability is named.
        assert_eq!(shared.device_nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(), ["/dev/nvidiactl"]);
        let named = GenerateOptions { capabilities: Some(vec!["display".into()]), ..Default::default() };
        let with_display = generate(&p, &v, &named).unwrap();
        assert_eq!(
            with_display.container_edits.device_nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(),
            ["/dev/nvidiactl", "/dev/nvidia-modeset"]
        );
        assert_eq!(shared.mounts.len(), 3, "every capability's files by default");
        assert_eq!(shared.mounts[0].options, ["ro", "nosuid", "nodev", "bind"]);
        assert_eq!(shared.mounts[0].mount_type, None);
        assert!(shared.hooks.is_empty());
    }

    #[test]
    fn uuid_strategy_on_real_root_needs_only_base_version() {
        let (p, v) = nvidia("");
        let opts = GenerateOptions { device_name_strategy: DeviceNameStrategy::Uuid, ..Default::default() };
        let spec = generate(&p, &v, &opts).unwrap();
        assert_eq!(spec.devices.len(), 3);
        assert!(spec.devices.iter().all(|d| d.container_edits.device_nodes.iter().all(|n| n.host_path.is_none())));
        assert_eq!(spec.cdi_version, "0.3.0");
        let opts = GenerateOptions { device_name_strategy: DeviceNameStrategy::Index, ..Default::default() };
        let spec = generate(&p, &v, &opts).unwrap();
        assert_eq!(spec.devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["0", "1", "all"]);
    }

    #[test]
    fn capability_selection_filters_files_and_control_nodes() {
        let (p, v) = nvidia("/fx");
        let opts = GenerateOptions { capabilities: Some(vec!["compute".into()]), ..Default::default() };
        let spec = generate(&p, &v, &opts).unwrap();
        assert_eq!(spec.container_edits.mounts.len(), 1);
        assert!(spec.container_edits.mounts[0].container_path.ends_with("libcuda.so.580.95.05"));
        assert_eq!(spec.container_edits.device_nodes.len(), 1, "modeset is for display only");
    }

    #[test]
    fn ldcache_hook_has_absolute_path_and_explicit_env() {
        let (p, v) = nvidia("/fx");
        let opts = GenerateOptions { ldcache_hook: Some("/usr/bin/actk-hook".into()), ..Default::default() };
        let spec = generate(&p, &v, &opts).unwrap();
        let h = &spec.container_edits.hooks[0];
        assert_eq!(h.path, "/usr/bin/actk-hook");
        assert_eq!(h.hook_name, "createContainer");
        assert_eq!(h.args, ["actk-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"]);
        assert_eq!(h.env, HOOK_ENV);
        assert_eq!(h.timeout, Some(HOOK_TIMEOUT_S), "issue 29: a hook actk writes carries a timeout");
        let opts = GenerateOptions { ldcache_hook: Some("actk-hook".into()), ..Default::default() };
        assert!(generate(&p, &v, &opts).unwrap_err().to_string().contains("not absolute"));
    }

    #[test]
    fn no_devices_is_an_error() {
        let (p, mut v) = nvidia("");
        v.devices.clear();
        assert!(generate(&p, &v, &GenerateOptions::default()).unwrap_err().to_string().contains("no devices"));
    }

    #[test]
    fn edits_for_selection_is_deduplicated() {
        let (p, v) = nvidia("/fx");
        let e = edits_for(&p, &v, &[1, 1], &["compute".into()]);
        assert_eq!(
            e.device_nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(),
            ["/dev/nvidiactl", "/dev/nvidia1"]
        );
        assert_eq!(e.mounts.len(), 1);
        let e = edits_for(&p, &v, &[0, 1], &["all".into()]);
        assert_eq!(e.device_nodes.len(), 4);
        assert_eq!(e.mounts.len(), 3);
    }

    #[test]
    fn glob_patterns_match_last_component() {
        assert!(path_matches("/dev/nvidia-caps/*", "/dev/nvidia-caps/nvidia-cap1"));
        assert!(path_matches("/dev/accel/accel_controlD*", "/dev/accel/accel_controlD3"));
        assert!(!path_matches("/dev/accel/accel_controlD*", "/dev/accel/accel3"));
        assert!(!path_matches("/dev/nvidia-caps/*", "/dev/x/nvidia-cap1"));
    }

    /// Issue 25 item 2: generated nodes keep the host node's group and mode for every vendor;
    /// asked for, the group becomes an additional GID where only it grants access (an AMD render
    /// node, 0660 root:render); a 0666 node or a root-group node adds nothing. By default, and in
    /// edits actk applies itself, there are none (the spec stays 0.5.0 for podman 4.3).
    #[test]
    fn item2_nodes_keep_their_group_and_group_only_nodes_add_it() {
        let (p, mut v) = nvidia("");
        v.devices[0].nodes[0] = DeviceNode { file_mode: Some(0o660), gid: Some(109), ..v.devices[0].nodes[0].clone() };
        v.devices[1].nodes[0] = DeviceNode { file_mode: Some(0o666), gid: Some(44), ..v.devices[1].nodes[0].clone() };
        v.shared_nodes =
            vec![DeviceNode { file_mode: Some(0o660), gid: Some(0), ..node("", "/dev/nvidiactl", 195, 255) }];
        let spec = generate(&p, &v, &GenerateOptions { additional_gids: true, ..Default::default() }).unwrap();
        let dev = |name: &str| spec.devices.iter().find(|d| d.name == name).unwrap();
        let n0 = &dev("0").container_edits.device_nodes[0];
        assert_eq!((n0.file_mode, n0.gid, n0.uid), (Some(0o660), Some(109), None));
        assert_eq!(dev("0").container_edits.additional_gids, [109]);
        assert_eq!(dev("1").container_edits.device_nodes[0].gid, Some(44));
        assert!(dev("1").container_edits.additional_gids.is_empty(), "0666: the group grants nothing more");
        assert_eq!(dev("all").container_edits.additional_gids, [109]);
        assert_eq!(spec.container_edits.device_nodes[0].gid, None, "root's group is left to the engine");
        assert_eq!(spec.cdi_version, "0.7.0", "additionalGids need 0.7.0");
        let old = generate(&p, &v, &GenerateOptions::default()).unwrap();
        assert!(old.devices.iter().all(|d| d.container_edits.additional_gids.is_empty()));
        assert_eq!(old.cdi_version, "0.5.0");
        assert_eq!(old.devices[0].container_edits.device_nodes[0].gid, Some(109));
        let e = edits_for(&p, &v, &[0], &[]);
        let n = e.device_nodes.iter().find(|n| n.path == "/dev/nvidia0").unwrap();
        assert_eq!((n.gid, e.additional_gids.len()), (Some(109), 0));
    }
}
