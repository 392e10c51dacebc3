//! Where published state lives: the run directory and the network namespace's name in it.

#![allow(unsafe_code)] // getsockopt(2) for the namespace cookie.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// Where claims and published state live (`CORELANE_RUN_DIR` overrides it).
pub fn run_dir() -> PathBuf {
    std::env::var_os("CORELANE_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/corelane"))
}

/// The calling thread's network namespace: its cookie (unique while the machine is up), or the
/// namespace file's inode on kernels without `SO_NETNS_COOKIE` (before 5.14).
pub fn netns_id() -> io::Result<String> {
    const SO_NETNS_COOKIE: libc::c_int = 71;
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `fd` is the socket just opened; `cookie` and `len` are valid for the write.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    if rc == 0 {
        return Ok(format!("net-{cookie}"));
    }
    // /proc/thread-self: a thread may have entered another namespace than the process's.
    let ino = std::fs::metadata("/proc/thread-self/ns/net")?.ino();
    Ok(format!("net-ino{ino}"))
}
