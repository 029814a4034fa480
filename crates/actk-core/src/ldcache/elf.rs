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
//! bounds-checked offsets, never the whole file, and bad input is an error, never a panic.

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
/// Longest soname, needed-library or interpreter name read.
const MAX_NAME: usize = 4096;
/// Largest note segment read for the ABI tag.
const MAX_NOTE: u64 = 64 * 1024;

/// Reads [`LibInfo`] from `file` (`len` bytes long); see the module docs.
pub fn library_info(file: &std::fs::File, len: u64) -> Result<LibInfo, ElfError> {
    let r = Reader { file, len };
    let ident = r.bytes(0, 16)?;
    if ident[..4] != *b"\x7fELF" {
        return Err(ElfError::Invalid("no ELF magic"));
    }
    let wide = match ident[4] {
        1 => false,
        2 => true,
        _ => return Err(ElfError::Invalid("unknown ELF class")),
    };
    if ident[5] != 1 {
        return Err(ElfError::Invalid("not little-endian"));
    }
    if r.u16(16)? != 3 {
        return Err(ElfError::Invalid("not a shared object (ET_DYN)"));
    }
    let machine = r.u16(18)?;
    // The architecture wrappers of readelflib.c, for the loader of the machine actk runs on.
    let arch_flags = match (machine, wide) {
        (EM_X86_64, true) if cfg!(target_arch = "x86_64") => Some(FLAG_X8664_LIB64 | FLAG_ELF_LIBC6),
        (EM_X86_64, false) if cfg!(target_arch = "x86_64") => Some(FLAG_X8664_LIBX32 | FLAG_ELF_LIBC6),
        (EM_386, false) if cfg!(target_arch = "x86_64") => None,
        (EM_AARCH64, true) if cfg!(target_arch = "aarch64") => Some(FLAG_AARCH64_LIB64 | FLAG_ELF_LIBC6),
        _ => return Err(ElfError::Machine(machine)),
    };
    let (phoff, phentsize, phnum) =
        if wide { (r.u64(32)?, r.u16(54)?, r.u16(56)?) } else { (r.u32(28)? as u64, r.u16(42)?, r.u16(44)?) };
    let want = if wide { 56 } else { 32 };
    if phentsize as usize != want || phnum as usize > MAX_PHDRS {
        return Err(ElfError::Invalid("bad program header table"));
    }
    let mut flag = FLAG_ELF;
    let mut osversion = 0;
    let mut dynamic = None;
    let mut loads = Vec::new();
    for i in 0..phnum as u64 {
        let at = phoff.checked_add(i * want as u64).ok_or(ElfError::Invalid("program header offset overflows"))?;
        let ph = if wide {
            Phdr {
                kind: r.u32(at)?,
                offset: r.u64(at + 8)?,
                vaddr: r.u64(at + 16)?,
                filesz: r.u64(at + 32)?,
                align: r.u64(at + 48)?,
            }
        } else {
            Phdr {
                kind: r.u32(at)?,
                offset: r.u32(at + 4)? as u64,
                vaddr: r.u32(at + 8)? as u64,
                filesz: r.u32(at + 16)? as u64,
                align: r.u32(at + 28)? as u64,
            }
        };
        match ph.kind {
            PT_DYNAMIC => dynamic = Some((ph.offset, ph.filesz)),
            PT_INTERP => {
                if let Some(f) = known(&r.cstr(ph.offset)?, INTERPRETERS) {
                    flag = f;
                }
            }
            PT_NOTE if osversion == 0 && ph.filesz >= 32 && ph.align >= 4 => osversion = abi_tag(&r, &ph)?,
            PT_LOAD => loads.push(ph),
            _ => {}
        }
    }
    let Some((dyn_off, dyn_size)) = dynamic.filter(|d| d.1 > 0) else {
        return Err(ElfError::Invalid("no dynamic section"));
    };
    let entsize = if wide { 16 } else { 8 };
    let mut dyns = Vec::new();
    for i in 0..(dyn_size / entsize).min(MAX_DYN as u64) {
        let at = dyn_off + i * entsize;
        let (tag, val) = if wide { (r.u64(at)?, r.u64(at + 8)?) } else { (r.u32(at)? as u64, r.u32(at + 4)? as u64) };
        if tag == 0 {
            break;
        }
        dyns.push((tag, val));
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
    let mut soname = None;
    for &(tag, val) in &dyns {
        if tag == DT_NEEDED && flag == FLAG_ELF {
            if let Some(f) = known(&r.cstr(strings.wrapping_add(val))?, KNOWN_LIBS) {
                flag = f;
            }
        } else if tag == DT_SONAME {
            soname = Some(r.cstr(strings.wrapping_add(val))?);
        }
    }
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

fn known(name: &str, list: &[&str]) -> Option<i32> {
    list.contains(&name).then_some(FLAG_ELF_LIBC6)
}

/// The OS version of the first `NT_GNU_ABI_TAG` note in segment `ph` (readelflib.c's loop).
fn abi_tag(r: &Reader<'_>, ph: &Phdr) -> Result<u32, ElfError> {
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

/// Bounds-checked little-endian reads at file offsets.
struct Reader<'a> {
    file: &'a std::fs::File,
    len: u64,
}

impl Reader<'_> {
    fn bytes(&self, at: u64, n: usize) -> Result<Vec<u8>, ElfError> {
        at.checked_add(n as u64).filter(|&e| e <= self.len).ok_or(ElfError::Invalid("truncated file"))?;
        let mut buf = vec![0; n];
        self.file.read_exact_at(&mut buf, at).map_err(|e| ElfError::Io(e.to_string()))?;
        Ok(buf)
    }

    fn u16(&self, at: u64) -> Result<u16, ElfError> {
        let b = self.bytes(at, 2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&self, at: u64) -> Result<u32, ElfError> {
        let b = self.bytes(at, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&self, at: u64) -> Result<u64, ElfError> {
        let b = self.bytes(at, 8)?;
        Ok(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }

    /// A NUL-terminated string at `at`, of at most [`MAX_NAME`] bytes.
    fn cstr(&self, at: u64) -> Result<String, ElfError> {
        if at >= self.len {
            return Err(ElfError::Invalid("string outside the file"));
        }
        let n = (self.len - at).min(MAX_NAME as u64) as usize;
        let b = self.bytes(at, n)?;
        let nul = b.iter().position(|&c| c == 0).ok_or(ElfError::Invalid("unterminated string"))?;
        String::from_utf8(b[..nul].to_vec()).map_err(|_| ElfError::Invalid("name is not UTF-8"))
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
