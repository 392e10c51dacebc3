//! Model-T batching: the driver runs its stages in lockstep over a batch of frames, and the
//! batch size and the receive ring's occupancy adapt at run time so that a batch's working set
//! (its receive frames, the frames it sends, the flows it touches) stays in the core's L2 cache.
//!
//! Two signals move the batch size, both cheap to read every turn:
//! - **Ring watermarks.** A pull that filled the whole batch means more frames wait in the RX
//!   ring (above the high watermark): after two such turns in a row (and a few turns at this
//!   size) the batch doubles, up to the cap. A run of eight pulls under a quarter of the batch
//!   (below the low watermark) halves it, so light load is not batched into latency.
//! - **Cost per frame.** Each batch size keeps a moving average of the nanoseconds a turn spent
//!   per frame. A size measured to cost more than 10% above half its size per frame steps back,
//!   and the batch does not grow into a size already measured that way: that is the working set
//!   spilling out of L2.
//!
//! The cap is the largest power of two whose working set (a receive frame and a transmit frame
//! per slot) fits in half of L2. The fill ring's occupancy (frames posted for the kernel to
//! receive into) follows the batch: four batches, at least what fits in L2, raised when the
//! kernel reports receive drops for want of a fill frame and never past the ring.

/// Sizes the tuner works with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TuneConfig {
    /// Smallest batch.
    pub min_batch: usize,
    /// Largest batch (also the TX kick size).
    pub max_batch: usize,
    /// The core's L2 cache in bytes (the working-set budget).
    pub l2_bytes: usize,
    /// Bytes of a frame the stages touch (a UMEM frame, at most a 1514-byte packet).
    pub frame_bytes: usize,
    /// Largest fill-ring occupancy the socket allows.
    pub max_fill: usize,
}

impl Default for TuneConfig {
    fn default() -> Self {
        TuneConfig {
            min_batch: 4,
            max_batch: 256,
            l2_bytes: 1 << 20,
            frame_bytes: 2048,
            max_fill: 2048,
        }
    }
}

const LEVELS: usize = 11; // batch sizes 1 ..= 1024

/// Turns a size runs before its cost per frame is trusted (to grow past it or back off it).
const SETTLE: u64 = 4;

fn level(n: usize) -> usize {
    (usize::BITS - 1 - n.max(1).leading_zeros()) as usize
}

/// Per batch size: turns spent there and the moving average cost per frame.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LevelStats {
    /// The batch size.
    pub batch: usize,
    /// Turns that ran with this batch size (and pulled at least one frame).
    pub turns: u64,
    /// Frames pulled at this size.
    pub frames: u64,
    /// Moving average of nanoseconds per frame (0 until measured).
    pub ns_per_frame: f64,
}

/// Chooses the batch size and the fill-ring occupancy turn by turn (see the module docs).
#[derive(Debug, Clone)]
pub struct BatchTuner {
    cfg: TuneConfig,
    batch: usize,
    cap: usize,
    full_streak: u32,
    low_streak: u32,
    levels: [LevelStats; LEVELS],
    fill_floor: usize,
    last_drops: Option<u64>,
    changes: u64,
}

impl BatchTuner {
    /// A tuner starting at the smallest batch.
    pub fn new(cfg: TuneConfig) -> Self {
        let min = cfg.min_batch.clamp(1, 1024).next_power_of_two();
        let max = cfg.max_batch.clamp(min, 1024);
        // Working set per batch slot: a received frame and a frame sent.
        let per_slot = 2 * cfg.frame_bytes.clamp(64, 4096);
        let fits = (cfg.l2_bytes / 2 / per_slot).max(1);
        let cap = (1usize << level(fits)).clamp(min, max);
        let mut levels = [LevelStats::default(); LEVELS];
        for (i, l) in levels.iter_mut().enumerate() {
            l.batch = 1 << i;
        }
        let max_fill = cfg.max_fill.max(1);
        let fill_floor = (cfg.l2_bytes / cfg.frame_bytes.clamp(64, 4096)).clamp(1, max_fill);
        BatchTuner {
            cfg: TuneConfig {
                min_batch: min,
                max_batch: max,
                max_fill,
                ..cfg
            },
            batch: min,
            cap,
            full_streak: 0,
            low_streak: 0,
            levels,
            fill_floor,
            last_drops: None,
            changes: 0,
        }
    }

    /// The batch size for the next turn.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The largest batch whose working set fits the L2 budget.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// How many times the batch size changed.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Frames to keep posted in the fill ring.
    pub fn fill_target(&self) -> usize {
        (4 * self.batch).max(self.fill_floor).min(self.cfg.max_fill)
    }

    /// After a turn that pulled `pulled` frames from the RX ring and sent `sent`, with the
    /// batch size [`batch`](Self::batch) returned, spending `busy_ns`. Returns true when the
    /// batch size changed. The fuller of the two directions is the pressure (a bulk sender
    /// pulls only ACKs but fills its transmit batches); the cost per frame is sampled only
    /// from full batches, so sizes are compared under the same load (a caller may pass 0 for
    /// `busy_ns` when neither count reached the batch: it is not read then).
    pub fn observe(&mut self, pulled: usize, sent: usize, busy_ns: u64) -> bool {
        let moved = pulled.max(sent);
        if moved == 0 {
            return false;
        }
        let b = self.batch;
        let l = &mut self.levels[level(b)];
        l.turns += 1;
        l.frames += (pulled + sent) as u64;
        if moved >= b {
            let sample = busy_ns as f64 / (pulled + sent) as f64;
            l.ns_per_frame = if l.ns_per_frame == 0.0 {
                sample
            } else {
                0.9 * l.ns_per_frame + 0.1 * sample
            };
        }
        // Measured costlier per frame than half this size: the working set spilled. Step back.
        let (here, turns) = (l.ns_per_frame, l.turns);
        let below = self.levels[level(b / 2)].ns_per_frame;
        if b > self.cfg.min_batch && turns >= SETTLE && below > 0.0 && here > below * 1.1 {
            return self.set(b / 2);
        }
        if moved >= b {
            self.low_streak = 0;
            self.full_streak += 1;
            if self.full_streak >= 2 && turns >= SETTLE && b < self.cap {
                let next = self.levels[level(b * 2)].ns_per_frame;
                // Measured costlier per frame at the next size: stay.
                if next == 0.0 || next <= here * 1.1 {
                    return self.set(b * 2);
                }
            }
        } else if moved * 4 <= b {
            self.full_streak = 0;
            self.low_streak += 1;
            if self.low_streak >= 8 && b > self.cfg.min_batch {
                return self.set(b / 2);
            }
        } else {
            self.full_streak = 0;
            self.low_streak = 0;
        }
        false
    }

    /// The kernel's running count of receive drops (no fill frame, or a full RX ring). New
    /// drops raise the fill ring's floor (doubling, up to the ring).
    pub fn observe_drops(&mut self, total: u64) {
        if let Some(last) = self.last_drops
            && total > last
        {
            self.fill_floor = (self.fill_floor * 2).min(self.cfg.max_fill);
        }
        self.last_drops = Some(total);
    }

    fn set(&mut self, b: usize) -> bool {
        self.batch = b;
        self.full_streak = 0;
        self.low_streak = 0;
        self.changes += 1;
        true
    }

    /// Every batch size used so far, smallest first.
    pub fn levels(&self) -> Vec<LevelStats> {
        self.levels
            .iter()
            .filter(|l| l.turns > 0)
            .copied()
            .collect()
    }

    /// The batch size that carried the most frames: where the tuner settled.
    pub fn settled(&self) -> usize {
        self.levels
            .iter()
            .max_by_key(|l| l.frames)
            .filter(|l| l.frames > 0)
            .map_or(self.batch, |l| l.batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuner(l2: usize) -> BatchTuner {
        BatchTuner::new(TuneConfig {
            l2_bytes: l2,
            frame_bytes: 2048,
            ..TuneConfig::default()
        })
    }

    #[test]
    fn the_cap_keeps_a_batch_in_half_of_l2() {
        // 2 MiB L2: 1 MiB budget / (2 x 2 KiB per slot) = 256.
        assert_eq!(tuner(2 << 20).cap(), 256);
        assert_eq!(tuner(1 << 20).cap(), 128);
        assert_eq!(tuner(256 << 10).cap(), 32);
        // A tiny cache still allows the smallest batch.
        assert_eq!(tuner(1024).cap(), 4);
    }

    #[test]
    fn a_backlog_grows_the_batch_to_the_cap_and_no_further() {
        let mut t = tuner(1 << 20);
        assert_eq!(t.batch(), 4);
        for _ in 0..100 {
            let b = t.batch();
            t.observe(b, 0, 100 * b as u64);
        }
        assert_eq!(t.batch(), 128);
        assert_eq!(t.settled(), 128);
    }

    #[test]
    fn light_load_shrinks_the_batch() {
        let mut t = tuner(1 << 20);
        for _ in 0..20 {
            let b = t.batch();
            t.observe(b, 0, 100 * b as u64);
        }
        assert!(t.batch() >= 64);
        for _ in 0..200 {
            t.observe(1, 0, 300);
        }
        assert_eq!(t.batch(), 4);
    }

    #[test]
    fn a_size_measured_costlier_per_frame_is_not_grown_into() {
        let mut t = tuner(2 << 20);
        // Cheap per frame up to 32, three times the cost at 64 (the working set spills).
        let cost = |b: usize| if b >= 64 { 300 } else { 100 };
        for _ in 0..100 {
            let b = t.batch();
            t.observe(b, 0, (cost(b) * b) as u64);
        }
        assert_eq!(t.batch(), 32, "{:?}", t.levels());
        // It tried 64, measured it costlier, and stepped back; light load shrinks it, and the
        // next backlog grows it again only up to the best measured size.
        for _ in 0..20 {
            t.observe(0, 1, 100);
        }
        for _ in 0..200 {
            let b = t.batch();
            t.observe(b, 0, (cost(b) * b) as u64);
        }
        assert_eq!(t.batch(), 32, "{:?}", t.levels());
    }

    #[test]
    fn receive_drops_raise_the_fill_ring() {
        let mut t = BatchTuner::new(TuneConfig {
            l2_bytes: 256 << 10,
            frame_bytes: 4096,
            max_fill: 1024,
            ..TuneConfig::default()
        });
        assert_eq!(t.fill_target(), 64);
        t.observe_drops(0);
        t.observe_drops(0);
        assert_eq!(t.fill_target(), 64);
        t.observe_drops(10);
        assert_eq!(t.fill_target(), 128);
        for d in 0..10 {
            t.observe_drops(100 + d);
        }
        assert_eq!(t.fill_target(), 1024);
    }
}
