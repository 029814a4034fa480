//! Writing an ld.so.cache: the order glibc's loader searches in, and the new format
//! (`glibc-ld.so.cache1.1`) that every glibc since 2.2 reads and glibc >= 2.32 writes alone.
//!
//! Followed from glibc 2.36 `elf/cache.c` (`compare`, `save_cache`, `write_extensions`) and
//! `elf/dl-cache.c` (`_dl_cache_libcmp`, the loader's binary search):
//! - entries are sorted by [`compare`]: soname descending in [`libcmp`] order (the loader
//!   bisects with the same function), then flags descending, `glibc-hwcaps` entries first (by
//!   subdirectory name), then more specific legacy hwcaps, then higher osversion; entries that
//!   compare equal keep the order they were added in (ldconfig inserts after its equals, and the
//!   loader takes the first usable one), so directories added first win;
//! - the file is the 48-byte header, the entry table, the string table (offsets count from the
//!   start of the header), and at the next 4-byte boundary the extension directory
//!   (magic `0xEAA42174`): a generator string and, when `glibc-hwcaps` entries exist, the sorted
//!   array of their subdirectory names.

use super::{Entry, EntryRef};
use std::cmp::Ordering;
use std::collections::HashMap;

/// `DL_CACHE_HWCAP_EXTENSION`: the hwcap bit of entries from `glibc-hwcaps` subdirectories.
pub const HWCAP_EXTENSION: u64 = 1 << 62;
/// `cache_extension_magic` (glibc `dl-cache.h`: `(uint32_t) -358342284`).
pub const EXTENSION_MAGIC: u32 = 0xEAA4_2174;
/// `cache_extension_tag_generator`.
pub const TAG_GENERATOR: u32 = 0;
/// `cache_extension_tag_glibc_hwcaps`.
pub const TAG_GLIBC_HWCAPS: u32 = 1;

/// glibc's `_dl_cache_libcmp`: compares sonames with runs of digits compared as numbers
/// (`libfoo.so.10` > `libfoo.so.9`), a digit sorting after any other character. Returns the
/// sign of the C function's result (its integer arithmetic wraps as the C code does in practice).
pub fn libcmp(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    let at = |s: &[u8], k: usize| s.get(k).copied().unwrap_or(0);
    while at(a, i) != 0 {
        let (ca, cb) = (at(a, i), at(b, j));
        if ca.is_ascii_digit() {
            if !cb.is_ascii_digit() {
                return Ordering::Greater;
            }
            let (mut va, mut vb) = (0i32, 0i32);
            while at(a, i).is_ascii_digit() {
                va = va.wrapping_mul(10).wrapping_add(i32::from(at(a, i) - b'0'));
                i += 1;
            }
            while at(b, j).is_ascii_digit() {
                vb = vb.wrapping_mul(10).wrapping_add(i32::from(at(b, j) - b'0'));
                j += 1;
            }
            let d = va.wrapping_sub(vb);
            if d != 0 {
                return d.cmp(&0);
            }
        } else if cb.is_ascii_digit() {
            return Ordering::Less;
        } else if ca != cb {
            return ca.cmp(&cb);
        } else {
            i += 1;
            j += 1;
        }
    }
    0u8.cmp(&at(b, j))
}

/// A cache entry with owned ([`Entry`]) or borrowed ([`EntryRef`]) strings: the writer takes
/// either, so the entries of an image's cache are written back without being copied first.
pub trait CacheRecord {
    /// The entry's fields.
    fn record(&self) -> EntryRef<'_>;
}

impl CacheRecord for Entry {
    fn record(&self) -> EntryRef<'_> {
        self.borrowed()
    }
}

impl CacheRecord for EntryRef<'_> {
    fn record(&self) -> EntryRef<'_> {
        *self
    }
}

/// glibc's `compare` of two cache entries (`Less`: `a` comes first).
pub fn compare<E: CacheRecord>(a: &E, b: &E) -> Ordering {
    compare_refs(&a.record(), &b.record())
}

fn compare_refs(a: &EntryRef<'_>, b: &EntryRef<'_>) -> Ordering {
    libcmp(b.key, a.key)
        .then_with(|| b.flags.cmp(&a.flags))
        .then_with(|| match (a.hwcaps, b.hwcaps) {
            (Some(x), Some(y)) => x.as_bytes().cmp(y.as_bytes()),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        })
        .then_with(|| {
            let legacy = |e: &EntryRef<'_>| if e.hwcaps.is_some() { 0 } else { e.hwcap };
            let (ha, hb) = (legacy(a), legacy(b));
            hb.count_ones().cmp(&ha.count_ones()).then_with(|| hb.cmp(&ha))
        })
        .then_with(|| b.osversion.cmp(&a.osversion))
}

/// Sorts `entries` into cache order; equal entries keep their order (see the module docs).
pub fn sort<E: CacheRecord>(entries: &mut [E]) {
    entries.sort_by(compare);
}

/// The bytes of an ld.so.cache holding `entries` in the given order (call [`sort`] first), with
/// `generator` as the extension's generator string. Entries marked [`HWCAP_EXTENSION`] without a
/// subdirectory name are left out (no loader could use them). Little-endian, the only byte order
/// of the machines actk serves.
pub fn encode<E: CacheRecord>(entries: &[E], generator: &str) -> Vec<u8> {
    let entries: Vec<EntryRef<'_>> = entries
        .iter()
        .map(CacheRecord::record)
        .filter(|e| e.hwcap & HWCAP_EXTENSION == 0 || e.hwcaps.is_some())
        .collect();
    // The hwcaps names in use, sorted, give each entry its index (as assign_glibc_hwcaps_indices).
    let mut hwcaps: Vec<&str> = entries.iter().filter_map(|e| e.hwcaps).collect();
    hwcaps.sort_unstable();
    hwcaps.dedup();
    let header = super::NEW_HEADER + entries.len() * super::NEW_ENTRY;
    let mut strings = Strings { base: header, bytes: Vec::new(), at: HashMap::new() };
    let mut table = Vec::with_capacity(entries.len() * super::NEW_ENTRY);
    for e in &entries {
        let key = strings.add(e.key);
        let value = strings.add(e.path);
        let hwcap = match e.hwcaps {
            Some(name) => {
                let index = hwcaps.binary_search(&name).unwrap_or(0) as u64;
                // Keep the ISA level (bits 32..61), as compute_hwcap_value writes it.
                HWCAP_EXTENSION | (e.hwcap & 0x3fff_ffff_0000_0000) | index
            }
            None => e.hwcap,
        };
        table.extend_from_slice(&e.flags.to_le_bytes());
        table.extend_from_slice(&key.to_le_bytes());
        table.extend_from_slice(&value.to_le_bytes());
        table.extend_from_slice(&e.osversion.to_le_bytes());
        table.extend_from_slice(&hwcap.to_le_bytes());
    }
    let hwcaps_offsets: Vec<u32> = hwcaps.iter().map(|h| strings.add(h)).collect();
    let strings = strings.bytes;
    let extension_offset = (header + strings.len()).next_multiple_of(4);
    let sections = if hwcaps.is_empty() { 1 } else { 2 };
    let ext_dir = 8 + sections * 16;
    let hwcaps_at = extension_offset + ext_dir;
    let generator_at = hwcaps_at + hwcaps_offsets.len() * 4;

    let mut out = Vec::with_capacity(generator_at + generator.len());
    out.extend_from_slice(super::NEW_MAGIC);
    for x in [entries.len() as u32, strings.len() as u32] {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.extend_from_slice(&[2, 0, 0, 0]); // flags: little-endian; 3 bytes padding
    out.extend_from_slice(&(extension_offset as u32).to_le_bytes());
    out.extend_from_slice(&[0; 12]);
    out.extend_from_slice(&table);
    out.extend_from_slice(&strings);
    out.resize(extension_offset, 0);
    for x in [EXTENSION_MAGIC, sections as u32, TAG_GENERATOR, 0, generator_at as u32, generator.len() as u32] {
        out.extend_from_slice(&x.to_le_bytes());
    }
    if !hwcaps.is_empty() {
        for x in [TAG_GLIBC_HWCAPS, 0, hwcaps_at as u32, (hwcaps_offsets.len() * 4) as u32] {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    for o in hwcaps_offsets {
        out.extend_from_slice(&o.to_le_bytes());
    }
    out.extend_from_slice(generator.as_bytes());
    out
}

/// The string table: each distinct string once, NUL-terminated, at an offset counted from the
/// start of the header (`base` is the size of header and entry table).
struct Strings<'a> {
    base: usize,
    bytes: Vec<u8>,
    at: HashMap<&'a str, u32>,
}

impl<'a> Strings<'a> {
    fn add(&mut self, s: &'a str) -> u32 {
        if let Some(&o) = self.at.get(s) {
            return o;
        }
        // Fits: a cache is far below 4 GiB (actk-inject bounds what it adds).
        let o = (self.base + self.bytes.len()) as u32;
        self.bytes.extend_from_slice(s.as_bytes());
        self.bytes.push(0);
        self.at.insert(s, o);
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(key: &str, path: &str) -> Entry {
        Entry { key: key.into(), path: path.into(), flags: 0x303, osversion: 0, hwcap: 0, hwcaps: None }
    }

    #[test]
    fn libcmp_compares_digit_runs_as_numbers() {
        assert_eq!(libcmp("libfoo.so.10", "libfoo.so.9"), Ordering::Greater);
        assert_eq!(libcmp("libfoo.so.1", "libfoo.so.1"), Ordering::Equal);
        assert_eq!(libcmp("libfoo.so", "libfoo.so.1"), Ordering::Less);
        assert_eq!(libcmp("libfoo.so.01", "libfoo.so.1"), Ordering::Equal, "numeric, as glibc");
        assert_eq!(libcmp("lib1", "liba"), Ordering::Greater, "a digit sorts after a letter");
        assert_eq!(libcmp("libA", "liba"), Ordering::Less);
    }

    #[test]
    fn encoded_cache_reads_back_in_order_with_hwcaps() {
        let mut entries = vec![
            e("libz.so.1", "/lib/libz.so.1"),
            e("libcuda.so.1", "/opt/drv/libcuda.so.1"),
            Entry {
                hwcaps: Some("x86-64-v3".into()),
                hwcap: HWCAP_EXTENSION | (3 << 32) | 7,
                ..e("libz.so.1", "/lib/glibc-hwcaps/x86-64-v3/libz.so.1.2")
            },
            e("libcuda.so.1", "/usr/lib/libcuda.so.1"),
            Entry { flags: 0x0003, ..e("libcuda.so.1", "/usr/lib32/libcuda.so.1") },
            Entry { hwcap: HWCAP_EXTENSION | 2, ..e("libgone.so.1", "/x/libgone.so.1") },
        ];
        sort(&mut entries);
        let order: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            order[..5],
            [
                "/lib/glibc-hwcaps/x86-64-v3/libz.so.1.2",
                "/lib/libz.so.1",
                "/x/libgone.so.1",
                "/opt/drv/libcuda.so.1",
                "/usr/lib/libcuda.so.1",
            ]
        );
        assert_eq!(order[5], "/usr/lib32/libcuda.so.1", "lower flags after higher for the same soname");
        let bytes = encode(&entries, "actk test");
        let back = super::super::parse_entries(&bytes).unwrap();
        assert_eq!(back.len(), 5, "the extension entry without a name is dropped");
        assert_eq!(back[0].hwcaps.as_deref(), Some("x86-64-v3"));
        assert_eq!(back[0].hwcap, HWCAP_EXTENSION | (3 << 32), "index re-assigned (0), ISA level kept");
        assert_eq!(back[1], e("libz.so.1", "/lib/libz.so.1"));
        assert_eq!(back[2].path, "/opt/drv/libcuda.so.1");
        assert!(bytes.windows(9).any(|w| w == b"actk test"));
    }
}
