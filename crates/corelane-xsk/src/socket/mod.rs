//! One AF_XDP socket bound to one queue, with its own UMEM, rings and frame ledger.

#![allow(unsafe_code)] // The UMEM and its rings are memory shared with the kernel.

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;

use crate::error::Error;
use crate::sys::{set_send_buffer, set_tx_budget, sockopt_zerocopy};
use corelane_frame::{Frame, FrameCounts, FrameIo, FramePool, FrameState, UmemId};

mod af_xdp;
mod chain;
mod config;
mod exchange;
mod partner;
mod ring;
mod shared;
pub use af_xdp::KernelStats;
use af_xdp::XdpSocket;
use chain::Chain;
pub use chain::MAX_PIECES;
pub use config::{BindMode, XskConfig, ZeroCopy};
pub use exchange::Phase as UpgradePhase;
use partner::Partner;
pub use partner::UpgradeOffer;
use ring::{Consumer, Desc, Producer, Region};

/// The kernel's headroom in front of every received packet (`XDP_PACKET_HEADROOM`).
const HEADROOM: u64 = 256;

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
}

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
    /// Whether this socket fills the fill ring and consumes the completion ring (one of the
    /// two processes sharing a queue does).
    owns_rings: bool,
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

/// How long a busy queue is tried again before it is reported taken (see `XskQueue::open`):
/// usually milliseconds, but 3.2-3.4 s were seen on a loaded machine after a runtime whose
/// peer never answered (the VLAN tests, with their others running beside them).
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl XskQueue {
    /// Binds an AF_XDP socket to queue `queue_id` of `ifname` (in the caller's network namespace).
    /// The XDP program is not loaded here: corelane loads its own with [`crate::Steering`].
    pub fn open(ifname: &str, queue_id: u32, config: &XskConfig) -> Result<Self, Error> {
        crate::caps::check_socket_privileges()?;
        crate::netdev::check_interface(ifname)?;
        crate::caps::check_memlock(u64::from(config.frames) * u64::from(config.frame_bytes()))?;
        // The socket of a process that just ended may hold the queue a moment longer (the
        // kernel releases it once the last frame it sent is freed, which a restart right after
        // a crash can beat): a busy queue is tried again for up to BUSY_WAIT before it is
        // reported taken.
        let start = std::time::Instant::now();
        loop {
            match Self::open_once(ifname, queue_id, config) {
                Err(Error::Bind {
                    errno: Some(libc::EBUSY),
                    ..
                }) if start.elapsed() < BUSY_WAIT => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                r => return r,
            }
        }
    }

    fn open_once(ifname: &str, queue_id: u32, config: &XskConfig) -> Result<Self, Error> {
        match config.zero_copy {
            ZeroCopy::Off => Self::bind(ifname, queue_id, config, BindMode::Copy),
            ZeroCopy::Require => Self::bind(ifname, queue_id, config, BindMode::ZeroCopy),
            ZeroCopy::Try => match Self::bind(ifname, queue_id, config, BindMode::ZeroCopy) {
                Ok(q) => Ok(q),
                Err(Error::Bind { errno, .. })
                    if errno == Some(libc::EOPNOTSUPP) || errno == Some(libc::EINVAL) =>
                {
                    tracing::info!(
                        "{ifname} queue {queue_id}: zero-copy refused by the driver, using copy mode"
                    );
                    Self::bind(ifname, queue_id, config, BindMode::Copy)
                }
                Err(e) => Err(e),
            },
        }
    }

    fn bind(ifname: &str, queue_id: u32, c: &XskConfig, mode: BindMode) -> Result<Self, Error> {
        let cfg_err = |what: String| Error::Config(what);
        if !c.ring_size.is_power_of_two() {
            return Err(cfg_err(format!(
                "ring size {} is not a power of two",
                c.ring_size
            )));
        }
        if !matches!(c.frame_bytes(), 2048 | 4096) {
            return Err(cfg_err(format!(
                "frame size {} must be 2048 or 4096",
                c.frame_size
            )));
        }
        if c.frames == 0 {
            return Err(cfg_err("a UMEM needs at least one frame".into()));
        }
        let ifindex = crate::netdev::check_interface(ifname)?;
        let umem_err = |e: io::Error| match e.raw_os_error() {
            Some(libc::EPERM) => crate::caps::check_socket_privileges()
                .err()
                .unwrap_or_else(|| Error::Privilege(format!("creating the UMEM: {e}"))),
            Some(libc::ENOBUFS) => Error::Privilege(crate::caps::memlock_message(
                u64::from(c.frames) * u64::from(c.frame_bytes()),
                crate::sys::memlock_limit(),
            )),
            errno => Error::Umem {
                errno,
                detail: e.to_string(),
            },
        };
        let umem = Region::new(c.frames as usize * c.frame_bytes() as usize).map_err(umem_err)?;
        let socket = XdpSocket::new().map_err(umem_err)?;
        socket
            .register_umem(&umem, c.frame_bytes(), c.ring_size)
            .map_err(umem_err)?;
        let (fq, cq) = socket.fill_comp_rings(c.ring_size).map_err(umem_err)?;
        let rings = socket.rx_tx_rings(c.ring_size).map_err(umem_err)?;
        let mut flags = libc::XDP_USE_NEED_WAKEUP;
        if c.multi_buffer() {
            flags |= libc::XDP_USE_SG;
        }
        flags |= match mode {
            BindMode::Copy => libc::XDP_COPY,
            BindMode::ZeroCopy => libc::XDP_ZEROCOPY,
        };
        socket
            .bind(ifindex, queue_id, flags, None)
            .map_err(|e| Error::Bind {
                ifname: ifname.to_string(),
                queue: queue_id,
                errno: e.raw_os_error(),
                detail: if c.multi_buffer() && mode == BindMode::Copy {
                    format!(
                        "{e} (packets of {} bytes span UMEM frames, which needs multi-buffer \
                         AF_XDP, Linux 6.6 or later: lower the MTU of {ifname} so a frame fits \
                         {} bytes)",
                        c.max_packet,
                        c.frame_capacity()
                    )
                } else {
                    e.to_string()
                },
            })?;
        let n = c.frames as usize;
        let pool = FramePool::new(n, (c.ring_size as usize).min(n / 2));
        let parts = Parts {
            socket,
            rx: rings.rx,
            tx: rings.tx,
            fq,
            cq,
            umem,
        };
        let mut q = XskQueue::assemble(parts, c, queue_id, pool);
        q.top_up_fill()?;
        Ok(q)
    }

    /// The queue over a bound socket, its rings and UMEM, with `pool`'s frames.
    fn assemble(p: Parts, c: &XskConfig, queue_id: u32, pool: FramePool) -> XskQueue {
        let fd = p.socket.raw();
        let mode = if sockopt_zerocopy(fd) {
            BindMode::ZeroCopy
        } else {
            BindMode::Copy
        };
        set_tx_budget(fd, c.ring_size);
        // Every TX slot may hold a frame in flight, each charged its bytes plus the kernel's
        // per-buffer overhead (under 1 KiB).
        let want = c.ring_size as usize * (c.frame_bytes() as usize + 1024);
        let send_buffer = set_send_buffer(fd, want);
        if send_buffer < want {
            tracing::debug!(
                "queue {queue_id}: AF_XDP send buffer {send_buffer} bytes of {want} wanted \
                 (raise net.core.wmem_max, or open the socket with CAP_NET_ADMIN): a copy-mode \
                 sender may wait for a slow receiver on a veth"
            );
        }
        XskQueue {
            rx: p.rx,
            tx: p.tx,
            fq: p.fq,
            cq: p.cq,
            socket: p.socket,
            umem: p.umem,
            id: UmemId::fresh(),
            frames: c.frames,
            pool,
            scratch: vec![Desc::default(); c.ring_size as usize],
            addrs: vec![0; c.ring_size as usize],
            post: Vec::with_capacity(c.ring_size as usize),
            frame_size: c.frame_bytes() as usize,
            max_packet: (c.max_packet.max(c.frame_capacity())) as usize,
            partial: None,
            spare_chains: Vec::new(),
            ring_size: c.ring_size,
            mode,
            queue_id,
            fd,
            send_buffer,
            stats: XskStats::default(),
            partner: None,
            owns_rings: true,
        }
    }

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

    fn index_of(&self, addr: u64) -> u32 {
        (addr / self.frame_size as u64) as u32
    }

    fn top_up_fill(&mut self) -> io::Result<()> {
        if !self.owns_rings {
            return Ok(());
        }
        let want = self
            .pool
            .fill_target()
            .saturating_sub(self.pool.count(FrameState::Receive));
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
        let max = max.min(self.scratch.len());
        let n = self.rx.pop(&mut self.scratch[..max]);
        let mut got = 0;
        for k in 0..n {
            got += usize::from(self.take_rx(self.scratch[k], out));
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
        if self.tx.push(&self.scratch[..used]) < used {
            // free() promised room; should the ring disagree, what went is lost to the ledger,
            // so say so rather than count it sent.
            tracing::error!("queue {}: TX ring took fewer than promised", self.queue_id);
            taken = 0;
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
}
