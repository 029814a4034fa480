//! What is held by whom: one ledger of the units the kubelet has handed out, for every resource
//! the plugin serves, so that hardware covered by two resources is never handed out twice.
//!
//! Several resources can cover the same hardware: `aws.amazon.com/neuron`,
//! `aws.amazon.com/neurondevice` (whole devices) and `aws.amazon.com/neuroncore` (their cores);
//! `nvidia.com/gpu` and `nvidia.com/mig-*` or AMD partitions and whole GPUs once a GPU's mode
//! changes while a pod holds it; time-sliced replicas of a device under another resource. The
//! kubelet counts each resource on its own, so without coordination a Neuron device would go to
//! a `neuron` pod, a `neurondevice` pod and a `neuroncore` pod at once (issue 28).
//!
//! Each unit has a [`Footprint`] (the physical device, and the part of it: a core, a MIG
//! device, a partition). A unit of one resource is *withdrawn* while a unit of another resource
//! whose footprint overlaps it is held: ListAndWatch reports it Unhealthy (how a device plugin
//! tells the kubelet not to hand a device out; the node's allocatable drops by it), the
//! preferred allocation avoids it, and an Allocate that still names it (the kubelet had not seen
//! the update yet) is refused naming the holder. Within one resource the kubelet already hands
//! each ID out once and replicas of one device are meant to share it, so a unit is withdrawn
//! through its own resource only when a held ID of that resource meant other hardware when it
//! was handed out (a GPU held whole as `amd.com/gpu` 0 before its partition mode changed covers
//! the partitions now listed as `amd.com/gpu` 1-7).
//!
//! What an ID meant is learned when the plugin serves it and kept while the ID is held, so a
//! mode change under a running pod keeps its hardware withdrawn; a plugin restarted after such
//! a change knows only the new meaning (nothing is kept on disk).
//!
//! Where "held" comes from: every Allocate answer is recorded at once; the kubelet's
//! PodResources API (`List`: the devices assigned to the containers of the node's active pods)
//! is read every [`RECONCILE`], and it is the truth: a unit it does not list is free again once
//! its Allocate is older than [`GRACE`] (the pod was deleted, ended, or failed admission), and a
//! unit it lists is held even when this process never saw the Allocate (the plugin restarted).
//! While the PodResources socket has never answered, recorded allocations are kept (freeing a
//! unit the kubelet still counts as assigned would hand it out twice); a warning names the
//! socket.

use crate::api::podresources::ListPodResourcesRequest;
use crate::api::podresources::pod_resources_lister_client::PodResourcesListerClient;
use crate::resources::{Resource, Unit};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often the kubelet's PodResources are read.
pub const RECONCILE: Duration = Duration::from_secs(2);

/// How long a recorded Allocate counts as held without PodResources listing it: the kubelet
/// records the assignment right after Allocate returns, so a List a few seconds later has it
/// unless the pod went (or failed admission on another resource).
pub const GRACE: Duration = Duration::from_secs(5);

/// Time limit of one PodResources call.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// The part of a device a unit gives.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// A core (global core number, as `NEURON_RT_VISIBLE_CORES` counts).
    Core(u32),
    /// A MIG device, by its UUID (or `GPU:MIG` when it has none).
    Mig(String),
    /// A partition of an AMD GPU: its compute partition mode (`cpx`) and number.
    Partition {
        /// `dpx`, `qpx`, `cpx`, ...
        mode: String,
        /// Partition number within the GPU.
        number: u32,
    },
}

/// The hardware a unit gives a container: a physical device (its kind and identity) and, for a
/// core, MIG device or partition, which part of it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Footprint {
    /// CDI kind of the device (`aws.amazon.com/neuron`).
    pub kind: String,
    /// The physical device: its PCI bus id, else its UUID or serial, else `index N` (stable
    /// across a MIG or partition mode change, which renumbers devices but keeps the PCI function).
    pub physical: String,
    /// `None`: the whole device.
    pub part: Option<Part>,
}

impl Footprint {
    /// Whether the two give some of the same hardware: the same device, and one of them whole
    /// or both the same part. Partitions of different modes (a mode change while one was held)
    /// may cover the same compute dies and count as overlapping.
    pub fn overlaps(&self, other: &Footprint) -> bool {
        if self.kind != other.kind || self.physical != other.physical {
            return false;
        }
        match (&self.part, &other.part) {
            (None, _) | (_, None) => true,
            (Some(Part::Partition { mode: a, number: x }), Some(Part::Partition { mode: b, number: y })) => {
                a != b || x == y
            }
            (Some(a), Some(b)) => a == b,
        }
    }
}

impl std::fmt::Display for Footprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind, self.physical)?;
        match &self.part {
            None => Ok(()),
            Some(Part::Core(c)) => write!(f, " core {c}"),
            Some(Part::Mig(m)) => write!(f, " MIG device {m}"),
            Some(Part::Partition { mode, number }) => write!(f, " {mode} partition {number}"),
        }
    }
}

/// The footprint of `unit` of `res` (a replica's is its device's).
pub fn footprint(res: &Resource, unit: &Unit) -> Footprint {
    let dev = res.vendor.devices.iter().find(|d| d.index == unit.device);
    let physical = dev
        .and_then(|d| d.pci_bus_id.clone().or_else(|| d.uuid.clone()).filter(|s| !s.is_empty()))
        .unwrap_or_else(|| format!("index {}", unit.device));
    let part = if let Some(c) = unit.core {
        Some(Part::Core(c))
    } else if let Some(m) = unit.mig {
        let uuid = dev
            .and_then(|d| d.mig.as_ref())
            .and_then(|x| x.devices.iter().find(|x| x.index == m))
            .map(|x| x.uuid.clone())
            .filter(|u| !u.is_empty());
        Some(Part::Mig(uuid.unwrap_or_else(|| format!("{}:{m}", unit.device))))
    } else {
        // An AMD GPU split into partitions (not SPX, which is the whole GPU).
        dev.and_then(|d| {
            let mode = d.attributes.get("compute_partition")?;
            let number = d.attributes.get("partition")?.parse().ok()?;
            (!mode.eq_ignore_ascii_case("spx")).then(|| Part::Partition { mode: mode.to_ascii_lowercase(), number })
        })
    };
    Footprint { kind: res.vendor.kind.clone(), physical, part }
}

/// A kubelet assignment: (resource name, device ID).
pub type Key = (String, String);

/// Whether the held assignment `held` (whose hardware is `held_fp`) keeps unit `id` of
/// resource `resource` (hardware `fp`) from being handed out: the hardware overlaps, unless it is
/// the same ID, or another replica of the same hardware of the same resource.
fn blocks(held: &Key, held_fp: &Footprint, resource: &str, id: &str, fp: &Footprint) -> bool {
    if held.0 == resource && (held.1 == id || held_fp == fp) {
        return false;
    }
    held_fp.overlaps(fp)
}

/// Why an Allocate is refused by the ledger.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{resource} device {id} ({footprint}) is in use through {holder} (device {holder_id}): the two resources cover the \
     same hardware and a unit is handed out through one of them at a time; the kubelet had not yet seen it withdrawn \
     from {resource}, so create the pod again (it then gets another device, or waits until one is free)"
)]
pub struct Conflict {
    /// The resource of the refused Allocate.
    pub resource: String,
    /// Its device ID that is taken.
    pub id: String,
    /// What that ID gives.
    pub footprint: Footprint,
    /// The resource through which the overlapping unit is held.
    pub holder: String,
    /// The held device ID.
    pub holder_id: String,
}

#[derive(Debug, Default)]
struct State {
    /// Footprint of every (resource, ID) ever served by this process: an assignment the
    /// kubelet lists under a resource served before a mode change still maps to hardware.
    catalogue: BTreeMap<Key, Footprint>,
    /// Allocate answers, when they were given.
    recent: BTreeMap<Key, Instant>,
    /// The assignments of the last PodResources List.
    listed: BTreeSet<Key>,
    /// Whether PodResources has answered at least once.
    listed_ok: bool,
}

impl State {
    fn held(&self, now: Instant) -> BTreeSet<&Key> {
        let mut out: BTreeSet<&Key> = self.listed.iter().collect();
        for (k, at) in &self.recent {
            if !self.listed_ok || now.duration_since(*at) < GRACE {
                out.insert(k);
            }
        }
        out
    }
}

/// The ledger shared by every resource's service (see the module docs).
#[derive(Debug)]
pub struct Ledger {
    state: Mutex<State>,
    generation: watch::Sender<u64>,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger { state: Mutex::new(State::default()), generation: watch::channel(0).0 }
    }
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the sets are still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// A receiver that sees a new value whenever the held set may have changed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Learns the footprint of every unit of `resources` (called whenever the plugin serves a
    /// new set of devices). A held ID keeps the footprint it had when it was handed out.
    pub fn learn(&self, resources: &[Resource]) {
        let mut s = self.lock();
        let held: BTreeSet<Key> = s.held(Instant::now()).into_iter().cloned().collect();
        for r in resources {
            for u in &r.units {
                let key = (r.name.clone(), u.id.clone());
                if !(held.contains(&key) && s.catalogue.contains_key(&key)) {
                    s.catalogue.insert(key, footprint(r, u));
                }
            }
        }
        drop(s);
        self.bump();
    }

    /// The IDs of `res` withdrawn now: units whose hardware overlaps a unit held through
    /// another resource (or through this one with another meaning, see the module docs).
    pub fn withdrawn(&self, res: &Resource) -> BTreeSet<String> {
        let s = self.lock();
        let held: Vec<(&Key, &Footprint)> =
            s.held(Instant::now()).into_iter().filter_map(|k| Some((k, s.catalogue.get(k)?))).collect();
        if held.is_empty() {
            return BTreeSet::new();
        }
        res.units
            .iter()
            .filter(|u| {
                let fp = footprint(res, u);
                held.iter().any(|(k, h)| blocks(k, h, &res.name, &u.id, &fp))
            })
            .map(|u| u.id.clone())
            .collect()
    }

    /// The IDs of `res` itself that are held now.
    pub fn held_ids(&self, res: &Resource) -> BTreeSet<String> {
        let s = self.lock();
        s.held(Instant::now()).into_iter().filter(|k| k.0 == res.name).map(|k| k.1.clone()).collect()
    }

    /// Records an Allocate of `ids` of `res`, unless one of them overlaps a unit held through
    /// another resource (the check and the record are one step, so two Allocates of two
    /// resources cannot both take one device).
    pub fn claim(&self, res: &Resource, ids: &[String]) -> Result<(), Box<Conflict>> {
        let mut s = self.lock();
        let now = Instant::now();
        let held: Vec<(Key, Footprint)> =
            s.held(now).into_iter().filter_map(|k| Some((k.clone(), s.catalogue.get(k)?.clone()))).collect();
        for id in ids {
            let Some(u) = res.unit(id) else { continue };
            let fp = footprint(res, u);
            if let Some(((holder, holder_id), _)) = held.iter().find(|(k, h)| blocks(k, h, &res.name, id, &fp)) {
                return Err(Box::new(Conflict {
                    resource: res.name.clone(),
                    id: id.clone(),
                    footprint: fp,
                    holder: holder.clone(),
                    holder_id: holder_id.clone(),
                }));
            }
        }
        for id in ids {
            if let Some(u) = res.unit(id) {
                s.catalogue.entry((res.name.clone(), id.clone())).or_insert_with(|| footprint(res, u));
            }
            s.recent.insert((res.name.clone(), id.clone()), now);
        }
        drop(s);
        self.bump();
        Ok(())
    }

    /// Takes the assignments of a PodResources List as the truth (see the module docs).
    pub fn reconcile(&self, listed: BTreeSet<Key>) {
        let mut s = self.lock();
        let now = Instant::now();
        let before: BTreeSet<Key> = s.held(now).into_iter().cloned().collect();
        s.listed = listed;
        s.listed_ok = true;
        s.recent.retain(|_, at| now.duration_since(*at) < GRACE);
        let after: BTreeSet<Key> = s.held(now).into_iter().cloned().collect();
        drop(s);
        if before != after {
            self.bump();
        }
    }

    /// Ages the recorded allocations (an Allocate older than [`GRACE`] that PodResources does
    /// not list is free again): wakes the streams when that changes the held set.
    fn age(&self) {
        let mut s = self.lock();
        if !s.listed_ok {
            return;
        }
        let now = Instant::now();
        let n = s.recent.len();
        let listed = s.listed.clone();
        s.recent.retain(|k, at| now.duration_since(*at) < GRACE || listed.contains(k));
        let changed = s.recent.len() != n;
        drop(s);
        if changed {
            self.bump();
        }
    }
}

/// The device assignments the kubelet at `socket` lists, as (resource, ID) pairs.
///
/// Errors: the socket does not answer, or the call fails or times out (the message says which).
pub async fn list_assignments(socket: &Path) -> Result<BTreeSet<Key>, String> {
    let channel = match tokio::time::timeout(CALL_TIMEOUT, crate::uds::connect(socket)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(format!("cannot connect: {e}")),
        Err(_) => return Err("connecting timed out".into()),
    };
    let resp = match tokio::time::timeout(
        CALL_TIMEOUT,
        PodResourcesListerClient::new(channel).list(ListPodResourcesRequest {}),
    )
    .await
    {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(status)) => return Err(format!("List failed: {}", status.message())),
        Err(_) => return Err("List timed out".into()),
    };
    let mut out = BTreeSet::new();
    for pod in resp.pod_resources {
        for c in pod.containers {
            for d in c.devices {
                for id in d.device_ids {
                    out.insert((d.resource_name.clone(), id));
                }
            }
        }
    }
    Ok(out)
}

/// Reads the kubelet's PodResources at `socket` every [`RECONCILE`] into `ledger`, forever.
/// Logs when the socket stops or starts answering (once per change).
pub async fn reconcile_loop(ledger: std::sync::Arc<Ledger>, socket: PathBuf) {
    let mut failing: Option<String> = None;
    loop {
        match list_assignments(&socket).await {
            Ok(listed) => {
                if failing.take().is_some() {
                    tracing::info!("the kubelet's PodResources at {} answer again", socket.display());
                }
                ledger.reconcile(listed);
            }
            Err(e) => {
                if failing.as_deref() != Some(e.as_str()) {
                    tracing::warn!(
                        "cannot read the kubelet's PodResources at {} ({e}): units held through one resource stay \
                         withdrawn from the resources over the same hardware until it answers (--pod-resources-socket; \
                         the chart mounts the kubelet's pod-resources directory)",
                        socket.display()
                    );
                    failing = Some(e);
                }
                ledger.age();
            }
        }
        tokio::time::sleep(RECONCILE).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{BuildOptions, build};
    use actk_core::inventory::{Device, Inventory, VendorInventory};

    /// Three Neuron devices with two cores each: neuron, neuroncore, neurondevice.
    fn neuron() -> Vec<Resource> {
        let vendor = VendorInventory {
            profile: "neuron".into(),
            kind: "aws.amazon.com/neuron".into(),
            devices: (0..3)
                .map(|i| Device { index: i, uuid: Some(format!("{i:016x}")), cores: Some(2), ..Default::default() })
                .collect(),
            ..Default::default()
        };
        let inv = Inventory { vendors: vec![vendor], ..Default::default() };
        build(&inv, &actk_core::profile::builtin(), &BuildOptions::default())
    }

    fn ids(s: &BTreeSet<String>) -> Vec<&str> {
        s.iter().map(String::as_str).collect()
    }

    #[test]
    fn footprints_of_cores_devices_and_partitions_overlap_as_the_hardware_does() {
        let fp = |part: Option<Part>| Footprint { kind: "k/x".into(), physical: "0000:05:00.0".into(), part };
        let cpx = |n| Some(Part::Partition { mode: "cpx".into(), number: n });
        assert!(fp(None).overlaps(&fp(Some(Part::Core(1)))));
        assert!(fp(Some(Part::Core(1))).overlaps(&fp(Some(Part::Core(1)))));
        assert!(!fp(Some(Part::Core(0))).overlaps(&fp(Some(Part::Core(1)))));
        assert!(!fp(cpx(0)).overlaps(&fp(cpx(1))));
        assert!(fp(cpx(0)).overlaps(&fp(Some(Part::Partition { mode: "dpx".into(), number: 1 }))));
        assert!(fp(None).overlaps(&fp(cpx(3))), "SPX (the whole GPU) covers every CPX partition");
        let other = Footprint { physical: "0000:27:00.0".into(), ..fp(None) };
        assert!(!fp(None).overlaps(&other));
        let r = neuron();
        assert_eq!(footprint(&r[1], &r[1].units[3]).to_string(), "aws.amazon.com/neuron 0000000000000001 core 3");
        assert_eq!(footprint(&r[0], &r[0].units[1]), footprint(&r[2], &r[2].units[1]));
    }

    /// A neuroncore pod on device 0 withdraws device 0 from neuron and neurondevice, and a
    /// neuron pod on device 1 withdraws its cores and its neurondevice twin; nothing of the
    /// resource itself is withdrawn.
    #[test]
    fn a_unit_held_through_one_resource_is_withdrawn_from_the_others() {
        let r = neuron();
        let (dev, core, alias) = (&r[0], &r[1], &r[2]);
        let l = Ledger::default();
        l.learn(&r);
        l.claim(core, &["0".into()]).unwrap();
        assert_eq!(ids(&l.withdrawn(dev)), [dev.units[0].id.as_str()]);
        assert_eq!(ids(&l.withdrawn(alias)), [alias.units[0].id.as_str()]);
        assert!(l.withdrawn(core).is_empty(), "core 1 of device 0 stays for other neuroncore pods");
        l.claim(dev, &[dev.units[1].id.clone()]).unwrap();
        assert_eq!(ids(&l.withdrawn(core)), ["2", "3"]);
        assert_eq!(ids(&l.withdrawn(alias)), [alias.units[0].id.as_str(), alias.units[1].id.as_str()]);
        // An Allocate that still names a withdrawn unit is refused, naming the holder.
        let e = l.claim(alias, &[alias.units[1].id.clone()]).unwrap_err();
        assert_eq!((e.holder.as_str(), e.holder_id.as_str()), ("aws.amazon.com/neuron", dev.units[1].id.as_str()));
        assert!(e.to_string().contains("in use through aws.amazon.com/neuron"), "{e}");
        // Nothing was recorded for the refused one.
        assert!(!l.held_ids(alias).contains(&alias.units[1].id));
        // Device 2 is free everywhere.
        l.claim(alias, &[alias.units[2].id.clone()]).unwrap();
    }

    /// PodResources is the truth: a pod that went frees its units, an assignment this process
    /// never saw (a restart) is held, and a fresh Allocate is held until GRACE passes.
    #[test]
    fn pod_resources_free_and_restore_units() {
        let r = neuron();
        let (dev, core) = (&r[0], &r[1]);
        let l = Ledger::default();
        l.learn(&r);
        let mut rx = l.subscribe();
        rx.borrow_and_update();
        l.claim(core, &["0".into(), "1".into()]).unwrap();
        assert!(rx.has_changed().unwrap());
        // The kubelet lists it: held.
        l.reconcile([(core.name.clone(), "0".into()), (core.name.clone(), "1".into())].into());
        assert_eq!(l.withdrawn(dev).len(), 1);
        // The pod is gone, and so is the recent record after GRACE (aged by hand here).
        l.lock().recent.values_mut().for_each(|at| *at = at.checked_sub(GRACE).expect("uptime over GRACE"));
        rx.borrow_and_update();
        l.reconcile(BTreeSet::new());
        assert!(l.withdrawn(dev).is_empty());
        assert!(rx.has_changed().unwrap(), "the streams are woken to report the unit healthy again");
        // A restarted plugin learns the assignment from the kubelet alone.
        let l2 = Ledger::default();
        l2.learn(&r);
        l2.reconcile([(dev.name.clone(), dev.units[2].id.clone())].into());
        assert_eq!(ids(&l2.withdrawn(core)), ["4", "5"]);
        // Assignments of resources this process does not serve are ignored.
        l2.reconcile([("nvidia.com/gpu".to_string(), "GPU-0".to_string())].into());
        assert!(l2.withdrawn(core).is_empty());
    }

    /// A GPU held whole keeps its hardware across a mode change: its MIG devices (another
    /// resource) and its partitions (the same resource name, other IDs) are withdrawn.
    #[test]
    fn a_mode_change_under_a_held_gpu_keeps_it_withdrawn() {
        use actk_core::inventory::{Mig, MigDevice};
        let gpu = |mig: bool| {
            let migs = if mig {
                (0..2)
                    .map(|j| MigDevice {
                        index: j,
                        uuid: format!("MIG-0{j}"),
                        profile: "3g.40gb".into(),
                        ..Default::default()
                    })
                    .collect()
            } else {
                vec![]
            };
            let vendor = VendorInventory {
                profile: "nvidia".into(),
                kind: "nvidia.com/gpu".into(),
                devices: vec![Device {
                    index: 0,
                    uuid: Some("GPU-0".into()),
                    pci_bus_id: Some("0000:07:00.0".into()),
                    mig: Some(Mig { enabled: mig, devices: migs }),
                    ..Default::default()
                }],
                ..Default::default()
            };
            let inv = Inventory { vendors: vec![vendor], ..Default::default() };
            let opts = BuildOptions { mig_strategy: crate::resources::MigStrategy::Mixed, ..Default::default() };
            build(&inv, &actk_core::profile::builtin(), &opts)
        };
        let l = Ledger::default();
        let before = gpu(false);
        l.learn(&before);
        l.claim(&before[0], &["GPU-0".into()]).unwrap();
        let after = gpu(true);
        l.learn(&after);
        let mig = after.iter().find(|r| r.name == "nvidia.com/mig-3g.40gb").unwrap();
        assert_eq!(ids(&l.withdrawn(mig)), ["MIG-00", "MIG-01"]);

        let amd = |mode: &str, n: u32| {
            let devices = (0..n)
                .map(|i| {
                    let mut d = Device { index: i, pci_bus_id: Some("0000:05:00.0".into()), ..Default::default() };
                    d.attributes.insert("compute_partition".into(), mode.into());
                    d.attributes.insert("memory_partition".into(), "nps1".into());
                    d.attributes.insert("partition".into(), i.to_string());
                    d
                })
                .collect();
            let vendor =
                VendorInventory { profile: "amd".into(), kind: "amd.com/gpu".into(), devices, ..Default::default() };
            let inv = Inventory { vendors: vec![vendor], ..Default::default() };
            build(&inv, &actk_core::profile::builtin(), &BuildOptions::default())
        };
        let l = Ledger::default();
        let spx = amd("spx", 1);
        l.learn(&spx);
        l.claim(&spx[0], &["0".into()]).unwrap();
        let cpx = amd("cpx", 8);
        l.learn(&cpx);
        assert_eq!(
            ids(&l.withdrawn(&cpx[0])),
            ["1", "2", "3", "4", "5", "6", "7"],
            "the partitions of the GPU held whole as amd.com/gpu 0 (ID 0 itself the kubelet keeps)"
        );
    }

    #[test]
    fn without_pod_resources_allocations_stay_held() {
        let r = neuron();
        let l = Ledger::default();
        l.learn(&r);
        l.claim(&r[1], &["0".into()]).unwrap();
        l.lock().recent.values_mut().for_each(|at| *at = at.checked_sub(GRACE * 2).expect("uptime over GRACE"));
        l.age();
        assert_eq!(l.withdrawn(&r[0]).len(), 1, "never freed while the kubelet cannot be asked");
    }
}
