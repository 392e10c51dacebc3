//! What must not be guessable: initial sequence numbers (RFC 6528), timestamp offsets (RFC
//! 7323), SYN cookies (RFC 4987), the identifications of fragmented datagrams (RFC 7739),
//! ephemeral ports (RFC 6056) and the hash tables' keys, each from SipHash-2-4 under a 128-bit
//! key of its own, drawn from the OS. Knowing one (the cookie key is handed to the XDP program)
//! tells nothing of the others. A stack built with a fixed seed (tests, the simulation) expands
//! it into the same keys through SipHash, so its runs repeat, but nothing it sends is an affine
//! function of the seed.
//!
//! ISN = M + F(local, remote, secret), M a clock ticking every 4 µs: a blind attacker cannot
//! predict another connection's ISN, and a new incarnation of the same four-tuple starts above
//! the last one.

use smoltcp::time::Instant;
use smoltcp::wire::{IpAddress, IpEndpoint};

use super::seq::Seq;

use crate::keyed::siphash;

fn words(local: IpEndpoint, remote: IpEndpoint, extra: u64) -> [u64; 6] {
    let mut w = [0u64; 6];
    let addr = |a: smoltcp::wire::IpAddress| -> u128 {
        match a {
            smoltcp::wire::IpAddress::Ipv4(v) => u128::from(u32::from(v)),
            smoltcp::wire::IpAddress::Ipv6(v) => u128::from(v),
        }
    };
    let (l, r) = (addr(local.addr), addr(remote.addr));
    w[0] = l as u64;
    w[1] = (l >> 64) as u64;
    w[2] = r as u64;
    w[3] = (r >> 64) as u64;
    w[4] = u64::from(local.port) << 16 | u64::from(remote.port);
    w[5] = extra;
    w
}

/// SYN cookie parameters a listener can recover from the cookie alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CookieInfo {
    /// The peer's MSS, rounded down to one of [`MSS_TABLE`].
    pub(crate) mss: u16,
}

/// The MSS values a cookie can carry (3 bits).
pub(crate) const MSS_TABLE: [u16; 8] = [536, 1200, 1220, 1360, 1400, 1440, 1460, 8960];

/// The per-stack secret: a key per purpose.
#[derive(Clone)]
pub(crate) struct Secret {
    isn: (u64, u64),
    ts: (u64, u64),
    cookie: (u64, u64),
    ids: (u64, u64),
    ports: (u64, u64),
    tables: (u64, u64),
    /// QUIC's stateless reset key: from the restart key when there is one, so that the next
    /// process resets the last one's connections in words their peers recognise.
    quic_reset: (u64, u64),
    /// QUIC's address-validation token key (Retry and NEW_TOKEN).
    quic_token: (u64, u64),
}

/// Counters of [`IdGen`].
const ID_BUCKETS: usize = 64;

/// The identifications of datagrams that may be fragmented (IPv4 without DF, IPv6 fragment
/// headers): a keyed hash of source, destination and protocol plus one of 64 counters that
/// hash picks (RFC 7739 section 5.3). IDs toward one destination do not repeat soon, and those
/// a peer sees tell it nothing of the key or of the IDs toward anyone else beyond how busy its
/// bucket is. A datagram that carries DF is atomic and takes ID 0 (RFC 6864).
#[derive(Clone)]
pub(crate) struct IdGen {
    key: (u64, u64),
    counters: [u32; ID_BUCKETS],
}

impl std::fmt::Debug for IdGen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdGen(..)")
    }
}

impl IdGen {
    /// The next identification from `src` to `dst` (4 or 16 address bytes each) for `proto`.
    pub(crate) fn next(&mut self, src: &[u8], dst: &[u8], proto: u8) -> u32 {
        let word = |b: &[u8], i: usize| -> u64 {
            b.iter()
                .skip(8 * i)
                .take(8)
                .rev()
                .fold(0u64, |a, &x| a << 8 | u64::from(x))
        };
        let h = siphash(
            self.key,
            &[
                word(src, 0),
                word(src, 1),
                word(dst, 0),
                word(dst, 1),
                u64::from(proto),
            ],
        );
        let c = &mut self.counters[(h >> 58) as usize % ID_BUCKETS];
        *c = c.wrapping_add(1);
        (h as u32).wrapping_add(*c)
    }
}

/// The purposes, in the order a seed is expanded into keys.
const PURPOSES: usize = 8;

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Minutes-ish counter of the cookie clock: 64 s per tick, 5 bits kept.
fn cookie_tick(now: Instant) -> u64 {
    (now.total_millis().max(0) as u64) / 64_000
}

impl Secret {
    /// A secret expanded from a fixed 64-bit seed, for reproducible runs: each key is
    /// SipHash of the purpose under a key made of the seed.
    pub(crate) fn new(seed: u64) -> Secret {
        Secret::from_master((seed, seed.rotate_left(32) ^ 0x636f_726c_616e_6521))
    }

    /// A secret expanded from a 128-bit master key: each key is SipHash of the purpose under
    /// the master key, so knowing one purpose's key tells nothing of another's or of the
    /// master.
    pub(crate) fn from_master(master: (u64, u64)) -> Secret {
        let mut k = [(0u64, 0u64); PURPOSES];
        for (i, key) in k.iter_mut().enumerate() {
            let i = i as u64;
            *key = (
                siphash(master, &[0x6b65_7900 | i, 0]),
                siphash(master, &[0x6b65_7900 | i, 1]),
            );
        }
        Secret::from_keys(k)
    }

    /// A secret of fresh keys from the OS (128 bits per purpose). None when the OS has no
    /// randomness to give.
    pub(crate) fn random() -> Option<Secret> {
        let mut b = [0u8; PURPOSES * 16];
        getrandom::fill(&mut b).ok()?;
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let mut k = [(0u64, 0u64); PURPOSES];
        for (i, key) in k.iter_mut().enumerate() {
            *key = (word(2 * i), word(2 * i + 1));
        }
        Some(Secret::from_keys(k))
    }

    fn from_keys(k: [(u64, u64); PURPOSES]) -> Secret {
        Secret {
            isn: k[0],
            ts: k[1],
            cookie: k[2],
            ids: k[3],
            ports: k[4],
            tables: k[5],
            quic_reset: k[6],
            quic_token: k[7],
        }
    }

    /// The same secret with its ISN and timestamp-offset keys drawn from `restart`, a key
    /// that outlives the process ([`crate::StackConfig::restart_key`]): the next process of
    /// the host gives a four-tuple the same timestamp offset and ISN function, so with a clock
    /// that runs on across processes its timestamps and ISNs stay above those a peer still
    /// holds in TIME-WAIT. The other keys stay this secret's.
    pub(crate) fn with_restart_key(mut self, restart: (u64, u64)) -> Secret {
        let r = Secret::from_master(restart);
        self.isn = r.isn;
        self.ts = r.ts;
        self.quic_reset = r.quic_reset;
        self
    }

    /// QUIC's keys, 256 bits each, expanded from their 128-bit ones: (stateless reset, token).
    pub(crate) fn quic_keys(&self) -> ([u8; 32], [u8; 32]) {
        let expand = |k: (u64, u64)| {
            let mut out = [0u8; 32];
            for (i, w) in out.chunks_exact_mut(8).enumerate() {
                w.copy_from_slice(&siphash(k, &[0x7175_6963, i as u64]).to_le_bytes());
            }
            out
        };
        (expand(self.quic_reset), expand(self.quic_token))
    }

    /// The key of the connection IDs that name this run's cores: from the stateless reset
    /// key, so every core of the run reads the others' IDs, and the next process of the host
    /// reads the last one's (and resets their connections, rather than taking the IDs for
    /// noise).
    pub(crate) fn quic_cid_key(&self) -> (u64, u64) {
        let k = self.quic_reset;
        (siphash(k, &[0x6369_6430]), siphash(k, &[0x6369_6431]))
    }

    /// The cookie key, for a program that makes this stack's cookies on its behalf (it can
    /// make and check cookies with it, nothing else).
    pub(crate) fn key(&self) -> (u64, u64) {
        self.cookie
    }

    /// The timestamp-offset key, for a program that answers SYNs with timestamps on this
    /// stack's behalf.
    pub(crate) fn ts_key(&self) -> (u64, u64) {
        self.ts
    }

    /// The key of the hash tables a peer's addresses index (flows, neighbours, fragments).
    pub(crate) fn table_key(&self) -> (u64, u64) {
        self.tables
    }

    /// RFC 6056's double-hash port selection (its algorithm 4), the two hashes of a
    /// connection's addresses and remote port: where the search for a free port starts (F),
    /// and which of the counters that move it on is this destination's (G, before the modulo).
    /// Connections to one destination take ports one after the other from a start no one
    /// can guess, so a port comes back to the same peer only after the whole range was used
    /// (a peer may still hold the last incarnation in TIME-WAIT), while ports tell nothing
    /// about the connections to other destinations. `draw`: a number used once, for a port
    /// with no destination yet (a UDP socket bound to port 0), which then starts anywhere.
    pub(crate) fn port_hashes(
        &self,
        local: IpAddress,
        remote: IpEndpoint,
        draw: u64,
    ) -> (u32, u32) {
        let h = siphash(self.ports, &words(IpEndpoint::new(local, 0), remote, draw));
        (h as u32, (h >> 32) as u32)
    }

    /// The generator of the identifications of datagrams that may be fragmented.
    pub(crate) fn ids(&self) -> IdGen {
        IdGen {
            key: self.ids,
            counters: [0; ID_BUCKETS],
        }
    }

    /// RFC 6528's initial sequence number for a connection.
    pub(crate) fn isn(&self, local: IpEndpoint, remote: IpEndpoint, now: Instant) -> Seq {
        let f = siphash(self.isn, &words(local, remote, 1)) as u32;
        let m = (now.total_micros().max(0) as u64 / 4) as u32;
        Seq(f.wrapping_add(m))
    }

    /// The timestamp offset of a four-tuple (RFC 7323 section 5.4): the same for every
    /// incarnation of the four-tuple, so timestamps stay monotonic across them.
    pub(crate) fn ts_offset(&self, local: IpEndpoint, remote: IpEndpoint) -> u32 {
        siphash(self.ts, &words(local, remote, 2)) as u32
    }

    fn cookie_hash(&self, local: IpEndpoint, remote: IpEndpoint, peer_isn: Seq, tick: u64) -> u32 {
        let extra = 3 | u64::from(peer_isn.0) << 8 | (tick & 31) << 40;
        (siphash(self.cookie, &words(local, remote, extra)) as u32) & 0x00ff_ffff
    }

    /// The ISN of a SYN-ACK that keeps no state (RFC 4987 section 3.6): 5 bits of time, 3 bits
    /// of MSS, 24 bits of keyed hash over the four-tuple, the peer's ISN and the time.
    pub(crate) fn cookie(
        &self,
        local: IpEndpoint,
        remote: IpEndpoint,
        peer_isn: Seq,
        peer_mss: u16,
        now: Instant,
    ) -> Seq {
        let tick = cookie_tick(now);
        let idx = MSS_TABLE.iter().rposition(|&m| m <= peer_mss).unwrap_or(0) as u32;
        let h = self.cookie_hash(local, remote, peer_isn, tick);
        Seq(((tick & 31) as u32) << 27 | idx << 24 | h)
    }

    /// Checks the ACK of a cookie SYN-ACK: `our_isn` is its ACK number - 1, `peer_isn` its
    /// sequence number - 1. A cookie is good for two ticks (64 to 128 s).
    pub(crate) fn check_cookie(
        &self,
        local: IpEndpoint,
        remote: IpEndpoint,
        peer_isn: Seq,
        our_isn: Seq,
        now: Instant,
    ) -> Option<CookieInfo> {
        let c = our_isn.0;
        let t = u64::from(c >> 27);
        let now_tick = cookie_tick(now);
        let tick = [now_tick, now_tick.wrapping_sub(1)]
            .into_iter()
            .find(|k| k & 31 == t)?;
        if c & 0x00ff_ffff != self.cookie_hash(local, remote, peer_isn, tick) {
            return None;
        }
        Some(CookieInfo {
            mss: MSS_TABLE[((c >> 24) & 7) as usize],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(s: &str) -> IpEndpoint {
        s.parse::<std::net::SocketAddr>().map_or(
            IpEndpoint::new(smoltcp::wire::IpAddress::v4(0, 0, 0, 0), 0),
            Into::into,
        )
    }

    #[test]
    fn quic_keys_follow_the_master_key_and_the_reset_key_the_restart_key() {
        let a = Secret::from_master((1, 2));
        let b = Secret::from_master((1, 2));
        let c = Secret::from_master((3, 4));
        assert_eq!(
            a.quic_keys(),
            b.quic_keys(),
            "one master key, one pair of QUIC keys"
        );
        let (reset, token) = a.quic_keys();
        assert_ne!(reset, token, "each purpose its own key");
        assert_ne!(c.quic_keys().0, reset);
        assert_ne!(c.quic_keys().1, token);
        // Two processes of a host: different master keys, one restart key: the same reset
        // key (a peer's connection is reset by the next process), their own token keys.
        let (p1, p2) = (a.with_restart_key((9, 9)), c.with_restart_key((9, 9)));
        assert_eq!(p1.quic_keys().0, p2.quic_keys().0);
        assert_ne!(p1.quic_keys().1, p2.quic_keys().1);
    }

    #[test]
    fn a_restart_key_fixes_isns_and_timestamp_offsets_and_nothing_else() {
        let (l, r) = (ep("10.0.0.1:40000"), ep("10.0.0.2:80"));
        let t = Instant::from_secs(5);
        let restart = (0x1234, 0x5678);
        let a = Secret::new(1).with_restart_key(restart);
        let b = Secret::new(2).with_restart_key(restart);
        assert_eq!(a.isn(l, r, t), b.isn(l, r, t));
        assert_eq!(a.ts_offset(l, r), b.ts_offset(l, r));
        assert_ne!(a.key(), b.key(), "cookie keys stay the run's own");
        assert_ne!(a.port_hashes(l.addr, r, 0), b.port_hashes(l.addr, r, 0));
        let c = Secret::new(1).with_restart_key((0x1234, 0x5679));
        assert_ne!(a.ts_offset(l, r), c.ts_offset(l, r));
    }

    #[test]
    fn isns_are_spread_and_advance_with_the_clock() {
        let s = Secret::new(7);
        let (l, r) = (ep("10.0.0.1:80"), ep("10.0.0.2:40000"));
        let t0 = Instant::from_millis(1000);
        let a = s.isn(l, r, t0);
        let b = s.isn(l, ep("10.0.0.2:40001"), t0);
        // Neighbouring ports give unrelated ISNs.
        assert!(a.0.abs_diff(b.0) > 1 << 16);
        // The same tuple one second later: 250 000 ticks of 4 µs further on.
        assert_eq!(s.isn(l, r, Instant::from_millis(2000)).diff(a), 250_000);
        // Another secret: another ISN.
        assert_ne!(Secret::new(8).isn(l, r, t0), a);
    }

    #[test]
    fn cookies_validate_only_for_their_tuple_isn_and_time() -> Result<(), &'static str> {
        let s = Secret::new(1);
        let (l, r) = (ep("10.0.0.1:80"), ep("10.0.0.2:40000"));
        let now = Instant::from_secs(1000);
        let c = s.cookie(l, r, Seq(5), 1460, now);
        let info = s.check_cookie(l, r, Seq(5), c, now).ok_or("refused")?;
        assert_eq!(info.mss, 1460);
        assert!(s.check_cookie(l, r, Seq(6), c, now).is_none());
        assert!(
            s.check_cookie(l, ep("10.0.0.2:40001"), Seq(5), c, now)
                .is_none()
        );
        assert!(s.check_cookie(l, r, Seq(5), c.plus(1), now).is_none());
        assert!(
            s.check_cookie(l, r, Seq(5), c, Instant::from_secs(1060))
                .is_some()
        );
        assert!(
            s.check_cookie(l, r, Seq(5), c, Instant::from_secs(1200))
                .is_none()
        );
        // An MSS between table entries rounds down.
        assert_eq!(s.cookie(l, r, Seq(5), 1300, now).0 >> 24 & 7, 2);
        Ok(())
    }
}
