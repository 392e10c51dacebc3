//! The receiver's duplicates waiting to be reported (RFC 2883): each ACK's first SACK block
//! names one, so data that arrived twice in one batch needs an ACK apiece. A sender undoes a
//! spurious recovery only when every retransmission of it is reported, so a duplicate left
//! unreported costs it the window it cut for nothing.

use super::seq::Seq;

/// Ranges reported at most per batch: the first goes in the next ACK, the others each in an
/// ACK of their own right after it. A duplicate beside or over a waiting range joins it (one
/// block covers both, as RFC 2883 section 4 allows); one more than this is not reported.
const PENDING: usize = 2;

/// Duplicates not yet reported, oldest first; an empty range (start = end) is a free slot,
/// and the taken ones come first. Kept to two: it is in every connection, whose state must
/// fit in a kilobyte.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Dsacks {
    ranges: [(Seq, Seq); PENDING],
}

impl Dsacks {
    /// `[start, end)` arrived again.
    pub(crate) fn note(&mut self, start: Seq, end: Seq) {
        if !end.gt(start) {
            return;
        }
        for r in &mut self.ranges {
            if r.0 == r.1 {
                *r = (start, end);
                return;
            }
            if start.le(r.1) && end.ge(r.0) {
                *r = (r.0.min(start), r.1.max(end));
                return;
            }
        }
    }

    /// The range the next ACK reports first.
    pub(crate) fn next(&self) -> Option<(Seq, Seq)> {
        let r = self.ranges[0];
        (r.0 != r.1).then_some(r)
    }

    /// Takes the range the next ACK reports.
    pub(crate) fn take(&mut self) -> Option<(Seq, Seq)> {
        let first = self.next()?;
        self.ranges.copy_within(1.., 0);
        self.ranges[PENDING - 1] = Default::default();
        Some(first)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.next().is_none()
    }

    pub(crate) fn clear(&mut self) {
        *self = Dsacks::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_apart_wait_in_turn_and_neighbours_join() {
        let mut d = Dsacks::default();
        d.note(Seq(100), Seq(200));
        d.note(Seq(500), Seq(600));
        // Beside the first, and over the second: still two blocks.
        d.note(Seq(200), Seq(300));
        d.note(Seq(550), Seq(700));
        // One more apart has no room.
        d.note(Seq(2000), Seq(2100));
        assert_eq!(d.take(), Some((Seq(100), Seq(300))));
        // A slot freed takes the next.
        d.note(Seq(900), Seq(1000));
        assert_eq!(d.take(), Some((Seq(500), Seq(700))));
        assert_eq!(d.take(), Some((Seq(900), Seq(1000))));
        assert!(d.is_empty());
        assert_eq!(d.take(), None);
        d.note(Seq(5), Seq(5));
        assert!(d.is_empty(), "an empty range is no duplicate");
    }

    #[test]
    fn ranges_across_the_wrap_join() {
        let mut d = Dsacks::default();
        d.note(Seq(u32::MAX - 99), Seq(u32::MAX - 9));
        d.note(Seq(u32::MAX - 9), Seq(90));
        assert_eq!(d.take(), Some((Seq(u32::MAX - 99), Seq(90))));
    }
}
