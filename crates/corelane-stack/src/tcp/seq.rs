//! Sequence numbers: 32-bit and wrapping, compared modulo 2^32 (RFC 9293 section 3.4).

use std::fmt;

/// A TCP sequence number.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Seq(pub u32);

impl Seq {
    /// `self - other` as a signed distance.
    #[inline]
    pub fn diff(self, other: Seq) -> i32 {
        self.0.wrapping_sub(other.0) as i32
    }

    /// Bytes from `other` up to `self` (0 when `self` is not after `other`).
    #[inline]
    pub fn since(self, other: Seq) -> usize {
        self.diff(other).max(0) as usize
    }

    /// `self + n`.
    #[inline]
    pub fn plus(self, n: usize) -> Seq {
        Seq(self.0.wrapping_add(n as u32))
    }

    /// `self - n`.
    #[inline]
    pub fn minus(self, n: usize) -> Seq {
        Seq(self.0.wrapping_sub(n as u32))
    }

    /// Strictly before `other`.
    #[inline]
    pub fn lt(self, other: Seq) -> bool {
        self.diff(other) < 0
    }

    /// Before or equal.
    #[inline]
    pub fn le(self, other: Seq) -> bool {
        self.diff(other) <= 0
    }

    /// Strictly after.
    #[inline]
    pub fn gt(self, other: Seq) -> bool {
        self.diff(other) > 0
    }

    /// After or equal.
    #[inline]
    pub fn ge(self, other: Seq) -> bool {
        self.diff(other) >= 0
    }

    /// The later of the two.
    #[inline]
    pub fn max(self, other: Seq) -> Seq {
        if self.ge(other) { self } else { other }
    }

    /// The earlier of the two.
    #[inline]
    pub fn min(self, other: Seq) -> Seq {
        if self.le(other) { self } else { other }
    }
}

impl fmt::Debug for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::Seq;

    #[test]
    fn comparisons_wrap() {
        let a = Seq(u32::MAX - 10);
        let b = a.plus(20);
        assert_eq!(b.0, 9);
        assert!(a.lt(b) && b.gt(a) && a.le(a) && b.ge(b));
        assert_eq!(b.since(a), 20);
        assert_eq!(a.since(b), 0);
        assert_eq!(a.max(b), b);
        assert_eq!(a.min(b), a);
        assert_eq!(b.minus(20), a);
    }
}
