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
//!
//! The rings of one stack count what they hold in its [`MemBudget`], which may cap it: past
//! the cap a ring does not grow (a writer waits, a receive window stops growing).

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

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
        // A ring dropped while its thread ends (the pool already gone) frees its buffer.
        let _ = POOL.try_with(|p| {
            let mut p = p.borrow_mut();
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

/// The bytes the rings of one stack (one core) hold, and the most they may (`cap`).
#[derive(Debug)]
pub(crate) struct MemBudget {
    used: AtomicUsize,
    cap: usize,
    limited: AtomicU64,
    dropped: AtomicU64,
    /// A received segment that was next in order was refused room since the stack last looked.
    pressure: AtomicBool,
}

impl MemBudget {
    /// A budget of `cap` bytes (None: no cap, only the count).
    pub(crate) fn new(cap: Option<usize>) -> Arc<MemBudget> {
        Arc::new(MemBudget {
            used: AtomicUsize::new(0),
            cap: cap.unwrap_or(usize::MAX),
            limited: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            pressure: AtomicBool::new(false),
        })
    }

    /// Bytes held now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Times a ring was refused room because of the cap.
    pub(crate) fn limited(&self) -> u64 {
        self.limited.load(Ordering::Relaxed)
    }

    /// Segments received and dropped because holding them would have passed the cap.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Notes that a received segment that was next in order was refused room.
    pub(crate) fn note_pressure(&self) {
        self.pressure.store(true, Ordering::Relaxed);
    }

    /// Whether a received segment that was next in order was refused room since the last call
    /// (and forgets it).
    pub(crate) fn take_pressure(&self) -> bool {
        // Asked once per segment received: a load first, since the swap is a locked
        // instruction (it was 3.5% of the in-memory pipeline on its own).
        self.pressure.load(Ordering::Relaxed) && self.pressure.swap(false, Ordering::Relaxed)
    }

    /// True when `more` bytes would not fit under the cap.
    pub(crate) fn over(&self, more: usize) -> bool {
        self.used().saturating_add(more) > self.cap
    }

    /// Bytes that still fit under the cap.
    fn room(&self) -> usize {
        self.cap.saturating_sub(self.used())
    }

    fn refused(&self) {
        self.limited.fetch_add(1, Ordering::Relaxed);
    }

    // `used` has one writer: the rings of one stack, changed through `&mut` on the thread
    // that drives that stack, so a load and a store make no update get lost, and cost no
    // locked instruction (four per request on each side, a tenth of a small request's
    // cost); other threads only read it.

    fn add(&self, n: usize) {
        let u = self.used.load(Ordering::Relaxed);
        self.used.store(u.saturating_add(n), Ordering::Relaxed);
    }

    fn sub(&self, n: usize) {
        // Saturating: a ring given its budget after it allocated never counted that much.
        let u = self.used.load(Ordering::Relaxed);
        self.used.store(u.saturating_sub(n), Ordering::Relaxed);
    }
}

/// The ring. `len` bytes from `head` are the readable (or unacknowledged) part; positions past
/// it may hold out-of-order bytes written with [`Ring::write_at`].
#[derive(Debug, Default)]
pub(crate) struct Ring {
    buf: Vec<u8>,
    head: usize,
    len: usize,
    mem: Option<Arc<MemBudget>>,
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.free();
    }
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

    /// Counts this ring's memory in `mem` from now on.
    pub(crate) fn set_budget(&mut self, mem: &Arc<MemBudget>) {
        if let Some(old) = &self.mem {
            old.sub(self.buf.len());
        }
        mem.add(self.buf.len());
        self.mem = Some(mem.clone());
    }

    /// Gives the memory back (the contents are lost): a small buffer to the pool.
    pub(crate) fn free(&mut self) {
        if let Some(m) = &self.mem {
            m.sub(self.buf.len());
        }
        give_back(std::mem::take(&mut self.buf));
        self.head = 0;
        self.len = 0;
    }

    /// Drops what lies past the contiguous part (bytes placed out of order) and gives back the
    /// capacity the contiguous part does not need; returns the bytes given back.
    pub(crate) fn drop_past_contents(&mut self) -> usize {
        let old = self.buf.len();
        if self.len == 0 {
            self.free();
            return old;
        }
        let want = self.len.next_power_of_two().max(SMALL);
        if want >= old {
            return 0;
        }
        let mut buf = if want == SMALL {
            take_small()
        } else {
            vec![0u8; want]
        };
        let (a, b) = self.slices(0, self.len);
        buf[..a.len()].copy_from_slice(a);
        buf[a.len()..self.len].copy_from_slice(b);
        give_back(std::mem::replace(&mut self.buf, buf));
        self.head = 0;
        if let Some(m) = &self.mem {
            m.sub(old - want);
        }
        old - want
    }

    /// The capacity [`Ring::reserve_total`] would grow to for `cap` bytes under `limit`.
    fn grown(&self, cap: usize, limit: usize) -> usize {
        let old = self.buf.len();
        if cap <= old {
            old
        } else {
            cap.max((old * 2).max(SMALL).min(limit))
        }
    }

    /// Tells its budget an in-order segment was refused room (see [`MemBudget::take_pressure`]).
    pub(crate) fn note_pressure(&self) {
        if let Some(m) = &self.mem {
            m.note_pressure();
        }
    }

    /// True when its budget has no room left at all.
    pub(crate) fn budget_exhausted(&self) -> bool {
        self.mem.as_ref().is_some_and(|m| m.room() == 0)
    }

    /// True when the ring can hold `cap` bytes in all (under `limit`, as
    /// [`Ring::reserve_total`] would grow it) without passing its budget's cap. A refusal is
    /// counted as a dropped segment: the receive side asks this before placing one.
    pub(crate) fn may_hold(&self, cap: usize, limit: usize) -> bool {
        let old = self.buf.len();
        let want = self.grown(cap, limit);
        match &self.mem {
            Some(m) if want > old && m.over(want - old) => {
                m.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
            _ => true,
        }
    }

    /// The most the ring may hold in all when asked for `cap` bytes under `limit` (what
    /// [`Ring::reserve_total`] would grow it to), as far as its budget's cap allows; a cut
    /// counts as a refusal. Never less than what it holds now.
    pub(crate) fn affordable(&self, cap: usize, limit: usize) -> usize {
        let old = self.buf.len();
        let want = self.grown(cap, limit);
        match &self.mem {
            Some(m) if want > old && m.over(want - old) => {
                m.refused();
                old + m.room()
            }
            _ => want,
        }
    }

    /// Makes room for `cap` bytes in all (never shrinks), keeping the contents and anything
    /// written past the contiguous part up to the old capacity. Grows by doubling (from 4 KiB)
    /// but never past `limit` unless `cap` itself is larger.
    pub(crate) fn reserve_total(&mut self, cap: usize, limit: usize) {
        let old = self.buf.len();
        if cap <= old {
            return;
        }
        let cap = self.grown(cap, limit);
        if let Some(m) = &self.mem {
            m.add(cap - old);
        }
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

    /// Hands up to `max` bytes from the front to `put` (in at most two pieces, in order) and
    /// drops them. Returns the count.
    pub(crate) fn read_with(&mut self, max: usize, put: &mut dyn FnMut(&[u8])) -> usize {
        let n = self.peek_with(max, put);
        self.consume(n);
        n
    }

    /// Hands up to `max` bytes from the front to `put` (in at most two pieces, in order),
    /// keeping them. Returns the count.
    pub(crate) fn peek_with(&self, max: usize, put: &mut dyn FnMut(&[u8])) -> usize {
        let n = max.min(self.len);
        let (a, b) = self.slices(0, n);
        for piece in [a, b] {
            if !piece.is_empty() {
                put(piece);
            }
        }
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
        assert_eq!(r.read_with(12, &mut crate::copy::slice_put(&mut out)), 12);
        // Bytes 8 and 9 were never written in this pass: what the first pass left there.
        assert_eq!(out, [1, 1, 2, 3, 4, 5, 6, 7, 1, 1, 9, 9]);
        assert!(r.is_empty());
        r.free();
        assert_eq!(r.capacity(), 0);
    }

    #[test]
    fn a_read_hands_out_the_bytes_across_the_wrap_in_order_and_at_most_max() {
        let mut r = Ring::default();
        r.reserve_total(10, 1 << 20);
        let cap = r.capacity();
        r.push(&vec![0u8; cap - 4]);
        r.consume(cap - 4);
        // 4 bytes before the wrap, 6 after it.
        let data: Vec<u8> = (1..=10).collect();
        r.push(&data);
        let mut pieces = Vec::new();
        assert_eq!(r.peek_with(7, &mut |p| pieces.push(p.to_vec())), 7);
        assert_eq!(
            pieces,
            [vec![1, 2, 3, 4], vec![5, 6, 7]],
            "two pieces, in order"
        );
        assert_eq!(r.len(), 10, "a peek takes nothing");
        let mut got = Vec::new();
        assert_eq!(r.read_with(3, &mut |p| got.extend_from_slice(p)), 3);
        assert_eq!(r.read_with(100, &mut |p| got.extend_from_slice(p)), 7);
        assert_eq!(got, data);
        assert!(r.is_empty());
        let mut called = false;
        assert_eq!(r.read_with(100, &mut |_| called = true), 0);
        assert!(!called, "no empty piece is handed out");
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

    #[test]
    fn a_budget_counts_what_its_rings_hold_and_caps_their_growth() {
        let mem = super::MemBudget::new(Some(3 * super::SMALL));
        let (mut a, mut b) = (Ring::default(), Ring::default());
        a.reserve_total(10, 1 << 20);
        // Given a budget after allocating: what it holds counts from then on.
        a.set_budget(&mem);
        b.set_budget(&mem);
        assert_eq!(mem.used(), super::SMALL);
        // b asks for 4 buffers' worth; 2 fit.
        let total = b.affordable(4 * super::SMALL, 1 << 20);
        assert_eq!(total, 2 * super::SMALL);
        assert_eq!(mem.limited(), 1);
        b.reserve_total(total, total);
        assert_eq!(mem.used(), 3 * super::SMALL);
        assert!(b.budget_exhausted());
        // Freeing and dropping give it back.
        a.free();
        assert_eq!(mem.used(), 2 * super::SMALL);
        drop(b);
        assert_eq!(mem.used(), 0);
        // Without a cap nothing is refused, everything is counted.
        let open = super::MemBudget::new(None);
        let mut c = Ring::default();
        c.set_budget(&open);
        assert_eq!(c.affordable(1 << 20, 1 << 20), 1 << 20);
        c.reserve_total(1 << 20, 1 << 20);
        assert_eq!((open.used(), open.limited()), (1 << 20, 0));
    }

    #[test]
    fn a_ring_dropped_as_its_thread_ends_frees_its_buffer_without_the_pool() {
        thread_local! {
            static HELD: std::cell::RefCell<Option<Ring>> = const { std::cell::RefCell::new(None) };
        }
        // HELD is set up before the pool, so its destructor runs after the pool's.
        let t = std::thread::spawn(|| {
            HELD.with_borrow_mut(|h| {
                let mut r = Ring::default();
                r.reserve_total(10, 1 << 20);
                *h = Some(r);
            });
        });
        assert!(t.join().is_ok());
    }
}
