//! The in-memory kernel's state and its sockets (`sim.rs` is the kernel's interface): what
//! the kernel holds of a queue, and a socket as [`XdpSocket`](super::af_xdp) holds it.

use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, MutexGuard};

use super::af_xdp::{KernelStats, SocketCalls};
use super::ring::{Consumer, Desc, Producer, Region, RingOffsets, Rings};
use crate::error::Error;

pub(super) const PAGE: usize = 4096;

/// Where a ring's indices and entries are in its pages (as `exchange.rs` lays them out).
pub(super) const OFFSETS: RingOffsets = RingOffsets {
    producer: 0,
    consumer: 64,
    flags: 128,
    desc: 192,
};

pub(super) fn ring_pages(size: u32, entry: usize) -> usize {
    (OFFSETS.desc as usize + size as usize * entry).next_multiple_of(PAGE)
}

pub(super) fn umem_err(what: &str, e: io::Error) -> Error {
    Error::Umem {
        errno: e.raw_os_error(),
        detail: format!("the in-memory kernel: {what}: {e}"),
    }
}

/// One socket as the kernel holds it.
#[derive(Debug)]
pub(super) struct Socket {
    pub(super) rx: Producer<Desc>,
    pub(super) tx: Consumer<Desc>,
    pub(super) open: bool,
    /// The descriptor its owner holds (its rings' memory file), as the program's socket
    /// map names it.
    pub(super) fd: std::os::fd::RawFd,
}

#[derive(Debug)]
pub(super) struct Kernel {
    pub(super) ring_size: u32,
    pub(super) frame_size: u64,
    /// The UMEM's memory file, read and written at offsets.
    pub(super) umem: File,
    pub(super) umem_len: u64,
    /// The fill and completion rings' memory file.
    pub(super) shared: Region,
    pub(super) fill: Consumer<u64>,
    pub(super) completion: Producer<u64>,
    pub(super) sockets: Vec<Socket>,
    /// The socket the program steers this queue's frames to.
    pub(super) target: Option<usize>,
    pub(super) wire: Vec<Vec<u8>>,
    /// What is sent is kept in `wire` (false: dropped).
    pub(super) keep_wire: bool,
    /// Frames that found no socket, no room on its RX ring or no fill-ring entry.
    pub(super) dropped: u64,
    /// Whether the driver takes fill-ring entries as a zero-copy one does: once it found the
    /// fill ring empty it sets the ring's `XDP_RING_NEED_WAKEUP` and takes no entry until a
    /// `poll` wakes it, however many were posted meanwhile.
    pub(super) fill_needs_wakeup: bool,
    /// The driver is waiting for that wakeup.
    pub(super) fill_asleep: bool,
}

impl Kernel {
    /// A zero-copy driver found the fill ring empty: it asks to be woken and waits.
    pub(super) fn fill_ran_dry(&mut self) {
        if self.fill_needs_wakeup {
            self.fill_asleep = true;
            self.fill.set_flags(libc::XDP_RING_NEED_WAKEUP);
        }
    }

    /// A wakeup (`poll`, `recvfrom`): the driver takes fill-ring entries again.
    pub(super) fn wake_fill(&mut self) {
        if self.fill_asleep {
            self.fill_asleep = false;
            self.fill.set_flags(0);
        }
    }

    /// Sends what socket `id`'s TX ring holds, as far as the completion ring has room.
    pub(super) fn transmit(&mut self, id: usize) {
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
                if self.keep_wire {
                    self.wire.push(bytes);
                }
            } else {
                self.dropped += 1;
            }
            // The frame's own address, as the kernel completes it (its start, unaligned
            // addresses kept as given).
            self.completion.push(&[d.addr]);
        }
    }

    pub(super) fn socket(&mut self, ring_size: u32) -> Result<(usize, Region), Error> {
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
        use std::os::fd::AsRawFd;
        let fd = user.file().as_raw_fd();
        self.sockets.push(Socket {
            rx,
            tx,
            open: true,
            fd,
        });
        Ok((self.sockets.len() - 1, user))
    }
}

/// A socket of the in-memory kernel, as `XdpSocket` holds it.
#[derive(Debug)]
pub(crate) struct Port {
    pub(super) kernel: Arc<Mutex<Kernel>>,
    pub(super) id: usize,
    /// The socket's rings, mapped on this side.
    pub(super) rings: Region,
    pub(super) ring_size: u32,
}

impl Port {
    pub(crate) fn file(&self) -> BorrowedFd<'_> {
        self.rings.file()
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

    /// Whether the RX ring holds frames (no waiting: the caller's schedule is the clock). A
    /// poll wakes a driver waiting for fill-ring entries, as `xsk_poll` does.
    pub(crate) fn rx_ready(&self) -> bool {
        let mut k = self.kernel();
        k.wake_fill();
        k.sockets
            .get_mut(self.id)
            .is_some_and(|s| s.open && !s.rx.pending().is_empty())
    }
}

impl SocketCalls for Port {
    fn borrow(&self) -> BorrowedFd<'_> {
        self.file()
    }

    fn register_umem(&self, _: &Region, _: u32, _: u32, _: bool) -> io::Result<bool> {
        // The in-memory kernel's UMEM is its queue's, made with it (`SimKernel::new`).
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }

    fn rx_tx_rings(&self, _: u32) -> io::Result<Rings> {
        Port::rx_tx_rings(self)
    }

    fn fill_comp_rings(&self, _: u32) -> io::Result<(Producer<u64>, Consumer<u64>)> {
        Port::fill_comp_rings(self)
    }

    fn bind(&self, _: u32, _: u32, _: u16, _: Option<BorrowedFd<'_>>) -> io::Result<()> {
        // Bound by the in-memory kernel when it made the socket (`SimKernel::bind`).
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }

    fn statistics(&self) -> io::Result<KernelStats> {
        Ok(KernelStats::default())
    }

    fn poll_readable(&self, _: i32) -> io::Result<bool> {
        Ok(self.rx_ready())
    }

    fn kick_tx(&self) -> io::Result<()> {
        Port::kick_tx(self);
        Ok(())
    }

    fn sim_id(&self) -> Option<usize> {
        Some(self.id)
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
