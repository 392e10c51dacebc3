//! Edge coverage from LLVM's SanitizerCoverage, which stable Rust can switch on:
//!
//! ```text
//! RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=3 \
//!            -Cllvm-args=-sanitizer-coverage-trace-pc-guard"
//! ```
//!
//! Built so, every edge of the instrumented code has a guard, numbered here when the program
//! starts (`__sanitizer_cov_trace_pc_guard_init`), and calls
//! `__sanitizer_cov_trace_pc_guard` each time it is taken; this module counts the calls per
//! edge. A run's features are its edges with their hit counts bucketed as libFuzzer and AFL
//! bucket them (1, 2, 3, 4-7, 8-15, 16-31, 32-127, 128+), so an input that takes a loop more
//! often counts as new too. Built without the flags, nothing calls in and
//! [`instrumented`] is false. LLVM does not instrument functions whose names start with
//! `__sanitizer_`, so the callbacks do not call themselves.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicUsize, Ordering};

/// Edges counted; an instrumented program with more shares slots (modulo).
const SLOTS: usize = 1 << 16;

static HITS: [AtomicU8; SLOTS] = [const { AtomicU8::new(0) }; SLOTS];
/// The slots the current run has hit, in the order first hit: a run's features are read from
/// these alone, not from every slot.
static DIRTY: [AtomicU32; SLOTS] = [const { AtomicU32::new(0) }; SLOTS];
static DIRTY_LEN: AtomicUsize = AtomicUsize::new(0);
/// Set while [`Seen::merge`] reads the counts: this crate is instrumented too, and the edges
/// merge itself takes must not write into the list it reads.
static PAUSED: AtomicBool = AtomicBool::new(false);
static NEXT: AtomicU32 = AtomicU32::new(1);
static ON: AtomicBool = AtomicBool::new(false);

/// Numbers the guards of one instrumented module (LLVM calls this once per module at start).
///
/// # Safety
/// `start..stop` is the module's array of guards, as SanitizerCoverage passes it.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn __sanitizer_cov_trace_pc_guard_init(
    start: *mut u32,
    stop: *mut u32,
) {
    if start == stop {
        return;
    }
    // SAFETY: LLVM passes its own guard array for this module; already numbered if the first
    // guard is not 0.
    if unsafe { *start } != 0 {
        return;
    }
    ON.store(true, Ordering::Relaxed);
    let mut p = start;
    while p < stop {
        // SAFETY: `p` stays inside `start..stop`, the module's guard array.
        unsafe {
            *p = NEXT.fetch_add(1, Ordering::Relaxed);
            p = p.add(1);
        }
    }
}

/// Counts one pass over the edge whose guard is `guard`.
///
/// # Safety
/// `guard` points into a guard array numbered by [`__sanitizer_cov_trace_pc_guard_init`].
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn __sanitizer_cov_trace_pc_guard(guard: *mut u32) {
    // SAFETY: LLVM passes a pointer to this edge's guard, numbered at start.
    let slot = unsafe { *guard } as usize % SLOTS;
    if PAUSED.load(Ordering::Relaxed) {
        return;
    }
    let h = &HITS[slot];
    let n = h.load(Ordering::Relaxed);
    if n == 0 {
        let i = DIRTY_LEN.fetch_add(1, Ordering::Relaxed);
        if let Some(d) = DIRTY.get(i) {
            d.store(slot as u32, Ordering::Relaxed);
        }
    }
    h.store(n.saturating_add(1), Ordering::Relaxed);
}

/// True when the program was built with SanitizerCoverage.
pub(crate) fn instrumented() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Edges instrumented.
pub(crate) fn edges() -> usize {
    (NEXT.load(Ordering::Relaxed) as usize).saturating_sub(1)
}

fn bucket(n: u8) -> u8 {
    match n {
        0 => 0,
        1 => 1,
        2 => 2,
        3 => 4,
        4..=7 => 8,
        8..=15 => 16,
        16..=31 => 32,
        32..=127 => 64,
        _ => 128,
    }
}

/// The features seen so far: per edge, the buckets its counts have fallen in.
#[derive(Debug)]
pub(crate) struct Seen {
    buckets: Vec<u8>,
}

impl Default for Seen {
    fn default() -> Self {
        Seen {
            buckets: vec![0; SLOTS],
        }
    }
}

impl Seen {
    /// Adds the last run's features and clears its counts for the next; returns how many
    /// were new.
    pub(crate) fn merge(&mut self) -> usize {
        self.merge_with(|b, seen| b & !seen != 0)
    }

    /// As [`Seen::merge`], counting only edges no run took before (not new hit counts).
    pub(crate) fn merge_edges(&mut self) -> usize {
        self.merge_with(|_, seen| seen == 0)
    }

    fn merge_with(&mut self, is_new: impl Fn(u8, u8) -> bool) -> usize {
        PAUSED.store(true, Ordering::Relaxed);
        let mut new = 0;
        let len = DIRTY_LEN.swap(0, Ordering::Relaxed).min(SLOTS);
        for d in &DIRTY[..len] {
            let slot = d.load(Ordering::Relaxed) as usize;
            let b = bucket(HITS[slot].swap(0, Ordering::Relaxed));
            let seen = &mut self.buckets[slot];
            if is_new(b, *seen) {
                new += 1;
            }
            *seen |= b;
        }
        PAUSED.store(false, Ordering::Relaxed);
        new
    }

    /// Edges taken by some run so far.
    pub(crate) fn edges(&self) -> usize {
        self.buckets.iter().filter(|&&b| b != 0).count()
    }
}
