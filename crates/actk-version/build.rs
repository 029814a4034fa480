//! Records the git commit the binaries are built from (`ACTK_GIT_COMMIT`), and asks Cargo to
//! rebuild this small crate, and only it, when HEAD moves. Outside a git checkout (a source
//! tarball) or without git, the commit is `unknown`; `ACTK_GIT_COMMIT` in the build environment
//! (image builds from an exported tree) wins.
//!
//! Only what names the commit is watched (HEAD, the ref it points to, packed-refs), never
//! `.git/index`: `git status` refreshes the index's stat data and rewrites the file, so watching
//! it relinked every release binary after any `git status`, this script's own included (issue 25,
//! item 8). "Dirty" is found with `--no-optional-locks`, which reads the index without writing
//! it; it is as fresh as the last commit or checkout (an edit alone does not rerun this script).

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-env-changed=ACTK_GIT_COMMIT");
    let commit = std::env::var("ACTK_GIT_COMMIT").ok().filter(|s| !s.is_empty()).or_else(|| {
        let head = git(&["rev-parse", "--short=12", "HEAD"])?;
        let dirty = git(&["--no-optional-locks", "status", "--porcelain", "--untracked-files=no"]).is_some();
        Some(if dirty { format!("{head}-dirty") } else { head })
    });
    // HEAD, the directory of the ref it names and packed-refs: a commit or checkout changes one
    // of them. In a worktree, HEAD lives in the worktree's git dir and refs in the common dir.
    // A path that does not exist is never named: Cargo counts a missing file as changed, so the
    // script (and every binary after it) would run on every build. The ref's directory, not the
    // ref, is watched (Cargo scans a directory's entries): a ref that lives only in packed-refs
    // gets a loose file on the next commit, and a directory's listing notices that.
    if let (Some(dir), Some(common)) = (git(&["rev-parse", "--git-dir"]), git(&["rev-parse", "--git-common-dir"])) {
        let (dir, common) = (PathBuf::from(dir), PathBuf::from(common));
        let mut watched = vec![dir.join("HEAD"), common.join("packed-refs")];
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watched.extend(common.join(r).parent().map(PathBuf::from));
        }
        for p in watched.iter().filter(|p| p.exists()) {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    println!("cargo:rustc-env=ACTK_GIT_COMMIT={}", commit.unwrap_or_else(|| "unknown".into()));
}
