//! Ports of a shared address: one the kernel holds too, where corelane serves only the ports it
//! owns and the kernel keeps the rest (its ARP and NDP, ping, ssh, its own connections).
//!
//! For each TCP or UDP port corelane steers on a shared address, a kernel socket of the same
//! protocol is bound to that address and port and held (a placeholder): the kernel then hands
//! the port to none of its own sockets, neither to a `bind` (a kernel server started later gets
//! `EADDRINUSE`) nor as an ephemeral port for a connection of its own, so corelane's frames and
//! the kernel's never share a port. A placeholder never listens and never receives: the
//! steering program takes its frames first. It is an open descriptor of this process, so the
//! kernel gives the port back when the process ends in any way, a `SIGKILL` included: nothing
//! is left to clean up. Placeholders allow `SO_REUSEPORT` among themselves, so that the new
//! process of an upgrade binds the ports the old one still holds.
//!
//! When the kernel already has a socket on the port (a listener, a connection that took it as
//! its ephemeral port), the bind fails and the error names the socket's process and the fix.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;

use corelane_frame::Proto;
use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6, bind, setsockopt, socket, sockopt,
};

use crate::error::Error;

/// The shared addresses of a [`Steering`](crate::Steering) and the placeholders held for its
/// ports on them.
#[derive(Debug, Default)]
pub(crate) struct SharedPorts {
    /// Shared addresses whose ports this process holds.
    addrs: Vec<IpAddr>,
    /// Shared addresses whose ports another process holds (a grant's broker).
    elsewhere: Vec<IpAddr>,
    /// Each port's placeholders, one per shared address it is held on.
    held: HashMap<(Proto, u16), Vec<(IpAddr, OwnedFd)>>,
}

impl SharedPorts {
    /// True when some address is shared.
    pub(crate) fn any(&self) -> bool {
        !self.addrs.is_empty() || !self.elsewhere.is_empty()
    }

    /// True when `addr` is shared.
    pub(crate) fn is_shared(&self, addr: IpAddr) -> bool {
        self.addrs.contains(&addr) || self.elsewhere.contains(&addr)
    }

    /// Shares `addr`, its ports held by another process (a grant's broker).
    pub(crate) fn add_elsewhere(&mut self, addr: IpAddr) {
        if !self.is_shared(addr) {
            self.elsewhere.push(addr);
        }
    }

    /// Shares `addr`: the `owned` ports get their placeholders on it at once.
    pub(crate) fn add(
        &mut self,
        addr: IpAddr,
        owned: impl Iterator<Item = (Proto, u16)>,
    ) -> Result<(), Error> {
        if self.is_shared(addr) {
            return Ok(());
        }
        let mut got = Vec::new();
        for (proto, port) in owned {
            got.push(((proto, port), hold(&[addr], proto, port)?));
        }
        for (k, fds) in got {
            self.held.entry(k).or_default().extend(fds);
        }
        self.addrs.push(addr);
        Ok(())
    }

    /// Stops sharing `addr`: its placeholders go now, so that sharing and unsharing an address
    /// again and again holds no more descriptors than once.
    pub(crate) fn remove(&mut self, addr: IpAddr) {
        self.addrs.retain(|a| *a != addr);
        self.elsewhere.retain(|a| *a != addr);
        for fds in self.held.values_mut() {
            fds.retain(|(a, _)| *a != addr);
        }
        self.held.retain(|_, fds| !fds.is_empty());
    }

    /// Placeholders held, over every port and address.
    #[cfg(test)]
    pub(crate) fn placeholders(&self) -> usize {
        self.held.values().map(Vec::len).sum()
    }

    /// Holds `proto` `port` on every shared address (nothing without one).
    pub(crate) fn hold(&mut self, proto: Proto, port: u16) -> Result<(), Error> {
        if self.addrs.is_empty() {
            return Ok(());
        }
        let fds = hold(&self.addrs, proto, port)?;
        self.held.insert((proto, port), fds);
        Ok(())
    }

    /// Gives `proto` `port` back to the kernel.
    pub(crate) fn release(&mut self, proto: Proto, port: u16) {
        self.held.remove(&(proto, port));
    }
}

/// Binds a placeholder for `proto` `port` on each address of `addrs`; all or none.
pub(crate) fn hold(
    addrs: &[IpAddr],
    proto: Proto,
    port: u16,
) -> Result<Vec<(IpAddr, OwnedFd)>, Error> {
    addrs
        .iter()
        .map(|&a| hold_one(SocketAddr::new(a, port), proto).map(|fd| (a, fd)))
        .collect()
}

fn hold_one(at: SocketAddr, proto: Proto) -> Result<OwnedFd, Error> {
    let family = match at {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let kind = match proto {
        Proto::Tcp => SockType::Stream,
        Proto::Udp => SockType::Datagram,
    };
    let os = |what: &str, e: Errno| Error::Io(std::io::Error::other(format!("{what}: {e}")));
    let make = || socket(family, kind, SockFlag::SOCK_CLOEXEC, None);
    // Each port held takes a descriptor per shared address: past the soft limit, it is raised
    // to the hard one (as a server that holds many sockets does), and past that, said.
    let fd = match make() {
        Err(Errno::EMFILE) => {
            let (soft, hard) = crate::sys::raise_nofile();
            make().map_err(|e| match e {
                Errno::EMFILE => Error::Config(format!(
                    "holding {} port {} of {} (shared with the kernel) needs one more \
                     descriptor, and this process has its limit's {soft} open (hard limit \
                     {hard}): each port held on a shared address takes one per address; raise \
                     the limit (`ulimit -n`, systemd's LimitNOFILE=) or hold fewer ports",
                    name(proto),
                    at.port(),
                    at.ip()
                )),
                e => os("a placeholder socket", e),
            })?
        }
        other => other.map_err(|e| os("a placeholder socket", e))?,
    };
    setsockopt(&fd, sockopt::ReusePort, &true).map_err(|e| os("SO_REUSEPORT", e))?;
    let bound = match at {
        SocketAddr::V4(a) => bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn::from(a)),
        SocketAddr::V6(a) => {
            setsockopt(&fd, sockopt::Ipv6V6Only, &true).map_err(|e| os("IPV6_V6ONLY", e))?;
            bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn6::from(a))
        }
    };
    match bound {
        Ok(()) => Ok(fd),
        Err(Errno::EADDRINUSE) => Err(Error::KernelPort(held_by(at, proto))),
        Err(Errno::EACCES) => Err(Error::Privilege(format!(
            "holding {} port {} of {} (shared with the kernel) needs CAP_NET_BIND_SERVICE, as \
             a kernel server's bind would; keep that capability or serve a port from \
             net.ipv4.ip_unprivileged_port_start up",
            name(proto),
            at.port(),
            at.ip()
        ))),
        Err(Errno::EADDRNOTAVAIL) => Err(Error::Config(format!(
            "{} is not the kernel's address (any more): a shared address must be one the kernel \
             holds (ip addr show)",
            at.ip()
        ))),
        Err(e) => Err(os(&format!("binding a placeholder to {at}"), e)),
    }
}

fn name(proto: Proto) -> &'static str {
    match proto {
        Proto::Tcp => "TCP",
        Proto::Udp => "UDP",
    }
}

/// The message for a port the kernel holds: which of its sockets, whose, and what to do.
pub(crate) fn held_by(at: SocketAddr, proto: Proto) -> String {
    let mut holders = kernel_sockets(proto, at.port())
        .into_iter()
        .filter(|s| s.local.ip().is_unspecified() || s.local.ip() == at.ip())
        .collect::<Vec<_>>();
    // A listener says it all; the connections it accepted only repeat it.
    if holders.iter().any(|s| s.listening) {
        holders.retain(|s| s.listening);
    }
    let mut msg = format!(
        "{} port {} of {} is the kernel's: ",
        name(proto),
        at.port(),
        at.ip()
    );
    if holders.is_empty() {
        msg.push_str("a kernel socket holds it");
    }
    for (i, s) in holders.iter().take(3).enumerate() {
        if i > 0 {
            msg.push_str(", ");
        }
        let _ = write!(msg, "{} {} {}", s.owner(), s.what(proto), s.local);
    }
    let _ = write!(
        msg,
        "; corelane and the kernel cannot split one port's traffic: stop that socket or serve \
         another port (ss -{}anp 'sport = :{}' lists them)",
        if proto == Proto::Tcp { "t" } else { "u" },
        at.port()
    );
    msg
}

/// One socket of the kernel's tables (`/proc/net/tcp` and the like).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KernelSocket {
    pub(crate) local: SocketAddr,
    pub(crate) listening: bool,
    pub(crate) inode: u64,
}

impl KernelSocket {
    fn what(&self, proto: Proto) -> &'static str {
        match (proto, self.listening) {
            (Proto::Tcp, true) => "listens on",
            (Proto::Tcp, false) => "has a connection from",
            (Proto::Udp, _) => "is bound to",
        }
    }

    /// "name (pid N)" of a process holding the socket, or "a kernel socket" when no process
    /// can be named (reading another process's descriptors takes privileges a running server
    /// has dropped; `ss -p` names it).
    fn owner(&self) -> String {
        owner_of(self.inode).unwrap_or_else(|| "a kernel socket".to_string())
    }
}

/// The kernel's sockets of `proto` on local port `port`, both families.
pub(crate) fn kernel_sockets(proto: Proto, port: u16) -> Vec<KernelSocket> {
    let files: &[&str] = match proto {
        Proto::Tcp => &["/proc/net/tcp", "/proc/net/tcp6"],
        Proto::Udp => &["/proc/net/udp", "/proc/net/udp6"],
    };
    files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| parse_table(&t, proto))
        .filter(|s| s.local.port() == port)
        .collect()
}

/// The sockets of one `/proc/net/{tcp,udp}{,6}` table.
pub(crate) fn parse_table(text: &str, proto: Proto) -> Vec<KernelSocket> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local = parse_addr(f.get(1)?)?;
            let state = u8::from_str_radix(f.get(3)?, 16).ok()?;
            let inode = f.get(9)?.parse().ok()?;
            Some(KernelSocket {
                local,
                listening: proto == Proto::Tcp && state == 0x0a,
                inode,
            })
        })
        .collect()
}

/// "0100007F:1F90" (IPv4, the address's 32-bit word in native order) or 32 hex digits
/// (IPv6, four such words) and a port in hex.
fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (a, p) = s.split_once(':')?;
    let port = u16::from_str_radix(p, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(a.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    let ip = match a.len() {
        8 => IpAddr::from(word(0)?),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::from(b)
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// "name (pid N)" of the first process with a descriptor for socket `inode`.
fn owner_of(inode: u64) -> Option<String> {
    if inode == 0 {
        return None;
    }
    let want = format!("socket:[{inode}]");
    for p in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()) {
                let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
                return Some(format!("{} (pid {pid})", comm.trim()));
            }
        }
    }
    None
}

#[cfg(test)]
#[path = "shared_tests.rs"]
mod tests;
