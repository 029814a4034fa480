//! Listings of the directories a container start reads its configuration from (the CDI spec
//! directories, profiles.d, hooks.d) and, through [`for_each`], of discovery's host root, by
//! getdents64(2) into a buffer on the stack (rustix's `RawDir`).
//!
//! Not `std::fs::read_dir` (issue 31): in the static musl shims that is musl's `opendir`, whose
//! directory stream is a block from musl's own malloc. musl maps that block for each listing
//! and unmaps it at `closedir`, and the first call sets musl's heap up besides (two `brk` and an
//! `mmap`): three directories of a create cost a dozen system calls and four page faults that
//! list nothing. The entry types getdents64 returns also spare a `stat` per spec file.

use rustix::fs::{FileType, Mode, OFlags};
use std::ffi::OsString;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

/// One entry of a directory: its name (never `.` or `..`) and its type as the directory
/// records it (`d_type`; [`FileType::Unknown`] on file systems that do not record it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The entry's name within its directory.
    pub name: OsString,
    /// The type from the directory entry; a symlink is [`FileType::Symlink`], not its target's.
    pub file_type: FileType,
}

impl Entry {
    /// Whether the entry is a directory, a symlink followed as [`Path::is_dir`] follows it:
    /// decided from the entry's type where that is definite, else by `stat` of `dir`/name.
    /// `dir`: the directory that was listed.
    pub fn is_dir(&self, dir: &Path) -> bool {
        match self.file_type {
            FileType::Directory => true,
            FileType::Symlink | FileType::Unknown => dir.join(&self.name).is_dir(),
            _ => false,
        }
    }
}

/// The entries of directory `dir`, in the order the file system returns them (callers sort).
/// Errors: as `std::fs::read_dir` (the directory cannot be opened: `NotFound` when it does not
/// exist, `NotADirectory` when it is a file) and a failed read of its entries.
pub fn list(dir: &Path) -> io::Result<Vec<Entry>> {
    let fd = rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    let mut out = Vec::new();
    for_each(&fd, |name, file_type| out.push(Entry { name: OsString::from_vec(name.to_vec()), file_type }))?;
    Ok(out)
}

/// Calls `f` with the name (bytes, never `.` or `..`) and the recorded type of every entry of
/// the directory open at `dir` (opened for reading, `O_DIRECTORY`), in the order the file system
/// returns them, read by getdents64(2) into an 8 KB buffer on the stack: [`list`] and
/// discovery's listings of the host root share it. Errors: a failed getdents64 (entries before
/// it were passed to `f`).
pub fn for_each(dir: &impl AsFd, mut f: impl FnMut(&[u8], FileType)) -> io::Result<()> {
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 8192];
    let mut entries = rustix::fs::RawDir::new(dir, &mut buf);
    while let Some(entry) = entries.next() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            f(name, entry.file_type());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// What std's read_dir and `Path::is_dir` say of every entry.
    fn by_std(dir: &Path) -> BTreeMap<OsString, bool> {
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap()).map(|e| (e.file_name(), e.path().is_dir())).collect()
    }

    #[test]
    fn lists_what_std_lists_with_the_same_directories() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::write(p.join("a.json"), "{}").unwrap();
        std::fs::create_dir(p.join("sub.json")).unwrap();
        std::os::unix::fs::symlink("sub.json", p.join("to-dir.json")).unwrap();
        std::os::unix::fs::symlink("a.json", p.join("to-file.json")).unwrap();
        std::os::unix::fs::symlink("missing", p.join("dangling.json")).unwrap();
        std::fs::write(p.join("caf\u{e9} with space.toml"), "").unwrap();
        std::fs::write(p.join(OsStr::from_bytes(b"not-utf8-\xff.json")), "").unwrap();
        // More names than one 8 KB getdents64 buffer holds (300 entries of about 56 bytes).
        for i in 0..300 {
            std::fs::write(p.join(format!("file-with-a-longish-name-{i:04}.yaml")), "").unwrap();
        }
        let ours: BTreeMap<OsString, bool> = list(p)
            .unwrap()
            .into_iter()
            .map(|e| {
                let d = e.is_dir(p);
                (e.name, d)
            })
            .collect();
        assert_eq!(ours, by_std(p));
        assert_eq!(ours.len(), 307);
        assert_eq!(ours.get(OsStr::new("to-dir.json")), Some(&true), "a symlink to a directory is a directory");
        assert_eq!(ours.get(OsStr::new("dangling.json")), Some(&false));
    }

    #[test]
    fn errors_as_std_does() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("missing");
        assert_eq!(list(&missing).unwrap_err().kind(), std::fs::read_dir(&missing).unwrap_err().kind());
        assert_eq!(list(&missing).unwrap_err().kind(), io::ErrorKind::NotFound);
        let file = d.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert_eq!(list(&file).unwrap_err().kind(), std::fs::read_dir(&file).unwrap_err().kind());
        let empty = d.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(list(&empty).unwrap().is_empty(), ". and .. are not entries");
    }

    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
}
