//! actk-dra-driver (written in the next commits).
fn main() {}
