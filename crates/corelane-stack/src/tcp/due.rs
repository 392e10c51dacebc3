//! A timer's deadline in 8 bytes: `Option<Instant>` takes 16, and a connection keeps eight
//! of them. The end of time stands for none, so the earliest of several deadlines is a
//! plain minimum.

use smoltcp::time::Instant;

/// A deadline, or none (`Due::NONE`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Due(i64);

impl Due {
    /// No deadline.
    pub(crate) const NONE: Due = Due(i64::MAX);

    /// The deadline, if one is set.
    #[inline]
    pub(crate) fn get(self) -> Option<Instant> {
        (self != Due::NONE).then(|| Instant::from_micros(self.0))
    }

    #[inline]
    pub(crate) fn is_none(self) -> bool {
        self == Due::NONE
    }

    /// Set, and `f` holds for it.
    #[inline]
    pub(crate) fn is_some_and(self, f: impl FnOnce(Instant) -> bool) -> bool {
        self.get().is_some_and(f)
    }

    /// Not set, or `f` holds for it.
    #[inline]
    pub(crate) fn is_none_or(self, f: impl FnOnce(Instant) -> bool) -> bool {
        self.get().is_none_or(f)
    }
}

impl Default for Due {
    fn default() -> Due {
        Due::NONE
    }
}

impl From<Option<Instant>> for Due {
    /// A time at the end of time (never met: smoltcp's instants are microseconds from the
    /// stack's start) is none as well.
    #[inline]
    fn from(t: Option<Instant>) -> Due {
        t.map_or(Due::NONE, |t| Due(t.total_micros()))
    }
}

impl std::fmt::Debug for Due {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_reads_back_and_none_sorts_after_every_time() {
        let t = Instant::from_micros(1_234_567);
        assert_eq!(Due::from(Some(t)).get(), Some(t));
        assert_eq!(Due::from(None).get(), None);
        assert_eq!(Due::default(), Due::NONE);
        assert!(Due::from(Some(t)) < Due::NONE);
        assert!(Due::from(Some(Instant::from_micros(0))) < Due::from(Some(t)));
        assert!(Due::from(Some(t)).is_some_and(|x| x == t));
        assert!(Due::NONE.is_none_or(|_| false));
        assert!(!Due::from(Some(t)).is_none_or(|_| false));
        assert_eq!(std::mem::size_of::<Due>(), 8);
    }
}
