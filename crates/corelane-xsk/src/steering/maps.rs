//! The program's maps as this process writes them: owned addresses (and the multicast groups
//! IPv6 ones need), ports, and the counters read back.

use std::net::IpAddr;

use corelane_frame::Proto;

use super::attached::{Attached, solicited_node_mac};
use super::{STAT_SLOTS, XdpCounters, map_err};
use crate::cookie::monotonic_ns;
use crate::error::Error;

/// An owned address's bits in `owned_v4` and `owned_v6` (`ADDR_OWNED`, `ADDR_SHARED`).
const ADDR_OWNED: u8 = 1;
const ADDR_SHARED: u8 = 2;

impl Attached {
    /// Owns `addr`, `shared` with the kernel or not (`ADDR_OWNED`, `ADDR_SHARED`).
    pub(super) fn own_addr_as(&mut self, addr: IpAddr, shared: bool) -> Result<(), Error> {
        let v = if shared {
            ADDR_OWNED | ADDR_SHARED
        } else {
            ADDR_OWNED
        };
        match addr {
            IpAddr::V4(a) => self
                .owned_v4
                .insert(u32::from_ne_bytes(a.octets()), v, 0)
                .map_err(map_err("owned_v4")),
            IpAddr::V6(a) => {
                self.owned_v6
                    .insert(a.octets(), v, 0)
                    .map_err(map_err("owned_v6"))?;
                if shared {
                    // The kernel has joined the address's solicited-node group and answers
                    // its neighbour solicitations.
                    return Ok(());
                }
                // A physical NIC filters multicast: neighbour solicitations for the address go
                // to its solicited-node group, which the interface must accept.
                let mac = solicited_node_mac(a.octets());
                let refs = self.groups.entry(mac).or_insert(0);
                *refs += 1;
                if *refs == 1 {
                    match crate::netdev::multicast(&self.ifname, mac, true) {
                        Ok(()) => {
                            if let Some(c) = &self.claim {
                                c.note_group(mac, true);
                            }
                        }
                        Err(e) => tracing::warn!(
                            "{}: cannot accept multicast {mac:02x?} for {a}: {e}; neighbour \
                             solicitations for it may not arrive",
                            self.ifname
                        ),
                    }
                }
                Ok(())
            }
        }
    }

    pub(super) fn disown_addr(&mut self, addr: IpAddr) -> Result<(), Error> {
        match addr {
            IpAddr::V4(a) => self
                .owned_v4
                .remove(&u32::from_ne_bytes(a.octets()))
                .map_err(map_err("owned_v4")),
            IpAddr::V6(a) => {
                let shared = self
                    .owned_v6
                    .get(&a.octets(), 0)
                    .is_ok_and(|v| v & ADDR_SHARED != 0);
                self.owned_v6
                    .remove(&a.octets())
                    .map_err(map_err("owned_v6"))?;
                if shared {
                    return Ok(());
                }
                let mac = solicited_node_mac(a.octets());
                if let Some(refs) = self.groups.get_mut(&mac) {
                    *refs -= 1;
                    if *refs == 0 {
                        self.groups.remove(&mac);
                        let _ = crate::netdev::multicast(&self.ifname, mac, false);
                        if let Some(c) = &self.claim {
                            c.note_group(mac, false);
                        }
                    }
                }
                Ok(())
            }
        }
    }

    pub(super) fn set_port(&mut self, proto: Proto, port: u16, on: bool) -> Result<(), Error> {
        let (map, name) = match proto {
            Proto::Tcp => (&mut self.tcp_ports, "tcp_ports"),
            Proto::Udp => (&mut self.udp_ports, "udp_ports"),
        };
        map.set(u32::from(port), u8::from(on), 0)
            .map_err(map_err(name))
    }

    pub(super) fn counters(&self) -> Result<XdpCounters, Error> {
        let mut sums = [0u64; STAT_SLOTS];
        for (slot, sum) in sums.iter_mut().enumerate() {
            let v = self
                .stats
                .get(&(slot as u32), 0)
                .map_err(map_err("stats"))?;
            *sum = v.iter().sum();
        }
        Ok(XdpCounters {
            steered: sums[0],
            passed: sums[1],
            malformed: sums[2],
            no_socket: sums[3],
            syn_cookies: sums[4],
            closed_port_resets: sums[5],
            port_unreachables: sums[6],
            unreachables_limited: sums[7],
            resets_limited: sums[8],
        })
    }
}

impl Attached {
    /// What the program noted of a shared address's neighbour `ip`, when recent.
    pub(super) fn neighbour(&self, ip: IpAddr) -> Option<[u8; 6]> {
        let key = match ip {
            IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            IpAddr::V6(a) => a.octets(),
        };
        let v = self.neighbours.get(&key, 0).ok()?;
        let b = v.to_ne_bytes();
        let when = u16::from_ne_bytes([b[6], b[7]]);
        neighbour_is_recent(when, monotonic_ns(std::time::Instant::now()))
            .then_some([b[0], b[1], b[2], b[3], b[4], b[5]])
    }
}

/// How old a noted answer may be, in the program's units of 2^30 ns (about 4.3 s): a core asks
/// when it needs an address and reads the answer milliseconds later; one noted long ago says
/// where a neighbour was, not where it is (a changed hardware address is taken at the next
/// request, never 20 minutes late).
const NEIGHBOUR_RECENT: u16 = 4;

/// Whether an answer the program noted at `when` (its units, wrapping) is recent at `now_ns`.
fn neighbour_is_recent(when: u16, now_ns: u64) -> bool {
    let now = (now_ns >> 30) as u16;
    now.wrapping_sub(when) <= NEIGHBOUR_RECENT
}

#[cfg(test)]
#[test]
fn an_answer_noted_long_ago_is_not_taken() {
    let unit = 1u64 << 30;
    assert!(neighbour_is_recent(7, 7 * unit));
    assert!(neighbour_is_recent(7, 11 * unit + 5));
    assert!(!neighbour_is_recent(7, 12 * unit));
    // Across the wrap of the two bytes.
    assert!(neighbour_is_recent(u16::MAX, (1u64 << 46) + unit));
    assert!(
        !neighbour_is_recent(7, 6 * unit),
        "from the future: a wrap ago"
    );
}
