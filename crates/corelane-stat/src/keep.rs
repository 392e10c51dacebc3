//! The key a host's runtimes keep across restarts, in the run directory.
//!
//! A runtime draws its ISN and timestamp-offset keys from it (`StackConfig::restart_key`), so
//! the next process of the same user gives a four-tuple timestamps and ISNs above those of the
//! last one: a peer that still holds that four-tuple in TIME-WAIT takes the new SYN instead of
//! dropping it for PAWS. The file is tmpfs's (`/run` is emptied at boot, as the kernel draws
//! its own such key at boot), readable and writable only by its owner, and made whole before it
//! gets its name, so a reader never sees half of one.

use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::trust::{euid, open_file};

/// The file's name in the run directory.
pub const RESTART_KEY_FILE: &str = "restart-key";

/// The restart key kept in `dir` (made there, from the OS's randomness, when missing).
///
/// # Errors
/// `dir` fails [`check_dir`](crate::check_dir) or cannot be written; the file is a link, has
/// another name, is not 16 bytes long, is owned by another user or readable by anyone else
/// (`PermissionDenied`, naming the fix).
pub fn restart_key(dir: &Path) -> io::Result<[u64; 2]> {
    crate::check_dir(dir)?;
    let path = dir.join(RESTART_KEY_FILE);
    let mut last = None;
    // A file that another process is giving its name has two for an instant: read again.
    for _ in 0..20 {
        match read_key(&path) {
            Ok(k) => return Ok(k),
            Err(e) if e.kind() == io::ErrorKind::NotFound => make_key(dir, &path)?,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                last = Some(e);
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("the restart key could not be read")))
}

fn read_key(path: &Path) -> io::Result<[u64; 2]> {
    let mut f = open_file(path, false, None)?;
    let m = f.metadata()?;
    if m.uid() != euid() || m.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{}: owned by uid {} with mode {:o}; a restart key must be this user's (uid {}) \
                 and readable by nobody else (remove the file: the next runtime makes a new one)",
                path.display(),
                m.uid(),
                m.mode() & 0o7777,
                euid()
            ),
        ));
    }
    let mut b = [0u8; 17];
    let n = f.read(&mut b)?;
    if n != 16 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {n} bytes, not a 16-byte key", path.display()),
        ));
    }
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[i..i + 8]);
        u64::from_le_bytes(w)
    };
    Ok([word(0), word(8)])
}

/// Writes a fresh key under a name of this process's, then links it to `path` (which fails,
/// harmlessly, where another process linked its own first).
fn make_key(dir: &Path, path: &Path) -> io::Result<()> {
    let mut key = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    let tmp = dir.join(format!(
        ".{RESTART_KEY_FILE}.{}.{:x}",
        std::process::id(),
        u64::from_le_bytes([
            key[0], key[3], key[5], key[7], key[9], key[11], key[13], key[15]
        ])
    ));
    let made = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(&key)?;
        match std::fs::hard_link(&tmp, path) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    made
}
