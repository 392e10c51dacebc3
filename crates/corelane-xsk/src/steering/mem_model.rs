//! The steering decision of `crates/corelane-xsk/xdp/corelane.bpf.c`, in Rust, over the
//! in-memory program's maps: which frames go to a socket (and, for TCP, which connection, so
//! that an upgrade's kept flows find their generation). ARP and NDP for owned addresses,
//! IPv4 (options, fragments) and IPv6 (extension headers, fragments), TCP and UDP to owned
//! ports, ICMP to owned addresses, and for an address shared with the kernel only its owned
//! ports and the ICMP errors quoting them. What the program answers itself (closed ports'
//! resets and port unreachables, SYN cookies) is not steering: here it is "not steered", as
//! a frame the program passes. A differential test (`tests/xdp_model_differential.rs`) holds
//! this to the compiled program under `BPF_PROG_TEST_RUN` on random and crafted frames.
//!
//! VLAN tags are not read: the in-memory program serves untagged frames, and a tagged one is
//! passed (as the program serving no VLAN passes it).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// What the decision reads of the program's maps.
pub(super) trait Owned {
    /// Whether `ip` is owned, and if so whether it is shared with the kernel.
    fn addr(&self, ip: IpAddr) -> Option<bool>;
    /// TCP `port` is steered.
    fn tcp(&self, port: u16) -> bool;
    /// UDP `port` is steered.
    fn udp(&self, port: u16) -> bool;
    /// The program answers bare SYNs to TCP `port` with cookies.
    fn cookies(&self, port: u16) -> bool;
    /// The interface's hardware address (the program answers only frames sent to it).
    fn mac(&self) -> Option<[u8; 6]>;
}

/// What the program does with a frame, as far as steering goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Steer {
    /// Not to a socket (the kernel's, malformed, or answered by the program).
    No,
    /// To the current generation's socket.
    Yes,
    /// A TCP segment from `.0` to local port `.1`: to the generation that keeps the
    /// connection during an upgrade's split, else to the current one.
    Flow(SocketAddr, u16),
}

fn be16(f: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([f[at], f[at + 1]])
}

fn v4(b: &[u8]) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
}

fn v6(b: &[u8]) -> IpAddr {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[..16]);
    IpAddr::V6(Ipv6Addr::from(a))
}

/// Where `f` goes, by the maps in `o`.
pub(super) fn steer(o: &dyn Owned, f: &[u8]) -> Steer {
    if f.len() < 14 {
        return Steer::No;
    }
    match be16(f, 12) {
        0x0806 => arp(o, f),
        0x0800 => ipv4(o, f),
        0x86dd => ipv6(o, f),
        _ => Steer::No,
    }
}

fn yes(b: bool) -> Steer {
    if b { Steer::Yes } else { Steer::No }
}

fn arp(o: &dyn Owned, f: &[u8]) -> Steer {
    if f.len() < 14 + 28 {
        return Steer::No;
    }
    let a = &f[14..];
    if be16(a, 0) != 1 || be16(a, 2) != 0x0800 || a[4] != 6 || a[5] != 4 {
        return Steer::No;
    }
    // Only the stack's own addresses: a shared address's ARP is the kernel's.
    yes(o.addr(v4(&a[24..28])) == Some(false))
}

fn ipv4(o: &dyn Owned, f: &[u8]) -> Steer {
    let n = f.len();
    if n < 34 {
        return Steer::No;
    }
    let ihl = usize::from(f[14] & 0x0f);
    if f[14] >> 4 != 4 || ihl < 5 {
        return Steer::No;
    }
    let Some(shared) = o.addr(v4(&f[30..34])) else {
        return Steer::No;
    };
    // A fragment: the stack reassembles it, unless the address is the kernel's too.
    if be16(f, 20) & 0x3fff != 0 {
        return yes(!shared);
    }
    let l4 = 14 + ihl * 4;
    if l4 > n {
        return Steer::No;
    }
    let proto = f[23];
    let src = v4(&f[26..30]);
    if shared {
        return to_shared(o, f, proto, l4, src, true);
    }
    if ihl == 5 && proto == 17 {
        return yes(n >= l4 + 8 && o.udp(be16(f, l4 + 2)));
    }
    if ihl == 5 && proto == 6 {
        return tcp(o, f, l4, src);
    }
    beyond(o, f, proto, l4, src)
}

/// A TCP segment at `l4` to an owned port: the stack's, unless the program answers it with a
/// cookie.
fn tcp(o: &dyn Owned, f: &[u8], l4: usize, src: IpAddr) -> Steer {
    if f.len() < l4 + 20 {
        return Steer::No;
    }
    let port = be16(f, l4 + 2);
    if !o.tcp(port) || cookie_answered(o, f, l4) {
        return Steer::No;
    }
    Steer::Flow(SocketAddr::new(src, be16(f, l4)), port)
}

/// What follows an IPv4 header with options, or an IPv6 header whose next header is not TCP,
/// UDP or ICMPv6: ICMP and fragments are the stack's, TCP and UDP by port.
fn beyond(o: &dyn Owned, f: &[u8], proto: u8, l4: usize, src: IpAddr) -> Steer {
    let n = f.len();
    match proto {
        1 | 58 | 44 => Steer::Yes,
        6 if n >= l4 + 20 && o.tcp(be16(f, l4 + 2)) => {
            Steer::Flow(SocketAddr::new(src, be16(f, l4)), be16(f, l4 + 2))
        }
        17 => yes(n >= l4 + 8 && o.udp(be16(f, l4 + 2))),
        _ => Steer::No,
    }
}

/// A frame to an address the kernel holds too: the stack's ports, and the ICMP errors
/// quoting a segment or datagram sent from one.
fn to_shared(o: &dyn Owned, f: &[u8], proto: u8, l4: usize, src: IpAddr, is_v4: bool) -> Steer {
    let n = f.len();
    match proto {
        6 => tcp(o, f, l4, src),
        17 => yes(n >= l4 + 8 && o.udp(be16(f, l4 + 2))),
        1 if is_v4 => icmp_error_about_ours(o, f, l4, true),
        58 if !is_v4 => icmp_error_about_ours(o, f, l4, false),
        _ => Steer::No,
    }
}

fn icmp_error_about_ours(o: &dyn Owned, f: &[u8], l4: usize, is_v4: bool) -> Steer {
    let n = f.len();
    if n < l4 + 8 {
        return Steer::No;
    }
    let ty = f[l4];
    let q = l4 + 8;
    let (error, qproto, ports) = if is_v4 {
        if n < q + 20 || f[q] & 0x0f != 5 {
            return Steer::No;
        }
        (ty == 3 || ty == 11, f[q + 9], q + 20)
    } else {
        if n < q + 40 {
            return Steer::No;
        }
        ((1..=3).contains(&ty), f[q + 6], q + 40)
    };
    if !error || n < ports + 4 {
        return Steer::No;
    }
    let sport = be16(f, ports);
    yes(match qproto {
        6 => o.tcp(sport),
        17 => o.udp(sport),
        _ => false,
    })
}

fn ipv6(o: &dyn Owned, f: &[u8]) -> Steer {
    let n = f.len();
    if n < 54 || f[14] >> 4 != 6 {
        return Steer::No;
    }
    let next = f[20];
    let dst = o.addr(v6(&f[38..54]));
    let src = v6(&f[22..38]);
    if next == 58 {
        if n < 62 {
            return Steer::No;
        }
        let ndp = matches!(f[54], 135 | 136);
        if !ndp {
            return match dst {
                Some(true) => icmp_error_about_ours(o, f, 54, false),
                Some(false) => Steer::Yes,
                None => Steer::No,
            };
        }
        // Neighbour discovery for one of the stack's own addresses (a shared one's is the
        // kernel's), by its target or its destination.
        return yes(n >= 78 && (o.addr(v6(&f[62..78])) == Some(false) || dst == Some(false)));
    }
    match dst {
        None => Steer::No,
        Some(true) => match next {
            6 | 17 => to_shared(o, f, next, 54, src, false),
            _ => Steer::No,
        },
        Some(false) => match next {
            6 => tcp(o, f, 54, src),
            17 => yes(n >= 62 && o.udp(be16(f, 56))),
            _ => beyond(o, f, next, 54, src),
        },
    }
}

/// Whether the program answers the TCP segment at `l4` with a SYN cookie: a bare SYN to a
/// port with cookies on, in an IPv4 header without options or an IPv6 one, sent to the
/// interface's address from a unicast one and from a source an answer may go to.
fn cookie_answered(o: &dyn Owned, f: &[u8], l4: usize) -> bool {
    let Some(mac) = o.mac() else {
        return false;
    };
    let v6 = f[14] >> 4 == 6;
    let flags = f[l4 + 13];
    let bare_syn = flags & 0x02 != 0 && flags & (0x10 | 0x04 | 0x01) == 0;
    let doff = usize::from(f[l4 + 12] >> 4) * 4;
    let bad_source = if v6 {
        let s = &f[22..38];
        s[0] == 0xff || s == [0; 16]
    } else {
        let s = &f[26..30];
        s == [0; 4] || s == [255; 4] || s[0] & 0xf0 == 0xe0
    };
    bare_syn
        && (v6 || l4 == 34)
        && o.cookies(be16(f, l4 + 2))
        && f[6] & 1 == 0
        && f[..6] == mac
        && doff >= 20
        && !bad_source
}
