//! Who may take a running server's place: the process at the other end of an upgrade's
//! connection (the upgrade socket of `Builder::upgrades`, or a broker's `hello upgrade`), read
//! so that it cannot pass for what it is not.
//!
//! A successor is handed everything the server holds (its AF_XDP sockets, the UMEM and so every
//! frame, the program's maps and link, the run's secret), so it must be a process that could
//! have made those itself:
//! - **its user**: all four of its user ids (real, effective, saved, filesystem) are the server's
//!   user's, or all four are root's; a process that ran a set-user-id program after it
//!   connected shows a mixed set and is refused;
//! - **its user namespace**: the server's own. Inside a user namespace of its making, a process
//!   shows every capability (`CapPrm` of `/proc/PID/status` is read in its own namespace) and
//!   holds none that counts here;
//! - **its capabilities**: at least those the server started with, read in that namespace;
//! - **its proof**: a socket it made in the server's network namespace and marked
//!   ([`PROOF_MARK`] as its `SO_MARK`), sent on the connection ([`send_proof`]). Only a process
//!   holding `CAP_NET_RAW` (or `CAP_NET_ADMIN`) over that network namespace can set a mark, so no
//!   reading of `/proc` that a race could fool decides alone (a process that connected and
//!   then ran a program with file capabilities, or handed its connection to another, is
//!   refused unless the sender could mark a socket). The proof is an unconnected unix socket:
//!   whoever receives it gains nothing by it (an AF_XDP or raw socket would let a receiver
//!   send any frame).
//!
//! Everything is read through a pidfd and a descriptor of the process's `/proc` directory taken
//! while the pidfd shows it alive: a pid reused meanwhile reads as an error, never as another
//! process's facts.

#![allow(unsafe_code)] // openat(2) and getsockopt(2) on descriptors this module owns.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use crate::unixsock::{peer, peer_pidfd, process_ended, send_message};

/// The word a successor's proof comes with.
pub const PROVE: &str = "prove";

/// The `SO_MARK` of a proof (any value but 0 would do: none can be set without the capability).
pub const PROOF_MARK: u32 = 0x636c_6e65;
/// `SO_NETNS_COOKIE` in `asm-generic/socket.h` (Linux 5.14).
const SO_NETNS_COOKIE: libc::c_int = 71;

/// A fresh unix datagram socket marked [`PROOF_MARK`]: what [`send_proof`] sends.
///
/// # Errors
/// This process may not mark a socket (it lacks `CAP_NET_RAW` and `CAP_NET_ADMIN` over its
/// network namespace).
pub fn proof_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor socket(2) just returned; nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let mark = PROOF_MARK;
    // SAFETY: setsockopt(2) on the socket just made, with a u32 and its size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MARK,
            (&mark as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

/// Proves on `conn` that this process holds `CAP_NET_RAW` here: sends [`PROVE`] with a socket
/// it marked (the receiver checks it, see the module's text).
///
/// # Errors
/// No socket can be marked here (the error says how to grant it), or the connection failed.
pub fn send_proof(conn: &OwnedFd) -> io::Result<()> {
    let proof = proof_socket().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "this process cannot mark a socket ({e}), which a successor does to prove it \
                 holds CAP_NET_RAW: start it with the running server's capabilities"
            ),
        )
    })?;
    send_message(conn.as_raw_fd(), PROVE, Some(proof.as_raw_fd()))
}

/// A successor that passed [`vet_successor`].
#[derive(Debug)]
pub struct Successor {
    /// Its process id when it connected.
    pub pid: u32,
    /// A pidfd of it ([`process_ended`] tells when it has ended).
    pub pidfd: OwnedFd,
}

/// What `/proc/PID/status` says of a process, as far as the vetting reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusFacts {
    /// Real, effective, saved and filesystem user ids.
    pub uids: [u32; 4],
    /// Permitted capabilities (in the process's own user namespace).
    pub cap_prm: u64,
}

impl StatusFacts {
    /// Reads the `Uid:` and `CapPrm:` lines of a `status` file's text; `None` when either is
    /// missing or malformed.
    pub fn parse(status: &str) -> Option<StatusFacts> {
        let mut uids = None;
        let mut cap_prm = None;
        for line in status.lines() {
            if let Some(v) = line.strip_prefix("Uid:") {
                let ids: Vec<u32> = v
                    .split_whitespace()
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .ok()?;
                uids = Some(<[u32; 4]>::try_from(ids).ok()?);
            } else if let Some(v) = line.strip_prefix("CapPrm:") {
                cap_prm = Some(u64::from_str_radix(v.trim(), 16).ok()?);
            }
        }
        Some(StatusFacts {
            uids: uids?,
            cap_prm: cap_prm?,
        })
    }

    /// Why these facts do not allow a process to take the place of a server of user `owner`
    /// that started with capabilities `caps` (None: they do).
    pub fn refusal(&self, owner: u32, caps: u64) -> Option<String> {
        let [r, e, s, f] = self.uids;
        let all = |u: u32| self.uids.iter().all(|&x| x == u);
        if !all(owner) && !all(0) {
            return Some(format!(
                "its user ids (real {r}, effective {e}, saved {s}, filesystem {f}) are not all \
                 user {owner}'s (or all root's): a process that ran a set-user-id program, or \
                 of another user, may not take this server's place"
            ));
        }
        if self.cap_prm & caps != caps {
            return Some(format!(
                "it lacks capabilities this server started with (it holds {:#x}, this one \
                 {caps:#x}): start it with the same capabilities (or as root)",
                self.cap_prm
            ));
        }
        None
    }
}

/// A process's `/proc` directory, opened while its pidfd showed it alive.
struct ProcDir {
    dir: File,
}

impl ProcDir {
    fn open(pid: u32, pidfd: &OwnedFd) -> Result<ProcDir, String> {
        let dir = File::open(format!("/proc/{pid}"))
            .map_err(|e| format!("/proc/{pid} cannot be opened: {e}"))?;
        // Opened before this check: if the pid had been reused, the pidfd's process ended
        // first, and reads through `dir` name the new one; the pidfd says so here.
        if process_ended(pidfd) {
            return Err("it ended while it asked".into());
        }
        Ok(ProcDir { dir })
    }

    /// `name` under the directory, opened relative to it (never through the pid's path).
    fn open_in(&self, name: &str) -> io::Result<File> {
        let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: openat(2) on a directory this struct owns, with a NUL-terminated relative
        // name; the result is checked.
        let fd = unsafe {
            libc::openat(
                self.dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor openat(2) just returned; nothing else owns it.
        Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn read(&self, name: &str) -> io::Result<String> {
        let mut s = String::new();
        self.open_in(name)?.read_to_string(&mut s)?;
        Ok(s)
    }
}

/// Whether the process of `dir` is in this process's user namespace.
fn same_user_ns(dir: &ProcDir) -> Result<bool, String> {
    let mine = std::fs::metadata("/proc/thread-self/ns/user")
        .map_err(|e| format!("this process's user namespace cannot be read: {e}"))?;
    match dir.open_in("ns/user").and_then(|f| f.metadata()) {
        Ok(theirs) => Ok((theirs.dev(), theirs.ino()) == (mine.dev(), mine.ino())),
        // Its namespace link is shown only to whoever may trace it (another user's process, or
        // one not dumpable): its identity maps, which anyone may read, are compared instead.
        // They are shown relative to the reader's namespace, and a namespace made below this
        // one can show this one's own maps only if a holder of CAP_SETUID here made it so.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)) => {
            let maps = |read: &dyn Fn(&str) -> io::Result<String>| -> Result<String, String> {
                let u = read("uid_map").map_err(|e| format!("its uid_map: {e}"))?;
                let g = read("gid_map").map_err(|e| format!("its gid_map: {e}"))?;
                Ok(format!("{u}\n{g}"))
            };
            let theirs = maps(&|n| dir.read(n))?;
            let mine = maps(&|n| std::fs::read_to_string(format!("/proc/thread-self/{n}")))?;
            Ok(theirs == mine)
        }
        Err(e) => Err(format!("its user namespace cannot be read: {e}")),
    }
}

/// A socket option of `fd` read as an integer of type `T`.
fn sockopt<T: Default + Copy>(fd: &OwnedFd, level: libc::c_int, opt: libc::c_int) -> io::Result<T> {
    let mut v = T::default();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: getsockopt(2) on a descriptor the caller owns; `v` and `len` are valid for the
    // write and `len` is `v`'s size.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&mut v as *mut T).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// Why `proof` does not prove its sender holds `CAP_NET_RAW` over the network namespace of
/// `conn` (None: it does): it must be a unix socket made in that namespace and marked
/// [`PROOF_MARK`].
pub fn proof_refusal(proof: &OwnedFd, conn: &OwnedFd) -> Option<String> {
    match sockopt::<libc::c_int>(proof, libc::SOL_SOCKET, libc::SO_DOMAIN) {
        Ok(libc::AF_UNIX) => {}
        Ok(d) => {
            return Some(format!(
                "its proof is a socket of family {d}, not a unix one"
            ));
        }
        Err(e) => return Some(format!("its proof is not a socket ({e})")),
    }
    match sockopt::<u32>(proof, libc::SOL_SOCKET, libc::SO_MARK) {
        Ok(PROOF_MARK) => {}
        Ok(m) => {
            return Some(format!(
                "its proof is not marked (mark {m:#x}): only a holder of CAP_NET_RAW marks one"
            ));
        }
        Err(e) => return Some(format!("its proof's mark cannot be read ({e})")),
    }
    let ours = sockopt::<u64>(conn, libc::SOL_SOCKET, SO_NETNS_COOKIE);
    let theirs = sockopt::<u64>(proof, libc::SOL_SOCKET, SO_NETNS_COOKIE);
    match (ours, theirs) {
        (Ok(a), Ok(b)) if a == b => None,
        (Ok(_), Ok(_)) => Some(
            "its proof was made in another network namespace (a mark set in one of its own \
             making proves nothing here)"
                .into(),
        ),
        (Err(e), _) | (_, Err(e)) => Some(format!(
            "the proof's network namespace cannot be read ({e}; Linux 5.14 or later reads it)"
        )),
    }
}

/// Checks that the process at the other end of `conn` may take the place of a server of user
/// `owner` that started with capabilities `caps`, with `proof` the marked socket it sent
/// ([`send_proof`]). See the module's text for the rules.
///
/// # Errors
/// Why it may not, in words naming the process.
pub fn vet_successor(
    conn: &OwnedFd,
    owner: u32,
    caps: u64,
    proof: Option<&OwnedFd>,
) -> Result<Successor, String> {
    let (pid, uid) = peer(conn).map_err(|e| format!("a connection without credentials: {e}"))?;
    let refused = |why: String| {
        format!("process {pid} of user {uid} may not take this server's place: {why}")
    };
    if uid != 0 && uid != owner {
        return Err(refused(format!("only root or user {owner} may")));
    }
    let pidfd = peer_pidfd(conn).map_err(|e| refused(format!("no pidfd of it ({e})")))?;
    let dir = ProcDir::open(pid, &pidfd).map_err(refused)?;
    if !same_user_ns(&dir).map_err(refused)? {
        return Err(refused(
            "it runs in another user namespace than this server's (the capabilities a process \
             holds in a namespace of its own making count for nothing here)"
                .into(),
        ));
    }
    let status = dir
        .read("status")
        .map_err(|e| refused(format!("its status cannot be read ({e})")))?;
    let facts = StatusFacts::parse(&status)
        .ok_or_else(|| refused("its status has no user ids or capabilities".into()))?;
    if let Some(why) = facts.refusal(owner, caps) {
        return Err(refused(why));
    }
    let Some(proof) = proof else {
        return Err(refused(format!(
            "it sent no proof of its capabilities (`{PROVE}` with a socket it marked; a \
             successor from a corelane release before this one sends none)"
        )));
    };
    if let Some(why) = proof_refusal(proof, conn) {
        return Err(refused(why));
    }
    Ok(Successor { pid, pidfd })
}

#[cfg(test)]
#[path = "peer_tests.rs"]
mod tests;
