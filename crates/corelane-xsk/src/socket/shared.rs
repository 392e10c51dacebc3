//! A second AF_XDP socket on a queue that already has one: what an upgraded server process
//! opens beside the one it replaces, so that both receive on the queue while the old one
//! drains (issue 30, part 4).
//!
//! The kernel lets only one UMEM serve a queue, so the second socket is bound with
//! `XDP_SHARED_UMEM` to the first one's descriptor, and maps the same frames from the UMEM's
//! memory file. It gets an RX and a TX ring of its own, but the queue's fill and completion
//! rings are the first socket's: one of each per queue, each with one producer and one consumer.
//! Which process fills and completes is therefore a hand-over between the two, and frames cross
//! between them (a frame one posted to the fill ring arrives on the other's RX ring when the
//! program steers the packet there). Since Linux 6.4 a bound socket may map the fill and
//! completion rings of the UMEM it shares, which is how the second process takes them over.
//!
//! This is the kernel half of the upgrade; `partner.rs` is the frames' half.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use super::af_xdp::XdpSocket;
use super::ring::Rings;
use super::ring::{Consumer, Producer, Region};
use crate::error::Error;

/// A socket bound to a queue beside the one that registered the queue's UMEM.
#[derive(Debug)]
pub(crate) struct Joined {
    pub(crate) rings: Rings,
    pub(crate) socket: XdpSocket,
    pub(crate) umem: Region,
    ring_size: u32,
}

impl Joined {
    /// Binds a socket to queue `queue` of `ifname`, sharing the UMEM of `first` (a socket bound
    /// to that queue) whose memory file is `umem`, `umem_len` bytes. Rings of `ring_size`.
    pub(crate) fn open(
        ifname: &str,
        queue: u32,
        first: BorrowedFd<'_>,
        umem: OwnedFd,
        umem_len: usize,
        ring_size: u32,
    ) -> Result<Joined, Error> {
        let ifindex = crate::netdev::check_interface(ifname)?;
        let umem_err = |e: io::Error| Error::Umem {
            errno: e.raw_os_error(),
            detail: format!("mapping a shared UMEM: {e}"),
        };
        let umem = Region::map(umem, umem_len).map_err(umem_err)?;
        let socket = XdpSocket::new().map_err(umem_err)?;
        let rings = socket.rx_tx_rings(ring_size).map_err(umem_err)?;
        socket
            .bind(ifindex, queue, 0, Some(first))
            .map_err(|e| Error::Bind {
                ifname: ifname.to_string(),
                queue,
                errno: e.raw_os_error(),
                detail: format!("sharing the UMEM of the socket already on the queue: {e}"),
            })?;
        Ok(Joined {
            rings,
            socket,
            umem,
            ring_size,
        })
    }

    /// As [`Joined::open`], a socket of the in-memory kernel's queue.
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn open_sim(
        kernel: &super::sim::SimKernel,
        umem: OwnedFd,
        umem_len: usize,
        ring_size: u32,
    ) -> Result<Joined, Error> {
        let umem_err = |e: io::Error| Error::Umem {
            errno: e.raw_os_error(),
            detail: format!("mapping a shared UMEM: {e}"),
        };
        let umem = Region::map(umem, umem_len).map_err(umem_err)?;
        let socket = kernel.socket()?;
        let rings = socket.rx_tx_rings(ring_size).map_err(umem_err)?;
        Ok(Joined {
            rings,
            socket,
            umem,
            ring_size,
        })
    }

    /// Maps the queue's fill and completion rings (Linux 6.4+). Only one side may produce to
    /// the fill ring and consume the completion ring at a time.
    pub(crate) fn fill_and_completion(&self) -> io::Result<(Producer<u64>, Consumer<u64>)> {
        self.socket.fill_comp_rings(self.ring_size).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("mapping the shared fill and completion rings (Linux 6.4 or later): {e}"),
            )
        })
    }
}

#[cfg(test)]
#[path = "shared_tests.rs"]
mod tests;
