//! A fault-injecting wrapper around any [`FrameIo`]: drops and corrupts frames with given odds,
//! from a seed, so a test that meets a fault can be replayed exactly.

use std::collections::VecDeque;
use std::io;

use crate::{FrameCounts, FrameIo};

/// What a [`FaultInjector`] does, in frames per million.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultConfig {
    /// Received frames dropped before the caller sees them.
    pub rx_drop_ppm: u32,
    /// Sent frames dropped instead of transmitted.
    pub tx_drop_ppm: u32,
    /// Received frames with one byte flipped (a checksum must catch it).
    pub corrupt_ppm: u32,
    /// Seed of the generator that decides (the same seed, the same faults).
    pub seed: u64,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            rx_drop_ppm: 0,
            tx_drop_ppm: 0,
            corrupt_ppm: 0,
            seed: 0x5eed_c0de,
        }
    }
}

/// What a [`FaultInjector`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Received frames dropped.
    pub rx_dropped: u64,
    /// Sent frames dropped.
    pub tx_dropped: u64,
    /// Received frames corrupted.
    pub corrupted: u64,
}

/// Wraps a [`FrameIo`] and injects faults on its way in and out. Dropped frames go back where
/// they came from (the fill ring, the free list), so the frame accounting stays exact.
///
/// ```
/// use corelane_frame::{FaultConfig, FaultInjector, FrameIo, MemLink};
/// let (a, _b) = MemLink::default().pair();
/// let mut lossy = FaultInjector::new(a, FaultConfig { tx_drop_ppm: 10_000, ..FaultConfig::default() });
/// let mut tx = Vec::new();
/// lossy.alloc(&mut tx, 64);
/// for f in &mut tx { lossy.bytes_mut(f, 60); }
/// lossy.send(&mut tx)?;
/// assert!(lossy.stats().tx_dropped <= 64);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct FaultInjector<P: FrameIo> {
    inner: P,
    cfg: FaultConfig,
    dice: Dice,
    stats: FaultStats,
    fresh: VecDeque<P::Frame>,
    spill: Vec<P::Frame>,
}

impl<P: FrameIo> FaultInjector<P> {
    /// Wraps `inner`.
    pub fn new(inner: P, cfg: FaultConfig) -> Self {
        FaultInjector {
            inner,
            dice: Dice(cfg.seed | 1),
            cfg,
            stats: FaultStats::default(),
            fresh: VecDeque::new(),
            spill: Vec::new(),
        }
    }

    /// The wrapped I/O.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// The wrapped I/O, mutably.
    pub fn inner_mut(&mut self) -> &mut P {
        &mut self.inner
    }

    /// Changes the odds from now on (the generator keeps its state).
    pub fn set_config(&mut self, cfg: FaultConfig) {
        self.cfg = cfg;
    }

    /// What was injected so far.
    pub fn stats(&self) -> FaultStats {
        self.stats
    }
}

/// The generator that decides faults: xorshift64*, small, fast and enough for this.
#[derive(Debug, Clone, Copy)]
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// True with odds of `ppm` in a million.
    fn roll(&mut self, ppm: u32) -> bool {
        ppm > 0 && self.next() % 1_000_000 < u64::from(ppm)
    }
}

impl<P: FrameIo> FrameIo for FaultInjector<P> {
    type Frame = P::Frame;

    fn frame_capacity(&self) -> usize {
        self.inner.frame_capacity()
    }

    fn bytes<'a>(&'a self, frame: &'a Self::Frame) -> &'a [u8] {
        self.inner.bytes(frame)
    }

    fn bytes_mut<'a>(&'a self, frame: &'a mut Self::Frame, len: usize) -> &'a mut [u8] {
        self.inner.bytes_mut(frame, len)
    }

    fn recv(&mut self, out: &mut VecDeque<Self::Frame>, max: usize) -> usize {
        let mut fresh = std::mem::take(&mut self.fresh);
        let n = self.inner.recv(&mut fresh, max);
        while let Some(mut f) = fresh.pop_front() {
            if self.dice.roll(self.cfg.rx_drop_ppm) {
                self.stats.rx_dropped += 1;
                self.spill.push(f);
                continue;
            }
            if self.dice.roll(self.cfg.corrupt_ppm) {
                let len = crate::Frame::len(&f);
                if len > 0 {
                    let at = (self.dice.next() % len as u64) as usize;
                    let bytes = self.inner.bytes_mut(&mut f, len);
                    bytes[at] ^= 0x5a;
                    self.stats.corrupted += 1;
                }
            }
            out.push_back(f);
        }
        self.fresh = fresh;
        if !self.spill.is_empty() {
            self.inner.release(&mut self.spill);
        }
        n
    }

    fn release(&mut self, frames: &mut Vec<Self::Frame>) {
        self.inner.release(frames);
    }

    fn alloc(&mut self, out: &mut Vec<Self::Frame>, n: usize) -> usize {
        self.inner.alloc(out, n)
    }

    fn free(&mut self, frames: &mut Vec<Self::Frame>) {
        self.inner.free(frames);
    }

    fn send(&mut self, frames: &mut Vec<Self::Frame>) -> io::Result<usize> {
        let ppm = self.cfg.tx_drop_ppm;
        if ppm > 0 {
            // The dropped frames leave in order; the rest keep theirs.
            let dice = &mut self.dice;
            self.spill.extend(frames.extract_if(.., |_| dice.roll(ppm)));
            self.stats.tx_dropped += self.spill.len() as u64;
            if !self.spill.is_empty() {
                self.inner.free(&mut self.spill);
            }
        }
        self.inner.send(frames)
    }

    fn complete(&mut self) -> io::Result<usize> {
        self.inner.complete()
    }

    fn counts(&mut self) -> FrameCounts {
        self.inner.counts()
    }

    fn fill_target(&self) -> usize {
        self.inner.fill_target()
    }

    fn set_fill_target(&mut self, frames: usize) -> usize {
        self.inner.set_fill_target(frames)
    }

    fn rx_drops(&mut self) -> u64 {
        self.inner.rx_drops()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemLink;

    fn send_n(p: &mut impl FrameIo, n: usize) {
        let mut tx = Vec::new();
        assert_eq!(p.alloc(&mut tx, n), n);
        for (k, f) in tx.iter_mut().enumerate() {
            p.bytes_mut(f, 64).fill(k as u8);
        }
        p.send(&mut tx).unwrap();
        p.complete().unwrap();
    }

    fn run(seed: u64) -> (FaultStats, usize) {
        let (a, b) = MemLink::default().pair();
        let cfg = FaultConfig {
            rx_drop_ppm: 100_000,
            tx_drop_ppm: 100_000,
            corrupt_ppm: 100_000,
            seed,
        };
        let (mut a, mut b) = (FaultInjector::new(a, cfg), FaultInjector::new(b, cfg));
        send_n(&mut a, 1000);
        let mut rx = VecDeque::new();
        let got = b.recv(&mut rx, 2048);
        assert_eq!(
            got,
            1000 - a.stats().tx_dropped as usize,
            "pulled from the ring"
        );
        let kept = rx.len();
        b.release(&mut rx.drain(..).collect());
        for p in [&mut a, &mut b] {
            let c = p.counts();
            assert_eq!(c.sum(), c.total);
            assert_eq!(c.in_use, 0, "dropped frames went back");
        }
        let s = FaultStats {
            tx_dropped: a.stats().tx_dropped,
            ..b.stats()
        };
        (s, kept)
    }

    #[test]
    fn the_same_seed_injects_the_same_faults() {
        let (s1, k1) = run(7);
        let (s2, k2) = run(7);
        assert_eq!((s1, k1), (s2, k2));
        // 10% each way, 1000 frames: well away from 0 and from all.
        assert!((50..200).contains(&s1.tx_dropped), "{s1:?}");
        assert!((30..200).contains(&s1.rx_dropped), "{s1:?}");
        assert!((30..200).contains(&s1.corrupted), "{s1:?}");
        let (s3, _) = run(8);
        assert_ne!(s1, s3, "another seed, other faults");
    }
}
