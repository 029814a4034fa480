//! A reader for glibc's dynamic linker cache, `/etc/ld.so.cache` (written by `ldconfig`).
//!
//! Layout (glibc `sysdeps/generic/dl-cache.h`, checked against files written by Debian 12's
//! `ldconfig -r`): the "new" format starts with the 20-byte magic `glibc-ld.so.cache1.1`, then
//! `nlibs: u32`, `len_strings: u32`, `flags: u8` (2 = little-endian, 3 = big-endian, 0 =
//! unspecified), 3 padding bytes, `extension_offset: u32`, 3 unused `u32` (48 bytes in all),
//! then `nlibs` entries of 24 bytes: `flags: i32, key: u32, value: u32, osversion: u32,
//! hwcap: u64`. `key` (the soname) and `value` (the path) are offsets of NUL-terminated strings
//! from the start of that header. Caches from glibc < 2.32 may start with the old
//! `ld.so-1.7.0` format (16-byte header, 12-byte entries) followed, 8-byte aligned, by the new
//! one; the new part is used when present, the old part otherwise (its string offsets count
//! from the end of its entry table).
//!
//! Input is untrusted bytes (a container image's cache, read by actk-inject): every offset is
//! bounds-checked, bad input is an error, never a panic, and strings are slices of the input,
//! counted against [`Limits`], so no cache makes the reader copy or scan more than its own size
//! plus the limits ([`parse_borrowed`]).
//!
//! [`write`] builds a cache (actk-inject adds the injected library directories to a container's
//! cache with it instead of running ldconfig), [`elf`] reads what ldconfig reads from a library.

pub mod elf;
pub mod write;

/// One library in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    /// The soname the dynamic linker looks up (`libcuda.so.1`).
    pub key: String,
    /// Absolute path of the file providing it, as seen from the cache's root
    /// (`/usr/lib/x86_64-linux-gnu/libcuda.so.1`; usually the soname symlink).
    pub path: String,
    /// ldconfig's flags: low byte = type (3 = ELF libc6), next byte = architecture
    /// (`0x03` x86-64, `0x0a` aarch64, `0x00` i386 for libc6 type, ...).
    pub flags: u32,
}

/// Architecture of a cache entry, from its flags (glibc `FLAG_*` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LibArch {
    /// `FLAG_X8664_LIB64` set (0x0303 for a libc6 library).
    X86_64,
    /// No architecture bits, ELF type 1-3 (0x0003 for libc6): 32-bit x86, what `compat32` mounts.
    I386,
    /// `FLAG_AARCH64_LIB64` set (0x0a03, `libc6,AArch64` in `ldconfig -p`): 64-bit Arm, what
    /// ldconfig on an arm64 host (Grace Hopper, Grace Blackwell) writes for every library.
    Aarch64,
    /// Anything else (x32, 32-bit Arm, other ELF types); carries the raw flags.
    Other(u32),
}

impl LibArch {
    /// The native 64-bit library architecture of a host whose kernel reports `machine`
    /// (`uname -m`, /proc/sys/kernel/arch): `x86_64` or `aarch64` (`arm64` accepted). `None` for
    /// other machines, whose libraries actk does not know how to tell apart.
    pub fn native(machine: &str) -> Option<LibArch> {
        match machine.trim() {
            "x86_64" | "amd64" => Some(LibArch::X86_64),
            "aarch64" | "arm64" => Some(LibArch::Aarch64),
            _ => None,
        }
    }

    /// The 32-bit compatibility architecture next to `self` (`compat32`): i386 on x86-64; none on
    /// aarch64 (no 32-bit Arm driver libraries exist for data-center GPUs).
    pub fn compat32(self) -> Option<LibArch> {
        match self {
            LibArch::X86_64 => Some(LibArch::I386),
            _ => None,
        }
    }

    /// The multiarch triplet directory name (`x86_64-linux-gnu`, `aarch64-linux-gnu`, `i386-linux-gnu`).
    pub fn triplet(self) -> Option<&'static str> {
        match self {
            LibArch::X86_64 => Some("x86_64-linux-gnu"),
            LibArch::Aarch64 => Some("aarch64-linux-gnu"),
            LibArch::I386 => Some("i386-linux-gnu"),
            LibArch::Other(_) => None,
        }
    }

    /// Whether an ELF header (the first bytes of a file) is a shared object of this architecture:
    /// class and `e_machine` (EM_X86_64 62, EM_AARCH64 183, EM_386 3), little-endian.
    pub fn matches_elf(self, head: &[u8]) -> bool {
        if head.len() < 20 || &head[..4] != b"\x7fELF" || head[5] != 1 {
            return false;
        }
        let machine = u16::from_le_bytes([head[18], head[19]]);
        match self {
            LibArch::X86_64 => head[4] == 2 && machine == 62,
            LibArch::Aarch64 => head[4] == 2 && machine == 183,
            LibArch::I386 => head[4] == 1 && machine == 3,
            LibArch::Other(_) => false,
        }
    }
}

impl CacheEntry {
    /// The entry's architecture (x86-64 vs i386 tells a library from its compat32 copy):
    /// [`LibArch::of_flags`].
    pub fn arch(&self) -> LibArch {
        LibArch::of_flags(self.flags)
    }
}

impl LibArch {
    /// The architecture of a cache entry with ldconfig's `flags`.
    ///
    /// ldconfig sets the x86-64 bits (0x0300) on every 64-bit entry; 32-bit entries carry no
    /// architecture bits and an ELF type of 1 (plain ELF, e.g. a library without libc
    /// dependency) to 3 (libc6), so on an x86-64 host's cache those are i386.
    pub fn of_flags(flags: u32) -> LibArch {
        const FLAG_TYPE_MASK: u32 = 0x00ff;
        const FLAG_REQUIRED_MASK: u32 = 0xff00;
        const FLAG_X8664_LIB64: u32 = 0x0300;
        const FLAG_AARCH64_LIB64: u32 = 0x0a00;
        let elf_type = flags & FLAG_TYPE_MASK;
        match flags & FLAG_REQUIRED_MASK {
            FLAG_X8664_LIB64 => LibArch::X86_64,
            FLAG_AARCH64_LIB64 => LibArch::Aarch64,
            0 if (1..=3).contains(&elf_type) => LibArch::I386,
            _ => LibArch::Other(flags),
        }
    }
}

/// Why a cache could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LdCacheError {
    /// The file starts with neither `glibc-ld.so.cache1.1` nor `ld.so-1.7.0`.
    #[error("not an ld.so.cache: unknown magic (expected glibc-ld.so.cache1.1 or ld.so-1.7.0)")]
    BadMagic,
    /// A header, entry table or string lies (partly) outside the file.
    #[error("truncated ld.so.cache: {what} at byte {offset} lies outside the {len}-byte file")]
    Truncated {
        /// What was being read (`entry table`, `string`).
        what: &'static str,
        /// Byte offset it was expected at.
        offset: usize,
        /// File length.
        len: usize,
    },
    /// The cache was written for a big-endian machine.
    #[error("ld.so.cache is big-endian (written for another architecture)")]
    BigEndian,
    /// A soname or path is not UTF-8.
    #[error("ld.so.cache string at byte {0} is not UTF-8")]
    NotUtf8(usize),
    /// Reading the cache would go past a bound of [`Limits`] (a hostile cache, or one no
    /// ldconfig writes).
    #[error("ld.so.cache goes past a limit of the reader: {what} (at most {limit})")]
    Limit {
        /// Which bound (`entries`, `string length`, `string bytes of all entries`).
        what: &'static str,
        /// The bound.
        limit: usize,
    },
}

const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_HEADER: usize = 48;
const NEW_ENTRY: usize = 24;
const OLD_HEADER: usize = 16;
const OLD_ENTRY: usize = 12;
/// `glibc-hwcaps` subdirectory names read from the cache extension, at most (glibc knows fewer
/// than ten per architecture: `x86-64-v2` .. `x86-64-v4`, `power9`, `z15`, ...).
const MAX_HWCAPS_NAMES: usize = 256;

/// What one parse may produce and cost (issue 29, finding 2: a 16 MB image cache whose 349k
/// entries all named one 8 MB string made a reader that copied each string demand terabytes).
///
/// Strings are handed out as slices of the input, never copied, and every string an entry names
/// is counted, so the work of the parse (finding each string's NUL, checking it is UTF-8) and of
/// anything done later with its entries (sorting, merging, writing a new cache) is bounded by
/// the input's size plus `max_output`, whatever the entries point at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Entries read at most; a cache announcing more is refused before any is read.
    pub max_entries: usize,
    /// Longest soname, path or `glibc-hwcaps` name in bytes, NUL not counted. Longer strings
    /// make the cache an error: the loader could not open such a path anyway (`PATH_MAX`).
    pub max_string: usize,
    /// Sum of the string lengths of all entries read (soname, path and `glibc-hwcaps` name of
    /// each, a string named by several entries counted for each), in bytes.
    pub max_output: usize,
}

impl Default for Limits {
    /// 131072 entries, 4095-byte strings, 16 MiB of strings: a full distribution's cache has
    /// a few thousand entries and a few hundred KB of strings.
    fn default() -> Self {
        Limits { max_entries: 1 << 17, max_string: 4095, max_output: 16 << 20 }
    }
}

/// One cache entry with every field, as [`parse_entries`] reads it and [`write::encode`] writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The soname looked up (`libcuda.so.1`).
    pub key: String,
    /// The file providing it.
    pub path: String,
    /// ldconfig's flags (type in the low byte, architecture in the next: `0x0303` x86-64 libc6).
    pub flags: i32,
    /// Lowest kernel version the library needs (ELF ABI note), `0` when none.
    pub osversion: u32,
    /// Legacy hwcap bits, or for a `glibc-hwcaps` entry [`write::HWCAP_EXTENSION`] | ISA level
    /// << 32 | index into the cache's hwcaps names.
    pub hwcap: u64,
    /// For a `glibc-hwcaps` entry, its subdirectory name (`x86-64-v3`) from the cache extension.
    pub hwcaps: Option<String>,
}

/// An [`Entry`] whose strings are slices of the cache file it was read from
/// ([`parse_borrowed`]), or of an [`Entry`] ([`Entry::borrowed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryRef<'a> {
    /// The soname looked up.
    pub key: &'a str,
    /// The file providing it.
    pub path: &'a str,
    /// ldconfig's flags, as [`Entry::flags`].
    pub flags: i32,
    /// As [`Entry::osversion`].
    pub osversion: u32,
    /// As [`Entry::hwcap`].
    pub hwcap: u64,
    /// As [`Entry::hwcaps`].
    pub hwcaps: Option<&'a str>,
}

impl Entry {
    /// This entry with borrowed strings.
    pub fn borrowed(&self) -> EntryRef<'_> {
        EntryRef {
            key: &self.key,
            path: &self.path,
            flags: self.flags,
            osversion: self.osversion,
            hwcap: self.hwcap,
            hwcaps: self.hwcaps.as_deref(),
        }
    }
}

impl EntryRef<'_> {
    /// The entry's architecture: [`LibArch::of_flags`] (as [`CacheEntry::arch`]).
    pub fn arch(&self) -> LibArch {
        LibArch::of_flags(self.flags as u32)
    }

    /// This entry with its strings copied.
    pub fn owned(&self) -> Entry {
        Entry {
            key: self.key.to_string(),
            path: self.path.to_string(),
            flags: self.flags,
            osversion: self.osversion,
            hwcap: self.hwcap,
            hwcaps: self.hwcaps.map(str::to_string),
        }
    }
}

/// Parse a whole ld.so.cache file within the default [`Limits`]. Entries keep the file's order
/// (ldconfig sorts them by soname, most specific first). Errors: [`LdCacheError`]; never panics.
pub fn parse(bytes: &[u8]) -> Result<Vec<CacheEntry>, LdCacheError> {
    Ok(parse_borrowed(bytes, &Limits::default())?
        .into_iter()
        .map(|e| CacheEntry { key: e.key.to_string(), path: e.path.to_string(), flags: e.flags as u32 })
        .collect())
}

/// [`parse`] with every field of each entry, and the `glibc-hwcaps` subdirectory names of the
/// cache extension (glibc 2.33+; a missing or malformed extension means no names).
pub fn parse_entries(bytes: &[u8]) -> Result<Vec<Entry>, LdCacheError> {
    Ok(parse_borrowed(bytes, &Limits::default())?.iter().map(EntryRef::owned).collect())
}

/// [`parse_entries`] without copying: every string is a slice of `bytes`, and the parse stops
/// with [`LdCacheError::Limit`] as soon as it would go past `limits` (see [`Limits`]).
pub fn parse_borrowed<'a>(bytes: &'a [u8], limits: &Limits) -> Result<Vec<EntryRef<'a>>, LdCacheError> {
    if bytes.starts_with(NEW_MAGIC) {
        return parse_new(bytes, bytes, limits);
    }
    if !bytes.starts_with(OLD_MAGIC) {
        return Err(LdCacheError::BadMagic);
    }
    let nlibs = read_u32(bytes, 12, "header")? as usize;
    let table_end = nlibs
        .checked_mul(OLD_ENTRY)
        .and_then(|n| n.checked_add(OLD_HEADER))
        .filter(|&end| end <= bytes.len())
        .ok_or(LdCacheError::Truncated { what: "entry table", offset: OLD_HEADER, len: bytes.len() })?;
    // The new format, when present, follows the old table at the next 8-byte boundary.
    let new_start = table_end.next_multiple_of(8);
    if let Some(rest) = bytes.get(new_start..)
        && rest.starts_with(NEW_MAGIC)
    {
        return parse_new(rest, bytes, limits);
    }
    let mut strings = Strings::new(&bytes[table_end..], 0, usize::MAX, limits);
    entries(bytes, OLD_HEADER, OLD_ENTRY, nlibs, &mut strings)
}

/// The new-format cache `bytes`, a part of the whole `file` (extension offsets count from the
/// start of the file, string offsets from the start of the new header).
fn parse_new<'a>(bytes: &'a [u8], file: &'a [u8], limits: &Limits) -> Result<Vec<EntryRef<'a>>, LdCacheError> {
    let nlibs = read_u32(bytes, 20, "header")? as usize;
    match bytes.get(28) {
        Some(3) => return Err(LdCacheError::BigEndian),
        Some(_) => {}
        None => return Err(LdCacheError::Truncated { what: "header", offset: 28, len: bytes.len() }),
    }
    let table_end = nlibs
        .checked_mul(NEW_ENTRY)
        .and_then(|n| n.checked_add(NEW_HEADER))
        .filter(|&end| end <= bytes.len())
        .ok_or(LdCacheError::Truncated { what: "entry table", offset: NEW_HEADER, len: bytes.len() })?;
    // The strings ldconfig wrote: `len_strings` bytes after the entry table (the extension
    // block, binary, follows them).
    let len_strings = read_u32(bytes, 24, "header")? as usize;
    let mut strings = Strings::new(bytes, table_end, table_end.saturating_add(len_strings), limits);
    let mut list = entries(bytes, NEW_HEADER, NEW_ENTRY, nlibs, &mut strings)?;
    if !list.iter().any(|e| e.hwcap & write::HWCAP_EXTENSION != 0) {
        return Ok(list);
    }
    let names = match read_u32(bytes, 32, "header") {
        Ok(o) => hwcaps_names(file, o as usize, &mut strings)?,
        Err(_) => Vec::new(),
    };
    for e in &mut list {
        if e.hwcap & write::HWCAP_EXTENSION != 0 {
            e.hwcaps = names.get(e.hwcap as u32 as usize).copied();
            strings.count(e.hwcaps.map_or(0, str::len))?;
        }
    }
    Ok(list)
}

/// The `glibc-hwcaps` names of the cache extension at `offset` in `file` (glibc
/// `cache_extension`: magic, count, then `{tag, flags, offset, size}` sections; tag 1 is an
/// array of string offsets into the string table). Anything malformed (more than
/// [`MAX_HWCAPS_NAMES`] names included) gives no names, or the names before the malformed one;
/// only going past a bound of [`Limits`] is an error, as it is for the entries' own strings.
fn hwcaps_names<'a>(file: &[u8], offset: usize, strings: &mut Strings<'a, '_>) -> Result<Vec<&'a str>, LdCacheError> {
    if offset == 0 || read_u32(file, offset, "extension").ok() != Some(write::EXTENSION_MAGIC) {
        return Ok(Vec::new());
    }
    let Ok(count) = read_u32(file, offset + 4, "extension") else { return Ok(Vec::new()) };
    for i in 0..count.min(64) as usize {
        let sec = offset + 8 + i * 16;
        let (Ok(tag), Ok(off), Ok(size)) = (
            read_u32(file, sec, "extension"),
            read_u32(file, sec + 8, "extension"),
            read_u32(file, sec + 12, "extension"),
        ) else {
            return Ok(Vec::new());
        };
        if tag != write::TAG_GLIBC_HWCAPS {
            continue;
        }
        let n = size as usize / 4;
        if n > MAX_HWCAPS_NAMES {
            return Ok(Vec::new());
        }
        let mut names = Vec::with_capacity(n);
        for j in 0..n {
            let Ok(s) = read_u32(file, off as usize + j * 4, "extension") else { break };
            match strings.get(s as usize) {
                Ok(name) => names.push(name),
                Err(e @ LdCacheError::Limit { .. }) => return Err(e),
                Err(_) => break,
            }
        }
        return Ok(names);
    }
    Ok(Vec::new())
}

/// The `nlibs` entries of a table at `start` in `bytes`, each `size` bytes beginning with
/// `flags, key, value` (u32 each, then in the new format `osversion: u32, hwcap: u64`); `key`
/// and `value` are offsets into `strings` (the string table after the old format's entries; the
/// whole new-format cache in the new format).
fn entries<'a>(
    bytes: &[u8],
    start: usize,
    size: usize,
    nlibs: usize,
    strings: &mut Strings<'a, '_>,
) -> Result<Vec<EntryRef<'a>>, LdCacheError> {
    if nlibs > strings.limits.max_entries {
        return Err(LdCacheError::Limit { what: "entries", limit: strings.limits.max_entries });
    }
    let mut out = Vec::with_capacity(nlibs);
    for i in 0..nlibs {
        let at = start + i * size;
        let flags = read_u32(bytes, at, "entry")? as i32;
        let key = read_u32(bytes, at + 4, "entry")? as usize;
        let value = read_u32(bytes, at + 8, "entry")? as usize;
        let (osversion, hwcap) = if size == NEW_ENTRY {
            let lo = read_u32(bytes, at + 16, "entry")? as u64;
            let hi = read_u32(bytes, at + 20, "entry")? as u64;
            (read_u32(bytes, at + 12, "entry")?, lo | hi << 32)
        } else {
            (0, 0)
        };
        out.push(EntryRef { key: strings.get(key)?, path: strings.get(value)?, flags, osversion, hwcap, hwcaps: None });
    }
    Ok(out)
}

fn read_u32(bytes: &[u8], at: usize, what: &'static str) -> Result<u32, LdCacheError> {
    at.checked_add(4)
        .and_then(|end| bytes.get(at..end))
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or(LdCacheError::Truncated { what, offset: at, len: bytes.len() })
}

/// The string table of one parse, and the string bytes handed out so far.
struct Strings<'a, 'l> {
    bytes: &'a [u8],
    limits: &'l Limits,
    out: usize,
    /// The NUL that ends each string, found 16 bytes at a time without asking the CPU
    /// (issue 31: a real cache holds a few thousand strings).
    nul: crate::discover::ByteFinder,
    /// The longest UTF-8 prefix of `bytes[text_from..text_to]` (where ldconfig puts the
    /// strings: after the entry table, `len_strings` bytes in the new format), checked once: a
    /// string inside it is a slice of it, without checking its bytes again (issue 31: one
    /// `from_utf8` per string was two thirds of a real cache's parse). A string elsewhere, or
    /// one not on its character boundaries, is checked alone.
    text: &'a str,
    text_from: usize,
}

impl<'a, 'l> Strings<'a, 'l> {
    /// The string table `bytes`, whose strings most often lie in `text_from..text_to` (cut
    /// to the table's length).
    fn new(bytes: &'a [u8], text_from: usize, text_to: usize, limits: &'l Limits) -> Self {
        let region = bytes.get(text_from..text_to.min(bytes.len())).unwrap_or_default();
        #[cfg(test)]
        let region = if tests::EACH_STRING_ALONE.get() { &[] } else { region };
        // A second pass over the valid prefix only for a table that is not all UTF-8 (std's
        // from_utf8 checks 16 bytes at a time where they are ASCII; utf8_chunks a byte at a time).
        let text = match std::str::from_utf8(region) {
            Ok(t) => t,
            Err(e) => std::str::from_utf8(&region[..e.valid_up_to()]).unwrap_or_default(),
        };
        Strings { bytes, limits, out: 0, nul: crate::discover::ByteFinder::new(0), text, text_from }
    }
}

impl<'a> Strings<'a, '_> {
    /// The NUL-terminated string at `at`, counted against [`Limits::max_output`]. The search for
    /// its NUL looks at most `max_string + 1` bytes, and a string that is found adds its length
    /// to the count: the bytes looked at over a whole parse stay below `max_output` plus one
    /// byte per string plus one failed search, beside the one UTF-8 check of the text
    /// ([`Strings::new`]), which looks at each byte of the file at most once.
    fn get(&mut self, at: usize) -> Result<&'a str, LdCacheError> {
        let len = self.bytes.len();
        let tail = self.bytes.get(at..).ok_or(LdCacheError::Truncated { what: "string", offset: at, len })?;
        let window = &tail[..tail.len().min(self.limits.max_string + 1)];
        let Some(nul) = self.nul.find(window) else {
            return Err(if window.len() < tail.len() {
                LdCacheError::Limit { what: "string length", limit: self.limits.max_string }
            } else {
                LdCacheError::Truncated { what: "string", offset: at, len }
            });
        };
        self.count(nul)?;
        if let Some(s) = at.checked_sub(self.text_from).and_then(|o| self.text.get(o..o + nul)) {
            return Ok(s);
        }
        std::str::from_utf8(&tail[..nul]).map_err(|_| LdCacheError::NotUtf8(at))
    }

    fn count(&mut self, n: usize) -> Result<(), LdCacheError> {
        self.out = self.out.saturating_add(n);
        if self.out > self.limits.max_output {
            return Err(LdCacheError::Limit { what: "string bytes of all entries", limit: self.limits.max_output });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Command;

    /// Build a root with real shared objects (gcc) and let the system's `ldconfig -r` write its
    /// cache. Returns None (test skipped, with a message) when gcc or ldconfig is missing.
    fn ldconfig_root(libs: &[(&str, &str, &str)]) -> Option<tempfile::TempDir> {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let src = root.join("f.c");
        std::fs::write(&src, "int f(void){return 1;}\n").unwrap();
        let mut dirs = Vec::new();
        for (dir, file, soname) in libs {
            let d = root.join(dir.trim_start_matches('/'));
            std::fs::create_dir_all(&d).unwrap();
            let m32 = dir.contains("i386");
            let mut gcc = Command::new("gcc");
            gcc.args(["-shared", "-fPIC", "-nostdlib", &format!("-Wl,-soname,{soname}"), "-o"])
                .arg(d.join(file))
                .arg(&src);
            if m32 {
                gcc.arg("-m32");
            }
            match gcc.status() {
                Ok(s) if s.success() => {}
                _ if m32 => {
                    eprintln!("skipping 32-bit library: gcc -m32 unavailable");
                    continue;
                }
                _ => {
                    eprintln!("SKIPPED: gcc not available to build test libraries");
                    return None;
                }
            }
            if !dirs.contains(dir) {
                dirs.push(*dir);
            }
        }
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/ld.so.conf"), dirs.join("\n") + "\n").unwrap();
        let ldconfig = ["/sbin/ldconfig", "/usr/sbin/ldconfig"].into_iter().find(|p| Path::new(p).exists());
        let Some(ldconfig) = ldconfig else {
            eprintln!("SKIPPED: ldconfig not found");
            return None;
        };
        let st = Command::new(ldconfig).arg("-r").arg(root).status().unwrap();
        assert!(st.success(), "ldconfig -r failed");
        Some(tmp)
    }

    #[test]
    fn reads_cache_written_by_ldconfig() {
        let Some(tmp) = ldconfig_root(&[
            ("/usr/lib/x86_64-linux-gnu", "libcuda.so.580.95.05", "libcuda.so.1"),
            ("/usr/lib/x86_64-linux-gnu", "libnvidia-ml.so.580.95.05", "libnvidia-ml.so.1"),
            ("/usr/lib/i386-linux-gnu", "libcuda.so.580.95.05", "libcuda.so.1"),
        ]) else {
            return;
        };
        let bytes = std::fs::read(tmp.path().join("etc/ld.so.cache")).unwrap();
        let entries = parse(&bytes).unwrap();
        let cuda64 = entries
            .iter()
            .find(|e| e.key == "libcuda.so.1" && e.arch() == LibArch::X86_64)
            .expect("libcuda.so.1 (x86-64) in cache");
        assert_eq!(cuda64.path, "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
        assert!(
            entries
                .iter()
                .any(|e| e.key == "libnvidia-ml.so.1" && e.path == "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
        );
        if tmp.path().join("usr/lib/i386-linux-gnu/libcuda.so.580.95.05").exists() {
            let cuda32 =
                entries.iter().find(|e| e.key == "libcuda.so.1" && e.arch() == LibArch::I386).expect("i386 entry");
            assert_eq!(cuda32.path, "/usr/lib/i386-linux-gnu/libcuda.so.1");
        }
    }

    #[test]
    fn truncated_or_garbage_input_is_an_error_not_a_panic() {
        let Some(tmp) = ldconfig_root(&[("/usr/lib/x86_64-linux-gnu", "libcuda.so.580.95.05", "libcuda.so.1")]) else {
            return;
        };
        let bytes = std::fs::read(tmp.path().join("etc/ld.so.cache")).unwrap();
        assert!(parse(&bytes).is_ok());
        // Every prefix: either a clean error or (past the strings) a full parse; never a panic.
        for cut in 0..bytes.len() {
            let r = parse(&bytes[..cut]);
            if cut < NEW_HEADER + NEW_ENTRY {
                assert!(r.is_err(), "prefix of {cut} bytes parsed");
            }
        }
        assert_eq!(parse(b"").unwrap_err(), LdCacheError::BadMagic);
        assert_eq!(parse(b"\x7fELF garbage").unwrap_err(), LdCacheError::BadMagic);
        // A huge nlibs must not overflow or allocate.
        let mut evil = bytes.clone();
        evil[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(parse(&evil), Err(LdCacheError::Truncated { what: "entry table", .. })));
        // A string offset past the end.
        let mut evil = bytes.clone();
        evil[52..56].copy_from_slice(&0x00ff_ffffu32.to_le_bytes());
        assert!(matches!(parse(&evil), Err(LdCacheError::Truncated { what: "string", .. })));
        // Pseudo-random garbage behind a valid magic.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..500 {
            let mut g = NEW_MAGIC.to_vec();
            for _ in 0..200 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                g.push(seed as u8);
            }
            let _ = parse(&g);
            g[..OLD_MAGIC.len()].copy_from_slice(OLD_MAGIC);
            let _ = parse(&g);
        }
    }

    /// Encode an old-format cache (optionally followed by the new format) by hand: glibc >= 2.32
    /// no longer writes it, but hosts upgraded in place can still have one.
    fn old_format(entries: &[(u32, &str, &str)], with_new: bool) -> Vec<u8> {
        let mut strings = Vec::new();
        let mut table = Vec::new();
        for (flags, key, path) in entries {
            let k = strings.len() as u32;
            strings.extend_from_slice(key.as_bytes());
            strings.push(0);
            let v = strings.len() as u32;
            strings.extend_from_slice(path.as_bytes());
            strings.push(0);
            table.extend_from_slice(&flags.to_le_bytes());
            table.extend_from_slice(&k.to_le_bytes());
            table.extend_from_slice(&v.to_le_bytes());
        }
        let mut out = OLD_MAGIC.to_vec();
        out.push(0);
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&table);
        if with_new {
            while !out.len().is_multiple_of(8) {
                out.push(0);
            }
            let mut new = NEW_MAGIC.to_vec();
            new.extend_from_slice(&(entries.len() as u32).to_le_bytes());
            new.extend_from_slice(&(strings.len() as u32).to_le_bytes());
            new.extend_from_slice(&[2, 0, 0, 0]);
            new.extend_from_slice(&[0; 16]);
            let strings_at = (NEW_HEADER + entries.len() * NEW_ENTRY) as u32;
            for chunk in table.chunks(12) {
                let flags = u32::from_le_bytes(chunk[0..4].try_into().unwrap());
                let k = u32::from_le_bytes(chunk[4..8].try_into().unwrap()) + strings_at;
                let v = u32::from_le_bytes(chunk[8..12].try_into().unwrap()) + strings_at;
                for x in [flags, k, v, 0] {
                    new.extend_from_slice(&x.to_le_bytes());
                }
                new.extend_from_slice(&0u64.to_le_bytes());
            }
            new.extend_from_slice(&strings);
            out.extend_from_slice(&new);
        } else {
            out.extend_from_slice(&strings);
        }
        out
    }

    /// A new-format cache of `n` entries whose key and path all name one string of `len`
    /// non-NUL bytes (issue 29, finding 2), and the offset of that string.
    fn flood(n: usize, len: usize) -> Vec<u8> {
        let strings_at = (NEW_HEADER + n * NEW_ENTRY) as u32;
        let mut out = NEW_MAGIC.to_vec();
        out.extend_from_slice(&(n as u32).to_le_bytes());
        out.extend_from_slice(&(len as u32 + 1).to_le_bytes());
        out.extend_from_slice(&[2, 0, 0, 0]);
        out.extend_from_slice(&[0; 16]);
        for _ in 0..n {
            for x in [0x0303, strings_at, strings_at, 0] {
                out.extend_from_slice(&x.to_le_bytes());
            }
            out.extend_from_slice(&0u64.to_le_bytes());
        }
        out.resize(out.len() + len, b'a');
        out.push(0);
        out
    }

    /// Finding 2 as filed: 16 MB, 349k entries naming one 8 MB string: more entries than any
    /// cache has, refused before one is read. With fewer entries, the reader stops at the first
    /// string, after looking at `max_string + 1` of its bytes, and copies nothing.
    #[test]
    fn an_amplifying_cache_stops_before_copying_anything() {
        let bytes = flood(349_000, 8 << 20);
        assert!(bytes.len() <= 16 << 20, "within the image cache reader's file limit");
        let e = parse_borrowed(&bytes, &Limits::default()).unwrap_err();
        assert_eq!(e, LdCacheError::Limit { what: "entries", limit: 1 << 17 });
        assert_eq!(parse(&bytes).unwrap_err(), e, "the copying reader is bounded the same way");
        let bytes = flood(100_000, 8 << 20);
        let e = parse_borrowed(&bytes, &Limits::default()).unwrap_err();
        assert_eq!(e, LdCacheError::Limit { what: "string length", limit: 4095 });
        assert!(e.to_string().contains("string length (at most 4095)"), "{e}");
    }

    /// The same flood with strings the loader could use (4000 bytes): each entry is fine alone,
    /// so the total is what stops it, after 16 MiB of strings, not 100k x 8000 bytes.
    #[test]
    fn many_entries_naming_one_long_string_go_past_the_output_limit() {
        let bytes = flood(100_000, 4000);
        let e = parse_borrowed(&bytes, &Limits::default()).unwrap_err();
        assert_eq!(e, LdCacheError::Limit { what: "string bytes of all entries", limit: 16 << 20 });
        // Under a limit that holds them, they are slices of the input, not copies.
        let small = flood(100, 4000);
        let limits = Limits { max_output: 100 * 8000, ..Limits::default() };
        let got = parse_borrowed(&small, &limits).unwrap();
        assert_eq!(got.len(), 100);
        let range = small.as_ptr_range();
        assert!(got.iter().all(|e| range.contains(&e.key.as_ptr()) && range.contains(&e.path.as_ptr())));
        assert_eq!(got[0].key.len(), 4000);
        let limits = Limits { max_output: 100 * 8000 - 1, ..Limits::default() };
        assert!(matches!(parse_borrowed(&small, &limits), Err(LdCacheError::Limit { .. })));
        // An entry count over the limit is refused before any entry is read.
        let limits = Limits { max_entries: 99, ..Limits::default() };
        assert_eq!(parse_borrowed(&small, &limits).unwrap_err(), LdCacheError::Limit { what: "entries", limit: 99 });
    }

    /// glibc-hwcaps names count like the other strings, and an extension with more names than
    /// any glibc knows gives none.
    #[test]
    fn hwcaps_names_are_bounded() {
        let entries: Vec<Entry> = (0..4)
            .map(|i| Entry {
                key: format!("libz.so.{i}"),
                path: format!("/lib/glibc-hwcaps/x86-64-v3/libz.so.{i}"),
                flags: 0x0303,
                osversion: 0,
                hwcap: write::HWCAP_EXTENSION,
                hwcaps: Some("x86-64-v3".into()),
            })
            .collect();
        let bytes = write::encode(&entries, "t");
        let got = parse_borrowed(&bytes, &Limits::default()).unwrap();
        assert!(got.iter().all(|e| e.hwcaps == Some("x86-64-v3")), "{got:?}");
        // Keys and paths fit, the names of the four entries do not.
        let strings: usize = entries.iter().map(|e| e.key.len() + e.path.len()).sum();
        let limits = Limits { max_output: strings + 3 * "x86-64-v3".len(), ..Limits::default() };
        assert!(matches!(parse_borrowed(&bytes, &limits), Err(LdCacheError::Limit { .. })));
        // The names section claims 1024 names: none are taken.
        let ext = read_u32(&bytes, 32, "t").unwrap() as usize;
        let mut evil = bytes.clone();
        let sec = (0..2).map(|i| ext + 8 + i * 16).find(|&s| read_u32(&evil, s, "t").unwrap() == 1).unwrap();
        evil[sec + 12..sec + 16].copy_from_slice(&(4 * 1024u32).to_le_bytes());
        let got = parse_borrowed(&evil, &Limits::default()).unwrap();
        assert!(got.iter().all(|e| e.hwcaps.is_none()), "{got:?}");
    }

    thread_local! {
        /// Set: every string is checked alone, as before the text was checked once
        /// ([`Strings::text`]); the reference the fast path is compared with.
        pub(super) static EACH_STRING_ALONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// Caches written with names of one- to four-byte UTF-8 characters, then damaged a few bytes
    /// at a time (anywhere: header, entry table, strings, extension; values that start, continue
    /// or end UTF-8 sequences, and NUL): reading the text once gives, entry for entry or error
    /// for error, what checking each string alone gives. Offsets into the header, strings that
    /// start inside a character and a text that stops being UTF-8 part of the way take the
    /// string-alone path.
    #[test]
    fn strings_read_from_the_text_checked_once_equal_strings_checked_alone() {
        let names = ["libcuda.so.1", "libé.so.2", "lib€x.so", "lib𝄞.so.1", "libnvidia-ml.so.1"];
        let entries: Vec<Entry> = names
            .iter()
            .enumerate()
            .map(|(i, n)| Entry {
                key: n.to_string(),
                path: format!("/usr/lib/x86_64-linux-gnu/{n}"),
                flags: 0x0303,
                osversion: 0,
                hwcap: if i == 3 { write::HWCAP_EXTENSION } else { 0 },
                hwcaps: (i == 3).then(|| "x86-64-v3".to_string()),
            })
            .collect();
        let base = write::encode(&entries, "actk test");
        let read = |bytes: &[u8], alone: bool| {
            EACH_STRING_ALONE.set(alone);
            let got =
                parse_borrowed(bytes, &Limits::default()).map(|v| v.iter().map(EntryRef::owned).collect::<Vec<_>>());
            EACH_STRING_ALONE.set(false);
            got
        };
        assert_eq!(read(&base, false).unwrap(), read(&base, true).unwrap());
        assert_eq!(read(&base, false).unwrap().len(), names.len());
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let values = [0x00u8, 0x41, 0x80, 0xbf, 0xc3, 0xe2, 0xf0, 0xff, b'/'];
        let (mut ok, mut err) = (0, 0);
        for _ in 0..20_000 {
            let mut bytes = base.clone();
            for _ in 0..1 + next() % 4 {
                // Half the changes in the strings, where the fast path works.
                let at = if next() % 2 == 0 {
                    let from = NEW_HEADER + names.len() * NEW_ENTRY;
                    from + (next() as usize) % (bytes.len() - from)
                } else {
                    (next() as usize) % bytes.len()
                };
                bytes[at] = values[(next() as usize) % values.len()];
            }
            let (fast, alone) = (read(&bytes, false), read(&bytes, true));
            assert_eq!(fast, alone, "{bytes:?}");
            if fast.is_ok() { ok += 1 } else { err += 1 }
        }
        assert!(ok > 1000 && err > 1000, "the damage reached both outcomes: {ok} read, {err} refused");
    }

    #[test]
    fn old_format_alone_and_followed_by_new_format() {
        let entries =
            [(0x0303, "libcuda.so.1", "/usr/lib64/libcuda.so.1"), (0x0003, "libcuda.so.1", "/usr/lib/libcuda.so.1")];
        for with_new in [false, true] {
            let got = parse(&old_format(&entries, with_new)).unwrap();
            assert_eq!(got.len(), 2, "with_new={with_new}");
            assert_eq!(got[0].path, "/usr/lib64/libcuda.so.1");
            assert_eq!(got[0].arch(), LibArch::X86_64);
            assert_eq!(got[1].arch(), LibArch::I386);
        }
    }
}
