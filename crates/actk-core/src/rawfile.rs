//! Whole-file reads and exclusive creates by direct system calls (rustix), for the files a
//! container start reads and writes outside the host root: config.toml, config.json,
//! `/proc/self/uid_map` and `/proc/sys/kernel/overflowuid`, CDI spec and hooks files,
//! config.json's temporary file; and discovery's reads in the host root.
//!
//! Not `std::fs` (issue 31): in the static musl shims, std's `File::open` is musl's `open(3)`,
//! which follows every `O_CLOEXEC` open with `fcntl(F_SETFD, FD_CLOEXEC)` for kernels older
//! than 2.6.23; and `std::fs::read` asks the file's size with `fstat` first, then reads it and
//! once more for the end. A create read four such files and wrote one: nine of its sixty-two
//! system calls were these. [`read_fd`] reads into a page on the stack first, so a small file
//! costs its `open`, a read, the read that finds the end and `close`, and the result is
//! allocated at its size.
//!
//! Errors are the system call's, as `std::io::Error` (`NotFound` for `ENOENT`, and so on), as
//! std gives them.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags};

/// Opens `path` for reading, close-on-exec, in one system call; `extra` adds flags
/// (`O_NONBLOCK` for a file that may be a FIFO).
/// Retries `EINTR`, as std's `File::open` does.
pub fn open_read(path: &Path, extra: OFlags) -> io::Result<OwnedFd> {
    open_retrying(path, OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | extra, Mode::empty())
}

/// open(2), again while it fails with `EINTR` (a signal during an open of a file on NFS or FUSE).
fn open_retrying(path: &Path, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    loop {
        match rustix::fs::open(path, flags, mode) {
            Err(rustix::io::Errno::INTR) => {}
            r => return Ok(r?),
        }
    }
}

/// Reads `fd` from its offset to its end: into a 4 KiB page on the stack while it fits (the
/// result allocated at its size), then into a buffer that doubles. Works on files whose size
/// `stat` does not tell (procfs and sysfs report 0 or 4096). Retries `EINTR`.
pub fn read_fd(fd: impl AsFd) -> io::Result<Vec<u8>> {
    read_fd_as(fd.as_fd(), false)
}

/// [`read_fd`] for a sysfs attribute, or a regular file standing in for one in a fixture root:
/// a first read that returns less than the page it asked for ends the file, without the read
/// that would return 0. A sysfs attribute is one `show()` of at most a page, which one read of
/// a page returns whole (`sysfs_kf_seq_show`; on a kernel with larger pages, an attribute over
/// 4 KiB fills the page and is read on to its end), and a fixture's regular file on a local
/// file system returns all that is asked up to its end. Not for procfs: a seq_file there may
/// stop a read short at a record that does not fit in its own buffer.
pub fn read_sysfs_fd(fd: impl AsFd) -> io::Result<Vec<u8>> {
    read_fd_as(fd.as_fd(), true)
}

fn read_fd_as(fd: std::os::fd::BorrowedFd<'_>, short_read_ends: bool) -> io::Result<Vec<u8>> {
    let mut page = [0u8; 4096];
    let mut len = 0;
    while len < page.len() {
        match rustix::io::read(fd, &mut page[len..]) {
            Ok(0) => return Ok(page[..len].to_vec()),
            Ok(n) if short_read_ends && len == 0 && n < page.len() => return Ok(page[..n].to_vec()),
            Ok(n) => len += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut buf = page.to_vec();
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match rustix::io::read(fd, &mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

/// Reads regular file `fd` from its start, at most `max` bytes, its size by `fstat` being
/// `size`: into a buffer of `size + 1` bytes, so that the first read returns `size` bytes and
/// asks no more (a file's contents are what `fstat` said: a local file's read returns all it
/// is asked for up to the end). Any other outcome (a file that grew or shrank since, a read cut
/// short on FUSE or by a signal) reads on until a read returns nothing, or to `max`. One read
/// for a CDI spec file where std's `read_to_end` made three (8 KiB, the rest, and the probe
/// that finds the end).
pub fn read_regular(fd: impl AsFd, size: u64, max: usize) -> io::Result<Vec<u8>> {
    let fd = fd.as_fd();
    let mut buf: Vec<u8> = Vec::with_capacity(usize::try_from(size).unwrap_or(max).min(max).saturating_add(1));
    while buf.len() < max {
        if buf.len() == buf.capacity() {
            buf.reserve_exact(buf.capacity().max(4096).min(max - buf.len()));
        }
        let asked = buf.capacity() - buf.len();
        match rustix::io::read(fd, rustix::buffer::spare_capacity(&mut buf)) {
            Ok(0) => break,
            Ok(n) if n < asked && buf.len() as u64 == size => break,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    buf.truncate(max);
    Ok(buf)
}

/// The whole of file `path` (`std::fs::read` without the `fcntl` and the `fstat`).
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    read_fd(open_read(path, OFlags::empty())?)
}

/// The whole of text file `path`; `InvalidData` when it is not UTF-8, as
/// `std::fs::read_to_string`.
pub fn read_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read(path)?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Creates `path` for writing with permission bits `mode` (before the umask), close-on-exec,
/// failing with `AlreadyExists` when any entry has that name, a symlink (dangling or not)
/// included (`O_CREAT | O_EXCL`): `OpenOptions::new().write(true).create_new(true).mode(mode)`
/// in one system call.
pub fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC | OFlags::NOCTTY;
    Ok(File::from(open_retrying(path, flags, Mode::from_raw_mode(mode))?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn reads_what_std_reads_at_every_size_around_the_page() {
        let d = tempfile::tempdir().unwrap();
        for n in [0usize, 1, 4095, 4096, 4097, 8191, 8192, 8193, 70_000] {
            let p = d.path().join(format!("f{n}"));
            let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
            std::fs::write(&p, &data).unwrap();
            assert_eq!(read(&p).unwrap(), data, "size {n}");
            assert_eq!(read(&p).unwrap(), std::fs::read(&p).unwrap(), "size {n}");
        }
    }

    #[test]
    fn sysfs_reads_of_regular_files_are_whole_at_every_size_around_the_page() {
        let d = tempfile::tempdir().unwrap();
        for n in [0usize, 1, 4095, 4096, 4097, 8192, 70_000] {
            let p = d.path().join(format!("f{n}"));
            let data: Vec<u8> = (0..n).map(|i| (i * 13 % 251) as u8).collect();
            std::fs::write(&p, &data).unwrap();
            let fd = open_read(&p, OFlags::empty()).unwrap();
            assert_eq!(read_sysfs_fd(&fd).unwrap(), data, "size {n}");
        }
    }

    #[test]
    fn sysfs_attributes_read_as_std_reads_them() {
        let mut read_some = 0;
        for p in [
            "/sys/class/net/lo/address",
            "/sys/class/net/lo/mtu",
            "/sys/devices/system/cpu/online",
            "/sys/devices/system/cpu/possible",
            "/sys/kernel/mm/transparent_hugepage/enabled",
            "/sys/module/kernel/parameters/panic",
        ] {
            let p = Path::new(p);
            let Ok(fd) = open_read(p, OFlags::empty()) else { continue };
            assert_eq!(read_sysfs_fd(&fd).unwrap(), std::fs::read(p).unwrap(), "{}", p.display());
            read_some += 1;
        }
        if read_some == 0 {
            eprintln!("SKIPPED: no sysfs attribute of the list on this machine (no /sys?)");
        }
    }

    #[test]
    fn reads_proc_files_whose_size_stat_does_not_tell() {
        for p in ["/proc/self/uid_map", "/proc/self/status", "/proc/self/mountinfo"] {
            let p = Path::new(p);
            let ours = read_to_string(p).unwrap();
            assert!(!ours.is_empty(), "{}", p.display());
            // The same file read by std in this process; `status` and `mountinfo` may change
            // between the two reads only in values, not in their first line.
            let std = std::fs::read_to_string(p).unwrap();
            assert_eq!(ours.lines().next(), std.lines().next(), "{}", p.display());
        }
        assert_eq!(
            read_to_string(Path::new("/proc/self/uid_map")).unwrap(),
            std::fs::read_to_string("/proc/self/uid_map").unwrap()
        );
    }

    #[test]
    fn regular_reads_take_the_whole_file_whatever_its_size_did_since_the_stat() {
        let d = tempfile::tempdir().unwrap();
        for n in [0usize, 1, 4095, 4096, 17_105, 70_000] {
            let p = d.path().join(format!("f{n}"));
            let data: Vec<u8> = (0..n).map(|i| (i * 11 % 251) as u8).collect();
            std::fs::write(&p, &data).unwrap();
            // The size as stat'ed, smaller (the file grew since), larger (it shrank).
            for hint in [n as u64, (n as u64).saturating_sub(10), n as u64 + 100, 0] {
                let fd = open_read(&p, OFlags::empty()).unwrap();
                assert_eq!(read_regular(&fd, hint, 1 << 20).unwrap(), data, "size {n}, hint {hint}");
            }
            // Never more than `max`, whatever the hint (a `max` under a page too).
            for hint in [n as u64, 0, 10, 5000] {
                let fd = open_read(&p, OFlags::empty()).unwrap();
                assert_eq!(
                    read_regular(&fd, hint, 1000).unwrap(),
                    data[..n.min(1000)],
                    "size {n}, hint {hint}, max 1000"
                );
            }
        }
    }

    /// A read cut short before the size the stat gave is not the end: the rest is read too
    /// (a pipe stands in for a file on FUSE whose reads return less than asked).
    #[test]
    fn a_regular_read_cut_short_reads_on() {
        let (r, mut w) = io::pipe().unwrap();
        let writer = std::thread::spawn(move || {
            w.write_all(b"abc").unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));
            w.write_all(b"def").unwrap();
        });
        assert_eq!(read_regular(&r, 6, 1 << 20).unwrap(), b"abcdef");
        writer.join().unwrap();
    }

    #[test]
    fn errors_are_the_ones_std_gives() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("missing");
        assert_eq!(read(&missing).unwrap_err().kind(), std::fs::read(&missing).unwrap_err().kind());
        assert_eq!(read(d.path()).unwrap_err().kind(), std::fs::read(d.path()).unwrap_err().kind());
        let bad = d.path().join("bad");
        std::fs::write(&bad, [0xff, 0xfe]).unwrap();
        assert_eq!(read_to_string(&bad).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn read_fds_are_close_on_exec() {
        let fd = open_read(Path::new("/proc/self/uid_map"), OFlags::empty()).unwrap();
        assert!(rustix::io::fcntl_getfd(&fd).unwrap().contains(rustix::io::FdFlags::CLOEXEC));
    }

    #[test]
    fn create_new_refuses_every_existing_name_and_follows_no_link() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "host").unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let dangling = d.path().join("dangling");
        std::os::unix::fs::symlink(d.path().join("nowhere"), &dangling).unwrap();
        for p in [&victim, &link, &dangling] {
            assert_eq!(create_new(p, 0o600).unwrap_err().kind(), io::ErrorKind::AlreadyExists, "{}", p.display());
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host");
        assert!(!d.path().join("nowhere").exists());

        let fresh = d.path().join("fresh");
        let mut f = create_new(&fresh, 0o600).unwrap();
        f.write_all(b"new").unwrap();
        drop(f);
        assert_eq!(std::fs::read_to_string(&fresh).unwrap(), "new");
        assert_eq!(std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777, 0o600);
        let fd = create_new(&d.path().join("cloexec"), 0o600).unwrap();
        assert!(rustix::io::fcntl_getfd(&fd).unwrap().contains(rustix::io::FdFlags::CLOEXEC));
    }
}
