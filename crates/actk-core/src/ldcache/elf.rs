//! What ldconfig reads from a shared library: its soname, the cache flags (type and
//! architecture) and the OS ABI version, from the ELF header, program headers, the dynamic
//! section and its string table.
//!
//! Followed from glibc 2.36 `elf/readelflib.c` (`process_elf_file`), `elf/readlib.c`
//! (`interpreters`, `known_libs`) and the architecture wrappers
//! (`sysdeps/unix/sysv/linux/x86_64/readelflib.c`, `.../aarch64/readelflib.c`):
//! - only `ET_DYN` files with a `PT_DYNAMIC` segment and a `DT_STRTAB` are libraries;
//! - the type is `FLAG_ELF` (1), or `FLAG_ELF_LIBC6` (3) when `PT_INTERP` is a glibc loader or
//!   a `DT_NEEDED` entry is `libc.so.6`/`libm.so.6`; x86-64 and AArch64 libraries are always
//!   libc6 with their architecture bits (`0x0303` x86-64, `0x0803` x32, `0x0a03` AArch64);
//!   32-bit x86 libraries carry no architecture bits; other machines are not indexed;
//! - the OS version is the first `NT_GNU_ABI_TAG` note of a `PT_NOTE` segment.
//!
//! Input is an untrusted file (a container image's): reads are `pread`s of bounded size at
//! bounds-checked offsets, never the whole file, at most [`MAX_FILE_BYTES`] in
//! [`MAX_FILE_READS`] reads per file; what glibc computes and then overrides is not read (the
//! interpreter and `DT_NEEDED` names of libraries an architecture wrapper types, every
//! `DT_SONAME` but the last); bad input is an error, never a panic.

use std::os::unix::fs::FileExt;

/// What ldconfig needs of one library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibInfo {
    /// `DT_SONAME`, when the library has one (else ldconfig uses the file name).
    pub soname: Option<String>,
    /// ldconfig's flags for the cache entry.
    pub flags: i32,
    /// OS ABI version from the ABI note (`0x030200` for Linux 3.2.0), `0` when none.
    pub osversion: u32,
}

/// Why a file is not indexed (ldconfig skips it with a message; so does actk).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElfError {
    /// Not an ELF file, or a truncated or inconsistent one.
    #[error("not a usable ELF shared library: {0}")]
    Invalid(&'static str),
    /// An ELF file for a machine this architecture's loader does not read.
    #[error("ELF machine {0} is not loaded on this architecture")]
    Machine(u16),
    /// An I/O error while reading.
    #[error("read error: {0}")]
    Io(String),
    /// Reading it would take more than [`MAX_FILE_BYTES`] or [`MAX_FILE_READS`] (or the budget
    /// given to [`library_info_within`]): no real library does.
    #[error(
        "not indexed: reading it would go past the reader's limit of {MAX_FILE_BYTES} bytes in {MAX_FILE_READS} reads"
    )]
    Limit,
}

const FLAG_ELF: i32 = 0x0001;
const FLAG_ELF_LIBC6: i32 = 0x0003;
const FLAG_X8664_LIB64: i32 = 0x0300;
const FLAG_X8664_LIBX32: i32 = 0x0800;
const FLAG_AARCH64_LIB64: i32 = 0x0a00;

const EM_386: u16 = 3;
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const PT_NOTE: u32 = 4;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_SONAME: u64 = 14;

/// Program headers read at most (real libraries have about 10).
const MAX_PHDRS: usize = 256;
/// Dynamic entries read at most (real libraries have a few dozen).
const MAX_DYN: usize = 4096;
/// Longest soname read.
const MAX_NAME: usize = 4096;
/// Largest note segment read for the ABI tag.
const MAX_NOTE: u64 = 64 * 1024;
/// Bytes [`library_info`] reads from one file at most. A real library needs a few KB (header,
/// program headers, notes, dynamic section, names); a file that would need more is crafted to
/// cost (issue 29, finding 3: many `PT_NOTE` segments, thousands of `DT_NEEDED` entries) and
/// is not indexed ([`ElfError::Limit`]).
pub const MAX_FILE_BYTES: u64 = 256 * 1024;
/// `pread`s [`library_info`] makes on one file at most (a real library needs about ten).
pub const MAX_FILE_READS: u32 = 256;

/// Reads [`LibInfo`] from `file` (`len` bytes long) within [`MAX_FILE_BYTES`] and
/// [`MAX_FILE_READS`]; see the module docs.
pub fn library_info(file: &std::fs::File, len: u64) -> Result<LibInfo, ElfError> {
    library_info_within(file, len, MAX_FILE_BYTES).0
}

/// [`library_info`] reading at most `max_bytes` (and [`MAX_FILE_READS`] reads): a caller with a
/// budget over many files passes what is left of it. Returns the result and the bytes read,
/// which never exceed `max_bytes` (a read that would is not made: [`ElfError::Limit`]).
pub fn library_info_within(file: &std::fs::File, len: u64, max_bytes: u64) -> (Result<LibInfo, ElfError>, u64) {
    let mut r = Reader { file, len, bytes_left: max_bytes, reads_left: MAX_FILE_READS, used: 0 };
    let info = read_info(&mut r);
    (info, r.used)
}

fn read_info(r: &mut Reader<'_>) -> Result<LibInfo, ElfError> {
    // Both header sizes (52 and 64 bytes) in one read; fields are taken from the buffer.
    let head = r.bytes(0, r.len.min(64) as usize)?;
    if head.len() < 16 {
        return Err(ElfError::Invalid("truncated file"));
    }
    if head[..4] != *b"\x7fELF" {
        return Err(ElfError::Invalid("no ELF magic"));
    }
    let wide = match head[4] {
        1 => false,
        2 => true,
        _ => return Err(ElfError::Invalid("unknown ELF class")),
    };
    if head[5] != 1 {
        return Err(ElfError::Invalid("not little-endian"));
    }
    if head.len() < if wide { 64 } else { 52 } {
        return Err(ElfError::Invalid("truncated file"));
    }
    let h = Le(&head);
    if h.u16(16) != 3 {
        return Err(ElfError::Invalid("not a shared object (ET_DYN)"));
    }
    let machine = h.u16(18);
    // The architecture wrappers of readelflib.c, for the loader of the machine actk runs on.
    let arch_flags = match (machine, wide) {
        (EM_X86_64, true) if cfg!(target_arch = "x86_64") => Some(FLAG_X8664_LIB64 | FLAG_ELF_LIBC6),
        (EM_X86_64, false) if cfg!(target_arch = "x86_64") => Some(FLAG_X8664_LIBX32 | FLAG_ELF_LIBC6),
        (EM_386, false) if cfg!(target_arch = "x86_64") => None,
        (EM_AARCH64, true) if cfg!(target_arch = "aarch64") => Some(FLAG_AARCH64_LIB64 | FLAG_ELF_LIBC6),
        _ => return Err(ElfError::Machine(machine)),
    };
    let (phoff, phentsize, phnum) =
        if wide { (h.u64(32), h.u16(54), h.u16(56)) } else { (h.u32(28) as u64, h.u16(42), h.u16(44)) };
    let want = if wide { 56 } else { 32 };
    if phentsize as usize != want || phnum as usize > MAX_PHDRS {
        return Err(ElfError::Invalid("bad program header table"));
    }
    let table = r.bytes(phoff, phnum as usize * want)?;
    let mut flag = FLAG_ELF;
    let mut osversion = 0;
    let mut dynamic = None;
    let mut loads = Vec::new();
    for raw in table.chunks_exact(want) {
        let p = Le(raw);
        let ph = if wide {
            Phdr { kind: p.u32(0), offset: p.u64(8), vaddr: p.u64(16), filesz: p.u64(32), align: p.u64(48) }
        } else {
            Phdr {
                kind: p.u32(0),
                offset: p.u32(4) as u64,
                vaddr: p.u32(8) as u64,
                filesz: p.u32(16) as u64,
                align: p.u32(28) as u64,
            }
        };
        match ph.kind {
            PT_DYNAMIC => dynamic = Some((ph.offset, ph.filesz)),
            // The interpreter only decides the type where no architecture wrapper sets it.
            PT_INTERP if arch_flags.is_none() => {
                let name = r.short_name(ph.offset)?;
                if known(&name, INTERPRETERS) {
                    flag = FLAG_ELF_LIBC6;
                }
            }
            // ldconfig's check_ptr still refuses an interpreter outside the file.
            PT_INTERP if ph.offset >= r.len => return Err(ElfError::Invalid("string outside the file")),
            PT_NOTE if osversion == 0 && ph.filesz >= 32 && ph.align >= 4 => osversion = abi_tag(r, &ph)?,
            PT_LOAD => loads.push(ph),
            _ => {}
        }
    }
    let Some((dyn_off, dyn_size)) = dynamic.filter(|d| d.1 > 0) else {
        return Err(ElfError::Invalid("no dynamic section"));
    };
    let entsize = if wide { 16 } else { 8 };
    // The whole dynamic section in one read, up to MAX_DYN entries and the end of the file.
    let wanted = (dyn_size / entsize).min(MAX_DYN as u64) * entsize;
    if dyn_off >= r.len {
        return Err(ElfError::Invalid("truncated file"));
    }
    let section = r.bytes(dyn_off, wanted.min(r.len - dyn_off) as usize)?;
    let mut dyns = Vec::new();
    let mut ended = false;
    for raw in section.chunks_exact(entsize as usize) {
        let d = Le(raw);
        let (tag, val) = if wide { (d.u64(0), d.u64(8)) } else { (d.u32(0) as u64, d.u32(4) as u64) };
        if tag == 0 {
            ended = true;
            break;
        }
        dyns.push((tag, val));
    }
    if !ended && (section.len() as u64) < wanted {
        return Err(ElfError::Invalid("truncated file"));
    }
    let Some(&(_, strtab)) = dyns.iter().find(|(t, _)| *t == DT_STRTAB) else {
        return Err(ElfError::Invalid("no dynamic string table"));
    };
    // The file offset of the string table: through the PT_LOAD segment holding its address.
    let loadoff = loads
        .iter()
        .find(|l| strtab >= l.vaddr && strtab - l.vaddr < l.filesz)
        .map(|l| l.vaddr.wrapping_sub(l.offset))
        .unwrap_or(0);
    let strings = strtab.wrapping_sub(loadoff);
    // DT_NEEDED decides the type only where no architecture wrapper sets it, and only until a
    // known library is found; the last DT_SONAME wins (readelflib.c keeps overwriting it).
    let mut soname_at = None;
    for &(tag, val) in &dyns {
        if tag == DT_NEEDED && flag == FLAG_ELF && arch_flags.is_none() {
            if known(&r.short_name(strings.wrapping_add(val))?, KNOWN_LIBS) {
                flag = FLAG_ELF_LIBC6;
            }
        } else if tag == DT_SONAME {
            soname_at = Some(strings.wrapping_add(val));
        }
    }
    let soname = match soname_at {
        Some(at) => Some(r.cstr(at)?),
        None => None,
    };
    Ok(LibInfo { soname, flags: arch_flags.unwrap_or(flag), osversion })
}

struct Phdr {
    kind: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
    align: u64,
}

/// glibc `readlib.c` `interpreters` (x86 `SYSDEP_KNOWN_INTERPRETER_NAMES` included).
const INTERPRETERS: &[&str] =
    &["/lib/ld-linux.so.2", "/lib64/ld-linux-x86-64.so.2", "/libx32/ld-linux-x32.so.2", "/lib/ld-linux-aarch64.so.1"];
/// glibc `readlib.c` `known_libs` for glibc (libc5/libc4 names are long gone).
const KNOWN_LIBS: &[&str] = &["libc.so.6", "libm.so.6"];
/// Bytes read of an interpreter or needed-library name: enough for the longest known name
/// and its NUL; a longer name cannot be one of them.
const SHORT_NAME: usize = 32;

/// Whether `name` (the bytes before its NUL; `None` for a longer name) is one of `list`.
fn known(name: &Option<Vec<u8>>, list: &[&str]) -> bool {
    name.as_ref().is_some_and(|n| list.iter().any(|k| k.as_bytes() == n.as_slice()))
}

/// The OS version of the first `NT_GNU_ABI_TAG` note in segment `ph` (readelflib.c's loop).
fn abi_tag(r: &mut Reader<'_>, ph: &Phdr) -> Result<u32, ElfError> {
    let align = match ph.align {
        a if a < 4 => 4,
        4 | 8 => ph.align,
        _ => return Ok(0),
    };
    let size = ph.filesz.min(MAX_NOTE);
    let data = r.bytes(ph.offset, size as usize)?;
    let word = |at: usize| data.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let (mut at, mut left) = (0usize, size);
    loop {
        let (Some(namesz), Some(descsz), Some(kind)) = (word(at), word(at + 4), word(at + 8)) else { return Ok(0) };
        if namesz == 4 && descsz == 16 && kind == 1 && data.get(at + 12..at + 16) == Some(b"GNU\0") {
            let d = |k: usize| word(at + 16 + 4 * k).unwrap_or(0);
            return Ok(d(0) << 24 | (d(1) & 0xff) << 16 | (d(2) & 0xff) << 8 | (d(3) & 0xff));
        }
        let up = |x: u64| x.div_ceil(align) * align;
        let next = up(up(12 + namesz as u64) + descsz as u64);
        if left.wrapping_sub(32) < next || next == 0 {
            return Ok(0);
        }
        left -= next;
        at += next as usize;
    }
}

/// Little-endian fields of a buffer whose size the caller checked.
struct Le<'a>(&'a [u8]);

impl Le<'_> {
    fn u16(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.0[at], self.0[at + 1]])
    }

    fn u32(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.0[at..at + 4].try_into().unwrap_or_default())
    }

    fn u64(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.0[at..at + 8].try_into().unwrap_or_default())
    }
}

/// Bounds-checked reads at file offsets, counted against the file's limits.
struct Reader<'a> {
    file: &'a std::fs::File,
    len: u64,
    bytes_left: u64,
    reads_left: u32,
    used: u64,
}

impl Reader<'_> {
    fn bytes(&mut self, at: u64, n: usize) -> Result<Vec<u8>, ElfError> {
        at.checked_add(n as u64).filter(|&e| e <= self.len).ok_or(ElfError::Invalid("truncated file"))?;
        if n as u64 > self.bytes_left || self.reads_left == 0 {
            return Err(ElfError::Limit);
        }
        self.bytes_left -= n as u64;
        self.reads_left -= 1;
        self.used += n as u64;
        let mut buf = vec![0; n];
        self.file.read_exact_at(&mut buf, at).map_err(|e| ElfError::Io(e.to_string()))?;
        Ok(buf)
    }

    /// The bytes before the NUL of the string at `at` when it ends within [`SHORT_NAME`] bytes,
    /// else `None`; a string starting outside the file is an error (ldconfig's `check_ptr`).
    fn short_name(&mut self, at: u64) -> Result<Option<Vec<u8>>, ElfError> {
        if at >= self.len {
            return Err(ElfError::Invalid("string outside the file"));
        }
        let mut b = self.bytes(at, (self.len - at).min(SHORT_NAME as u64) as usize)?;
        Ok(b.iter().position(|&c| c == 0).map(|nul| {
            b.truncate(nul);
            b
        }))
    }

    /// A NUL-terminated string at `at`, of at most [`MAX_NAME`] bytes: a first read of
    /// [`SHORT_NAME`] bytes finds a usual soname, a second one the rest.
    fn cstr(&mut self, at: u64) -> Result<String, ElfError> {
        let b = match self.short_name(at)? {
            Some(b) => b,
            None => {
                let n = (self.len - at).min(MAX_NAME as u64) as usize;
                let b = self.bytes(at, n)?;
                let nul = b.iter().position(|&c| c == 0).ok_or(ElfError::Invalid("unterminated string"))?;
                b[..nul].to_vec()
            }
        };
        String::from_utf8(b).map_err(|_| ElfError::Invalid("name is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn info(p: &Path) -> Result<LibInfo, ElfError> {
        let f = std::fs::File::open(p).unwrap();
        let len = f.metadata().unwrap().len();
        library_info(&f, len)
    }

    #[test]
    fn host_libraries_and_non_libraries() {
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.exists());
        if let Some(libc) = libc.filter(|_| cfg!(target_arch = "x86_64")) {
            let i = info(libc).unwrap();
            assert_eq!(i.soname.as_deref(), Some("libc.so.6"));
            assert_eq!(i.flags, 0x0303);
            assert!(i.osversion >= 0x0002_0600, "libc's ABI note: {:#x}", i.osversion);
        }
        let d = tempfile::tempdir().unwrap();
        let junk = d.path().join("libjunk.so");
        std::fs::write(&junk, b"/* GNU ld script */ GROUP ( libc.so.6 )").unwrap();
        assert_eq!(info(&junk).unwrap_err(), ElfError::Invalid("no ELF magic"));
        std::fs::write(&junk, b"\x7fELF\x02\x01\x01").unwrap();
        assert_eq!(info(&junk).unwrap_err(), ElfError::Invalid("truncated file"));
    }

    fn info_of(bytes: &[u8]) -> (Result<LibInfo, ElfError>, u64) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("libflood.so.1");
        std::fs::write(&p, bytes).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        library_info_within(&f, bytes.len() as u64, MAX_FILE_BYTES)
    }

    /// Issue 29, finding 3: a library with 254 `PT_NOTE` segments of 64 KiB and 4000
    /// `DT_NEEDED` entries cost ~32 MiB of reads per file; now it costs at most the per-file
    /// limit and is not indexed, while the same file with one small note and a few `DT_NEEDED`
    /// is an ordinary library.
    #[test]
    fn a_crafted_library_costs_at_most_the_per_file_limit() {
        use actk_testsupport::hostile::{CraftedElf, crafted_elf};
        if !cfg!(target_arch = "x86_64") {
            return;
        }
        let (r, used) = info_of(&crafted_elf(CraftedElf::FLOOD));
        assert_eq!(r.unwrap_err(), ElfError::Limit);
        assert!(used <= MAX_FILE_BYTES, "{used} bytes read");
        let plain = CraftedElf { notes: 1, note_size: 64, needed: 3, wide: true };
        let (r, used) = info_of(&crafted_elf(plain));
        let i = r.unwrap();
        assert_eq!((i.soname.as_deref(), i.flags, i.osversion), (Some("libflood.so.1"), 0x0303, 0));
        assert!(used < 1024, "{used} bytes read for a small library");
        // 64-bit: the notes are what costs; without them the 4000 DT_NEEDED are never read.
        let (r, used) = info_of(&crafted_elf(CraftedElf { notes: 0, ..CraftedElf::FLOOD }));
        assert_eq!(r.unwrap().soname.as_deref(), Some("libflood.so.1"));
        assert!(used < 70 * 1024, "{used} bytes: the dynamic section once, no name of DT_NEEDED");
        // i386, where DT_NEEDED decides the type: a read each, so the read limit stops 4000.
        let (r, _) = info_of(&crafted_elf(CraftedElf { notes: 1, note_size: 64, needed: 4000, wide: false }));
        assert_eq!(r.unwrap_err(), ElfError::Limit);
        let (r, _) = info_of(&crafted_elf(CraftedElf { notes: 1, note_size: 64, needed: 3, wide: false }));
        assert_eq!(r.unwrap().flags, FLAG_ELF, "no libc among the needed libraries");
    }

    /// A real library is far below the per-file limit.
    #[test]
    fn host_libc_costs_a_few_kilobytes() {
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.exists());
        let Some(libc) = libc.filter(|_| cfg!(target_arch = "x86_64")) else { return };
        let f = std::fs::File::open(libc).unwrap();
        let (r, used) = library_info_within(&f, f.metadata().unwrap().len(), MAX_FILE_BYTES);
        assert_eq!(r.unwrap().soname.as_deref(), Some("libc.so.6"));
        assert!(used < 16 * 1024, "{used} bytes read from libc");
    }

    #[test]
    fn garbage_after_a_valid_header_is_an_error_not_a_panic() {
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.exists());
        let Some(libc) = libc else { return };
        let real = std::fs::read(libc).unwrap();
        let head = &real[..real.len().min(64 * 1024)];
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("libx.so.1");
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..300 {
            let mut b = head.to_vec();
            for _ in 0..(1 + round % 16) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let at = 16 + (seed as usize % (b.len() - 16));
                b[at] = (seed >> 32) as u8;
            }
            b.truncate(64 + (seed as usize % b.len()));
            std::fs::write(&p, &b).unwrap();
            let _ = info(&p);
        }
    }
}
