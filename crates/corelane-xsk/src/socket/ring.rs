//! The memory an AF_XDP socket shares: the UMEM, a region of a memory file (so that another
//! process given the file's descriptor can map the same frames: see `XskQueue::join`), and the
//! four single-producer / single-consumer rings the kernel maps for the socket.
//!
//! A ring is an array of `size` entries (a power of two) with a producer and a consumer index
//! that run freely and wrap at 2^32; the entry of index `i` is at `i & (size - 1)`. The
//! producer writes entries, then publishes them with a release store of its index; the consumer
//! reads the index with an acquire load, reads the entries, then hands their slots back with a
//! release store of its own index. Each side keeps a copy of the other's index and reads the
//! shared one only when the copy says there is not enough (the fast path touches no shared
//! cache line it does not own).

#![allow(unsafe_code)] // Memory shared with the kernel, mapped and read through raw pointers.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// One descriptor of the RX and TX rings (`struct xdp_desc`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Desc {
    /// Offset of the packet's first byte in the UMEM.
    pub(crate) addr: u64,
    /// Bytes of packet.
    pub(crate) len: u32,
    /// `XDP_PKT_CONTD` when more of the packet follows in the next descriptor.
    pub(crate) options: u32,
}

/// A shared mapping, unmapped on drop.
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; who may touch which bytes is the business of the types
// that hold it (a ring's side, a frame's handle), not of the thread they are on.
unsafe impl Send for Mapping {}

impl Mapping {
    fn new(len: usize, fd: BorrowedFd<'_>, offset: u64) -> io::Result<Mapping> {
        let off = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: a fresh shared mapping of `len` bytes of `fd` at `offset`; the kernel checks
        // the range and the address is its choice, so nothing existing is replaced.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `Mapping::new` with this address and length, and no
        // reference into it outlives its holder (the region or ring borrows from `self`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The UMEM's memory: a memory file of `len` bytes mapped shared. Its descriptor can be passed
/// to another process, which maps the same frames with [`Region::map`].
#[derive(Debug)]
pub(crate) struct Region {
    map: Mapping,
    file: OwnedFd,
}

impl Region {
    /// A new zeroed region of `len` bytes.
    pub(crate) fn new(len: usize) -> io::Result<Region> {
        // SAFETY: the name is a NUL-terminated constant; the call returns a new descriptor or -1.
        let fd = unsafe {
            libc::memfd_create(
                c"corelane-umem".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned by nothing else.
        let file = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = libc::off_t::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: a valid descriptor and a length; an error is a return value.
        if unsafe { libc::ftruncate(file.as_raw_fd(), size) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // Its size is fixed for good: a process it is passed to (the new one of an upgrade)
        // cannot shrink it under the other's mapping (a SIGBUS there), nor grow it.
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor we own, with an integer argument.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Region::map(file, len)
    }

    /// Maps `len` bytes of the memory file `file` (a region another process made). Refused
    /// unless the file is sealed against shrinking and growing and holds `len` bytes: the
    /// mapping can then never reach past its end.
    pub(crate) fn map(file: OwnedFd, len: usize) -> io::Result<Region> {
        // SAFETY: fcntl on a descriptor we own; F_GET_SEALS takes no argument.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        let want = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        if seals < 0 || seals & want != want {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the memory file passed is not sealed against resizing",
            ));
        }
        let size = std::fs::File::from(file.try_clone()?).metadata()?.len();
        if size < len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the memory file passed holds {size} bytes, {len} needed"),
            ));
        }
        let map = Mapping::new(len, file.as_fd(), 0)?;
        Ok(Region { map, file })
    }

    /// The region's bytes.
    pub(crate) fn len(&self) -> usize {
        self.map.len
    }

    /// The first byte's address, to register with the kernel.
    pub(crate) fn addr(&self) -> u64 {
        self.map.ptr.as_ptr() as u64
    }

    /// The memory file, to pass to another process.
    pub(crate) fn file(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// `len` bytes at `offset`, cut to the region (an offset from the kernel is checked, never
    /// trusted).
    fn span(&self, offset: u64, len: usize) -> (usize, usize) {
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.map.len);
        (start, len.min(self.map.len - start))
    }

    /// The bytes at `offset`.
    ///
    /// # Safety
    /// No one may write these bytes while the slice lives: the caller holds the frame they
    /// belong to (the kernel handed it over, or it came off the free list), and no mutable
    /// slice of it exists.
    pub(crate) unsafe fn bytes(&self, offset: u64, len: usize) -> &[u8] {
        let (start, n) = self.span(offset, len);
        // SAFETY: `start + n` is within the mapping (span), which lives as long as `self`; the
        // caller promises that no one writes these bytes meanwhile.
        unsafe { std::slice::from_raw_parts(self.map.ptr.as_ptr().add(start), n) }
    }

    /// The bytes at `offset`, to write.
    ///
    /// # Safety
    /// The caller holds the frame these bytes belong to and no other slice of them exists
    /// while this one lives (it borrows the frame's handle mutably for as long).
    #[allow(clippy::mut_from_ref)] // The region is shared memory: exclusivity is per frame.
    pub(crate) unsafe fn bytes_mut(&self, offset: u64, len: usize) -> &mut [u8] {
        let (start, n) = self.span(offset, len);
        // SAFETY: as for `bytes`, and the caller promises this is the only slice of them.
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr.as_ptr().add(start), n) }
    }
}

/// A socket's own RX and TX rings (the fill and completion rings are its UMEM's, shared by
/// every socket on the queue).
#[derive(Debug)]
pub(crate) struct Rings {
    pub(crate) rx: Consumer<Desc>,
    pub(crate) tx: Producer<Desc>,
}

/// Where a ring's indices, flags and entries are in its mapping (`struct xdp_ring_offset`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingOffsets {
    pub(crate) producer: u64,
    pub(crate) consumer: u64,
    pub(crate) desc: u64,
    pub(crate) flags: u64,
}

impl From<libc::xdp_ring_offset> for RingOffsets {
    fn from(o: libc::xdp_ring_offset) -> Self {
        RingOffsets {
            producer: o.producer,
            consumer: o.consumer,
            desc: o.desc,
            flags: o.flags,
        }
    }
}

/// A mapped ring of `T`, either side.
#[derive(Debug)]
struct Ring<T> {
    _map: Mapping,
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    flags: NonNull<AtomicU32>,
    entries: NonNull<T>,
    mask: u32,
}

// SAFETY: as for `Mapping`; a ring side is used by one thread at a time (`&mut self`).
unsafe impl<T: Send> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    fn map(fd: BorrowedFd<'_>, off: RingOffsets, pgoff: u64, size: u32) -> io::Result<Ring<T>> {
        if !size.is_power_of_two() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("ring size {size} is not a power of two"),
            ));
        }
        let len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        let map = Mapping::new(len, fd, pgoff)?;
        let at = |o: u64, n: usize| -> io::Result<NonNull<u8>> {
            let o = o as usize;
            if o.checked_add(n).is_none_or(|end| end > len) || !o.is_multiple_of(4) {
                return Err(io::Error::other(
                    "the kernel's ring offsets are out of range",
                ));
            }
            // SAFETY: `o + n` is within the mapping (checked just above).
            Ok(unsafe { map.ptr.add(o) })
        };
        let entries_len = size as usize * std::mem::size_of::<T>();
        Ok(Ring {
            producer: at(off.producer, 4)?.cast(),
            consumer: at(off.consumer, 4)?.cast(),
            flags: at(off.flags, 4)?.cast(),
            entries: at(off.desc, entries_len)?.cast(),
            mask: size - 1,
            _map: map,
        })
    }

    fn index(&self, which: NonNull<AtomicU32>) -> &AtomicU32 {
        // SAFETY: the index is a 4-byte aligned word inside the mapping (checked in `map`),
        // which lives as long as `self`; the kernel and this side touch it only atomically.
        unsafe { which.as_ref() }
    }

    fn size(&self) -> u32 {
        self.mask + 1
    }

    /// The `n` entries from index `start` on (at most the ring's size), oldest first. The
    /// caller has read with acquire a producer index at or past `start + n`.
    fn entries_from(&self, start: u32, n: u32) -> Vec<T> {
        (0..n.min(self.size()))
            .map(|k| {
                let slot = start.wrapping_add(k) & self.mask;
                // SAFETY: `slot` is within the ring's entries (masked); the entry was written
                // before the producer index that covers it was published (read with acquire
                // by the caller).
                unsafe { self.entries.add(slot as usize).read_volatile() }
            })
            .collect()
    }
}

/// The side of a ring this process produces (fill, TX).
#[derive(Debug)]
pub(crate) struct Producer<T> {
    ring: Ring<T>,
    /// Our producer index (published on `push`).
    prod: u32,
    /// The consumer index last read, plus the ring's size: `cons - prod` slots are free.
    cons: u32,
}

impl<T: Copy> Producer<T> {
    pub(crate) fn map(
        fd: BorrowedFd<'_>,
        off: RingOffsets,
        pgoff: u64,
        size: u32,
    ) -> io::Result<Self> {
        let ring = Ring::map(fd, off, pgoff, size)?;
        // A ring this side maps may already be in use (a second process taking the fill ring
        // over): start from where the indices stand.
        let prod = ring.index(ring.producer).load(Ordering::Relaxed);
        let cons = (ring.index(ring.consumer).load(Ordering::Acquire)).wrapping_add(ring.size());
        Ok(Producer { ring, prod, cons })
    }

    /// Free slots: at least `want` when that many are free (reading the consumer's index only
    /// when the last copy of it says fewer).
    pub(crate) fn free(&mut self, want: u32) -> u32 {
        let free = self.cons.wrapping_sub(self.prod);
        if free >= want {
            return free;
        }
        self.free_exact()
    }

    /// Free slots now.
    pub(crate) fn free_exact(&mut self) -> u32 {
        let c = self.ring.index(self.ring.consumer).load(Ordering::Acquire);
        self.cons = c.wrapping_add(self.ring.size());
        self.cons.wrapping_sub(self.prod)
    }

    /// Writes as many of `items` as there are free slots and publishes them. Returns how many.
    pub(crate) fn push(&mut self, items: &[T]) -> usize {
        let n = (self.free(items.len() as u32) as usize).min(items.len());
        for (k, item) in items[..n].iter().enumerate() {
            let slot = self.prod.wrapping_add(k as u32) & self.ring.mask;
            // SAFETY: `slot` is within the ring's entries (masked), and it is free: between our
            // producer index and the consumer's plus the size, which only we write.
            unsafe { self.ring.entries.add(slot as usize).write_volatile(*item) };
        }
        self.prod = self.prod.wrapping_add(n as u32);
        // Release: the entries are written before the kernel can see the index move.
        self.ring
            .index(self.ring.producer)
            .store(self.prod, Ordering::Release);
        n
    }

    /// Takes the ring over from another producer that stopped (a process gone): our index
    /// from where it left it, and the entries it published that are not consumed yet, oldest
    /// first (the consumer may take some of them meanwhile).
    pub(crate) fn take_over(&mut self) -> Vec<T> {
        self.prod = self.ring.index(self.ring.producer).load(Ordering::Acquire);
        let cons = self.ring.index(self.ring.consumer).load(Ordering::Acquire);
        self.cons = cons.wrapping_add(self.ring.size());
        self.ring.entries_from(cons, self.prod.wrapping_sub(cons))
    }

    /// The entries published and not consumed yet, oldest first (left in the ring).
    pub(crate) fn pending(&self) -> Vec<T> {
        let cons = self.ring.index(self.ring.consumer).load(Ordering::Acquire);
        self.ring.entries_from(cons, self.prod.wrapping_sub(cons))
    }

    /// Whether the kernel asks to be woken to consume (`XDP_RING_NEED_WAKEUP`).
    pub(crate) fn needs_wakeup(&self) -> bool {
        self.ring.index(self.ring.flags).load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }
}

/// The side of a ring this process consumes (RX, completion).
#[derive(Debug)]
pub(crate) struct Consumer<T> {
    ring: Ring<T>,
    /// Our consumer index (published on `pop`).
    cons: u32,
    /// The producer index last read: `prod - cons` entries are ready.
    prod: u32,
}

impl<T: Copy> Consumer<T> {
    pub(crate) fn map(
        fd: BorrowedFd<'_>,
        off: RingOffsets,
        pgoff: u64,
        size: u32,
    ) -> io::Result<Self> {
        let ring = Ring::map(fd, off, pgoff, size)?;
        let cons = ring.index(ring.consumer).load(Ordering::Relaxed);
        let prod = ring.index(ring.producer).load(Ordering::Acquire);
        Ok(Consumer { ring, cons, prod })
    }

    /// Entries ready: at least `want` when that many are (reading the producer's index only
    /// when the last copy of it says fewer).
    pub(crate) fn ready(&mut self, want: u32) -> u32 {
        let n = self.prod.wrapping_sub(self.cons);
        if n >= want {
            return n;
        }
        self.ready_exact()
    }

    /// Takes the ring over from another consumer that stopped (a process gone): our index
    /// from where it left it.
    pub(crate) fn take_over(&mut self) {
        self.cons = self.ring.index(self.ring.consumer).load(Ordering::Acquire);
        self.prod = self.ring.index(self.ring.producer).load(Ordering::Acquire);
    }

    /// The entries ready now, oldest first, left in the ring.
    pub(crate) fn peek_all(&mut self) -> Vec<T> {
        let n = self.ready_exact();
        self.ring.entries_from(self.cons, n)
    }

    /// Sets the ring's flags word (what the kernel does: `XDP_RING_NEED_WAKEUP`), for the
    /// in-memory kernel of `sim.rs`.
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn set_flags(&self, flags: u32) {
        self.ring
            .index(self.ring.flags)
            .store(flags, Ordering::Relaxed);
    }

    /// Entries ready now.
    pub(crate) fn ready_exact(&mut self) -> u32 {
        self.prod = self.ring.index(self.ring.producer).load(Ordering::Acquire);
        self.prod.wrapping_sub(self.cons)
    }

    /// Reads up to `out.len()` entries into `out` and hands their slots back. Returns how many.
    pub(crate) fn pop(&mut self, out: &mut [T]) -> usize {
        let n = (self.ready(out.len() as u32) as usize)
            .min(out.len())
            .min(self.ring.size() as usize);
        for (k, o) in out[..n].iter_mut().enumerate() {
            let slot = self.cons.wrapping_add(k as u32) & self.ring.mask;
            // SAFETY: `slot` is within the ring's entries (masked), and published: between our
            // consumer index and the producer's, read with acquire above.
            *o = unsafe { self.ring.entries.add(slot as usize).read_volatile() };
        }
        self.cons = self.cons.wrapping_add(n as u32);
        // Release: the entries are read before the kernel may write their slots again.
        self.ring
            .index(self.ring.consumer)
            .store(self.cons, Ordering::Release);
        n
    }
}

#[cfg(test)]
#[path = "ring_tests.rs"]
mod tests;
