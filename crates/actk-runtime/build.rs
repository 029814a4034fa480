//! Only declares hot-text.txt an input of this crate: the release build's linker
//! (scripts/lib/hot-text-link.sh) lays out .text from it, and Cargo relinks a binary only when
//! one of its inputs changes (issue 31).
fn main() {
    println!("cargo:rerun-if-changed=hot-text.txt");
}
