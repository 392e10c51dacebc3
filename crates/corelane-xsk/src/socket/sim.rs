//! An in-memory kernel for one AF_XDP queue: what the kernel does with a queue's rings, done in
//! this process over memory files, so that the queue's own code ([`XskQueue`], the hand-over
//! of an upgrade between two of them) runs without root, without a device and in any
//! interleaving a test or a seeded simulation picks.
//!
//! [`SimKernel::open`] makes a queue as [`XskQueue::open`] does; the rings are laid out in
//! memory files as the kernel lays them out, and the same ring code serves both sides. The
//! kernel's side is taken by the caller's calls: [`SimKernel::deliver`] receives a frame as
//! copy mode does (a fill-ring entry, the bytes written at the kernel's headroom, a descriptor
//! on the RX ring of the socket the program steers to), and a kick of a socket's TX ring
//! ([`XskQueue`]'s own `sendto`) sends what it holds: its bytes to [`SimKernel::take_wire`],
//! its address to the completion ring. A socket dropped is closed: its rings are gone, as they
//! are when the kernel releases one. [`SimKernel::frames_held`] lists the frames the kernel
//! holds, for checks that every frame is in one place.

use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, MutexGuard};

use super::af_xdp::{Rings, XdpSocket};
use super::ring::{Consumer, Desc, Producer, Region, RingOffsets};
use super::{HEADROOM, Parts, XskConfig, XskQueue};
use crate::error::Error;
use corelane_frame::FramePool;

const PAGE: usize = 4096;

/// Where a ring's indices and entries are in its pages (as `exchange.rs` lays them out).
const OFFSETS: RingOffsets = RingOffsets {
    producer: 0,
    consumer: 64,
    flags: 128,
    desc: 192,
};

fn ring_pages(size: u32, entry: usize) -> usize {
    (OFFSETS.desc as usize + size as usize * entry).next_multiple_of(PAGE)
}

fn umem_err(what: &str, e: io::Error) -> Error {
    Error::Umem {
        errno: e.raw_os_error(),
        detail: format!("the in-memory kernel: {what}: {e}"),
    }
}

/// One socket as the kernel holds it.
#[derive(Debug)]
struct Socket {
    rx: Producer<Desc>,
    tx: Consumer<Desc>,
    open: bool,
}

#[derive(Debug)]
struct Kernel {
    ring_size: u32,
    frame_size: u64,
    /// The UMEM's memory file, read and written at offsets.
    umem: File,
    umem_len: u64,
    /// The fill and completion rings' memory file.
    shared: Region,
    fill: Consumer<u64>,
    completion: Producer<u64>,
    sockets: Vec<Socket>,
    /// The socket the program steers this queue's frames to.
    target: Option<usize>,
    wire: Vec<Vec<u8>>,
    /// Frames that found no socket, no room on its RX ring or no fill-ring entry.
    dropped: u64,
}

impl Kernel {
    /// Sends what socket `id`'s TX ring holds, as far as the completion ring has room.
    fn transmit(&mut self, id: usize) {
        let room = self.completion.free_exact() as usize;
        let Some(s) = self.sockets.get_mut(id).filter(|s| s.open) else {
            return;
        };
        let ready = (s.tx.ready_exact() as usize).min(room);
        let mut descs = vec![Desc::default(); ready];
        let n = s.tx.pop(&mut descs);
        for d in &descs[..n] {
            let mut bytes = vec![0u8; d.len as usize];
            let inside = d
                .addr
                .checked_add(u64::from(d.len))
                .is_some_and(|end| end <= self.umem_len);
            if inside && self.umem.read_exact_at(&mut bytes, d.addr).is_ok() {
                self.wire.push(bytes);
            } else {
                self.dropped += 1;
            }
            // The frame's own address, as the kernel completes it (its start, unaligned
            // addresses kept as given).
            self.completion.push(&[d.addr]);
        }
    }

    fn socket(&mut self, ring_size: u32) -> Result<(usize, Region), Error> {
        let rx_at = 0u64;
        let tx_at = ring_pages(ring_size, std::mem::size_of::<Desc>()) as u64;
        let region =
            Region::new(2 * tx_at as usize).map_err(|e| umem_err("a socket's rings", e))?;
        let rx = Producer::map(region.file(), OFFSETS, rx_at, ring_size)
            .map_err(|e| umem_err("the RX ring", e))?;
        let tx = Consumer::map(region.file(), OFFSETS, tx_at, ring_size)
            .map_err(|e| umem_err("the TX ring", e))?;
        // Copy mode: every send needs a kick.
        tx.set_flags(libc::XDP_RING_NEED_WAKEUP);
        let user = Region::map(
            region
                .file()
                .try_clone_to_owned()
                .map_err(|e| umem_err("a socket's rings", e))?,
            region.len(),
        )
        .map_err(|e| umem_err("a socket's rings", e))?;
        self.sockets.push(Socket { rx, tx, open: true });
        Ok((self.sockets.len() - 1, user))
    }
}

/// A socket of the in-memory kernel, as [`XdpSocket`] holds it.
#[derive(Debug)]
pub(crate) struct Port {
    kernel: Arc<Mutex<Kernel>>,
    id: usize,
    /// The socket's rings, mapped on this side.
    rings: Region,
    ring_size: u32,
}

impl Port {
    pub(crate) fn file(&self) -> BorrowedFd<'_> {
        self.rings.file()
    }

    pub(crate) fn id(&self) -> usize {
        self.id
    }

    fn kernel(&self) -> MutexGuard<'_, Kernel> {
        self.kernel.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn rx_tx_rings(&self) -> io::Result<Rings> {
        let tx_at = ring_pages(self.ring_size, std::mem::size_of::<Desc>()) as u64;
        Ok(Rings {
            rx: Consumer::map(self.rings.file(), OFFSETS, 0, self.ring_size)?,
            tx: Producer::map(self.rings.file(), OFFSETS, tx_at, self.ring_size)?,
        })
    }

    pub(crate) fn fill_comp_rings(&self) -> io::Result<(Producer<u64>, Consumer<u64>)> {
        let k = self.kernel();
        let cq_at = ring_pages(self.ring_size, 8) as u64;
        Ok((
            Producer::map(k.shared.file(), OFFSETS, 0, self.ring_size)?,
            Consumer::map(k.shared.file(), OFFSETS, cq_at, self.ring_size)?,
        ))
    }

    /// A kick: the kernel sends what the TX ring holds.
    pub(crate) fn kick_tx(&self) {
        self.kernel().transmit(self.id);
    }

    /// Whether the RX ring holds frames (no waiting: the caller's schedule is the clock).
    pub(crate) fn rx_ready(&self) -> bool {
        let mut k = self.kernel();
        k.sockets
            .get_mut(self.id)
            .is_some_and(|s| s.open && !s.rx.pending().is_empty())
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        // Closed: the kernel lets go of its rings, and what they held goes with them.
        let mut k = self.kernel();
        if let Some(s) = k.sockets.get_mut(self.id) {
            s.open = false;
        }
        if k.target == Some(self.id) {
            k.target = None;
        }
    }
}

/// The in-memory kernel of one queue (see the module's documentation). Cheap to clone: the
/// clones are the same kernel.
#[derive(Debug, Clone)]
pub struct SimKernel {
    kernel: Arc<Mutex<Kernel>>,
}

impl SimKernel {
    fn kernel(&self) -> MutexGuard<'_, Kernel> {
        self.kernel.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A queue with a UMEM of its own, as [`XskQueue::open`] makes one on a device (copy
    /// mode), and the kernel that serves it. The program steers the queue to it.
    ///
    /// # Errors
    /// The memory files cannot be made or mapped, or the sizes are not powers of two.
    pub fn open(c: &XskConfig) -> Result<(SimKernel, XskQueue), Error> {
        let len = c.frames as usize * c.frame_bytes() as usize;
        let umem = Region::new(len).map_err(|e| umem_err("the UMEM", e))?;
        let file = File::from(
            umem.file()
                .try_clone_to_owned()
                .map_err(|e| umem_err("the UMEM", e))?,
        );
        let cq_at = ring_pages(c.ring_size, 8);
        let shared = Region::new(2 * cq_at).map_err(|e| umem_err("the fill ring", e))?;
        let fill = Consumer::map(shared.file(), OFFSETS, 0, c.ring_size)
            .map_err(|e| umem_err("the fill ring", e))?;
        let completion = Producer::map(shared.file(), OFFSETS, cq_at as u64, c.ring_size)
            .map_err(|e| umem_err("the completion ring", e))?;
        let sim = SimKernel {
            kernel: Arc::new(Mutex::new(Kernel {
                ring_size: c.ring_size,
                frame_size: u64::from(c.frame_bytes()),
                umem: file,
                umem_len: len as u64,
                shared,
                fill,
                completion,
                sockets: Vec::new(),
                target: None,
                wire: Vec::new(),
                dropped: 0,
            })),
        };
        let socket = sim.socket()?;
        let rings = socket
            .rx_tx_rings(c.ring_size)
            .map_err(|e| umem_err("the rings", e))?;
        let (fq, cq) = socket
            .fill_comp_rings(c.ring_size)
            .map_err(|e| umem_err("the rings", e))?;
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
        let mut q = XskQueue::assemble(parts, c, 0, pool);
        sim.steer_to(&q);
        q.top_up_fill()?;
        Ok((sim, q))
    }

    /// A new socket on this queue (a joining process's, before it binds).
    pub(crate) fn socket(&self) -> Result<XdpSocket, Error> {
        let ring_size = self.kernel().ring_size;
        let (id, rings) = self.kernel().socket(ring_size)?;
        Ok(XdpSocket::sim(Port {
            kernel: self.kernel.clone(),
            id,
            rings,
            ring_size,
        }))
    }

    /// The program steers the queue's frames to `q`'s socket (the XSKMAP entry).
    pub fn steer_to(&self, q: &XskQueue) {
        let id = q.socket.sim_id();
        self.kernel().target = id;
    }

    /// Receives `bytes` as copy mode does. False when dropped: no socket steered to, its RX
    /// ring full, no fill-ring entry, or longer than a frame.
    pub fn deliver(&self, bytes: &[u8]) -> bool {
        let mut k = self.kernel();
        let k = &mut *k;
        let Some(id) = k.target else {
            k.dropped += 1;
            return false;
        };
        let room = k.frame_size.saturating_sub(HEADROOM);
        let ring_size = k.ring_size;
        let has_room = k.sockets[id].open
            && (k.sockets[id].rx.pending().len() as u32) < ring_size
            && bytes.len() as u64 <= room;
        let mut entry = [0u64];
        if !has_room || k.fill.pop(&mut entry) == 0 {
            k.dropped += 1;
            return false;
        }
        // The frame's start: the fill ring may carry an address inside it.
        let start = entry[0] - entry[0] % k.frame_size;
        let addr = start + HEADROOM;
        if k.umem.write_all_at(bytes, addr).is_err() {
            k.dropped += 1;
            return false;
        }
        let d = Desc {
            addr,
            len: bytes.len() as u32,
            options: 0,
        };
        k.sockets[id].rx.push(&[d]) == 1
    }

    /// The frames sent since the last call, in order.
    pub fn take_wire(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.kernel().wire)
    }

    /// Frames dropped on receive or send.
    pub fn dropped(&self) -> u64 {
        self.kernel().dropped
    }

    /// The frames (indices) the kernel holds: posted in the fill ring, on an open socket's RX
    /// or TX ring, or completed and not yet read. Each once per place it is found in (a frame
    /// in two places is listed twice).
    pub fn frames_held(&self) -> Vec<usize> {
        let mut k = self.kernel();
        let k = &mut *k;
        let size = k.frame_size;
        let index = |addr: u64| (addr / size) as usize;
        let mut out: Vec<usize> = k.fill.peek_all().into_iter().map(index).collect();
        out.extend(k.completion.pending().into_iter().map(index));
        for s in k.sockets.iter_mut().filter(|s| s.open) {
            out.extend(s.rx.pending().into_iter().map(|d| index(d.addr)));
            out.extend(s.tx.peek_all().into_iter().map(|d| index(d.addr)));
        }
        out
    }
}

#[path = "sim_upgrade.rs"]
pub mod upgrade;

#[cfg(test)]
#[path = "sim_tests.rs"]
mod tests;
