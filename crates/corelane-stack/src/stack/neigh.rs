//! The TCP engine's neighbour table: which hardware address each next hop has. It learns from
//! every ARP packet and NDP solicitation or advertisement that arrives (smoltcp's interface
//! still answers them for UDP and ICMP), asks with an ARP request or a neighbour solicitation
//! when a connection needs an address it does not know, and keeps at most `MAX` entries. An
//! entry older than `STALE` is still used while a new request goes out, so a flow never waits
//! for a refresh; when the table is full the oldest eighth makes room.

use std::collections::HashMap;

use crate::keyed::KeyedState;
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetFrame, EthernetProtocol, IpAddress, IpProtocol,
    Ipv4Address, Ipv6Address, Ipv6Packet,
};

use crate::device::XdpDevice;
use crate::tcp::wire::checksum;
use corelane_frame::FrameIo;
use smoltcp::phy::Device as _;

/// Most entries kept.
const MAX: usize = 16 * 1024;
/// An entry is asked for again after this long (and still used meanwhile).
const STALE: Duration = Duration::from_secs(300);
/// An entry no longer used after this long without news.
const EXPIRE: Duration = Duration::from_secs(1200);
/// At most one request per address per this long.
const RETRY: Duration = Duration::from_millis(200);
/// Most addresses asked for and not yet answered (as the kernel's `gc_thresh3`): past it, no
/// request for a new address goes out until the old ones age out, so a flood of distinct
/// spoofed sources grows neither the table nor the work per frame.
const MAX_ASKED: usize = 1024;
/// A request unanswered this long is forgotten (every flow waiting on it has given up by then).
const ASKED_TTL: Duration = Duration::from_secs(5);
/// The asked table is swept for old entries at most this often.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

#[derive(Debug, Default)]
pub(super) struct Neighbors {
    known: HashMap<IpAddress, ([u8; 6], Instant), KeyedState>,
    pub(super) asked: HashMap<IpAddress, Instant, KeyedState>,
    /// The addresses asked for, in turn, for [`Neighbors::wanted`] (at most [`MAX_ASKED`]).
    turns: std::collections::VecDeque<IpAddress>,
    swept: Option<Instant>,
}

impl Neighbors {
    /// An empty table whose maps hash under `key`.
    pub(super) fn keyed(key: KeyedState) -> Neighbors {
        Neighbors {
            known: HashMap::with_hasher(key),
            asked: HashMap::with_hasher(key),
            turns: std::collections::VecDeque::new(),
            swept: None,
        }
    }

    /// The hardware address of `ip`, if known, and whether it is fresh (a stale one is
    /// usable, but should be asked for again).
    pub(super) fn lookup(&self, ip: IpAddress, now: Instant) -> Option<([u8; 6], bool)> {
        self.known
            .get(&ip)
            .filter(|(_, at)| now - *at < EXPIRE)
            .map(|(m, at)| (*m, now - *at < STALE))
    }

    /// Entries held.
    pub(super) fn len(&self) -> usize {
        self.known.len()
    }

    /// Remembers that `ip` is at `mac`. Returns true if this was news.
    pub(super) fn learn(&mut self, ip: IpAddress, mac: [u8; 6], now: Instant) -> bool {
        if mac[0] & 1 == 1 || mac == [0; 6] {
            return false;
        }
        self.asked.remove(&ip);
        if let Some(e) = self.known.get_mut(&ip) {
            let news = e.0 != mac;
            *e = (mac, now);
            return news;
        }
        if self.known.len() >= MAX {
            self.make_room();
        }
        self.known.insert(ip, (mac, now));
        true
    }

    /// A datagram from `ip` arrived from `mac`: an entry that already says so is fresh again.
    /// Nothing is created or moved (as with the kernel, only ARP and NDP say where a neighbour
    /// is: any host on the link can write any source address on a datagram).
    pub(super) fn confirm(&mut self, ip: IpAddress, mac: [u8; 6], now: Instant) {
        if let Some(e) = self.known.get_mut(&ip)
            && e.0 == mac
        {
            e.1 = now;
        }
    }

    /// Forgets the oldest eighth of the entries (O(n), once per `MAX / 8` new entries).
    fn make_room(&mut self) {
        let mut ages: Vec<Instant> = self.known.values().map(|(_, t)| *t).collect();
        let nth = ages.len() / 8;
        let (_, cut, _) = ages.select_nth_unstable(nth);
        let cut = *cut;
        self.known.retain(|_, (_, t)| *t > cut);
    }

    /// True when a request for `ip` may go out now (none in the last `RETRY`, and room in the
    /// table for a new address).
    pub(super) fn may_ask(&mut self, ip: IpAddress, now: Instant) -> bool {
        if self.asked.len() >= MAX_ASKED && self.swept.is_none_or(|t| now - t >= SWEEP_EVERY) {
            self.swept = Some(now);
            self.asked.retain(|_, t| now - *t < ASKED_TTL);
            let asked = &self.asked;
            self.turns.retain(|ip| asked.contains_key(ip));
        }
        match self.asked.get(&ip) {
            Some(t) if now - *t < RETRY => false,
            Some(_) => {
                self.asked.insert(ip, now);
                true
            }
            None if self.asked.len() >= MAX_ASKED => false,
            None => {
                self.asked.insert(ip, now);
                // (An address learnt and asked for again may be there twice for a while.)
                if self.turns.len() < 2 * MAX_ASKED {
                    self.turns.push_back(ip);
                }
                true
            }
        }
    }

    /// At most `limit` of the addresses asked for and not known (or known but stale: asked
    /// for again), taking them in turn across calls: the work per call never grows with the
    /// table.
    pub(super) fn wanted(&mut self, limit: usize, now: Instant) -> Vec<IpAddress> {
        let mut out = Vec::new();
        for _ in 0..self.turns.len().min(limit) {
            let Some(ip) = self.turns.pop_front() else {
                break;
            };
            let live = self.asked.get(&ip).is_some_and(|t| now - *t < ASKED_TTL);
            if live {
                if self.lookup(ip, now).is_none_or(|(_, fresh)| !fresh) {
                    out.push(ip);
                }
                self.turns.push_back(ip);
            } else {
                self.asked.remove(&ip);
            }
        }
        out
    }

    /// Learns what an ARP or NDP frame tells. Returns true if something new was learnt.
    pub(super) fn snoop(&mut self, frame: &[u8], now: Instant) -> bool {
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return false;
        };
        match eth.ethertype() {
            EthernetProtocol::Arp => {
                let Ok(p) = ArpPacket::new_checked(eth.payload()) else {
                    return false;
                };
                match ArpRepr::parse(&p) {
                    Ok(ArpRepr::EthernetIpv4 {
                        source_hardware_addr,
                        source_protocol_addr,
                        ..
                    }) => self.learn(
                        IpAddress::Ipv4(source_protocol_addr),
                        source_hardware_addr.0,
                        now,
                    ),
                    _ => false,
                }
            }
            EthernetProtocol::Ipv6 => {
                let Ok(ip) = Ipv6Packet::new_checked(eth.payload()) else {
                    return false;
                };
                if ip.next_header() != IpProtocol::Icmpv6 {
                    return false;
                }
                let src = ip.src_addr();
                let icmp = ip.payload();
                if checksum(&src.octets(), &ip.dst_addr().octets(), 58, icmp) != 0 {
                    return false;
                }
                // RFC 4861 sections 7.1.1 and 7.1.2: hop limit 255 (the frame cannot have
                // crossed a router), code 0, at least the fixed part, a unicast target.
                if ip.hop_limit() != 255 || icmp.get(1) != Some(&0) || icmp.len() < 24 {
                    return false;
                }
                // 135: a solicitation names its sender's address (option 1); 136: an
                // advertisement names the target's (option 2).
                let (ip_of, want) = match icmp.first() {
                    Some(135) => (src, 1u8),
                    Some(136) => (
                        Ipv6Address::from_octets(icmp[8..24].try_into().unwrap_or([0; 16])),
                        2,
                    ),
                    _ => return false,
                };
                if ip_of.is_unspecified() || ip_of.is_multicast() {
                    return false;
                }
                let Some(mac) = link_option(&icmp[24..], want) else {
                    return false;
                };
                let who = IpAddress::Ipv6(ip_of);
                if want == 2 {
                    // RFC 4861 section 7.2.5: an advertisement never creates an entry (only
                    // one this side asked for, its INCOMPLETE state), and changes a known
                    // address only with the Override flag.
                    let overrides = icmp[4] & 0x20 != 0;
                    match self.known.get(&who) {
                        None if !self.asked.contains_key(&who) => return false,
                        Some((old, _)) if *old != mac && !overrides => return false,
                        _ => {}
                    }
                }
                self.learn(who, mac, now)
            }
            _ => false,
        }
    }
}

/// The link-layer address option of kind `want` (1: source, 2: target) among NDP `opts`.
fn link_option(mut opts: &[u8], want: u8) -> Option<[u8; 6]> {
    while opts.len() >= 8 {
        let len = usize::from(opts[1]) * 8;
        if len == 0 || len > opts.len() {
            return None;
        }
        if opts[0] == want {
            return opts[2..8].try_into().ok();
        }
        opts = &opts[len..];
    }
    None
}

/// The frame asking for `target`'s hardware address: an ARP request (IPv4) or a neighbour
/// solicitation to the solicited-node group (IPv6). `from` is this side's address of the same
/// family.
pub(super) fn request(mac: [u8; 6], from: IpAddress, target: IpAddress) -> Option<Vec<u8>> {
    match (from, target) {
        (IpAddress::Ipv4(f), IpAddress::Ipv4(t)) => Some(super::ndisc::arp_frame(
            ArpOperation::Request,
            mac,
            f,
            [0xff; 6],
            t,
        )),
        (IpAddress::Ipv6(f), IpAddress::Ipv6(t)) => {
            let o = t.octets();
            let group = super::ndisc::solicited_node(o);
            let mut body = [0u8; 32];
            body[0] = 135;
            body[8..24].copy_from_slice(&o);
            body[24] = 1;
            body[25] = 1;
            body[26..32].copy_from_slice(&mac);
            Some(super::ndisc::icmp6_frame(
                super::ndisc::multicast_mac(group),
                mac,
                f.octets(),
                group,
                &body,
            ))
        }
        _ => None,
    }
}

/// True when `a` is one of the unspecified addresses.
pub(super) fn unspecified(a: IpAddress) -> bool {
    match a {
        IpAddress::Ipv4(v) => v == Ipv4Address::UNSPECIFIED,
        IpAddress::Ipv6(v) => v.is_unspecified(),
    }
}

/// How the stack finds, and asks for, its next hops' hardware addresses.
impl super::Stack {
    /// The hardware address of next hop `hop` and whether it is fresh, if known: an owned
    /// address is this stack's own (its frames come back through the device's loopback, see
    /// [`crate::XdpDevice::set_own_mac`]).
    pub(super) fn neighbor(&self, hop: IpAddress, now: Instant) -> Option<([u8; 6], bool)> {
        if self.owns(hop) {
            return Some((self.mac, true));
        }
        self.neigh.lookup(hop, now)
    }

    /// The next hops asked for and not yet known, or known but stale and asked for again:
    /// none most of the time.
    /// With an address shared with the kernel, the kernel takes the answers to the stack's
    /// requests; the runtime reads what they said elsewhere and gives it back with
    /// [`learn_neighbor`](Self::learn_neighbor).
    ///
    /// At most `limit` a call, taken in turn across calls (the caller makes a system call per
    /// address: a flood of spoofed sources must not make that grow).
    pub fn neighbors_wanted(&mut self, limit: usize) -> Vec<std::net::IpAddr> {
        let now = self.clock;
        self.neigh
            .wanted(limit, now)
            .into_iter()
            .map(std::net::IpAddr::from)
            .collect()
    }

    /// Learns that next hop `ip` is at `mac`, as from an ARP reply or neighbour advertisement;
    /// flows waiting for it go out on the next poll. Returns true if this was news.
    pub fn learn_neighbor(&mut self, ip: std::net::IpAddr, mac: [u8; 6]) -> bool {
        let news = self.neigh.learn(ip.into(), mac, self.clock);
        if news {
            for i in std::mem::take(&mut self.unresolved) {
                self.queue_egress(i);
            }
        }
        news
    }

    /// Sends an ARP request or a neighbour solicitation for `hop` from `from`, unless one went
    /// out lately.
    pub(super) fn ask<P: FrameIo>(
        &mut self,
        now: Instant,
        dev: &mut XdpDevice<P>,
        from: IpAddress,
        hop: IpAddress,
    ) {
        if !unspecified(from)
            && self.neigh.may_ask(hop, now)
            && let Some(frame) = request(self.mac, from, hop)
            && let Some(tx) = dev.transmit(now)
        {
            smoltcp::phy::TxToken::consume(tx, frame.len(), |buf| buf.copy_from_slice(&frame));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Result = std::result::Result<(), Box<dyn std::error::Error>>;

    fn ip(s: &str) -> std::result::Result<IpAddress, std::net::AddrParseError> {
        Ok(s.parse::<std::net::IpAddr>()?.into())
    }

    /// A flood of requests for distinct addresses (replies to spoofed sources): the table
    /// holds at most `MAX_ASKED`, each call to `wanted` looks at 16, every waiting address gets
    /// its turn, and once the old ones age out new addresses are asked for again.
    #[test]
    fn a_flood_of_distinct_next_hops_grows_neither_the_table_nor_the_work() -> Result {
        let mut n = Neighbors::default();
        let t0 = Instant::from_secs(10);
        let mut sent = 0;
        for i in 0..100_000u32 {
            let a = IpAddress::Ipv4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            sent += usize::from(n.may_ask(a, t0 + Duration::from_micros(u64::from(i))));
        }
        assert_eq!(sent, MAX_ASKED, "requests for new addresses past the cap");
        assert!(n.asked.len() <= MAX_ASKED && n.turns.len() <= MAX_ASKED);
        let mut seen = std::collections::HashSet::new();
        let later = t0 + Duration::from_millis(200);
        for _ in 0..MAX_ASKED / 16 {
            let w = n.wanted(16, later);
            assert_eq!(w.len(), 16);
            seen.extend(w);
        }
        assert_eq!(seen.len(), MAX_ASKED, "every address in turn");
        // Aged out: the next new address is asked for, and the table is small again.
        let aged = t0 + ASKED_TTL + Duration::from_secs(1);
        assert!(n.may_ask(ip("10.200.0.1")?, aged));
        assert!(n.asked.len() <= 1 + 1, "{}", n.asked.len());
        assert!(n.wanted(16, aged).len() <= 1);
        Ok(())
    }

    /// A stale entry asked for again is wanted too (with a shared address the answer reaches
    /// the kernel, and only the runtime's reading brings it back: before, a stale hop was
    /// asked for every 200 ms until it expired, and a changed address went unseen meanwhile).
    #[test]
    fn a_stale_neighbour_asked_for_again_is_wanted_until_it_is_heard() -> Result {
        let mut n = Neighbors::default();
        let (hop, t0) = (ip("10.0.0.7")?, Instant::from_secs(1));
        assert!(n.learn(hop, [2, 0, 0, 0, 0, 7], t0));
        assert!(n.wanted(16, t0).is_empty());
        let stale = t0 + STALE + Duration::from_secs(1);
        assert_eq!(n.lookup(hop, stale), Some(([2, 0, 0, 0, 0, 7], false)));
        assert!(n.may_ask(hop, stale));
        assert_eq!(n.wanted(16, stale), vec![hop]);
        assert_eq!(n.wanted(16, stale), vec![hop], "until heard");
        // Heard at a new address: known, fresh, no longer wanted.
        assert!(n.learn(hop, [2, 0, 0, 0, 0, 8], stale));
        assert!(n.wanted(16, stale).is_empty());
        assert_eq!(n.lookup(hop, stale), Some(([2, 0, 0, 0, 0, 8], true)));
        Ok(())
    }

    #[test]
    fn learns_from_its_own_requests_seen_by_a_peer() -> Result {
        let now = Instant::from_secs(1);
        let mac = [2, 0, 0, 0, 0, 9];
        let mut n = Neighbors::default();
        let v4 = request(mac, ip("10.0.0.9")?, ip("10.0.0.1")?).ok_or("an ARP request")?;
        assert!(n.snoop(&v4, now));
        assert_eq!(n.lookup(ip("10.0.0.9")?, now), Some((mac, true)));
        let v6 = request(mac, ip("fd00::9")?, ip("fd00::1")?).ok_or("a solicitation")?;
        assert!(
            matches!(
                crate::classify::classify(&v6),
                crate::Class::Neighbor { .. }
            ),
            "a valid solicitation"
        );
        assert!(n.snoop(&v6, now));
        assert_eq!(n.lookup(ip("fd00::9")?, now), Some((mac, true)));
        // A corrupted solicitation teaches nothing.
        let mut bad = v6.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(!Neighbors::default().snoop(&bad, now));
        assert!(n.may_ask(ip("10.0.0.1")?, now));
        assert!(!n.may_ask(ip("10.0.0.1")?, now));
        // Stale: still used, but asked for again; expired: gone.
        assert_eq!(n.lookup(ip("fd00::9")?, now + STALE), Some((mac, false)));
        assert!(n.lookup(ip("fd00::9")?, now + EXPIRE).is_none());
        Ok(())
    }

    #[test]
    fn a_full_table_forgets_its_oldest_and_keeps_learning() {
        let mut n = Neighbors::default();
        let mac = [2, 0, 0, 0, 0, 1];
        let total = MAX + MAX / 2;
        for i in 0..total as u32 {
            let a = IpAddress::Ipv4(Ipv4Address::from_bits(0x0a00_0000 + i));
            assert!(n.learn(a, mac, Instant::from_millis(i64::from(i))));
        }
        assert!(n.known.len() <= MAX);
        let newest = IpAddress::Ipv4(Ipv4Address::from_bits(0x0a00_0000 + total as u32 - 1));
        let oldest = IpAddress::Ipv4(Ipv4Address::from_bits(0x0a00_0000));
        let now = Instant::from_millis(total as i64);
        assert!(n.lookup(newest, now).is_some());
        assert!(n.lookup(oldest, now).is_none());
    }

    #[test]
    fn a_datagram_confirms_a_neighbour_but_never_creates_or_moves_one() -> Result {
        let mut n = Neighbors::default();
        let (real, forged) = ([2, 0, 0, 0, 0, 9], [2, 0, 0, 0, 0, 0x66]);
        let t0 = Instant::from_secs(1);
        n.confirm(ip("10.0.0.9")?, forged, t0);
        assert!(n.lookup(ip("10.0.0.9")?, t0).is_none(), "not created");
        assert!(n.learn(ip("10.0.0.9")?, real, t0));
        n.confirm(ip("10.0.0.9")?, forged, t0 + STALE);
        assert_eq!(
            n.lookup(ip("10.0.0.9")?, t0 + STALE),
            Some((real, false)),
            "not moved, nor made fresh"
        );
        n.confirm(ip("10.0.0.9")?, real, t0 + STALE);
        assert_eq!(
            n.lookup(ip("10.0.0.9")?, t0 + STALE),
            Some((real, true)),
            "fresh"
        );
        Ok(())
    }
}
