//! One AF_XDP socket bound to one queue, with its own UMEM, rings and frame ledger.

#![allow(unsafe_code)] // The UMEM and its rings are memory shared with the kernel.

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;

use corelane_frame::{Frame, FrameCounts, FrameIo, FramePool, FrameState, UmemId};

mod af_xdp;
mod chain;
mod config;
mod exchange;
mod join;
mod offload;
mod open;
mod partner;
mod ring;
mod shared;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
#[cfg(any(test, feature = "sim"))]
mod sim_port;
pub use af_xdp::KernelStats;
use af_xdp::XdpSocket;
use chain::Chain;
pub use chain::MAX_PIECES;
pub use config::{BindMode, XskConfig, ZeroCopy};
pub use exchange::Phase as UpgradePhase;
pub use join::{PendingJoin, frames_in_two_hands};
use partner::Partner;
pub use partner::{CallOff, UpgradeOffer};
use ring::{Consumer, Desc, Producer, Region};

/// The kernel's headroom in front of every received packet (`XDP_PACKET_HEADROOM`).
const HEADROOM: u64 = 256;

/// The steering program's receive stamp (`struct rx_stamp`), the XDP metadata right before a
/// steered packet: this magic, 4 bytes of padding, then `bpf_ktime_get_ns` when it ran.
const RX_STAMP_MAGIC: u32 = 0x636c_7374;
const RX_STAMP_LEN: u64 = 16;

/// A frame of an [`XskQueue`].
#[derive(Debug)]
pub struct XskFrame {
    desc: Desc,
    umem: UmemId,
    index: u32,
    /// A packet longer than one frame: its bytes, and the frames after this one.
    chain: Option<Box<Chain>>,
}

impl Frame for XskFrame {
    fn umem(&self) -> UmemId {
        self.umem
    }
    fn index(&self) -> usize {
        self.index as usize
    }
    fn len(&self) -> usize {
        match &self.chain {
            Some(c) => c.bytes.len(),
            None => self.desc.len as usize,
        }
    }
}

/// Counters of one queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XskStats {
    /// Frames received.
    pub rx_frames: u64,
    /// Frames queued for transmit.
    pub tx_frames: u64,
    /// TX kicks (sendto calls).
    pub tx_kicks: u64,
    /// Frames dropped because the TX ring was full (or, for a packet spanning frames, the
    /// UMEM had no free frames for its pieces).
    pub tx_ring_full: u64,
    /// Fill-ring wakeups.
    pub fill_wakeups: u64,
    /// Kicks given to a driver that held frames to send for [`TX_NUDGE_AFTER`] without
    /// completing any or asking for a wakeup.
    pub tx_nudges: u64,
}

/// How long frames may sit in the TX ring with nothing completed before the driver is kicked
/// whether or not it asked for a wakeup. A zero-copy driver that stopped sending without
/// setting the ring's need-wakeup flag (virtio_net on a starved guest: its watchdog said the
/// transmit queue timed out, and nothing went out until the socket closed) would otherwise
/// hold them until the socket closes.
pub const TX_NUDGE_AFTER: std::time::Duration = std::time::Duration::from_millis(1);

/// An AF_XDP socket on one queue of one interface, owning its UMEM.
///
/// Frames are split between receive (kept in the fill ring, topped up on every
/// [`FrameIo::complete`]) and transmit (allocated from the free list). The XDP program must
/// redirect this queue to the socket: see [`Steering::register`](crate::Steering::register).
pub struct XskQueue {
    // Field order matters for drop: rings and socket before the UMEM.
    rx: Consumer<Desc>,
    tx: Producer<Desc>,
    fq: Producer<u64>,
    cq: Consumer<u64>,
    socket: XdpSocket,
    umem: Region,
    id: UmemId,
    frames: u32,
    pool: FramePool,
    scratch: Vec<Desc>,
    addrs: Vec<u64>,
    post: Vec<u32>,
    frame_size: usize,
    /// The largest packet: one frame's capacity, or `max_packet` with multi-buffer.
    max_packet: usize,
    /// A chained packet whose last piece has not been read yet.
    partial: Option<XskFrame>,
    /// The next batch received is to have its first frame's receive stamp read
    /// ([`XskQueue::want_rx_stamp`]), and what was read.
    stamp_wanted: Option<u64>,
    stamp: Option<u64>,
    /// Since when frames were in transmit with nothing completed (None: progress).
    tx_stalled_since: Option<std::time::Instant>,
    /// Gather buffers of chained packets done with, for the next ones. Boxed as a frame holds
    /// them, so that reusing one allocates nothing.
    #[allow(clippy::vec_box)]
    spare_chains: Vec<Box<Chain>>,
    ring_size: u32,
    mode: BindMode,
    queue_id: u32,
    fd: RawFd,
    send_buffer: usize,
    stats: XskStats,
    /// The other process of an upgrade, while two share this queue.
    partner: Option<Box<Partner>>,
    /// Whether this socket fills the fill ring and consumes the completion ring (one sharer does).
    owns_rings: bool,
    /// Frames may leave their checksum to the kernel (`offload.rs`).
    tx_checksum: bool,
}

/// What a bound socket is made of.
struct Parts {
    socket: XdpSocket,
    rx: Consumer<Desc>,
    tx: Producer<Desc>,
    fq: Producer<u64>,
    cq: Consumer<u64>,
    umem: Region,
}

impl std::fmt::Debug for XskQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskQueue")
            .field("queue_id", &self.queue_id)
            .field("mode", &self.mode)
            .field("fd", &self.fd)
            .field("frames", &self.pool.len())
            .finish_non_exhaustive()
    }
}

impl XskQueue {
    /// The descriptor of frame `index`, ready to be written and sent (its packet starts after
    /// the kernel's headroom, as a received one does).
    fn template(&self, index: u32) -> Desc {
        Desc {
            addr: u64::from(index) * self.frame_size as u64 + HEADROOM,
            len: 0,
            options: 0,
        }
    }

    /// Copy or zero-copy, as the kernel reports the bound socket.
    pub fn mode(&self) -> BindMode {
        self.mode
    }

    /// The queue this socket is bound to.
    pub fn queue_id(&self) -> u32 {
        self.queue_id
    }

    /// The bytes of copy-mode frames this socket may have in flight (`SO_SNDBUF` as the kernel
    /// granted it): sized for every TX slot when the opener holds CAP_NET_ADMIN, else capped by
    /// `net.core.wmem_max`.
    pub fn send_buffer(&self) -> usize {
        self.send_buffer
    }

    /// The socket's descriptor, to register in the XSKMAP and to poll on.
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// Whether the queue is the in-memory kernel's (its descriptor a memory file, nothing to
    /// sleep on), not an AF_XDP socket's.
    #[cfg(any(test, feature = "sim"))]
    pub fn in_memory(&self) -> bool {
        self.socket.sim_id().is_some()
    }

    /// Counters so far.
    pub fn stats(&self) -> XskStats {
        self.stats
    }

    /// The kernel's counters for this socket (drops for a full RX ring or an empty fill ring).
    pub fn kernel_stats(&self) -> io::Result<KernelStats> {
        self.socket.statistics()
    }

    /// Blocks until a frame arrives or `timeout_ms` passes (-1: forever). Returns true when the
    /// RX ring has frames.
    pub fn wait(&mut self, timeout_ms: i32) -> io::Result<bool> {
        self.socket.poll_readable(timeout_ms)
    }

    /// The frame an address from a ring names; one past the UMEM (which only a corrupted ring
    /// could hold) maps to `u32::MAX`, which every ledger move refuses, never to a frame it
    /// would alias after truncation.
    fn index_of(&self, addr: u64) -> u32 {
        let i = addr / self.frame_size as u64;
        if i < u64::from(self.frames) {
            i as u32
        } else {
            u32::MAX
        }
    }

    /// Reads the next received batch's first receive stamp: when the steering program saw that
    /// frame ([`XskQueue::take_rx_stamp`]). A stamp older than `not_before` (nanoseconds of
    /// `CLOCK_MONOTONIC`: a moment the frame cannot have arrived before, such as the start of
    /// the last turn that found the RX ring empty) is not this use's: a frame that carried a
    /// stamp once and comes back without one (a driver or path without metadata) still holds
    /// it in its headroom.
    pub fn want_rx_stamp(&mut self, not_before: u64) {
        self.stamp_wanted = Some(not_before);
        self.stamp = None;
    }

    /// The receive stamp read since [`XskQueue::want_rx_stamp`]: when the steering program
    /// steered the first frame of the batch received after it, in nanoseconds of
    /// `CLOCK_MONOTONIC` (the clock `bpf_ktime_get_ns` and [`crate::monotonic_ns`] read). None
    /// when no batch came, or its frame carried no stamp (a driver without XDP metadata). The
    /// request ends here either way.
    pub fn take_rx_stamp(&mut self) -> Option<u64> {
        self.stamp_wanted = None;
        self.stamp.take()
    }

    /// The stamp in front of the packet at `addr` of a frame user space now holds (its magic
    /// cleared, so that no later read takes it; the frames not read keep theirs, which
    /// `not_before` tells from a fresh one).
    fn read_stamp(&self, addr: u64) -> Option<u64> {
        let at = addr.checked_sub(RX_STAMP_LEN)?;
        if addr % (self.frame_size as u64) < RX_STAMP_LEN {
            return None;
        }
        // SAFETY: the frame at `addr` came off this socket's RX ring and its handle was just
        // made (take_rx): user space holds it and no slice of its bytes exists yet. The stamp
        // lies in the same frame, in the kernel's headroom before the packet.
        let m = unsafe { self.umem.bytes_mut(at, RX_STAMP_LEN as usize) };
        let magic = u32::from_ne_bytes(m[..4].try_into().ok()?);
        let ns = u64::from_ne_bytes(m[8..16].try_into().ok()?);
        if magic != RX_STAMP_MAGIC {
            return None;
        }
        m[..4].fill(0);
        Some(ns)
    }

    fn top_up_fill(&mut self) -> io::Result<()> {
        if !self.owns_rings || !self.may_send() {
            return Ok(());
        }
        let want = self
            .pool
            .fill_target()
            .saturating_sub(self.posted_for_receive());
        if want == 0 {
            return Ok(());
        }
        let room = self.fq.free(want as u32) as usize;
        let mut post = std::mem::take(&mut self.post);
        self.pool.post_for_receive(room, |i| post.push(i));
        let n = post.len();
        if n == 0 {
            self.post = post;
            return Ok(());
        }
        for (slot, &i) in self.addrs.iter_mut().zip(&post) {
            *slot = u64::from(i) * self.frame_size as u64;
        }
        post.clear();
        self.post = post;
        // These frames came off the free list (the pool moved them to Receive), so neither the
        // kernel nor user space refers to them.
        let produced = self.fq.push(&self.addrs[..n]);
        debug_assert_eq!(produced, n, "free() promised room");
        self.wake_fill()
    }

    fn wake_fill(&mut self) -> io::Result<()> {
        if self.fq.needs_wakeup() {
            self.stats.fill_wakeups += 1;
            self.socket.poll_readable(0)?;
        }
        Ok(())
    }

    /// Frames are in transmit and none completed: once that has lasted [`TX_NUDGE_AFTER`],
    /// the driver is kicked even though it did not ask for a wakeup (and again after as long).
    fn nudge_stalled_tx(&mut self) -> io::Result<()> {
        let now = std::time::Instant::now();
        let since = *self.tx_stalled_since.get_or_insert(now);
        if now.duration_since(since) >= TX_NUDGE_AFTER && !self.tx.needs_wakeup() {
            self.stats.tx_nudges += 1;
            self.tx_stalled_since = Some(now);
            self.socket.kick_tx()?;
        }
        Ok(())
    }

    /// Frames are in transmit, not yet completed: a core should not sleep long (nothing it
    /// waits on says when they complete).
    pub fn tx_in_flight(&self) -> bool {
        self.pool.count(FrameState::Transmit) > 0
    }

    fn kick_tx(&mut self) -> io::Result<()> {
        // A copy-mode kick sends a bounded number of frames; kick again while the kernel keeps
        // making progress, so one batch goes out in one call from the driver's point of view.
        let mut last = u32::MAX;
        for _ in 0..16 {
            if !self.tx.needs_wakeup() {
                return Ok(());
            }
            self.stats.tx_kicks += 1;
            self.socket.kick_tx()?;
            let free = self.tx.free_exact();
            if free == self.ring_size || free == last {
                return Ok(());
            }
            last = free;
        }
        Ok(())
    }
}

impl FrameIo for XskQueue {
    type Frame = XskFrame;

    fn frame_capacity(&self) -> usize {
        // The kernel reserves XDP_PACKET_HEADROOM (256) at the front of each frame; with
        // multi-buffer a packet spans frames.
        self.max_packet
    }

    fn bytes<'a>(&'a self, frame: &'a XskFrame) -> &'a [u8] {
        self.id.check(frame);
        if let Some(c) = &frame.chain {
            return &c.bytes;
        }
        // SAFETY: `frame` is a unique handle to a frame of this UMEM (checked above) that user
        // space holds (the ledger has it InUse), so the kernel does not write it while borrowed.
        unsafe { self.umem.bytes(frame.desc.addr, frame.desc.len as usize) }
    }

    fn bytes_mut<'a>(&'a self, frame: &'a mut XskFrame, len: usize) -> &'a mut [u8] {
        self.id.check(frame);
        if frame.chain.is_some() || len > self.one_frame() {
            return self.chained_bytes_mut(frame, len);
        }
        // At most to the end of the frame.
        let room = self.frame_size - (frame.desc.addr % self.frame_size as u64) as usize;
        frame.desc.len = len.min(room) as u32;
        // SAFETY: as for `bytes`, and the handle is borrowed mutably for 'a, so this is the only
        // reference to the frame's bytes meanwhile.
        unsafe {
            self.umem
                .bytes_mut(frame.desc.addr, frame.desc.len as usize)
        }
    }

    fn recv(&mut self, out: &mut VecDeque<XskFrame>, max: usize) -> usize {
        if self.upgrade_called_off() {
            // The old process has the queue back: nothing here is this side's to read.
            return 0;
        }
        let max = max.min(self.scratch.len());
        let n = self.rx.pop(&mut self.scratch[..max]);
        let mut got = 0;
        for k in 0..n {
            let took = self.take_rx(self.scratch[k], out);
            if took && let Some(not_before) = self.stamp_wanted.take() {
                self.stamp = self
                    .read_stamp(self.scratch[k].addr)
                    .filter(|&ns| ns >= not_before);
            }
            got += usize::from(took);
        }
        // The kernel publishes a chained packet whole: finish one this batch cut short.
        while self.partial.is_some() {
            let mut one = [Desc::default()];
            if self.rx.pop(&mut one) == 0 {
                break;
            }
            got += usize::from(self.take_rx(one[0], out));
        }
        self.stats.rx_frames += got as u64;
        if n == 0 {
            // A zero-copy driver that found the fill ring empty waits for a wakeup, and may
            // have set its flag after the last post looked (the entries are there, nothing
            // more will be posted): nothing received is when to look again, as libxdp's
            // receive loop does. Copy mode never sets the flag. Either process of an upgrade
            // may wake it (their sockets share the queue's pool): the one that fills the ring
            // may be asleep while the other receives.
            if let Err(e) = self.wake_fill() {
                tracing::warn!("queue {}: fill ring wakeup: {e}", self.queue_id);
            }
        }
        got
    }

    fn release(&mut self, frames: &mut Vec<XskFrame>) {
        // Back to the free list, from which the fill ring is topped up first.
        self.free(frames);
        if let Err(e) = self.top_up_fill() {
            tracing::warn!("queue {}: fill ring wakeup: {e}", self.queue_id);
        }
    }

    fn alloc(&mut self, out: &mut Vec<XskFrame>, n: usize) -> usize {
        if !self.may_send() {
            return 0;
        }
        // The pool keeps the fill ring's share: transmit may not take the frames receive needs.
        let (id, frame_size) = (self.id, self.frame_size as u64);
        self.pool.alloc(n, |index| {
            out.push(XskFrame {
                desc: Desc {
                    addr: u64::from(index) * frame_size + HEADROOM,
                    len: 0,
                    options: 0,
                },
                umem: id,
                index,
                chain: None,
            })
        })
    }

    fn free(&mut self, frames: &mut Vec<XskFrame>) {
        for f in frames.drain(..) {
            self.id.check(&f);
            self.free_one(f);
        }
    }

    fn send(&mut self, frames: &mut Vec<XskFrame>) -> io::Result<usize> {
        if frames.is_empty() {
            return Ok(0);
        }
        if !self.may_send() {
            // Standing down from an upgrade called off: nothing more goes out from here.
            self.stats.tx_ring_full += frames.len() as u64;
            self.free(frames);
            return Ok(0);
        }
        let want: usize = frames.iter().map(|f| self.pieces_of(f)).sum();
        let room = (self.tx.free(want as u32) as usize).min(self.scratch.len());
        // Descriptors for the frames that fit, every piece of a chained packet or none.
        let (mut used, mut taken) = (0, 0);
        while taken < frames.len() {
            let f = &mut frames[taken];
            self.id.check(f);
            if f.chain.is_none() {
                if used == room {
                    break;
                }
                self.scratch[used] = f.desc;
                used += 1;
            } else {
                let Some(n) = self.lay_out_chain(f, room - used, used) else {
                    break;
                };
                used += n;
            }
            taken += 1;
        }
        // Each descriptor is a frame of this UMEM (checked) held by user space (InUse) and
        // written through `bytes_mut` (or with a piece of a chained packet); after this only
        // the kernel refers to it until completion.
        let pushed = self.tx.push(&self.scratch[..used]);
        if pushed < used {
            // free() promised room; should the ring disagree, the descriptors it took are the
            // kernel's now: their frames must not go back to the free list (the kernel would
            // read a frame being written). With none taken every frame stays this side's;
            // otherwise all are counted sent, and those never published never complete (lost
            // to this side, said here, rather than in two hands).
            tracing::error!(
                "queue {}: the TX ring took {pushed} of {used} descriptors",
                self.queue_id
            );
            if pushed == 0 {
                taken = 0;
            }
        }
        let mut sent = 0;
        for f in frames.drain(..taken) {
            self.pool.sent(f.index).map_err(io::Error::other)?;
            if let Some(c) = f.chain {
                for &i in &c.rest {
                    self.pool.sent(i).map_err(io::Error::other)?;
                }
                self.keep_spare(c);
            }
            sent += 1;
        }
        if !frames.is_empty() {
            self.stats.tx_ring_full += frames.len() as u64;
            self.free(frames);
        }
        self.stats.tx_frames += sent as u64;
        self.kick_tx()?;
        Ok(sent)
    }

    fn complete(&mut self) -> io::Result<usize> {
        if self.upgrade_called_off() {
            return Ok(0);
        }
        let n = if self.owns_rings {
            self.cq.pop(&mut self.addrs)
        } else {
            0
        };
        for k in 0..n {
            let index = self.index_of(self.addrs[k]);
            self.completed(index);
        }
        if self.partner.is_some() {
            self.partner_turn();
        }
        if self.pool.count(FrameState::Transmit) > 0 && n == 0 {
            // Copy mode completes frames during the kick; nudge frames still in the TX ring.
            self.kick_tx()?;
            self.nudge_stalled_tx()?;
        } else {
            self.tx_stalled_since = None;
        }
        self.top_up_fill()?;
        Ok(n)
    }

    fn counts(&mut self) -> FrameCounts {
        let rx = self.rx.ready_exact() as usize;
        let cq = if self.owns_rings {
            self.cq.ready_exact() as usize
        } else {
            0
        };
        self.pool.counts(rx, cq)
    }

    fn fill_target(&self) -> usize {
        self.pool.fill_target()
    }

    fn set_fill_target(&mut self, frames: usize) -> usize {
        if !self.owns_rings {
            // Handed to the new process of an upgrade, which fills the ring: none of this
            // side's free frames are kept back for it (they are to send from).
            return 0;
        }
        // At most the fill ring, and at most half the frames: transmit keeps the other half.
        let most = (self.ring_size as usize).min(self.frames as usize / 2);
        let set = self.pool.set_fill_target(frames, most);
        if let Err(e) = self.top_up_fill() {
            tracing::warn!("queue {}: fill ring wakeup: {e}", self.queue_id);
        }
        set
    }

    fn rx_drops(&mut self) -> u64 {
        self.kernel_stats()
            .map(|k| k.rx_dropped + k.rx_ring_full)
            .unwrap_or(0)
    }

    fn checksum_offload(&self) -> bool {
        self.tx_checksum
    }
    fn finish_checksum(&self, frame: &mut XskFrame, start: usize, offset: usize) -> bool {
        self.request_checksum(frame, start, offset)
    }
}
