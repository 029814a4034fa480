//! Test helpers of this crate's unit tests.

use rustix::fd::OwnedFd;
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};

/// Watches files for being opened (`IN_OPEN`): an `O_PATH` descriptor raises no such event, a
/// real open (which, for a device node, runs its driver's `open`) does.
pub struct OpenWatch {
    fd: OwnedFd,
    paths: HashMap<i32, PathBuf>,
}

impl OpenWatch {
    /// Watches each of `paths`.
    pub fn new(paths: &[&Path]) -> OpenWatch {
        let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC).unwrap();
        let mut map = HashMap::new();
        for p in paths {
            let wd = inotify::add_watch(&fd, *p, WatchFlags::OPEN | WatchFlags::DONT_FOLLOW).unwrap();
            map.insert(wd, p.to_path_buf());
        }
        OpenWatch { fd, paths: map }
    }

    /// The watched paths opened since the last call.
    pub fn opened(&self) -> Vec<PathBuf> {
        let mut buf = [MaybeUninit::uninit(); 4096];
        let mut r = inotify::Reader::new(&self.fd, &mut buf);
        let mut out = Vec::new();
        while let Ok(ev) = r.next() {
            if ev.events().contains(ReadFlags::OPEN)
                && let Some(p) = self.paths.get(&ev.wd())
            {
                out.push(p.clone());
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

/// Makes a node of `kind` (character device 1:11 as finding 4's image ships, or a FIFO) at `p`.
pub fn node(p: &Path, kind: rustix::fs::FileType) {
    let dev = if kind == rustix::fs::FileType::CharacterDevice { rustix::fs::makedev(1, 11) } else { 0 };
    rustix::fs::mknodat(rustix::fs::CWD, p, kind, rustix::fs::Mode::from_raw_mode(0o644), dev).unwrap();
}
