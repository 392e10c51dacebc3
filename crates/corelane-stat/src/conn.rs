//! One TCP connection as a core publishes it: sixteen words per entry.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use crate::CONN_WORDS;

/// The TCP states, in the order a connection entry encodes them.
pub const TCP_STATES: [&str; 11] = [
    "CLOSED",
    "LISTEN",
    "SYN-SENT",
    "SYN-RECEIVED",
    "ESTABLISHED",
    "FIN-WAIT-1",
    "FIN-WAIT-2",
    "CLOSE-WAIT",
    "CLOSING",
    "LAST-ACK",
    "TIME-WAIT",
];

/// One TCP connection as a core published it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conn {
    /// The core that holds it.
    pub core: usize,
    /// Index into [`TCP_STATES`].
    pub state: u8,
    /// This side.
    pub local: SocketAddr,
    /// The peer.
    pub remote: SocketAddr,
    /// Payload bytes received.
    pub bytes_in: u64,
    /// Payload bytes sent.
    pub bytes_out: u64,
    /// Segments retransmitted.
    pub retrans: u64,
    /// Smoothed RTT, once measured.
    pub srtt: Option<Duration>,
    /// RTT variation, once measured.
    pub rttvar: Option<Duration>,
    /// Congestion window, bytes.
    pub cwnd: u64,
    /// Bytes written and not yet acknowledged.
    pub send_queue: u64,
    /// Bytes received and not yet read.
    pub recv_queue: u64,
    /// The peer's window, bytes.
    pub snd_window: u64,
    /// This side's receive window, bytes.
    pub rcv_window: u64,
}

impl Conn {
    /// The state's name.
    pub fn state_name(&self) -> &'static str {
        TCP_STATES.get(self.state as usize).copied().unwrap_or("?")
    }

    pub(crate) fn encode(&self) -> [u64; CONN_WORDS] {
        let ip16 = |a: IpAddr| match a {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        };
        let (l, r) = (ip16(self.local.ip()), ip16(self.remote.ip()));
        let half = |b: &[u8; 16], i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let v6 = u64::from(self.local.is_ipv6());
        let dur = |d: Option<Duration>| d.map_or(u64::MAX, |d| d.as_micros() as u64);
        [
            v6 | (u64::from(self.state) << 8) | ((self.core as u64) << 16),
            u64::from(self.local.port()) | (u64::from(self.remote.port()) << 16),
            half(&l, 0),
            half(&l, 1),
            half(&r, 0),
            half(&r, 1),
            self.bytes_in,
            self.bytes_out,
            self.retrans,
            dur(self.srtt),
            dur(self.rttvar),
            self.cwnd,
            self.send_queue,
            self.recv_queue,
            self.snd_window,
            self.rcv_window,
        ]
    }

    pub(crate) fn decode(w: &[u64; CONN_WORDS]) -> Conn {
        let v6 = w[0] & 1 == 1;
        let ip = |a: u64, b: u64| -> IpAddr {
            let mut o = [0u8; 16];
            o[..8].copy_from_slice(&a.to_le_bytes());
            o[8..].copy_from_slice(&b.to_le_bytes());
            let v = Ipv6Addr::from(o);
            match v.to_ipv4_mapped() {
                Some(v4) if !v6 => IpAddr::V4(v4),
                _ => IpAddr::V6(v),
            }
        };
        let dur = |x: u64| (x != u64::MAX).then(|| Duration::from_micros(x));
        Conn {
            core: ((w[0] >> 16) & 0xffff) as usize,
            state: ((w[0] >> 8) & 0xff) as u8,
            local: SocketAddr::new(ip(w[2], w[3]), (w[1] & 0xffff) as u16),
            remote: SocketAddr::new(ip(w[4], w[5]), ((w[1] >> 16) & 0xffff) as u16),
            bytes_in: w[6],
            bytes_out: w[7],
            retrans: w[8],
            srtt: dur(w[9]),
            rttvar: dur(w[10]),
            cwnd: w[11],
            send_queue: w[12],
            recv_queue: w[13],
            snd_window: w[14],
            rcv_window: w[15],
        }
    }
}
