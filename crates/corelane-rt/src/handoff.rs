//! Cross-core handoff: a frame that arrived on one core's queue but belongs to a flow another
//! core owns is copied into a single-producer single-consumer ring for that core.
//!
//! One ring per ordered pair of cores, so no two threads ever write the same index. The producer
//! and consumer indices sit on separate cache lines; each side caches the other's index and
//! reads it again only when the ring looks full (or empty). A [`Doorbell`] (an eventfd) wakes a
//! consumer that went to sleep.

#![allow(unsafe_code)] // SPSC rings shared between two cores.

use std::cell::UnsafeCell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Bytes a slot holds at least: what a 4096-byte UMEM frame holds after the kernel's headroom
/// (more when the interface's packets span frames).
pub const SLOT_BYTES: usize = 4096 - 256;

#[repr(align(64))]
struct CacheLine<T>(T);

struct Slot {
    len: u16,
    hops: u8,
    data: Box<[u8]>,
}

struct Ring {
    slots: Box<[UnsafeCell<Slot>]>,
    /// Bytes each slot holds.
    slot_bytes: usize,
    mask: usize,
    /// Next slot the consumer reads.
    head: CacheLine<AtomicUsize>,
    /// Next slot the producer writes.
    tail: CacheLine<AtomicUsize>,
}

// SAFETY: a slot is written only by the one producer while it is outside [head, tail) and read
// only by the one consumer while it is inside; the Release store of `tail` (after the write) and
// Acquire load by the consumer, and likewise for `head`, order those accesses.
unsafe impl Sync for Ring {}
// SAFETY: as above; the ring owns plain bytes.
unsafe impl Send for Ring {}

/// The sending end of a handoff ring.
pub struct Producer {
    ring: Arc<Ring>,
    tail: usize,
    head_cache: usize,
}

/// The receiving end of a handoff ring.
pub struct Consumer {
    ring: Arc<Ring>,
    head: usize,
    tail_cache: usize,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("tail", &self.tail)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}

/// A ring with room for `slots` frames (rounded up to a power of two) of up to `bytes` bytes
/// (at least [`SLOT_BYTES`], at most 65535).
pub fn channel(slots: usize, bytes: usize) -> (Producer, Consumer) {
    let n = slots.max(2).next_power_of_two();
    let bytes = bytes.clamp(SLOT_BYTES, usize::from(u16::MAX));
    let slots: Box<[UnsafeCell<Slot>]> = (0..n)
        .map(|_| {
            UnsafeCell::new(Slot {
                len: 0,
                hops: 0,
                data: vec![0; bytes].into_boxed_slice(),
            })
        })
        .collect();
    let ring = Arc::new(Ring {
        slots,
        slot_bytes: bytes,
        mask: n - 1,
        head: CacheLine(AtomicUsize::new(0)),
        tail: CacheLine(AtomicUsize::new(0)),
    });
    (
        Producer {
            ring: ring.clone(),
            tail: 0,
            head_cache: 0,
        },
        Consumer {
            ring,
            head: 0,
            tail_cache: 0,
        },
    )
}

impl Producer {
    /// Copies `bytes` into the ring with hop count `hops`. Returns false when the frame is too
    /// large or the ring is full (the consumer is behind): the caller counts a drop.
    pub fn push(&mut self, hops: u8, bytes: &[u8]) -> bool {
        if bytes.len() > self.ring.slot_bytes {
            return false;
        }
        if self.tail - self.head_cache > self.ring.mask {
            self.head_cache = self.ring.head.0.load(Ordering::Acquire);
            if self.tail - self.head_cache > self.ring.mask {
                return false;
            }
        }
        let cell = &self.ring.slots[self.tail & self.ring.mask];
        // SAFETY: the slot at `tail` is outside [head, tail), so the consumer does not read it
        // until the Release store below publishes it; only this producer writes slots.
        let slot = unsafe { &mut *cell.get() };
        slot.data[..bytes.len()].copy_from_slice(bytes);
        slot.len = bytes.len() as u16;
        slot.hops = hops;
        self.tail += 1;
        self.ring.tail.0.store(self.tail, Ordering::Release);
        true
    }
}

impl Consumer {
    /// Takes the oldest frame, if any, giving its hop count and bytes to `f`.
    pub fn pop(&mut self, f: impl FnOnce(u8, &[u8])) -> bool {
        if self.head == self.tail_cache {
            self.tail_cache = self.ring.tail.0.load(Ordering::Acquire);
            if self.head == self.tail_cache {
                return false;
            }
        }
        let cell = &self.ring.slots[self.head & self.ring.mask];
        // SAFETY: the slot at `head` is inside [head, tail): the producer published it with a
        // Release store we observed with Acquire, and does not touch it until `head` moves on.
        let slot = unsafe { &*cell.get() };
        f(slot.hops, &slot.data[..usize::from(slot.len)]);
        self.head += 1;
        self.ring.head.0.store(self.head, Ordering::Release);
        true
    }

    /// True when nothing is waiting (as of now).
    pub fn is_empty(&self) -> bool {
        self.head == self.ring.tail.0.load(Ordering::Acquire)
    }
}

/// Wakes a core that sleeps: an eventfd the core's executor waits on, rung only when the core
/// said it is going to sleep.
#[derive(Debug)]
pub struct Doorbell {
    fd: OwnedFd,
    sleeping: AtomicBool,
    /// Set before the eventfd is written: the owner drains it only when something rang (a
    /// read that finds nothing is a system call per wake-up for nothing).
    rung: AtomicBool,
}

impl Doorbell {
    /// A new doorbell (a non-blocking eventfd).
    pub fn new() -> io::Result<Arc<Doorbell>> {
        // SAFETY: eventfd takes no pointers; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Arc::new(Doorbell {
            // SAFETY: `fd` is a new descriptor that nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            sleeping: AtomicBool::new(false),
            rung: AtomicBool::new(false),
        }))
    }

    /// The eventfd to wait on.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The owner is about to sleep: after this, producers ring. The owner must look at its
    /// rings once more after calling this, then sleep.
    pub fn arm(&self) {
        self.sleeping.store(true, Ordering::SeqCst);
    }

    /// The owner is awake again; clears any pending ring. A ring whose write lands after this
    /// read stays pending: it wakes the owner's next sleep once, for nothing.
    pub fn disarm(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
        if !self.rung.swap(false, Ordering::SeqCst) {
            return;
        }
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into `v`; the fd is non-blocking, so an empty counter returns
        // EAGAIN, which is fine.
        unsafe { libc::read(self.fd(), (&raw mut v).cast(), 8) };
    }

    /// Wakes the owner if it sleeps (call after publishing work for it).
    pub fn ring(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            self.ring_always();
        }
    }

    /// Wakes the owner whether or not it said it sleeps (to stop it).
    pub fn ring_always(&self) {
        self.rung.store(true, Ordering::SeqCst);
        let v = 1u64;
        // SAFETY: writes 8 bytes from `v` to the eventfd; a full counter (EAGAIN) still leaves
        // the fd readable, which is all that matters.
        unsafe { libc::write(self.fd(), (&raw const v).cast(), 8) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_out_in_order_and_a_full_ring_refuses() {
        let (mut p, mut c) = channel(4, 0);
        for i in 0..4u8 {
            assert!(p.push(i, &[i; 100]));
        }
        assert!(!p.push(9, b"full"), "a full ring takes nothing");
        assert!(!p.push(0, &[0; SLOT_BYTES + 1]), "too large");
        let (mut jp, mut jc) = channel(2, 9014);
        assert!(jp.push(1, &[7; 9014]), "a jumbo frame fits a jumbo ring");
        assert!(!jp.push(1, &[7; 9015]), "too large");
        assert!(jc.pop(|_, b| assert_eq!(b, &[7; 9014][..])));
        for i in 0..4u8 {
            assert!(c.pop(|hops, b| {
                assert_eq!(hops, i);
                assert_eq!(b, &[i; 100][..]);
            }));
        }
        assert!(!c.pop(|_, _| panic!("empty")));
        assert!(c.is_empty());
        // Wraps around.
        for round in 0..10u8 {
            assert!(p.push(round, &[round]));
            assert!(c.pop(|_, b| assert_eq!(b, &[round])));
        }
    }

    #[test]
    fn a_million_frames_cross_threads_intact() {
        let (mut p, mut c) = channel(256, 0);
        let n = 1_000_000u32;
        let t = std::thread::spawn(move || {
            let mut i = 0u32;
            while i < n {
                if p.push((i % 3) as u8, &i.to_le_bytes()) {
                    i += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        let mut next = 0u32;
        while next < n {
            c.pop(|hops, b| {
                assert_eq!(b, next.to_le_bytes());
                assert_eq!(hops, (next % 3) as u8);
                next += 1;
            });
        }
        t.join().unwrap();
    }

    #[test]
    fn doorbell_rings_only_when_armed() {
        let bell = Doorbell::new().unwrap();
        let readable = |b: &Doorbell| {
            let mut p = libc::pollfd {
                fd: b.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, zero timeout.
            unsafe { libc::poll(&mut p, 1, 0) == 1 }
        };
        bell.ring();
        assert!(!readable(&bell));
        bell.arm();
        bell.ring();
        assert!(readable(&bell));
        bell.disarm();
        assert!(!readable(&bell));
        // A stop rings whether the owner sleeps or not; the next disarm drains it, and one
        // with nothing rung leaves nothing behind either.
        bell.ring_always();
        assert!(readable(&bell));
        bell.disarm();
        assert!(!readable(&bell));
        bell.disarm();
        assert!(!readable(&bell));
        bell.arm();
        bell.ring();
        bell.ring();
        bell.disarm();
        assert!(!readable(&bell), "two rings, one drain");
    }
}
