//! The kernel's routes and addresses on an interface, read over rtnetlink: the routes a
//! corelane host on that interface should use when the application gives none, and the
//! addresses it must not take (the kernel answers for them already).

use std::fmt;
use std::net::IpAddr;

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::{Socket, SocketAddr};

use crate::error::Error;
use crate::netdev::check_interface;

/// A unicast route of the kernel's main table whose way out is a given interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelRoute {
    /// The destination prefix's address (`0.0.0.0` or `::` for a default route).
    pub dst: IpAddr,
    /// The destination prefix's length.
    pub prefix: u8,
    /// The gateway, or None for a destination on the link itself.
    pub via: Option<IpAddr>,
    /// The route's metric (lower wins among equal prefixes).
    pub metric: u32,
}

impl KernelRoute {
    /// True for a default route (prefix length 0).
    pub fn is_default(&self) -> bool {
        self.prefix == 0
    }
}

impl fmt::Display for KernelRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_default() {
            f.write_str("default")?;
        } else {
            write!(f, "{}/{}", self.dst, self.prefix)?;
        }
        match self.via {
            Some(g) => write!(f, " via {g}"),
            None => f.write_str(" on-link"),
        }
    }
}

/// The unicast routes (IPv4 and IPv6) of the kernel's main table that leave through `ifname`,
/// in the kernel's order. Link-local and multicast prefixes are left out.
///
/// ```no_run
/// for r in corelane_xsk::kernel_routes("eth0")? {
///     println!("{r}");
/// }
/// # Ok::<(), corelane_xsk::Error>(())
/// ```
///
/// # Errors
/// No such interface, or the netlink socket failed (a process without a network namespace
/// it may read, say).
pub fn kernel_routes(ifname: &str) -> Result<Vec<KernelRoute>, Error> {
    let index = check_interface(ifname)?;
    let mut routes = Vec::new();
    for msg in dump(RouteNetlinkMessage::GetRoute(RouteMessage::default()))? {
        if let RouteNetlinkMessage::NewRoute(m) = msg
            && let Some(r) = route_of(&m, index)
        {
            routes.push(r);
        }
    }
    Ok(routes)
}

/// The addresses the kernel holds on `ifname` (as `ip addr show dev IF` lists them).
///
/// # Errors
/// No such interface, or the netlink socket failed.
pub fn kernel_addrs(ifname: &str) -> Result<Vec<IpAddr>, Error> {
    Ok(kernel_addrs_with_prefix(ifname)?
        .into_iter()
        .map(|(a, _)| a)
        .collect())
}

/// The addresses the kernel holds on `ifname` with their prefix lengths (`ip addr show dev IF`'s
/// `ADDR/PREFIX`).
///
/// # Errors
/// No such interface, or the netlink socket failed.
pub fn kernel_addrs_with_prefix(ifname: &str) -> Result<Vec<(IpAddr, u8)>, Error> {
    let index = check_interface(ifname)?;
    Ok(addrs_of(Some(index))?
        .into_iter()
        .map(|(ip, prefix, _)| (ip, prefix))
        .collect())
}

/// Every address the kernel holds in this network namespace, with its prefix length and the
/// name of the interface that holds it. The kernel answers for all of them on every interface
/// (ARP, and TCP to any of its addresses: Linux is a weak host), so an address it holds on
/// another interface (a VLAN device over the one corelane serves, a loopback) is its own there
/// too.
///
/// # Errors
/// The netlink socket failed.
pub fn kernel_addrs_anywhere() -> Result<Vec<(IpAddr, u8, String)>, Error> {
    let names = interface_names();
    Ok(addrs_of(None)?
        .into_iter()
        .map(|(ip, prefix, index)| {
            let name = names
                .iter()
                .find(|(i, _)| *i == index)
                .map_or_else(|| format!("interface {index}"), |(_, n)| n.clone());
            (ip, prefix, name)
        })
        .collect())
}

/// (index, name) of every interface of this namespace, from /sys/class/net.
fn interface_names() -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/sys/class/net") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let index = std::fs::read_to_string(e.path().join("ifindex")).ok()?;
            Some((index.trim().parse().ok()?, name))
        })
        .collect()
}

/// The addresses the kernel holds on interface `index` (every interface: None), with prefix
/// length and interface index.
fn addrs_of(index: Option<u32>) -> Result<Vec<(IpAddr, u8, u32)>, Error> {
    let mut addrs = Vec::new();
    for msg in dump(RouteNetlinkMessage::GetAddress(AddressMessage::default()))? {
        let RouteNetlinkMessage::NewAddress(m) = msg else {
            continue;
        };
        if index.is_some_and(|i| m.header.index != i) {
            continue;
        }
        // IPv4 names the local address in Local; IPv6 in Address.
        let local = m.attributes.iter().find_map(|a| match a {
            AddressAttribute::Local(ip) => Some(*ip),
            _ => None,
        });
        let any = m.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        });
        if let Some(ip) = local.or(any) {
            addrs.push((ip, m.header.prefix_len, m.header.index));
        }
    }
    Ok(addrs)
}

fn netlink_err(what: &str, e: impl fmt::Display) -> Error {
    Error::Io(std::io::Error::other(format!(
        "reading the kernel's routes over netlink: {what}: {e}"
    )))
}

/// Notice of the kernel's route changes (a route added or removed by `ip route`, a router
/// advertisement, a DHCP client, an interface going down), as rtnetlink's route groups carry
/// them; the caller reads the routes again ([`kernel_routes`]) after one.
#[derive(Debug)]
pub struct RouteWatch {
    socket: Socket,
    index: u32,
}

/// rtnetlink's multicast groups of IPv4 and IPv6 route changes.
const RTMGRP_IPV4_ROUTE: u32 = 0x40;
const RTMGRP_IPV6_ROUTE: u32 = 0x400;

impl RouteWatch {
    /// Starts listening for changes of routes out of `ifname`, in the calling thread's network
    /// namespace.
    ///
    /// # Errors
    /// No such interface, or the netlink socket failed.
    pub fn open(ifname: &str) -> Result<RouteWatch, Error> {
        let index = check_interface(ifname)?;
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(|e| netlink_err("socket", e))?;
        socket
            .bind(&SocketAddr::new(0, RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE))
            .map_err(|e| netlink_err("bind to the route groups", e))?;
        socket
            .set_non_blocking(true)
            .map_err(|e| netlink_err("non-blocking", e))?;
        Ok(RouteWatch { socket, index })
    }

    /// Waits up to `timeout` for changes; true when a route out of the interface was added or
    /// removed (every notice that arrived is read). A notice lost to a full socket buffer
    /// counts as a change.
    pub fn changed(&mut self, timeout: std::time::Duration) -> bool {
        use std::os::fd::AsFd;
        if !crate::sys::wait_readable(self.socket.as_fd(), timeout) {
            return false;
        }
        let mut changed = false;
        let mut rx = vec![0u8; 64 * 1024];
        loop {
            let size = match self.socket.recv(&mut &mut rx[..], 0) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return changed,
                // ENOBUFS: notices were dropped; read the routes again to be sure.
                Err(_) => return true,
            };
            let mut offset = 0;
            while offset < size {
                let Ok(msg) = <NetlinkMessage<RouteNetlinkMessage>>::deserialize(&rx[offset..size])
                else {
                    return true;
                };
                let len = msg.header.length as usize;
                if let NetlinkPayload::InnerMessage(
                    RouteNetlinkMessage::NewRoute(m) | RouteNetlinkMessage::DelRoute(m),
                ) = &msg.payload
                {
                    let oif = m.attributes.iter().find_map(|a| match a {
                        RouteAttribute::Oif(i) => Some(*i),
                        _ => None,
                    });
                    changed |= oif == Some(self.index);
                }
                if len == 0 {
                    break;
                }
                offset += len;
            }
        }
    }
}

/// What the kernel answers a dump request `request` with.
fn dump(request: RouteNetlinkMessage) -> Result<Vec<RouteNetlinkMessage>, Error> {
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(|e| netlink_err("socket", e))?;
    socket.bind_auto().map_err(|e| netlink_err("bind", e))?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(|e| netlink_err("connect", e))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = 1;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(request));
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf[..]);
    socket.send(&buf, 0).map_err(|e| netlink_err("send", e))?;
    let mut out = Vec::new();
    let mut rx = vec![0u8; 64 * 1024];
    loop {
        let size = socket
            .recv(&mut &mut rx[..], 0)
            .map_err(|e| netlink_err("recv", e))?;
        let mut offset = 0;
        while offset < size {
            let msg = <NetlinkMessage<RouteNetlinkMessage>>::deserialize(&rx[offset..size])
                .map_err(|e| netlink_err("a malformed answer", e))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(out),
                NetlinkPayload::Error(e) => return Err(netlink_err("the kernel refused", e)),
                NetlinkPayload::InnerMessage(m) => out.push(m),
                _ => {}
            }
            if len == 0 {
                break;
            }
            offset += len;
        }
    }
}

/// The route `msg` describes, if it is a unicast route of the main table out of interface
/// `index`.
fn route_of(msg: &RouteMessage, index: u32) -> Option<KernelRoute> {
    let h = &msg.header;
    if h.kind != RouteType::Unicast || h.table != RouteHeader::RT_TABLE_MAIN {
        return None;
    }
    let mut dst = None;
    let mut via = None;
    let mut oif = None;
    let mut metric = 0;
    for a in &msg.attributes {
        match a {
            RouteAttribute::Destination(d) => dst = ip_of(d),
            RouteAttribute::Gateway(g) => via = ip_of(g),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Priority(p) => metric = *p,
            _ => {}
        }
    }
    if oif != Some(index) {
        return None;
    }
    let dst = match (dst, h.address_family) {
        (Some(d), _) => d,
        (None, AddressFamily::Inet) => IpAddr::from([0u8; 4]),
        (None, AddressFamily::Inet6) => IpAddr::from([0u8; 16]),
        _ => return None,
    };
    let skip = match dst {
        IpAddr::V4(a) => a.is_multicast() || a.is_link_local(),
        IpAddr::V6(a) => a.is_multicast() || a.is_unicast_link_local(),
    };
    if skip {
        return None;
    }
    Some(KernelRoute {
        dst,
        prefix: h.destination_prefix_length,
        via,
        metric,
    })
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v) => Some(IpAddr::V4(*v)),
        RouteAddress::Inet6(v) => Some(IpAddr::V6(*v)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_print_like_ip_route() -> Result<(), std::net::AddrParseError> {
        let r = KernelRoute {
            dst: "0.0.0.0".parse()?,
            prefix: 0,
            via: Some("10.1.0.1".parse()?),
            metric: 0,
        };
        assert_eq!(r.to_string(), "default via 10.1.0.1");
        let r = KernelRoute {
            dst: "fd00:2::".parse()?,
            prefix: 64,
            via: None,
            metric: 256,
        };
        assert_eq!(r.to_string(), "fd00:2::/64 on-link");
        Ok(())
    }

    #[test]
    fn the_loopback_holds_its_addresses() -> Result<(), Error> {
        let lo = kernel_addrs("lo")?;
        assert!(lo.contains(&IpAddr::from([127, 0, 0, 1])), "{lo:?}");
        Ok(())
    }

    #[test]
    fn the_loopback_has_no_unicast_route_of_the_main_table() -> Result<(), Error> {
        // lo's routes live in the local table; an unknown interface is an error that names it.
        assert!(kernel_routes("lo")?.iter().all(|r| !r.is_default()));
        match kernel_routes("no-such-if0") {
            Err(Error::NoInterface(n)) => assert_eq!(n, "no-such-if0"),
            other => panic!("expected NoInterface, got {other:?}"),
        }
        Ok(())
    }
}
