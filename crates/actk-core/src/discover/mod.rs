//! Discovery: reading a host root into an [`Inventory`], driven by profiles (DESIGN.md
//! "Vendor profiles").
//!
//! [`discover`] runs, for each profile in order, the code its `discovery` names: the
//! profile-driven [`generic`] reader (character nodes matching `devices.node` plus sysfs
//! attributes) or a small vendor enricher ([`nvidia`], [`neuron`], [`amd`], [`gaudi`]). Then
//! shared control nodes and host files (driver libraries through the host's ld.so.cache, tools,
//! firmware; see [`hostfiles`]) are added for each vendor that has devices.
//!
//! Every read goes through [`HostRoot`], which resolves symlinks *inside* the root (an absolute
//! link target restarts at the root, `..` stops at it), so a driver-container root such as
//! /run/nvidia/driver or a fixture can never make discovery read the real host's files.
//! Discovery never fails: odd things become [`Warning`]s naming the path.

pub mod amd;
pub mod gaudi;
pub mod generic;
pub mod hostfiles;
pub mod neuron;
pub mod nvidia;
pub mod nvml;

use crate::inventory::{DeviceNode, Inventory, VendorInventory, Warning};
use crate::profile::Profile;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsStr;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Most symlinks followed while resolving one path (Linux's MAXSYMLINKS is 40).
const MAX_SYMLINKS: usize = 40;

/// Longest host path resolved, in bytes (Linux's PATH_MAX with its NUL): a longer one fails with
/// `ENAMETOOLONG`, as openat2 would fail it. Resolving looks each of a path's directories up in
/// the memo by its whole path, so a path of 100 000 names (a root's ld.so.cache can hold one)
/// took over a minute.
const MAX_PATH: usize = 4096;

/// Most directory handles one [`HostRoot`] keeps open: half the process's soft limit of open
/// files (`RLIMIT_NOFILE`; 512 at the usual 1024), at most this many. A 64-GPU host's discovery
/// walks about 300 directories and a 256-device one over 1000; past the cap directories are
/// still walked with handles, closed after use, but every read below one walks its path again
/// (issue 31: a fixed cap of 512 made a 256-device node cost 4x per device what a 64-device
/// one did). Engines raise the limit (containerd and dockerd run with 1048576).
const MAX_CACHED_DIRS: usize = 8192;

/// The handle cap of a [`HostRoot`] made now: see [`MAX_CACHED_DIRS`].
fn dir_cap() -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    soft.map_or(MAX_CACHED_DIRS, |n| usize::try_from(n / 2).unwrap_or(MAX_CACHED_DIRS).clamp(64, MAX_CACHED_DIRS))
}

/// A host root: `/`, a fixture directory, or a driver container's root. Paths given to its
/// methods are absolute paths *as seen on that host* (`/sys/class/neuron_device`).
///
/// Resolution walks one name at a time from `O_PATH` handles of the directories already
/// resolved (`openat`/`fstatat`/`readlinkat` relative to them, never following a link in the
/// kernel), so each step is a lookup of one name rather than of the whole host path again, and
/// symlinks are followed here, inside the root. Reads and listings first try the whole rest of
/// the path in one openat2(2) from the nearest resolved directory with `RESOLVE_NO_SYMLINKS |
/// RESOLVE_BENEATH` (the kernel refuses any symlink on the way, and `..`). When that meets a
/// symlink, a read, a link's name and a directory check that need no resolved path ask the
/// kernel to resolve in the root instead (`RESOLVE_IN_ROOT`, the same rule: absolute links and
/// `..` stay in the root; magic links refused), from the read's parent directory, which is
/// kept for its siblings; only what needs the resolved path (a library's mount source, a
/// device node's host path) or what the kernel cannot answer alike is walked.
#[derive(Debug)]
pub struct HostRoot {
    root: PathBuf,
    cache: Mutex<DirCache>,
    /// Whether openat2(2) may be tried: cleared on `ENOSYS` (kernels before 5.6) and `EPERM`
    /// (a seccomp profile that predates it), after which every path is walked.
    openat2: AtomicBool,
    /// Most handles (and memo entries of each kind) kept: [`dir_cap`].
    max_dirs: usize,
}

/// What one discovery pass has resolved. A HostRoot lives for one pass ([`discover`]), so
/// entries cannot go stale. Keys are paths' bytes: hashing a `Path` parses its components.
#[derive(Debug, Default)]
struct DirCache {
    /// Directories as asked (`/sys/bus/pci/devices/0000:1b:00.0`) -> resolution and handle.
    /// Discovery reads several files in each of many directories (procfs and sysfs per GPU,
    /// library directories); without this every read resolved every component again, which
    /// made 64 GPUs cost 2.3x the instructions of 8 (benches/discovery.rs).
    asked: PathMap<(PathBuf, Arc<OwnedFd>)>,
    /// Resolved directories (no symlink in them; `/` is the root) -> `O_PATH` handle.
    fds: PathMap<Arc<OwnedFd>>,
    /// Directories as asked that do not exist (`ENOENT`): profiles name many optional ones.
    missing: std::collections::HashSet<std::ffi::OsString, foldhash::fast::RandomState>,
    /// Directory listings as asked (`/dev` is globbed by several profiles' patterns).
    listings: PathMap<Vec<String>>,
    /// Directories as asked -> `O_PATH` handle, opened by the kernel resolving in the root
    /// ([`HostRoot::dir_in_root`]): the files read in a sysfs device directory reached through
    /// links (`/sys/class/neuron_device/neuron5`) open from it in one call each.
    in_root: PathMap<Arc<OwnedFd>>,
}

impl DirCache {
    /// Empty, with room for what a one-node discovery puts in it: growing the maps by doubling
    /// cost a DGX H100 create about 24 k instructions of rehashing (issue 31). Room is only
    /// allocated, not written, until used.
    fn sized() -> DirCache {
        DirCache {
            asked: PathMap::with_capacity_and_hasher(64, Default::default()),
            fds: PathMap::with_capacity_and_hasher(64, Default::default()),
            missing: std::collections::HashSet::with_capacity_and_hasher(32, Default::default()),
            listings: PathMap::with_capacity_and_hasher(16, Default::default()),
            in_root: PathMap::default(),
        }
    }
}

/// A map keyed by a path's bytes, hashed with foldhash rather than the default SipHash: every
/// file a discovery pass reads looks its directory up here, and SipHash of the path was a
/// tenth of an AMD CPX start (issue 31). Keys are host paths discovery asks for, not input
/// a container controls, and the hasher is seeded per process.
type PathMap<V> = HashMap<std::ffi::OsString, V, foldhash::fast::RandomState>;

/// Where a path resolved: a directory reached as such (the root, a `..`, or a directory
/// asked for), or a named entry of a resolved directory with its `lstat`.
enum Found {
    Dir(PathBuf, Arc<OwnedFd>),
    Entry { dir: PathBuf, fd: Arc<OwnedFd>, name: std::ffi::OsString, stat: rustix::fs::Stat },
}

impl Found {
    fn path(self) -> PathBuf {
        match self {
            Found::Dir(p, _) => p,
            Found::Entry { mut dir, name, .. } => {
                dir.push(name);
                dir
            }
        }
    }
}

/// How the walk treats the last name: as a directory (opened as a handle), or as an entry
/// (`lstat`ed; a symlink there followed when `follow`). With `link_first` the asked last name,
/// when followed, is read as a link before it is `lstat`ed: one call for a link (and for a
/// missing name), two for anything else, where lstat-then-readlink takes two for a link. Link
/// targets are `lstat`ed first again (a soname link's target is the versioned file).
#[derive(Clone, Copy)]
enum Last {
    Dir,
    Entry { follow: bool, link_first: bool },
}

impl Clone for HostRoot {
    /// A clone starts with an empty cache.
    fn clone(&self) -> Self {
        HostRoot::new(self.root.clone())
    }
}

/// A byte searcher that needs no CPU feature detection ([`ByteFinder::new`]), for discovery's
/// searches in paths and procfs lines.
///
/// memchr's top-level functions pick an AVX2 or SSE2 routine at their first call by asking the
/// CPU (`std_detect`: ten CPUID instructions), and CPUID traps to the hypervisor in a VM (0.9 µs
/// each on the CI machine): a container start paid that for strings of a few dozen bytes
/// (issue 31). SSE2 is part of x86-64 itself, so memchr's SSE2 searcher is used there without
/// asking. Elsewhere memchr's own functions, which ask nothing on aarch64 (NEON is part of it).
#[derive(Clone, Copy)]
pub(crate) struct ByteFinder {
    needle: u8,
    /// memchr's SSE2 searcher: always there on x86-64 (the x86_64 targets enable SSE2, which
    /// memchr checks at compile time).
    #[cfg(target_arch = "x86_64")]
    sse2: Option<memchr::arch::x86_64::sse2::memchr::One>,
}

impl ByteFinder {
    /// A searcher for `needle`.
    pub(crate) fn new(needle: u8) -> Self {
        ByteFinder {
            needle,
            #[cfg(target_arch = "x86_64")]
            sse2: memchr::arch::x86_64::sse2::memchr::One::new(needle),
        }
    }

    /// The position of the first `needle` in `haystack`.
    pub(crate) fn find(&self, haystack: &[u8]) -> Option<usize> {
        #[cfg(target_arch = "x86_64")]
        if let Some(f) = &self.sse2 {
            return f.find(haystack);
        }
        memchr::memchr(self.needle, haystack)
    }

    /// The position of the last `needle` in `haystack`.
    pub(crate) fn rfind(&self, haystack: &[u8]) -> Option<usize> {
        #[cfg(target_arch = "x86_64")]
        if let Some(f) = &self.sse2 {
            return f.rfind(haystack);
        }
        memchr::memrchr(self.needle, haystack)
    }
}

/// An absolute path of plain names only (`/sys/bus/pci/devices/X/numa_node`): its parent is
/// a memo key as it stands.
fn is_plain(path: &Path) -> bool {
    path.is_absolute() && path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// The parent and last name of `path` when it is canonical: `/`, then names separated by single
/// `/`s, none of them `.` or `..`, nothing after the last name. Such a path [`is_plain`], and
/// these are what `Path::parent` and `Path::file_name` give for it, found with one pass over
/// the bytes instead of std's component parser (which was a tenth of a discovery's
/// instructions; issue 31). `None` for any other path, the root included: callers then take
/// std's way.
fn canonical_split(path: &Path) -> Option<(&Path, &OsStr)> {
    let b = path.as_os_str().as_bytes();
    if b.len() < 2 || b[0] != b'/' {
        return None;
    }
    // Name by name: the byte after each `/` tells an empty name or one that may be `.` or
    // `..`, and the next `/` is found with memchr's SSE2 search (a byte loop over the whole
    // path was 600 instructions for a sysfs path of 50 bytes, every open of a discovery;
    // issue 31).
    let slashes = ByteFinder::new(b'/');
    let mut last = 0;
    loop {
        let start = last + 1;
        match b.get(start) {
            None | Some(b'/') => return None,
            Some(b'.') => {
                let name = &b[start..];
                if name == b"." || name == b".." || name.starts_with(b"./") || name.starts_with(b"../") {
                    return None;
                }
            }
            Some(_) => {}
        }
        match slashes.find(&b[start..]) {
            Some(i) => last = start + i,
            None => break,
        }
    }
    // `last` is the last `/` now (0 for a name right below the root).
    let parent = if last == 0 { &b[..1] } else { &b[..last] };
    Some((Path::new(OsStr::from_bytes(parent)), OsStr::from_bytes(&b[last + 1..])))
}

/// The parent and last name of a plain absolute path ([`canonical_split`], else std's parser
/// for an [`is_plain`] path such as `/a//b/`); `None` for any other path (`.`, `..`, relative,
/// the root), which callers walk from the root.
fn split_last(path: &Path) -> Option<(&Path, &OsStr)> {
    canonical_split(path).or_else(|| match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) if is_plain(path) => Some((parent, name)),
        _ => None,
    })
}

/// `Path::parent` ([`canonical_split`] first).
fn parent_of(path: &Path) -> Option<&Path> {
    canonical_split(path).map(|(p, _)| p).or_else(|| path.parent())
}

/// [`is_plain`] ([`canonical_split`] first).
fn plain(path: &Path) -> bool {
    canonical_split(path).is_some() || is_plain(path)
}

/// `path` as a `String`: `to_str` (which checks ASCII a word at a time) where it is UTF-8,
/// else `to_string_lossy` (which decodes a character at a time, 30 k instructions of a DGX
/// discovery for paths that were all ASCII; issue 31).
pub(crate) fn path_string(path: &Path) -> String {
    match path.to_str() {
        Some(s) => s.to_owned(),
        None => path.to_string_lossy().into_owned(),
    }
}

/// Where in `path` a name ends that sysfs makes a symlink, when `path` goes on below it: every
/// entry of `/sys/class/<class>/` and of `/sys/bus/<bus>/devices/` is one, to the device's
/// directory under `/sys/devices` (the kernel's sysfs-rules.rst). Such a path
/// (`/sys/bus/pci/devices/0000:05:00.0/product_name`) is not opened with symlinks refused from
/// above that entry: that try failed with `ELOOP` before every such read or listing, two system
/// calls of each AMD device's discovery (issue 31). Only a shortcut: either way the path
/// resolves in the root. The byte length of the entry's path (`/sys/class/drm/renderD128`).
fn sysfs_link_end(path: &Path) -> Option<usize> {
    let b = path.as_os_str().as_bytes();
    // Canonical paths only (single `/`s; any other simply takes the long way): a few byte
    // compares for the paths that are not below /sys, as every open asks.
    let slash = |from: usize| b[from..].iter().position(|&c| c == b'/').map(|i| from + i);
    // Where the entry's name starts: after `/sys/class/<class>/`, or `/sys/bus/<bus>/devices/`.
    let start = if b.starts_with(b"/sys/class/") {
        let class_end = slash(11)?;
        if class_end == 11 {
            return None;
        }
        class_end + 1
    } else if b.starts_with(b"/sys/bus/") {
        let bus_end = slash(9)?;
        if bus_end == 9 || !b[bus_end + 1..].starts_with(b"devices/") {
            return None;
        }
        bus_end + 1 + b"devices/".len()
    } else {
        return None;
    };
    let end = slash(start)?;
    (end > start && b[end..].iter().any(|&c| c != b'/')).then_some(end)
}

/// `pattern` with every `{index}` in it replaced by `index`: `str::replace` without its two-way
/// searcher, which it sets up for each call (600 instructions for a device path of a few dozen
/// bytes; a Neuron or Gaudi discovery fills three patterns a device; issue 31).
pub(crate) fn fill_index(pattern: &str, index: &str) -> String {
    const KEY: &str = "{index}";
    let mut out = String::with_capacity(pattern.len() + index.len());
    let mut rest = pattern;
    let brace = ByteFinder::new(b'{');
    while let Some(i) = brace.find(rest.as_bytes()) {
        out.push_str(&rest[..i]);
        if rest[i..].starts_with(KEY) {
            out.push_str(index);
            rest = &rest[i + KEY.len()..];
        } else {
            out.push('{');
            rest = &rest[i + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// `s` split around its last `byte` (ASCII), as `str::rsplit_once(char)` splits it: memchr's
/// search from the end where the char searcher took 260 instructions a call, for every
/// library's directory and every PCI id of a discovery (issue 31).
pub(crate) fn rsplit_once_byte(s: &str, byte: u8) -> Option<(&str, &str)> {
    debug_assert!(byte.is_ascii());
    let i = memchr::memrchr(byte, s.as_bytes())?;
    // An ASCII byte is a whole character: both sides are on character boundaries.
    Some((s.get(..i)?, s.get(i + 1..)?))
}

/// `path` + `/` + `name`, as `PathBuf::push` makes it for one relative name without a `/` (no
/// `/` after an empty `path` or one that ends in `/`), without its parsing of both: 450
/// instructions a call, twice for every library a discovery resolves (issue 31).
pub(crate) fn push_name(path: &mut PathBuf, name: &OsStr) {
    debug_assert!(!name.as_bytes().contains(&b'/') && !name.is_empty());
    let mut s = std::mem::take(path).into_os_string();
    s.reserve(name.len() + 1);
    if !s.is_empty() && !s.as_bytes().ends_with(b"/") {
        s.push("/");
    }
    s.push(name);
    *path = PathBuf::from(s);
}

/// `dir` + `/` + `name` (`format!("{dir}/{name}")` without the formatting machinery, 700
/// instructions a call, several calls a device; issue 31).
pub(crate) fn join_str(dir: &str, name: &str) -> String {
    let mut out = String::with_capacity(dir.len() + 1 + name.len());
    out.push_str(dir);
    out.push('/');
    out.push_str(name);
    out
}

/// Whether `path` names a file below sysfs's device, class, bus or module trees, plain (no
/// `.` or `..`): what [`crate::rawfile::read_sysfs_fd`] may read. Not the other file systems
/// mounted below /sys (debugfs, tracefs, securityfs, cgroupfs under /sys/fs), whose seq_files
/// may stop a read short before their end.
fn is_sysfs_attribute_path(path: &Path) -> bool {
    let b = path.as_os_str().as_bytes();
    [&b"/sys/class/"[..], b"/sys/bus/", b"/sys/devices/", b"/sys/module/"].iter().any(|p| b.starts_with(p))
        && plain(path)
}

/// `ENAMETOOLONG` for a path of [`MAX_PATH`] bytes or more.
fn check_len(path: &Path) -> io::Result<()> {
    if path.as_os_str().len() >= MAX_PATH {
        return Err(rustix::io::Errno::NAMETOOLONG.into());
    }
    Ok(())
}

/// The leading plain names of `rest` (components separated by `/`) that are directories on
/// the way: up to the first `.` or `..`, and without the last component unless `last_is_dir`.
/// Returns (byte length of that prefix, number of names).
fn plain_dirs(rest: &[u8], last_is_dir: bool) -> (usize, usize) {
    let (mut end, mut n, mut pos) = (0, 0, 0);
    loop {
        while rest.get(pos) == Some(&b'/') {
            pos += 1;
        }
        if pos >= rest.len() {
            return (end, n);
        }
        let stop = rest[pos..].iter().position(|&b| b == b'/').map_or(rest.len(), |i| pos + i);
        let name = &rest[pos..stop];
        let is_last = rest[stop..].iter().all(|&b| b == b'/');
        if name == b"." || name == b".." || (is_last && !last_is_dir) {
            return (end, n);
        }
        end = stop;
        n += 1;
        pos = stop;
    }
}

impl HostRoot {
    /// A host root at `root` (not checked here; a missing root simply has no devices). A
    /// relative `root` (`actk cdi generate --root fixture`) is made absolute against the working
    /// directory, so every host path discovery reports (and a CDI spec's `hostPath`) is absolute.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root: PathBuf = root.into();
        let root = if root.is_absolute() { root } else { std::path::absolute(&root).unwrap_or(root) };
        HostRoot { root, cache: Mutex::new(DirCache::sized()), openat2: AtomicBool::new(true), max_dirs: dir_cap() }
    }

    /// The root directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// How many directory handles this root keeps open ([`dir_cap`] at most).
    fn kept_handles(&self) -> usize {
        self.cache.lock().map_or(0, |c| c.fds.len() + c.in_root.len())
    }

    /// Whether this is the running system's own root (`/`), where the host's own NVML (the one
    /// on the loader's path) may be used: the root directory is the same directory as `/`
    /// (device and inode; `/`, a link to it, or `/` bind-mounted elsewhere). False when either
    /// cannot be stat'ed.
    ///
    /// Not `canonicalize() == "/"`: musl's realpath(3) reads every name of the path as a link
    /// and returns its result in memory from musl's own malloc, which a discovery then set up
    /// for that one string (two `brk`, a guard `mmap`, and their page faults; issue 31).
    pub fn is_system_root(&self) -> bool {
        match (rustix::fs::stat(&self.root), rustix::fs::stat("/")) {
            (Ok(root), Ok(system)) => root.st_dev == system.st_dev && root.st_ino == system.st_ino,
            _ => false,
        }
    }

    /// The real path of host path `path` without resolving anything (for messages and for
    /// paths already resolved by [`HostRoot::resolve`]).
    ///
    /// `Path::strip_prefix("/")` and `Path::join` with the bytes handled directly: std parses
    /// both paths into components for each, 1 300 instructions a call, 20 calls in a DGX
    /// discovery (issue 31). The result is the same: `path`'s leading `/`s dropped, what is
    /// left appended to the root after one `/` (none added when the root ends in one); the
    /// root alone when nothing is left. (One exception, of no use: an empty root, which
    /// [`HostRoot::new`] keeps when the working directory is gone, gives `/x` where std gave
    /// `x`; such a root opens nothing either way.)
    pub fn host_path(&self, path: impl AsRef<Path>) -> PathBuf {
        let path = path.as_ref().as_os_str().as_bytes();
        let rel = &path[path.iter().take_while(|&&b| b == b'/').count()..];
        if rel.is_empty() {
            return self.root.clone();
        }
        let root = self.root.as_os_str().as_bytes();
        let mut out = Vec::with_capacity(root.len() + 1 + rel.len());
        out.extend_from_slice(root);
        if !root.ends_with(b"/") {
            out.push(b'/');
        }
        out.extend_from_slice(rel);
        PathBuf::from(std::ffi::OsString::from_vec(out))
    }

    /// Resolve `path` (absolute, as seen on the host) inside the root, following every
    /// symlink with the root as `/`, like openat2(RESOLVE_IN_ROOT). Returns the resolved
    /// absolute host path (`/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05`); join it with
    /// [`HostRoot::host_path`] to read it.
    ///
    /// Errors: `NotFound` when a component is missing, `NotADirectory` when one is a file,
    /// `ELOOP`-like `Other` after [`MAX_SYMLINKS`] links. Discovery only reads host and driver
    /// roots that the admin chose, so the gap between resolving and opening by path is
    /// accepted here (the injection layer, which works on container roots, uses O_PATH handles
    /// throughout); this type's own reads open through the handles it resolved with.
    pub fn resolve(&self, path: impl AsRef<Path>) -> io::Result<PathBuf> {
        Ok(self.locate(path.as_ref(), true)?.path())
    }

    /// Like [`HostRoot::resolve`] but a symlink in the last component is not followed.
    pub fn resolve_parent(&self, path: impl AsRef<Path>) -> io::Result<PathBuf> {
        Ok(self.locate(path.as_ref(), false)?.path())
    }

    /// [`HostRoot::resolve`] with the `stat` of what the path resolved to (never a symlink):
    /// one walk where a resolve and a `stat` of the host path would walk twice.
    pub fn resolve_stat(&self, path: impl AsRef<Path>) -> io::Result<(PathBuf, rustix::fs::Stat)> {
        self.resolve_stat_as(path.as_ref(), false)
    }

    /// [`HostRoot::resolve_stat`] for a path whose last name is most often a symlink (an
    /// ld.so.cache entry is a soname link to the versioned file, `libcuda.so.1` ->
    /// `libcuda.so.580.95.05`): each last name on the way is read as a link first, one system
    /// call fewer per link. Same results and errors as `resolve_stat`.
    pub fn resolve_stat_link(&self, path: impl AsRef<Path>) -> io::Result<(PathBuf, rustix::fs::Stat)> {
        self.resolve_stat_as(path.as_ref(), true)
    }

    fn resolve_stat_as(&self, path: &Path, link_first: bool) -> io::Result<(PathBuf, rustix::fs::Stat)> {
        match self.locate_as(path, Last::Entry { follow: true, link_first })? {
            Found::Dir(p, fd) => Ok((p, rustix::fs::fstat(&*fd)?)),
            Found::Entry { mut dir, name, stat, .. } => {
                push_name(&mut dir, &name);
                Ok((dir, stat))
            }
        }
    }

    /// Where `path` resolves: its parent directory from the memo (plain paths), then the last
    /// name; other paths (`..`, `.`) are walked from the root.
    fn locate(&self, path: &Path, follow_last: bool) -> io::Result<Found> {
        self.locate_as(path, Last::Entry { follow: follow_last, link_first: false })
    }

    fn locate_as(&self, path: &Path, last: Last) -> io::Result<Found> {
        check_len(path)?;
        if let Some((parent, name)) = split_last(path) {
            let (dir, fd) = self.resolved_dir(parent)?;
            return self.walk(dir, fd, name.as_bytes(), last);
        }
        self.walk(PathBuf::from("/"), self.root_fd()?, path.as_os_str().as_bytes(), last)
    }

    /// The `O_PATH` handle of the root itself.
    fn root_fd(&self) -> io::Result<Arc<OwnedFd>> {
        if let Some(fd) = self.cache.lock().ok().and_then(|c| c.fds.get(OsStr::new("/")).cloned()) {
            return Ok(fd);
        }
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(&self.root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(self.keep_fd(Path::new("/"), fd))
    }

    /// Cache the handle of resolved directory `resolved` (while there is room) and share it.
    /// A directory already cached keeps its first handle and `fd` is closed: replacing it would
    /// leave the old one open in `asked` as well, past [`MAX_CACHED_DIRS`] handles (sysfs has
    /// several links into each device directory, each walked to it in its own openat2).
    fn keep_fd(&self, resolved: &Path, fd: OwnedFd) -> Arc<OwnedFd> {
        let Ok(mut c) = self.cache.lock() else { return Arc::new(fd) };
        if let Some(kept) = c.fds.get(resolved.as_os_str()) {
            return kept.clone();
        }
        let fd = Arc::new(fd);
        if c.fds.len() + c.in_root.len() < self.max_dirs {
            c.fds.insert(resolved.as_os_str().to_owned(), fd.clone());
        }
        fd
    }

    /// The handle of resolved directory `resolved` (after a `..`): from the cache, or opened
    /// from its nearest cached ancestor (the root at worst) without following any link (a
    /// resolved path has none): in one openat2, else name by name.
    fn dir_fd(&self, resolved: &Path) -> io::Result<Arc<OwnedFd>> {
        if let Some(fd) = self.cache.lock().ok().and_then(|c| c.fds.get(resolved.as_os_str()).cloned()) {
            return Ok(fd);
        }
        let (mut cur, mut fd) = self.nearest_kept(resolved)?;
        let rest = resolved.strip_prefix(&cur).map_err(|_| io::Error::other("not below its ancestor"))?.to_owned();
        if self.openat2.load(Ordering::Relaxed) {
            use rustix::fs::{Mode, OFlags, ResolveFlags};
            let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
            let how = ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH;
            match rustix::fs::openat2(&*fd, &rest, flags, Mode::empty(), how) {
                Ok(f) => return Ok(self.keep_fd(resolved, f)),
                Err(rustix::io::Errno::NOSYS | rustix::io::Errno::PERM) => self.openat2.store(false, Ordering::Relaxed),
                Err(_) => {} // walked below, with the error of the name that fails
            }
        }
        for name in rest.components().filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        }) {
            cur.push(name);
            fd = self.open_dir_at(&fd, &cur, name)?;
        }
        Ok(fd)
    }

    /// The nearest strict ancestor of resolved directory `resolved` whose handle is kept, and
    /// that handle (the root at worst).
    fn nearest_kept(&self, resolved: &Path) -> io::Result<(PathBuf, Arc<OwnedFd>)> {
        let cached = |p: &Path| self.cache.lock().ok().and_then(|c| c.fds.get(p.as_os_str()).cloned());
        match resolved.ancestors().skip(1).find_map(|a| Some((a, cached(a)?))) {
            Some((a, fd)) => Ok((a.to_path_buf(), fd)),
            None => Ok((PathBuf::from("/"), self.root_fd()?)),
        }
    }

    /// Open `name` in directory `fd` as an `O_PATH` directory handle for resolved path `cur`
    /// (cached). A symlink there fails with `ENOTDIR`, as does a file.
    fn open_dir_at(&self, fd: &OwnedFd, cur: &Path, name: &OsStr) -> io::Result<Arc<OwnedFd>> {
        use rustix::fs::{Mode, OFlags};
        if let Some(f) = self.cache.lock().ok().and_then(|c| c.fds.get(cur.as_os_str()).cloned()) {
            return Ok(f);
        }
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let f = rustix::fs::openat(fd, name, flags, Mode::empty())?;
        Ok(self.keep_fd(cur, f))
    }

    /// The resolution of directory `dir` (absolute) and its handle, memoised for plain paths
    /// (every ancestor too, so siblings share their walk). The ancestors not memoised yet are
    /// resolved from the nearest one that is (the root at worst) in a loop, not by recursing: a
    /// path of a few thousand names (one from a root's ld.so.cache) took a stack frame each and
    /// overflowed a 2 MiB thread stack.
    fn resolved_dir(&self, dir: &Path) -> io::Result<(PathBuf, Arc<OwnedFd>)> {
        check_len(dir)?;
        if let Some(hit) = self.memo_dir(dir) {
            return hit;
        }
        // `dir` and its ancestors up to the nearest memoised one, nearest first.
        let mut chain = vec![dir];
        let mut base = None;
        if plain(dir) {
            let mut ancestor = parent_of(dir);
            while let Some(a) = ancestor {
                match self.memo_dir(a) {
                    Some(Ok(hit)) => {
                        base = Some(hit);
                        break;
                    }
                    Some(Err(e)) => {
                        self.remember_missing(&chain);
                        return Err(e);
                    }
                    None => {
                        chain.push(a);
                        ancestor = parent_of(a);
                    }
                }
            }
        }
        for i in (0..chain.len()).rev() {
            let d = chain[i];
            let found = match (base.take(), canonical_split(d).map(|(_, n)| n).or_else(|| d.file_name())) {
                (Some((pdir, pfd)), Some(name)) => self.walk(pdir, pfd, name.as_bytes(), Last::Dir),
                _ => self.resolve_dir_uncached(d),
            };
            // A walk for a directory ends at one (its last name is opened as a directory handle).
            let (p, fd) = match found {
                Ok(Found::Dir(p, fd)) => (p, fd),
                Ok(Found::Entry { .. }) => return Err(rustix::io::Errno::NOTDIR.into()),
                Err(e) => {
                    if e.kind() == io::ErrorKind::NotFound {
                        self.remember_missing(&chain[..=i]);
                    }
                    return Err(e);
                }
            };
            // Only while handles are still cached: past that, an entry here would keep one open.
            if let Ok(mut c) = self.cache.lock()
                && c.asked.len() < self.max_dirs
                && c.fds.len() + c.in_root.len() < self.max_dirs
            {
                c.asked.insert(d.as_os_str().to_owned(), (p.clone(), fd.clone()));
                // A resolved path (no symlink in it) resolves to itself: asked for later (a
                // caller that resolved a directory once and reads below it), it is a memo hit
                // and the base of an openat2, not a climb of every ancestor to the root.
                if p.as_path() != d {
                    c.asked.entry(p.as_os_str().to_owned()).or_insert_with(|| (p.clone(), fd.clone()));
                }
            }
            base = Some((p, fd));
        }
        base.ok_or_else(|| io::Error::other("no directory resolved"))
    }

    /// What the memo says of directory `dir` as asked: its resolution, `NotFound` when it is
    /// known to be missing, `None` when it has not been resolved yet.
    fn memo_dir(&self, dir: &Path) -> Option<io::Result<(PathBuf, Arc<OwnedFd>)>> {
        let c = self.cache.lock().ok()?;
        if let Some(p) = c.asked.get(dir.as_os_str()) {
            return Some(Ok(p.clone()));
        }
        c.missing.contains(dir.as_os_str()).then(|| Err(rustix::io::Errno::NOENT.into()))
    }

    /// Remember directories `dirs` (as asked) as missing, while there is room.
    fn remember_missing(&self, dirs: &[&Path]) {
        if let Ok(mut c) = self.cache.lock() {
            for d in dirs {
                if c.missing.len() >= self.max_dirs {
                    break;
                }
                c.missing.insert(d.as_os_str().to_owned());
            }
        }
    }

    /// Resolve directory `dir` without its ancestors' memo: the root, or a whole path (`..`,
    /// `.`, relative) walked from the root.
    fn resolve_dir_uncached(&self, dir: &Path) -> io::Result<Found> {
        if dir.as_os_str() == "/" {
            return Ok(Found::Dir(PathBuf::from("/"), self.root_fd()?));
        }
        self.walk(PathBuf::from("/"), self.root_fd()?, dir.as_os_str().as_bytes(), Last::Dir)
    }

    /// The resolution of directory `path` (as [`HostRoot::resolve`] gives it, memoised per
    /// pass). Errors: as `resolve`, and `NotADirectory` when it is not a directory.
    pub fn resolve_dir(&self, path: impl AsRef<Path>) -> io::Result<PathBuf> {
        Ok(self.resolved_dir(path.as_ref())?.0)
    }

    /// Resolve the names in `todo` (path components separated by `/`) one by one starting at
    /// resolved directory `cur` (handle `fd`), following symlinks inside the root (the last
    /// one as `last` says). A link's target is put in front of what is left, and an absolute
    /// one restarts at the root; `..` stops at the root.
    fn walk(&self, mut cur: PathBuf, mut fd: Arc<OwnedFd>, todo: &[u8], mut last: Last) -> io::Result<Found> {
        use rustix::fs::{AtFlags, FileType};
        let mut links = 0;
        let mut todo: std::borrow::Cow<'_, [u8]> = todo.into();
        let mut pos = 0;
        // After a `..`, `cur` names the parent but `fd` is still the handle of where the walk
        // was: the parent's handle is opened only when something is looked up in it (issue 31:
        // sysfs's `device` links climb three directories and name a fourth, which opened three
        // handles, each kept, where one openat2 from a kept ancestor reaches the fourth).
        let mut stale = false;
        loop {
            while todo.get(pos) == Some(&b'/') {
                pos += 1;
            }
            if pos >= todo.len() {
                if stale {
                    fd = self.dir_fd(&cur)?;
                }
                return Ok(Found::Dir(cur, fd));
            }
            // Several plain names ahead (a link's target after its leading `..`s, as sysfs's
            // ../../../devices/pci0000:00/0000:00:01.1/.../0000:1b:00.0): one openat2 for the
            // directories among them, refusing any symlink; a symlink there walks name by name.
            let dirs_end = plain_dirs(&todo[pos..], matches!(last, Last::Dir));
            if dirs_end.1 >= 2 && self.openat2.load(Ordering::Relaxed) {
                use rustix::fs::{Mode, OFlags, ResolveFlags};
                use rustix::io::Errno;
                let rel = OsStr::from_bytes(&todo[pos..pos + dirs_end.0]);
                // No O_NOFOLLOW: with O_PATH it would open a last-name symlink itself (ENOTDIR
                // here); without it RESOLVE_NO_SYMLINKS refuses that one too (ELOOP).
                let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
                let how = ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH;
                // With `cur` not opened yet (after `..`), from its nearest kept ancestor: `cur`
                // is resolved, so the names between them are plain directories too.
                let opened = if stale {
                    let kept = self.cache.lock().ok().and_then(|c| c.fds.get(cur.as_os_str()).cloned());
                    let (base, bfd) = match kept {
                        Some(f) => (cur.clone(), f),
                        None => self.nearest_kept(&cur)?,
                    };
                    let mut path =
                        cur.strip_prefix(&base).map_err(|_| io::Error::other("not below its ancestor"))?.to_owned();
                    path.push(rel);
                    rustix::fs::openat2(&*bfd, &path, flags, Mode::empty(), how)
                } else {
                    rustix::fs::openat2(&*fd, rel, flags, Mode::empty(), how)
                };
                match opened {
                    Ok(f) => {
                        for name in rel.as_bytes().split(|&b| b == b'/').filter(|n| !n.is_empty()) {
                            push_name(&mut cur, OsStr::from_bytes(name));
                        }
                        fd = self.keep_fd(&cur, f);
                        stale = false;
                        pos += dirs_end.0;
                        continue;
                    }
                    Err(Errno::LOOP | Errno::XDEV | Errno::AGAIN) => {}
                    Err(Errno::NOSYS | Errno::PERM) => self.openat2.store(false, Ordering::Relaxed),
                    // Missing or not a directory: no symlink came before it, so the walk would
                    // stop at the same name.
                    Err(e) => return Err(e.into()),
                }
            }
            let end = todo[pos..].iter().position(|&b| b == b'/').map_or(todo.len(), |i| pos + i);
            let (start, name_end) = (pos, end);
            pos = end;
            let is_last = todo[pos..].iter().all(|&b| b == b'/');
            let name = OsStr::from_bytes(&todo[start..name_end]);
            if name == "." {
                continue;
            }
            if name == ".." {
                // Stops at "/": `..` never leaves the root.
                stale |= cur.pop();
                continue;
            }
            if stale {
                fd = self.dir_fd(&cur)?;
                stale = false;
            }
            let target = match (is_last, last) {
                (true, Last::Entry { follow: true, link_first: true }) => {
                    match rustix::fs::readlinkat(&*fd, name, Vec::new()) {
                        Ok(t) => t,
                        // Not a link: what it is.
                        Err(rustix::io::Errno::INVAL) => {
                            let stat = rustix::fs::statat(&*fd, name, AtFlags::SYMLINK_NOFOLLOW)?;
                            return Ok(Found::Entry { dir: cur, fd, name: name.to_owned(), stat });
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                (true, Last::Entry { follow, .. }) => {
                    let stat = rustix::fs::statat(&*fd, name, AtFlags::SYMLINK_NOFOLLOW)?;
                    if FileType::from_raw_mode(stat.st_mode) != FileType::Symlink || !follow {
                        return Ok(Found::Entry { dir: cur, fd, name: name.to_owned(), stat });
                    }
                    rustix::fs::readlinkat(&*fd, name, Vec::new())?
                }
                _ => {
                    push_name(&mut cur, name);
                    match self.open_dir_at(&fd, &cur, name) {
                        Ok(f) => {
                            fd = f;
                            continue;
                        }
                        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error()) => {
                            cur.pop();
                            // A symlink, or a file where a directory should be.
                            match rustix::fs::readlinkat(&*fd, name, Vec::new()) {
                                Ok(t) => t,
                                Err(rustix::io::Errno::INVAL) => return Err(e),
                                Err(e) => return Err(e.into()),
                            }
                        }
                        Err(e) => return Err(e),
                    }
                }
            };
            links += 1;
            // A link's target is most often the file itself (libcuda.so.1 -> libcuda.so.580.95.05).
            if let Last::Entry { follow, .. } = last {
                last = Last::Entry { follow, link_first: false };
            }
            if links > MAX_SYMLINKS {
                return Err(io::Error::other(format!(
                    "too many levels of symbolic links at {}",
                    cur.join(name).display()
                )));
            }
            let target = target.into_bytes();
            if target.first() == Some(&b'/') {
                cur = PathBuf::from("/");
                fd = self.root_fd()?;
            }
            let mut next = target;
            next.push(b'/');
            next.extend_from_slice(&todo[pos..]);
            todo = next.into();
            pos = 0;
        }
    }

    /// Read a text file at host path `path` (resolved in the root).
    pub fn read_to_string(&self, path: impl AsRef<Path>) -> io::Result<String> {
        let bytes = self.read(path)?;
        String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Read a whole file at host path `path` (resolved in the root).
    pub fn read(&self, path: impl AsRef<Path>) -> io::Result<Vec<u8>> {
        let path = path.as_ref();
        let fd = self.open(path)?;
        // procfs and sysfs files report size 0, and std's read_to_end on a File asks the size
        // first (fstat and lseek on every file, about a fifth of discovery's system calls):
        // plain reads until the end ([`crate::rawfile::read_fd`]). A sysfs attribute's short
        // first read is its end (`read_sysfs_fd`): a Neuron device's three attributes were
        // twelve system calls, now nine (issue 31).
        if is_sysfs_attribute_path(path) { crate::rawfile::read_sysfs_fd(&fd) } else { crate::rawfile::read_fd(&fd) }
    }

    /// Open plain absolute path `path` with `flags` in one openat2(2) from its nearest resolved
    /// directory (memoised by the walk or by [`HostRoot::dir_in_root`]; the root at worst),
    /// refusing every symlink and `..` on the way. `None` when the path has a symlink (the caller
    /// walks it), is not plain, or openat2 is unavailable; other errors (`ENOENT`, `ENOTDIR`)
    /// are the path's own, as no link came before them, and a path of [`MAX_PATH`] bytes or
    /// more fails with `ENAMETOOLONG` before any look-up.
    fn open_beneath(&self, path: &Path, flags: rustix::fs::OFlags) -> Option<io::Result<OwnedFd>> {
        use rustix::fs::ResolveFlags;
        if let Err(e) = check_len(path) {
            return Some(Err(e));
        }
        if !self.openat2.load(Ordering::Relaxed) || !plain(path) {
            return None;
        }
        // Below a sysfs link entry, only a kept directory at or below the entry can be the start.
        let link_end = sysfs_link_end(path).unwrap_or(0);
        let root = match self.root_fd() {
            Ok(fd) => fd,
            Err(e) => return Some(Err(e)),
        };
        // The nearest memoised ancestor, found on the path's bytes (a plain absolute path: its
        // ancestors are its prefixes up to a `/`); Path::parent and strip_prefix parse the
        // components again at every step, most of an open's instructions (issue 31).
        let (dir, rel) = {
            let cache = self.cache.lock().ok()?;
            let bytes = path.as_os_str().as_bytes();
            let full = bytes.len() - bytes.iter().rev().take_while(|&&b| b == b'/').count();
            let mut end = full;
            loop {
                let slash = ByteFinder::new(b'/').rfind(&bytes[..end])?;
                let rel = OsStr::from_bytes(&bytes[slash + 1..full]);
                let a_end = slash - bytes[..slash].iter().rev().take_while(|&&b| b == b'/').count();
                if a_end < link_end {
                    return None;
                }
                if a_end == 0 {
                    break (root, Path::new(rel));
                }
                let ancestor = OsStr::from_bytes(&bytes[..a_end]);
                if let Some(fd) = cache.asked.get(ancestor).map(|(_, fd)| fd).or_else(|| cache.in_root.get(ancestor)) {
                    break (fd.clone(), Path::new(rel));
                }
                end = a_end;
            }
        };
        // No O_NOFOLLOW: RESOLVE_NO_SYMLINKS refuses a symlink in the last name as well (ELOOP),
        // where O_NOFOLLOW with O_DIRECTORY would fail it as ENOTDIR.
        self.openat2_at(&dir, rel, flags, ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH)
    }

    /// openat2(2) of `rel` below `dir` with `flags` (and `O_CLOEXEC`) and `how`. `None` where the
    /// walk must answer instead: a symlink refused or a loop (`ELOOP`), a magic link (`EXDEV`),
    /// a race with a rename (`EAGAIN`), and openat2 unavailable (`ENOSYS`, or `EPERM` from a
    /// seccomp profile that predates it: it is not tried again); other errors are `rel`'s own.
    fn openat2_at(
        &self,
        dir: &OwnedFd,
        rel: &Path,
        flags: rustix::fs::OFlags,
        how: rustix::fs::ResolveFlags,
    ) -> Option<io::Result<OwnedFd>> {
        use rustix::fs::{Mode, OFlags};
        use rustix::io::Errno;
        match rustix::fs::openat2(dir, rel, flags | OFlags::CLOEXEC, Mode::empty(), how) {
            Ok(fd) => Some(Ok(fd)),
            Err(Errno::LOOP | Errno::XDEV | Errno::AGAIN) => None,
            Err(Errno::NOSYS | Errno::PERM) => {
                self.openat2.store(false, Ordering::Relaxed);
                None
            }
            Err(e) => Some(Err(e.into())),
        }
    }

    /// Open host path `path` with `flags` in one openat2(2) from the root with
    /// `RESOLVE_IN_ROOT`: the kernel follows every symlink on the way with the root as `/` and
    /// stops `..` there, as [`HostRoot::walk`] does, without the walk's look-ups and handles
    /// (issue 31: a sysfs attribute behind the class link and the `device` link cost a Gaudi
    /// device's discovery 25 k instructions walked). Magic links (`/proc/self/...`) are refused
    /// (`RESOLVE_NO_MAGICLINKS`). `None` where the walk must answer: openat2 unavailable, a loop
    /// or too many links (the walk's own error), a magic link, a race with a rename (`EAGAIN`);
    /// other errors (`ENOENT`, `ENOTDIR`) are the path's, as the walk would find them.
    fn open_in_root(&self, path: &Path, flags: rustix::fs::OFlags) -> Option<io::Result<OwnedFd>> {
        use rustix::fs::ResolveFlags;
        if let Err(e) = check_len(path) {
            return Some(Err(e));
        }
        if !self.openat2.load(Ordering::Relaxed) {
            return None;
        }
        let root = match self.root_fd() {
            Ok(fd) => fd,
            Err(e) => return Some(Err(e)),
        };
        let rel = path.strip_prefix("/").unwrap_or(path);
        let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
        self.openat2_at(&root, rel, flags, ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS)
    }

    /// The `O_PATH` handle of directory `dir` (as asked) opened by the kernel resolving in the
    /// root, memoised while there is room ([`HostRoot::open_in_root`]; `None` as there).
    fn dir_in_root(&self, dir: &Path) -> Option<io::Result<Arc<OwnedFd>>> {
        use rustix::fs::OFlags;
        if let Some(fd) = self.cache.lock().ok().and_then(|c| c.in_root.get(dir.as_os_str()).cloned()) {
            return Some(Ok(fd));
        }
        let fd = match self.open_in_root(dir, OFlags::PATH | OFlags::DIRECTORY)? {
            Ok(fd) => Arc::new(fd),
            Err(e) => return Some(Err(e)),
        };
        // Within the one cap of kept handles (see MAX_CACHED_DIRS).
        if let Ok(mut c) = self.cache.lock()
            && c.fds.len() + c.in_root.len() < self.max_dirs
        {
            c.in_root.insert(dir.as_os_str().to_owned(), fd.clone());
        }
        Some(Ok(fd))
    }

    /// Open `path` (its parent `dir` as asked, its plain last name `name`) with `flags`: the
    /// name in the parent's handle from [`HostRoot::dir_in_root`], refusing a symlink there,
    /// which is then opened whole in the root. `None` as [`HostRoot::open_in_root`].
    fn open_under_dir_in_root(
        &self,
        path: &Path,
        dir: &Path,
        name: &OsStr,
        flags: rustix::fs::OFlags,
    ) -> Option<io::Result<OwnedFd>> {
        use rustix::fs::ResolveFlags;
        let parent = match self.dir_in_root(dir)? {
            Ok(fd) => fd,
            Err(e) => return Some(Err(e)),
        };
        let how = ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH;
        self.openat2_at(&parent, Path::new(name), flags, how).or_else(|| self.open_in_root(path, flags))
    }

    /// Open host path `path` for reading, resolved in the root: in one openat2 when no symlink
    /// is on the way ([`HostRoot::open_beneath`]); else from its parent's handle opened by the
    /// kernel resolving in the root, memoised for the other files there
    /// ([`HostRoot::open_under_dir_in_root`]); otherwise walked, and what it resolves to is
    /// opened in its resolved directory with `O_NOFOLLOW`, so nothing outside the root is
    /// opened either way.
    pub fn open(&self, path: &Path) -> io::Result<OwnedFd> {
        use rustix::fs::{Mode, OFlags};
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        if let Some(r) = self.open_beneath(path, OFlags::RDONLY) {
            return r;
        }
        if let Some((dir, name)) = split_last(path)
            && let Some(r) = self.open_under_dir_in_root(path, dir, name, OFlags::RDONLY)
        {
            return r;
        }
        // A symlink on the way: the parent walked (and memoised), the last name opened in it.
        if let (Some(parent), Some(last)) = (path.parent(), path.file_name())
            && plain(path)
        {
            let (_, dir) = self.resolved_dir(parent)?;
            match rustix::fs::openat(&*dir, last, flags, Mode::empty()) {
                Ok(f) => return Ok(f),
                Err(rustix::io::Errno::LOOP) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(match self.locate(path, true)? {
            Found::Dir(_, fd) => rustix::fs::openat(&*fd, ".", flags, Mode::empty())?,
            Found::Entry { fd, name, .. } => rustix::fs::openat(&*fd, &name, flags, Mode::empty())?,
        })
    }

    /// Names of the entries of directory `path`, sorted.
    pub fn list_dir(&self, path: impl AsRef<Path>) -> io::Result<Vec<String>> {
        let key = path.as_ref().as_os_str();
        if let Some(names) = self.cache.lock().ok().and_then(|c| c.listings.get(key).cloned()) {
            return Ok(names);
        }
        let names = self.list_dir_uncached(path.as_ref())?;
        if let Ok(mut c) = self.cache.lock()
            && c.listings.len() < self.max_dirs
        {
            c.listings.insert(key.to_owned(), names.clone());
        }
        Ok(names)
    }

    /// The entries of directory `path` for which `keep` holds, sorted; not memoised (a
    /// library directory of thousands of entries, scanned for a few names, costs a string per
    /// entry kept rather than per entry). Errors: as [`HostRoot::list_dir`].
    pub fn list_dir_matching(&self, path: impl AsRef<Path>, keep: impl FnMut(&str) -> bool) -> io::Result<Vec<String>> {
        self.list_dir_filtered(path.as_ref(), keep)
    }

    fn list_dir_uncached(&self, path: &Path) -> io::Result<Vec<String>> {
        self.list_dir_filtered(path, |_| true)
    }

    fn list_dir_filtered(&self, path: &Path, mut keep: impl FnMut(&str) -> bool) -> io::Result<Vec<String>> {
        use rustix::fs::{Mode, OFlags};
        // No symlink on the way: one openat2 from the nearest kept directory. Else the kernel
        // resolves it in the root, as for a read (a DRM device's `drm` directory behind its
        // class link and its `device` link: 12 system calls walked, one here; issue 31), and
        // only what it cannot answer is walked.
        let flags = OFlags::RDONLY | OFlags::DIRECTORY;
        let dir = match self.open_beneath(path, flags).or_else(|| self.open_in_root(path, flags)) {
            Some(r) => r?,
            None => {
                let (_, fd) = self.resolved_dir(path)?;
                rustix::fs::openat(&*fd, ".", flags | OFlags::CLOEXEC, Mode::empty())?
            }
        };
        let mut names = Vec::new();
        // getdents64 into a buffer on the stack (rustix's Dir grows heap buffers per listing).
        crate::dirlist::for_each(&dir, |name, _| {
            if let Ok(name) = std::str::from_utf8(name)
                && keep(name)
            {
                names.push(name.to_string());
            }
        })?;
        names.sort();
        Ok(names)
    }

    /// The last component of the target of symlink `path` (sysfs `device` -> PCI bus id,
    /// `driver` -> driver name). The link itself is not followed beyond reading it.
    pub fn link_name(&self, path: impl AsRef<Path>) -> io::Result<String> {
        let path = path.as_ref();
        check_len(path)?;
        // The parent opened with the kernel resolving in the root (memoised), the link read
        // there; a path that is not plain ([`split_last`]) is walked.
        let in_root = split_last(path).and_then(|(dir, name)| Some((self.dir_in_root(dir)?, name)));
        let target = match in_root {
            Some((dir, name)) => rustix::fs::readlinkat(&*dir?, name, Vec::new())?,
            None => match self.locate(path, false)? {
                Found::Entry { fd, name, .. } => rustix::fs::readlinkat(&*fd, &name, Vec::new())?,
                Found::Dir(..) => return Err(rustix::io::Errno::INVAL.into()),
            },
        };
        let target = PathBuf::from(std::ffi::OsString::from_vec(target.into_bytes()));
        target
            .file_name()
            .and_then(OsStr::to_str)
            .map(str::to_string)
            .ok_or_else(|| io::Error::other(format!("link target {} has no name", target.display())))
    }

    /// Whether host path `path` resolves, in the root, to a directory: one openat2 with the
    /// kernel resolving in the root where it can ([`HostRoot::open_in_root`]), else
    /// [`HostRoot::resolve_dir`]'s walk.
    pub fn is_dir(&self, path: impl AsRef<Path>) -> bool {
        match self.dir_in_root(path.as_ref()) {
            Some(r) => r.is_ok(),
            None => self.resolve_dir(path).is_ok(),
        }
    }

    /// Whether host path `path` exists (after resolution in the root).
    pub fn exists(&self, path: impl AsRef<Path>) -> bool {
        self.locate(path.as_ref(), true).is_ok()
    }

    /// Stat the device node at host path `path` (resolved in the root) and describe it as
    /// seen at container path `path`. Errors: missing, or not a character/block device.
    pub fn device_node(&self, path: &str) -> io::Result<DeviceNode> {
        use rustix::fs::{FileType, major, minor};
        let (real, st) = self.resolve_stat(path)?;
        let node_type = match FileType::from_raw_mode(st.st_mode) {
            FileType::CharacterDevice => 'c',
            FileType::BlockDevice => 'b',
            _ => return Err(io::Error::other("not a device node")),
        };
        Ok(DeviceNode {
            path: path.to_string(),
            host_path: self.host_path(real),
            node_type,
            major: major(st.st_rdev),
            minor: minor(st.st_rdev),
            file_mode: Some(st.st_mode & 0o7777),
            gid: Some(st.st_gid),
        })
    }

    /// The majors /proc/devices lists for character driver `name`. Errors: /proc/devices
    /// unreadable.
    pub fn proc_devices_major(&self, name: &str) -> io::Result<Option<u32>> {
        let text = self.read_to_string("/proc/devices")?;
        let mut in_char = false;
        for line in text.lines() {
            if line.starts_with("Character devices") {
                in_char = true;
            } else if line.starts_with("Block devices") {
                in_char = false;
            } else if in_char
                && let Some((num, dev)) = line.trim().split_once(char::is_whitespace)
                && dev.trim() == name
            {
                return Ok(num.parse().ok());
            }
        }
        Ok(None)
    }
}

/// Collects warnings while discovering; each names the host path it is about.
#[derive(Debug, Default)]
pub struct Warnings(pub Vec<Warning>);

impl Warnings {
    /// Record `message` about host path `path` (as the real path under the root).
    pub fn add(&mut self, host: &HostRoot, path: impl AsRef<Path>, message: impl Into<String>) {
        self.add_real(host.host_path(path), message);
    }

    /// [`Warnings::add`] for a path that is already the real one (a library NVML was loaded
    /// from), which is not joined to the root again.
    pub fn add_real(&mut self, real: PathBuf, message: impl Into<String>) {
        let w = Warning { path: real, message: message.into() };
        // The same file can be reached twice (merged-/usr aliases); say it once.
        if !self.0.contains(&w) {
            tracing::debug!("discovery warning: {w}");
            self.0.push(w);
        }
    }
}

/// What discovery may do beyond reading files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoverOptions {
    /// Load the root's NVML ([`nvml`]) for MIG devices, NVLink peers and UUIDs procfs lacks.
    /// On by default; a container start turns it on only for a MIG request, so an ordinary
    /// start never dlopens the driver's library.
    pub nvml: bool,
    /// Read what allocation weighs: each device's NUMA node (sysfs `numa_node`, through the PCI
    /// device's links) and the links between devices (AMD XGMI peers from the KFD topology's
    /// `io_links`, one directory and one file per link; a profile's `links` attribute). On by
    /// default; a container start turns it off: injection needs each device's nodes, identity
    /// and attributes, not its placement (that serves the device plugin's preferred allocation,
    /// the Topology Manager and DRA), and on an 8-GPU MI300X the links alone are 72 of
    /// discovery's 150 reads. Without it `numa_node` is `None` and `links` empty.
    pub topology: bool,
    /// Per profile name, the only device indexes to describe (a container start that asks for
    /// devices by index; issue 31: what a start reads follows what it asks for, not the size of
    /// the node). Each device keeps the index a full pass gives it; the others are left out of
    /// the inventory unread, as far as the vendor's numbering allows (NVIDIA's follows the
    /// sorted listing of `/proc/driver/nvidia/gpus`, AMD's needs every KFD node's properties).
    /// An empty set leaves the profile out altogether. Profiles not named: every device.
    pub only: BTreeMap<String, BTreeSet<u32>>,
    /// The devices' identity alone (issue 31): `Some(names)` for a container start whose CDI
    /// spec files serve its devices and that needs only some of their attributes, the names a
    /// profile's device variables read (HABANA_VISIBLE_MODULES from `module_id`). Then no
    /// vendor's host files or control nodes are looked for (`host_files` and `shared_nodes`
    /// are empty), and the profile-driven reader (generic and Gaudi devices, Neuron's before
    /// its own additions) reads of `devices.attributes` only these names and `uuid` (spec
    /// device names may be UUIDs, matched on it), beside what tells the profile's devices apart
    /// (the node, its `device/driver` link), and no per-device extra node or Gaudi driver
    /// version. Every device still has its index, node and UUID, and at least the named
    /// attributes a full pass gives it. `None` (the default): everything.
    pub attributes_only: Option<BTreeSet<String>>,
    /// The caller ends right after the pass (actk-runtime's create execs the low-level
    /// runtime; [`crate::plan::PlanOptions::process_ends`]): the pass's [`HostRoot`]s, their
    /// kept directory handles (all `O_CLOEXEC`: the exec closes them) and memos, are left to
    /// the process's end instead of closed and freed one by one (a DGX create's 25 `close`
    /// calls; issue 31), as long as a root keeps no more than an eighth of its cap of handles
    /// (see [`dir_cap`]). Off by default: a long-running caller would leak them.
    pub process_ends: bool,
}

impl Default for DiscoverOptions {
    fn default() -> Self {
        DiscoverOptions {
            nvml: true,
            topology: true,
            only: BTreeMap::new(),
            attributes_only: None,
            process_ends: false,
        }
    }
}

impl DiscoverOptions {
    /// The indexes [`DiscoverOptions::only`] names for `profile`, if it names any.
    pub(crate) fn wanted(&self, profile: &Profile) -> Option<&BTreeSet<u32>> {
        self.only.get(&profile.name)
    }
}

/// Read `root` into an inventory with the default [`DiscoverOptions`] (NVML on); one root
/// serves devices and driver files ([`discover_roots`] takes them apart).
pub fn discover(root: &Path, profiles: &[Profile]) -> Inventory {
    discover_roots_with(root, root, profiles, &DiscoverOptions::default())
}

/// [`discover`] with explicit [`DiscoverOptions`].
pub fn discover_with(root: &Path, profiles: &[Profile], opts: &DiscoverOptions) -> Inventory {
    discover_roots_with(root, root, profiles, opts)
}

/// [`discover`] with the driver files apart from the devices, as on a GPU Operator node: the
/// device root (`/`) holds /dev, /proc and /sys (the kernel module is the host's), the driver
/// root (`/run/nvidia/driver`, the driver container's file system) holds ld.so.cache, the driver
/// libraries, tools and firmware. Both are made absolute against the working directory.
pub fn discover_roots(root: &Path, driver_root: &Path, profiles: &[Profile]) -> Inventory {
    discover_roots_with(root, driver_root, profiles, &DiscoverOptions::default())
}

/// Read the device `root` and the `driver_root` into an inventory, one [`VendorInventory`] per
/// profile that finds a device, in profile order. Never fails: unreadable or inconsistent host
/// state becomes warnings. NVML (when `opts.nvml`) is loaded from the device root.
pub fn discover_roots_with(root: &Path, driver_root: &Path, profiles: &[Profile], opts: &DiscoverOptions) -> Inventory {
    let host = HostRoot::new(root);
    // One root (the usual case): one cache of resolved directories for devices and files.
    let driver_own = (driver_root != root).then(|| HostRoot::new(driver_root));
    let driver = driver_own.as_ref().unwrap_or(&host);
    let root = host.root();
    // Host files are looked for only when the inventory is more than the devices' identity.
    let ld = opts.attributes_only.is_none().then(|| hostfiles::LdCache::load(driver));
    let files = ld.as_ref().map(|ld| {
        let entries = ld.entries();
        // The library architecture is the device root's (its kernel's), whichever root has the files.
        let arch = hostfiles::host_arch_with(&host, &entries);
        (entries, arch)
    });
    crate::bench_stage::reached("ldcache");
    let mut warnings = Warnings::default();
    let mut vendors = Vec::new();
    for profile in profiles {
        if opts.wanted(profile).is_some_and(BTreeSet::is_empty) {
            continue;
        }
        let found = match profile.discovery.as_str() {
            "nvidia" => nvidia::discover(&host, profile, opts, &mut warnings),
            "neuron" => neuron::discover(&host, profile, opts, &mut warnings),
            "amd" => amd::discover(&host, profile, opts, &mut warnings),
            "gaudi" => gaudi::discover(&host, profile, profiles, opts, &mut warnings),
            _ => generic::discover(&host, profile, profiles, opts, &mut warnings),
        };
        let Some(mut vendor) = found else { continue };
        if vendor.devices.is_empty() {
            continue;
        }
        crate::bench_stage::reached("devices");
        if let Some((ld, arch)) = &files {
            vendor.shared_nodes = control_nodes(&host, profile, &mut warnings);
            crate::bench_stage::reached("control");
            vendor.host_files =
                hostfiles::find_with_cache(driver, ld, *arch, profile, vendor.driver_version.as_deref(), &mut warnings);
        }
        vendors.push(vendor);
    }
    let inventory = Inventory { root: root.to_path_buf(), vendors, warnings: warnings.0 };
    if opts.process_ends {
        // Left to the exec only while they are few: a create may run three passes (the devices'
        // identity, then everything, then the whole node), each with a root and a driver root,
        // and what each leaves stays open until the exec. An eighth of the cap each (which is
        // half the soft RLIMIT_NOFILE) keeps all of them under 3/8 of the limit; a pass that
        // kept more closes its handles as any other does.
        for h in [Some(host), driver_own].into_iter().flatten() {
            if h.kept_handles() <= h.max_dirs / 8 {
                std::mem::forget(h);
            }
        }
    }
    inventory
}

/// A fresh [`VendorInventory`] for `profile` with no devices yet.
pub(crate) fn vendor_for(profile: &Profile) -> VendorInventory {
    VendorInventory { profile: profile.name.clone(), kind: profile.kind.clone(), ..Default::default() }
}

/// The profile's control nodes that exist on the host (a `*` in the last component matches
/// any name there), sorted by path within each entry.
fn control_nodes(host: &HostRoot, profile: &Profile, warnings: &mut Warnings) -> Vec<DeviceNode> {
    let mut out: Vec<DeviceNode> = Vec::new();
    for c in &profile.control_nodes {
        for path in expand_glob(host, &c.path) {
            match host.device_node(&path) {
                Ok(node) if !out.iter().any(|n| n.path == node.path) => out.push(node),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => warnings.add(host, &path, format!("control node skipped: {e}")),
            }
        }
    }
    out
}

/// Expand a `*` in the last component of host path `pattern` against the directory listing;
/// a pattern without `*` is returned as is. Results sorted.
pub(crate) fn expand_glob(host: &HostRoot, pattern: &str) -> Vec<String> {
    let Some((dir, last)) = rsplit_once_byte(pattern, b'/') else { return vec![] };
    let Some((pre, post)) = last.split_once('*') else { return vec![pattern.to_string()] };
    let dir = if dir.is_empty() { "/" } else { dir };
    host.list_dir(dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.len() >= pre.len() + post.len() && n.starts_with(pre) && n.ends_with(post))
        .map(|n| format!("{}/{n}", dir.trim_end_matches('/')))
        .collect()
}

/// Parse a sysfs `numa_node` value: `-1` (no NUMA information) gives `None`.
pub(crate) fn parse_numa(text: &str) -> Result<Option<u32>, String> {
    let t = text.trim();
    match t.parse::<i64>() {
        Ok(n) if n < 0 => Ok(None),
        Ok(n) => u32::try_from(n).map(Some).map_err(|_| format!("numa_node {t:?} out of range")),
        Err(_) => Err(format!("numa_node {t:?} is not a number")),
    }
}

/// Normalise a PCI bus id to the long lower-case form `0000:18:00.0` (a 2-digit domain-less
/// `18:00.0` or NVIDIA's 8-digit domain `00000000:18:00.0` are accepted). None if malformed.
pub(crate) fn normalize_pci(id: &str) -> Option<String> {
    let (rest, func) = rsplit_once_byte(id.trim(), b'.')?;
    let mut parts = rest.split(':');
    let (dom, bus, dev) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(bus), Some(dev), None, _) => ("0", bus, dev),
        (Some(dom), Some(bus), Some(dev), None) => (dom, bus, dev),
        _ => return None,
    };
    let dom = u32::from_str_radix(dom, 16).ok()?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let dev = u8::from_str_radix(dev, 16).ok()?;
    let func = u8::from_str_radix(func, 16).ok()?;
    // `{dom:04x}:{bus:02x}:{dev:02x}.{func:x}`, without the formatting machinery (issue 31: it
    // runs for every GPU and device directory of a discovery).
    let mut out = String::with_capacity(12);
    hex(&mut out, dom.into(), 4);
    out.push(':');
    hex(&mut out, bus.into(), 2);
    out.push(':');
    hex(&mut out, dev.into(), 2);
    out.push('.');
    hex(&mut out, func.into(), 1);
    Some(out)
}

/// Appends `v` in lower-case hexadecimal, zero-padded to `width` digits (`{v:0width$x}`).
pub(crate) fn hex(out: &mut String, v: u64, width: usize) {
    let digits = (64 - v.leading_zeros()).div_ceil(4).max(1) as usize;
    for _ in digits..width {
        out.push('0');
    }
    for i in (0..digits).rev() {
        out.push(char::from(b"0123456789abcdef"[((v >> (4 * i)) & 0xf) as usize]));
    }
}

#[cfg(test)]
pub(crate) mod testutil {
    //! Small host trees built inside a test (regular files, relative links, real nodes).
    use std::path::Path;

    /// Write `text` at host path `rel` under `root`, creating directories.
    pub fn file(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// Create symlink `rel` -> `target` under `root`.
    /// Writes at `rel` the start of a little-endian ELF object: class (1 = 32-bit, 2 = 64-bit)
    /// and e_machine (62 x86-64, 183 aarch64, 3 i386), enough for the architecture check.
    pub fn elf(root: &Path, rel: &str, class: u8, machine: u16) {
        let mut b = vec![0x7f, b'E', b'L', b'F', class, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0];
        b.extend_from_slice(&machine.to_le_bytes());
        b.extend_from_slice(b" actk test library\n");
        let p = root.join(rel.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b).unwrap();
    }

    pub fn link(root: &Path, rel: &str, target: &str) {
        let p = root.join(rel.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, p).unwrap();
    }

    /// mknod a character node; returns false (and the caller skips) when not permitted.
    pub fn node(root: &Path, rel: &str, major: u32, minor: u32) -> bool {
        use rustix::fs::{CWD, FileType, Mode, makedev, mknodat};
        let p = root.join(rel.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        match mknodat(CWD, &p, FileType::CharacterDevice, Mode::from_raw_mode(0o666), makedev(major, minor)) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("skipping: mknod {} failed ({e}); device node tests need root", p.display());
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sysfs_attribute_paths_are_the_device_class_bus_and_module_trees_only() {
        for (p, yes) in [
            ("/sys/class/neuron_device/neuron3/core_count", true),
            ("/sys/bus/pci/devices/0000:05:00.0/product_name", true),
            ("/sys/devices/virtual/kfd/kfd/topology/nodes/2/properties", true),
            ("/sys/module/amdgpu/version", true),
            ("/sys/kernel/debug/dri/0/name", false),
            ("/sys/fs/cgroup/cgroup.procs", false),
            ("/sys/class/../kernel/tracing/trace", false),
            // `.` names the same directory: std reads it away, so does the check.
            ("/sys/class/./x/y", true),
            ("/proc/driver/nvidia/version", false),
        ] {
            assert_eq!(is_sysfs_attribute_path(Path::new(p)), yes, "{p}");
        }
    }

    #[test]
    fn sysfs_link_entries_are_known_by_their_place() {
        for (p, entry) in [
            ("/sys/bus/pci/devices/0000:05:00.0/product_name", Some("/sys/bus/pci/devices/0000:05:00.0")),
            ("/sys/bus/pci/devices/0000:05:00.0", None),
            ("/sys/bus/pci/devices/0000:05:00.0/", None),
            ("/sys/bus/pci/devices", None),
            ("/sys/bus/pci/drivers/amdgpu/bind", None),
            ("/sys/class/drm/renderD128/device/drm", Some("/sys/class/drm/renderD128")),
            ("/sys/class/neuron_device/neuron3/info/serial_number", Some("/sys/class/neuron_device/neuron3")),
            ("/sys//class/drm//renderD128//device", None),
            ("/sys/bus/pci/devices//0000:05:00.0/x", None),
            ("/sys/class//renderD128/device", None),
            ("/sys/class/drm/renderD128", None),
            ("/sys/class/kfd", None),
            ("/sys/devices/virtual/kfd/kfd/topology", None),
            ("/sys/module/amdgpu/version", None),
            ("/proc/driver/nvidia/gpus/0000:1b:00.0/information", None),
            ("/sysx/class/a/b/c", None),
        ] {
            let end = sysfs_link_end(Path::new(p));
            assert_eq!(end.map(|e| &p[..e]), entry, "{p}");
        }
    }

    proptest::proptest! {
        /// fill_index is str::replace of `{index}`, braces of every other kind left alone.
        #[test]
        fn fill_index_is_str_replace(pattern in "[a-z/{}]{0,12}(\\{index\\}[a-z/{}]{0,6}){0,3}", index in "[0-9]{0,4}") {
            proptest::prop_assert_eq!(fill_index(&pattern, &index), pattern.replace("{index}", &index));
        }

        #[test]
        fn rsplit_once_byte_is_str_rsplit_once(s in "[a-z/.é€]{0,40}") {
            proptest::prop_assert_eq!(rsplit_once_byte(&s, b'/'), s.rsplit_once('/'));
            proptest::prop_assert_eq!(rsplit_once_byte(&s, b'.'), s.rsplit_once('.'));
        }

        #[test]
        fn push_name_is_pathbuf_push(path in "/?[a-z/.]{0,30}", name in "[a-z.é]{1,12}") {
            let mut ours = PathBuf::from(&path);
            push_name(&mut ours, OsStr::new(&name));
            let mut std = PathBuf::from(&path);
            std.push(&name);
            proptest::prop_assert_eq!(ours.as_os_str(), std.as_os_str());
        }

        #[test]
        fn join_str_is_the_format(dir in "[a-z/]{0,20}", name in "[a-z.]{0,12}") {
            proptest::prop_assert_eq!(join_str(&dir, &name), format!("{dir}/{name}"));
        }
    }

    /// `host_path` by bytes gives what `root.join(path.strip_prefix("/"))` gave.
    #[test]
    fn host_path_by_bytes_is_std_join_of_the_path_below_the_root() {
        let std_way = |root: &Path, path: &Path| {
            let rel = path.strip_prefix("/").unwrap_or(path);
            if rel.as_os_str().is_empty() { root.to_path_buf() } else { root.join(rel) }
        };
        for root in ["/r", "/r/", "/", "/fixture root/x"] {
            let host = HostRoot::new(root);
            for path in ["/", "", "/a", "/a/b/", "a/b", "/a/./b", "/a/../b", "/dev/nvidia0", "/a//b", "/é/\u{1F600}"] {
                let path = Path::new(path);
                assert_eq!(host.host_path(path), std_way(Path::new(root), path), "root {root:?}, path {path:?}");
            }
        }
        let host = HostRoot::new("/r");
        // std reads `//a` as `/a` below the root too; so do the bytes.
        assert_eq!(host.host_path("//a"), Path::new("/r/a"));
        assert_eq!(host.host_path("///"), Path::new("/r"));
    }

    proptest::proptest! {
        /// ByteFinder answers as a scan does, needle present or not, at any length: one byte
        /// value in 40, so that first and last matches fall anywhere in SSE2's 16- and 64-byte
        /// blocks and the tails after them.
        #[test]
        fn byte_finder_finds_what_a_scan_finds(hay in proptest::collection::vec(0u8..40, 0..200), needle in 0u8..40) {
            let f = ByteFinder::new(needle);
            proptest::prop_assert_eq!(f.find(&hay), hay.iter().position(|&b| b == needle));
            proptest::prop_assert_eq!(f.rfind(&hay), hay.iter().rposition(|&b| b == needle));
        }

        /// canonical_split, parent_of and plain agree with std's Path::parent, Path::file_name
        /// and is_plain on every path of `a`, `.` and `/` (absolute or not, any run of them).
        #[test]
        fn the_byte_split_agrees_with_std(p in "/?[a./]{0,12}|(/[a-z.]{0,24}){1,6}/?") {
            let path = Path::new(&p);
            // canonical_split is the rule it states, on every path: `/`, then names separated
            // by single `/`s, none empty, `.` or `..`.
            let by_rule = p.strip_prefix('/').filter(|names| names.split('/').all(|n| !matches!(n, "" | "." | ".."))).map(|_| {
                let i = p.rfind('/').unwrap_or(0);
                (Path::new(if i == 0 { "/" } else { &p[..i] }), OsStr::new(&p[i + 1..]))
            });
            proptest::prop_assert_eq!(canonical_split(path), by_rule, "{}", p);
            if let Some((parent, name)) = canonical_split(path) {
                proptest::prop_assert_eq!(Some(parent), path.parent(), "{}", p);
                proptest::prop_assert_eq!(Some(name), path.file_name(), "{}", p);
                proptest::prop_assert!(is_plain(path), "{}", p);
            }
            proptest::prop_assert_eq!(parent_of(path), path.parent(), "{}", p);
            proptest::prop_assert_eq!(plain(path), is_plain(path), "{}", p);
        }
    }

    use super::testutil::*;
    use super::*;

    #[test]
    fn the_system_root_is_known_by_its_directory() {
        assert!(HostRoot::new("/").is_system_root());
        assert!(HostRoot::new("//").is_system_root());
        assert!(HostRoot::new("/usr/..").is_system_root());
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        std::os::unix::fs::symlink("/", r.join("to-root")).unwrap();
        std::fs::create_dir(r.join("dir")).unwrap();
        assert!(HostRoot::new(r.join("to-root")).is_system_root(), "a link to / is /");
        assert!(!HostRoot::new(r).is_system_root(), "a fixture root is not /");
        assert!(!HostRoot::new(r.join("dir")).is_system_root());
        assert!(!HostRoot::new(r.join("missing")).is_system_root());
        assert!(!HostRoot::new("").is_system_root(), "no path is no root");
    }

    #[test]
    fn resolution_stays_inside_root() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        file(r, "/usr/lib/x86_64-linux-gnu/libx.so.1.0", "x");
        link(r, "/lib", "usr/lib");
        link(r, "/usr/lib/x86_64-linux-gnu/libx.so.1", "libx.so.1.0");
        link(r, "/abs", "/usr/lib/x86_64-linux-gnu/libx.so.1");
        link(r, "/escape", "../../../../../../etc/passwd");
        link(r, "/escape_abs", "/etc/passwd");
        link(r, "/loop", "loop");
        // `.`, doubled and trailing slashes in a link target are plain separators.
        link(r, "/dotted", "./usr//lib/./x86_64-linux-gnu/");
        let h = HostRoot::new(r);
        assert_eq!(
            h.resolve("/lib/x86_64-linux-gnu/libx.so.1").unwrap(),
            Path::new("/usr/lib/x86_64-linux-gnu/libx.so.1.0")
        );
        assert_eq!(h.resolve("/abs").unwrap(), Path::new("/usr/lib/x86_64-linux-gnu/libx.so.1.0"));
        assert_eq!(h.resolve_parent("/abs").unwrap(), Path::new("/abs"));
        // The host's /etc/passwd must not be reached through either link: there is none in root.
        assert_eq!(h.resolve("/escape").unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(h.resolve("/escape_abs").unwrap_err().kind(), io::ErrorKind::NotFound);
        assert!(h.read_to_string("/escape").is_err());
        assert!(h.read_to_string("/escape_abs").is_err());
        // Reads follow links as the resolution does: an absolute target is the root's.
        file(r, "/etc/actk-read-test", "inside");
        link(r, "/to_etc", "/etc/actk-read-test");
        link(r, "/to_etc_up", "../../../../etc/actk-read-test");
        assert_eq!(h.read_to_string("/to_etc").unwrap(), "inside");
        assert_eq!(h.read_to_string("/to_etc_up").unwrap(), "inside");
        assert_eq!(h.read_to_string("/abs").unwrap(), "x");
        assert_eq!(h.read_to_string("/lib/x86_64-linux-gnu/libx.so.1").unwrap(), "x");
        assert_eq!(h.read("/missing").unwrap_err().kind(), io::ErrorKind::NotFound);
        let big: String = (0..3000).map(|i| format!("{i} ")).collect();
        file(r, "/big", &big);
        assert_eq!(h.read_to_string("/big").unwrap(), big, "more than the first page");
        // A link whose target is several plain names (resolved in one openat2 when none of them
        // is a symlink) with a symlink among them that points out: walked, and kept inside.
        std::fs::create_dir_all(r.join("d2")).unwrap();
        link(r, "/d2/esc", "/etc");
        link(r, "/through", "d2/esc/actk-read-test");
        link(r, "/d3/up", "../../../../../../etc");
        link(r, "/through_up", "d3/up/passwd");
        link(r, "/through_dir", "d2/esc");
        assert_eq!(h.read_to_string("/through").unwrap(), "inside");
        assert_eq!(h.resolve("/through").unwrap(), Path::new("/etc/actk-read-test"));
        assert_eq!(h.read("/through_up").unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(h.resolve("/through_up").unwrap_err().kind(), io::ErrorKind::NotFound);
        assert!(h.list_dir("/through_dir").unwrap().contains(&"actk-read-test".to_string()));
        assert_eq!(h.resolve_dir("/through_dir").unwrap(), Path::new("/etc"));
        // A listing larger than one getdents buffer (600 entries of ~40 bytes each).
        for i in 0..600 {
            file(r, &format!("/many/entry-with-a-longish-name-{i:04}"), "");
        }
        let many = h.list_dir("/many").unwrap();
        assert_eq!(many.len(), 600);
        assert_eq!(many[599], "entry-with-a-longish-name-0599");
        assert!(h.resolve("/loop").unwrap_err().to_string().contains("too many levels"));
        // Without openat2 (ENOSYS, or EPERM from an older seccomp profile) every path is walked,
        // with the same results.
        let walked = HostRoot::new(r);
        walked.openat2.store(false, Ordering::Relaxed);
        for p in [
            "/lib/x86_64-linux-gnu/libx.so.1",
            "/abs",
            "/escape",
            "/escape_abs",
            "/to_etc",
            "/to_etc_up",
            "/through",
            "/through_up",
            "/through_dir",
            "/dotted/libx.so.1",
            "/missing",
            "/big",
            "/loop",
        ] {
            let res = |h: &HostRoot| format!("{:?}", h.resolve(p).map_err(|e| e.kind()));
            let read = |h: &HostRoot| format!("{:?}", h.read(p).map_err(|e| e.kind()));
            let list = |h: &HostRoot| format!("{:?}", h.list_dir(p).map_err(|e| e.kind()));
            assert_eq!(res(&walked), res(&h), "resolve {p}");
            assert_eq!(read(&walked), read(&h), "read {p}");
            assert_eq!(list(&walked), list(&h), "list {p}");
        }
        assert_eq!(h.link_name("/lib").unwrap(), "lib");
        assert_eq!(h.resolve("/dotted/libx.so.1").unwrap(), Path::new("/usr/lib/x86_64-linux-gnu/libx.so.1.0"));
        assert_eq!(h.resolve("/dotted").unwrap(), Path::new("/usr/lib/x86_64-linux-gnu"));
        assert_eq!(
            h.resolve("//usr/./lib//x86_64-linux-gnu/libx.so.1").unwrap(),
            Path::new("/usr/lib/x86_64-linux-gnu/libx.so.1.0")
        );
    }

    #[test]
    fn memoised_directories_resolve_like_the_walk() {
        // sysfs-like: a bus link into a deep device directory, `..` after a link, and a link
        // loop in a directory position; each path asked twice (the second time from the cache).
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        file(r, "/sys/devices/pci0000:00/0000:00:01.0/0000:1b:00.0/numa_node", "0\n");
        file(r, "/sys/devices/pci0000:00/0000:00:01.0/power", "on\n");
        link(r, "/sys/bus/pci/devices/0000:1b:00.0", "../../../devices/pci0000:00/0000:00:01.0/0000:1b:00.0");
        link(r, "/sys/up", "../../../../..");
        link(r, "/d/loop", "loop");
        let h = HostRoot::new(r);
        for _ in 0..2 {
            assert_eq!(
                h.resolve("/sys/bus/pci/devices/0000:1b:00.0/numa_node").unwrap(),
                Path::new("/sys/devices/pci0000:00/0000:00:01.0/0000:1b:00.0/numa_node")
            );
            assert_eq!(
                h.resolve("/sys/bus/pci/devices/0000:1b:00.0/../power").unwrap(),
                Path::new("/sys/devices/pci0000:00/0000:00:01.0/power")
            );
            // `..` through a link stops at the root; the host's /etc is never reached.
            assert_eq!(h.resolve("/sys/up/sys/devices").unwrap(), Path::new("/sys/devices"));
            assert_eq!(h.resolve("/sys/up/etc/passwd").unwrap_err().kind(), io::ErrorKind::NotFound);
            assert!(h.resolve("/d/loop/x").unwrap_err().to_string().contains("too many levels"));
            assert_eq!(
                h.resolve_parent("/sys/bus/pci/devices/0000:1b:00.0").unwrap(),
                Path::new("/sys/bus/pci/devices/0000:1b:00.0")
            );
            // Reads below a directory resolved once, by its resolved path (a memo hit), with
            // doubled and trailing slashes, and from the root.
            let dev = h.resolve_dir("/sys/bus/pci/devices/0000:1b:00.0").unwrap();
            assert_eq!(h.read_to_string(dev.join("numa_node")).unwrap(), "0\n");
            assert_eq!(h.read_to_string(format!("{}//numa_node", dev.display())).unwrap(), "0\n");
            assert_eq!(h.read_to_string("//sys//devices/pci0000:00/0000:00:01.0///power").unwrap(), "on\n");
            assert_eq!(h.list_dir(format!("{}//", dev.display())).unwrap(), ["numa_node"]);
            assert_eq!(h.read_to_string("/sys/up/sys/devices/pci0000:00/0000:00:01.0/power").unwrap(), "on\n");
            assert_eq!(h.read_to_string("/").unwrap_err().kind(), io::ErrorKind::IsADirectory);
        }
    }

    #[test]
    fn numa_and_pci_parsing() {
        assert_eq!(parse_numa("-1\n"), Ok(None));
        assert_eq!(parse_numa("1\n"), Ok(Some(1)));
        assert!(parse_numa("x").is_err());
        assert_eq!(normalize_pci("00000000:1B:00.0").as_deref(), Some("0000:1b:00.0"));
        assert_eq!(normalize_pci("1b:00.0").as_deref(), Some("0000:1b:00.0"));
        assert_eq!(normalize_pci("garbage"), None);
        for (id, want) in [
            (" 0000:CE:00.1\n", Some("0000:ce:00.1")),
            ("1:2:3.4", Some("0001:02:03.4")),
            ("12345:ff:1f.7", Some("12345:ff:1f.7")),
            ("a:b:c:d.0", None),
            ("1b.0", None),
            ("1b:100.0", None),
            ("1b:00", None),
        ] {
            assert_eq!(normalize_pci(id).as_deref(), want, "{id:?}");
        }
        let mut s = String::new();
        for v in [0u64, 1, 0xf, 0x10, 0xabc, 0x1234, 0x12345, u64::from(u32::MAX), u64::MAX] {
            for w in 0..10 {
                s.clear();
                hex(&mut s, v, w);
                assert_eq!(s, format!("{v:0w$x}"), "{v:#x} width {w}");
            }
        }
    }

    #[test]
    fn proc_devices_majors_are_char_only() {
        let tmp = tempfile::tempdir().unwrap();
        file(tmp.path(), "/proc/devices", "Character devices:\n  1 mem\n246 neuron\n\nBlock devices:\n  7 neuron\n");
        let h = HostRoot::new(tmp.path());
        assert_eq!(h.proc_devices_major("neuron").unwrap(), Some(246));
        assert_eq!(h.proc_devices_major("nvidia-uvm").unwrap(), None);
    }

    // Differential checks of HostRoot against the kernel's openat2(RESOLVE_IN_ROOT), the walk
    // before the change and the walk without openat2, on random trees of links.
    use rustix::fs::{Mode, OFlags, ResolveFlags};

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn pick<'a>(&mut self, v: &[&'a str]) -> &'a str {
            v[(self.next() % v.len() as u64) as usize]
        }
    }

    const NAMES: &[&str] = &["a", "b", "c", "f", "l1", "l2", "l3", "..", ".", "etc"];

    fn rand_path(rng: &mut Rng, abs: bool) -> String {
        let n = 1 + rng.next() % 7;
        let parts: Vec<&str> = (0..n).map(|_| rng.pick(NAMES)).collect();
        let s = parts.join(if rng.next().is_multiple_of(5) { "//" } else { "/" });
        if abs { format!("/{s}") } else { s }
    }

    fn kind(e: &io::Error) -> String {
        if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) || e.to_string().contains("too many levels")
        {
            "loop".into()
        } else {
            format!("{:?}", e.kind())
        }
    }

    /// The resolution before the change (9d9cd43's walk, lstat by full path, memo left out).
    fn old_resolve(root: &Path, path: &Path, follow_last: bool) -> io::Result<PathBuf> {
        let mut names: Vec<PathBuf> = path
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(PathBuf::from(n)),
                Component::ParentDir => Some(PathBuf::from("..")),
                _ => None,
            })
            .collect();
        let Some(last) = names.pop() else { return Ok(PathBuf::from("/")) };
        let parent = if names.is_empty() {
            PathBuf::from("/")
        } else {
            let key: PathBuf = std::iter::once(PathBuf::from("/")).chain(names).collect();
            old_resolve(root, &key, true)?
        };
        let mut cur = parent;
        let mut todo = last.into_os_string().into_vec();
        let mut links = 0;
        let rel = |c: &Path| root.join(c.strip_prefix("/").unwrap_or(c));
        let mut host = rel(&cur);
        let mut pos = 0;
        loop {
            while todo.get(pos) == Some(&b'/') {
                pos += 1;
            }
            if pos >= todo.len() {
                return Ok(cur);
            }
            let end = todo[pos..].iter().position(|&b| b == b'/').map_or(todo.len(), |i| pos + i);
            let (start, name_end) = (pos, end);
            pos = end;
            let is_last = todo[pos..].iter().all(|&b| b == b'/');
            let name = OsStr::from_bytes(&todo[start..name_end]).to_owned();
            if name == "." {
                continue;
            }
            if name == ".." {
                if cur.pop() {
                    host.pop();
                }
                continue;
            }
            host.push(&name);
            let meta = std::fs::symlink_metadata(&host)?;
            if !meta.file_type().is_symlink() || (!follow_last && is_last) {
                cur.push(&name);
                continue;
            }
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(io::Error::other("too many levels"));
            }
            let target = std::fs::read_link(&host)?;
            host.pop();
            if target.is_absolute() {
                cur = PathBuf::from("/");
                host = root.to_path_buf();
            }
            let mut next = target.into_os_string().into_vec();
            next.push(b'/');
            next.extend_from_slice(&todo[pos..]);
            todo = next;
            pos = 0;
        }
    }

    /// The kernel's answer: openat2 RESOLVE_IN_ROOT, read back through /proc/self/fd.
    fn oracle(root: &Path, path: &str, flags: OFlags) -> Result<PathBuf, String> {
        let rfd = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        // EAGAIN: a rename elsewhere (other tests) during a `..` lookup; the kernel asks to retry.
        let open = || rustix::fs::openat2(&rfd, path, flags | OFlags::CLOEXEC, Mode::empty(), ResolveFlags::IN_ROOT);
        let mut res = open();
        for _ in 0..10_000 {
            if !matches!(res, Err(rustix::io::Errno::AGAIN)) {
                break;
            }
            res = open();
        }
        match res {
            Ok(fd) => {
                use std::os::fd::AsRawFd;
                let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
                let rel = real.strip_prefix(root).unwrap();
                Ok(Path::new("/").join(rel))
            }
            Err(e) => Err(kind(&e.into())),
        }
    }

    fn tree(seed: u64) -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path().canonicalize().unwrap();
        for d in ["/a/b/c/a/b/c", "/b/c/a/b", "/c", "/etc"] {
            std::fs::create_dir_all(r.join(d.trim_start_matches('/'))).unwrap();
        }
        file(&r, "/a/f", "af");
        file(&r, "/a/b/f", "abf");
        file(&r, "/etc/f", "etcf");
        file(&r, "/f", "f");
        let mut rng = Rng(seed);
        for _ in 0..14 {
            let dir = rng.pick(&["", "/a", "/a/b", "/b", "/c", "/a/b/c", "/b/c", "/a/b/c/a/b"]);
            let name = rng.pick(&["l1", "l2", "l3"]);
            let abs = rng.next().is_multiple_of(3);
            let mut target = rand_path(&mut rng, abs);
            if rng.next().is_multiple_of(4) {
                target = format!("../../../../{target}");
            }
            if rng.next().is_multiple_of(6) {
                target.push('/');
            }
            let p = format!("{dir}/{name}");
            if r.join(p.trim_start_matches('/')).symlink_metadata().is_err() {
                link(&r, &p, &target);
            }
        }
        (tmp, r)
    }

    /// Every query's answers, from a resolution `res` (old or kernel) of the path with and
    /// without the last link followed, as one comparable string per method.
    fn expected(r: &Path, res: Result<PathBuf, String>, res_nofollow: Result<PathBuf, String>) -> Vec<String> {
        let real = |o: &PathBuf| r.join(o.strip_prefix("/").unwrap());
        let read = res.clone().and_then(|o| std::fs::read(real(&o)).map_err(|e| kind(&e)));
        let list = res.clone().and_then(|o| {
            std::fs::read_dir(real(&o))
                .map(|d| {
                    let mut v: Vec<String> = d.map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
                    v.sort();
                    v
                })
                .map_err(|e| kind(&e))
        });
        let link = res_nofollow.clone().and_then(|o| {
            std::fs::read_link(real(&o))
                .map_err(|e| kind(&e))
                .and_then(|t| t.file_name().and_then(OsStr::to_str).map(str::to_string).ok_or("noname".to_string()))
        });
        let stat = res.clone().and_then(|o| {
            std::fs::metadata(real(&o)).map(|m| (o, std::os::unix::fs::MetadataExt::ino(&m))).map_err(|e| kind(&e))
        });
        vec![
            format!("resolve {res:?}"),
            format!("resolve_parent {res_nofollow:?}"),
            format!("read {read:?}"),
            format!("list_dir {list:?}"),
            format!("exists {:?}", res.is_ok()),
            format!("link_name {link:?}"),
            format!("resolve_stat {stat:?}"),
        ]
    }

    fn answers(h: &HostRoot, p: &str) -> Vec<String> {
        let k = |e: io::Error| kind(&e);
        let link = h.link_name(p).map_err(|e| match kind(&e).as_str() {
            "Other" if e.to_string().contains("no name") => "noname".to_string(),
            s => s.to_string(),
        });
        vec![
            format!("resolve {:?}", h.resolve(p).map_err(k)),
            format!("resolve_parent {:?}", h.resolve_parent(p).map_err(k)),
            format!("read {:?}", h.read(p).map_err(k)),
            format!("list_dir {:?}", h.list_dir(p).map_err(k)),
            format!("exists {:?}", h.exists(p)),
            format!("link_name {link:?}"),
            {
                // resolve_stat_link answers exactly as resolve_stat (it only asks in another order).
                let a = format!("resolve_stat {:?}", h.resolve_stat(p).map(|(p, st)| (p, st.st_ino)).map_err(k));
                let b = format!("resolve_stat {:?}", h.resolve_stat_link(p).map(|(p, st)| (p, st.st_ino)).map_err(k));
                if a == b { a } else { format!("{a} but resolve_stat_link: {b}") }
            },
        ]
    }

    #[test]
    fn random_links_resolve_like_the_kernel() {
        let mut bad = Vec::new();
        for seed in 1..80u64 {
            let (_tmp, r) = tree(seed * 7919);
            let cached = HostRoot::new(&r);
            let walked = HostRoot::new(&r);
            walked.openat2.store(false, Ordering::Relaxed);
            // A pass past its cap of handles: nothing more is kept.
            let full = HostRoot::new(&r);
            if let (Ok(fd), Ok(mut c)) = (full.root_fd(), full.cache.lock()) {
                for i in 0..full.max_dirs {
                    c.fds.insert(format!("/zz/{i}").into(), fd.clone());
                    c.asked.insert(format!("/zz/{i}").into(), (PathBuf::from("/zz"), fd.clone()));
                    c.missing.insert(format!("/zy/{i}").into());
                    c.listings.insert(format!("/zy/{i}").into(), vec![]);
                }
            }
            let mut rng = Rng(seed * 104729 + 1);
            for _ in 0..60 {
                // Relative, and with a trailing `/`, too: memo keys are the paths as asked.
                let abs = !rng.next().is_multiple_of(8);
                let mut p = rand_path(&mut rng, abs);
                if rng.next().is_multiple_of(6) {
                    p.push('/');
                }
                let fresh = HostRoot::new(&r);
                let old = expected(
                    &r,
                    old_resolve(&r, Path::new(&p), true).map_err(|e| kind(&e)),
                    old_resolve(&r, Path::new(&p), false).map_err(|e| kind(&e)),
                );
                let kern = expected(&r, oracle(&r, &p, OFlags::PATH), oracle(&r, &p, OFlags::PATH | OFlags::NOFOLLOW));
                for (name, h) in [("cached", &cached), ("walked", &walked), ("fresh", &fresh), ("full", &full)] {
                    let got = answers(h, &p);
                    for i in 0..got.len() {
                        if got[i] == old[i] {
                            continue;
                        }
                        // The walk before the change let `..` follow a file (`/f/../x`); now it
                        // is `ENOTDIR`, as in the kernel.
                        if got[i] != kern[i] {
                            bad.push(format!(
                                "seed {seed} {name} {p}: {} (old {}, kernel {})",
                                got[i], old[i], kern[i]
                            ));
                        }
                    }
                }
                let want = oracle(&r, &p, OFlags::PATH | OFlags::DIRECTORY);
                for (name, h) in [("cached", &cached), ("walked", &walked), ("fresh", &fresh), ("full", &full)] {
                    let got = h.resolve_dir(&p).map_err(|e| kind(&e));
                    if got != want {
                        bad.push(format!("seed {seed} {name} resolve_dir({p}) = {got:?}, kernel {want:?}"));
                    }
                    if h.is_dir(&p) != want.is_ok() {
                        bad.push(format!("seed {seed} {name} is_dir({p}) = {}, kernel {want:?}", h.is_dir(&p)));
                    }
                }
            }
        }
        bad.sort();
        bad.dedup();
        let n = bad.len();
        bad.truncate(40);
        assert!(n == 0, "{n} mismatches:\n{}", bad.join("\n"));
    }

    /// The distinct handles `h`'s cache keeps open.
    fn held_fds(h: &HostRoot) -> usize {
        use std::os::fd::AsRawFd;
        let c = h.cache.lock().unwrap();
        let mut fds: Vec<i32> = c
            .fds
            .values()
            .chain(c.asked.values().map(|(_, fd)| fd))
            .chain(c.in_root.values())
            .map(|fd| fd.as_raw_fd())
            .collect();
        fds.sort();
        fds.dedup();
        fds.len()
    }

    #[test]
    fn edge_paths_resolve_alike_walked_and_cached() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path().canonicalize().unwrap();
        file(&r, "/f", "f");
        std::fs::create_dir_all(r.join("d/e")).unwrap();
        link(&r, "/toroot", "/");
        link(&r, "/toroot2", "//");
        link(&r, "/dots", "../../..");
        let long = "x".repeat(300);
        // chains of 40 and 41 links
        for i in 0..41 {
            link(&r, &format!("/c/{i}"), &format!("{}", i + 1));
        }
        file(&r, "/c/41", "end");
        let walked = HostRoot::new(&r);
        walked.openat2.store(false, Ordering::Relaxed);
        for p in [
            "",
            "/",
            ".",
            "..",
            "/..",
            "//",
            "d",
            "d/e",
            "/d/",
            "/d//e/",
            "/toroot",
            "/toroot/f",
            "/toroot2/f",
            "/dots/f",
            "/dots",
            "/d/e/../../f",
            "/c/1",
            "/c/0",
            "/c/2/",
            "/toroot/c/1",
            "/f\0x",
            "/d\0/e",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("/{long}"), format!("/d/{long}/x"), format!("/d/e/../{long}")])
        {
            let fresh = HostRoot::new(&r);
            let a = answers(&fresh, &p);
            let b = answers(&walked, &p);
            let c = answers(&fresh, &p);
            // Not compared with the kernel here: it differs where the walk before this change
            // did too ("" is the root, a trailing `/` after a file is dropped, a parent's links
            // are counted apart from the last name's).
            assert_eq!(a, b, "walked {p:?}");
            assert_eq!(a, c, "cached {p:?}");
            let rd = (fresh.resolve_dir(&p).map_err(|e| kind(&e)), walked.resolve_dir(&p).map_err(|e| kind(&e)));
            assert_eq!(rd.0, rd.1, "resolve_dir {p:?}");
        }
    }

    #[test]
    fn handles_stay_within_max_cached_dirs() {
        // sysfs-like: several links into each device directory (bus, class, driver), each
        // asked as a directory and a file read in it.
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        let n = 600;
        for i in 0..n {
            file(r, &format!("/sys/devices/pci0/{i}/numa_node"), "0\n");
            for via in ["bus", "class", "drv"] {
                link(r, &format!("/sys/{via}/{i}"), &format!("../devices/pci0/{i}"));
            }
        }
        // The cap a soft limit of 1024 open files gives, below what this tree needs.
        let mut h = HostRoot::new(r);
        h.max_dirs = 512;
        for i in 0..n {
            for via in ["bus", "class", "drv"] {
                assert_eq!(h.read_to_string(format!("/sys/{via}/{i}/numa_node")).unwrap(), "0\n");
            }
            // The walk's handles and those opened in the root share the one cap.
            assert_eq!(h.resolve_dir(format!("/sys/bus/{i}")).unwrap(), Path::new(&format!("/sys/devices/pci0/{i}")));
            assert!(h.is_dir(format!("/sys/drv/{i}")));
        }
        let held = held_fds(&h);
        assert!(held <= h.max_dirs, "{held} handles held, more than {}", h.max_dirs);
    }

    #[test]
    fn very_deep_paths_do_not_overflow_the_stack() {
        // A path from a root's ld.so.cache can be any length: one just under PATH_MAX (2047
        // names) must not take a stack frame per name (it overflowed a 2 MiB thread stack), and a
        // longer one fails at once, as openat2 fails it.
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path().to_path_buf();
        std::fs::create_dir_all(r.join("a")).unwrap();
        link(&r, "/a/a", ".");
        let t = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let h = HostRoot::new(&r);
                let p = "/a".repeat(2047);
                assert_eq!(h.resolve(&p).unwrap(), Path::new("/a"));
                assert_eq!(h.resolve_dir(&p).unwrap(), Path::new("/a"));
                assert!(h.list_dir(&p).unwrap().contains(&"a".to_string()));
                assert_eq!(HostRoot::new(&r).resolve_dir(&p).unwrap(), Path::new("/a"));
                let long = "/a".repeat(100_000);
                let too_long = |e: io::Error| e.raw_os_error() == Some(rustix::io::Errno::NAMETOOLONG.raw_os_error());
                assert!(h.resolve(&long).is_err_and(too_long));
                assert!(h.resolve_dir(&long).is_err_and(too_long));
                assert!(h.read(&long).is_err_and(too_long));
                assert!(h.list_dir(&long).is_err_and(too_long));
                assert!(!h.exists(&long));
            })
            .unwrap();
        assert!(t.join().is_ok());
    }
}
