//! The version every actk binary reports: the workspace version (Cargo.toml) and the git
//! commit it was built from, as `0.1.0 (commit 1a2b3c4d5e6f)`; `-dirty` marks uncommitted
//! changes in tracked files, `unknown` a build outside a git checkout. The container image and
//! the Helm chart carry the same version (`appVersion`).

/// The workspace version, e.g. `0.1.0`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit (12 hex digits, `-dirty` when tracked files were modified) or `unknown`.
pub const COMMIT: &str = env!("ACTK_GIT_COMMIT");

/// `VERSION (commit COMMIT)`, for clap's `version` and the binaries' `--version` lines.
pub const LONG: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("ACTK_GIT_COMMIT"), ")");

/// The line a binary prints for `--version`: `NAME VERSION (commit COMMIT)`.
pub fn line(name: &str) -> String {
    format!("{name} {LONG}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_version_names_the_workspace_version_and_a_commit() {
        assert!(super::LONG.starts_with(super::VERSION));
        assert!(super::LONG.contains("(commit "));
        assert!(!super::COMMIT.is_empty());
        assert_eq!(super::line("actk"), format!("actk {}", super::LONG));
    }
}
