//! A model of what the XDP program must do with a frame, written from the rules in
//! `crates/corelane-xsk/xdp/corelane.bpf.c`'s comments, and the checks of the answers it builds.

use super::*;

/// A served port's segment finds no socket here (these tests register none): the program
/// answers it as a closed port would, or, where it would not answer, passes it. Either way
/// it counts the missing socket first.
fn no_socket(closed: Expect) -> Expect {
    match closed {
        Expect::Pass => Expect::SteerPass,
        Expect::Reset => Expect::SteerReset,
        Expect::Unreach => Expect::SteerUnreach,
        e => e,
    }
}

/// What the program must do with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Pass,
    Malformed,
    Steer,
    Reset,
    Unreach,
    Cookie,
    /// A served port with no socket: answered as a closed port, or passed when a closed port
    /// would not be answered (a reset, a multicast sender...).
    SteerPass,
    SteerReset,
    SteerUnreach,
}

fn be16(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_be_bytes([b[at], b[at + 1]]))
}

fn owned4(a: &[u8]) -> bool {
    a == SERVER
}

fn owned6(a: &[u8]) -> bool {
    a == SERVER6
}

fn shared4(a: &[u8]) -> bool {
    a == SHARED
}

fn shared6(a: &[u8]) -> bool {
    a == SHARED6
}

/// A frame to a shared address: corelane's ports are steered (found with no socket here, so
/// passed), the rest is the kernel's and is never answered from here. ICMP errors quoting a
/// segment or datagram from an owned port are steered; other ICMP is the kernel's.
fn shared(f: &[u8], proto: u8, l4: usize, v4: bool) -> Expect {
    let n = f.len();
    match proto {
        6 if n < l4 + 20 => Expect::Malformed,
        6 if cookie(f, l4) && (!v4 || f[14] & 0x0f == 5) => Expect::Cookie,
        6 if tcp_served(be16(f, l4 + 2)) => Expect::Steer,
        17 if n < l4 + 8 => Expect::Malformed,
        17 if be16(f, l4 + 2) == usize::from(UDP_PORT) => Expect::Steer,
        1 if v4 => shared_icmp(f, l4, true),
        58 if !v4 => shared_icmp(f, l4, false),
        _ => Expect::Pass,
    }
}

fn shared_icmp(f: &[u8], l4: usize, v4: bool) -> Expect {
    let n = f.len();
    if n < l4 + 8 {
        return Expect::Pass;
    }
    let ty = f[l4];
    let q = l4 + 8;
    let (error, qproto, ports) = if v4 {
        if n < q + 20 || f[q] & 0x0f != 5 {
            return Expect::Pass;
        }
        (ty == 3 || ty == 11, f[q + 9], q + 20)
    } else {
        if n < q + 40 {
            return Expect::Pass;
        }
        ((1..=3).contains(&ty), f[q + 6], q + 40)
    };
    if !error || n < ports + 4 {
        return Expect::Pass;
    }
    let sport = be16(f, ports);
    let owned = match qproto {
        6 => tcp_served(sport),
        17 => sport == usize::from(UDP_PORT),
        _ => false,
    };
    if owned { Expect::Steer } else { Expect::Pass }
}

fn tcp_served(port: usize) -> bool {
    port == usize::from(COOKIE_PORT) || port == usize::from(TCP_PORT)
}

/// Sent to the interface's own MAC (the program answers nothing else).
fn to_iface(f: &[u8]) -> bool {
    f[..6] == IFACE_MAC
}

fn from_unicast(f: &[u8]) -> bool {
    f[6] & 1 == 0
}

/// Whether the source address of the IP header (IPv4 at 26, IPv6 at 22) is one nothing is
/// ever answered to: unspecified, broadcast or multicast.
fn bad_source(f: &[u8]) -> bool {
    if f[14] >> 4 == 6 {
        let s = &f[22..38];
        s[0] == 0xff || s == [0; 16]
    } else {
        let s = &f[26..30];
        s == [0; 4] || s == [255; 4] || s[0] & 0xf0 == 0xe0
    }
}

/// Whether the TCP segment at `t` is a bare SYN the program answers with a cookie: to the
/// port with cookies on, sent to the interface from a unicast MAC and a source address
/// answers may go to.
fn cookie(f: &[u8], t: usize) -> bool {
    let flags = f[t + 13];
    let bare_syn = flags & 0x02 != 0 && flags & (0x10 | 0x04 | 0x01) == 0;
    let doff = usize::from(f[t + 12] >> 4) * 4;
    bare_syn
        && be16(f, t + 2) == usize::from(COOKIE_PORT)
        && from_unicast(f)
        && to_iface(f)
        && doff >= 20
        && !bad_source(f)
}

/// Whether a TCP segment at `t` (`seglen` bytes by the IP header) to a closed port is reset.
fn resets(f: &[u8], t: usize, seglen: usize) -> Expect {
    let doff = usize::from(f[t + 12] >> 4) * 4;
    let rst = f[t + 13] & 0x04 != 0;
    if rst || !from_unicast(f) || !to_iface(f) || doff < 20 || seglen < doff || bad_source(f) {
        Expect::Pass
    } else {
        Expect::Reset
    }
}

pub fn expect(f: &[u8]) -> Expect {
    let n = f.len();
    match be16(f, 12) {
        0x0806 => {
            if n < 14 + 28 {
                return Expect::Malformed;
            }
            let a = &f[14..];
            if be16(a, 0) != 1 || be16(a, 2) != 0x0800 || a[4] != 6 || a[5] != 4 {
                return Expect::Pass;
            }
            if owned4(&a[24..28]) && !shared4(&a[24..28]) {
                Expect::Steer
            } else {
                Expect::Pass
            }
        }
        0x0800 => ipv4(f),
        0x86dd => ipv6(f),
        _ => Expect::Pass,
    }
}

fn ipv4(f: &[u8]) -> Expect {
    let n = f.len();
    if n < 34 {
        return Expect::Malformed;
    }
    let ihl = usize::from(f[14] & 0x0f);
    if f[14] >> 4 != 4 || ihl < 5 {
        return Expect::Malformed;
    }
    let is_shared = shared4(&f[30..34]);
    if !owned4(&f[30..34]) && !is_shared {
        return Expect::Pass;
    }
    if be16(f, 20) & 0x3fff != 0 {
        return if is_shared {
            Expect::Pass
        } else {
            Expect::Steer
        };
    }
    let l4 = 14 + ihl * 4;
    if l4 > n {
        return Expect::Malformed;
    }
    if is_shared {
        return shared(f, f[23], l4, true);
    }
    let proto = f[23];
    if proto == 17 && ihl == 5 {
        if n < l4 + 8 {
            return Expect::Malformed;
        }
        let s = &f[26..30];
        let closed = if !from_unicast(f)
            || !to_iface(f)
            || s == [0; 4]
            || s == [255; 4]
            || s[0] & 0xf0 == 0xe0
        {
            Expect::Pass
        } else {
            Expect::Unreach
        };
        if be16(f, l4 + 2) == usize::from(UDP_PORT) {
            return no_socket(closed);
        }
        return closed;
    }
    if proto == 6 && ihl == 5 {
        if n < l4 + 20 {
            return Expect::Malformed;
        }
        let port = be16(f, l4 + 2);
        if cookie(f, l4) {
            return Expect::Cookie;
        }
        let tot = be16(f, 16);
        let closed = if tot < 20 {
            Expect::Pass
        } else {
            resets(f, l4, tot - 20)
        };
        if tcp_served(port) {
            return no_socket(closed);
        }
        return closed;
    }
    l4_steer(f, proto, l4)
}

/// The program's rule for what follows an IPv4 header with options, or an IPv6 header whose
/// next header is not TCP, UDP or ICMPv6.
fn l4_steer(f: &[u8], proto: u8, l4: usize) -> Expect {
    let n = f.len();
    match proto {
        1 | 58 | 44 => Expect::Steer,
        6 if n < l4 + 20 => Expect::Malformed,
        6 if tcp_served(be16(f, l4 + 2)) => Expect::Steer,
        17 if n < l4 + 8 => Expect::Malformed,
        17 if be16(f, l4 + 2) == usize::from(UDP_PORT) => Expect::Steer,
        _ => Expect::Pass,
    }
}

fn ipv6(f: &[u8]) -> Expect {
    let n = f.len();
    if n < 54 {
        return Expect::Malformed;
    }
    if f[14] >> 4 != 6 {
        return Expect::Malformed;
    }
    let next = f[20];
    let dst_owned = owned6(&f[38..54]);
    let dst_shared = shared6(&f[38..54]);
    if next == 58 {
        if n < 62 {
            return Expect::Malformed;
        }
        if dst_shared && f[54] != 135 && f[54] != 136 {
            return shared_icmp(f, 54, false);
        }
        if f[54] != 135 && f[54] != 136 {
            return if dst_owned {
                Expect::Steer
            } else {
                Expect::Pass
            };
        }
        if n < 78 {
            return Expect::Malformed;
        }
        return if owned6(&f[62..78]) || dst_owned {
            Expect::Steer
        } else {
            Expect::Pass
        };
    }
    if dst_shared {
        return match next {
            6 if n < 74 => Expect::Malformed,
            17 if n < 62 => Expect::Malformed,
            6 | 17 => shared(f, next, 54, false),
            _ => Expect::Pass,
        };
    }
    if !dst_owned {
        return Expect::Pass;
    }
    match next {
        6 => {
            if n < 74 {
                return Expect::Malformed;
            }
            if cookie(f, 54) {
                return Expect::Cookie;
            }
            let closed = resets(f, 54, be16(f, 18));
            if tcp_served(be16(f, 56)) {
                return no_socket(closed);
            }
            closed
        }
        17 => {
            if n < 62 {
                return Expect::Malformed;
            }
            let s = &f[22..38];
            let closed = if !from_unicast(f) || !to_iface(f) || s[0] == 0xff || s == [0; 16] {
                Expect::Pass
            } else {
                Expect::Unreach
            };
            if be16(f, 56) == usize::from(UDP_PORT) {
                return no_socket(closed);
            }
            closed
        }
        _ => l4_steer(f, next, 54),
    }
}

/// Checks an answer: from the interface to the sender, lengths and checksums right.
pub fn check_answer(kind: Expect, f: &[u8], out: &[u8]) {
    assert_eq!(out[..6], f[6..12], "the answer goes to the sender");
    assert_eq!(
        out[6..12],
        IFACE_MAC,
        "the answer leaves from the interface's MAC"
    );
    let v4 = be16(out, 12) == 0x0800;
    let (l4, src, dst, proto) = if v4 {
        let ip = &out[14..34];
        assert_eq!(ip[0], 0x45);
        assert_eq!(fold(sum(ip)), 0xffff, "IPv4 header checksum");
        assert_eq!(be16(ip, 2), out.len() - 14, "IPv4 total length");
        assert_eq!((&ip[12..16], &ip[16..20]), (&f[30..34], &f[26..30]));
        (34, &out[26..30], &out[30..34], ip[9])
    } else {
        assert_eq!(be16(out, 12), 0x86dd);
        assert_eq!(out[14] >> 4, 6);
        assert_eq!(be16(out, 18), out.len() - 54, "IPv6 payload length");
        assert_eq!((&out[22..38], &out[38..54]), (&f[38..54], &f[22..38]));
        (54, &out[22..38], &out[38..54], out[20])
    };
    let body = &out[l4..];
    let mut pseudo = Vec::new();
    if !(v4 && proto == 1) {
        pseudo.extend_from_slice(src);
        pseudo.extend_from_slice(dst);
        pseudo.extend_from_slice(&[0, proto]);
        pseudo.extend_from_slice(&(body.len() as u16).to_be_bytes());
    }
    assert_eq!(fold(sum(&pseudo) + sum(body)), 0xffff, "{kind:?} checksum");
    let fl4 = if v4 {
        14 + usize::from(f[14] & 0x0f) * 4
    } else {
        54
    };
    match kind {
        Expect::Reset | Expect::SteerReset | Expect::Cookie => {
            assert_eq!(proto, 6);
            assert_eq!(
                (&body[0..2], &body[2..4]),
                (&f[fl4 + 2..fl4 + 4], &f[fl4..fl4 + 2])
            );
            if kind != Expect::Cookie {
                assert_eq!(body.len(), 20);
                assert!(body[13] & 0x04 != 0, "RST set");
            } else {
                assert_eq!(body[13], 0x12, "SYN and ACK");
                let isn = u32::from_be_bytes(f[fl4 + 4..fl4 + 8].try_into().unwrap());
                let ack = u32::from_be_bytes(body[8..12].try_into().unwrap());
                assert_eq!(ack, isn.wrapping_add(1));
            }
        }
        _ => {
            // Destination unreachable, port unreachable, quoting the IP header and 8 bytes.
            let (ty, code, quote) = if v4 { (3, 3, 28) } else { (1, 4, 48) };
            assert_eq!(proto, if v4 { 1 } else { 58 });
            assert_eq!((body[0], body[1]), (ty, code));
            assert_eq!(&body[8..], &f[14..14 + quote], "the quote");
        }
    }
}
