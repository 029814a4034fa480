//! Applying CDI container edits to an OCI runtime spec (config.json) held as a
//! `serde_json::Value`, so that every field actk does not know, and the order of all fields,
//! survive (serde_json's `preserve_order`). oci-spec types would drop unknown fields and reject
//! unknown enum values, so the injected pieces are built as JSON directly, with the field names of
//! the OCI runtime spec (config.md "Mounts", "POSIX process" `user.additionalGids`, "Hooks";
//! config-linux.md "Devices", "Allowed Device list").
//!
//! Rules (CDI SPEC.md "Container Edits" applied as OCI fields, in the order and with the
//! defaults of the reference library, container-device-interface `pkg/cdi` `ContainerEdits.Apply`):
//! - device nodes -> `linux.devices[]` (`path`, `type`, `major`, `minor`, `fileMode`, `uid`,
//!   `gid`): an entry with the same `path` is removed and the node added after the others (in
//!   a user namespace a node whose `hostPath` differs from its `path` becomes a bind mount from
//!   `hostPath` instead, since runc would bind-mount it from `path`, which that host lacks). A
//!   node whose edit names no `uid` (`gid`) gets `process.user.uid` (`gid`) when that is not 0,
//!   so a non-root container owns the nodes it is given (runc would make them root's); and an
//!   allow rule `{"allow":true,"type":T,"major":M,"minor":m,"access":"rwm"}` appended to
//!   `linux.resources.devices` unless the same rule is there (appended last, so it overrides a
//!   deny-all earlier in the list); only for `b` and `c` nodes (the device cgroup has no type
//!   `p` or `u`, and runc refuses such a rule).
//! - mounts -> an entry with the same `destination` is removed and the mount appended; then the
//!   whole `mounts[]` is sorted by the depth of the destination (stable: `/a` before `/a/b/c`
//!   whatever order a spec lists them in, and the order of equal depths kept), as the reference
//!   library, Docker and CRI-O order mounts.
//! - env -> `process.env`: the last entry with the same NAME (the one that counts) is replaced in
//!   place, a new NAME appended; earlier duplicates stay where the engine put them.
//! - hooks -> `hooks.<stage>[]`, each with an explicit `env` (a minimal PATH when the edit has
//!   none: a hook must never inherit the engine's environment); a hook already in the stage
//!   (same path and argv, [`same_hook`]) is not added again.
//! - additional GIDs -> `process.user.additionalGids`, each at most once; 0 is skipped
//!   (SPEC.md: "Values of 0 are ignored").
//! - net devices (CDI 1.1 `netDevices`) -> `linux.netDevices` (runtime-spec config-linux.md
//!   "Network Devices"): an object keyed by the host interface name whose value names the
//!   interface in the container, `{"eth1": {"name": "net1"}}`; an entry with the same key is
//!   replaced.
//! - Intel RDT (CDI `intelRdt`) -> `linux.intelRdt` (config-linux.md "IntelRdt"): the fields the
//!   edit sets replace the same fields; fields the engine set and the edit does not name stay.
//!   Whether the low-level runtime can take them is checked by [`unsupported_by_runtime`].
//!
//! Applying the same edits twice gives the same document as applying them once.
//!
//! [`apply_deferred`] is the same edit with the added `mounts[]` and `linux.devices[]` entries
//! kept as references to the edits until the document is serialised ([`Deferred::with`]):
//! actk-runtime writes config.json that way, without building them as JSON values first.

use crate::cdi::spec::{ContainerEdits, DeviceNode, Hook, Mount};
use serde_json::{Map, Value, json};

/// Annotation actk-runtime sets on a spec it has edited; actk-hook sees it and does nothing.
pub const APPLIED_ANNOTATION: &str = "io.actk.applied";

/// Name under which Docker's `--gpus` adds its prestart hook (and under which actk-hook answers).
pub const LEGACY_NVIDIA_HOOK: &str = "nvidia-container-runtime-hook";

/// `PATH` given to a hook whose edit names no environment.
pub const HOOK_DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// OCI runtime spec hook stages (config.md "POSIX-platform Hooks").
pub const HOOK_STAGES: &[&str] =
    &["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"];

/// Why edits could not be applied. Each names the field or the edit at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    /// A field of config.json has another JSON type than the OCI runtime spec says.
    #[error("config.json: `{field}` is not {expected}")]
    WrongType {
        /// Dotted field path (`linux.devices`).
        field: String,
        /// `an object`, `an array`.
        expected: &'static str,
    },
    /// A device node edit without major/minor numbers (the planner fills them from the host node).
    #[error("device node {path}: no major/minor number (the host node could not be read)")]
    MissingNumbers {
        /// Container path of the node.
        path: String,
    },
    /// A hook edit with a stage the OCI runtime spec does not define.
    #[error("hook {path}: unknown stage {stage:?}; expected one of {}", HOOK_STAGES.join(", "))]
    BadStage {
        /// Hook executable.
        path: String,
        /// The stage given.
        stage: String,
    },
    /// An env edit that is not `NAME=value`.
    #[error("env edit {entry:?} is not NAME=value")]
    BadEnv {
        /// The entry.
        entry: String,
    },
    /// A CDI `netDevices` or `intelRdt` edit of the wrong shape (a spec that skipped validation).
    #[error("CDI edit `{field}`: {problem}")]
    BadEdit {
        /// `netDevices[0]`, `intelRdt`.
        field: String,
        /// What is wrong.
        problem: String,
    },
}

/// Applies `edits` to `spec` (a whole config.json). See the module docs for the rules.
/// Errors leave `spec` partly edited: callers work on a copy and write it only on success.
pub fn apply(spec: &mut Value, edits: &ContainerEdits) -> Result<(), EditError> {
    apply_in(spec, edits, false)
}

/// [`apply`] for a runtime that itself runs in a user namespace (`runtime_in_userns`: rootless
/// podman runs runc inside its own namespace, and the config.json it writes then has no `user`
/// namespace of its own): device nodes are handled as for a user-namespaced config.json.
pub fn apply_in(spec: &mut Value, edits: &ContainerEdits, runtime_in_userns: bool) -> Result<(), EditError> {
    apply_deferred(spec, edits, runtime_in_userns)?.write_into(spec);
    Ok(())
}

/// [`apply_in`], except that the `mounts[]` and `linux.devices[]` entries the edits add are not
/// built as JSON values: the returned [`Deferred`] holds each list's final order, as positions
/// in the list `spec` has (left as it was) and references to the edits. [`Deferred::with`]
/// serialises `spec` with them in place, byte for byte what [`apply_in`] gives; [`Deferred::write_into`]
/// puts them into `spec`. actk-runtime writes config.json this way: building a DGX node's ~60
/// driver mounts as values and serialising those was a tenth of a container start (issue 31).
///
/// Until then `spec` still has its own `mounts` and `linux.devices` (an added list is present and
/// empty): a reader of those lists (a hooks.d `hasBindMounts` condition) must see the written
/// form, and nothing may change those two lists before the write (the positions would no longer
/// name their elements; checked in debug builds). Errors: as [`apply_in`]. A device node
/// without numbers is refused before anything is changed; a later error (a field of the wrong
/// type) leaves `spec` partly edited (cgroup rules without their device entries), so callers
/// write it only on success.
pub fn apply_deferred<'e>(
    spec: &mut Value,
    edits: &'e ContainerEdits,
    runtime_in_userns: bool,
) -> Result<Deferred<'e>, EditError> {
    for e in &edits.env {
        if e.split_once('=').is_none_or(|(n, _)| n.is_empty()) {
            return Err(EditError::BadEnv { entry: e.clone() });
        }
    }
    for h in &edits.hooks {
        if !HOOK_STAGES.contains(&h.hook_name.as_str()) {
            return Err(EditError::BadStage { path: h.path.clone(), stage: h.hook_name.clone() });
        }
    }
    for n in &edits.device_nodes {
        // A FIFO (`p`) has no numbers; character and block devices must have them.
        if n.node_type.as_deref() != Some("p") && (n.major.is_none() || n.minor.is_none()) {
            return Err(EditError::MissingNumbers { path: n.path.clone() });
        }
    }
    let net_devices = net_device_entries(edits)?;
    let rdt = match &edits.intel_rdt {
        None => None,
        Some(Value::Object(m)) => Some(m),
        Some(other) => {
            return Err(EditError::BadEdit { field: "intelRdt".into(), problem: format!("{other} is not an object") });
        }
    };
    let root =
        spec.as_object_mut().ok_or(EditError::WrongType { field: "(document)".into(), expected: "an object" })?;
    let mut deferred = Deferred { mounts: None, devices: None, owner: process_owner(root), lens: (0, 0) };

    if !edits.env.is_empty() {
        let env = array_at(root, &["process", "env"])?;
        // The last entry of each NAME (the one that counts) is replaced in place; a new NAME is
        // appended (the reference library's order).
        let name = |s: &str| s.split_once('=').map_or(s, |(n, _)| n).to_string();
        let mut last: foldhash::HashMap<String, usize> =
            env.iter().enumerate().filter_map(|(i, v)| v.as_str().map(|s| (name(s), i))).collect();
        for e in &edits.env {
            match last.get(&name(e)) {
                Some(&i) => env[i] = Value::String(e.clone()),
                None => {
                    env.push(Value::String(e.clone()));
                    last.insert(name(e), env.len() - 1);
                }
            }
        }
    }

    if !edits.device_nodes.is_empty() {
        // In a user namespace runc cannot mknod; it bind-mounts each linux.devices entry from the
        // same path on the host. A node that exists only elsewhere on the host (a driver root,
        // /run/nvidia/driver/dev/nvidiactl; a fixture) is bind-mounted from there instead, as
        // runc would have done from its path: the cgroup rule below still grants it.
        let userns = runtime_in_userns || has_user_namespace(root);
        let (moved, direct): (Vec<&DeviceNode>, Vec<&DeviceNode>) =
            edits.device_nodes.iter().partition(|n| userns && n.host_path.as_deref().is_some_and(|h| h != n.path));
        if !direct.is_empty() {
            let list = array_at(root, &["linux", "devices"])?;
            deferred.devices = Some(merge_entries(list, "path", direct.into_iter().map(Entry::Device), true));
        }
        if !moved.is_empty() {
            let list = array_at(root, &["mounts"])?;
            deferred.mounts = Some(merge_entries(list, "destination", moved.into_iter().map(Entry::Bind), false));
        }
        let rules = array_at(root, &["linux", "resources", "devices"])?;
        // The allow rules already there, indexed once (issue 31): looking each node's rule up
        // in the list made the loop quadratic in the number of nodes.
        let mut present: foldhash::HashSet<RuleKey> = rules.iter().filter_map(rule_key).collect();
        for node in &edits.device_nodes {
            let ty = node.node_type.as_deref().unwrap_or("c");
            // Rules only for block and character devices, as the reference library writes them:
            // the device cgroup knows only `a`, `b` and `c`, runc 1.1 refuses the container for
            // a rule of type `p` or `u` ("invalid cgroup device type"), a FIFO needs none, and
            // runc allows each `linux.devices` entry (an unbuffered `u` one too) by itself.
            if ty != "b" && ty != "c" {
                continue;
            }
            // Absent or empty: rwm (CDI SPEC.md).
            let access = node.permissions.as_deref().filter(|p| !p.is_empty()).unwrap_or("rwm");
            let (major, minor) = (Value::from(node.major), Value::from(node.minor));
            if present.insert((ty.to_string(), node.major, node.minor, access.to_string())) {
                let mut rule = Map::with_capacity(5);
                rule.insert("allow".into(), Value::Bool(true));
                rule.insert("type".into(), Value::from(ty));
                rule.insert("major".into(), major);
                rule.insert("minor".into(), minor);
                rule.insert("access".into(), Value::from(access));
                rules.push(Value::Object(rule));
            }
        }
    }

    if !edits.mounts.is_empty() {
        let list = array_at(root, &["mounts"])?;
        let entries = edits.mounts.iter().map(Entry::Mount);
        deferred.mounts = Some(match deferred.mounts.take() {
            None => merge_entries(list, "destination", entries, false),
            Some(mut slots) => {
                replace_all(&mut slots, |e| entry_key(e, list, "destination"), entries.collect(), false);
                slots
            }
        });
    }
    deferred.lens = lens(root);
    if let Some(slots) = &mut deferred.mounts
        && let Some(Value::Array(list)) = root.get("mounts")
    {
        // By the depth of the destination, stably: a mount is attached after every mount of a
        // shallower path, so a parent never hides a child (Docker's and the reference library's
        // order: the number of `/` in the cleaned path). Each depth computed once.
        slots.sort_by_cached_key(|e| mount_depth(entry_key(e, list, "destination").unwrap_or("")));
    }

    for h in &edits.hooks {
        let stage = array_at(root, &["hooks", h.hook_name.as_str()])?;
        let entry = hook_json(h);
        if !stage.iter().any(|e| same_hook(e, &entry)) {
            stage.push(entry);
        }
    }

    if edits.additional_gids.iter().any(|g| *g != 0) {
        let gids = array_at(root, &["process", "user", "additionalGids"])?;
        for g in edits.additional_gids.iter().filter(|g| **g != 0) {
            let v = json!(g);
            if !gids.contains(&v) {
                gids.push(v);
            }
        }
    }

    if !net_devices.is_empty() {
        let nd = object_at(root, &["linux", "netDevices"])?;
        for (host, name) in net_devices {
            nd.insert(host.to_string(), json!({ "name": name }));
        }
    }

    if let Some(rdt) = rdt {
        let target = object_at(root, &["linux", "intelRdt"])?;
        for (k, v) in rdt {
            target.insert(k.clone(), v.clone());
        }
    }
    Ok(deferred)
}

/// The `mounts[]` and `linux.devices[]` lists [`apply_deferred`] leaves to be written: each list's
/// final order, or `None` where the edits leave that list as config.json has it.
#[derive(Debug, Clone)]
pub struct Deferred<'e> {
    mounts: Option<Vec<Entry<'e>>>,
    devices: Option<Vec<Entry<'e>>>,
    /// `process.user`'s (uid, gid) when not 0: the owner of a node whose edit names none.
    owner: (Option<u32>, Option<u32>),
    /// The lengths of the `mounts` and `linux.devices` lists the positions refer to.
    lens: (usize, usize),
}

/// The lengths of `root`'s `mounts` and `linux.devices` lists (0 where absent).
fn lens(root: &Map<String, Value>) -> (usize, usize) {
    let len = |v: Option<&Value>| v.and_then(Value::as_array).map_or(0, Vec::len);
    (len(root.get("mounts")), len(root.get("linux").and_then(|l| l.get("devices"))))
}

/// One element of a deferred list: the element at this position of the list config.json has,
/// or what an edit adds.
#[derive(Debug, Clone, Copy)]
enum Entry<'e> {
    Spec(usize),
    Mount(&'e Mount),
    /// A device node bind-mounted from its host path (in a user namespace).
    Bind(&'e DeviceNode),
    /// A `linux.devices` entry.
    Device(&'e DeviceNode),
}

/// `list`'s positions with `entries` merged in by [`replace_all`].
fn merge_entries<'e>(
    list: &[Value],
    key: &str,
    entries: impl Iterator<Item = Entry<'e>>,
    replace_again: bool,
) -> Vec<Entry<'e>> {
    let mut slots: Vec<Entry<'e>> = (0..list.len()).map(Entry::Spec).collect();
    replace_all(&mut slots, |e| entry_key(e, list, key), entries.collect(), replace_again);
    slots
}

/// The `key` member (`destination`, `path`) of `e`; a position is looked up in `list`.
fn entry_key<'a>(e: &Entry<'a>, list: &'a [Value], key: &str) -> Option<&'a str> {
    match *e {
        Entry::Spec(i) => list.get(i).and_then(|v| member(v, key)).and_then(Value::as_str),
        Entry::Mount(m) => Some(&m.container_path),
        Entry::Bind(n) | Entry::Device(n) => Some(&n.path),
    }
}

impl<'e> Deferred<'e> {
    /// `spec` (the document [`apply_deferred`] edited, with any other changes made since) with
    /// the deferred lists in place, for serde: serialised, it is what `spec` serialises to after
    /// [`Deferred::write_into`], without building the added entries as values.
    pub fn with<'a>(&'a self, spec: &'a Value) -> WithDeferred<'a, 'e> {
        debug_assert_eq!(
            spec.as_object().map(lens),
            Some(self.lens),
            "mounts or linux.devices changed since apply_deferred"
        );
        WithDeferred { spec, deferred: self }
    }

    /// Puts the deferred lists into `spec`, as [`apply_in`] leaves it.
    pub fn write_into(self, spec: &mut Value) {
        debug_assert_eq!(
            spec.as_object().map(lens),
            Some(self.lens),
            "mounts or linux.devices changed since apply_deferred"
        );
        let owner = self.owner;
        let build = |slots: Vec<Entry<'e>>, list: &mut Vec<Value>| {
            let mut old: Vec<Option<Value>> = std::mem::take(list).into_iter().map(Some).collect();
            list.reserve(slots.len());
            for e in slots {
                let v = match e {
                    Entry::Spec(i) => old.get_mut(i).and_then(Option::take),
                    // Strings and integers only: serialising to a value cannot fail.
                    e => Some(serde_json::to_value(Out { e, owner }).expect("an added entry is plain JSON")),
                };
                list.extend(v);
            }
        };
        if let Some(slots) = self.mounts
            && let Some(Value::Array(list)) = spec.get_mut("mounts")
        {
            build(slots, list);
        }
        if let Some(slots) = self.devices
            && let Some(Value::Array(list)) = spec.get_mut("linux").and_then(|l| l.get_mut("devices"))
        {
            build(slots, list);
        }
    }
}

/// A config.json with [`Deferred`] lists in place, as [`Deferred::with`] returns it.
pub struct WithDeferred<'a, 'e> {
    spec: &'a Value,
    deferred: &'a Deferred<'e>,
}

impl serde::Serialize for WithDeferred<'_, '_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let d = self.deferred;
        let Some(root) = self.spec.as_object().filter(|_| d.mounts.is_some() || d.devices.is_some()) else {
            return self.spec.serialize(s);
        };
        let mut map = s.serialize_map(Some(root.len()))?;
        for (k, v) in root {
            match (k.as_str(), v, &d.mounts, &d.devices) {
                ("mounts", Value::Array(list), Some(slots), _) => {
                    map.serialize_entry(k, &Slots { list, slots, owner: d.owner })?
                }
                ("linux", Value::Object(linux), _, Some(slots)) => {
                    map.serialize_entry(k, &Linux { linux, slots, owner: d.owner })?
                }
                _ => map.serialize_entry(k, v)?,
            }
        }
        map.end()
    }
}

/// `linux` with its `devices` list deferred.
struct Linux<'a, 'e> {
    linux: &'a Map<String, Value>,
    slots: &'a [Entry<'e>],
    owner: (Option<u32>, Option<u32>),
}

impl serde::Serialize for Linux<'_, '_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.linux.len()))?;
        for (k, v) in self.linux {
            match (k.as_str(), v) {
                ("devices", Value::Array(list)) => {
                    map.serialize_entry(k, &Slots { list, slots: self.slots, owner: self.owner })?
                }
                _ => map.serialize_entry(k, v)?,
            }
        }
        map.end()
    }
}

/// A deferred list: positions in `list` and added entries.
struct Slots<'a, 'e> {
    list: &'a [Value],
    slots: &'a [Entry<'e>],
    owner: (Option<u32>, Option<u32>),
}

impl serde::Serialize for Slots<'_, '_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.slots.len()))?;
        for &e in self.slots {
            match e {
                Entry::Spec(i) => {
                    if let Some(v) = self.list.get(i) {
                        seq.serialize_element(v)?;
                    }
                }
                e => seq.serialize_element(&Out { e, owner: self.owner })?,
            }
        }
        seq.end()
    }
}

/// An added entry as config.json has it: a mount (config.md "Mounts"), a device node's bind
/// mount, or a `linux.devices` entry (config-linux.md "Devices").
#[derive(Clone, Copy)]
struct Out<'e> {
    e: Entry<'e>,
    owner: (Option<u32>, Option<u32>),
}

impl serde::Serialize for Out<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self.e {
            Entry::Mount(m) => {
                // The type is the spec's, and absent when the spec gives none, as the reference
                // library writes it: runc and crun make a bind mount whenever the options say
                // `bind`/`rbind`, whatever the type, and a typed `bind` is what runtime-tools'
                // in-container checker cannot verify (tests/conformance/runtime-tools). A mount
                // whose type is absent or `bind` gets the `bind` option when it has neither: runc
                // makes a bind mount only when the options say so, CDI specs often leave it
                // implied, and without it runc would call mount(2) with an empty filesystem type
                // and fail the container.
                let ty = m.mount_type.as_deref().filter(|t| !t.is_empty());
                let add_bind =
                    matches!(ty, None | Some("bind")) && !m.options.iter().any(|o| o == "bind" || o == "rbind");
                let mut map = s.serialize_map(None)?;
                map.serialize_entry("destination", &m.container_path)?;
                if let Some(ty) = ty {
                    map.serialize_entry("type", ty)?;
                }
                map.serialize_entry("source", &m.host_path)?;
                map.serialize_entry("options", &Options { options: &m.options, add_bind })?;
                map.end()
            }
            Entry::Bind(n) => {
                // What runc does for linux.devices in a user namespace: `nosuid,noexec`, never
                // `nodev` or `ro` (the node must open read-write).
                let mut map = s.serialize_map(Some(4))?;
                map.serialize_entry("destination", &n.path)?;
                map.serialize_entry("type", "bind")?;
                map.serialize_entry("source", n.host_path.as_deref().unwrap_or(&n.path))?;
                map.serialize_entry("options", &["bind", "nosuid", "noexec"])?;
                map.end()
            }
            Entry::Device(n) => {
                let t = n.node_type.as_deref().unwrap_or("c");
                let mut map = s.serialize_map(None)?;
                map.serialize_entry("path", &n.path)?;
                map.serialize_entry("type", t)?;
                // A FIFO (`p`) has no numbers ([`apply_deferred`] checked the others have them).
                if t != "p" {
                    map.serialize_entry("major", &n.major)?;
                    map.serialize_entry("minor", &n.minor)?;
                }
                if let Some(mode) = n.file_mode {
                    map.serialize_entry("fileMode", &mode)?;
                }
                if let Some(uid) = n.uid.or(self.owner.0) {
                    map.serialize_entry("uid", &uid)?;
                }
                if let Some(gid) = n.gid.or(self.owner.1) {
                    map.serialize_entry("gid", &gid)?;
                }
                map.end()
            }
            Entry::Spec(_) => s.serialize_unit(),
        }
    }
}

/// A mount's options, with `bind` appended when `add_bind`.
struct Options<'a> {
    options: &'a [String],
    add_bind: bool,
}

impl serde::Serialize for Options<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.options.iter().map(String::as_str).chain(self.add_bind.then_some("bind")))
    }
}

/// An allow rule of `linux.resources.devices` as [`apply_in`] writes it: type, major, minor
/// (`None`: JSON null, as a FIFO's rule has) and access.
type RuleKey = (String, Option<i64>, Option<i64>, String);

/// The key of `rule` when it has exactly the five fields of a rule [`apply_in`] writes, with
/// `allow: true` and integer (or null) numbers; any other rule never equals one it writes.
fn rule_key(rule: &Value) -> Option<RuleKey> {
    let o = rule.as_object()?;
    let number = |k: &str| match o.get(k)? {
        Value::Null => Some(None),
        v => v.as_i64().map(Some),
    };
    (o.len() == 5 && o.get("allow") == Some(&Value::Bool(true))).then_some(())?;
    Some((
        o.get("type")?.as_str()?.to_string(),
        number("major")?,
        number("minor")?,
        o.get("access")?.as_str()?.to_string(),
    ))
}

/// `(hostInterfaceName, name)` of every CDI net device edit. Errors: an entry without both names.
fn net_device_entries(edits: &ContainerEdits) -> Result<Vec<(&str, &str)>, EditError> {
    edits
        .net_devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let get = |k: &str| d.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
            match (get("hostInterfaceName"), get("name")) {
                (Some(h), Some(n)) => Ok((h, n)),
                _ => Err(EditError::BadEdit {
                    field: format!("netDevices[{i}]"),
                    problem: format!("{d} needs a non-empty hostInterfaceName and name"),
                }),
            }
        })
        .collect()
}

/// Runtime-spec 1.3 `linux.intelRdt` fields a runtime announces in its features document
/// (features-linux.md "IntelRdt"): `schemata` and `enableMonitoring` (as `monitoring`). The
/// other fields (`closID`, `l3CacheSchema`, `memBwSchema`) are in every runtime-spec version.
const RDT_FEATURE_FIELDS: &[(&str, &str)] = &[("schemata", "schemata"), ("enableMonitoring", "monitoring")];

/// The edits of `edits` that the low-level runtime would silently ignore, judged by its features
/// document (`runc features`, runtime-spec features.md; `None` when the runtime has no
/// `features` command, as crun 1.8 and runc before 1.1): one line per refused field, naming it
/// and why. An empty result means every edit reaches the runtime, which applies it or fails
/// naming it (runc refuses `intelRdt` on a host without resctrl).
///
/// - `netDevices` (OCI `linux.netDevices`, runtime-spec 1.3) needs `linux.netDevices.enabled`;
/// - `intelRdt` needs the host's resctrl filesystem (`resctrl`: mounted at /sys/fs/resctrl):
///   runc 1.1 starts the container without the class when it is missing;
/// - `intelRdt.schemata` / `intelRdt.enableMonitoring` (runtime-spec 1.3) need
///   `linux.intelRdt.schemata` / `linux.intelRdt.monitoring`.
pub fn unsupported_by_runtime(
    edits: &ContainerEdits,
    runtime: &str,
    features: Option<&Value>,
    resctrl: bool,
) -> Vec<String> {
    let flag = |ptr: &str| features.and_then(|f| f.pointer(ptr)).and_then(Value::as_bool) == Some(true);
    let said = match features {
        Some(_) => format!("`{runtime} features` does not list it"),
        None => format!("{runtime} has no `features` command to say it can"),
    };
    let mut out = Vec::new();
    if !edits.net_devices.is_empty() && !flag("/linux/netDevices/enabled") {
        let names: Vec<String> = edits
            .net_devices
            .iter()
            .map(|d| d.get("hostInterfaceName").and_then(Value::as_str).unwrap_or("?").to_string())
            .collect();
        out.push(format!(
            "CDI edit netDevices ({}) becomes OCI linux.netDevices, which {runtime} would ignore ({said}); use a runtime that supports network devices (runc >= 1.3) or drop the netDevices edit",
            names.join(", ")
        ));
    }
    if edits.intel_rdt.is_some() && !resctrl {
        out.push(format!(
            "CDI edit intelRdt becomes OCI linux.intelRdt, but this host has no Intel RDT (no resctrl filesystem mounted at /sys/fs/resctrl) and {runtime} would start the container without it; mount resctrl (`mount -t resctrl resctrl /sys/fs/resctrl`) on an RDT-capable host or drop the intelRdt edit"
        ));
    }
    if let Some(rdt) = edits.intel_rdt.as_ref().and_then(Value::as_object) {
        for (field, feature) in RDT_FEATURE_FIELDS {
            if rdt.contains_key(*field) && !flag(&format!("/linux/intelRdt/{feature}")) {
                out.push(format!(
                    "CDI edit intelRdt.{field} becomes OCI linux.intelRdt.{field}, which {runtime} would ignore ({said}: linux.intelRdt.{feature}); use a runtime that supports it or drop the field"
                ));
            }
        }
    }
    out
}

/// Whether two OCI hook entries run the same program the same way: same `path` and the same
/// argv (an absent or empty `args` is argv `[path]`, as runtimes execute it). `env` and
/// `timeout` do not count: the same hook merged by podman and by actk differs only there.
pub fn same_hook(a: &Value, b: &Value) -> bool {
    let path = |h: &Value| h.get("path").and_then(Value::as_str).map(str::to_string);
    let argv = |h: &Value| -> Option<Vec<String>> {
        let p = path(h)?;
        let args: Vec<String> = h
            .get("args")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|x| x.as_str().map(str::to_string).unwrap_or_else(|| x.to_string())).collect())
            .unwrap_or_default();
        Some(if args.is_empty() { vec![p] } else { args })
    };
    path(a).is_some() && path(a) == path(b) && argv(a) == argv(b)
}

/// Removes the prestart hooks Docker's `--gpus` adds (executable or argv[0] named
/// [`LEGACY_NVIDIA_HOOK`]), once actk-runtime has served the request itself, so that nothing is
/// injected twice. Returns how many were removed. An empty `prestart` list is removed too.
pub fn remove_legacy_nvidia_hook(spec: &mut Value) -> usize {
    let Some(hooks) = spec.get_mut("hooks").and_then(Value::as_object_mut) else { return 0 };
    let Some(pre) = hooks.get_mut("prestart").and_then(Value::as_array_mut) else { return 0 };
    let before = pre.len();
    let is_legacy = |h: &Value| {
        let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_string();
        let path = h.get("path").and_then(Value::as_str).map(base);
        let arg0 = h.get("args").and_then(|a| a.get(0)).and_then(Value::as_str).map(base);
        path.as_deref() == Some(LEGACY_NVIDIA_HOOK) || arg0.as_deref() == Some(LEGACY_NVIDIA_HOOK)
    };
    pre.retain(|h| !is_legacy(h));
    let removed = before - pre.len();
    if pre.is_empty() && removed > 0 {
        hooks.remove("prestart");
    }
    removed
}

/// Sets [`APPLIED_ANNOTATION`] to `summary` (e.g. the qualified names served).
pub fn mark_applied(spec: &mut Value, summary: &str) -> Result<(), EditError> {
    let root =
        spec.as_object_mut().ok_or(EditError::WrongType { field: "(document)".into(), expected: "an object" })?;
    let ann = object_at(root, &["annotations"])?;
    ann.insert(APPLIED_ANNOTATION.into(), Value::String(summary.into()));
    Ok(())
}

/// True when the spec carries [`APPLIED_ANNOTATION`].
pub fn is_applied(spec: &Value) -> bool {
    spec.pointer("/annotations").and_then(|a| a.get(APPLIED_ANNOTATION)).is_some()
}

/// `process.user`'s uid and gid of a whole config.json, each when it is not 0: the owner a
/// device node gets when its edit names none, as the reference library gives it (actk-hook
/// gives the nodes it makes to the same owner).
pub fn node_owner(spec: &Value) -> (Option<u32>, Option<u32>) {
    spec.as_object().map(process_owner).unwrap_or_default()
}

fn process_owner(root: &Map<String, Value>) -> (Option<u32>, Option<u32>) {
    let user = root.get("process").and_then(|p| p.get("user"));
    let id = |k: &str| {
        user.and_then(|u| u.get(k)).and_then(Value::as_u64).and_then(|v| u32::try_from(v).ok()).filter(|v| *v != 0)
    };
    (id("uid"), id("gid"))
}

/// Puts `entries` into `list` one by one as the reference library does: the first element with
/// the entry's `key` is removed, then (`replace_again`, its AddDevice) another element with that
/// key is replaced in place, else the entry is appended (its AddMount always appends). So an
/// entry given twice ends up once, the later one.
///
/// In one pass (issue 31: a scan of the list per entry was quadratic in the devices of a
/// node asked for all of them): the positions of each key's elements are queued in list
/// order; a removal leaves a hole, filled in at the end, so no position moves meanwhile, and
/// an append goes past every position queued.
fn replace_all<'k, T: Copy>(
    list: &mut Vec<T>,
    key: impl Fn(&T) -> Option<&'k str>,
    entries: Vec<T>,
    replace_again: bool,
) {
    // Slots: 0..list.len() are the list's elements, then one per appended entry; what each slot
    // holds is decided first, with keys borrowed from the elements, and the values are moved once
    // at the end. Each key's queue of slots (in list order) is a chain through `next`, so a key
    // costs one map entry (foldhash) and no allocation of its own.
    #[derive(Clone, Copy)]
    enum Src {
        List(usize),
        Entry(usize),
        Gone,
    }
    const END: usize = usize::MAX;
    let len = list.len();
    let mut src: Vec<Src> = (0..len).map(Src::List).collect();
    src.reserve(entries.len());
    let mut next: Vec<usize> = vec![END; len + entries.len()];
    {
        let mut queues: Queues<'_> = Queues::with_capacity_and_hasher(len + entries.len(), Default::default());
        for (i, v) in list.iter().enumerate() {
            if let Some(k) = key(v) {
                enqueue(&mut queues, &mut next, k, i);
            }
        }
        for (j, entry) in entries.iter().enumerate() {
            let Some(k) = key(entry) else {
                src.push(Src::Entry(j));
                continue;
            };
            let q = queues.entry(k).or_insert((END, END));
            if q.0 != END {
                src[q.0] = Src::Gone;
                q.0 = next[q.0];
                if q.0 == END {
                    q.1 = END;
                }
            }
            if replace_again && q.0 != END {
                src[q.0] = Src::Entry(j);
            } else {
                enqueue(&mut queues, &mut next, k, src.len());
                src.push(Src::Entry(j));
            }
        }
    }
    let mut old: Vec<Option<T>> = list.drain(..).map(Some).collect();
    let mut new: Vec<Option<T>> = entries.into_iter().map(Some).collect();
    list.reserve(src.len());
    for s in src {
        let v = match s {
            Src::List(i) => old[i].take(),
            Src::Entry(j) => new[j].take(),
            Src::Gone => None,
        };
        list.extend(v);
    }
}

/// replace_all's queues: per key, the first and last slot holding it ([`usize::MAX`]: none).
type Queues<'k> = std::collections::HashMap<&'k str, (usize, usize), foldhash::fast::RandomState>;

/// Appends `slot` to `k`'s queue, chained through `next`.
fn enqueue<'k>(queues: &mut Queues<'k>, next: &mut [usize], k: &'k str, slot: usize) {
    let q = queues.entry(k).or_insert((usize::MAX, usize::MAX));
    if q.1 == usize::MAX {
        q.0 = slot;
    } else {
        next[q.1] = slot;
    }
    q.1 = slot;
}

/// `v`'s member `key` when `v` is an object. Small objects (a mount's four members, a device's
/// six) are searched in order: cheaper than hashing the key with the map's SipHash.
fn member<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match v {
        Value::Object(m) if m.len() <= 8 => m.iter().find_map(|(k, v)| (k == key).then_some(v)),
        Value::Object(m) => m.get(key),
        _ => None,
    }
}

/// The number of separators in `path` cleaned as Go's `filepath.Clean` does (`/` is 1, `/a/b`
/// is 2, `/a//b/../c/` is 2, a relative `a/b` is 1).
pub fn mount_depth(path: &str) -> usize {
    // The cleaned path's components counted, not collected (issue 31: a Vec and a char search
    // per mount were 1.6 k instructions of each of a spec's 65 mounts). `..` components can only
    // pile up at the front of a relative path, so `ups` of the `n` kept components are `..`.
    let abs = path.starts_with('/');
    let (mut n, mut ups) = (0usize, 0usize);
    for p in path.as_bytes().split(|&b| b == b'/') {
        match p {
            b"" | b"." => {}
            b".." => {
                if n > ups {
                    n -= 1;
                } else if !abs {
                    n += 1;
                    ups += 1;
                }
            }
            _ => n += 1,
        }
    }
    match (abs, n) {
        (true, 0) => 1,
        (true, n) => n,
        (false, 0) => 0,
        (false, n) => n - 1,
    }
}

/// Whether the spec asks for a user namespace (`linux.namespaces[].type == "user"`): podman
/// rootless and `--uidmap`, Docker userns-remap, Kubernetes `hostUsers: false`.
pub fn has_user_namespace(spec: &Map<String, Value>) -> bool {
    spec.get("linux")
        .and_then(|l| l.get("namespaces"))
        .and_then(Value::as_array)
        .is_some_and(|ns| ns.iter().any(|n| n.get("type").and_then(Value::as_str) == Some("user")))
}

fn hook_json(h: &Hook) -> Value {
    let mut m = Map::new();
    m.insert("path".into(), json!(h.path));
    if !h.args.is_empty() {
        m.insert("args".into(), json!(h.args));
    }
    let env = if h.env.is_empty() { vec![HOOK_DEFAULT_PATH.to_string()] } else { h.env.clone() };
    m.insert("env".into(), json!(env));
    if let Some(t) = h.timeout {
        m.insert("timeout".into(), json!(t));
    }
    Value::Object(m)
}

/// The object at `path` under `root`, created (empty) where missing.
pub(crate) fn object_at<'a>(
    root: &'a mut Map<String, Value>,
    path: &[&str],
) -> Result<&'a mut Map<String, Value>, EditError> {
    let mut cur = root;
    for (i, key) in path.iter().enumerate() {
        let v = cur.entry(key.to_string()).or_insert_with(|| Value::Object(Map::new()));
        if v.is_null() {
            *v = Value::Object(Map::new());
        }
        cur = v
            .as_object_mut()
            .ok_or_else(|| EditError::WrongType { field: path[..=i].join("."), expected: "an object" })?;
    }
    Ok(cur)
}

/// The array at `path` under `root`, created (empty, with missing parents) where missing.
pub(crate) fn array_at<'a>(root: &'a mut Map<String, Value>, path: &[&str]) -> Result<&'a mut Vec<Value>, EditError> {
    let (last, parents) = path.split_last().expect("array_at is called with a non-empty path");
    let parent = object_at(root, parents)?;
    let v = parent.entry(last.to_string()).or_insert_with(|| Value::Array(Vec::new()));
    if v.is_null() {
        *v = Value::Array(Vec::new());
    }
    v.as_array_mut().ok_or_else(|| EditError::WrongType { field: path.join("."), expected: "an array" })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edits() -> ContainerEdits {
        ContainerEdits {
            env: vec!["NVIDIA_VISIBLE_DEVICES=void".into(), "ACTK=1".into()],
            device_nodes: vec![
                DeviceNode {
                    path: "/dev/nvidia1".into(),
                    node_type: Some("c".into()),
                    major: Some(195),
                    minor: Some(1),
                    file_mode: Some(0o666),
                    ..Default::default()
                },
                DeviceNode {
                    path: "/dev/nvidiactl".into(),
                    major: Some(195),
                    minor: Some(255),
                    uid: Some(0),
                    gid: Some(0),
                    ..Default::default()
                },
            ],
            mounts: vec![Mount {
                host_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05".into(),
                container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05".into(),
                mount_type: None,
                options: vec!["ro".into(), "nosuid".into(), "nodev".into()],
            }],
            hooks: vec![Hook {
                hook_name: "createContainer".into(),
                path: "/usr/bin/actk-hook".into(),
                args: vec!["actk-hook".into(), "ldconfig".into()],
                ..Default::default()
            }],
            additional_gids: vec![44, 0],
            ..Default::default()
        }
    }

    fn base() -> Value {
        json!({
            "ociVersion": "1.0.2",
            "zzUnknown": {"keep": [1, 2]},
            "process": {"user": {"uid": 0, "gid": 0, "additionalGids": [0]}, "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=1"]},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}, "devices": [{"path": "/dev/nvidia1", "type": "c", "major": 1, "minor": 1}]}
        })
    }

    /// [`replace_all`] on values keyed by their member `d`, as apply_deferred runs it on
    /// positions: each element and entry is a position in one list of all of them.
    fn replace_all_values(list: &mut Vec<Value>, entries: Vec<Value>, replace_again: bool) {
        let n = list.len();
        let all: Vec<Value> = list.drain(..).chain(entries).collect();
        let mut slots: Vec<usize> = (0..n).collect();
        replace_all(
            &mut slots,
            |&i| member(&all[i], "d").and_then(Value::as_str),
            (n..all.len()).collect(),
            replace_again,
        );
        list.extend(slots.into_iter().map(|i| all[i].clone()));
    }

    /// The reference library's rule stated directly: a scan of the list per entry.
    fn replace_all_direct(list: &mut Vec<Value>, key: &str, entries: Vec<Value>, replace_again: bool) {
        for entry in entries {
            let k = entry.get(key).and_then(Value::as_str).map(str::to_string);
            let same = |v: &Value| k.is_some() && v.get(key).and_then(Value::as_str) == k.as_deref();
            if let Some(i) = list.iter().position(same) {
                list.remove(i);
            }
            match list.iter().position(same).filter(|_| replace_again) {
                Some(i) => list[i] = entry,
                None => list.push(entry),
            }
        }
    }

    proptest::proptest! {
        /// The one-pass replace_all equals the scan per entry, on lists and entries with
        /// repeated keys, elements without the key and keys that are not strings.
        #[test]
        fn replace_all_equals_the_scan_per_entry(
            list in proptest::collection::vec((0u8..4, 0u8..5), 0..10),
            entries in proptest::collection::vec((0u8..4, 0u8..5), 0..10),
            replace_again: bool,
        ) {
            let value = |(k, v): (u8, u8)| match k {
                3 => json!({"v": v}),
                2 if v == 4 => json!({"d": 2, "v": v}),
                _ => json!({"d": format!("/{k}"), "v": v}),
            };
            let list: Vec<Value> = list.into_iter().map(value).collect();
            let entries: Vec<Value> = entries.into_iter().map(value).collect();
            let (mut fast, mut direct) = (list.clone(), list);
            replace_all_values(&mut fast, entries.clone(), replace_again);
            replace_all_direct(&mut direct, "d", entries, replace_again);
            proptest::prop_assert_eq!(fast, direct);
        }
    }

    #[test]
    fn replace_all_removes_the_first_of_a_key_then_replaces_another_or_appends() {
        let mut list =
            vec![json!({"d": "/a", "v": 1}), json!({"d": "/b", "v": 1}), json!({"x": 0}), json!({"d": "/a", "v": 9})];
        replace_all_values(
            &mut list,
            vec![json!({"d": "/c", "v": 2}), json!({"d": "/a", "v": 2}), json!({"y": 1})],
            true,
        );
        assert_eq!(
            list,
            vec![
                json!({"d": "/b", "v": 1}),
                json!({"x": 0}),
                json!({"d": "/a", "v": 2}),
                json!({"d": "/c", "v": 2}),
                json!({"y": 1})
            ]
        );
        // Given twice: the later one, once.
        let mut list = vec![];
        replace_all_values(&mut list, vec![json!({"d": "/a", "v": 1}), json!({"d": "/a", "v": 2})], true);
        assert_eq!(list, vec![json!({"d": "/a", "v": 2})]);
        let mut list = vec![json!({"d": "/a", "v": 1}), json!({"d": "/b", "v": 1})];
        replace_all_values(&mut list, vec![json!({"d": "/a", "v": 2})], false);
        assert_eq!(list, vec![json!({"d": "/b", "v": 1}), json!({"d": "/a", "v": 2})]);
    }

    /// Go's `filepath.Clean` stated directly: the components kept on a stack.
    fn mount_depth_direct(path: &str) -> usize {
        let abs = path.starts_with('/');
        let mut parts: Vec<&str> = Vec::new();
        for p in path.split('/') {
            match p {
                "" | "." => {}
                ".." if parts.last().is_some_and(|l| *l != "..") => {
                    parts.pop();
                }
                ".." if !abs => parts.push(".."),
                ".." => {}
                _ => parts.push(p),
            }
        }
        match (abs, parts.len()) {
            (true, 0) => 1,
            (true, n) => n,
            (false, 0) => 0,
            (false, n) => n - 1,
        }
    }

    proptest::proptest! {
        /// The counting mount_depth equals the stack of components, on paths made of `a`, `.`
        /// and `/` (every run of dots and separators, absolute and relative).
        #[test]
        fn mount_depth_equals_the_stack_of_components(path in "[a./]{0,16}") {
            proptest::prop_assert_eq!(mount_depth(&path), mount_depth_direct(&path), "{}", path);
        }
    }

    #[test]
    fn mount_depth_counts_separators_of_the_cleaned_path() {
        for (p, d) in [
            ("/", 1),
            ("/a", 1),
            ("/a/b", 2),
            ("/a//b/", 2),
            ("/a/./b/../c", 2),
            ("/..", 1),
            ("a/b", 1),
            ("", 0),
            (".", 0),
            ("../a", 1),
            ("a/../..", 0),
            ("../../a/b/..", 2),
        ] {
            assert_eq!(mount_depth(p), d, "{p}");
        }
    }

    /// Issue 25 item 4: a spec listing /a/b/c before /a must not leave /a/b/c hidden under /a:
    /// mounts are sorted by depth, stably, the engine's ones included (the reference library's
    /// order), and applying twice still equals once.
    #[test]
    fn item4_mounts_are_ordered_by_depth() {
        let m = |c: &str| Mount { host_path: format!("/host{c}"), container_path: c.into(), ..Default::default() };
        let e = ContainerEdits { mounts: vec![m("/a/b/c"), m("/a"), m("/etc/hosts"), m("/a/b")], ..Default::default() };
        let mut s = json!({"mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "/etc/hosts", "type": "bind", "source": "/engine/hosts"}
        ]});
        apply(&mut s, &e).unwrap();
        let dests: Vec<&str> =
            s["mounts"].as_array().unwrap().iter().map(|m| m["destination"].as_str().unwrap()).collect();
        assert_eq!(dests, ["/proc", "/dev", "/a", "/dev/pts", "/etc/hosts", "/a/b", "/a/b/c"]);
        assert_eq!(s["mounts"][4]["source"], "/host/etc/hosts", "the edit replaced the engine's mount");
        let mut twice = s.clone();
        apply(&mut twice, &e).unwrap();
        assert_eq!(twice, s);
    }

    /// Issue 25 items 2 and 9: a node whose edit names no uid/gid is given to the container's
    /// user (not root: runc would make it root:root, which a non-root user cannot open at 0660);
    /// a uid/gid of 0 in process.user leaves it to runc; additional GID 0 is skipped.
    #[test]
    fn item2_nodes_go_to_the_container_user_and_gid_0_is_not_added() {
        let e = ContainerEdits {
            device_nodes: vec![
                DeviceNode {
                    path: "/dev/dri/renderD128".into(),
                    node_type: Some("c".into()),
                    major: Some(226),
                    minor: Some(128),
                    file_mode: Some(0o660),
                    gid: Some(109),
                    ..Default::default()
                },
                DeviceNode {
                    path: "/dev/nvidia0".into(),
                    node_type: Some("c".into()),
                    major: Some(195),
                    minor: Some(0),
                    uid: Some(7),
                    ..Default::default()
                },
            ],
            additional_gids: vec![0, 109],
            ..Default::default()
        };
        let mut s = json!({"process": {"user": {"uid": 1000, "gid": 1000}}});
        apply(&mut s, &e).unwrap();
        assert_eq!(
            s["linux"]["devices"],
            json!([
                {"path": "/dev/dri/renderD128", "type": "c", "major": 226, "minor": 128, "fileMode": 0o660, "uid": 1000, "gid": 109},
                {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "uid": 7, "gid": 1000}
            ])
        );
        assert_eq!(s["process"]["user"]["additionalGids"], json!([109]));
        let mut root = json!({"process": {"user": {"uid": 0, "gid": 0}}});
        apply(&mut root, &ContainerEdits { additional_gids: vec![0], ..e.clone() }).unwrap();
        assert_eq!(
            root["linux"]["devices"][1],
            json!({"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "uid": 7})
        );
        let mut only_zero = json!({});
        apply(&mut only_zero, &ContainerEdits { additional_gids: vec![0], ..Default::default() }).unwrap();
        assert_eq!(only_zero, json!({}));
    }

    #[test]
    fn applies_every_kind_of_edit() {
        let mut s = base();
        apply(&mut s, &edits()).unwrap();
        assert_eq!(
            s["process"]["env"],
            json!(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=void", "ACTK=1"]),
            "the last NVIDIA_VISIBLE_DEVICES (the one that counts) replaced in place"
        );
        assert_eq!(
            s["linux"]["devices"],
            json!([
                {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1, "fileMode": 438},
                {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, "uid": 0, "gid": 0}
            ])
        );
        assert_eq!(
            s["linux"]["resources"]["devices"],
            json!([
                {"allow": false, "access": "rwm"},
                {"allow": true, "type": "c", "major": 195, "minor": 1, "access": "rwm"},
                {"allow": true, "type": "c", "major": 195, "minor": 255, "access": "rwm"}
            ])
        );
        assert_eq!(s["mounts"][1]["options"], json!(["ro", "nosuid", "nodev", "bind"]));
        assert_eq!(
            s["mounts"][1].get("type"),
            None,
            "no type where the spec gives none, as the reference library writes it"
        );
        assert_eq!(s["hooks"]["createContainer"][0]["env"], json!([HOOK_DEFAULT_PATH]));
        assert_eq!(s["process"]["user"]["additionalGids"], json!([0, 44]));
        assert_eq!(s["zzUnknown"], json!({"keep": [1, 2]}));
        let keys: Vec<_> = s.as_object().unwrap().keys().cloned().collect();
        assert_eq!(
            keys,
            vec!["ociVersion", "zzUnknown", "process", "mounts", "linux", "hooks"],
            "field order kept, new ones last"
        );
    }

    #[test]
    fn applying_twice_equals_once() {
        let mut once = base();
        apply(&mut once, &edits()).unwrap();
        let mut twice = once.clone();
        apply(&mut twice, &edits()).unwrap();
        assert_eq!(serde_json::to_string(&once).unwrap(), serde_json::to_string(&twice).unwrap());
    }

    #[test]
    fn creates_missing_sections() {
        let mut s = json!({"ociVersion": "1.0.2"});
        apply(&mut s, &edits()).unwrap();
        assert_eq!(s["linux"]["devices"].as_array().unwrap().len(), 2);
        assert_eq!(s["process"]["user"]["additionalGids"], json!([44]), "additional GID 0 is skipped (SPEC.md)");
    }

    /// Found by the CDI reference oracle (hand/fifo-node.yaml, generated specs): a FIFO or an
    /// unbuffered (`u`) node is created in the container but gets no device-cgroup rule, which
    /// runc 1.1 would refuse ("invalid cgroup device type") and the reference library does not
    /// write.
    #[test]
    fn fifo_and_unbuffered_nodes_get_no_cgroup_rule() {
        let mut s = base();
        let e = ContainerEdits {
            device_nodes: vec![
                DeviceNode { path: "/dev/ctl-fifo".into(), node_type: Some("p".into()), ..Default::default() },
                DeviceNode {
                    path: "/dev/raw".into(),
                    node_type: Some("u".into()),
                    major: Some(10),
                    minor: Some(3),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        apply(&mut s, &e).unwrap();
        assert_eq!(s["linux"]["devices"][1], json!({"path": "/dev/ctl-fifo", "type": "p"}));
        assert_eq!(s["linux"]["devices"][2], json!({"path": "/dev/raw", "type": "u", "major": 10, "minor": 3}));
        assert_eq!(s["linux"]["resources"]["devices"], json!([{"allow": false, "access": "rwm"}]));
    }

    #[test]
    fn wrong_types_are_named() {
        let mut s = json!({"linux": {"devices": {"oops": 1}}});
        let e = apply(&mut s, &edits()).unwrap_err().to_string();
        assert_eq!(e, "config.json: `linux.devices` is not an array");
        let mut s = json!({});
        let mut bad = ContainerEdits::default();
        bad.hooks.push(Hook { hook_name: "prestrat".into(), path: "/x".into(), ..Default::default() });
        assert!(apply(&mut s, &bad).unwrap_err().to_string().contains("unknown stage \"prestrat\""));
        let mut nonum = ContainerEdits::default();
        nonum.device_nodes.push(DeviceNode { path: "/dev/x".into(), ..Default::default() });
        assert!(matches!(apply(&mut s, &nonum), Err(EditError::MissingNumbers { .. })));
    }

    /// Field case F17 (in core): CDI 1.1 netDevices and intelRdt edits land in the OCI spec as
    /// `linux.netDevices` and `linux.intelRdt`; the engine's own fields survive; twice == once.
    #[test]
    fn f17_net_devices_and_intel_rdt_are_applied_to_the_oci_spec() {
        let e = ContainerEdits {
            net_devices: vec![json!({"hostInterfaceName": "eth1", "name": "net1"})],
            intel_rdt: Some(json!({"closID": "gpu-jobs", "schemata": ["L3:0=ff"]})),
            ..Default::default()
        };
        let mut s = json!({"linux": {"intelRdt": {"l3CacheSchema": "L3:0=f", "closID": "old"},
                                     "netDevices": {"eth0": {"name": "eth0"}}}});
        apply(&mut s, &e).unwrap();
        assert_eq!(s["linux"]["netDevices"], json!({"eth0": {"name": "eth0"}, "eth1": {"name": "net1"}}));
        assert_eq!(
            s["linux"]["intelRdt"],
            json!({"l3CacheSchema": "L3:0=f", "closID": "gpu-jobs", "schemata": ["L3:0=ff"]})
        );
        let mut twice = s.clone();
        apply(&mut twice, &e).unwrap();
        assert_eq!(twice, s);
        let bad = ContainerEdits { net_devices: vec![json!({"name": "net1"})], ..Default::default() };
        assert_eq!(
            apply(&mut json!({}), &bad).unwrap_err().to_string(),
            "CDI edit `netDevices[0]`: {\"name\":\"net1\"} needs a non-empty hostInterfaceName and name"
        );
    }

    /// F17: what the low-level runtime would ignore is named, judged by its features document.
    #[test]
    fn f17_edits_the_runtime_would_ignore_are_named() {
        let e = ContainerEdits {
            net_devices: vec![json!({"hostInterfaceName": "eth1", "name": "net1"})],
            intel_rdt: Some(json!({"closID": "g", "enableMonitoring": true})),
            ..Default::default()
        };
        // runc 1.1.5's features: neither netDevices nor intelRdt.
        let old = json!({"ociVersionMax": "1.0.2-dev", "linux": {"namespaces": ["user"]}});
        let refused = unsupported_by_runtime(&e, "runc", Some(&old), true);
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert!(refused[0].starts_with("CDI edit netDevices (eth1) becomes OCI linux.netDevices"), "{refused:?}");
        assert!(refused[1].contains("intelRdt.enableMonitoring"), "{refused:?}");
        assert!(unsupported_by_runtime(&e, "crun", None, true)[0].contains("crun has no `features` command"));
        let new =
            json!({"linux": {"netDevices": {"enabled": true}, "intelRdt": {"enabled": true, "monitoring": true}}});
        assert!(unsupported_by_runtime(&e, "runc", Some(&new), true).is_empty());
        // closID alone is runtime-spec 1.0: passed on where the host has RDT; without resctrl
        // runc 1.1 would drop it quietly, so it is refused naming the field.
        let plain = ContainerEdits { intel_rdt: Some(json!({"closID": "g"})), ..Default::default() };
        assert!(unsupported_by_runtime(&plain, "runc", Some(&old), true).is_empty());
        let no_rdt = unsupported_by_runtime(&plain, "runc", Some(&old), false);
        assert!(no_rdt.len() == 1 && no_rdt[0].contains("no resctrl filesystem"), "{no_rdt:?}");
    }

    /// Issue 13 item 1: in a user namespace a node that exists only under a driver root is bind-
    /// mounted from there (runc would look for it at its container path on the host and fail);
    /// a node at its own path stays a linux.devices entry; both get their cgroup rule.
    #[test]
    fn item1_userns_nodes_under_a_driver_root_become_bind_mounts() {
        let node = |path: &str, host: Option<&str>, minor| DeviceNode {
            path: path.into(),
            host_path: host.map(String::from),
            node_type: Some("c".into()),
            major: Some(195),
            minor: Some(minor),
            ..Default::default()
        };
        let e = ContainerEdits {
            device_nodes: vec![
                node("/dev/nvidiactl", Some("/run/nvidia/driver/dev/nvidiactl"), 255),
                node("/dev/nvidia0", None, 0),
            ],
            ..Default::default()
        };
        let mut s = json!({"linux": {"namespaces": [{"type": "mount"}, {"type": "user"}]}, "mounts": []});
        apply(&mut s, &e).unwrap();
        assert_eq!(s["linux"]["devices"], json!([{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]));
        assert_eq!(
            s["mounts"],
            json!([{"destination": "/dev/nvidiactl", "type": "bind", "source": "/run/nvidia/driver/dev/nvidiactl", "options": ["bind", "nosuid", "noexec"]}])
        );
        assert_eq!(s["linux"]["resources"]["devices"].as_array().unwrap().len(), 2);
        let mut twice = s.clone();
        apply(&mut twice, &e).unwrap();
        assert_eq!(twice, s);
        // Without a user namespace runc makes the node from its numbers: linux.devices as before.
        let mut plain = json!({"linux": {"namespaces": [{"type": "mount"}]}});
        apply(&mut plain, &e).unwrap();
        assert_eq!(plain["linux"]["devices"].as_array().unwrap().len(), 2);
        assert!(plain.get("mounts").is_none());
    }

    #[test]
    fn removes_dockers_gpus_hook_only() {
        let mut s = json!({"hooks": {"prestart": [
            {"path": "/usr/local/bin/nvidia-container-runtime-hook", "args": ["nvidia-container-runtime-hook", "prestart"]},
            {"path": "/proc/31191/exe", "args": ["libnetwork-setkey", "-exec-root=/var/run/docker"]}
        ]}});
        assert_eq!(remove_legacy_nvidia_hook(&mut s), 1);
        assert_eq!(s["hooks"]["prestart"][0]["args"][0], "libnetwork-setkey");
        assert_eq!(remove_legacy_nvidia_hook(&mut s), 0);
    }

    #[test]
    fn marks_applied() {
        let mut s = json!({"annotations": {"a": "b"}});
        assert!(!is_applied(&s));
        mark_applied(&mut s, "nvidia.com/gpu=1").unwrap();
        assert!(is_applied(&s));
        assert_eq!(s["annotations"]["a"], "b");
    }

    /// The exact text of every kind of added entry, key order included (serde_json's `Value`
    /// equality ignores the order of an object's keys): a device node with every field and one
    /// taking the container user as owner, a FIFO, a `u` node, mounts with no type, an empty
    /// type, `bind` and `tmpfs`, options with and without `bind`/`rbind`, and (in a user
    /// namespace) a node bind-mounted from its host path. The text is what 4fdd3b4's
    /// Value-building edits wrote.
    #[test]
    fn added_entries_are_written_exactly_as_before() {
        const WANT_PLAIN: &str = r#"{"process":{"user":{"uid":1000,"gid":1001}},"mounts":[{"destination":"/proc","type":"proc","source":"proc"},{"destination":"/run/d","type":"tmpfs","source":"/host/run/d","options":["nosuid"]},{"destination":"/usr/lib/a.so","source":"/host/usr/lib/a.so","options":["ro","nosuid","bind"]},{"destination":"/usr/lib/b.so","source":"/host/usr/lib/b.so","options":["ro","bind"]},{"destination":"/usr/lib/c.so","type":"bind","source":"/host/usr/lib/c.so","options":["rbind","ro"]}],"linux":{"devices":[{"path":"/dev/full","type":"c","major":195,"minor":1,"fileMode":438,"uid":7,"gid":8},{"path":"/dev/owned","type":"c","major":195,"minor":2,"uid":1000,"gid":1001},{"path":"/dev/fifo","type":"p","uid":1000,"gid":1001},{"path":"/dev/raw","type":"u","major":10,"minor":3,"uid":1000,"gid":1001},{"path":"/dev/moved","type":"c","major":195,"minor":255,"uid":1000,"gid":1001}],"resources":{"devices":[{"allow":true,"type":"c","major":195,"minor":1,"access":"rwm"},{"allow":true,"type":"c","major":195,"minor":2,"access":"rwm"},{"allow":true,"type":"c","major":195,"minor":255,"access":"rwm"}]}}}"#;
        const WANT_USERNS: &str = r#"{"process":{"user":{"uid":1000,"gid":1001}},"mounts":[{"destination":"/proc","type":"proc","source":"proc"},{"destination":"/dev/moved","type":"bind","source":"/drv/dev/moved","options":["bind","nosuid","noexec"]},{"destination":"/run/d","type":"tmpfs","source":"/host/run/d","options":["nosuid"]},{"destination":"/usr/lib/a.so","source":"/host/usr/lib/a.so","options":["ro","nosuid","bind"]},{"destination":"/usr/lib/b.so","source":"/host/usr/lib/b.so","options":["ro","bind"]},{"destination":"/usr/lib/c.so","type":"bind","source":"/host/usr/lib/c.so","options":["rbind","ro"]}],"linux":{"devices":[{"path":"/dev/full","type":"c","major":195,"minor":1,"fileMode":438,"uid":7,"gid":8},{"path":"/dev/owned","type":"c","major":195,"minor":2,"uid":1000,"gid":1001},{"path":"/dev/fifo","type":"p","uid":1000,"gid":1001},{"path":"/dev/raw","type":"u","major":10,"minor":3,"uid":1000,"gid":1001}],"resources":{"devices":[{"allow":true,"type":"c","major":195,"minor":1,"access":"rwm"},{"allow":true,"type":"c","major":195,"minor":2,"access":"rwm"},{"allow":true,"type":"c","major":195,"minor":255,"access":"rwm"}]}}}"#;
        let node = |path: &str, ty: Option<&str>, numbers: Option<(i64, i64)>| DeviceNode {
            path: path.into(),
            node_type: ty.map(String::from),
            major: numbers.map(|n| n.0),
            minor: numbers.map(|n| n.1),
            ..Default::default()
        };
        let mount = |dest: &str, ty: Option<&str>, options: &[&str]| Mount {
            host_path: format!("/host{dest}"),
            container_path: dest.into(),
            mount_type: ty.map(String::from),
            options: options.iter().map(|o| o.to_string()).collect(),
        };
        let e = ContainerEdits {
            device_nodes: vec![
                DeviceNode {
                    file_mode: Some(0o666),
                    uid: Some(7),
                    gid: Some(8),
                    ..node("/dev/full", Some("c"), Some((195, 1)))
                },
                node("/dev/owned", None, Some((195, 2))),
                node("/dev/fifo", Some("p"), None),
                node("/dev/raw", Some("u"), Some((10, 3))),
                DeviceNode {
                    host_path: Some("/drv/dev/moved".into()),
                    ..node("/dev/moved", Some("c"), Some((195, 255)))
                },
            ],
            mounts: vec![
                mount("/usr/lib/a.so", None, &["ro", "nosuid"]),
                mount("/usr/lib/b.so", Some(""), &["ro"]),
                mount("/usr/lib/c.so", Some("bind"), &["rbind", "ro"]),
                mount("/run/d", Some("tmpfs"), &["nosuid"]),
            ],
            ..Default::default()
        };
        let doc = || json!({"process": {"user": {"uid": 1000, "gid": 1001}}, "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}], "linux": {}});
        let mut s = doc();
        apply(&mut s, &e).unwrap();
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(text, WANT_PLAIN);
        // actk-runtime's way, deferred, gives the same bytes.
        let mut d = doc();
        let deferred = apply_deferred(&mut d, &e, false).unwrap();
        assert_eq!(serde_json::to_string(&deferred.with(&d)).unwrap(), WANT_PLAIN);
        let mut u = doc();
        apply_in(&mut u, &e, true).unwrap();
        let text = serde_json::to_string(&u).unwrap();
        assert_eq!(text, WANT_USERNS);
        let mut d = doc();
        let deferred = apply_deferred(&mut d, &e, true).unwrap();
        assert_eq!(serde_json::to_string(&deferred.with(&d)).unwrap(), WANT_USERNS);
    }
}
