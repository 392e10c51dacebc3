//! A grant: the XDP program attached by a privileged broker (`corelane-broker grant`), and a server
//! that steers through it with no privilege but `CAP_NET_RAW`.
//!
//! The broker attaches the program, holds its maps and the interface's claim, and listens on a
//! Unix socket (`SOCK_SEQPACKET`) at `/run/corelane/net-COOKIE/IFNAME/grant`. A server connects,
//! and the broker checks its user (`SO_PEERCRED`) against the grant. From then on every change
//! the server wants is a request the broker checks and carries out:
//!
//! | request | reply | checked |
//! |---|---|---|
//! | `hello` | `ok MODE [why native was refused]` | the user |
//! | `hello upgrade`, then `prove` with a marked socket | `ok prove`, then as `hello` | the user is the holder's; the rules of [`crate::peer`] |
//! | `addr IP` / `unaddr IP` | `ok` | IP is granted |
//! | `port tcp\|udp N` / `unport tcp\|udp N` | `ok` | N is in a granted range |
//! | `queue Q` with the AF_XDP socket's descriptor | `ok` | the descriptor is an AF_XDP socket |
//! | `channels N` | `ok` | N within the driver's maximum |
//! | `counters` | `ok STEERED PASSED MALFORMED NO_SOCKET` | |
//! | `stats` | `ok PATH` with the stats file's descriptor | |
//! | `vlan` | `ok VID` or `ok VID SVID`: the 802.1Q VLAN the program serves (0: untagged frames) and the 802.1ad service VLAN around it (QinQ), when there is one | |
//! | `capture` | `ok PATH` with the capture file's descriptor (owned by the server's user, mode 0600) | |
//!
//! Errors are `err MESSAGE`, one line naming what was refused and how to grant it. The server
//! never holds a map descriptor: it cannot steer an address or port it was not granted, only
//! put its own sockets behind the queues. (What it sends is not limited: an AF_XDP socket, like
//! a raw socket, transmits any frame.) When the server's connection closes (it exited or
//! died), the broker stops steering everything the server asked for; the kernel removes the
//! server's sockets from the program's socket map as they close.

#![allow(unsafe_code)] // `OwnedFd::from_raw_fd` on descriptors the kernel just gave us; a pidfd and its poll.

use std::fs::File;
use std::io::{IoSlice, IoSliceMut};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::socket::{
    self, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    UnixAddr, sockopt,
};

use corelane_frame::Proto;

use crate::error::Error;
use crate::program::{AttachedMode, XdpCounters};
use crate::vlan::Vlan;

/// Longest message either side sends.
pub const MAX_MESSAGE: usize = 4096;

/// Where the broker for `ifname` listens, in the calling thread's network namespace.
pub fn grant_socket_path(ifname: &str) -> std::io::Result<PathBuf> {
    Ok(crate::claim::iface_dir(ifname)?.join("grant"))
}

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
    let sock = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
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

/// A connection to the grant socket at `path`, before anything is said on it (the broker
/// expects `hello` first; [`GrantClient::connect_at`] says it).
///
/// # Errors
/// The socket could not be made or nobody listens at `path`.
pub fn open_connection(path: &Path) -> std::io::Result<OwnedFd> {
    let sock = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let addr = UnixAddr::new(path)?;
    socket::connect(sock.as_raw_fd(), &addr)?;
    Ok(sock)
}

#[path = "grant_upgrade.rs"]
mod upgrade;

/// The connection of a server to the broker that holds its interface's XDP program.
#[derive(Debug)]
pub struct GrantClient {
    sock: OwnedFd,
    path: PathBuf,
    mode: AttachedMode,
    fallback_reason: Option<String>,
}

impl GrantClient {
    /// Connects to the broker for `ifname`. `Ok(None)` when no broker serves it (no socket, or
    /// a socket nobody listens on: a broker that died).
    ///
    /// # Errors
    /// A broker is there and refused this process (its user is not granted, or another server
    /// holds the grant), or did not answer.
    pub fn connect(ifname: &str) -> Result<Option<GrantClient>, Error> {
        let path = grant_socket_path(ifname)?;
        Self::connect_at(&path)
    }

    /// Connects to the broker listening at `path`. `Ok(None)` when nobody listens there.
    ///
    /// # Errors
    /// As [`GrantClient::connect`].
    pub fn connect_at(path: &Path) -> Result<Option<GrantClient>, Error> {
        Self::connect_saying(path, "hello", None)
    }

    /// Connects to the broker for `ifname` as the successor of the server it serves (an
    /// upgrade: the broker lets the two steer together until the old one leaves).
    ///
    /// # Errors
    /// No broker serves `ifname`, or it refused this process.
    pub fn connect_successor(ifname: &str) -> Result<GrantClient, Error> {
        let path = grant_socket_path(ifname)?;
        // With the proof that this process holds CAP_NET_RAW here (`crate::peer`).
        let proof = crate::peer::proof_socket().map_err(|e| {
            Error::Privilege(format!(
                "this process cannot mark a socket ({e}), which a successor does to prove it \
                 holds CAP_NET_RAW: start it with the running server's capabilities"
            ))
        })?;
        Self::connect_saying(&path, "hello upgrade", Some(&proof))?.ok_or_else(|| {
            Error::Grant(format!(
                "the old server steers through a corelane-broker grant, and none listens at {}",
                path.display()
            ))
        })
    }

    fn connect_saying(
        path: &Path,
        hello: &str,
        with: Option<&OwnedFd>,
    ) -> Result<Option<GrantClient>, Error> {
        let sock = match open_connection(path) {
            Ok(s) => s,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT) | Some(libc::ECONNREFUSED)
                ) =>
            {
                return Ok(None);
            }
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
                return Err(Error::Privilege(format!(
                    "{} may not be opened by this user; the broker's socket must be writable \
                     (corelane-broker grant makes it so)",
                    path.display()
                )));
            }
            Err(e) => return Err(Error::Io(e)),
        };
        let timeout = nix::sys::time::TimeVal::new(5, 0);
        socket::setsockopt(&sock, sockopt::ReceiveTimeout, &timeout)
            .map_err(std::io::Error::from)?;
        let mut client = GrantClient {
            sock,
            path: path.to_path_buf(),
            mode: AttachedMode::Generic,
            fallback_reason: None,
        };
        let mut hello = client.request(hello, None)?;
        // A successor is asked for its proof once the broker takes descriptors from it.
        if let Some(proof) = with
            && hello == "prove"
        {
            hello = client.request(crate::peer::PROVE, Some(proof.as_raw_fd()))?;
        }
        let (mode, why) = hello.split_once(' ').unwrap_or((hello.as_str(), ""));
        client.mode = match mode {
            "native" => AttachedMode::Native,
            _ => AttachedMode::Generic,
        };
        client.fallback_reason = (!why.is_empty()).then(|| why.to_string());
        Ok(Some(client))
    }

    /// The broker's socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The mode the broker attached the program in.
    pub fn mode(&self) -> AttachedMode {
        self.mode
    }

    /// Why native mode was refused, when the broker fell back to generic mode.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }

    /// Sends `text` (with `fd`) and returns the reply's text after `ok`.
    fn request(&self, text: &str, fd: Option<RawFd>) -> Result<String, Error> {
        self.exchange(text, fd).map(|(reply, _)| reply)
    }

    /// Sends `text` (with `fd`) and returns the reply's text after `ok` and the descriptor
    /// that came with it.
    fn exchange(&self, text: &str, fd: Option<RawFd>) -> Result<(String, Option<OwnedFd>), Error> {
        let gone = |detail: String| {
            Error::Grant(format!(
                "the broker at {} {detail}; is `corelane-broker grant` still running?",
                self.path.display()
            ))
        };
        if let Err(e) = send_message(self.sock.as_raw_fd(), text, fd) {
            // The broker may have refused this process at once, said why and closed: its word
            // is waiting.
            if let Ok(Some((reply, _))) = self.answer()
                && let Some(why) = reply.strip_prefix("err ")
            {
                return Err(Error::Grant(why.to_string()));
            }
            return Err(gone(format!("did not take `{text}`: {e}")));
        }
        let (reply, passed) = match self.answer() {
            Ok(Some(r)) => r,
            Ok(None) => return Err(gone(format!("closed the connection at `{text}`"))),
            Err(e) => return Err(gone(format!("did not answer `{text}`: {e}"))),
        };
        if let Some(rest) = reply.strip_prefix("ok") {
            Ok((rest.trim_start().to_string(), passed))
        } else {
            let why = reply.strip_prefix("err ").unwrap_or(&reply);
            Err(Error::Grant(why.to_string()))
        }
    }

    /// The broker's next message.
    fn answer(&self) -> std::io::Result<Option<(String, Option<OwnedFd>)>> {
        recv_message(self.sock.as_raw_fd())
    }

    /// Asks the broker to steer `addr` to this server.
    pub(crate) fn own_addr(&self, addr: IpAddr) -> Result<(), Error> {
        self.request(&format!("addr {addr}"), None).map(drop)
    }

    /// Asks the broker to steer `addr`'s owned ports to this server, the kernel keeping the
    /// rest of the address.
    pub(crate) fn own_shared_addr(&self, addr: IpAddr) -> Result<(), Error> {
        self.request(&format!("addr {addr} shared"), None).map(drop)
    }

    /// What the broker's program noted of a shared address's neighbour `ip`, if anything.
    pub(crate) fn neighbour(&self, ip: IpAddr) -> Option<[u8; 6]> {
        let reply = self.request(&format!("neigh {ip}"), None).ok()?;
        parse_mac(&reply)
    }

    /// Asks the broker to stop steering `addr`.
    pub(crate) fn disown_addr(&self, addr: IpAddr) -> Result<(), Error> {
        self.request(&format!("unaddr {addr}"), None).map(drop)
    }

    /// Asks the broker to steer `proto` port `port` (`on`) or stop (`!on`).
    pub(crate) fn port(&self, proto: Proto, port: u16, on: bool) -> Result<(), Error> {
        let verb = if on { "port" } else { "unport" };
        self.request(&format!("{verb} {} {port}", proto_name(proto)), None)
            .map(drop)
    }

    /// Hands the broker the AF_XDP socket `fd` for `queue`.
    pub(crate) fn register(&self, queue: u32, fd: RawFd) -> Result<(), Error> {
        self.request(&format!("queue {queue}"), Some(fd)).map(drop)
    }

    /// Asks the broker to give the interface `need` receive queues.
    pub fn set_rx_queues(&self, need: u32) -> Result<(), Error> {
        self.request(&format!("channels {need}"), None).map(drop)
    }

    /// The program's counters, from the broker.
    pub(crate) fn counters(&self) -> Result<XdpCounters, Error> {
        let text = self.request("counters", None)?;
        let v: Vec<u64> = text
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        match v[..] {
            [steered, passed, malformed, no_socket] => Ok(XdpCounters {
                steered,
                passed,
                malformed,
                no_socket,
                ..XdpCounters::default()
            }),
            _ => Err(Error::Grant(format!(
                "malformed counters from the broker: {text}"
            ))),
        }
    }

    /// The stats file the broker made for this server, `bytes` long (a sealed memory file:
    /// it cannot be resized), opened for writing, and the path of its pointer.
    ///
    /// # Errors
    /// The broker refused (a size past its cap) or sent no descriptor.
    pub fn stats_file(&self, bytes: u64) -> Result<(File, PathBuf), Error> {
        match self.exchange(&format!("stats {bytes}"), None)? {
            (path, Some(fd)) => Ok((File::from(fd), PathBuf::from(path))),
            (_, None) => Err(Error::Grant(
                "the broker sent no descriptor with the stats file".into(),
            )),
        }
    }

    /// The VLAN the broker's program serves (untagged frames also from a broker older than the
    /// request).
    ///
    /// # Errors
    /// The broker's connection failed, or its answer is not a VLAN.
    pub fn vlan(&self) -> Result<Vlan, Error> {
        match self.exchange("vlan", None) {
            Ok((text, _)) => Vlan::from_wire(&text)
                .ok_or_else(|| Error::Grant(format!("malformed VLAN from the broker: {text}"))),
            Err(Error::Grant(e)) if e.contains("unknown request") => Ok(Vlan::default()),
            Err(e) => Err(e),
        }
    }

    /// The packet capture file the broker made for this server beside its stats file, `bytes`
    /// long (sealed as the stats file is), opened for reading and writing, and the path of its
    /// pointer.
    ///
    /// # Errors
    /// The broker refused (a size past its cap) or sent no descriptor.
    pub fn capture_file(&self, bytes: u64) -> Result<(File, PathBuf), Error> {
        match self.exchange(&format!("capture {bytes}"), None)? {
            (path, Some(fd)) => Ok((File::from(fd), PathBuf::from(path))),
            (_, None) => Err(Error::Grant(
                "the broker sent no descriptor with the capture file".into(),
            )),
        }
    }
}

/// `tcp` or `udp`, as the protocol spells them.
pub fn proto_name(p: Proto) -> &'static str {
    match p {
        Proto::Tcp => "tcp",
        Proto::Udp => "udp",
    }
}

#[cfg(test)]
#[path = "grant_tests.rs"]
mod tests;

/// "aa:bb:cc:dd:ee:ff" as six bytes (None for anything else, the broker's "none" among them).
fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}
