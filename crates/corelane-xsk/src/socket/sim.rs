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
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, MutexGuard};

use super::af_xdp::XdpSocket;
use super::ring::{Consumer, Desc, Producer, Region};
use super::sim_port::{Kernel, OFFSETS, Port, ring_pages, umem_err};
use super::{HEADROOM, Parts, XskConfig, XskQueue};
use crate::error::Error;

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
                keep_wire: true,
                dropped: 0,
                fill_needs_wakeup: false,
                fill_asleep: false,
            })),
        };
        let socket = sim.socket()?;
        let rings = socket
            .rx_tx_rings(c.ring_size)
            .map_err(|e| umem_err("the rings", e))?;
        let (fq, cq) = socket
            .fill_comp_rings(c.ring_size)
            .map_err(|e| umem_err("the rings", e))?;
        let parts = Parts {
            socket,
            rx: rings.rx,
            tx: rings.tx,
            fq,
            cq,
            umem,
        };
        let mut q = XskQueue::alone(parts, c, 0);
        sim.steer_to(&q);
        q.top_up_fill()?;
        Ok((sim, q))
    }

    /// A new socket on this queue (a joining process's, before it binds).
    pub(crate) fn socket(&self) -> Result<XdpSocket, Error> {
        let ring_size = self.kernel().ring_size;
        let (id, rings) = self.kernel().socket(ring_size)?;
        Ok(XdpSocket::over(Port {
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
        let target = self.kernel().target;
        self.deliver_to(target, bytes, None)
    }

    /// As [`SimKernel::deliver`], with the steering program's receive stamp (`ns` of
    /// `CLOCK_MONOTONIC`) in the XDP metadata right before the packet, as the kernel copies it.
    pub fn deliver_stamped(&self, bytes: &[u8], ns: u64) -> bool {
        let target = self.kernel().target;
        self.deliver_to(target, bytes, Some(ns))
    }

    /// Receives `bytes` on the open socket whose owner holds descriptor `fd` (what the
    /// program's socket map names), as [`SimKernel::deliver`] does.
    pub fn deliver_to_fd(&self, fd: std::os::fd::RawFd, bytes: &[u8]) -> bool {
        let id = self
            .kernel()
            .sockets
            .iter()
            .position(|s| s.open && s.fd == fd);
        self.deliver_to(id, bytes, None)
    }

    fn deliver_to(&self, target: Option<usize>, bytes: &[u8], stamp: Option<u64>) -> bool {
        let mut k = self.kernel();
        let k = &mut *k;
        let Some(id) = target else {
            k.dropped += 1;
            return false;
        };
        let room = k.frame_size.saturating_sub(HEADROOM);
        let ring_size = k.ring_size;
        let has_room = k.sockets[id].open
            && (k.sockets[id].rx.pending().len() as u32) < ring_size
            && bytes.len() as u64 <= room;
        let mut entry = [0u64];
        if !has_room || k.fill_asleep {
            k.dropped += 1;
            return false;
        }
        if k.fill.pop(&mut entry) == 0 {
            k.fill_ran_dry();
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
        if let Some(ns) = stamp {
            let mut meta = [0u8; super::RX_STAMP_LEN as usize];
            meta[..4].copy_from_slice(&super::RX_STAMP_MAGIC.to_ne_bytes());
            meta[8..].copy_from_slice(&ns.to_ne_bytes());
            if k.umem
                .write_all_at(&meta, addr - super::RX_STAMP_LEN)
                .is_err()
            {
                k.dropped += 1;
                return false;
            }
        }
        let d = Desc {
            addr,
            len: bytes.len() as u32,
            options: 0,
        };
        k.sockets[id].rx.push(&[d]) == 1
    }

    /// From now on the driver takes fill-ring entries as a zero-copy driver does (virtio_net,
    /// ice, mlx5 with `XDP_USE_NEED_WAKEUP`): when it finds the fill ring empty it sets the
    /// ring's need-wakeup flag and receives nothing more until a `poll` on a socket of the
    /// queue wakes it, even once entries are posted again. Copy mode never waits so.
    pub fn fill_like_zero_copy(&self) {
        self.kernel().fill_needs_wakeup = true;
    }

    /// From now on the driver stops sending without asking for a wakeup: the TX rings'
    /// need-wakeup flags are cleared and what they hold goes out only when a kick comes anyway
    /// (as a zero-copy virtio_net did on a starved guest, its transmit queue timed out).
    pub fn tx_stalls_silently(&self) {
        let k = self.kernel();
        for s in k.sockets.iter().filter(|s| s.open) {
            s.tx.set_flags(0);
        }
    }

    /// The driver found the fill ring empty just before user space posted to it, and set the
    /// need-wakeup flag just after user space last looked at it: the race every zero-copy
    /// receive must survive, at a moment a test chooses (see [`SimKernel::fill_like_zero_copy`]).
    pub fn fill_runs_dry_now(&self) {
        self.kernel().fill_ran_dry();
    }

    /// Nothing is on the link: what is sent from now on is dropped, not kept for
    /// [`SimKernel::take_wire`] (a kernel no test reads the wire of).
    pub fn discard_wire(&self) {
        self.kernel().keep_wire = false;
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

/// Where a queue's frames are ([`SimKernel::misplaced`]): the frames found in more than one
/// place, and those found in none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Misplaced {
    /// Frames held in two places at once (the fault a check looks for).
    pub twice: Vec<usize>,
    /// Frames in no place (lost; a check at the end, once nothing is in flight).
    pub lost: Vec<usize>,
}

impl SimKernel {
    /// Counts every frame of the queue's UMEM once per place that holds it: each queue of
    /// `queues` (the processes' queues on it, old first) by its ledger (free or in use: a
    /// new process called off holds nothing), this kernel's rings, and the exchange's two
    /// rings of an upgrade as the first queue still mapping them has them.
    ///
    /// # Errors
    /// A queue's ledger contradicts itself.
    pub fn misplaced(&self, queues: &mut [&mut XskQueue]) -> Result<Misplaced, String> {
        let frames = {
            let k = self.kernel();
            (k.umem_len / k.frame_size) as usize
        };
        let mut count = vec![0u32; frames];
        for (n, q) in queues.iter().enumerate() {
            q.pool
                .ledger()
                .verify()
                .map_err(|e| format!("queue {n}'s ledger: {e}"))?;
            if q.upgrade_called_off() {
                continue;
            }
            for (i, c) in count.iter_mut().enumerate() {
                if matches!(
                    q.pool.ledger().get(i),
                    Some(corelane_frame::FrameState::Free | corelane_frame::FrameState::InUse)
                ) {
                    *c += 1;
                }
            }
        }
        for i in self.frames_held() {
            if let Some(c) = count.get_mut(i) {
                *c += 1;
            }
        }
        if let Some(q) = queues
            .iter_mut()
            .find(|q| q.partner.is_some() && !q.upgrade_called_off())
        {
            for i in q.exchange_frames() {
                if let Some(c) = count.get_mut(i as usize) {
                    *c += 1;
                }
            }
        }
        Ok(Misplaced {
            twice: (0..frames).filter(|&i| count[i] > 1).collect(),
            lost: (0..frames).filter(|&i| count[i] == 0).collect(),
        })
    }
}

#[path = "sim_upgrade.rs"]
pub mod upgrade;

#[cfg(test)]
#[path = "sim_tests.rs"]
mod tests;
