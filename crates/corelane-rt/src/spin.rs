//! How long an idle core spins before it sleeps, set from what a wake-up costs on this host.
//!
//! A frame that finds its core asleep waits for the wake-up: on a virtual CPU here 30-70 µs
//! from the steering program to the core's turn, on an Intel host 16-20 µs, on bare metal a
//! few. A core that sleeps through a gap adds that wait to the request that ends it, so a gap
//! shorter than twice the wake-up's cost is cheaper spun through (sleeping would add half the
//! gap or more to the request's time), and a fixed spin is either too short for a slow host
//! or burns CPU on a fast one. The driver measures both waits (a frame that woke the core
//! against one that found it awake) and spins through gaps up to twice their difference: the
//! longest spin is four times the cost, since a gap is spun through whole when recent gaps
//! are under half the longest spin ([`crate::PollMode::Adaptive`]).

use std::time::Duration;

/// The longest spin, in wake-up costs.
pub(crate) const COST_FACTOR: u32 = 4;
/// The shortest longest spin, however cheap a wake-up (a clock read and a ring look each
/// turn of the spin).
pub(crate) const MIN_SPIN: Duration = Duration::from_micros(10);
/// Waits kept of each kind: the median of the last few, so that one wake-up the host
/// delayed (a descheduled virtual CPU) does not move the spin.
const KEPT: usize = 15;

/// The last [`KEPT`] waits of one kind, in nanoseconds.
#[derive(Debug, Clone, Default)]
struct Recent {
    waits: [u64; KEPT],
    len: usize,
    next: usize,
}

impl Recent {
    fn push(&mut self, ns: u64) {
        self.waits[self.next] = ns;
        self.next = (self.next + 1) % KEPT;
        self.len = (self.len + 1).min(KEPT);
    }

    fn median(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let mut w = self.waits;
        let w = &mut w[..self.len];
        w.sort_unstable();
        Some(w[self.len / 2])
    }
}

/// What a wake-up costs a frame, from the waits the driver measured, and the spin it sets.
#[derive(Debug, Clone, Default)]
pub(crate) struct WakeCost {
    woken: Recent,
    awake: Recent,
    /// The cost from the medians, worked out when a wait comes (not per idle turn).
    cost: Option<Duration>,
}

impl WakeCost {
    /// A frame that woke the core waited `ns` from the steering program to the core's turn.
    pub(crate) fn woken(&mut self, ns: u64) {
        self.woken.push(ns);
        self.update();
    }

    /// A frame that found the core awake waited `ns`.
    pub(crate) fn awake(&mut self, ns: u64) {
        self.awake.push(ns);
        self.update();
    }

    fn update(&mut self) {
        self.cost = self.woken.median().map(|w| {
            let a = self.awake.median().unwrap_or(0);
            Duration::from_nanos(w.saturating_sub(a))
        });
    }

    /// What sleeping adds to a frame's wait: None until a wake-up was measured.
    pub(crate) fn cost(&self) -> Option<Duration> {
        self.cost
    }

    /// The longest spin once idle, at most `cap` (the configured spin): `cap` until a wake-up
    /// was measured, then [`COST_FACTOR`] times its cost, at least [`MIN_SPIN`].
    pub(crate) fn spin(&self, cap: Duration) -> Duration {
        match self.cost {
            None => cap,
            Some(c) => (c * COST_FACTOR).max(MIN_SPIN).min(cap),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Duration = Duration::from_micros(200);

    #[test]
    fn the_spin_is_the_cap_until_a_wake_up_was_measured() {
        let mut w = WakeCost::default();
        assert_eq!(w.spin(CAP), CAP);
        // Waits of an awake core alone say nothing of what sleeping costs.
        w.awake(3_000);
        assert_eq!(w.cost(), None);
        assert_eq!(w.spin(CAP), CAP);
        w.woken(23_000);
        assert_eq!(w.cost(), Some(Duration::from_micros(20)));
        assert_eq!(w.spin(CAP), Duration::from_micros(80));
    }

    #[test]
    fn the_spin_follows_the_cost_between_its_bounds() {
        let mut fast = WakeCost::default();
        fast.woken(1_000);
        assert_eq!(fast.spin(CAP), MIN_SPIN);
        let mut slow = WakeCost::default();
        slow.woken(400_000);
        assert_eq!(slow.spin(CAP), CAP);
        // A wake-up never costs less than nothing.
        let mut odd = WakeCost::default();
        odd.awake(50_000);
        odd.woken(10_000);
        assert_eq!(odd.cost(), Some(Duration::ZERO));
        assert_eq!(odd.spin(CAP), MIN_SPIN);
    }

    #[test]
    fn one_delayed_wake_up_does_not_move_the_spin() {
        let mut w = WakeCost::default();
        for _ in 0..6 {
            w.woken(30_000);
        }
        w.woken(9_000_000);
        assert_eq!(w.cost(), Some(Duration::from_micros(30)));
        // The host got slower for good: the spin follows within the waits kept.
        for _ in 0..KEPT / 2 + 1 {
            w.woken(60_000);
        }
        assert_eq!(w.cost(), Some(Duration::from_micros(60)));
        assert_eq!(w.spin(CAP), Duration::from_micros(200));
    }
}
