//! Plants one hostile class of issue 29 into a rootfs, for benches/hostile-bench.sh (which runs
//! the same files against two builds of actk).
//!
//! Usage: `hostile_image cache|elf|dropin ROOTFS [LIB_DIR] [LINKS]` (defaults:
//! `/usr/lib/x86_64-linux-gnu`, 1000 links).

use actk_testsupport::hostile::{Class, plant};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let class = match args.first().map(String::as_str) {
        Some("cache") => Class::AmplifyingCache,
        Some("elf") => Class::ElfFlood,
        Some("dropin") => Class::DropInFlood,
        _ => anyhow::bail!("usage: hostile_image cache|elf|dropin ROOTFS [LIB_DIR] [LINKS]"),
    };
    let rootfs = args.get(1).ok_or_else(|| anyhow::anyhow!("ROOTFS missing"))?;
    let lib_dir = args.get(2).map(String::as_str).unwrap_or("/usr/lib/x86_64-linux-gnu");
    let links = args.get(3).map(|n| n.parse()).transpose()?.unwrap_or(1000);
    plant(std::path::Path::new(rootfs), class, lib_dir, links)
}
