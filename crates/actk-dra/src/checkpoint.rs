//! The driver's checkpoint: which claims it prepared and what it answered, on disk, so that a
//! restarted driver answers NodePrepareResources for them the same way without the API server
//! and knows which transient specs are its own.
//!
//! Format (JSON, `version` 1, or [`VERSION_MADE`] while MIG devices are made for a claim): `{"version": 1, "node": "...", "claims": {"<uid>": {"claim":
//! {"namespace", "uid", "name"}, "devices": [{"request", "pool", "device", "cdi_ids"}],
//! "spec": "<file name in the CDI dir>", "cores": {"<device>": [<core within the device>, ...]},
//! "made": [{"device", "gpu_uuid", "start", "gpu_instance", "compute_instance", "uuid"}]}},
//! "making": {"<uid>": [<placement>, ...]}}` (`cores` only for claims that share devices in
//! cores, `made` only for claims with MIG devices made for them, `making` only while a prepare
//! makes some). Written atomically (temporary file in the same
//! directory, fsync, rename, fsync of the directory), so a crash leaves the old or the new
//! checkpoint, never a mix.

use crate::claim::{ClaimRef, PreparedDevice};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Version of the file format this driver writes and reads.
pub const VERSION: u32 = 1;

/// The version written while any claim has MIG devices made for it ([`Entry::made`],
/// [`Checkpoint::making`]): a driver of an earlier release, which would drop those fields and
/// so never destroy the devices (and publish them as free static MIG devices), refuses such a
/// checkpoint naming the file instead. Both versions are read.
pub const VERSION_MADE: u32 = 2;

/// File name of the checkpoint in the driver's plugin directory.
pub const FILE_NAME: &str = "checkpoint.json";

/// One prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The claim.
    pub claim: ClaimRef,
    /// The answer given.
    pub devices: Vec<PreparedDevice>,
    /// File name of its spec in the CDI directory; `None` when it has no device on this node.
    pub spec: Option<String>,
    /// Cores the claim holds of each device it shares in cores (slice device name -> cores
    /// numbered within the device, 0 first); absent in checkpoints of earlier releases, which
    /// shared nothing.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cores: BTreeMap<String, Vec<u32>>,
    /// MIG devices the driver made for the claim (dynamic MIG, [`crate::mig`]), destroyed at
    /// unprepare; absent in checkpoints of earlier releases and of claims without any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub made: Vec<Made>,
}

/// A MIG device made at prepare for a placement device ([`crate::mig::Placement`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Made {
    /// The placement device allocated (`nvidia-0-mig-3g-40gb-4`).
    pub device: String,
    /// The GPU's UUID.
    pub gpu_uuid: String,
    /// First memory slice of its GPU instance (the placement's).
    pub start: u32,
    /// GPU instance id NVML gave it.
    pub gpu_instance: u32,
    /// Compute instance id.
    pub compute_instance: u32,
    /// The MIG device's UUID (`MIG-...`).
    pub uuid: String,
}

/// The whole checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Format version ([`VERSION`]).
    pub version: u32,
    /// Node the claims were prepared on.
    pub node: String,
    /// Prepared claims by UID.
    pub claims: BTreeMap<String, Entry>,
    /// MIG devices being made for a claim (by UID) whose prepare has not finished: written
    /// before NVML is asked, so that a driver killed in between finds and destroys what it
    /// made (at the claim's next prepare or its unprepare), and the publisher does not publish
    /// them as MIG devices of their own. Absent in checkpoints of earlier releases.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub making: BTreeMap<String, Vec<crate::mig::Placement>>,
}

/// Why the checkpoint cannot be read or written; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading or writing failed.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a checkpoint of this format.
    #[error("checkpoint {path} is not valid: {message}; move it away to start without it")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl Checkpoint {
    /// An empty checkpoint for `node`.
    pub fn new(node: &str) -> Checkpoint {
        Checkpoint { version: VERSION, node: node.to_string(), claims: BTreeMap::new(), making: BTreeMap::new() }
    }

    /// Reads `path`; a missing file is an empty checkpoint for `node`.
    ///
    /// Errors: [`CheckpointError::Io`]; [`CheckpointError::Invalid`] for bad JSON, another
    /// version, or another node's checkpoint (the node was renamed: its claims are not ours).
    pub fn load(path: &Path, node: &str) -> Result<Checkpoint, CheckpointError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Checkpoint::new(node)),
            Err(source) => return Err(CheckpointError::Io { path: path.to_path_buf(), source }),
        };
        let invalid = |message: String| CheckpointError::Invalid { path: path.to_path_buf(), message };
        let c: Checkpoint = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        if c.version != VERSION && c.version != VERSION_MADE {
            return Err(invalid(format!("version {} (this driver reads {VERSION} and {VERSION_MADE})", c.version)));
        }
        if c.node != node {
            return Err(invalid(format!("it is for node {:?}, this is {node:?}", c.node)));
        }
        Ok(c)
    }

    /// Writes the checkpoint to `path` atomically (mode 0600; parent created).
    ///
    /// Errors: [`CheckpointError::Io`] naming the file; the old file is then unchanged.
    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        let io = |source| CheckpointError::Io { path: path.to_path_buf(), source };
        let mut c = self.clone();
        let made = !c.making.is_empty() || c.claims.values().any(|e| !e.made.is_empty());
        c.version = if made { VERSION_MADE } else { VERSION };
        let text = serde_json::to_string_pretty(&c).map_err(|e| io(std::io::Error::other(e)))?;
        write_atomic(path, text.as_bytes(), 0o600).map_err(io)
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory: written, fsynced,
/// renamed over `path`, directory fsynced. On error the temporary file is removed and `path` is
/// as it was.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_missing_and_invalid() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("d/checkpoint.json");
        assert_eq!(Checkpoint::load(&p, "n1").unwrap(), Checkpoint::new("n1"));
        let mut c = Checkpoint::new("n1");
        let claim = ClaimRef { namespace: "ns".into(), uid: "u1".into(), name: "c".into() };
        c.claims.insert(
            "u1".into(),
            Entry {
                claim,
                devices: vec![PreparedDevice {
                    request: "gpu".into(),
                    pool: "n1".into(),
                    device: "nvidia-0".into(),
                    cdi_ids: vec!["actk.dev/claim=u1-nvidia-0".into()],
                }],
                spec: Some("actk.dev-claim_u1.json".into()),
                cores: [("neuron-1".to_string(), vec![2, 3])].into(),
                made: vec![Made {
                    device: "nvidia-0-mig-3g-40gb-4".into(),
                    gpu_uuid: "GPU-0".into(),
                    start: 4,
                    gpu_instance: 2,
                    compute_instance: 0,
                    uuid: "MIG-0".into(),
                }],
            },
        );
        c.save(&p).unwrap();
        let mut read = Checkpoint::load(&p, "n1").unwrap();
        assert_eq!(read.version, VERSION_MADE, "made MIG devices: an earlier release refuses the file");
        read.version = VERSION;
        assert_eq!(read, c);
        let err = Checkpoint::load(&p, "n2").unwrap_err().to_string();
        assert!(err.contains("for node \"n1\""), "{err}");
        std::fs::write(&p, "{\"version\": 1, \"node\": \"n1\", \"claims\": {").unwrap();
        let err = Checkpoint::load(&p, "n1").unwrap_err().to_string();
        assert!(err.starts_with(&format!("checkpoint {} is not valid", p.display())), "{err}");
        assert_eq!(std::fs::read_dir(p.parent().unwrap()).unwrap().count(), 1, "no temporary files left");
    }
}
