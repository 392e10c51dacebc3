//! A byte ring that grows on demand: the send buffer (bytes from the oldest unacknowledged one
//! on) and the receive buffer (bytes ready to read, then room where out-of-order segments are
//! placed at their offset). Nothing is allocated until the first byte arrives, and [`Ring::free`]
//! gives the memory back.
//!
//! A ring starts with a [`SMALL`] buffer taken from a per-thread pool (each core runs on one
//! thread, so the pool is per core and needs no lock) and grows by doubling. A small buffer
//! goes back to the pool when freed, so a request/response connection that empties its rings
//! after every exchange takes and returns one without touching the allocator, and an idle
//! connection holds none.

use std::cell::RefCell;

/// The size of a ring's first buffer, the unit the pool keeps.
pub(crate) const SMALL: usize = 4096;

/// Most buffers the pool keeps per thread (1 MiB); more are given back to the allocator.
const POOL_MAX: usize = 256;

thread_local! {
    static POOL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

fn take_small() -> Vec<u8> {
    POOL.with_borrow_mut(|p| p.pop())
        .unwrap_or_else(|| vec![0u8; SMALL])
}

fn give_back(buf: Vec<u8>) {
    if buf.len() == SMALL {
        POOL.with_borrow_mut(|p| {
            if p.len() < POOL_MAX {
                p.push(buf);
            }
        });
    }
}

/// Buffers in this thread's pool.
#[cfg(test)]
pub(crate) fn pooled() -> usize {
    POOL.with_borrow(|p| p.len())
}

/// The ring. `len` bytes from `head` are the readable (or unacknowledged) part; positions past
/// it may hold out-of-order bytes written with [`Ring::write_at`].
#[derive(Debug, Default)]
pub(crate) struct Ring {
    buf: Vec<u8>,
    head: usize,
    len: usize,
}

impl Ring {
    /// Bytes in the contiguous part.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// True when the contiguous part is empty.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated.
    #[inline]
    pub(crate) fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Gives the memory back (the contents are lost): a small buffer to the pool.
    pub(crate) fn free(&mut self) {
        give_back(std::mem::take(&mut self.buf));
        self.head = 0;
        self.len = 0;
    }

    /// Makes room for `cap` bytes in all (never shrinks), keeping the contents and anything
    /// written past the contiguous part up to the old capacity. Grows by doubling (from 4 KiB)
    /// but never past `limit` unless `cap` itself is larger.
    pub(crate) fn reserve_total(&mut self, cap: usize, limit: usize) {
        let old = self.buf.len();
        if cap <= old {
            return;
        }
        let cap = cap.max((old * 2).max(SMALL).min(limit));
        if old == 0 && cap == SMALL {
            self.buf = take_small();
            self.head = 0;
            return;
        }
        let mut buf = vec![0u8; cap];
        // Unroll the old ring (all of it: out-of-order bytes past `len` are kept) to offset 0.
        let (a, b) = self.buf.split_at(self.head);
        buf[..b.len()].copy_from_slice(b);
        buf[b.len()..old].copy_from_slice(a);
        give_back(std::mem::replace(&mut self.buf, buf));
        self.head = 0;
    }

    #[inline]
    fn pos(&self, off: usize) -> usize {
        let p = self.head + off;
        if p >= self.buf.len() {
            p - self.buf.len()
        } else {
            p
        }
    }

    /// Appends `data` to the contiguous part; the caller has reserved room.
    pub(crate) fn push(&mut self, data: &[u8]) {
        self.write_at(self.len, data);
        self.len += data.len();
    }

    /// Writes `data` at `off` bytes from the head (may be past the contiguous part); the caller
    /// has reserved room for `off + data.len()` bytes.
    pub(crate) fn write_at(&mut self, off: usize, data: &[u8]) {
        debug_assert!(off + data.len() <= self.buf.len());
        if data.is_empty() {
            return;
        }
        let p = self.pos(off);
        let first = data.len().min(self.buf.len() - p);
        self.buf[p..p + first].copy_from_slice(&data[..first]);
        self.buf[..data.len() - first].copy_from_slice(&data[first..]);
    }

    /// Extends the contiguous part by `n` bytes already written with [`Ring::write_at`].
    pub(crate) fn extend(&mut self, n: usize) {
        self.len += n;
        debug_assert!(self.len <= self.buf.len());
    }

    /// The `len` bytes at `off` as at most two slices.
    pub(crate) fn slices(&self, off: usize, len: usize) -> (&[u8], &[u8]) {
        if len == 0 {
            return (&[], &[]);
        }
        let p = self.pos(off);
        let first = len.min(self.buf.len() - p);
        (&self.buf[p..p + first], &self.buf[..len - first])
    }

    /// Drops `n` bytes from the front.
    pub(crate) fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        self.len -= n;
        // The head moves even when the ring empties: out-of-order bytes past the contiguous
        // part stay where they were written.
        self.head = self.pos(n);
    }

    /// Copies from the front into `out` and drops what was copied. Returns the count.
    pub(crate) fn read(&mut self, out: &mut [u8]) -> usize {
        let n = out.len().min(self.len);
        let (a, b) = self.slices(0, n);
        out[..a.len()].copy_from_slice(a);
        out[a.len()..n].copy_from_slice(b);
        self.consume(n);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::Ring;

    #[test]
    fn wraps_grows_and_keeps_out_of_order_bytes() {
        let mut r = Ring::default();
        assert_eq!(r.capacity(), 0);
        r.reserve_total(10, 1 << 20);
        let cap = r.capacity();
        r.push(&vec![1u8; cap - 3]);
        r.consume(cap - 5);
        // Contiguous: 2 bytes; wrap around with 6 more.
        r.push(&[2, 3, 4, 5, 6, 7]);
        r.write_at(10, &[9, 9]);
        assert_eq!(r.len(), 8);
        r.reserve_total(cap + 1, 1 << 20);
        let mut out = [0u8; 12];
        r.extend(4);
        assert_eq!(r.read(&mut out), 12);
        // Bytes 8 and 9 were never written in this pass: what the first pass left there.
        assert_eq!(out, [1, 1, 2, 3, 4, 5, 6, 7, 1, 1, 9, 9]);
        assert!(r.is_empty());
        r.free();
        assert_eq!(r.capacity(), 0);
    }

    #[test]
    fn small_buffers_come_from_and_go_back_to_the_pool() {
        let before = super::pooled();
        let mut r = Ring::default();
        r.reserve_total(100, 1 << 20);
        assert_eq!(r.capacity(), super::SMALL);
        r.push(b"hello");
        r.free();
        assert_eq!(super::pooled(), before + 1);
        // Taken again (not zeroed: a ring's bytes past its contents are never read).
        r.reserve_total(1, 1 << 20);
        assert_eq!(super::pooled(), before);
        // Growing gives the small buffer back; freeing a large one does not pool it.
        r.reserve_total(super::SMALL + 1, 1 << 20);
        assert_eq!(super::pooled(), before + 1);
        r.free();
        assert_eq!(super::pooled(), before + 1);
        // A ring limited below the pool's size allocates its own.
        let mut small = Ring::default();
        small.reserve_total(10, 1024);
        assert_eq!(small.capacity(), 1024);
        small.free();
        assert_eq!(super::pooled(), before + 1);
    }
}
