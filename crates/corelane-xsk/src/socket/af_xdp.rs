//! The AF_XDP socket's system calls: creating it, registering a UMEM, sizing and mapping its
//! rings, binding it to a queue (alone, or sharing another socket's UMEM on the same queue),
//! its counters, and the calls that wake the kernel.

#![allow(unsafe_code)] // System calls on the socket, with pointers to the structures they fill.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use super::ring::{Consumer, Producer, Region, Rings};

/// The kernel's counters for one AF_XDP socket (`struct xdp_statistics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelStats {
    /// Frames dropped for reasons other than a full RX ring or an empty fill ring.
    pub rx_dropped: u64,
    /// Invalid descriptors on the fill ring.
    pub rx_invalid_descs: u64,
    /// Invalid descriptors on the TX ring.
    pub tx_invalid_descs: u64,
    /// Frames dropped because the RX ring was full.
    pub rx_ring_full: u64,
    /// Times the fill ring was found empty.
    pub rx_fill_ring_empty: u64,
    /// Times the TX ring was found empty on a kick.
    pub tx_ring_empty: u64,
}

/// The system calls an AF_XDP socket answers: the kernel's ([`KernelSocket`]), or, with the
/// `sim` feature, the in-memory kernel's (`sim_port::Port`). The rings above them are the same
/// shared memory either way, so every queue move runs unchanged over both.
pub(crate) trait SocketCalls: std::fmt::Debug + Send {
    /// The descriptor the rings are mapped from: the socket's, or the in-memory rings' file.
    fn borrow(&self) -> BorrowedFd<'_>;
    /// Registers `region` as the socket's UMEM, in frames of `frame_size` bytes, and sizes its
    /// fill and completion rings. `tx_metadata`: with room for AF_XDP TX metadata before each
    /// transmitted packet (Linux 6.11+); returns whether it has that room.
    fn register_umem(
        &self,
        region: &Region,
        frame_size: u32,
        ring: u32,
        tx_metadata: bool,
    ) -> io::Result<bool>;
    /// Sizes and maps the RX and TX rings.
    fn rx_tx_rings(&self, size: u32) -> io::Result<Rings>;
    /// Maps the UMEM's fill and completion rings.
    fn fill_comp_rings(&self, size: u32) -> io::Result<(Producer<u64>, Consumer<u64>)>;
    /// Binds to queue `queue` of interface `ifindex` (`shared`: the socket whose UMEM it shares).
    fn bind(
        &self,
        ifindex: u32,
        queue: u32,
        flags: u16,
        shared: Option<BorrowedFd<'_>>,
    ) -> io::Result<()>;
    /// The socket's counters.
    fn statistics(&self) -> io::Result<KernelStats>;
    /// Waits up to `timeout_ms` (-1: forever) for frames in the RX ring.
    fn poll_readable(&self, timeout_ms: i32) -> io::Result<bool>;
    /// Asks the kernel to send what the TX ring holds.
    fn kick_tx(&self) -> io::Result<()>;
    /// The in-memory kernel's number for this socket (None: a real socket).
    #[cfg(any(test, feature = "sim"))]
    fn sim_id(&self) -> Option<usize> {
        None
    }
}

/// An AF_XDP socket: its system calls, made to the kernel or to the in-memory one.
#[derive(Debug)]
pub(crate) struct XdpSocket(Box<dyn SocketCalls>);

/// A socket of the kernel: its descriptor.
#[derive(Debug)]
pub(crate) struct KernelSocket(OwnedFd);

fn setsockopt<T>(fd: RawFd, opt: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` is valid for reads of size_of::<T>() bytes; a bad option is an error return.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            opt,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn getsockopt<T: Copy>(fd: RawFd, opt: libc::c_int, mut v: T) -> io::Result<T> {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `v` is valid for writes of `len` bytes, which the kernel does not exceed.
    let rc =
        unsafe { libc::getsockopt(fd, libc::SOL_XDP, opt, (&mut v as *mut T).cast(), &mut len) };
    if rc == 0 {
        Ok(v)
    } else {
        Err(io::Error::last_os_error())
    }
}

impl XdpSocket {
    /// A new AF_XDP socket (CAP_NET_RAW).
    pub(crate) fn new() -> io::Result<XdpSocket> {
        // SAFETY: plain system call; returns a new descriptor or -1.
        let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by socket() and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(XdpSocket(Box::new(KernelSocket(fd))))
    }

    /// A socket whose system calls `calls` answers (the in-memory kernel's).
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn over(calls: impl SocketCalls + 'static) -> XdpSocket {
        XdpSocket(Box::new(calls))
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.borrow().as_raw_fd()
    }
}

/// Every system call of the socket is its implementation's.
impl std::ops::Deref for XdpSocket {
    type Target = dyn SocketCalls;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl KernelSocket {
    fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    fn offsets(&self) -> io::Result<libc::xdp_mmap_offsets> {
        let zero = libc::xdp_ring_offset {
            producer: 0,
            consumer: 0,
            desc: 0,
            flags: 0,
        };
        getsockopt(
            self.raw(),
            libc::XDP_MMAP_OFFSETS,
            libc::xdp_mmap_offsets {
                rx: zero,
                tx: zero,
                fr: zero,
                cr: zero,
            },
        )
    }
}

impl SocketCalls for KernelSocket {
    fn borrow(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }

    fn register_umem(
        &self,
        region: &Region,
        frame_size: u32,
        ring: u32,
        tx_metadata: bool,
    ) -> io::Result<bool> {
        let mut reg = libc::xdp_umem_reg {
            addr: region.addr(),
            len: region.len() as u64,
            chunk_size: frame_size,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        if tx_metadata {
            reg.flags = libc::XDP_UMEM_TX_METADATA_LEN;
            reg.tx_metadata_len = super::offload::META_LEN as u32;
        }
        let meta = match setsockopt(self.raw(), libc::XDP_UMEM_REG, &reg) {
            Ok(()) => tx_metadata,
            // A kernel before 6.11 knows no such flag: registered without.
            Err(e) if tx_metadata && e.raw_os_error() == Some(libc::EINVAL) => {
                reg.flags = 0;
                reg.tx_metadata_len = 0;
                setsockopt(self.raw(), libc::XDP_UMEM_REG, &reg)?;
                false
            }
            Err(e) => return Err(e),
        };
        setsockopt(self.raw(), libc::XDP_UMEM_FILL_RING, &ring)?;
        setsockopt(self.raw(), libc::XDP_UMEM_COMPLETION_RING, &ring)?;
        Ok(meta)
    }

    fn rx_tx_rings(&self, size: u32) -> io::Result<Rings> {
        setsockopt(self.raw(), libc::XDP_RX_RING, &size)?;
        setsockopt(self.raw(), libc::XDP_TX_RING, &size)?;
        let off = self.offsets()?;
        Ok(Rings {
            rx: Consumer::map(
                self.borrow(),
                off.rx.into(),
                libc::XDP_PGOFF_RX_RING as u64,
                size,
            )?,
            tx: Producer::map(
                self.borrow(),
                off.tx.into(),
                libc::XDP_PGOFF_TX_RING as u64,
                size,
            )?,
        })
    }

    fn fill_comp_rings(&self, size: u32) -> io::Result<(Producer<u64>, Consumer<u64>)> {
        let off = self.offsets()?;
        Ok((
            Producer::map(
                self.borrow(),
                off.fr.into(),
                libc::XDP_UMEM_PGOFF_FILL_RING,
                size,
            )?,
            Consumer::map(
                self.borrow(),
                off.cr.into(),
                libc::XDP_UMEM_PGOFF_COMPLETION_RING,
                size,
            )?,
        ))
    }

    fn bind(
        &self,
        ifindex: u32,
        queue: u32,
        flags: u16,
        shared: Option<BorrowedFd<'_>>,
    ) -> io::Result<()> {
        let addr = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: flags | shared.map_or(0, |_| libc::XDP_SHARED_UMEM),
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: shared.map_or(0, |f| f.as_raw_fd() as u32),
        };
        // SAFETY: `addr` is a valid sockaddr_xdp of the size given.
        let rc = unsafe {
            libc::bind(
                self.raw(),
                (&addr as *const libc::sockaddr_xdp).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn statistics(&self) -> io::Result<KernelStats> {
        let s = getsockopt(
            self.raw(),
            libc::XDP_STATISTICS,
            libc::xdp_statistics {
                rx_dropped: 0,
                rx_invalid_descs: 0,
                tx_invalid_descs: 0,
                rx_ring_full: 0,
                rx_fill_ring_empty_descs: 0,
                tx_ring_empty_descs: 0,
            },
        )?;
        Ok(KernelStats {
            rx_dropped: s.rx_dropped,
            rx_invalid_descs: s.rx_invalid_descs,
            tx_invalid_descs: s.tx_invalid_descs,
            rx_ring_full: s.rx_ring_full,
            rx_fill_ring_empty: s.rx_fill_ring_empty_descs,
            tx_ring_empty: s.tx_ring_empty_descs,
        })
    }

    fn poll_readable(&self, timeout_ms: i32) -> io::Result<bool> {
        let mut p = libc::pollfd {
            fd: self.raw(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        match n {
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
            0 => Ok(false),
            _ => Ok(p.revents & libc::POLLIN != 0),
        }
    }

    fn kick_tx(&self) -> io::Result<()> {
        // SAFETY: a zero-length send with no buffer and no address.
        let rc = unsafe {
            libc::sendto(
                self.raw(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if rc >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOBUFS | libc::EAGAIN | libc::EBUSY | libc::ENETDOWN) => Ok(()),
            _ => Err(e),
        }
    }
}
