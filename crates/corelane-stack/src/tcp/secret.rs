//! What must not be guessable: initial sequence numbers (RFC 6528), timestamp offsets and SYN
//! cookies (RFC 4987), all from SipHash-2-4 keyed with a per-stack secret.
//!
//! ISN = M + F(local, remote, secret), M a clock ticking every 4 µs: a blind attacker cannot
//! predict another connection's ISN, and a new incarnation of the same four-tuple starts above
//! the last one.

use smoltcp::time::Instant;
use smoltcp::wire::IpEndpoint;

use super::seq::Seq;

/// SipHash-2-4 (Aumasson and Bernstein, 2012) over a short message of 64-bit words.
fn siphash(k: (u64, u64), words: &[u64]) -> u64 {
    let mut v = [
        k.0 ^ 0x736f_6d65_7073_6575,
        k.1 ^ 0x646f_7261_6e64_6f6d,
        k.0 ^ 0x6c79_6765_6e65_7261,
        k.1 ^ 0x7465_6462_7974_6573,
    ];
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }
    let compress = |m: u64, v: &mut [u64; 4]| {
        v[3] ^= m;
        round(v);
        round(v);
        v[0] ^= m;
    };
    for &w in words {
        compress(w, &mut v);
    }
    // The final block: the message length in bytes in the top byte.
    compress(((words.len() * 8) as u64) << 56, &mut v);
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

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

/// The per-stack secret.
#[derive(Clone)]
pub(crate) struct Secret {
    key: (u64, u64),
}

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
    /// A secret from a 64-bit seed (the stack's seed, itself from the OS unless fixed).
    pub(crate) fn new(seed: u64) -> Secret {
        let a = seed ^ 0x5163_7a1e_0f3c_2b9d;
        let b = siphash((seed, !seed), &[0x006b_6579]);
        Secret { key: (a, b) }
    }

    /// The SipHash key, for a program that makes this stack's cookies on its behalf.
    pub(crate) fn key(&self) -> (u64, u64) {
        self.key
    }

    /// RFC 6528's initial sequence number for a connection.
    pub(crate) fn isn(&self, local: IpEndpoint, remote: IpEndpoint, now: Instant) -> Seq {
        let f = siphash(self.key, &words(local, remote, 1)) as u32;
        let m = (now.total_micros().max(0) as u64 / 4) as u32;
        Seq(f.wrapping_add(m))
    }

    /// The timestamp offset of a four-tuple (RFC 7323 section 5.4): the same for every
    /// incarnation of the four-tuple, so timestamps stay monotonic across them.
    pub(crate) fn ts_offset(&self, local: IpEndpoint, remote: IpEndpoint) -> u32 {
        siphash(self.key, &words(local, remote, 2)) as u32
    }

    fn cookie_hash(&self, local: IpEndpoint, remote: IpEndpoint, peer_isn: Seq, tick: u64) -> u32 {
        let extra = 3 | u64::from(peer_isn.0) << 8 | (tick & 31) << 40;
        (siphash(self.key, &words(local, remote, extra)) as u32) & 0x00ff_ffff
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
    fn siphash_matches_the_reference_vector() {
        // The reference implementation's test table: key 00..0f, the 8-byte message 00..07
        // (whole words only here) hashes to 93f5f5799a932462, and the empty one to
        // 726fdb47dd0e0e31.
        let k0 = u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]);
        let k1 = u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]);
        let m = u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(siphash((k0, k1), &[m]), 0x93f5_f579_9a93_2462);
        assert_eq!(siphash((k0, k1), &[]), 0x726f_db47_dd0e_0e31);
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
