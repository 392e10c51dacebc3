//! What the steering program needs to answer SYNs with the stack's SYN cookies, as the map
//! holds it, and the clock it reads.

/// What the program needs to answer SYNs with the stack's SYN cookies (`struct cookie_cfg` in
/// `crates/corelane-xsk/xdp/corelane.bpf.c`, field for field): the stack's secret key, its clock, and the options
/// its own cookie SYN-ACK would carry. Whoever holds the key can forge cookies for the stack.
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct CookieParams {
    /// The SipHash key of the stack's cookies.
    pub k0: u64,
    /// Its second half.
    pub k1: u64,
    /// The stack's time zero on `CLOCK_MONOTONIC`, nanoseconds ([`monotonic_ns`]).
    pub epoch_ns: u64,
    /// This side's MSS over IPv4.
    pub mss: u16,
    /// The SYN-ACK's window field.
    pub window: u16,
    /// This side's window scale.
    pub wscale: u8,
    /// 1: answer timestamps (the peer's window scale and SACK-permitted ride in TSval).
    pub timestamps: u8,
    /// 1: SACK is enabled.
    pub sack: u8,
    /// The IPv4 TTL.
    pub ttl: u8,
    /// The SipHash key of the stack's timestamp offsets (a key of its own: the cookie key
    /// tells nothing of it, nor it of the cookie key).
    pub ts_k0: u64,
    /// Its second half.
    pub ts_k1: u64,
    /// The interface's hardware address, the SYN-ACK's source.
    pub mac: [u8; 6],
    /// This side's MSS over IPv6 (0: IPv6 SYNs are left to the stack).
    pub mss6: u16,
}

impl std::fmt::Debug for CookieParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CookieParams")
            .field("epoch_ns", &self.epoch_ns)
            .field("mss", &self.mss)
            .field("mss6", &self.mss6)
            .field("window", &self.window)
            .field("wscale", &self.wscale)
            .field("timestamps", &self.timestamps)
            .field("sack", &self.sack)
            .field("ttl", &self.ttl)
            .field("mac", &self.mac)
            .finish_non_exhaustive()
    }
}

#[allow(unsafe_code)]
// SAFETY: CookieParams is repr(C), made of integers and byte arrays only with no padding
// (3 x 8 + 2 x 2 + 4 x 1 = 32 bytes, then 2 x 8 and 6 + 2 = 56 bytes, `mss6` at 54, every field at a
// multiple of its alignment), so every bit pattern is a valid value and it can be copied to
// and from a map.
unsafe impl aya::Pod for CookieParams {}

/// `t` on `CLOCK_MONOTONIC` (the clock `std::time::Instant` and `bpf_ktime_get_ns` read), in
/// nanoseconds.
pub fn monotonic_ns(t: std::time::Instant) -> u64 {
    let now = std::time::Instant::now();
    let mono = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|ts| ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64)
        .unwrap_or(0);
    mono.saturating_sub(now.saturating_duration_since(t).as_nanos() as u64)
}
