//! Host files a vendor's containers get: driver libraries, tools and firmware, per capability.
//!
//! Libraries are found as the dynamic linker finds them: through the host's ld.so.cache
//! (`<root>/etc/ld.so.cache`, parsed by [`crate::ldcache`]), and only when a library is not
//! in the cache, by scanning the standard library directories. As libnvidia-container does,
//! only files whose name ends in the running driver version are taken
//! (`libcuda.so.580.95.05` for driver 580.95.05); a library of another version is left out
//! with a warning (a stale install makes CUDA fail with "driver/library version mismatch").
//! Each library yields the versioned file and, mounted from that same file, its soname path
//! (`libcuda.so.1`), so the container needs no symlink of its own.

use super::{HostRoot, Warnings, expand_glob};
use crate::inventory::{HostFile, HostFileKind};
use crate::ldcache::{self, EntryRef, LibArch};
use crate::profile::Profile;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Library directories scanned when ld.so.cache has no entry, for a library architecture:
/// the Debian/Ubuntu multiarch directories of its triplet first, then RHEL/SUSE lib64 (or
/// lib32 for i386), then plain lib. A file found by the scan must also be an ELF object of that
/// architecture ([`LibArch::matches_elf`]): lib64 and lib hold whatever the distribution put there.
fn lib_dirs(arch: LibArch) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(t) = arch.triplet() {
        v.push(format!("/usr/lib/{t}"));
        v.push(format!("/lib/{t}"));
    }
    match arch {
        LibArch::I386 => v.push("/usr/lib32".into()),
        _ => {
            v.push("/usr/lib64".into());
            v.push("/lib64".into());
        }
    }
    v.push("/usr/lib".into());
    v
}

/// The host's native library architecture:
/// 1. `<device root>/proc/sys/kernel/arch` (the uname machine, Linux >= 6.1; a fixture says its own);
/// 2. for a root that is not this system's own (a fixture, a copied node) without it, the
///    architecture most 64-bit entries of the driver root's ld.so.cache have: its ldconfig
///    wrote them for its machine;
/// 3. the running kernel's machine (`uname -m`; a driver container on this node shares it).
///
/// x86-64 when none is a known architecture.
pub fn host_arch(device_root: &HostRoot, driver_root: &HostRoot) -> LibArch {
    host_arch_with(device_root, &LdCache::load(driver_root).entries())
}

/// [`host_arch`] with the driver root's ld.so.cache already read.
pub fn host_arch_with(device_root: &HostRoot, driver_cache: &LdEntries<'_>) -> LibArch {
    if let Some(a) = device_root.read_to_string("/proc/sys/kernel/arch").ok().and_then(|m| LibArch::native(&m)) {
        return a;
    }
    if !device_root.is_system_root()
        && let Ok(entries) = &driver_cache.0
    {
        let count = |a: LibArch| entries.iter().filter(|e| e.arch() == a).count();
        let (x86, arm) = (count(LibArch::X86_64), count(LibArch::Aarch64));
        if x86 + arm > 0 {
            return if arm > x86 { LibArch::Aarch64 } else { LibArch::X86_64 };
        }
    }
    LibArch::native(&rustix::system::uname().machine().to_string_lossy()).unwrap_or(LibArch::X86_64)
}

/// A root's /etc/ld.so.cache, read once per discovery pass: its bytes (`None` when the file is
/// missing), or why it could not be read. [`LdCache::entries`] parses it.
pub struct LdCache(Result<Option<Vec<u8>>, String>);

impl LdCache {
    /// Read `root`'s /etc/ld.so.cache.
    pub fn load(root: &HostRoot) -> LdCache {
        LdCache(match root.read(CACHE) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("unreadable: {e}; falling back to the standard library directories")),
        })
    }

    /// The cache's entries, their strings slices of the file's bytes ([`ldcache::parse_borrowed`]
    /// within the default limits; none when the file is missing), or what is wrong with it.
    /// Parsed once per pass: a real node's cache (30-100 KB, one to three thousand entries)
    /// copied into a `String` each cost a third of a discovery's instructions and their
    /// page faults (issue 31).
    pub fn entries(&self) -> LdEntries<'_> {
        LdEntries(match &self.0 {
            Ok(Some(bytes)) => ldcache::parse_borrowed(bytes, &ldcache::Limits::default())
                .map_err(|e| format!("{e}; falling back to the standard library directories")),
            Ok(None) => Ok(Vec::new()),
            Err(why) => Err(why.clone()),
        })
    }
}

/// The entries of an [`LdCache`] ([`LdCache::entries`]), or what is wrong with the file, which
/// [`find_with_cache`] reports as a warning for each vendor that looks libraries up.
pub struct LdEntries<'a>(Result<Vec<EntryRef<'a>>, String>);

/// Where the ld.so.cache is, in any root.
const CACHE: &str = "/etc/ld.so.cache";

/// Directories searched for executables, in this order; an executable is mounted where it was
/// found.
const BIN_DIRS: &[&str] = &["/usr/bin", "/usr/local/bin", "/usr/sbin", "/opt/aws/neuron/bin"];

/// Driver installs kept under one prefix with `bin/` and `lib64/` beside each other, searched
/// after [`BIN_DIRS`]: GKE's driver installer mounts its driver at `/usr/local/nvidia`, NVIDIA's
/// CUDA images put `/usr/local/nvidia/bin` on PATH, and hosts that keep the driver there often
/// have only wrapper scripts in /usr/bin (seen on an H200 VM on 2026-12-04: `/usr/bin/nvidia-smi`
/// a shell script ending in `exec /usr/local/nvidia/bin/nvidia-smi`). An executable taken from
/// here is mounted at `/usr/bin/NAME`, which is on every image's default PATH.
const DRIVER_BIN_DIRS: &[&str] = &["/usr/local/nvidia/bin"];

/// The host files `profile` asks for that exist under `host`, in capability-name order,
/// without duplicates (by container path). `driver_version` filters libraries and fills
/// `{driver_version}` in file patterns (patterns needing it are skipped without one).
pub fn find(
    host: &HostRoot,
    profile: &Profile,
    driver_version: Option<&str>,
    warnings: &mut Warnings,
) -> Vec<HostFile> {
    find_for_arch(host, host_arch(host, host), profile, driver_version, warnings)
}

/// [`find`] for a given native library architecture (the device root's, [`host_arch`], when
/// the driver files are in another root).
pub fn find_for_arch(
    host: &HostRoot,
    native: LibArch,
    profile: &Profile,
    driver_version: Option<&str>,
    warnings: &mut Warnings,
) -> Vec<HostFile> {
    find_with_cache(host, &LdCache::load(host).entries(), native, profile, driver_version, warnings)
}

/// [`find_for_arch`] with `host`'s ld.so.cache already read ([`LdCache::entries`]).
pub fn find_with_cache(
    host: &HostRoot,
    ld: &LdEntries<'_>,
    native: LibArch,
    profile: &Profile,
    driver_version: Option<&str>,
    warnings: &mut Warnings,
) -> Vec<HostFile> {
    let no_entries = Vec::new();
    let entries = match &ld.0 {
        Ok(entries) => entries,
        Err(why) => {
            warnings.add(host, CACHE, why.clone());
            &no_entries
        }
    };
    let cache = CacheIndex::new(entries, profile.capabilities.values().flat_map(|files| &files.libraries));
    let probe_first = ld.0.as_ref().is_ok_and(|e| !e.is_empty());
    // The architecture of a capability's libraries when the host may have some: none for one it
    // cannot run ([`capability_arch`]), and none for a foreign one (compat32's i386 on x86-64)
    // when a usable cache has no entry of it at all and the host has none of its own
    // directories (/usr/lib/i386-linux-gnu, /lib/i386-linux-gnu, /usr/lib32). ldconfig always
    // indexes /lib and /usr/lib (where RHEL keeps 32-bit libraries; glibc adds them beside
    // lib64), and a driver install runs it, so a 32-bit library there is in the cache;
    // libnvidia-container takes compat32 libraries from the cache alone. A directory of the
    // architecture's own is searched, as before, whether or not ld.so.conf names it (NVIDIA's
    // .run installer can put compat32 libraries in /usr/lib/i386-linux-gnu on a Debian host
    // without libc6:i386, whose i386-linux-gnu.conf would name it). Searching for each
    // compat32 library of the DGX profile cost its discovery 21 system calls (issue 31). The
    // host's own architecture is always searched: a cache stale for it is what the search is
    // there for. Decided once per pass, and only for a profile that has such a capability.
    let foreign_searched = std::cell::OnceCell::new();
    let lib_arch = |files: &crate::profile::CapabilityFiles| {
        capability_arch(files, native).filter(|&a| {
            a == native
                || !probe_first
                || *foreign_searched.get_or_init(|| {
                    entries.iter().any(|e| e.arch() == a)
                        || lib_dirs(a).iter().filter(|d| d.as_str() != "/usr/lib").any(|d| host.resolve_dir(d).is_ok())
                })
        })
    };
    // Fallback directory listings, read once per discovery and keeping only the names of the
    // libraries the cache lacks: a real /usr/lib/x86_64-linux-gnu holds thousands of entries
    // and most optional libraries (compat32, ngx, ...) are absent.
    let mut wanted = Wanted::default();
    for files in profile.capabilities.values() {
        if let Some(arch) = lib_arch(files) {
            for lib in files.libraries.iter().filter(|lib| !cache.has(lib, arch)) {
                wanted.add(lib);
            }
        }
    }
    let mut dirs = DirListings { wanted, by_dir: Default::default(), probe_first, arch_dirs: Vec::new() };
    let mut out: Vec<HostFile> = Vec::new();
    let push = |f: HostFile, out: &mut Vec<HostFile>| {
        if !out.iter().any(|o| o.container_path == f.container_path) {
            out.push(f);
        }
    };
    for (cap, files) in &profile.capabilities {
        let arch = lib_arch(files);
        // Libraries of an architecture this host has no copies of (compat32 on arm64, or on an
        // x86-64 host whose cache has no i386 entry): none.
        let libraries: &[String] = if arch.is_some() { &files.libraries } else { &[] };
        let arch = arch.unwrap_or(native);
        for lib in libraries {
            for f in find_library(host, &cache, &mut dirs, lib, arch, driver_version, cap, warnings) {
                push(f, &mut out);
            }
        }
        for bin in &files.binaries {
            if let Some(f) = find_binary(host, bin, cap) {
                push(f, &mut out);
            }
        }
        for (patterns, kind) in [(&files.files, HostFileKind::File), (&files.firmware, HostFileKind::Firmware)] {
            for pattern in patterns {
                let pattern = match (pattern.contains("{driver_version}"), driver_version) {
                    (false, _) => pattern.clone(),
                    (true, Some(v)) => pattern.replace("{driver_version}", v),
                    (true, None) => continue,
                };
                for path in expand_glob(host, &pattern) {
                    if let Ok((real, st)) = host.resolve_stat(&path)
                        && mountable(&st, kind)
                    {
                        // Mount at the real path so a merged-/usr alias (/lib -> usr/lib) and
                        // its target do not become two mounts of one file.
                        let container_path = super::path_string(&real);
                        push(
                            HostFile {
                                capability: cap.clone(),
                                kind,
                                host_path: host.host_path(&real),
                                container_path,
                            },
                            &mut out,
                        );
                    }
                }
            }
        }
    }
    out
}

/// The library architecture of a capability's files on a host of architecture `native`: the
/// host's own, its 32-bit one for `arch = "i386"` (or `compat32`), `None` when the host has
/// none of that architecture (compat32 on arm64, an `aarch64` capability on x86-64).
fn capability_arch(files: &crate::profile::CapabilityFiles, native: LibArch) -> Option<LibArch> {
    match files.arch.as_deref() {
        None => Some(native),
        Some("i386") | Some("compat32") => native.compat32(),
        Some(other) => LibArch::native(other).filter(|a| *a == native),
    }
}

/// Whether a host path of `kind` is mounted: firmware only as regular files; other `files` also
/// as unix sockets (nvidia-persistenced's, fabric manager's) and directories (the MPS pipe
/// directory), never device nodes (those are device node edits) or FIFOs.
fn mountable(st: &rustix::fs::Stat, kind: HostFileKind) -> bool {
    use rustix::fs::FileType;
    let t = FileType::from_raw_mode(st.st_mode);
    t == FileType::RegularFile || (kind == HostFileKind::File && matches!(t, FileType::Directory | FileType::Socket))
}

/// Whether `st` is a regular file's.
fn is_file(st: &rustix::fs::Stat) -> bool {
    rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile
}

/// Whether file name `name` is library `lib` (`libcuda.so`) itself or a versioned name of it.
fn is_name_of(name: &str, lib: &str) -> bool {
    name == lib || name.strip_prefix(lib).is_some_and(|rest| rest.starts_with('.'))
}

/// The part of a library file name before its version: up to the first `.so` that ends the
/// name or is followed by `.` (`libcuda.so.1` -> `libcuda.so`).
fn so_base(name: &str) -> Option<&str> {
    // Each `.` a candidate, found with memchr (issue 31: `str::find(".so")` set up a two-way
    // searcher per call, 50 k instructions of a discovery).
    let (b, dots) = (name.as_bytes(), super::ByteFinder::new(b'.'));
    let mut from = 0;
    while let Some(dot) = dots.find(&b[from..]).map(|i| from + i) {
        let end = dot + 3;
        if b.get(dot + 1..end) == Some(b"so") && b.get(end).is_none_or(|&c| c == b'.') {
            return Some(&name[..end]);
        }
        from = dot + 1;
    }
    None
}

/// ld.so.cache entries by the library they are a name of: a real cache has ~1500 entries and a
/// profile asks for dozens of libraries, so a scan per library was most of the lookup.
pub struct CacheIndex<'a> {
    entries: &'a [EntryRef<'a>],
    /// The positions of the entries of each wanted base ([`CacheIndex::new`]); a base nobody
    /// asked for is not in it.
    by_base: FoldMap<&'a str, Vec<usize>>,
}

impl<'a> CacheIndex<'a> {
    /// The index of `entries` for libraries `libs` (any other library's entries are still
    /// found, by a scan: [`CacheIndex::named`]). Only the entries whose base is one of theirs
    /// are kept: a real cache's thousand other libraries cost a look-up each, not a list each
    /// (issue 31).
    fn new<'l>(entries: &'a [EntryRef<'a>], libs: impl IntoIterator<Item = &'l String>) -> Self {
        let mut by_base: FoldMap<&'a str, Vec<usize>> = FoldMap::default();
        let wanted: std::collections::HashSet<&str, foldhash::fast::RandomState> =
            libs.into_iter().map(String::as_str).filter(|l| so_base(l) == Some(l)).collect();
        // The first 8 bytes of the wanted bases (a dozen for NVIDIA's: `libnvidi`, `libcuda.`,
        // ...): a key that starts otherwise is none of theirs, told in a few instructions. A
        // base shorter than that leaves every key to the look-up.
        let mut heads: Vec<[u8; 8]> = Vec::new();
        let all_long = wanted.iter().all(|b| b.len() >= 8);
        if all_long {
            heads = wanted.iter().filter_map(|b| b.as_bytes().first_chunk::<8>().copied()).collect();
            heads.sort_unstable();
            heads.dedup();
        }
        if !wanted.is_empty() {
            for (i, e) in entries.iter().enumerate() {
                if all_long && !e.key.as_bytes().first_chunk::<8>().is_some_and(|h| heads.contains(h)) {
                    continue;
                }
                if let Some(b) = so_base(e.key)
                    && wanted.contains(b)
                {
                    by_base.entry(b).or_default().push(i);
                }
            }
        }
        CacheIndex { entries, by_base }
    }

    /// Whether the cache has an entry of `arch` for library `lib` ([`CacheIndex::named`]).
    fn has(&self, lib: &str, arch: LibArch) -> bool {
        !self.named(lib, arch).is_empty()
    }

    /// The entries of `arch` whose key is library `lib` or a versioned name of it
    /// ([`is_name_of`]), in cache order. A `lib` whose own base is itself (`libcuda.so`) has
    /// all of them under that base; any other name is looked for in every entry.
    fn named(&self, lib: &str, arch: LibArch) -> Vec<&'a EntryRef<'a>> {
        let ok = |e: &&EntryRef<'_>| e.arch() == arch && is_name_of(e.key, lib);
        if so_base(lib) == Some(lib) {
            let idx = self.by_base.get(lib).map(Vec::as_slice).unwrap_or_default();
            idx.iter().map(|&i| &self.entries[i]).filter(ok).collect()
        } else {
            self.entries.iter().filter(ok).collect()
        }
    }
}

/// Whether `real` (a resolved file name) belongs to driver `version`; no version: any.
fn version_matches(real: &Path, version: Option<&str>) -> bool {
    let name = real.file_name().and_then(|n| n.to_str()).unwrap_or_default().as_bytes();
    // `name` ends in `.so.{v}`, compared without formatting that suffix for every library.
    version.is_none_or(|v| name.strip_suffix(v.as_bytes()).is_some_and(|rest| rest.ends_with(b".so.")))
}

/// The libraries a pass looks for by scanning directories (those the cache has no entry for):
/// a directory entry is kept when it may be one of their names ([`is_name_of`]).
#[derive(Default)]
struct Wanted<'a> {
    /// Libraries that are their own base (`libcuda.so`): any name of one has that base.
    bases: std::collections::HashSet<&'a str, foldhash::fast::RandomState>,
    /// Any other name (`libfoo`, `libfoo.so.bar.so`): compared with every entry.
    others: Vec<&'a str>,
}

impl<'a> Wanted<'a> {
    fn add(&mut self, lib: &'a str) {
        if so_base(lib) == Some(lib) {
            self.bases.insert(lib);
        } else {
            self.others.push(lib);
        }
    }

    /// Whether directory entry `name` may be a name of a wanted library: if `name` is a name of
    /// a library that is its own base, that library is `name`'s base too (a `.so` earlier in
    /// `name` ending it would be one in the library's name).
    fn may_be(&self, name: &str) -> bool {
        so_base(name).is_some_and(|b| self.bases.contains(b)) || self.others.iter().any(|l| is_name_of(name, l))
    }
}

/// A map keyed by names and paths of the host's library files (foldhash, not std's SipHash: a
/// discovery looks up every library of a profile; the host root is trusted input).
type FoldMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Fallback listings of library directories for one pass: each directory listed at most once
/// as it resolves (on a merged-/usr host `/lib/x86_64-linux-gnu` is `/usr/lib/x86_64-linux-gnu`),
/// keeping the names of the [`Wanted`] libraries, sorted.
struct DirListings<'a> {
    wanted: Wanted<'a>,
    by_dir: FoldMap<PathBuf, Vec<String>>,
    /// The root has a usable ld.so.cache: a library it lacks is looked for by its versioned
    /// file name (`libnvidia-pkcs11.so.580.95.05`) in each directory before the directory is
    /// listed (see [`find_library`]).
    probe_first: bool,
    /// [`lib_dirs`] of each architecture asked for so far, as (directory as named, as it
    /// resolves), without those missing and each real directory once (on a merged-/usr host
    /// `/lib/x86_64-linux-gnu` is `/usr/lib/x86_64-linux-gnu`): resolved once per pass, not
    /// once per library the cache lacks (issue 31: the 18 compat32 libraries of a DGX's
    /// profile, none of them installed, resolved four directories each).
    arch_dirs: Vec<(LibArch, LibDirs)>,
}

/// Library directories as (directory as named, as it resolves), shared by a pass's lookups.
type LibDirs = std::rc::Rc<[(String, PathBuf)]>;

impl DirListings<'_> {
    /// The kept names of library directory `dir` (named as [`lib_dirs`] names it), which
    /// resolves to `real`; empty when it cannot be listed.
    fn get(&mut self, host: &HostRoot, dir: &str, real: &Path) -> &[String] {
        let wanted = &self.wanted;
        match self.by_dir.entry(real.to_path_buf()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(host.list_dir_matching(dir, |n| wanted.may_be(n)).unwrap_or_default())
            }
        }
    }

    /// The library directories of `arch` that exist under `host` ([`DirListings::arch_dirs`]).
    fn dirs_of(&mut self, host: &HostRoot, arch: LibArch) -> LibDirs {
        if let Some((_, dirs)) = self.arch_dirs.iter().find(|(a, _)| *a == arch) {
            return dirs.clone();
        }
        let mut dirs: Vec<(String, PathBuf)> = Vec::new();
        for dir in lib_dirs(arch) {
            let Ok(real) = host.resolve_dir(&dir) else { continue };
            if !dirs.iter().any(|(_, r)| *r == real) {
                dirs.push((dir, real));
            }
        }
        let dirs: LibDirs = dirs.into();
        self.arch_dirs.push((arch, dirs.clone()));
        dirs
    }
}

/// Whether host file `path` (resolved) starts with an ELF header of `arch`.
fn is_elf_of(host: &HostRoot, path: &Path, arch: LibArch) -> bool {
    use std::io::Read;
    let mut head = [0u8; 20];
    host.open(path).map(std::fs::File::from).and_then(|mut f| f.read_exact(&mut head)).is_ok()
        && arch.matches_elf(&head)
}

/// Considers `path` (a cache entry or a scanned name) for library `lib`: a regular file of the
/// driver's `version` goes into `found` as (path as the linker sees it, resolved real path);
/// one of another version is warned about. Returns false when `path` does not resolve in the
/// root at all.
fn consider(
    host: &HostRoot,
    lib: &str,
    version: Option<&str>,
    path: &str,
    found: &mut Vec<(String, PathBuf)>,
    warnings: &mut Warnings,
) -> bool {
    // A name that ends in the driver's version (`libnvidia-glcore.so.580.95.05`) is most often
    // the file itself, looked at with one `stat`; any other (`libcuda.so.1`) most often a link,
    // read first (one system call fewer either way; the same result).
    let named_by_version = version.is_some_and(|v| version_matches(Path::new(path), Some(v)));
    let resolved = if named_by_version { host.resolve_stat(path) } else { host.resolve_stat_link(path) };
    let Ok((real, st)) = resolved else { return false };
    if !is_file(&st) {
        return true;
    }
    if version_matches(&real, version) {
        found.push((path.to_string(), real));
    } else if let Some(v) = version {
        warnings.add(host, &real, format!("{lib} of another driver version (running driver is {v}); not mounted"));
    }
    true
}

/// `dir/lib.version` (`/usr/lib/libcuda.so.580.95.05`), built in one allocation.
fn versioned_path(dir: &Path, lib: &str, version: &str) -> PathBuf {
    let dir = dir.as_os_str();
    let mut p = std::ffi::OsString::with_capacity(dir.len() + lib.len() + version.len() + 2);
    p.push(dir);
    if !dir.as_encoded_bytes().ends_with(b"/") {
        p.push("/");
    }
    p.push(lib);
    p.push(".");
    p.push(version);
    p.into()
}

/// Looks for `lib` by listing the library directories of `arch` (each real directory once).
fn scan_dirs(
    host: &HostRoot,
    dirs_seen: &mut DirListings<'_>,
    lib: &str,
    arch: LibArch,
    version: Option<&str>,
    found: &mut Vec<(String, PathBuf)>,
    warnings: &mut Warnings,
) {
    // A directory reached again by another name (/lib64 -> usr/lib64) holds the same files:
    // each real directory is in the list once.
    for (dir, real_dir) in dirs_seen.dirs_of(host, arch).iter() {
        // With a cache, a library it lacks is most often not installed at all (a profile
        // names every optional library of the driver): its versioned file is looked for
        // first, and only a directory that has it is listed for its soname links. Listing a
        // real /usr/lib/x86_64-linux-gnu (a thousand entries) took 0.4 ms, more than the
        // rest of discovery. Without a cache (or a driver version) every directory is listed,
        // so that a stale library of another version is still named in a warning.
        if dirs_seen.probe_first
            && let Some(v) = version
            && !host.resolve_stat(versioned_path(real_dir, lib, v)).is_ok_and(|(_, st)| is_file(&st))
        {
            continue;
        }
        let listing = dirs_seen.get(host, dir, real_dir);
        // lib64 and lib hold unqualified 64-bit or 32-bit files depending on the distro (and
        // an arm64 copy may sit next to an x86 one): only files of the wanted arch count.
        let names: Vec<String> = listing.iter().filter(|n| is_name_of(n, lib) && n.as_str() != lib).cloned().collect();
        for name in names {
            let path = super::join_str(dir, &name);
            if host.resolve(&path).is_ok_and(|real| is_elf_of(host, &real, arch)) {
                consider(host, lib, version, &path, found, warnings);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn find_library(
    host: &HostRoot,
    cache: &CacheIndex<'_>,
    dirs_seen: &mut DirListings<'_>,
    lib: &str,
    arch: LibArch,
    version: Option<&str>,
    cap: &str,
    warnings: &mut Warnings,
) -> Vec<HostFile> {
    // (path as the linker sees it, resolved real path)
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    let entries = cache.named(lib, arch);
    let mut resolved = 0;
    for e in &entries {
        resolved += usize::from(consider(host, lib, version, e.path, &mut found, warnings));
    }
    if found.is_empty() && entries.is_empty() {
        scan_dirs(host, dirs_seen, lib, arch, version, &mut found, warnings);
    } else if resolved == 0 && !entries.is_empty() {
        // Every path the cache names for the library is missing from this root: a stale cache
        // (a driver reinstalled without ldconfig), or a root that is not all there (a pod that
        // mounts /usr but not a merged /usr's /lib link, which is where a Debian or Ubuntu cache
        // names libraries). Say so, and search the directories as if the cache had no entry,
        // listing them for this library alone.
        warnings.add(
            host,
            entries[0].path,
            format!(
                "ld.so.cache names {lib} here, which is not in this root (a stale cache: run ldconfig; or not all of the root is mounted); searching the library directories"
            ),
        );
        let mut wanted = Wanted::default();
        wanted.add(lib);
        let mut own = DirListings { wanted, by_dir: Default::default(), probe_first: false, arch_dirs: Vec::new() };
        scan_dirs(host, &mut own, lib, arch, version, &mut found, warnings);
    }
    let mut out: Vec<HostFile> = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    for (_, real) in &found {
        if !seen.contains(real) {
            seen.push(real.clone());
            out.push(HostFile {
                capability: cap.to_string(),
                kind: HostFileKind::Library,
                host_path: host.host_path(real),
                container_path: super::path_string(real),
            });
        }
    }
    // Soname paths (the cache keys' paths, or links found by the scan) mount the same file.
    for (path, real) in &found {
        let path = canonical_dir(host, path);
        if path.as_bytes() != real.as_os_str().as_bytes() && !out.iter().any(|o| o.container_path == path) {
            out.push(HostFile {
                capability: cap.to_string(),
                kind: HostFileKind::Library,
                host_path: host.host_path(real),
                container_path: path,
            });
        }
    }
    out
}

/// `path` with its directory resolved in the root (so `/lib64/x` on a merged-/usr host is
/// `/usr/lib64/x`) but its last component kept.
fn canonical_dir(host: &HostRoot, path: &str) -> String {
    match super::rsplit_once_byte(path, b'/') {
        Some((dir, name)) => match host.resolve_dir(if dir.is_empty() { "/" } else { dir }) {
            // `d` resolved and absolute: `d/name` by bytes (Path::join parses both).
            Ok(d) => {
                let mut out = super::path_string(&d);
                out.reserve(name.len() + 1);
                if !out.ends_with('/') {
                    out.push('/');
                }
                out.push_str(name);
                out
            }
            Err(_) => path.to_string(),
        },
        None => path.to_string(),
    }
}

/// Executable `name` of capability `cap`: the first ELF file named so in [`BIN_DIRS`], then
/// [`DRIVER_BIN_DIRS`]; when none of them is ELF, the first regular file found (a script that
/// does its work itself still runs in the container). A wrapper script that execs the real
/// binary by a host path would fail there, since that path is not mounted; preferring the ELF
/// file mounts the binary itself. `None` when no directory has it.
fn find_binary(host: &HostRoot, name: &str, cap: &str) -> Option<HostFile> {
    let mut first = None;
    for dir in BIN_DIRS.iter().chain(DRIVER_BIN_DIRS) {
        let path = super::join_str(dir, name);
        let Ok((real, st)) = host.resolve_stat(&path) else { continue };
        if !is_file(&st) {
            continue;
        }
        let container_path =
            if DRIVER_BIN_DIRS.contains(dir) { super::join_str("/usr/bin", name) } else { canonical_dir(host, &path) };
        let found = HostFile {
            capability: cap.to_string(),
            kind: HostFileKind::Binary,
            host_path: host.host_path(&real),
            container_path,
        };
        if is_elf(host, &real) {
            return Some(found);
        }
        first.get_or_insert(found);
    }
    first
}

/// Whether the file at root path `real` starts with the ELF magic (`\x7fELF`); false when it
/// cannot be opened or read.
fn is_elf(host: &HostRoot, real: &Path) -> bool {
    let Ok(fd) = host.open(real) else { return false };
    let mut magic = [0u8; 4];
    matches!(rustix::io::read(&fd, &mut magic), Ok(4)) && magic == *b"\x7fELF"
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    /// A profile whose `compute` and `compat32` (i386) capabilities both ask for libcuda.so.
    fn compute_and_compat32_profile() -> Profile {
        crate::profile::parse(
            Path::new("t.toml"),
            "name = \"t\"\nkind = \"a.b/c\"\ndiscovery = \"nvidia\"\n[capabilities.compute]\nlibraries = [\"libcuda.so\"]\n[capabilities.compat32]\narch = \"i386\"\nlibraries = [\"libcuda.so\"]\n",
        )
        .unwrap()
    }

    /// `ldconfig -r r`: root `r`'s /etc/ld.so.cache written from its /etc/ld.so.conf; false
    /// (the caller skips) when ldconfig is not there or fails.
    fn ldconfig_in(r: &Path) -> bool {
        std::process::Command::new("/sbin/ldconfig").arg("-r").arg(r).status().is_ok_and(|s| s.success())
    }

    /// A real shared library `rel` (under root `r`) with `soname`, built by gcc (`-m32` with
    /// `m32`); false (the caller skips) when gcc cannot build it.
    fn shared_lib(r: &Path, rel: &str, soname: &str, m32: bool) -> bool {
        let src = r.join("f.c");
        std::fs::write(&src, "int f(void){return 1;}\n").unwrap();
        let out = r.join(rel);
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let mut gcc = std::process::Command::new("gcc");
        gcc.args(["-shared", "-fPIC", "-nostdlib", &format!("-Wl,-soname,{soname}"), "-o"]).arg(&out).arg(&src);
        if m32 {
            gcc.arg("-m32");
        }
        gcc.status().is_ok_and(|s| s.success())
    }

    #[test]
    fn cache_index_finds_what_a_scan_finds() {
        assert_eq!(so_base("libcuda.so.1"), Some("libcuda.so"));
        assert_eq!(so_base("libcuda.so"), Some("libcuda.so"));
        assert_eq!(so_base("libsox.so.3"), Some("libsox.so"));
        assert_eq!(so_base("libfoo.so.bar.so.1"), Some("libfoo.so"));
        assert_eq!(so_base("ld-linux-x86-64.so.2"), Some("ld-linux-x86-64.so"));
        // The rule stated with str::find, on names made of the pieces that matter.
        fn by_find(name: &str) -> Option<&str> {
            let mut from = 0;
            while let Some(i) = name[from..].find(".so").map(|i| from + i + 3) {
                if name.len() == i || name.as_bytes()[i] == b'.' {
                    return Some(&name[..i]);
                }
                from = i;
            }
            None
        }
        let pieces = ["lib", ".", "so", ".so", "x", "1", "é"];
        let mut names = vec![String::new()];
        for _ in 0..4 {
            names = names.iter().flat_map(|n| pieces.iter().map(move |p| format!("{n}{p}"))).collect();
            for n in &names {
                assert_eq!(so_base(n), by_find(n), "{n:?}");
            }
        }
        assert_eq!(so_base("noso"), None);
        let keys = [
            "libcuda.so.1",
            "libcuda.so",
            "libcudadebugger.so.1",
            "libsox.so.3",
            "libfoo.so.bar.so.1",
            "libnvidia-ml.so.1",
            "libnvidia-ml.so.580.95.05",
            "libEGL_nvidia.so.0",
            "libx.sox.so.2",
            "libz.so.1",
            "libnvidia-m.so.1",
        ];
        let paths: Vec<String> = keys.iter().map(|k| format!("/l/{k}")).collect();
        let entries: Vec<EntryRef<'_>> = keys
            .iter()
            .zip(&paths)
            .flat_map(|(k, path)| {
                [0x0303, 0x0a03].map(|flags| EntryRef { key: k, path, flags, osversion: 0, hwcap: 0, hwcaps: None })
            })
            .collect();
        let libs: Vec<String> = [
            "libcuda.so",
            "libcudadebugger.so",
            "libsox.so",
            "libfoo.so",
            "libfoo.so.bar.so",
            "libnvidia-ml.so",
            "libEGL_nvidia.so",
            "libx.sox.so",
            "libx.sox",
            "libcuda",
            "libmissing.so",
        ]
        .map(String::from)
        .into();
        // Indexed for the libraries asked for, as a pass indexes it for its profile's: bases of
        // 8 bytes or more (told apart by their first 8 bytes first), and with a shorter one too
        // (`libz.so`, which turns that off).
        let mut with_short = libs.clone();
        with_short.push("libz.so".into());
        for libs in [&libs, &with_short] {
            let index = CacheIndex::new(&entries, libs);
            assert_eq!(index.named("libcuda.so", LibArch::X86_64).len(), 2, "libcuda.so.1 and libcuda.so");
            assert_eq!(index.named("libcuda.so", LibArch::Aarch64).len(), 2);
            for lib in libs {
                for arch in [LibArch::X86_64, LibArch::Aarch64] {
                    let scan: Vec<&EntryRef<'_>> =
                        entries.iter().filter(|e| e.arch() == arch && is_name_of(e.key, lib)).collect();
                    let found = index.named(lib, arch);
                    assert_eq!(found.len(), scan.len(), "{lib} {arch:?}");
                    assert!(found.iter().zip(&scan).all(|(a, b)| std::ptr::eq(*a, *b)), "{lib} {arch:?}");
                }
            }
        }
    }

    fn profile() -> Profile {
        crate::profile::parse(
            Path::new("t.toml"),
            r#"
name = "t"
kind = "example.com/t"
discovery = "nvidia"
[capabilities.compute]
libraries = ["libcuda.so"]
binaries = ["nvidia-smi"]
[capabilities.base]
firmware = ["/lib/firmware/nvidia/{driver_version}/*"]
"#,
        )
        .unwrap()
    }

    /// Without a cache: the directory scan finds the versioned file and its soname link, skips
    /// and warns about a library of another version, and resolves merged-/usr links.
    #[test]
    fn scan_fallback_versions_and_merged_usr() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        link(r, "/lib", "usr/lib");
        elf(r, "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", 2, 62);
        link(r, "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "libcuda.so.580.95.05");
        link(r, "/usr/lib/x86_64-linux-gnu/libcuda.so", "libcuda.so.1");
        elf(r, "/usr/lib64/libcuda.so.535.104.05", 2, 62);
        // Of the right version but another architecture: never a candidate.
        elf(r, "/usr/lib/libcuda.so.580.95.05", 2, 183);
        file(r, "/usr/bin/nvidia-smi", "bin");
        file(r, "/usr/lib/firmware/nvidia/580.95.05/gsp_ga10x.bin", "fw");
        file(r, "/usr/lib/firmware/nvidia/535.104.05/gsp_ga10x.bin", "old fw");
        let host = HostRoot::new(r);
        let mut w = Warnings::default();
        let files = find(&host, &profile(), Some("580.95.05"), &mut w);
        let got: Vec<(&str, &str)> = files.iter().map(|f| (f.capability.as_str(), f.container_path.as_str())).collect();
        assert_eq!(
            got,
            [
                ("base", "/usr/lib/firmware/nvidia/580.95.05/gsp_ga10x.bin"),
                ("compute", "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"),
                ("compute", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                ("compute", "/usr/bin/nvidia-smi"),
            ]
        );
        assert!(files.iter().all(|f| f.host_path.starts_with(r)));
        assert_eq!(files[2].host_path, r.join("usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"));
        assert!(
            w.0.iter()
                .any(|x| x.path == r.join("usr/lib64/libcuda.so.535.104.05")
                    && x.message.contains("another driver version")),
            "{:?}",
            w.0
        );
    }

    /// A host that keeps its driver under /usr/local/nvidia and has only wrapper scripts in
    /// /usr/bin (the H200 VM where scripts/gpu-check ran on 2026-12-04; the container's
    /// `nvidia-smi` failed with "exec: /usr/local/nvidia/bin/nvidia-smi: not found"): the ELF
    /// binary is mounted at /usr/bin/nvidia-smi instead of the script. Where /usr/bin holds the
    /// ELF binary itself, that one is mounted, as before.
    #[test]
    fn driver_prefix_binaries_win_over_wrapper_scripts() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        file(r, "/usr/bin/nvidia-smi", "#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n");
        elf(r, "/usr/local/nvidia/bin/nvidia-smi", 2, 62);
        let smi = |r: &Path| {
            let files = find(&HostRoot::new(r), &profile(), Some("580.95.05"), &mut Warnings::default());
            let f = files.into_iter().find(|f| f.container_path.ends_with("/nvidia-smi")).expect("nvidia-smi found");
            (f.container_path, f.host_path)
        };
        assert_eq!(smi(r), ("/usr/bin/nvidia-smi".to_string(), r.join("usr/local/nvidia/bin/nvidia-smi")));
        std::fs::remove_file(r.join("usr/bin/nvidia-smi")).unwrap();
        elf(r, "/usr/bin/nvidia-smi", 2, 62);
        assert_eq!(smi(r), ("/usr/bin/nvidia-smi".to_string(), r.join("usr/bin/nvidia-smi")));
        // Only the driver prefix has it: still on PATH in the container.
        std::fs::remove_file(r.join("usr/bin/nvidia-smi")).unwrap();
        assert_eq!(smi(r), ("/usr/bin/nvidia-smi".to_string(), r.join("usr/local/nvidia/bin/nvidia-smi")));
    }

    /// A root whose ld.so.cache names the driver's libraries under /lib/x86_64-linux-gnu (as
    /// Debian's and Ubuntu's do) but lacks the merged /usr's `lib -> usr/lib` link (a pod that
    /// mounts /usr and not all of the root): the libraries are still found in the directories,
    /// and a warning names the cache's path. (Before, discovery found none and said nothing.)
    #[test]
    fn cache_entries_missing_from_the_root_are_warned_and_searched_for() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        if !shared_lib(r, "usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", "libcuda.so.1", false) {
            eprintln!("SKIPPED: gcc unavailable");
            return;
        }
        link(r, "/lib", "usr/lib");
        file(r, "/etc/ld.so.conf", "/lib/x86_64-linux-gnu\n");
        if !ldconfig_in(r) {
            eprintln!("SKIPPED: ldconfig unavailable");
            return;
        }
        let p = crate::profile::parse(
            Path::new("t.toml"),
            "name = \"t\"\nkind = \"a.b/c\"\ndiscovery = \"nvidia\"\n[capabilities.compute]\nlibraries = [\"libcuda.so\"]\n",
        )
        .unwrap();
        let with_link = find(&HostRoot::new(r), &p, Some("580.95.05"), &mut Warnings::default());
        assert_eq!(
            with_link.iter().map(|f| f.container_path.as_str()).collect::<Vec<_>>(),
            ["/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"]
        );
        std::fs::remove_file(r.join("lib")).unwrap();
        let mut w = Warnings::default();
        let files = find(&HostRoot::new(r), &p, Some("580.95.05"), &mut w);
        assert_eq!(
            files.iter().map(|f| f.container_path.as_str()).collect::<Vec<_>>(),
            ["/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"]
        );
        assert!(
            w.0.iter().any(
                |x| x.path.ends_with("lib/x86_64-linux-gnu/libcuda.so.1") && x.message.contains("not in this root")
            ),
            "{:?}",
            w.0
        );
    }

    /// Issue 13 item 2: an arm64 host (its /proc/sys/kernel/arch says aarch64) gets its
    /// libraries from the aarch64 multiarch directory, not the x86-64 copies next to them, and
    /// no compat32 libraries (there are none for Arm data-center GPUs).
    #[test]
    fn item2_arm64_host_scans_its_multiarch_directory_by_elf_machine() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        file(r, "/proc/sys/kernel/arch", "aarch64\n");
        link(r, "/lib", "usr/lib");
        elf(r, "/usr/lib/aarch64-linux-gnu/libcuda.so.580.95.05", 2, 183);
        link(r, "/usr/lib/aarch64-linux-gnu/libcuda.so.1", "libcuda.so.580.95.05");
        elf(r, "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", 2, 62);
        elf(r, "/usr/lib64/libcuda.so.580.95.05", 2, 62);
        elf(r, "/usr/lib/i386-linux-gnu/libcuda.so.580.95.05", 1, 3);
        let host = HostRoot::new(r);
        assert_eq!(host_arch(&host, &host), LibArch::Aarch64);
        let p = compute_and_compat32_profile();
        let mut w = Warnings::default();
        let files = find(&host, &p, Some("580.95.05"), &mut w);
        let got: Vec<(&str, &str)> = files.iter().map(|f| (f.capability.as_str(), f.container_path.as_str())).collect();
        assert_eq!(
            got,
            [
                ("compute", "/usr/lib/aarch64-linux-gnu/libcuda.so.580.95.05"),
                ("compute", "/usr/lib/aarch64-linux-gnu/libcuda.so.1"),
            ]
        );
    }

    /// The cache flags of an arm64 cache (written by aarch64 ldconfig: 0x0a03, `libc6,AArch64`).
    #[test]
    fn item2_aarch64_cache_flags_are_aarch64() {
        let e = ldcache::CacheEntry {
            key: "libcuda.so.1".into(),
            path: "/lib/aarch64-linux-gnu/libcuda.so.1".into(),
            flags: 0x0a03,
        };
        assert_eq!(e.arch(), LibArch::Aarch64);
        // Discovery reads the same entry borrowed from the file.
        let r = EntryRef { key: &e.key, path: &e.path, flags: 0x0a03, osversion: 0, hwcap: 0, hwcaps: None };
        assert_eq!(r.arch(), LibArch::Aarch64);
        assert_eq!(LibArch::native("aarch64\n"), Some(LibArch::Aarch64));
        assert_eq!(LibArch::native("x86_64"), Some(LibArch::X86_64));
        assert_eq!(LibArch::Aarch64.compat32(), None);
    }

    /// compat32 takes the i386 copy from the cache, compute the x86-64 one; same soname.
    #[test]
    fn compat32_picks_i386_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        for (dir, m32) in [("usr/lib/x86_64-linux-gnu", false), ("usr/lib/i386-linux-gnu", true)] {
            if !shared_lib(r, &format!("{dir}/libcuda.so.580.95.05"), "libcuda.so.1", m32) {
                eprintln!("SKIPPED: gcc (with -m32) unavailable");
                return;
            }
        }
        file(r, "/etc/ld.so.conf", "/usr/lib/x86_64-linux-gnu\n/usr/lib/i386-linux-gnu\n");
        if !ldconfig_in(r) {
            eprintln!("SKIPPED: ldconfig unavailable");
            return;
        }
        let p = compute_and_compat32_profile();
        let mut w = Warnings::default();
        let files = find(&HostRoot::new(r), &p, Some("580.95.05"), &mut w);
        let got: Vec<(&str, &str)> = files.iter().map(|f| (f.capability.as_str(), f.container_path.as_str())).collect();
        assert_eq!(
            got,
            [
                ("compat32", "/usr/lib/i386-linux-gnu/libcuda.so.580.95.05"),
                ("compat32", "/usr/lib/i386-linux-gnu/libcuda.so.1"),
                ("compute", "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"),
                ("compute", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            ]
        );
        assert!(w.0.is_empty(), "{:?}", w.0);
    }

    /// With a usable cache that has no i386 entry at all and no i386 directory of its own on the
    /// host, compat32 libraries are not searched for (a 32-bit library in /usr/lib would be in
    /// the cache; libnvidia-container reads them from the cache alone); with an i386 directory
    /// (even one ld.so.conf does not name), with any i386 entry in the cache, or without a
    /// cache, a 32-bit library the cache lacks is still found by the search.
    #[test]
    fn compat32_is_searched_only_where_the_host_may_have_i386_libraries() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        if !shared_lib(r, "usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", "libcuda.so.1", false) {
            eprintln!("SKIPPED: gcc unavailable");
            return;
        }
        file(r, "/etc/ld.so.conf", "/usr/lib/x86_64-linux-gnu\n");
        let ldconfig = || ldconfig_in(r);
        if !ldconfig() {
            eprintln!("SKIPPED: ldconfig unavailable");
            return;
        }
        let p = compute_and_compat32_profile();
        let found = || {
            let mut w = Warnings::default();
            let files = find(&HostRoot::new(r), &p, Some("580.95.05"), &mut w);
            files.iter().map(|f| format!("{} {}", f.capability, f.container_path)).collect::<Vec<_>>()
        };
        let compute = [
            "compute /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
            "compute /usr/lib/x86_64-linux-gnu/libcuda.so.1",
        ];
        // A 32-bit libcuda (ELFCLASS32, EM_386) in /usr/lib, put there after ldconfig ran, on a
        // host without an i386 directory: not searched for.
        elf(r, "/usr/lib/libcuda.so.580.95.05", 1, 3);
        assert_eq!(found(), compute, "no i386 entry, no i386 directory");

        // No cache at all: every directory is searched, as before.
        let cache = std::fs::read(r.join("etc/ld.so.cache")).unwrap();
        std::fs::remove_file(r.join("etc/ld.so.cache")).unwrap();
        assert_eq!(found()[0], "compat32 /usr/lib/libcuda.so.580.95.05", "no cache");
        std::fs::write(r.join("etc/ld.so.cache"), &cache).unwrap();
        std::fs::remove_file(r.join("usr/lib/libcuda.so.580.95.05")).unwrap();

        // An i386 directory that ld.so.conf does not name, holding it: searched.
        elf(r, "/usr/lib/i386-linux-gnu/libcuda.so.580.95.05", 1, 3);
        let with_dir = found();
        assert_eq!(with_dir[0], "compat32 /usr/lib/i386-linux-gnu/libcuda.so.580.95.05", "{with_dir:?}");
        assert_eq!(with_dir[1..], compute, "{with_dir:?}");
        std::fs::remove_dir_all(r.join("usr/lib/i386-linux-gnu")).unwrap();

        // Any i386 library in the cache (here in /usr/lib32, named by ld.so.conf), then the
        // 32-bit libcuda installed after ldconfig into /usr/lib: searched.
        if !shared_lib(r, "usr/lib32/libother.so.1", "libother.so.1", true) {
            eprintln!("SKIPPED: gcc -m32 unavailable");
            return;
        }
        file(r, "/etc/ld.so.conf", "/usr/lib/x86_64-linux-gnu\n/usr/lib32\n");
        assert!(ldconfig());
        std::fs::remove_dir_all(r.join("usr/lib32")).unwrap();
        elf(r, "/usr/lib/libcuda.so.580.95.05", 1, 3);
        let with_i386 = found();
        assert_eq!(with_i386[0], "compat32 /usr/lib/libcuda.so.580.95.05", "{with_i386:?}");
    }

    /// With a cache: a library it lacks (installed after ldconfig last ran) is still found in the
    /// standard directories by its versioned name, with its soname link; one of another driver
    /// version is not mounted.
    #[test]
    fn library_the_cache_lacks_is_found_by_its_versioned_name() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        if !shared_lib(r, "usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", "libcuda.so.1", false) {
            eprintln!("SKIPPED: gcc unavailable");
            return;
        }
        file(r, "/etc/ld.so.conf", "/usr/lib/x86_64-linux-gnu\n");
        if !ldconfig_in(r) {
            eprintln!("SKIPPED: ldconfig unavailable");
            return;
        }
        // After ldconfig: one library of this driver, one of another (neither in the cache).
        elf(r, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05", 2, 62);
        link(r, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "libnvidia-ml.so.580.95.05");
        elf(r, "/usr/lib64/libnvidia-cfg.so.535.104.05", 2, 62);
        link(r, "/usr/lib64/libnvidia-cfg.so.1", "libnvidia-cfg.so.535.104.05");
        let p = crate::profile::parse(
            Path::new("t.toml"),
            "name = \"t\"\nkind = \"a.b/c\"\ndiscovery = \"nvidia\"\n[capabilities.utility]\nlibraries = [\"libnvidia-ml.so\", \"libnvidia-cfg.so\", \"libnvidia-nscq.so\"]\n[capabilities.compute]\nlibraries = [\"libcuda.so\"]\n",
        )
        .unwrap();
        let host = HostRoot::new(r);
        let mut w = Warnings::default();
        let files = find(&host, &p, Some("580.95.05"), &mut w);
        let got: Vec<&str> = files.iter().map(|f| f.container_path.as_str()).collect();
        assert_eq!(
            got,
            [
                "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            ]
        );
        assert_eq!(files[3].host_path, r.join("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05"));
    }

    /// With a cache written by ldconfig: the cache decides, and a stale cache entry warns.
    #[test]
    fn cache_lookup_with_ldconfig() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        for (file, soname) in
            [("libcuda.so.580.95.05", "libcuda.so.1"), ("libnvidia-ml.so.470.1.2", "libnvidia-ml.so.1")]
        {
            if !shared_lib(r, &format!("opt/drv/lib/{file}"), soname, false) {
                eprintln!("SKIPPED: gcc unavailable");
                return;
            }
        }
        file(r, "/etc/ld.so.conf", "/opt/drv/lib\n");
        if !ldconfig_in(r) {
            eprintln!("SKIPPED: ldconfig unavailable");
            return;
        }
        let p = crate::profile::parse(
            Path::new("t.toml"),
            "name = \"t\"\nkind = \"a.b/c\"\ndiscovery = \"nvidia\"\n[capabilities.utility]\nlibraries = [\"libnvidia-ml.so\"]\n[capabilities.compute]\nlibraries = [\"libcuda.so\"]\n",
        )
        .unwrap();
        let host = HostRoot::new(r);
        let mut w = Warnings::default();
        let files = find(&host, &p, Some("580.95.05"), &mut w);
        let got: Vec<&str> = files.iter().map(|f| f.container_path.as_str()).collect();
        assert_eq!(got, ["/opt/drv/lib/libcuda.so.580.95.05", "/opt/drv/lib/libcuda.so.1"]);
        assert!(w.0.iter().any(|x| x.path == r.join("opt/drv/lib/libnvidia-ml.so.470.1.2")), "{:?}", w.0);
    }
}
