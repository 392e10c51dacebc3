//! A smoltcp [`Device`] over a [`FrameIo`]: RX tokens read the UMEM frame in place, TX tokens
//! write straight into a UMEM frame, and frames move in batches with one kick per batch.

use std::collections::VecDeque;
use std::io;

use corelane_frame::FrameIo;
use smoltcp::phy::{Checksum, ChecksumCapabilities, Device, DeviceCapabilities, Medium};
use smoltcp::time::Instant;

use crate::classify::{Class, classify};
pub use crate::device_stats::DeviceStats;

/// Bytes of Ethernet header before the IP packet (the MTU counts from the IP header).
const ETH_HEADER: usize = 14;

/// Sees the frames a device takes from its queue and the frames it sends, while set (a packet
/// capture: see [`XdpDevice::set_tap`]). Frames handed over from another core are not seen
/// again: the core whose queue received them saw them.
pub trait Tap: Send {
    /// The time of the frames that follow, in Unix nanoseconds (set once per turn).
    fn clock(&mut self, unix_ns: u64);
    /// A frame received (`outbound` false) or about to be sent.
    fn frame(&mut self, outbound: bool, bytes: &[u8]);
}

/// The device. `B` is the batch size: frames pulled from the RX ring per call and sent per kick.
#[derive(Debug)]
pub struct XdpDevice<P: FrameIo> {
    io: P,
    incoming: VecDeque<P::Frame>,
    rx_ready: VecDeque<Pending<P::Frame>>,
    scratch: Vec<P::Frame>,
    rx_done: Vec<P::Frame>,
    tx_free: Vec<P::Frame>,
    tx_out: Vec<P::Frame>,
    batch: usize,
    mtu: usize,
    /// The VLAN tags every sent frame carries after its addresses, outermost first.
    tags: Tags,
    strict: bool,
    stats: DeviceStats,
    tap: Option<Box<dyn Tap>>,
    /// A received VLAN frame with its tags put back, for the tap.
    tap_buf: Vec<u8>,
    /// This device's hardware address: a frame sent to it comes back as received.
    own_mac: Option<[u8; 6]>,
    /// Frames sent to `own_mac` this batch, on their way back.
    looped: Vec<P::Frame>,
}

impl std::fmt::Debug for dyn Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tap")
    }
}

impl<P: FrameIo> XdpDevice<P> {
    /// Wraps `io`; `mtu` is the IP MTU of the link (1500 on a default veth).
    pub fn new(io: P, mtu: usize, batch: usize) -> Self {
        let batch = batch.clamp(1, 1024);
        XdpDevice {
            io,
            incoming: VecDeque::with_capacity(batch),
            rx_ready: VecDeque::with_capacity(batch),
            scratch: Vec::with_capacity(1),
            rx_done: Vec::with_capacity(batch),
            tx_free: Vec::with_capacity(batch),
            tx_out: Vec::with_capacity(batch),
            batch,
            mtu,
            tags: Tags::default(),
            strict: cfg!(debug_assertions),
            stats: DeviceStats::default(),
            tap: None,
            tap_buf: Vec::new(),
            own_mac: None,
            looped: Vec::new(),
        }
    }

    /// Frames sent to `mac` from now on come back to this device as received, never reaching
    /// the wire (a NIC does not send a frame back to the port it left): what makes a
    /// connection from the stack to one of its own addresses work. [`crate::Stack::new`] sets
    /// the stack's address.
    pub fn set_own_mac(&mut self, mac: [u8; 6]) {
        self.own_mac = Some(mac);
    }

    /// True when frames wait for the protocol stage (received, handed over, or looped back
    /// to this device by the last flush).
    pub fn rx_waiting(&self) -> bool {
        !self.rx_ready.is_empty()
    }

    /// Tags every frame sent from now on with 802.1Q VLAN `vid` (0: untagged). The frames the
    /// stack reads stay untagged: on receive the XDP program takes the tag off.
    pub fn set_vlan(&mut self, vid: u16) {
        self.set_vlans(0, vid);
    }

    /// Tags every frame sent from now on with 802.1Q VLAN `vid` inside 802.1ad service VLAN
    /// `svid` (QinQ: the outer tag 0x88a8, the inner 0x8100; either 0: that tag left out). The
    /// frames the stack reads stay untagged: on receive the XDP program takes the tags off.
    pub fn set_vlans(&mut self, svid: u16, vid: u16) {
        self.tags = Tags::new(svid, vid);
    }

    /// Starts (`Some`) or stops showing every frame received from the queue and sent to a
    /// [`Tap`]. Without one, the frame path pays one branch per batch.
    pub fn set_tap(&mut self, tap: Option<Box<dyn Tap>>) {
        self.tap = tap;
    }

    /// The tap, while one is set.
    pub fn tap_mut(&mut self) -> Option<&mut (dyn Tap + 'static)> {
        self.tap.as_deref_mut()
    }

    /// The frame I/O underneath.
    pub fn io(&self) -> &P {
        &self.io
    }

    /// The frame I/O underneath, mutably (for counters and accounting).
    pub fn io_mut(&mut self) -> &mut P {
        &mut self.io
    }

    /// The frame I/O, taken out of the device; the frames the device held go with it
    /// unreturned (a simulation's crash: the process's memory is gone).
    pub fn into_io(self) -> P {
        self.io
    }

    /// Counters so far.
    pub fn stats(&self) -> DeviceStats {
        self.stats
    }

    /// Reads the kernel's count of frames dropped before this side (may cost a system call)
    /// into [`DeviceStats::rx_ring_drops`], and returns it.
    pub fn read_rx_drops(&mut self) -> u64 {
        self.stats.rx_ring_drops = self.io.rx_drops();
        self.stats.rx_ring_drops
    }

    /// Whether a frame built longer than the MTU panics (true) or is dropped and counted in
    /// [`DeviceStats::tx_oversize`] (false). On in debug builds; tests and the simulation
    /// turn it on in release builds too.
    pub fn set_strict(&mut self, strict: bool) {
        self.strict = strict;
    }

    /// The IP MTU of the link.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// Frames pulled per RX batch and sent per kick.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Changes the batch size (1 to 1024) from the next pull on; see [`crate::BatchTuner`].
    pub fn set_batch(&mut self, batch: usize) {
        self.batch = batch.clamp(1, 1024);
    }

    /// Frames received and classified but not yet given to the protocol stage.
    pub fn rx_pending(&self) -> usize {
        self.rx_ready.len()
    }

    /// RX and classify stages: pulls up to one batch from the RX ring, verifies every frame, and
    /// keeps the ones that pass for the protocol stage. Returns how many frames were pulled.
    pub fn pull_batch(&mut self) -> usize {
        let n = self.recv_batch();
        self.classify_batch();
        n
    }

    /// RX stage alone: moves up to one batch from the RX ring; returns how many.
    pub fn recv_batch(&mut self) -> usize {
        let n = self.io.recv(&mut self.incoming, self.batch);
        self.stats.rx_frames += n as u64;
        if let Some(tap) = &mut self.tap {
            let fresh = self.incoming.len() - n;
            for f in self.incoming.iter().skip(fresh) {
                let bytes = self.io.bytes(f);
                if self.tags.len == 0 || bytes.len() < 12 {
                    tap.frame(false, bytes);
                    continue;
                }
                // The XDP program took the VLAN's tags off; a capture shows the frame as the
                // wire carried it, as it shows what this device sends.
                let tagged = &mut self.tap_buf;
                tagged.clear();
                tagged.extend_from_slice(&bytes[..12]);
                tagged.extend_from_slice(self.tags.bytes());
                tagged.extend_from_slice(&bytes[12..]);
                tap.frame(false, tagged);
            }
        }
        n
    }

    /// Classify stage alone: verifies the frames [`recv_batch`](Self::recv_batch) took and
    /// queues the ones that pass for the protocol stage.
    pub fn classify_batch(&mut self) {
        while let Some(f) = self.incoming.pop_front() {
            self.admit(f, 0);
        }
    }

    fn admit(&mut self, frame: P::Frame, hops: u8) {
        let bytes = self.io.bytes(&frame);
        if bytes.len() > self.mtu + ETH_HEADER {
            self.stats.rx_oversize += 1;
        }
        let class = classify(bytes);
        match class {
            Class::BadChecksum => self.stats.rx_bad_checksum += 1,
            Class::Malformed => self.stats.rx_malformed += 1,
            _ => {
                self.rx_ready.push_back(Pending { frame, class, hops });
                return;
            }
        }
        // Dropped frames go back to the fill ring with the processed ones.
        self.rx_done.push(frame);
    }

    /// Copies a frame that arrived on another core's queue into a frame of this UMEM and queues
    /// it for the protocol stage behind the frames already waiting. `hops` counts the cores it
    /// has been handed through. Returns false (and counts a drop) when no frame is free.
    pub fn inject(&mut self, bytes: &[u8], hops: u8) -> bool {
        if bytes.len() > self.io.frame_capacity() || self.io.alloc(&mut self.scratch, 1) == 0 {
            self.stats.rx_inject_dropped += 1;
            return false;
        }
        let Some(mut frame) = self.scratch.pop() else {
            self.stats.rx_inject_dropped += 1;
            return false;
        };
        self.io
            .bytes_mut(&mut frame, bytes.len())
            .copy_from_slice(bytes);
        self.stats.rx_injected += 1;
        self.admit(frame, hops);
        true
    }

    /// The class and hop count of the next frame waiting for the protocol stage.
    pub fn peek(&self) -> Option<(Class, u8)> {
        self.rx_ready.front().map(|p| (p.class, p.hops))
    }

    /// The bytes of the next frame waiting for the protocol stage.
    pub fn front_bytes(&self) -> Option<&[u8]> {
        self.rx_ready.front().map(|p| self.io.bytes(&p.frame))
    }

    /// The protocol stage is done with the next waiting frame (read in place through
    /// [`XdpDevice::front_bytes`]): it is counted as delivered and returns to the fill ring.
    pub fn consume(&mut self) {
        if let Some(p) = self.rx_ready.pop_front() {
            self.stats.rx_delivered += 1;
            self.rx_done.push(p.frame);
        }
    }

    /// Drops the next waiting frame without processing it (it returns to the fill ring).
    pub fn skip(&mut self) {
        if let Some(p) = self.rx_ready.pop_front() {
            self.rx_done.push(p.frame);
        }
    }

    /// TX, recycle and refill stages: sends queued frames with one kick, returns processed
    /// receive frames to the fill ring and reclaims completed transmit frames.
    pub fn flush(&mut self) -> io::Result<()> {
        if !self.tx_out.is_empty() {
            self.send_out()?;
        }
        if !self.rx_done.is_empty() {
            self.io.release(&mut self.rx_done);
        }
        self.io.complete()?;
        Ok(())
    }

    /// Gives every held frame back (spare transmit frames, unprocessed receive frames), so the
    /// frame accounting shows nothing in use. Call before checking the accounting on shutdown.
    pub fn drain(&mut self) -> io::Result<()> {
        self.flush()?;
        let mut rest: Vec<P::Frame> = self.rx_ready.drain(..).map(|p| p.frame).collect();
        self.io.release(&mut rest);
        self.io.free(&mut self.tx_free);
        self.io.complete()?;
        Ok(())
    }

    /// Sends the queued frames with one kick (the tap sees them first).
    fn send_out(&mut self) -> io::Result<usize> {
        if let Some(tap) = &mut self.tap {
            for f in &self.tx_out {
                tap.frame(true, self.io.bytes(f));
            }
        }
        if let Some(mac) = self.own_mac {
            self.loop_back(mac);
            if self.tx_out.is_empty() {
                return Ok(0);
            }
        }
        self.stats.tx_batches += 1;
        self.io.send(&mut self.tx_out)
    }

    /// Takes the frames addressed to `mac` out of the transmit batch (the others keep their
    /// order) and queues them for the protocol stage, their VLAN tags taken off as the XDP
    /// program takes them off a received frame.
    fn loop_back(&mut self, mac: [u8; 6]) {
        let io = &self.io;
        let ours = |f: &P::Frame| io.bytes(f).get(..6) == Some(&mac[..]);
        if !self.tx_out.iter().any(ours) {
            return;
        }
        self.looped.extend(self.tx_out.extract_if(.., |f| ours(f)));
        let mut looped = std::mem::take(&mut self.looped);
        for mut frame in looped.drain(..) {
            let tag = self.tags.len;
            if tag > 0 {
                let bytes = self.io.bytes(&frame);
                let mut plain = Vec::with_capacity(bytes.len().saturating_sub(tag));
                plain.extend_from_slice(&bytes[..12.min(bytes.len())]);
                plain.extend_from_slice(bytes.get(12 + tag..).unwrap_or_default());
                self.io
                    .bytes_mut(&mut frame, plain.len())
                    .copy_from_slice(&plain);
            }
            self.stats.looped += 1;
            self.admit(frame, 0);
        }
        self.looped = looped;
    }

    fn ensure_tx_frame(&mut self) -> bool {
        if self.tx_out.len() >= self.batch
            && let Err(e) = self.send_out()
        {
            tracing::warn!("transmit kick failed: {e}");
        }
        if self.tx_free.is_empty() && self.io.alloc(&mut self.tx_free, self.batch) == 0 {
            // Reclaim completed frames and try once more.
            let _ = self.io.complete();
            self.io.alloc(&mut self.tx_free, self.batch);
        }
        !self.tx_free.is_empty()
    }
}

/// A classified frame waiting for the protocol stage.
#[derive(Debug)]
struct Pending<F> {
    frame: F,
    class: Class,
    hops: u8,
}

/// A received frame, read in place.
#[derive(Debug)]
pub struct RxToken<'a, P: FrameIo> {
    io: &'a P,
    frame: P::Frame,
    done: &'a mut Vec<P::Frame>,
}

impl<P: FrameIo> smoltcp::phy::RxToken for RxToken<'_, P> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        let r = f(self.io.bytes(&self.frame));
        self.done.push(self.frame);
        r
    }
}

/// A transmit slot: smoltcp writes the frame straight into UMEM.
#[derive(Debug)]
pub struct TxToken<'a, P: FrameIo> {
    io: &'a P,
    free: &'a mut Vec<P::Frame>,
    out: &'a mut Vec<P::Frame>,
    stats: &'a mut DeviceStats,
    /// The longest frame the link carries.
    max_frame: usize,
    /// The tags to insert after the addresses.
    tags: Tags,
    strict: bool,
    /// The device's own address: a frame to it comes back as received, its checksum whole.
    own_mac: Option<[u8; 6]>,
}

impl<P: FrameIo> smoltcp::phy::TxToken for TxToken<'_, P> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        self.write(len, false, |buf, _| (f(buf), None))
    }
}

impl<P: FrameIo> TxToken<'_, P> {
    /// Writes a TCP or UDP frame of `len` bytes whose checksum the device may finish: `f` is
    /// told whether it may, and then stores the pseudo-header's sum in the checksum field and
    /// returns where the sum starts and the field's offset from there. The device finishes
    /// it, or this does when the device cannot for this frame (or it comes back as received).
    pub(crate) fn write_offloading(
        self,
        len: usize,
        f: impl FnOnce(&mut [u8], bool) -> Option<(usize, usize)>,
    ) {
        let offload = self.tags.len == 0 && self.io.checksum_offload();
        self.write(len, offload, |buf, may| ((), f(buf, may)));
    }

    fn write<R>(
        self,
        len: usize,
        offload: bool,
        f: impl FnOnce(&mut [u8], bool) -> (R, Option<(usize, usize)>),
    ) -> R {
        if len > self.max_frame {
            // Nothing may leave longer than the MTU: a real link drops it, or a router
            // answers "too big" and shrinks the path for nothing.
            assert!(
                !self.strict,
                "a {len}-byte frame exceeds the link's MTU ({} bytes with the Ethernet header)",
                self.max_frame
            );
            self.stats.tx_oversize += 1;
            let mut scratch = vec![0u8; len];
            return f(&mut scratch, false).0;
        }
        let tag = self.tags.len;
        match self.free.pop() {
            Some(mut frame) if len + tag <= self.io.frame_capacity() => {
                let buf = self.io.bytes_mut(&mut frame, len + tag);
                let (r, partial) = f(&mut buf[tag..], offload);
                let looped = partial.is_some() && self.own_mac.is_some_and(|m| buf[..6] == m);
                if tag != 0 {
                    self.tags.insert(buf);
                }
                if let Some((start, offset)) = partial {
                    if !looped && self.io.finish_checksum(&mut frame, start, offset) {
                        self.stats.tx_checksum_offloaded += 1;
                    } else {
                        // Offered but refused for this frame (tagged frames are never offered).
                        let buf = self.io.bytes_mut(&mut frame, len);
                        let c = crate::tcp::wire::inet_checksum(&buf[start..]);
                        buf[start + offset..start + offset + 2].copy_from_slice(&c.to_ne_bytes());
                    }
                }
                self.out.push(frame);
                self.stats.tx_frames += 1;
                r
            }
            other => {
                // No frame (or too large): let smoltcp build the packet into scratch space and
                // drop it; TCP retransmits.
                if let Some(frame) = other {
                    self.free.push(frame);
                }
                self.stats.tx_no_frame += 1;
                let mut scratch = vec![0u8; len];
                f(&mut scratch, false).0
            }
        }
    }
}

/// The VLAN tags a device's frames carry after their addresses, outermost first, as on the
/// wire: none, one 802.1Q tag, or an 802.1ad service tag (QinQ) and the 802.1Q tag inside it.
#[derive(Debug, Clone, Copy, Default)]
struct Tags {
    wire: [u8; 8],
    len: usize,
}

impl Tags {
    fn new(svid: u16, vid: u16) -> Tags {
        let mut t = Tags::default();
        for (tpid, id) in [(0x88a8u16, svid & 0x0fff), (0x8100, vid & 0x0fff)] {
            if id != 0 {
                t.wire[t.len..t.len + 2].copy_from_slice(&tpid.to_be_bytes());
                t.wire[t.len + 2..t.len + 4].copy_from_slice(&id.to_be_bytes());
                t.len += 4;
            }
        }
        t
    }

    fn bytes(&self) -> &[u8] {
        &self.wire[..self.len]
    }

    /// Turns `buf`, an untagged frame written at offset `len`, into the same frame with the
    /// tags between its addresses and its EtherType.
    fn insert(&self, buf: &mut [u8]) {
        if buf.len() < 12 + 2 * self.len {
            return;
        }
        buf.copy_within(self.len..self.len + 12, 0);
        buf[12..12 + self.len].copy_from_slice(self.bytes());
    }
}

impl<P: FrameIo> Device for XdpDevice<P> {
    type RxToken<'a>
        = RxToken<'a, P>
    where
        Self: 'a;
    type TxToken<'a>
        = TxToken<'a, P>
    where
        Self: 'a;

    fn receive(&mut self, _timestamp: Instant) -> Option<(RxToken<'_, P>, TxToken<'_, P>)> {
        if self.rx_ready.is_empty() {
            return None;
        }
        self.ensure_tx_frame();
        let frame = self.rx_ready.pop_front()?.frame;
        self.stats.rx_delivered += 1;
        Some((
            RxToken {
                io: &self.io,
                frame,
                done: &mut self.rx_done,
            },
            TxToken {
                io: &self.io,
                free: &mut self.tx_free,
                out: &mut self.tx_out,
                stats: &mut self.stats,
                max_frame: self.mtu + ETH_HEADER,
                tags: self.tags,
                strict: self.strict,
                own_mac: self.own_mac,
            },
        ))
    }

    fn transmit(&mut self, _timestamp: Instant) -> Option<TxToken<'_, P>> {
        if !self.ensure_tx_frame() {
            self.stats.tx_no_frame += 1;
            return None;
        }
        Some(TxToken {
            io: &self.io,
            free: &mut self.tx_free,
            out: &mut self.tx_out,
            stats: &mut self.stats,
            max_frame: self.mtu + ETH_HEADER,
            tags: self.tags,
            strict: self.strict,
            own_mac: self.own_mac,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = (self.mtu + 14).min(self.io.frame_capacity());
        caps.max_burst_size = Some(self.batch);
        // IPv4, TCP and UDP checksums are verified by the classify stage; smoltcp only computes
        // them on transmit. ICMP checksums are still verified by smoltcp.
        let mut cs = ChecksumCapabilities::default();
        cs.ipv4 = Checksum::Tx;
        cs.tcp = Checksum::Tx;
        cs.udp = Checksum::Tx;
        caps.checksum = cs;
        caps
    }
}
