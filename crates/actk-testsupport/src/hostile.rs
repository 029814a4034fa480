//! Hostile image files of issue 29 (findings 2-4), built byte for byte, for the unit tests of
//! the readers, the end-to-end tests (crates/e2e/tests/hostile_files.rs) and the bench
//! (benches/hostile-bench.sh, through `cargo run -p actk-testsupport --example hostile_image`):
//!
//! - [`amplifying_cache`]: an `/etc/ld.so.cache` whose entries all name one long string;
//! - [`crafted_elf`]: a shared object with many `PT_NOTE` segments and thousands of
//!   `DT_NEEDED` entries, which a reader that reads each one costs megabytes;
//! - [`compat_drop_in_flood`]: `00-compat-*.conf` drop-ins with hundreds of thousands of
//!   distinct directory lines;
//! - [`plant`]: one of those into a rootfs; [`node`]: a device node (`c 1 11`, as finding 4's
//!   image ships) or a FIFO;
//! - [`OpenWatch`]: proof that actk never opened such a node (inotify `IN_OPEN`).

use anyhow::{Context, Result};
use rustix::fd::OwnedFd;
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};

/// A new-format ld.so.cache (`glibc-ld.so.cache1.1`, glibc `dl-cache.h`) of `entries` entries
/// whose soname and path all name one string of `string_len` bytes (`a`s). Finding 2 as filed:
/// 349,000 entries and an 8 MiB string (16 MB in all, the largest cache actk-inject reads).
pub fn amplifying_cache(entries: usize, string_len: usize) -> Vec<u8> {
    let strings_at = (48 + entries * 24) as u32;
    let mut out = b"glibc-ld.so.cache1.1".to_vec();
    out.extend_from_slice(&(entries as u32).to_le_bytes());
    out.extend_from_slice(&(string_len as u32 + 1).to_le_bytes());
    out.extend_from_slice(&[2, 0, 0, 0]);
    out.extend_from_slice(&[0; 16]);
    for _ in 0..entries {
        for x in [0x0303u32, strings_at, strings_at, 0] {
            out.extend_from_slice(&x.to_le_bytes());
        }
        out.extend_from_slice(&0u64.to_le_bytes());
    }
    out.resize(out.len() + string_len, b'a');
    out.push(0);
    out
}

/// The shape of a [`crafted_elf`].
#[derive(Debug, Clone, Copy)]
pub struct CraftedElf {
    /// `PT_NOTE` segments (program headers are at most 256 with the `PT_LOAD` and `PT_DYNAMIC`).
    pub notes: usize,
    /// Bytes of the one note area every `PT_NOTE` names (one note that is not the ABI tag).
    pub note_size: usize,
    /// `DT_NEEDED` entries, all naming a library that is not libc.
    pub needed: usize,
    /// ELFCLASS64 x86-64 (true) or ELFCLASS32 i386 (false, where `DT_NEEDED` decides the type).
    pub wide: bool,
}

impl CraftedElf {
    /// Finding 3 as filed: 254 notes of 64 KiB and 4000 `DT_NEEDED`, x86-64.
    pub const FLOOD: CraftedElf = CraftedElf { notes: 254, note_size: 64 * 1024, needed: 4000, wide: true };
}

/// A shared object (`ET_DYN`, soname `libflood.so.1`) ldconfig would index, shaped as `shape`
/// says: a reader that reads every `PT_NOTE` whole and every `DT_NEEDED` name with a 4 KiB read
/// spends about 16 MiB on each (the file itself is ~150 KB). Layout: header, program headers,
/// the note area, the dynamic section, the string table, 4 KiB of zeros.
pub fn crafted_elf(shape: CraftedElf) -> Vec<u8> {
    let CraftedElf { notes, note_size, needed, wide } = shape;
    let (ehsize, phentsize, dynent) = if wide { (64, 56, 16) } else { (52, 32, 8) };
    let phnum = 2 + notes;
    let note_off = (ehsize + phnum * phentsize).next_multiple_of(8);
    let dyn_off = (note_off + note_size).next_multiple_of(8);
    let dyn_size = (needed + 3) * dynent;
    let str_off = dyn_off + dyn_size;
    let strtab: &[u8] = b"\0libflood.so.1\0libnothing.so.0\0";
    let (soname, other) = (1u64, 15u64);
    let len = str_off + strtab.len() + 4096;
    let mut f = vec![0u8; len];
    let put = |f: &mut Vec<u8>, at: usize, v: u64, n: usize| f[at..at + n].copy_from_slice(&v.to_le_bytes()[..n]);
    f[..4].copy_from_slice(b"\x7fELF");
    f[4] = if wide { 2 } else { 1 };
    f[5] = 1;
    f[6] = 1;
    put(&mut f, 16, 3, 2); // ET_DYN
    put(&mut f, 18, if wide { 62 } else { 3 }, 2);
    put(&mut f, 20, 1, 4);
    if wide {
        put(&mut f, 32, ehsize as u64, 8); // e_phoff
        put(&mut f, 52, ehsize as u64, 2);
        put(&mut f, 54, phentsize as u64, 2);
        put(&mut f, 56, phnum as u64, 2);
    } else {
        put(&mut f, 28, ehsize as u64, 4);
        put(&mut f, 40, ehsize as u64, 2);
        put(&mut f, 42, phentsize as u64, 2);
        put(&mut f, 44, phnum as u64, 2);
    }
    // (type, offset = vaddr, filesz, align); the one PT_LOAD maps the file at address 0.
    let mut phdrs = vec![(1u64, 0u64, len as u64, 0x1000u64), (2, dyn_off as u64, dyn_size as u64, 8)];
    phdrs.extend((0..notes).map(|_| (4, note_off as u64, note_size as u64, 4)));
    for (i, (kind, off, size, align)) in phdrs.into_iter().enumerate() {
        let at = ehsize + i * phentsize;
        if wide {
            put(&mut f, at, kind, 4);
            put(&mut f, at + 4, 4, 4); // PF_R
            put(&mut f, at + 8, off, 8);
            put(&mut f, at + 16, off, 8);
            put(&mut f, at + 24, off, 8);
            put(&mut f, at + 32, size, 8);
            put(&mut f, at + 40, size, 8);
            put(&mut f, at + 48, align, 8);
        } else {
            put(&mut f, at, kind, 4);
            put(&mut f, at + 4, off, 4);
            put(&mut f, at + 8, off, 4);
            put(&mut f, at + 12, off, 4);
            put(&mut f, at + 16, size, 4);
            put(&mut f, at + 20, size, 4);
            put(&mut f, at + 24, 4, 4);
            put(&mut f, at + 28, align, 4);
        }
    }
    if note_size >= 16 {
        // One note that is not NT_GNU_ABI_TAG, filling the area: the ABI tag search reads it all.
        put(&mut f, note_off, 4, 4);
        put(&mut f, note_off + 4, (note_size - 16) as u64, 4);
        put(&mut f, note_off + 8, 0x99, 4);
        f[note_off + 12..note_off + 16].copy_from_slice(b"ACTK");
    }
    let mut dyns = vec![(1u64, other); needed];
    dyns.extend([(5, str_off as u64), (14, soname), (0, 0)]);
    for (i, (tag, val)) in dyns.into_iter().enumerate() {
        let at = dyn_off + i * dynent;
        let half = dynent / 2;
        put(&mut f, at, tag, half);
        put(&mut f, at + half, val, half);
    }
    f[str_off..str_off + strtab.len()].copy_from_slice(strtab);
    f
}

/// Drop-ins `00-compat-flood-NNN.conf` holding `lines` distinct absolute directory lines in
/// all (`/c/0`, `/c/1`, ...), 64 KiB per file at most (what actk reads of one drop-in): finding 3's
/// drop-in flood is 226,000 lines. Returns (file name, contents) pairs.
pub fn compat_drop_in_flood(lines: usize) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut cur = Vec::new();
    for i in 0..lines {
        let line = format!("/c/{i:x}\n");
        if cur.len() + line.len() > 64 * 1024 {
            files.push(std::mem::take(&mut cur));
        }
        cur.extend_from_slice(line.as_bytes());
    }
    if !cur.is_empty() {
        files.push(cur);
    }
    files.into_iter().enumerate().map(|(i, b)| (format!("00-compat-flood-{i:03}.conf"), b)).collect()
}

/// The hostile classes [`plant`] puts into a rootfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// `/etc/ld.so.cache` is [`amplifying_cache`]`(349_000, 8 MiB)`.
    AmplifyingCache,
    /// `links` symlinks `libflood<N>.so.1` in `dir` to one [`crafted_elf`]`(FLOOD)` there.
    ElfFlood,
    /// [`compat_drop_in_flood`]`(226_000)` in `/etc/ld.so.conf.d`.
    DropInFlood,
}

/// Puts `class` into `rootfs`; `lib_dir` is the (container) library directory actk will scan
/// (the ELF flood goes there), `links` the number of links of the ELF flood.
///
/// Errors: a file cannot be written.
pub fn plant(rootfs: &Path, class: Class, lib_dir: &str, links: usize) -> Result<()> {
    let at = |p: &str| rootfs.join(p.trim_start_matches('/'));
    match class {
        Class::AmplifyingCache => {
            std::fs::create_dir_all(at("/etc"))?;
            std::fs::write(at("/etc/ld.so.cache"), amplifying_cache(349_000, 8 << 20))
                .context("writing the amplifying cache")?;
        }
        Class::ElfFlood => {
            let dir = at(lib_dir);
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("libflood-real.so.1.0"), crafted_elf(CraftedElf::FLOOD))
                .context("writing the crafted ELF")?;
            for i in 0..links {
                let link = dir.join(format!("libflood{i}.so.1"));
                let _ = std::fs::remove_file(&link);
                std::os::unix::fs::symlink("libflood-real.so.1.0", &link).context("linking the crafted ELF")?;
            }
        }
        Class::DropInFlood => {
            let d = at("/etc/ld.so.conf.d");
            std::fs::create_dir_all(&d)?;
            for (name, body) in compat_drop_in_flood(226_000) {
                std::fs::write(d.join(name), body).context("writing a compat drop-in")?;
            }
        }
    }
    Ok(())
}

/// Makes a node at `p`: a character device 1:11 (`/dev/kmsg`'s numbers, finding 4's image) for
/// [`rustix::fs::FileType::CharacterDevice`], else a FIFO. Needs root for the device.
///
/// Errors: mknod fails.
pub fn node(p: &Path, kind: rustix::fs::FileType) -> Result<()> {
    let (kind, dev) = match kind {
        rustix::fs::FileType::CharacterDevice => (kind, rustix::fs::makedev(1, 11)),
        _ => (rustix::fs::FileType::Fifo, 0),
    };
    rustix::fs::mknodat(rustix::fs::CWD, p, kind, rustix::fs::Mode::from_raw_mode(0o644), dev)
        .with_context(|| format!("mknod {}", p.display()))
}

/// Watches files for being opened (inotify `IN_OPEN`): an `O_PATH` descriptor raises no such
/// event, a real open (which, for a device node, runs its driver's `open`) does, from any
/// process and mount namespace (the watch is on the inode).
pub struct OpenWatch {
    fd: OwnedFd,
    paths: HashMap<i32, PathBuf>,
}

impl OpenWatch {
    /// Watches each of `paths` (not following a symlink there).
    ///
    /// Errors: inotify cannot be set up or a path watched.
    pub fn new(paths: &[&Path]) -> Result<OpenWatch> {
        let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC).context("inotify_init1")?;
        let mut map = HashMap::new();
        for p in paths {
            let wd = inotify::add_watch(&fd, *p, WatchFlags::OPEN | WatchFlags::DONT_FOLLOW)
                .with_context(|| format!("inotify watch on {}", p.display()))?;
            map.insert(wd, p.to_path_buf());
        }
        Ok(OpenWatch { fd, paths: map })
    }

    /// The watched paths opened since the last call, sorted.
    pub fn opened(&self) -> Vec<PathBuf> {
        let mut buf = [MaybeUninit::uninit(); 4096];
        let mut r = inotify::Reader::new(&self.fd, &mut buf);
        let mut out = Vec::new();
        while let Ok(ev) = r.next() {
            if ev.events().contains(ReadFlags::OPEN)
                && let Some(p) = self.paths.get(&ev.wd())
            {
                out.push(p.clone());
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flood_files_have_the_shapes_of_the_findings() {
        let cache = amplifying_cache(349_000, 8 << 20);
        assert!(cache.len() <= 16 << 20 && cache.len() > 16_000_000, "{}", cache.len());
        let elf = crafted_elf(CraftedElf::FLOOD);
        assert!(elf.len() < 160 * 1024, "{}", elf.len());
        assert_eq!(u16::from_le_bytes([elf[56], elf[57]]), 256, "256 program headers");
        let drop_ins = compat_drop_in_flood(226_000);
        let lines: usize = drop_ins.iter().map(|(_, b)| b.iter().filter(|&&c| c == b'\n').count()).sum();
        assert_eq!(lines, 226_000);
        assert!(drop_ins.iter().all(|(_, b)| b.len() <= 64 * 1024));
    }
}
