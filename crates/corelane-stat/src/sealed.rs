//! Files a root broker makes for a server it does not trust with its run directory: sealed
//! memory files of a fixed size, and a small pointer in the run directory by which root's
//! readers find them.
//!
//! A granted server writes its statistics and captured frames into files the broker hands it.
//! Were they files in `/run`, its descriptor would let it grow them until `/run` is full, or
//! shrink them under root's reader (a `SIGBUS`). So the broker makes each one a memory file
//! (`memfd_create`) of the size the server asked for, within a cap, sealed against growing and
//! shrinking (`F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL`): the kernel refuses any resize, the
//! pages are charged to whoever writes them, and nothing lands in `/run` but the pointer.
//!
//! The pointer is a one-line file at the path the file would have had (`stats`, `capture`),
//! written by the broker in the run directory (which only root or the broker's user may
//! change: `trust.rs`): `corelane-sealed PID FD DEV INO`, the broker's process, the
//! descriptor it keeps open, and the memory file's identity. A reader copies that descriptor
//! (`pidfd_getfd`, never opening `/proc/PID/fd/FD` anew: a FIFO or device named there would
//! make root's reader wait or open it) and uses it only when that process runs as the
//! pointer's owner, and the file is the one named (a pid reused since names another file), a
//! regular file, and sealed.

#![allow(unsafe_code)] // memfd_create(2) and fcntl(2) seals.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The first word of a pointer file.
const TAG: &str = "corelane-sealed";

/// The largest file a broker makes for one server's request (stats or capture).
pub const SEALED_MAX_BYTES: u64 = 256 << 20;

/// A memory file of `bytes` bytes (zeroes), sealed so that nobody can grow or shrink it, named
/// `name` in `/proc/PID/fd` listings.
///
/// # Errors
/// `bytes` is zero or above [`SEALED_MAX_BYTES`] (`InvalidInput`, naming the cap), or the
/// kernel refuses the file or its seals.
pub fn sealed_file(name: &str, bytes: u64) -> io::Result<File> {
    if bytes == 0 || bytes > SEALED_MAX_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{name}: {bytes} bytes asked for; a file made for a server holds 1 to \
                 {SEALED_MAX_BYTES} bytes"
            ),
        ));
    }
    let cname = CString::new(format!("corelane-{name}"))
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the file's name"))?;
    // SAFETY: a valid NUL-terminated name and flags; the result is checked.
    let fd =
        unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just made and is owned by nothing else.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(bytes)?;
    let seals = libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
    // SAFETY: fcntl(2) on a descriptor this function owns, with an integer argument.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

/// Writes at `path` the pointer to `file`, which this process keeps open, with permissions
/// `mode`: replacing what is there, never through a link. Returns the pointer's identity, to
/// remove it with.
///
/// # Errors
/// The pointer cannot be written.
pub fn write_pointer(path: &Path, file: &File, mode: u32) -> io::Result<crate::FileId> {
    let m = file.metadata()?;
    let line = format!(
        "{TAG} {} {} {} {}\n",
        std::process::id(),
        file.as_raw_fd(),
        m.dev(),
        m.ino()
    );
    let mut p = crate::new_file(path, mode)?;
    p.write_all(line.as_bytes())?;
    crate::file_id(&p).ok_or_else(|| io::Error::other("the pointer vanished"))
}

/// What a pointer says: where the file is (a process's descriptor) and which file it must be.
#[derive(Debug, PartialEq, Eq)]
struct Pointer {
    pid: u32,
    fd: i32,
    id: crate::FileId,
}

impl Pointer {
    fn at(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/fd/{}", self.pid, self.fd))
    }
}

/// A copy of descriptor `fd` of process `pid` (`pidfd_getfd(2)`, Linux 5.6): the same open
/// file, never opened anew, so that naming a FIFO, a device or a file of another mode makes
/// root's reader do nothing it would not have done: wait on a FIFO, open a tty, or gain a
/// write access the process does not have.
fn copy_descriptor(pid: u32, fd: i32) -> io::Result<File> {
    // SAFETY: pidfd_open(2) with a pid and no flags; the result is checked.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if pidfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor pidfd_open just returned; nothing else owns it.
    let pidfd = unsafe { std::os::fd::OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: pidfd_getfd(2) on a pidfd this function owns, no flags; the result is checked.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor pidfd_getfd just installed in this process (close-on-exec);
    // nothing else owns it.
    Ok(unsafe { File::from_raw_fd(got as i32) })
}

fn parse(text: &str) -> Option<Pointer> {
    let mut w = text.trim_end().split(' ');
    if w.next()? != TAG {
        return None;
    }
    let pid: u32 = w.next()?.parse().ok()?;
    let fd: i32 = w.next()?.parse().ok()?;
    let dev: u64 = w.next()?.parse().ok()?;
    let ino: u64 = w.next()?.parse().ok()?;
    if w.next().is_some() || fd < 0 {
        return None;
    }
    Some(Pointer {
        pid,
        fd,
        id: (dev, ino),
    })
}

/// The file `file` (opened at `path`) stands for: itself, or the sealed file it points to
/// when it is a pointer. A pointer counts only when the process it names runs as the
/// pointer's owner, and the file it leads to only when it is the one named and sealed against
/// resizing: a pointer leads to nothing but a file such a broker made.
///
/// # Errors
/// A pointer whose process is another user's, or leading to no file, to another file than it
/// names, or to a file not sealed.
pub(crate) fn follow(file: File, path: &Path, write: bool) -> io::Result<File> {
    let m = file.metadata()?;
    if m.len() > 128 {
        return Ok(file);
    }
    let mut text = String::new();
    if (&file).read_to_string(&mut text).is_err() || !text.starts_with(TAG) {
        return Ok(file);
    }
    let bad = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {why}", path.display()),
        )
    };
    let p = parse(&text).ok_or_else(|| bad("a malformed pointer".into()))?;
    let at = p.at();
    let process = PathBuf::from(format!("/proc/{}", p.pid));
    let runs_as = std::fs::metadata(&process)
        .map_err(|e| bad(format!("its broker {}: {e}", process.display())))?
        .uid();
    if runs_as != m.uid() {
        return Err(bad(format!(
            "a pointer owned by uid {} to a process of uid {runs_as}: refused",
            m.uid()
        )));
    }
    let target = match copy_descriptor(p.pid, p.fd) {
        Ok(f) => f,
        // A user's reader whom ptrace's rules (Yama) refuse the copy: opening the file again
        // gives it nothing it could not open itself. Root never reopens.
        Err(e) if e.raw_os_error() == Some(libc::EPERM) && crate::trust::euid() != 0 => {
            std::fs::OpenOptions::new()
                .read(true)
                .write(write)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(&at)
                .map_err(|e| bad(format!("its broker's file {}: {e}", at.display())))?
        }
        Err(e) => return Err(bad(format!("its broker's file {}: {e}", at.display()))),
    };
    let t = target.metadata()?;
    if (t.dev(), t.ino()) != p.id || !t.file_type().is_file() {
        return Err(bad(format!(
            "{} is not the file the pointer names (its broker is gone)",
            at.display()
        )));
    }
    // The broker keeps its files open for reading and writing; a copy of a descriptor open
    // otherwise gives no more than it had.
    // SAFETY: fcntl(2) F_GETFL on a descriptor `target` owns; no argument.
    let mode = unsafe { libc::fcntl(target.as_raw_fd(), libc::F_GETFL) } & libc::O_ACCMODE;
    if write && mode != libc::O_RDWR {
        return Err(bad(format!("{} is not open for writing", at.display())));
    }
    // SAFETY: fcntl(2) F_GET_SEALS on a descriptor `target` owns; no argument.
    let seals = unsafe { libc::fcntl(target.as_raw_fd(), libc::F_GET_SEALS) };
    let want = libc::F_SEAL_GROW | libc::F_SEAL_SHRINK;
    if seals < 0 || seals & want != want {
        return Err(bad(format!(
            "{} is not sealed against resizing: not a file a broker made",
            at.display()
        )));
    }
    Ok(target)
}

#[cfg(test)]
#[path = "sealed_tests.rs"]
mod tests;
