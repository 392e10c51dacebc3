//! SYN cookies answered outside the stack: what a program that answers SYNs on this stack's
//! behalf (corelane's XDP program, under a flood) needs to send the SYN-ACK the stack's own
//! cookie path would, and which listeners are flooded now.

use smoltcp::wire::{IpAddress, Ipv4Address, Ipv6Address};

use smoltcp::time::{Duration, Instant};

use super::{DEFAULT_TTL, Stack};

/// How long after a listener's last cookie an ACK may still carry one: two ticks of the
/// cookie clock (`secret.rs`), the most a cookie is accepted for.
pub(super) const COOKIE_LIFE: Duration = Duration::from_secs(128);

/// The SYN-ACK of a cookie, as this stack would send it over IPv4 and IPv6 (`cookie_syn_ack`): the key
/// its cookies are made with and the fields and options it carries. Whoever holds the key can
/// forge cookies for this stack: it goes only to the program that answers for it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SynCookieTemplate {
    /// The SipHash key of the stack's cookies.
    pub key: (u64, u64),
    /// The SipHash key of its timestamp offsets (TSval = milliseconds + the offset).
    pub ts_key: (u64, u64),
    /// The interface's hardware address (the SYN-ACK's source).
    pub mac: [u8; 6],
    /// This side's MSS over IPv4.
    pub mss: u16,
    /// This side's MSS over IPv6.
    pub mss6: u16,
    /// The window field.
    pub window: u16,
    /// This side's window scale (sent when the SYN had timestamps and a window scale).
    pub wscale: u8,
    /// Timestamps are answered (and carry the peer's window scale and SACK-permitted).
    pub timestamps: bool,
    /// SACK is enabled.
    pub sack: bool,
    /// The IPv4 TTL.
    pub ttl: u8,
}

impl std::fmt::Debug for SynCookieTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SynCookieTemplate")
            .field("mss", &self.mss)
            .field("mss6", &self.mss6)
            .field("window", &self.window)
            .field("wscale", &self.wscale)
            .field("timestamps", &self.timestamps)
            .field("sack", &self.sack)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Stack {
    /// The keys of a QUIC endpoint on this stack, 256 bits each, drawn from the stack's
    /// master key (`StackConfig::key`: every core of a run, and the next process of an
    /// upgrade, has the same): its stateless reset key (from `StackConfig::restart_key` when
    /// set, so the next process of the host resets the last one's connections in words their
    /// peers recognise) and its address-validation token key.
    pub fn quic_keys(&self) -> ([u8; 32], [u8; 32]) {
        self.secret.quic_keys()
    }

    /// What a program answering SYNs for this stack needs (see [`SynCookieTemplate`]), or
    /// None when the stack sends no cookies (`TcpConfig::syn_cookies` off).
    pub fn syn_cookie_template(&self) -> Option<SynCookieTemplate> {
        if !self.cfg.tcp.syn_cookies {
            return None;
        }
        let sizes = self.sizes(IpAddress::Ipv4(Ipv4Address::UNSPECIFIED));
        let (window, wscale) = crate::tcp::cookie_window(&self.cfg.tcp, sizes);
        Some(SynCookieTemplate {
            key: self.secret.key(),
            ts_key: self.secret.ts_key(),
            mac: self.mac,
            mss: sizes.mss,
            mss6: self.sizes(IpAddress::Ipv6(Ipv6Address::UNSPECIFIED)).mss,
            window,
            wscale,
            timestamps: self.cfg.tcp.timestamps,
            sack: self.cfg.tcp.sack,
            ttl: DEFAULT_TTL,
        })
    }

    /// A listener on `port` answered a SYN with a cookie: its backlog is full.
    pub(super) fn note_cookie_port(&mut self, now: Instant, port: u16) {
        self.cookies_sent_for(port, now);
        if !self.cookie_ports.contains(&port) {
            self.cookie_ports.push(port);
        }
    }

    /// SYN cookies were sent for the listener on `port` at `now` by someone else on this
    /// stack's behalf (the XDP program, see [`Stack::syn_cookie_template`]): ACKs carrying
    /// cookies are checked for it for the next two minutes. Outside such a window an ACK that
    /// matches no connection is not checked as a cookie at all (one table lookup, no keyed
    /// hash), as Linux checks cookies only after a recent overflow.
    pub fn cookies_sent_for(&mut self, port: u16, now: Instant) {
        if let Some(l) = self.listeners.get_mut(&port) {
            l.cookies_until = Some(now + COOKIE_LIFE);
        }
    }

    /// Moves the ports of the listeners that answered SYNs with cookies since the last call
    /// into `out` (a runtime may then have them answered before the stack, see
    /// [`Stack::syn_cookie_template`]).
    pub fn take_cookie_ports(&mut self, out: &mut Vec<u16>) {
        out.append(&mut self.cookie_ports);
    }
}
