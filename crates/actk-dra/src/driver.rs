//! The node side of the driver: NodePrepareResources and NodeUnprepareResources over the
//! current inventory, the claims in the API server, the CDI directory and the checkpoint.
//!
//! Prepare of one claim:
//! 1. already in the checkpoint and its spec file present: the checkpointed answer (idempotent,
//!    and a restarted driver answers without the API server);
//! 2. else read the claim from the API server ([`ClaimSource`]), then under the lock check its
//!    UID, build its spec ([`crate::claim::prepare`], with the cores of shared devices that
//!    other prepared claims hold, from the checkpoint), write the spec atomically, then the
//!    checkpoint; when the checkpoint cannot be written the spec is removed again, so an error
//!    leaves nothing behind.
//!
//! With dynamic MIG ([`Driver::with_dynamic_mig`], [`crate::mig`]) prepare also makes the MIG
//! device of each placement device the claim was allocated, under the lock: the checkpoint
//! records that it is making them (`making`) before NVML is asked, the entry lists what was
//! made, and any failure destroys it again. Unprepare destroys them first; while NVML refuses
//! (a process still uses one) nothing else is removed and the kubelet calls again.
//!
//! Unprepare of one claim removes its spec (a missing one is fine) and its checkpoint entry
//! (with the cores it held). Claims sharing a device each have their own spec, so the others
//! keep theirs: the device stays for them.
//! Claims are handled one at a time under one lock (the work is a few small file writes); the
//! API read happens outside the lock.
//!
//! Two driver processes can serve one node at once: during a rolling update the kubelet
//! (1.33+) has the old pod and the new one registered, each with its own sockets, and may call
//! either ([`crate::plugin::Sockets`]). The lock is therefore also a file lock,
//! [`LOCK_FILE`] in the plugin directory (flock), and the checkpoint is read again from disk
//! under it: what one process prepared, the other answers and unprepares.
//!
//! A claim is its namespace, name and UID together: both calls refuse a UID that is not a UID
//! ([`claim::check_uid`], before it names a file) and a UID the checkpoint holds for another
//! namespace or name; prepare also refuses an API object whose namespace, name or UID differs.
//! So one tenant's UID under another's claim name (or a namespace that does not exist) neither
//! answers with the first tenant's devices nor removes its spec.

use crate::checkpoint::{Checkpoint, Entry, Made};
use crate::claim::{self, ClaimError, ClaimRef, PreparedDevice, SpecOptions};
use actk_core::cdi::validate::Format;
use actk_core::inventory::Inventory;
use actk_core::profile::Profile;
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::{Mutex, MutexGuard, watch};

/// File name of the lock that serializes prepare and unprepare across the driver processes of
/// one node, in the directory of the checkpoint (the plugin directory).
pub const LOCK_FILE: &str = "serialize.lock";

/// Where claims are read from: the API server in the driver, a map in tests and benches.
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim `namespace/name`. Errors: a message naming what failed (not found, forbidden,
    /// unreachable).
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Pin<Box<dyn Future<Output = Result<ResourceClaim, String>> + Send + '_>>;
}

/// Everything prepare and unprepare need.
pub struct Driver {
    /// Node name (the pool name).
    pub node: String,
    /// The profiles.
    pub profiles: Vec<Profile>,
    /// Where claim specs go (the node's /var/run/cdi as the driver sees it).
    pub cdi_dir: PathBuf,
    /// The checkpoint file.
    pub checkpoint_path: PathBuf,
    /// How specs are built.
    pub spec_options: SpecOptions,
    /// The inventory as published (served profiles only, unhealthy devices left out).
    pub inventory: watch::Receiver<Arc<Inventory>>,
    claims: Arc<dyn ClaimSource>,
    state: Mutex<Checkpoint>,
    metrics: Option<crate::metrics::DraMetrics>,
    lock_file: Option<PathBuf>,
    dynamic_mig: Option<DynamicMig>,
}

/// What prepare needs to make MIG devices ([`Driver::with_dynamic_mig`]).
struct DynamicMig {
    /// The host root whose NVML makes them.
    root: PathBuf,
    /// The placements the publisher offers.
    placements: watch::Receiver<Arc<crate::mig::Placements>>,
}

/// The checkpoint while both locks are held (this process's and the node-wide file lock);
/// dropping it releases them.
struct Held<'a> {
    cp: MutexGuard<'a, Checkpoint>,
    _file: std::fs::File,
}

impl std::ops::Deref for Held<'_> {
    type Target = Checkpoint;
    fn deref(&self) -> &Checkpoint {
        &self.cp
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Checkpoint {
        &mut self.cp
    }
}

/// Why the driver cannot start.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The checkpoint is unreadable.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
}

impl Driver {
    /// A driver for `node`, loading its checkpoint from `checkpoint_path` (missing: empty).
    ///
    /// Errors: [`DriverError::Checkpoint`] when the checkpoint exists but cannot be read.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        node: String,
        profiles: Vec<Profile>,
        cdi_dir: PathBuf,
        checkpoint_path: PathBuf,
        spec_options: SpecOptions,
        inventory: watch::Receiver<Arc<Inventory>>,
        claims: Arc<dyn ClaimSource>,
    ) -> Result<Driver, DriverError> {
        let cp = Checkpoint::load(&checkpoint_path, &node)?;
        Ok(Driver {
            node,
            profiles,
            cdi_dir,
            checkpoint_path,
            spec_options,
            inventory,
            claims,
            state: Mutex::new(cp),
            metrics: None,
            lock_file: None,
            dynamic_mig: None,
        })
    }

    /// The driver counting prepared claims in `metrics`.
    pub fn with_metrics(mut self, metrics: crate::metrics::DraMetrics) -> Driver {
        metrics.prepared_claims(self.state.get_mut().claims.len());
        self.metrics = Some(metrics);
        self
    }

    /// The metrics the driver counts in, when given ([`Driver::with_metrics`]).
    pub fn metrics(&self) -> Option<&crate::metrics::DraMetrics> {
        self.metrics.as_ref()
    }

    /// The driver with its node-wide lock file at `path` instead of [`LOCK_FILE`] beside the
    /// checkpoint (tests that make the checkpoint's directory unusable).
    pub fn with_lock_file(mut self, path: PathBuf) -> Driver {
        self.lock_file = Some(path);
        self
    }

    /// The driver making the MIG device of each placement device a claim was allocated
    /// (dynamic MIG, [`crate::mig`]) through the NVML of host root `root`, for the placements
    /// the publisher offers on `placements`.
    pub fn with_dynamic_mig(
        mut self,
        root: PathBuf,
        placements: watch::Receiver<Arc<crate::mig::Placements>>,
    ) -> Driver {
        self.dynamic_mig = Some(DynamicMig { root, placements });
        self
    }

    /// The node-wide lock file ([`LOCK_FILE`] beside the checkpoint, unless set).
    pub fn lock_path(&self) -> PathBuf {
        self.lock_file
            .clone()
            .unwrap_or_else(|| self.checkpoint_path.parent().unwrap_or(Path::new(".")).join(LOCK_FILE))
    }

    /// Takes this process's lock, then the node-wide file lock, and reads the checkpoint again
    /// (another driver process may have changed it).
    ///
    /// Errors: the lock file cannot be opened or locked, or the checkpoint cannot be read (the
    /// message names the file).
    async fn hold(&self) -> Result<Held<'_>, String> {
        let mut cp = self.state.lock().await;
        let path = self.lock_path();
        let shown = path.display().to_string();
        let file = tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let f = std::fs::File::options().create(true).truncate(false).write(true).open(&path)?;
            f.lock()?;
            Ok(f)
        })
        .await
        .map_err(|e| format!("locking {shown}: {e}"))?
        .map_err(|e| format!("locking {shown}: {e}"))?;
        *cp = Checkpoint::load(&self.checkpoint_path, &self.node).map_err(|e| e.to_string())?;
        Ok(Held { cp, _file: file })
    }

    /// UIDs of the claims in the checkpoint.
    ///
    /// Errors: as [`Driver::hold`].
    pub async fn prepared_claims(&self) -> Result<Vec<String>, String> {
        Ok(self.hold().await?.claims.keys().cloned().collect())
    }

    /// Removes claim specs of this driver in the CDI directory that the checkpoint does not
    /// know (a driver killed between writing a spec and its checkpoint), so that no spec grants
    /// devices for a claim nobody prepared. Each removal is logged.
    pub async fn remove_orphan_specs(&self) {
        let st = match self.hold().await {
            Ok(st) => st,
            Err(e) => {
                tracing::warn!("not removing orphan claim specs: {e}");
                return;
            }
        };
        let Ok(entries) = std::fs::read_dir(&self.cdi_dir) else { return };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(uid) = claim::uid_of_spec_file(&name)
                && !st.claims.contains_key(uid)
            {
                match std::fs::remove_file(e.path()) {
                    Ok(()) => tracing::info!("removed {}: no prepared claim has uid {uid}", e.path().display()),
                    Err(err) => tracing::warn!("cannot remove orphan spec {}: {err}", e.path().display()),
                }
            }
        }
    }

    /// Prepares `want` (see the module docs) and returns its devices.
    ///
    /// Errors: a message naming the claim: [`ClaimError`]s ([`ClaimError::NotAUid`] and
    /// [`ClaimError::OtherClaim`] before anything is read or written), a spec or checkpoint
    /// write failure.
    pub async fn prepare(&self, want: &ClaimRef) -> Result<Vec<PreparedDevice>, String> {
        claim::check_uid(want).map_err(|e| e.to_string())?;
        {
            let st = self.hold().await?;
            Self::same_claim(&st, want)?;
            if let Some(e) = st.claims.get(&want.uid)
                && e.spec.as_ref().is_none_or(|s| self.cdi_dir.join(s).exists())
            {
                return Ok(e.devices.clone());
            }
        }
        let obj = self
            .claims
            .get(&want.namespace, &want.name)
            .await
            .map_err(|message| ClaimError::NotFound { claim: want.clone(), message }.to_string())?;
        let inventory = self.inventory.borrow().clone();
        let mut st = self.hold().await?;
        // Another call may have prepared this UID for another claim while the API was read.
        Self::same_claim(&st, want)?;
        // Under the lock: which cores of shared devices other claims hold is the checkpoint's.
        let mut taken: std::collections::BTreeMap<String, std::collections::BTreeSet<u32>> = Default::default();
        for (uid, e) in &st.claims {
            if *uid != want.uid {
                for (device, cores) in &e.cores {
                    taken.entry(device.clone()).or_default().extend(cores);
                }
            }
        }
        // Dynamic MIG: the MIG devices of the claim's placement devices are made now, with the
        // checkpoint saying so first; from here on an error destroys them again, so nothing is
        // left half made.
        let wanted = self.wanted_placements(want, &obj, &inventory)?;
        // What an earlier prepare of this claim left: MIG devices a killed prepare was making,
        // or made for an entry whose spec has gone since. Destroyed first, so that this
        // prepare makes its devices from nothing (NVML would refuse their placements).
        let stale: Vec<Made> = st.claims.get(&want.uid).map(|e| e.made.clone()).unwrap_or_default();
        let left = st.making.get(&want.uid).cloned();
        if !stale.is_empty() || left.is_some() {
            self.destroy_migs(&stale).await.map_err(|e| format!("claim {want}: {e}"))?;
            if let Some(left) = &left {
                self.destroy_at(left).await.map_err(|e| format!("claim {want}: {e}"))?;
            }
            let mut next = st.clone();
            next.making.remove(&want.uid);
            if let Some(e) = next.claims.get_mut(&want.uid) {
                e.made.clear();
            }
            next.save(&self.checkpoint_path).map_err(|e| format!("claim {want}: {e}"))?;
            *st = next;
        }
        if !wanted.is_empty() {
            let mut next = st.clone();
            next.making.insert(want.uid.clone(), wanted.iter().map(|(_, p)| p.clone()).collect());
            next.save(&self.checkpoint_path).map_err(|e| format!("claim {want}: {e}"))?;
            *st = next;
        }
        let (inventory, made, aliases) = match self.make_migs(want, inventory, wanted).await {
            Ok(m) => m,
            Err(Unmade { why, clean }) => {
                // Nothing left made: the record goes. Something left made: the record stays, for
                // the claim's next prepare or its unprepare to destroy it.
                return Err(if clean { self.forget_making(&mut st, want, why) } else { why });
            }
        };
        let file = claim::spec_file_name(&want.uid);
        let path = self.cdi_dir.join(&file);
        let outcome: Result<claim::Prepared, String> = async {
            let prepared = claim::prepare(
                want,
                &obj,
                &self.node,
                &inventory,
                &self.profiles,
                &taken,
                &aliases,
                &self.spec_options,
            )
            .map_err(|e| e.to_string())?;
            if let Some(spec) = &prepared.spec {
                actk_core::cdi::write::write_spec(spec, &path, Format::Json)
                    .map_err(|e| format!("claim {want}: cannot write its CDI spec: {e}"))?;
            }
            let mut next = st.clone();
            next.claims.insert(
                want.uid.clone(),
                Entry {
                    claim: want.clone(),
                    devices: prepared.devices.clone(),
                    spec: prepared.spec.is_some().then(|| file.clone()),
                    cores: prepared.cores.clone(),
                    made: made.clone(),
                },
            );
            next.making.remove(&want.uid);
            if let Err(e) = next.save(&self.checkpoint_path) {
                if prepared.spec.is_some() {
                    let _ = std::fs::remove_file(&path);
                }
                return Err(format!("claim {want}: {e}; its CDI spec was removed again"));
            }
            *st = next;
            Ok(prepared)
        }
        .await;
        let prepared = match outcome {
            Ok(p) => p,
            Err(why) => {
                return Err(match self.destroy_migs(&made).await {
                    Ok(()) => self.forget_making(&mut st, want, why),
                    Err(e) => format!("{why}; {e}"),
                });
            }
        };
        if let Some(m) = &self.metrics {
            m.prepared_claims(st.claims.len());
        }
        tracing::info!(
            "prepared claim {want}: {}",
            prepared.devices.iter().map(|d| d.device.as_str()).collect::<Vec<_>>().join(", ")
        );
        Ok(prepared.devices)
    }

    /// Unprepares `claim`: removes its spec and checkpoint entry; a claim never prepared (or
    /// unprepared before) is fine.
    ///
    /// Errors: [`ClaimError::NotAUid`] and [`ClaimError::OtherClaim`] (nothing removed), the
    /// spec cannot be removed, or the checkpoint cannot be written (both name the file).
    pub async fn unprepare(&self, claim: &ClaimRef) -> Result<(), String> {
        claim::check_uid(claim).map_err(|e| e.to_string())?;
        let mut st = self.hold().await?;
        Self::same_claim(&st, claim)?;
        // The MIG devices made for it first: while one cannot be destroyed (a process still
        // uses it), nothing else is removed and the kubelet calls again.
        if let Some(e) = st.claims.get(&claim.uid)
            && !e.made.is_empty()
        {
            self.destroy_migs(&e.made).await.map_err(|e| format!("claim {claim}: {e}"))?;
            // Destroyed: the entry no longer names them (their ids may be given to others).
            let mut next = st.clone();
            if let Some(e) = next.claims.get_mut(&claim.uid) {
                e.made.clear();
            }
            next.save(&self.checkpoint_path).map_err(|e| format!("claim {claim}: {e}"))?;
            *st = next;
        }
        if let Some(left) = st.making.get(&claim.uid).cloned() {
            // Its prepare was killed while making MIG devices.
            self.destroy_at(&left).await.map_err(|e| format!("claim {claim}: {e}"))?;
            let mut next = st.clone();
            next.making.remove(&claim.uid);
            next.save(&self.checkpoint_path).map_err(|e| format!("claim {claim}: {e}"))?;
            *st = next;
        }
        let path = self.cdi_dir.join(claim::spec_file_name(&claim.uid));
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("claim {claim}: cannot remove its CDI spec {}: {e}", path.display())),
        }
        if st.claims.contains_key(&claim.uid) {
            let mut next = st.clone();
            next.claims.remove(&claim.uid);
            next.save(&self.checkpoint_path).map_err(|e| format!("claim {claim}: {e}"))?;
            *st = next;
            if let Some(m) = &self.metrics {
                m.prepared_claims(st.claims.len());
            }
            tracing::info!("unprepared claim {claim}");
        }
        Ok(())
    }
}

/// The MIG devices made for a claim, the inventory that holds them, and each placement
/// device's MIG device name ([`claim::prepare`]'s `made`).
type MadeMigs = (Arc<Inventory>, Vec<Made>, std::collections::BTreeMap<String, String>);

/// Why a claim's MIG devices were not made, and whether nothing of them is left (`clean`).
struct Unmade {
    why: String,
    clean: bool,
}

impl Driver {
    /// The placement devices (dynamic MIG) `claim` was allocated on this node, with where
    /// their MIG devices go; none without dynamic MIG.
    ///
    /// Errors: a placement's GPU is not usable here now (lost, withdrawn), naming the claim.
    fn wanted_placements(
        &self,
        want: &ClaimRef,
        claim: &ResourceClaim,
        inventory: &Inventory,
    ) -> Result<Vec<(String, crate::mig::Placement)>, String> {
        let Some(dm) = &self.dynamic_mig else { return Ok(Vec::new()) };
        let offered = dm.placements.borrow().clone();
        let mut wanted: Vec<(String, crate::mig::Placement)> = Vec::new();
        let results = claim.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref());
        for r in results.and_then(|d| d.results.as_ref()).into_iter().flatten() {
            if r.driver == crate::slice::DRIVER
                && r.pool == self.node
                && let Some(p) = offered.get(&r.device)
                && !wanted.iter().any(|(n, _)| *n == r.device)
            {
                // Admin access consumes no counters: the placement stays allocatable to
                // others, and a MIG device made for it would block theirs.
                if r.admin_access == Some(true) {
                    return Err(format!(
                        "claim {want}: device {} is a MIG device made on demand (dynamic MIG), which admin access cannot claim (it would hold the placement without the scheduler counting it); claim a MIG device that exists, or the GPU",
                        r.device
                    ));
                }
                wanted.push((r.device.clone(), p.clone()));
            }
        }
        for (name, p) in &wanted {
            let usable = inventory
                .vendors
                .iter()
                .flat_map(|v| &v.devices)
                .any(|d| d.uuid.as_deref() == Some(p.gpu_uuid.as_str()) && !d.nodes.is_empty());
            if !usable {
                return Err(format!(
                    "claim {want}: device {name} is a MIG device of GPU {}, which is not usable on this node now (lost or unhealthy)",
                    p.gpu_uuid
                ));
            }
        }
        Ok(wanted)
    }

    /// Makes the MIG device of each of `wanted` and returns `inventory` with them.
    ///
    /// Errors (nothing left made): NVML cannot be loaded, refuses the placement (taken by a
    /// MIG device made outside the driver), or discovery does not find the new MIG device;
    /// each names the claim.
    async fn make_migs(
        &self,
        want: &ClaimRef,
        inventory: Arc<Inventory>,
        wanted: Vec<(String, crate::mig::Placement)>,
    ) -> Result<MadeMigs, Unmade> {
        let Some(dm) = self.dynamic_mig.as_ref().filter(|_| !wanted.is_empty()) else {
            return Ok((inventory, Vec::new(), Default::default()));
        };
        let root = dm.root.clone();
        let profiles: Vec<Profile> = self.profiles.clone();
        match tokio::task::spawn_blocking(move || make_blocking(&root, &profiles, &inventory, &wanted)).await {
            Ok(Ok(m)) => Ok(m),
            Ok(Err(u)) => Err(Unmade { why: format!("claim {want}: {}", u.why), clean: u.clean }),
            Err(e) => Err(Unmade { why: format!("claim {want}: making its MIG devices: {e}"), clean: false }),
        }
    }

    /// Destroys the MIG devices at `placements` that a killed prepare may have made.
    ///
    /// Errors: NVML cannot be loaded or refuses.
    async fn destroy_at(&self, placements: &[crate::mig::Placement]) -> Result<(), String> {
        let Some(dm) = &self.dynamic_mig else { return Ok(()) };
        let (root, profiles, placements) = (dm.root.clone(), self.profiles.clone(), placements.to_vec());
        tokio::task::spawn_blocking(move || {
            let inv = actk_core::discover::discover(&root, &profiles);
            let mut found = Vec::new();
            for p in &placements {
                let m = inv
                    .vendors
                    .iter()
                    .flat_map(|v| &v.devices)
                    .filter(|d| d.uuid.as_deref() == Some(&p.gpu_uuid))
                    .find_map(|d| {
                        d.mig
                            .as_ref()?
                            .devices
                            .iter()
                            .find(|m| {
                                m.placement.start == p.start && m.placement.size == p.size && m.profile == p.mig_profile
                            })
                            .cloned()
                    });
                if let Some(m) = m {
                    found.push(Made {
                        device: String::new(),
                        gpu_uuid: p.gpu_uuid.clone(),
                        start: p.start,
                        gpu_instance: m.gpu_instance,
                        compute_instance: m.compute_instance,
                        uuid: m.uuid.clone(),
                    });
                }
            }
            if found.is_empty() { Ok(()) } else { destroy_blocking(&root, &found) }
        })
        .await
        .map_err(|e| format!("destroying MIG devices: {e}"))?
    }

    /// Destroys `made` (a device already gone is fine).
    ///
    /// Errors: NVML cannot be loaded or refuses (a process still uses the device), naming the
    /// devices not destroyed.
    async fn destroy_migs(&self, made: &[Made]) -> Result<(), String> {
        if made.is_empty() {
            return Ok(());
        }
        let Some(dm) = &self.dynamic_mig else {
            return Err(format!(
                "the MIG devices {} were made for it and dynamic MIG is off now; turn it on (--dynamic-mig) to destroy them, or destroy them with nvidia-smi mig -dci / -dgi",
                made.iter().map(|m| m.uuid.as_str()).collect::<Vec<_>>().join(", ")
            ));
        };
        let root = dm.root.clone();
        let made = made.to_vec();
        tokio::task::spawn_blocking(move || destroy_blocking(&root, &made))
            .await
            .map_err(|e| format!("destroying MIG devices: {e}"))?
    }

    /// Removes the record that `want`'s MIG devices are being made (they are not: nothing of
    /// them is left) and returns `why`, with the checkpoint's error when it cannot be saved.
    fn forget_making(&self, st: &mut Held<'_>, want: &ClaimRef, why: String) -> String {
        if !st.making.contains_key(&want.uid) {
            return why;
        }
        let mut next = (**st).clone();
        next.making.remove(&want.uid);
        match next.save(&self.checkpoint_path) {
            Ok(()) => {
                **st = next;
                why
            }
            Err(e) => format!("{why}; {e}"),
        }
    }

    /// Errors when the checkpoint holds `want.uid` for a claim of another namespace or name.
    fn same_claim(st: &Checkpoint, want: &ClaimRef) -> Result<(), String> {
        match st.claims.get(&want.uid) {
            Some(e) if e.claim != *want => {
                Err(ClaimError::OtherClaim { claim: want.clone(), where_: "the checkpoint".into() }.to_string())
            }
            _ => Ok(()),
        }
    }
}

/// Makes each of `wanted` (placement device name, placement) through the root's NVML, then
/// reads the GPUs' MIG devices again (their capability nodes) and returns `inventory` with
/// them. On an error, what it made is destroyed again; `clean` says whether that worked.
fn make_blocking(
    root: &Path,
    profiles: &[Profile],
    inventory: &Inventory,
    wanted: &[(String, crate::mig::Placement)],
) -> Result<MadeMigs, Unmade> {
    use actk_core::discover::nvml::{self, dynamic};
    let host = actk_core::discover::HostRoot::new(root);
    let lib =
        nvml::open(&host).map_err(|e| Unmade { why: format!("cannot make its MIG devices: {e}"), clean: true })?;
    let mut made: Vec<Made> = Vec::new();
    // What is made is destroyed again when a later step fails.
    let undo = |lib: &nvml_wrapper::Nvml, made: &[Made], mut why: String| {
        let clean = match destroy_with(lib, made) {
            Ok(()) => true,
            Err(d) => {
                why.push_str(&format!("; {d}"));
                false
            }
        };
        Unmade { why, clean }
    };
    for (name, p) in wanted {
        match dynamic::create(&lib, &p.gpu_uuid, p.profile_index, p.start) {
            Ok(c) => {
                tracing::info!(
                    "made MIG device {} ({} at memory slice {} of GPU {}, GI {} CI {}) for {name}",
                    c.uuid,
                    p.mig_profile,
                    p.start,
                    p.gpu_uuid,
                    c.gpu_instance,
                    c.compute_instance
                );
                made.push(Made {
                    device: name.clone(),
                    gpu_uuid: p.gpu_uuid.clone(),
                    start: p.start,
                    gpu_instance: c.gpu_instance,
                    compute_instance: c.compute_instance,
                    uuid: c.uuid,
                });
            }
            Err(e) => {
                let why = format!("cannot make device {name} ({} at memory slice {}): {e}", p.mig_profile, p.start);
                return Err(undo(&lib, &made, why));
            }
        }
    }
    // The GPUs' MIG devices as discovery describes them now (the new ones' capability nodes;
    // MIG device indexes may have moved).
    let vendors: std::collections::BTreeSet<&str> = inventory
        .vendors
        .iter()
        .filter(|v| v.devices.iter().any(|d| wanted.iter().any(|(_, p)| d.uuid.as_deref() == Some(&p.gpu_uuid))))
        .map(|v| v.profile.as_str())
        .collect();
    let some: Vec<Profile> = profiles.iter().filter(|p| vendors.contains(p.name.as_str())).cloned().collect();
    let fresh = actk_core::discover::discover(root, &some);
    let mut out = inventory.clone();
    let mut aliases = std::collections::BTreeMap::new();
    for m in &made {
        let found = fresh.vendors.iter().flat_map(|v| &v.devices).find(|d| d.uuid.as_deref() == Some(&m.gpu_uuid));
        let Some(now) = found.and_then(|d| d.mig.clone()).filter(|g| g.devices.iter().any(|x| x.uuid == m.uuid)) else {
            let why = format!("MIG device {} was made for {} but discovery does not find it", m.uuid, m.device);
            return Err(undo(&lib, &made, why));
        };
        for v in &mut out.vendors {
            let profile = v.profile.clone();
            for d in v.devices.iter_mut().filter(|d| d.uuid.as_deref() == Some(m.gpu_uuid.as_str())) {
                d.mig = Some(now.clone());
                if let Some(mig) = now.devices.iter().find(|x| x.uuid == m.uuid) {
                    aliases.insert(m.device.clone(), crate::slice::mig_device_name(&profile, d.index, mig));
                }
            }
        }
    }
    Ok((Arc::new(out), made, aliases))
}

/// Destroys `made` through the root's NVML.
fn destroy_blocking(root: &Path, made: &[Made]) -> Result<(), String> {
    let host = actk_core::discover::HostRoot::new(root);
    let lib = actk_core::discover::nvml::open(&host).map_err(|e| {
        format!(
            "cannot destroy MIG devices {}: {e}",
            made.iter().map(|m| m.uuid.as_str()).collect::<Vec<_>>().join(", ")
        )
    })?;
    destroy_with(&lib, made)
}

/// Destroys each of `made` by its UUID (one no longer there is fine; an instance id NVML has
/// since given to another device is never destroyed).
fn destroy_with(lib: &nvml_wrapper::Nvml, made: &[Made]) -> Result<(), String> {
    let mut failed = Vec::new();
    for m in made.iter().rev() {
        match actk_core::discover::nvml::dynamic::destroy_by_uuid(lib, &m.gpu_uuid, &m.uuid) {
            Ok(true) => tracing::info!("destroyed MIG device {} ({})", m.uuid, m.device),
            Ok(false) => tracing::info!("MIG device {} ({}) is gone already", m.uuid, m.device),
            Err(e) => failed.push(format!("{} ({}): {e}", m.uuid, m.device)),
        }
    }
    if failed.is_empty() { Ok(()) } else { Err(format!("cannot destroy MIG device(s) {}", failed.join("; "))) }
}

/// Claims held in memory, keyed by `(namespace, name)`: the [`ClaimSource`] of tests, benches
/// and dry runs.
#[derive(Default)]
pub struct MemoryClaims(pub std::sync::Mutex<std::collections::BTreeMap<(String, String), ResourceClaim>>);

impl MemoryClaims {
    /// Adds or replaces `claim` (keyed by its metadata namespace and name).
    pub fn put(&self, claim: ResourceClaim) {
        let key =
            (claim.metadata.namespace.clone().unwrap_or_default(), claim.metadata.name.clone().unwrap_or_default());
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(key, claim);
    }
}

impl ClaimSource for MemoryClaims {
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Pin<Box<dyn Future<Output = Result<ResourceClaim, String>> + Send + '_>> {
        let found =
            self.0.lock().unwrap_or_else(|e| e.into_inner()).get(&(namespace.to_string(), name.to_string())).cloned();
        let missing = format!("resourceclaims.resource.k8s.io \"{name}\" not found");
        Box::pin(async move { found.ok_or(missing) })
    }
}
