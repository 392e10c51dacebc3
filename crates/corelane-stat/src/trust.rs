//! Files in the run directory, opened so that another user of the machine cannot point them
//! elsewhere.
//!
//! A root process (a runtime, the `corelane-broker grant` broker, `corelane-stat`) creates,
//! truncates and maps files under the run directory. Were the directory, or one above it,
//! writable by another user, that user could put a link where a file is expected and have
//! root write through it (`owner` linked to `/etc/shadow` is emptied). So:
//! - the run directory and every directory above it must be owned by root or this process's
//!   user, and writable by nobody else (a root-owned sticky directory such as `/tmp` is
//!   allowed: nobody else may rename or remove what is in it);
//! - a file is opened without following a link in its last component (`O_NOFOLLOW`), and must
//!   be a regular file with one name (a hard link to another file is refused).

#![allow(unsafe_code)] // geteuid(2), which cannot fail.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

/// This process's effective user.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid(2) takes nothing and cannot fail.
    unsafe { libc::geteuid() }
}

fn untrusted(path: &Path, why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{}: {why}; corelane keeps its records there and will not use a directory another \
             user can change (make it owned by root or by this user, mode 0755 or 0700, or set \
             CORELANE_RUN_DIR to one that is)",
            path.display()
        ),
    )
}

/// Whether a directory (or link) owned by `uid` with mode `mode` can be changed only by root
/// or `me`.
fn safe_owner_and_mode(uid: u32, mode: u32, me: u32) -> Result<(), String> {
    if uid != 0 && uid != me {
        return Err(format!("owned by uid {uid}, not by root or uid {me}"));
    }
    let sticky = mode & libc::S_ISVTX != 0;
    if mode & 0o022 != 0 && !(sticky && uid == 0) {
        return Err(format!(
            "writable by {} (mode {:o})",
            if mode & 0o002 != 0 {
                "others"
            } else {
                "its group"
            },
            mode & 0o7777
        ));
    }
    Ok(())
}

/// Checks that `dir` and every directory above it can be changed only by root or this
/// process's user (see the module's rules). A link on the way must be owned by one of them
/// too, and where it leads is checked the same way.
///
/// # Errors
/// `PermissionDenied` naming the first directory another user can change; the error of
/// `lstat` when one is missing.
pub fn check_dir(dir: &Path) -> io::Result<()> {
    check_dir_as(dir, euid())
}

fn check_dir_as(dir: &Path, me: u32) -> io::Result<()> {
    let dir = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir()?.join(dir)
    };
    let mut at = PathBuf::new();
    let mut links = false;
    for c in dir.components() {
        match c {
            Component::RootDir => at.push("/"),
            Component::Normal(n) => at.push(n),
            // `..` and `.` are resolved below, through the canonical path.
            _ => {
                links = true;
                continue;
            }
        }
        let m = std::fs::symlink_metadata(&at)?;
        // A link's own mode is always 0777 and means nothing: who owns it does (its directory,
        // already checked, says who may replace it).
        let mode = if m.file_type().is_symlink() {
            0o755
        } else {
            m.mode()
        };
        safe_owner_and_mode(m.uid(), mode, me).map_err(|why| untrusted(&at, why))?;
        if m.file_type().is_symlink() {
            links = true;
        } else if !m.is_dir() {
            return Err(untrusted(&at, "not a directory"));
        }
    }
    if links {
        let real = dir.canonicalize()?;
        if real != dir {
            return check_dir_as(&real, me);
        }
    }
    Ok(())
}

/// Makes `dir` (and what is missing above it, mode 0755) and checks it as [`check_dir`] does.
///
/// # Errors
/// As [`check_dir`], or the directory cannot be made.
pub fn make_dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    check_dir(dir)
}

/// Opens the regular file at `path` without following a link there: for reading, and for
/// writing with `write`; made (with `mode`, less the umask) when `create` and missing.
///
/// # Errors
/// `path` is a link (`ELOOP`), not a regular file, has another name too (a hard link), or
/// cannot be opened.
pub fn open_file(path: &Path, write: bool, create: Option<u32>) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK);
    if let Some(mode) = create {
        o.create(true).mode(mode);
    }
    let file = o.open(path).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{}: a symbolic link, not followed", path.display()),
            )
        } else {
            e
        }
    })?;
    check_regular(&file, path)?;
    Ok(file)
}

/// Checks that an open file is a regular file with one name.
///
/// # Errors
/// `InvalidData` naming what it is instead.
pub fn check_regular(file: &File, path: &Path) -> io::Result<()> {
    let m = file.metadata()?;
    if !m.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not a regular file", path.display()),
        ));
    }
    if m.nlink() > 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: has {} names (a hard link to another file): refused",
                path.display(),
                m.nlink()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
#[path = "trust_tests.rs"]
mod tests;
