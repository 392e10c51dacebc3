//! The runtime's clock: the wall clock of a real run, or a virtual one that a simulation moves
//! by hand (`crate::sim`). Every deadline the cores and the upgrade poll is read from it, so
//! that seconds of an upgrade's waits cost a simulation nothing and come in any order it picks.

#[cfg(any(test, feature = "sim"))]
use std::sync::Arc;
#[cfg(any(test, feature = "sim"))]
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A run's clock (cheap to clone: the clones read the same time).
#[derive(Debug, Clone, Default)]
pub(crate) enum Clock {
    /// `Instant::now()`.
    #[default]
    Wall,
    /// A start and the time moved since, in nanoseconds (a simulation's).
    #[cfg(any(test, feature = "sim"))]
    Virtual(Arc<Virtual>),
}

#[derive(Debug)]
#[cfg(any(test, feature = "sim"))]
pub(crate) struct Virtual {
    base: Instant,
    nanos: AtomicU64,
}

impl Clock {
    /// A virtual clock standing at its start until [`Clock::advance`] moves it.
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn virtual_clock() -> Clock {
        Clock::Virtual(Arc::new(Virtual {
            base: Instant::now(),
            nanos: AtomicU64::new(0),
        }))
    }

    /// The time now.
    pub(crate) fn now(&self) -> Instant {
        match self {
            Clock::Wall => Instant::now(),
            #[cfg(any(test, feature = "sim"))]
            Clock::Virtual(v) => v.base + Duration::from_nanos(v.nanos.load(Ordering::Acquire)),
        }
    }

    /// Moves a virtual clock on by `d` (the wall clock moves by itself: nothing).
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn advance(&self, d: Duration) {
        if let Clock::Virtual(v) = self {
            v.nanos.fetch_add(d.as_nanos() as u64, Ordering::AcqRel);
        }
    }
}

/// The instant of the host's monotonic zero (`CLOCK_MONOTONIC`, which `Instant` reads): the
/// epoch a real run's stacks count from. Every process of the host then reads the same stack
/// time at the same moment, so timestamps and ISNs (with [`crate::restart_key`]) run on
/// across restarts and upgrades instead of starting again from zero.
pub(crate) fn host_epoch() -> Instant {
    let now = Instant::now();
    let since_zero = Duration::from_nanos(crate::host::monotonic_ns(now));
    now.checked_sub(since_zero).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_epoch_is_the_monotonic_clock_s_zero() {
        let a = host_epoch();
        std::thread::sleep(Duration::from_millis(3));
        // Read from two clocks one after the other: a preempted thread may see them apart.
        let off = crate::host::monotonic_ns(a);
        assert!(off < 50_000_000, "the epoch stands {off} ns after the zero");
        let b = host_epoch();
        let apart = if a > b { a - b } else { b - a };
        assert!(apart < Duration::from_millis(50), "epochs {apart:?} apart");
    }

    #[test]
    fn a_virtual_clock_moves_only_when_told() {
        let c = Clock::virtual_clock();
        let t0 = c.now();
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(
            c.now(),
            t0,
            "virtual time stood still while the wall clock moved"
        );
        c.clone().advance(Duration::from_secs(30));
        assert_eq!(
            c.now() - t0,
            Duration::from_secs(30),
            "a clone moves the same clock"
        );
    }
}
