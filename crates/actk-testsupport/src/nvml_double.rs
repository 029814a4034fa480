//! The NVML test double of the fixture roots (fixtures/nvml-double/libnvidia-ml.c): its state
//! file read back for tests to compare discovery with, and the knobs a test turns while a
//! process has it loaded.
//!
//! - [`State::of`]: the records of `<root>/nvml-double/state.tsv` (what the double answers);
//! - [`raise_xid`]: append an Xid event the double delivers to event sets created before;
//! - [`lose_gpu`] / [`recover_gpu`]: make every query of a GPU answer GPU_IS_LOST, and undo it.

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
