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

use std::fs::File;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::sys::socket::{self, sockopt};

use corelane_frame::Proto;

use crate::error::Error;
use crate::program::{AttachedMode, XdpCounters};
use crate::vlan::Vlan;

/// Where the broker for `ifname` listens, in the calling thread's network namespace.
pub fn grant_socket_path(ifname: &str) -> std::io::Result<PathBuf> {
    Ok(crate::claim::iface_dir(ifname)?.join("grant"))
}

pub use crate::unixsock::{
    MAX_MESSAGE, accept, effective_uid, kill_process, listen_at, listen_refusing, open_connection,
    peer, peer_pidfd, process_ended, recv_message, send_message, set_read_deadline,
    take_descriptors,
};

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

    /// [`request`](Self::request) for `r`, written as the protocol spells it.
    pub(crate) fn ask(&self, r: &Request, fd: Option<RawFd>) -> Result<String, Error> {
        self.request(&r.to_text(), fd)
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
        self.ask(
            &Request::Addr {
                addr,
                shared: false,
            },
            None,
        )
        .map(drop)
    }

    /// Asks the broker to steer `addr`'s owned ports to this server, the kernel keeping the
    /// rest of the address.
    pub(crate) fn own_shared_addr(&self, addr: IpAddr) -> Result<(), Error> {
        self.ask(&Request::Addr { addr, shared: true }, None)
            .map(drop)
    }

    /// What the broker's program noted of a shared address's neighbour `ip`, if anything.
    pub(crate) fn neighbour(&self, ip: IpAddr) -> Option<[u8; 6]> {
        let reply = self.ask(&Request::Neigh(ip), None).ok()?;
        parse_mac(&reply)
    }

    /// Asks the broker to stop steering `addr`.
    pub(crate) fn disown_addr(&self, addr: IpAddr) -> Result<(), Error> {
        self.ask(&Request::Unaddr(addr), None).map(drop)
    }

    /// Asks the broker to steer `proto` port `port` (`on`) or stop (`!on`).
    pub(crate) fn port(&self, proto: Proto, port: u16, on: bool) -> Result<(), Error> {
        self.ask(&Request::Port { proto, port, on }, None).map(drop)
    }

    /// Hands the broker the AF_XDP socket `fd` for `queue`.
    pub(crate) fn register(&self, queue: u32, fd: RawFd) -> Result<(), Error> {
        self.ask(
            &Request::Queue {
                queue,
                generation: None,
            },
            Some(fd),
        )
        .map(drop)
    }

    /// Asks the broker to give the interface `need` receive queues.
    pub fn set_rx_queues(&self, need: u32) -> Result<(), Error> {
        self.ask(&Request::Channels(need), None).map(drop)
    }

    /// The program's counters, from the broker.
    pub(crate) fn counters(&self) -> Result<XdpCounters, Error> {
        let text = self.ask(&Request::Counters, None)?;
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
        match self.exchange(&Request::Stats(bytes).to_text(), None)? {
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
        match self.exchange(&Request::Vlan.to_text(), None) {
            Ok((text, _)) => Vlan::from_wire(&text)
                .ok_or_else(|| Error::Grant(format!("malformed VLAN from the broker: {text}"))),
            Err(Error::Grant(e)) if e.contains("unknown request") => Ok(Vlan::default()),
            Err(e) => Err(e),
        }
    }

    /// This server's user's restart key (`StackConfig::restart_key`), which the broker keeps
    /// in the run directory, root's alone, one per user.
    ///
    /// # Errors
    /// The broker refused (or is older than the request), or its answer is not a key.
    pub fn restart_key(&self) -> Result<[u64; 2], Error> {
        let (text, _) = self.exchange(&Request::RestartKey.to_text(), None)?;
        let half = |r: std::ops::Range<usize>| {
            text.get(r)
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    Error::Grant(format!("malformed restart key from the broker: {text}"))
                })
        };
        if text.len() != 32 {
            return Err(Error::Grant(format!(
                "malformed restart key from the broker: {text}"
            )));
        }
        Ok([half(0..16)?, half(16..32)?])
    }

    /// The packet capture file the broker made for this server beside its stats file, `bytes`
    /// long (sealed as the stats file is), opened for reading and writing, and the path of its
    /// pointer.
    ///
    /// # Errors
    /// The broker refused (a size past its cap) or sent no descriptor.
    pub fn capture_file(&self, bytes: u64) -> Result<(File, PathBuf), Error> {
        match self.exchange(&Request::Capture(bytes).to_text(), None)? {
            (path, Some(fd)) => Ok((File::from(fd), PathBuf::from(path))),
            (_, None) => Err(Error::Grant(
                "the broker sent no descriptor with the capture file".into(),
            )),
        }
    }
}

pub use crate::grant_words::{Request, proto_name};

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
