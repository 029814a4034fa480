//! Property test of the ld.so.cache actk writes (actk_core::ldcache::write): any set of entries,
//! sorted and encoded, reads back entry for entry, and glibc's loader, which bisects the table
//! with `_dl_cache_libcmp` (elf/dl-cache.c `search_cache`), finds every soname, and for a soname
//! takes the entry that was added first among those of the highest flags (the added directories
//! win over the image's copies).
//!
//! Cases: `PROPTEST_CASES` (default 256); counts go to `$ACTK_VERIFY_COUNTS`.

use actk_core::ldcache::write::{self, libcmp};
use actk_core::ldcache::{self, Entry};
use proptest::prelude::*;
use std::cmp::Ordering;

mod common;
use common::check;

/// The loader's lookup of `name` (dl-cache.c): bisect for any equal key, go back to the first
/// equal one, take the first of the equals whose flags this machine's loader accepts.
fn search(entries: &[Entry], name: &str, flags: i32) -> Option<usize> {
    let (mut left, mut right) = (0i64, entries.len() as i64 - 1);
    while left <= right {
        let middle = (left + right) / 2;
        match libcmp(name, &entries[middle as usize].key) {
            Ordering::Equal => {
                let mut m = middle as usize;
                while m > 0 && libcmp(name, &entries[m - 1].key) == Ordering::Equal {
                    m -= 1;
                }
                return (m..entries.len())
                    .take_while(|&i| libcmp(name, &entries[i].key) == Ordering::Equal)
                    .find(|&i| entries[i].flags == flags);
            }
            Ordering::Less => left = middle + 1,
            Ordering::Greater => right = middle - 1,
        }
    }
    None
}

fn soname() -> impl Strategy<Value = String> {
    ("lib[a-c]{1,3}(-[0-9]{1,2})?", prop::option::of("[0-9]{1,3}"), prop::option::of("[0-9]{1,2}")).prop_map(
        |(stem, major, minor)| match (major, minor) {
            (None, _) => format!("{stem}.so"),
            (Some(m), None) => format!("{stem}.so.{}", m.trim_start_matches('0').max("0")),
            (Some(m), Some(n)) => format!("{stem}.so.{}.{n}", m.trim_start_matches('0').max("0")),
        },
    )
}

#[test]
fn any_cache_reads_back_and_the_loader_finds_every_soname_first_added_first() {
    let entry =
        (soname(), 0usize..4, prop::sample::select(vec![0x0303, 0x0003, 0x0001])).prop_map(|(key, dir, flags)| Entry {
            path: format!("/dir{dir}/{key}"),
            key,
            flags,
            osversion: 0,
            hwcap: 0,
            hwcaps: None,
        });
    check("ld.so.cache-write", prop::collection::vec(entry, 0..60), |added| {
        let mut sorted = added.clone();
        write::sort(&mut sorted);
        let bytes = write::encode(&sorted, "actk property test");
        let back = ldcache::parse_entries(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&back, &sorted);
        for e in &added {
            let found = search(&back, &e.key, e.flags);
            prop_assert!(found.is_some(), "the loader does not find {} ({:#x})", e.key, e.flags);
            // The first one added with this soname and flags (sonames equal under libcmp count as one).
            let first = added
                .iter()
                .find(|x| libcmp(&x.key, &e.key) == Ordering::Equal && x.flags == e.flags)
                .expect("e itself");
            prop_assert_eq!(&back[found.unwrap_or_default()].path, &first.path);
        }
        Ok(())
    });
}

/// The bounded reader (issue 29, finding 2): for any cache (written by actk, then with bytes
/// flipped and entry offsets redirected, as a hostile image would) and any limits, a parse that
/// succeeds stays within them, hands out slices of the input (never copies), and agrees with
/// the copying reader; one that fails past a limit says which.
#[test]
fn the_bounded_reader_stays_within_its_limits_and_copies_nothing() {
    let entry = (soname(), 0usize..4).prop_map(|(key, dir)| Entry {
        path: format!("/dir{dir}/{key}"),
        key,
        flags: 0x0303,
        osversion: 0,
        hwcap: 0,
        hwcaps: None,
    });
    let limits = (1usize..40, 1usize..40, 1usize..2000).prop_map(|(e, s, o)| ldcache::Limits {
        max_entries: e,
        max_string: s,
        max_output: o,
    });
    // (entry index, which offset: key or value, new offset)
    let redirect = prop::collection::vec((any::<prop::sample::Index>(), any::<bool>(), any::<u16>()), 0..8);
    let flips = prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4);
    check(
        "ld.so.cache-bounded",
        (prop::collection::vec(entry, 0..40), limits, redirect, flips),
        |(mut entries, limits, redirect, flips)| {
            write::sort(&mut entries);
            let mut bytes = write::encode(&entries, "actk property test");
            let n = entries.len();
            for (i, value, to) in redirect {
                if n > 0 {
                    let at = 48 + i.index(n) * 24 + if value { 8 } else { 4 };
                    bytes[at..at + 4].copy_from_slice(&u32::from(to).to_le_bytes());
                }
            }
            for (at, b) in flips {
                let i = at.index(bytes.len());
                bytes[i] = b;
            }
            match ldcache::parse_borrowed(&bytes, &limits) {
                Ok(got) => {
                    prop_assert!(got.len() <= limits.max_entries);
                    let range = bytes.as_ptr_range();
                    let mut total = 0;
                    for e in &got {
                        for s in [e.key, e.path] {
                            prop_assert!(s.len() <= limits.max_string, "{} bytes", s.len());
                            prop_assert!(s.is_empty() || range.contains(&s.as_ptr()), "{s:?} is a copy");
                            total += s.len();
                        }
                    }
                    prop_assert!(total <= limits.max_output, "{total} bytes of strings");
                    let owned = ldcache::parse_entries(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert_eq!(got.iter().map(|e| e.owned()).collect::<Vec<_>>(), owned);
                }
                Err(ldcache::LdCacheError::Limit { what, limit }) => {
                    prop_assert!(
                        [limits.max_entries, limits.max_string, limits.max_output].contains(&limit),
                        "{what}: {limit}"
                    );
                }
                Err(_) => {}
            }
            Ok(())
        },
    );
}
