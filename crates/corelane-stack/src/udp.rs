//! A UDP socket's two queues, sans-IO: datagrams received and not yet read, datagrams written
//! and not yet sent, each bounded in datagrams and in bytes. Buffers of sent and read
//! datagrams are kept for reuse, so a socket in steady use does not allocate.

use std::collections::VecDeque;
use std::task::Waker;

use smoltcp::time::Instant;
use smoltcp::wire::{IpAddress, IpEndpoint};

/// The largest UDP payload: 65535 less the 8-byte UDP header and a 20-byte IPv4 header.
pub const MAX_PAYLOAD: usize = 65_507;

/// Buffers kept for reuse per socket.
const SPARE: usize = 16;

/// One datagram and the peer it came from or goes to.
#[derive(Debug)]
pub(crate) struct Datagram {
    pub(crate) peer: IpEndpoint,
    pub(crate) data: Vec<u8>,
    /// Its two ECN bits: as received, or to send with (0: the socket's own).
    pub(crate) ecn: u8,
}

/// Counters of one UDP socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// Datagrams received and queued for the application.
    pub rx: u64,
    /// Datagrams sent.
    pub tx: u64,
    /// Datagrams received and dropped because the receive queue was full.
    pub rx_dropped: u64,
    /// Datagrams dropped because no route led to the peer, or its hardware address never
    /// came.
    pub tx_dropped: u64,
    /// Datagrams of a QUIC endpoint's socket handed to the core their connection ID names
    /// (the peer's address or port changed, and its datagrams landed on this core's queue).
    pub steered: u64,
}

impl std::ops::AddAssign for UdpStats {
    fn add_assign(&mut self, o: UdpStats) {
        self.rx += o.rx;
        self.tx += o.tx;
        self.rx_dropped += o.rx_dropped;
        self.tx_dropped += o.tx_dropped;
        self.steered += o.steered;
    }
}

/// A UDP socket's queues.
#[derive(Debug)]
pub(crate) struct UdpSock {
    rx: VecDeque<Datagram>,
    rx_bytes: usize,
    tx: VecDeque<Datagram>,
    tx_bytes: usize,
    spare: Vec<Vec<u8>>,
    max_packets: usize,
    max_bytes: usize,
    rx_waker: Option<Waker>,
    tx_waker: Option<Waker>,
    /// Datagrams whose next hop has not answered yet, each with its hop and since when it
    /// waits: set aside so the rest of the send queue goes on (as the kernel's per-neighbour
    /// queue, `unres_qlen`), at most [`PARK_PER_HOP`] per hop and a quarter of the queue in all.
    /// They still count against the send queue's bytes.
    parked: VecDeque<Parked>,
    /// The peer an ICMP "port unreachable" (or another hard error) last said refused a
    /// datagram from here, until taken: a connected socket's next call says so
    /// (`ECONNREFUSED`, as the kernel's).
    pub(crate) refused: Option<IpEndpoint>,
    /// The address the socket was bound to, which its datagrams leave from (None: the
    /// unspecified address, each datagram from the owned address routing picks).
    pub(crate) bound: Option<IpAddress>,
    /// A QUIC endpoint's socket: short-header datagrams go to the core their connection ID
    /// names (`Stack::udp_steer_quic`).
    pub(crate) steer: Option<crate::quic_cid::CidSteer>,
    pub(crate) stats: UdpStats,
}

/// A datagram waiting for its next hop's hardware address.
#[derive(Debug)]
pub(crate) struct Parked {
    pub(crate) hop: IpAddress,
    pub(crate) since: Instant,
    pub(crate) d: Datagram,
}

/// Most datagrams set aside for one next hop; past it the oldest is dropped.
pub(crate) const PARK_PER_HOP: usize = 4;

impl UdpSock {
    /// Queues of at most `packets` datagrams and `bytes` payload bytes each way.
    pub(crate) fn new(packets: usize, bytes: usize) -> Self {
        UdpSock {
            rx: VecDeque::new(),
            rx_bytes: 0,
            tx: VecDeque::new(),
            tx_bytes: 0,
            spare: Vec::new(),
            max_packets: packets.max(1),
            max_bytes: bytes.max(1),
            rx_waker: None,
            tx_waker: None,
            refused: None,
            bound: None,
            steer: None,
            parked: VecDeque::new(),
            stats: UdpStats::default(),
        }
    }

    /// The largest datagram the send queue can ever hold.
    pub(crate) fn send_capacity(&self) -> usize {
        self.max_bytes.min(MAX_PAYLOAD)
    }

    fn buffer(&mut self, data: &[u8]) -> Vec<u8> {
        let mut v = self.spare.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(data);
        v
    }

    fn recycle(&mut self, mut v: Vec<u8>) {
        // Keep ordinary-sized buffers only: a 64 KiB one would be held for good.
        if self.spare.len() < SPARE && v.capacity() <= 4096 {
            v.clear();
            self.spare.push(v);
        }
    }

    /// A datagram arrived from `peer`, with ECN bits `ecn`. False (dropped, counted) when the
    /// queue is full.
    pub(crate) fn received(&mut self, peer: IpEndpoint, data: &[u8], ecn: u8) -> bool {
        if self.rx.len() >= self.max_packets || self.rx_bytes + data.len() > self.max_bytes {
            self.stats.rx_dropped += 1;
            return false;
        }
        let data = self.buffer(data);
        self.rx_bytes += data.len();
        self.rx.push_back(Datagram { peer, data, ecn });
        self.stats.rx += 1;
        if let Some(w) = self.rx_waker.take() {
            w.wake();
        }
        true
    }

    /// The next datagram read into `buf`: the bytes copied and the sender. A datagram longer
    /// than `buf` is cut to it (the rest is lost), as a kernel UDP socket does. None when none
    /// waits.
    #[cfg(test)]
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> Option<(usize, IpEndpoint)> {
        let max = buf.len();
        self.read_with(max, &mut crate::copy::slice_put(buf))
    }

    /// The next datagram's first `max` bytes handed to `put` (once, also when empty), and the
    /// datagram taken from the queue.
    pub(crate) fn read_with(
        &mut self,
        max: usize,
        put: &mut dyn FnMut(&[u8]),
    ) -> Option<(usize, IpEndpoint)> {
        let d = self.rx.pop_front()?;
        self.rx_bytes -= d.data.len();
        let n = d.data.len().min(max);
        put(&d.data[..n]);
        let peer = d.peer;
        self.recycle(d.data);
        Some((n, peer))
    }

    /// The next datagram copied into `buf` (cut to it) and left in the queue.
    pub(crate) fn peek(&self, buf: &mut [u8]) -> Option<(usize, IpEndpoint)> {
        let max = buf.len();
        self.peek_with(max, &mut crate::copy::slice_put(buf))
    }

    /// As [`UdpSock::read_with`], leaving the datagram queued.
    pub(crate) fn peek_with(
        &self,
        max: usize,
        put: &mut dyn FnMut(&[u8]),
    ) -> Option<(usize, IpEndpoint)> {
        let d = self.rx.front()?;
        let n = d.data.len().min(max);
        put(&d.data[..n]);
        Some((n, d.peer))
    }

    /// True when the send queue has room for a datagram (of one byte, at least).
    pub(crate) fn has_room(&self) -> bool {
        self.tx.len() < self.max_packets && self.tx_bytes < self.max_bytes
    }

    /// The ECN bits of the next datagram to read (0 when none waits).
    pub(crate) fn front_ecn(&self) -> u8 {
        self.rx.front().map_or(0, |d| d.ecn)
    }

    /// Queues `data` for `peer`, with ECN bits `ecn` (0: the socket's). False when the send
    /// queue has no room for it now.
    pub(crate) fn write(&mut self, peer: IpEndpoint, data: &[u8], ecn: u8) -> bool {
        if self.tx.len() >= self.max_packets || self.tx_bytes + data.len() > self.max_bytes {
            return false;
        }
        let data = self.buffer(data);
        self.tx_bytes += data.len();
        self.tx.push_back(Datagram { peer, data, ecn });
        true
    }

    /// The peer of the datagram to send next.
    pub(crate) fn next_peer(&self) -> Option<IpEndpoint> {
        self.tx.front().map(|d| d.peer)
    }

    /// Takes the datagram to send next; it still counts against the queue's bytes until
    /// [`UdpSock::finish`] or [`UdpSock::unpop`].
    pub(crate) fn pop_out(&mut self) -> Option<Datagram> {
        self.tx.pop_front()
    }

    /// Puts back a datagram that could not go out yet.
    pub(crate) fn unpop(&mut self, d: Datagram) {
        self.tx.push_front(d);
    }

    /// A datagram taken with [`UdpSock::pop_out`] is done with: sent, or dropped when `sent`
    /// is false. A writer waiting for room is woken.
    pub(crate) fn finish(&mut self, d: Datagram, sent: bool) {
        self.tx_bytes -= d.data.len();
        self.recycle(d.data);
        if sent {
            self.stats.tx += 1;
        } else {
            self.stats.tx_dropped += 1;
        }
        if let Some(w) = self.tx_waker.take() {
            w.wake();
        }
    }

    /// Sets `d` (taken with [`UdpSock::pop_out`]) aside until `hop` answers, so that the
    /// datagrams behind it go on. A hop with [`PARK_PER_HOP`] waiting already loses its oldest
    /// (counted), and so does the socket's oldest when a quarter of its queue waits: what one
    /// silent neighbour holds never stalls the others' replies.
    pub(crate) fn park(&mut self, hop: IpAddress, d: Datagram, now: Instant) {
        let same = self.parked.iter().filter(|p| p.hop == hop).count();
        let full = self.parked.len() >= (self.max_packets / 4).max(1);
        if same >= PARK_PER_HOP || full {
            let i = if same >= PARK_PER_HOP {
                self.parked.iter().position(|p| p.hop == hop)
            } else {
                Some(0)
            };
            if let Some(old) = i.and_then(|i| self.parked.remove(i)) {
                self.finish(old.d, false);
            }
        }
        self.parked.push_back(Parked { hop, since: now, d });
    }

    /// Datagrams set aside, oldest first.
    pub(crate) fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Takes every datagram set aside (to be sent, set aside again or dropped).
    pub(crate) fn take_parked(&mut self) -> VecDeque<Parked> {
        std::mem::take(&mut self.parked)
    }

    /// Puts back what [`UdpSock::take_parked`] took and is still waiting.
    pub(crate) fn restore_parked(&mut self, mut still: VecDeque<Parked>) {
        still.append(&mut self.parked);
        self.parked = still;
    }

    /// Drops the datagram at the head of the send queue (counted).
    pub(crate) fn drop_out(&mut self) {
        if let Some(d) = self.tx.pop_front() {
            self.finish(d, false);
        }
    }

    /// Wakes a reader waiting for a datagram (to tell it something changed).
    pub(crate) fn wake_rx(&mut self) {
        if let Some(w) = self.rx_waker.take() {
            w.wake();
        }
    }

    pub(crate) fn set_rx_waker(&mut self, w: &Waker) {
        keep_waker(&mut self.rx_waker, w);
    }

    pub(crate) fn set_tx_waker(&mut self, w: &Waker) {
        keep_waker(&mut self.tx_waker, w);
    }
}

/// Keeps `w` in `slot`, reusing the waker already there when it wakes the same task.
pub(crate) fn keep_waker(slot: &mut Option<Waker>, w: &Waker) {
    match slot {
        Some(old) => old.clone_from(w),
        None => *slot = Some(w.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_are_bounded_in_datagrams_and_bytes_and_reuse_their_buffers() -> Result<(), String> {
        let mut s = UdpSock::new(2, 100);
        let peer = IpEndpoint::new(smoltcp::wire::IpAddress::v4(10, 0, 0, 2), 9);
        assert!(s.received(peer, &[1; 40], 0));
        assert!(s.received(peer, &[2; 40], 3));
        assert!(!s.received(peer, &[3; 1], 0), "two datagrams at most");
        assert_eq!(s.stats.rx_dropped, 1);
        let mut buf = [0u8; 64];
        assert_eq!(s.peek(&mut buf), Some((40, peer)));
        assert_eq!(s.read(&mut buf), Some((40, peer)), "peeked, still there");
        assert_eq!(buf[0], 1);
        assert_eq!(s.front_ecn(), 3, "the second came marked CE");
        let mut small = [0u8; 10];
        assert_eq!(s.read(&mut small), Some((10, peer)), "too long: cut");
        assert_eq!(small, [2; 10]);
        assert_eq!(s.read(&mut buf), None);
        assert_eq!(s.spare.len(), 2, "both buffers kept for reuse");
        assert!(s.write(peer, &[0; 60], 2));
        assert!(!s.write(peer, &[0; 60], 0), "100 bytes at most");
        let d = s.pop_out().ok_or("a datagram")?;
        assert_eq!((d.data.len(), d.ecn), (60, 2));
        s.finish(d, true);
        assert!(s.next_peer().is_none());
        assert_eq!(s.stats.tx, 1);
        assert_eq!(s.spare.len(), 2);
        Ok(())
    }
}
