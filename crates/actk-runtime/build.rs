//! Only declares hot-text.txt and the release build's linker, scripts/lib/hot-text-link.sh,
//! inputs of this crate: the linker lays out .text from the list, and Cargo relinks a binary
//! only when one of its inputs changes (issue 31).
fn main() {
    println!("cargo:rerun-if-changed=hot-text.txt");
    println!("cargo:rerun-if-changed=../../scripts/lib/hot-text-link.sh");
}
