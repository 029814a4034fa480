//! actk-core: the pure part of actk (DESIGN.md "Crates"): vendor profiles, discovery over a
//! host root, the inventory, the CDI model and generation, request parsing, and applying CDI
//! edits to an OCI runtime spec. Only file reads; no privileges needed.

pub mod bench_stage;
pub mod cdi;
pub mod config;
pub mod devchar;
pub mod dirlist;
pub mod discover;
pub mod edits;
pub mod hooksd;
pub mod inventory;
pub mod ldcache;
pub mod plan;
pub mod policy;
pub mod profile;
pub mod rawfile;
pub mod request;
pub mod require;
pub mod sharing;
pub mod trusted;
