//! The unix-socket plumbing the grant broker and the upgrade share: one message (with at most
//! one descriptor) at a time over `SOCK_SEQPACKET`, listening sockets placed without a window
//! of wider permissions, who is at the other end (credentials, a pidfd) and ending it.

#![allow(unsafe_code)] // `OwnedFd::from_raw_fd` on descriptors the kernel just gave us; pidfds, their poll and signal; socket options.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

use nix::sys::socket::{
    self, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    UnixAddr, sockopt,
};

/// Longest message either side sends.
pub const MAX_MESSAGE: usize = 4096;

/// Sends one message, with a descriptor when `fd` is given.
///
/// # Errors
/// The socket is closed or the message does not fit.
pub fn send_message(sock: RawFd, text: &str, fd: Option<RawFd>) -> std::io::Result<()> {
    let fds = fd.map(|f| [f]);
    let cmsgs: Vec<ControlMessage<'_>> = fds.iter().map(|f| ControlMessage::ScmRights(f)).collect();
    socket::sendmsg::<()>(
        sock,
        &[IoSlice::new(text.as_bytes())],
        &cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    Ok(())
}

/// Receives one message and the descriptor that came with it. `Ok(None)` when the peer closed
/// the connection.
///
/// # Errors
/// The socket failed or timed out, or the message was truncated or not UTF-8.
pub fn recv_message(sock: RawFd) -> std::io::Result<Option<(String, Option<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let (n, fds, truncated) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg =
            socket::recvmsg::<()>(sock, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
        let mut fds = Vec::new();
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(r) = c {
                fds.extend(r);
            }
        }
        let truncated = msg
            .flags
            .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
        (msg.bytes, fds, truncated)
    };
    // SAFETY: the kernel just installed these descriptors in this process for us; nothing
    // else refers to them, so each gets exactly one owner.
    let mut owned: Vec<OwnedFd> = fds
        .into_iter()
        .map(|f| unsafe { OwnedFd::from_raw_fd(f) })
        .collect();
    if n == 0 && owned.is_empty() {
        return Ok(None);
    }
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    if truncated || owned.len() > 1 {
        return Err(bad("message too long or with more than one descriptor"));
    }
    buf.truncate(n);
    let text = String::from_utf8(buf).map_err(|_| bad("message is not UTF-8"))?;
    Ok(Some((text, owned.pop())))
}

/// A listening `SOCK_SEQPACKET` socket at `path` (a stale one removed first) with permissions
/// `mode`, whose `accept` wakes every `tick` so the caller can see whether to stop. The broker
/// makes it 0666 (who may take the grant is checked on the connection), an upgrade's 0600.
///
/// The socket is bound in a fresh directory only this process may enter, given its mode
/// there, and renamed into place: its permissions are never wider than `mode`, not even for
/// a moment, and no link another user puts at `path` is followed.
///
/// # Errors
/// The socket cannot be made, bound or listened on.
pub fn listen_at(path: &Path, tick: Duration, mode: u32) -> std::io::Result<OwnedFd> {
    listen_refusing(path, tick, mode, false).map(|(s, _)| s)
}

/// `SO_PASSRIGHTS` in `asm-generic/socket.h` (Linux 6.16): whether a unix socket takes
/// descriptors (`SCM_RIGHTS`); a connection inherits its listener's setting.
const SO_PASSRIGHTS: libc::c_int = 83;

/// Whether `sock` takes descriptors sent to it (a sender's `sendmsg` with descriptors fails
/// with `EPERM` while it does not). `Ok(false)`: the kernel cannot refuse them (before 6.16).
///
/// # Errors
/// The kernel refused the option otherwise.
pub fn take_descriptors(sock: &OwnedFd, take: bool) -> std::io::Result<bool> {
    let v: libc::c_int = take.into();
    // SAFETY: setsockopt(2) on a socket the caller owns, with an int and its size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PASSRIGHTS,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOPROTOOPT) => Ok(false),
        _ => Err(e),
    }
}

/// As [`listen_at`]; with `refuse_descriptors`, no connection takes a descriptor until its
/// receiver allows it ([`take_descriptors`]): a peer that is refused cannot leave one behind
/// whose last close would block the closer. Returns whether the kernel could refuse them.
///
/// # Errors
/// As [`listen_at`].
pub fn listen_refusing(
    path: &Path,
    tick: Duration,
    mode: u32,
    refuse_descriptors: bool,
) -> std::io::Result<(OwnedFd, bool)> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}: not a file's path", path.display()),
        )
    })?;
    let sock = seqpacket()?;
    // Before it can be reached: every connection made to it inherits this.
    let refused = refuse_descriptors && take_descriptors(&sock, false)?;
    // A directory of its own, mode 0700: nobody else can reach the socket until it is renamed.
    let mut private = None;
    for n in 0..100u32 {
        let dir = parent.join(format!(
            ".{}.{}.{n}",
            name.to_string_lossy(),
            std::process::id()
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                private = Some(dir);
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    let private = private.ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!(
                "{}: no private directory could be made beside it",
                path.display()
            ),
        )
    })?;
    let inner = private.join("s");
    let placed = (|| {
        socket::bind(sock.as_raw_fd(), &UnixAddr::new(&inner)?)?;
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(mode))?;
        // rename(2) replaces a stale socket (or a link) at `path` itself, never what a link
        // points to.
        std::fs::rename(&inner, path)
    })();
    let _ = std::fs::remove_file(&inner);
    let _ = std::fs::remove_dir(&private);
    placed?;
    socket::listen(&sock, socket::Backlog::new(8)?)?;
    let tick =
        nix::sys::time::TimeVal::new(tick.as_secs() as i64, i64::from(tick.subsec_micros()) as _);
    socket::setsockopt(&sock, sockopt::ReceiveTimeout, &tick)?;
    Ok((sock, refused))
}

/// The next connection to `listener`, or `None` when the wait timed out or was interrupted.
///
/// # Errors
/// Accepting failed otherwise.
pub fn accept(listener: &OwnedFd) -> std::io::Result<Option<OwnedFd>> {
    match socket::accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
        // SAFETY: accept4 just returned this descriptor; nothing else owns it.
        Ok(fd) => Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) })),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Makes a read on `conn` give up after `deadline` (None: wait as long as it takes).
///
/// # Errors
/// The kernel refused the option.
pub fn set_read_deadline(
    conn: &OwnedFd,
    deadline: Option<std::time::Duration>,
) -> std::io::Result<()> {
    let d = deadline.unwrap_or_default();
    let tv = nix::sys::time::TimeVal::new(d.as_secs() as i64, i64::from(d.subsec_micros()) as _);
    socket::setsockopt(conn, sockopt::ReceiveTimeout, &tv)?;
    Ok(())
}

/// This process's effective user id.
pub fn effective_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// The process id and user id of the process at the other end of `conn`.
///
/// # Errors
/// The kernel gave no credentials.
pub fn peer(conn: &OwnedFd) -> std::io::Result<(u32, u32)> {
    let c = socket::getsockopt(conn, sockopt::PeerCredentials)?;
    Ok((c.pid() as u32, c.uid()))
}

/// A descriptor of the process at the other end of `conn` (a pidfd: it names that process
/// and no other, even once its pid is reused), to see whether it has ended
/// ([`process_ended`]).
///
/// # Errors
/// The kernel gave no credentials, or has no pidfds (before 5.3).
pub fn peer_pidfd(conn: &OwnedFd) -> std::io::Result<OwnedFd> {
    const SO_PEERPIDFD: libc::c_int = 77;
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt on a socket this caller owns; `fd` and `len` are valid for the write.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 && fd >= 0 {
        // SAFETY: the kernel just installed this descriptor for us; nothing else owns it.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    // Before 6.5: the pid the connection was made by, while the connection holds it alive.
    let (pid, _) = peer(conn)?;
    // SAFETY: pidfd_open(2) with a pid and no flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above: a fresh descriptor of ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether the process `pidfd` names has ended (its pidfd polls readable).
pub fn process_ended(pidfd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the call's duration, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}

/// Sends `SIGKILL` to the process `pidfd` names (`pidfd_send_signal(2)`: never to another
/// process that reused its pid).
///
/// # Errors
/// This process may not signal it (another user's), or it has ended.
pub fn kill_process(pidfd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: pidfd_send_signal(2) on a pidfd the caller owns, with no siginfo and no flags;
    // the result is checked.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A fresh unix `SOCK_SEQPACKET` socket (close-on-exec).
fn seqpacket() -> std::io::Result<OwnedFd> {
    Ok(socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?)
}

/// A connection to the grant socket at `path`, before anything is said on it (the broker
/// expects `hello` first; [`GrantClient::connect_at`](crate::GrantClient::connect_at) says it).
///
/// # Errors
/// The socket could not be made or nobody listens at `path`.
pub fn open_connection(path: &Path) -> std::io::Result<OwnedFd> {
    let sock = seqpacket()?;
    let addr = UnixAddr::new(path)?;
    socket::connect(sock.as_raw_fd(), &addr)?;
    Ok(sock)
}
