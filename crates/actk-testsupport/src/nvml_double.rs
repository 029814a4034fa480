//! The NVML test double of the fixture roots (fixtures/nvml-double/libnvidia-ml.c): its state
//! file read back for tests to compare discovery with, and the knobs a test turns while a
//! process has it loaded.
//!
//! - [`State::of`]: the records of `<root>/nvml-double/state.tsv` (what the double answers);
//! - [`raise_xid`]: append an Xid event the double delivers to event sets created before;
//! - [`lose_gpu`] / [`recover_gpu`]: make every query of a GPU answer GPU_IS_LOST, and undo it;
//! - [`enable_mig`]: switch a GPU to MIG mode, as an administrator does before MIG devices are made.

use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One record of the state file: its name (`gpu`, `mig`, ...) and `key=value` fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// `system`, `gpu`, `giprofile`, `gi`, `mig` or `nvlink`.
    pub kind: String,
    /// The fields.
    pub fields: BTreeMap<String, String>,
}

impl Record {
    /// Field `key`; panics naming the record when absent (fixture data is known).
    pub fn get(&self, key: &str) -> &str {
        self.fields
            .get(key)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("{} record has no {key}: {self:?}", self.kind))
    }

    /// Field `key` as a number.
    pub fn num(&self, key: &str) -> u64 {
        let v = self.get(key);
        v.strip_prefix("0x")
            .map_or_else(|| v.parse(), |h| u64::from_str_radix(h, 16))
            .unwrap_or_else(|_| panic!("{key}={v} is not a number"))
    }
}

/// The double's state as the fixture wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// Every record in file order.
    pub records: Vec<Record>,
}

impl State {
    /// Parse state text (TAB-separated `key=value` after the record name; `#` comments).
    pub fn parse(text: &str) -> State {
        let records = text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                let mut it = l.split('\t');
                let kind = it.next().unwrap_or_default().to_string();
                let fields =
                    it.filter_map(|f| f.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
                Record { kind, fields }
            })
            .collect();
        State { records }
    }

    /// The state of the double placed in fixture root `root`.
    pub fn of(root: &Path) -> Result<State> {
        let p = state_dir(root).join("state.tsv");
        let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        Ok(State::parse(&text))
    }

    /// Records of one kind, in file order.
    pub fn all<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Record> + 'a {
        self.records.iter().filter(move |r| r.kind == kind)
    }

    /// GPU records in index order.
    pub fn gpus(&self) -> Vec<&Record> {
        let mut g: Vec<&Record> = self.all("gpu").collect();
        g.sort_by_key(|r| r.num("index"));
        g
    }

    /// MIG records of GPU `gpu`, in MIG index order.
    pub fn migs(&self, gpu: u64) -> Vec<&Record> {
        let mut m: Vec<&Record> = self.all("mig").filter(|r| r.num("gpu") == gpu).collect();
        m.sort_by_key(|r| r.num("index"));
        m
    }

    /// The `gi` record of GPU instance `gi` on GPU `gpu`.
    pub fn gi(&self, gpu: u64, gi: u64) -> Option<&Record> {
        self.all("gi").find(|r| r.num("gpu") == gpu && r.num("id") == gi)
    }

    /// The UUID of GPU `index`.
    pub fn gpu_uuid(&self, index: u64) -> String {
        self.gpus().iter().find(|r| r.num("index") == index).map(|r| r.get("uuid").to_string()).expect("GPU exists")
    }
}

/// `<root>/nvml-double`.
pub fn state_dir(root: &Path) -> PathBuf {
    root.join("nvml-double")
}

fn append(root: &Path, file: &str, line: &str) -> Result<()> {
    let dir = state_dir(root);
    if !dir.join("state.tsv").is_file() {
        bail!("{} has no NVML double (no nvml-double/state.tsv)", root.display());
    }
    let p = dir.join(file);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&p)
        .with_context(|| format!("opening {}", p.display()))?;
    // One write per line: the double reads only whole lines.
    f.write_all(format!("{line}\n").as_bytes()).with_context(|| format!("writing {}", p.display()))
}

/// Raise Xid `xid` on the GPU or MIG device with UUID `uuid`: every event set of the double in
/// that root that registered the GPU delivers it (nvmlEventSetWait_v2).
pub fn raise_xid(root: &Path, uuid: &str, xid: u64) -> Result<()> {
    append(root, "events", &format!("xid\tuuid={uuid}\txid={xid}"))
}

/// Set the uncorrected ECC error count of the GPU with UUID `uuid` to `count` (what
/// nvmlDeviceGetTotalEccErrors answers for it from now on, volatile and aggregate).
pub fn set_uncorrected_ecc(root: &Path, uuid: &str, count: u64) -> Result<()> {
    append(root, "ecc", &format!("ecc\tuuid={uuid}\tuncorrected={count}"))
}

/// Make every nvmlInit from now on take `ms` milliseconds (as on a node without persistence
/// mode, where nvmlInit initialises each GPU); 0 makes it immediate again.
pub fn set_init_delay(root: &Path, ms: u64) -> Result<()> {
    let dir = state_dir(root);
    if !dir.join("state.tsv").is_file() {
        bail!("{} has no NVML double (no nvml-double/state.tsv)", root.display());
    }
    let p = dir.join("init_ms");
    std::fs::write(&p, format!("{ms}\n")).with_context(|| format!("writing {}", p.display()))
}

/// Make the GPU with UUID `uuid` refuse Xid event registration (NVML_ERROR_NOT_SUPPORTED, as a
/// GPU without Xid events answers).
pub fn refuse_events(root: &Path, uuid: &str) -> Result<()> {
    append(root, "no_events", uuid)
}

/// Make the GPU with UUID `uuid` answer every query with NVML_ERROR_GPU_IS_LOST.
pub fn lose_gpu(root: &Path, uuid: &str) -> Result<()> {
    append(root, "lost", uuid)
}

/// Undo [`lose_gpu`] for `uuid`.
pub fn recover_gpu(root: &Path, uuid: &str) -> Result<()> {
    let p = state_dir(root).join("lost");
    let text = std::fs::read_to_string(&p).unwrap_or_default();
    let kept: String = text.lines().filter(|l| *l != uuid).map(|l| format!("{l}\n")).collect();
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, kept).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &p).with_context(|| format!("replacing {}", p.display()))
}

/// Switch GPU `gpu_index` of the prepared fixture `root` to MIG mode, as an administrator's
/// `nvidia-smi -i N -mig 1` (and GPU reset) does: its `gpu` record says `mig=enabled`; every
/// other line of `nvml-double/state.tsv` is kept. Written as the double writes the file (under
/// the flock on `state.lock`, into a temporary file renamed over it), so a process that has the
/// double loaded sees it at its next nvmlInit. Errors: no double, no such GPU, or I/O.
pub fn enable_mig(root: &Path, gpu_index: u32) -> Result<()> {
    let dir = state_dir(root);
    let path = dir.join("state.tsv");
    let lock_path = dir.join("state.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("opening {}", lock_path.display()))?;
    lock.lock().with_context(|| format!("locking {}", lock_path.display()))?;
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let index = format!("index={gpu_index}");
    let mut found = false;
    let out: String = text
        .lines()
        .map(|l| {
            let mut fields: Vec<&str> = l.split('\t').collect();
            if fields.first() == Some(&"gpu") && fields.contains(&index.as_str()) {
                found = true;
                for f in &mut fields {
                    if f.starts_with("mig=") {
                        *f = "mig=enabled";
                    }
                }
            }
            fields.join("\t") + "\n"
        })
        .collect();
    if !found {
        bail!("{} has no gpu record with {index}", path.display());
    }
    let tmp = dir.join(".state.tsv.enable_mig.tmp");
    std::fs::write(&tmp, out).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("replacing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn giprofile_placements_parse_as_fields() {
        let s = State::parse(
            "giprofile\tgpu=all\tindex=2\tid=9\tslices=3\tname=3g.40gb\tplacements=0,4\tplacement_size=4\n",
        );
        let p = s.all("giprofile").next().unwrap();
        assert_eq!((p.get("placements"), p.num("placement_size"), p.num("id")), ("0,4", 4, 9));
    }

    #[test]
    fn enable_mig_changes_only_that_gpus_mode() -> Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir(state_dir(dir.path()))?;
        let text = "# comment\nsystem\tdriver=1\ngpu\tindex=0\tmig=disabled\tcc=9.0\ngpu\tindex=1\tmig=disabled\ngi\tgpu=0\tid=1\n";
        std::fs::write(state_dir(dir.path()).join("state.tsv"), text)?;
        enable_mig(dir.path(), 1)?;
        let after = std::fs::read_to_string(state_dir(dir.path()).join("state.tsv"))?;
        assert_eq!(after, text.replace("index=1\tmig=disabled", "index=1\tmig=enabled"));
        assert!(enable_mig(dir.path(), 7).is_err());
        Ok(())
    }
}
